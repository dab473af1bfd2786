"""Cluster throughput with 1, 2 and 4 nodes (kvstore.Cluster: etcd, the nodes, a controller;
each node one poller, durability none), loaded by redis-benchmark --cluster (it reads CLUSTER
SLOTS and sends each key to its slot's owner; with one node, which owns every slot, plain
redis-benchmark, as --cluster refuses a cluster of one): SET and GET of 85-byte values over a key space
spread across every slot, 50 connections, pipeline 16.

This machine has 2 cores shared by the nodes and the load generator, so the aggregate rate
cannot grow with the nodes: what is measured is whether the cost per request stays the same
(requests per second of the nodes' CPU time, all their processes, /proc), which is what would
make the rate grow with the machines on a real network. Nothing crosses from node to node on
the request path: each request is served by its slot's owner alone. Node counts alternate
A B C within each round; medians with min-max over rounds.

    kvstore experiment run kv_cluster_throughput      -> OUT/kv_cluster_throughput.{csv,png}
"""
import os
import shutil
import statistics
import sys
import tempfile

from kvstore import Cluster
from kvstore.experiments import common

NAME = "kv_cluster_throughput"
QUICK = ["--rounds", "1", "--requests", "20000", "--nodes", "1", "2"]
OPS = ("SET", "GET")


def measure(args):
    rows = []
    for rnd in range(args.rounds):
        order = args.nodes if rnd % 2 == 0 else args.nodes[::-1]
        for n in order:
            d = tempfile.mkdtemp(prefix="kv-cluster-")
            base = common.free_port_run(n)
            c = Cluster(nodes=n, dir=d, base_port=base, durability="none", serve_args=["--threads", "1"]).up()
            try:
                pids = [x["pid"] for x in c.state["nodes"]]
                for op in OPS:
                    cpu0 = sum(common.cpu_seconds(p) for p in pids)
                    # (redis-benchmark --cluster refuses a cluster of one node: that one owns every
                    # slot, so the plain run sends the same requests to the same node)
                    r = common.run_redis_benchmark(base, op, args.pipeline, args.conns, args.requests,
                                                   args.keyspace, args.value_size, extra=["--cluster"] if n > 1 else [])
                    cpu = sum(common.cpu_seconds(p) for p in pids) - cpu0
                    rows.append({"round": rnd, "nodes": n, "op": op, "pipeline": args.pipeline,
                                 "throughput": round(r["throughput"]), "p50_us": round(r["p50_us"], 1),
                                 "p99_us": round(r["p99_us"], 1), "requests": args.requests,
                                 "server_cpu_s": round(cpu, 3),
                                 "req_per_cpu_s": round(args.requests / cpu) if cpu > 0 else ""})
                    common.log(f"round {rnd} {n} node{'s' if n > 1 else ' '} {op} {r['throughput']:>10,.0f} req/s  "
                               f"p99 {r['p99_us']:6.0f} us  {rows[-1]['req_per_cpu_s']:>10,} req per CPU-second")
                    common.write_csv(args.csv, rows)
            finally:
                c.down()
                shutil.rmtree(d, ignore_errors=True)
    return rows


def summary(rows):
    out = {}
    for r in rows:
        out.setdefault((int(r["nodes"]), r["op"]), []).append(r)
    def spread(v, f):  # (a point too short for /proc's 10 ms CPU clock has no req_per_cpu_s)
        xs = [float(r[f]) for r in v if r[f] != ""] or [float("nan")]
        return statistics.median(xs), min(xs), max(xs)
    return {k: {f: spread(v, f) for f in ("throughput", "req_per_cpu_s", "p99_us")} for k, v in out.items()}


def report(rows):
    s = summary(rows)
    counts = sorted({n for n, _ in s})
    for op in OPS:
        base = s.get((counts[0], op))
        for n in counts:
            x = s[(n, op)]
            print(f"{op} {n} node{'s' if n > 1 else ' '}: {x['throughput'][0]:>10,.0f} req/s "
                  f"({x['throughput'][1]:,.0f}-{x['throughput'][2]:,.0f})  {x['req_per_cpu_s'][0]:>10,.0f} req per "
                  f"CPU-second ({x['req_per_cpu_s'][1]:,.0f}-{x['req_per_cpu_s'][2]:,.0f}), "
                  f"{x['req_per_cpu_s'][0] / base['req_per_cpu_s'][0]:.2f}x of {counts[0]} node  "
                  f"p99 {x['p99_us'][0]:,.0f} us")


def draw(rows, path):
    plt = common.pyplot()
    s = summary(rows)
    counts = sorted({n for n, _ in s})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for op, marker in zip(OPS, "os"):
        for ax, f in zip(axes, ("throughput", "req_per_cpu_s")):
            pts = [s[(n, op)][f] for n in counts]
            med = [p[0] for p in pts]
            ax.errorbar(counts, med, yerr=[[m - p[1] for m, p in zip(med, pts)], [p[2] - m for m, p in zip(med, pts)]],
                        marker=marker, capsize=3, label=op)
    for ax, title in zip(axes, ("requests/s (redis-benchmark --cluster, P16)",
                                "requests per second of the nodes' CPU time")):
        ax.set_xticks(counts)
        ax.set_xlabel("nodes")
        ax.set_ylim(bottom=0)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"kvstore cluster, 1 poller a node, {os.cpu_count()} cores shared with the load generator")
    common.save_figure(fig, path)


def check_args(args):
    if not args.plot_only:
        for tool in ("redis-benchmark", "etcd"):
            if shutil.which(tool) is None:
                raise SystemExit(f"{NAME}: {tool} is not installed (make deps installs it)")


def add_args(ap):
    ap.add_argument("--rounds", type=int, default=3, help="rounds; node counts alternate within each")
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4], help="cluster sizes")
    ap.add_argument("--requests", type=int, default=400_000, help="requests per point")
    ap.add_argument("--pipeline", type=int, default=16, help="redis-benchmark -P")
    ap.add_argument("--conns", type=int, default=50, help="redis-benchmark connections")
    ap.add_argument("--keyspace", type=int, default=100_000, help="redis-benchmark -r (keys spread over every slot)")
    ap.add_argument("--value-size", type=int, default=85, help="SET value bytes")


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
