"""kvstore vs Redis vs memcached on the same machine, the same loads, in the same run.

Loads: 85-byte values, 1 M keys, SET and GET, pipeline 1 and 16, 50 connections,
driven by redis-benchmark (RESP servers only) and by `kvstore bench` (the C load
generator; memcached through its text protocol). Each round runs every server once
per load, A B C A B C ..., so drift on this shared machine hits all alike; medians
are reported. Server CPU seconds come from /proc for each run.

    kvstore experiment run kv_peer_compare            # full run -> OUT/kv_peer_compare.{csv,png}
    kvstore experiment run kv_peer_compare --quick    # smoke scale, into a temporary directory
    kvstore experiment plot kv_peer_compare
"""
import statistics
import sys
import tempfile
import time

from kvstore import Node
from kvstore.experiments import common

NAME = "kv_peer_compare"
QUICK = ["--rounds", "1", "--requests", "20000", "--preload", "20000", "--keyspace", "20000", "--pipelines", "16",
         "--kv-threads", "2"]


class KvNode:
    protocol = "resp"

    def __init__(self, threads, durability="none", name=None):
        self.name = name or f"kvstore-{threads}p"
        # memory only by default, as the Redis (persistence off) and memcached beside it
        data = {} if durability == "none" else {"data_dir": tempfile.mkdtemp(prefix=f"kv-{self.name}-")}
        self.node = Node(port=0, threads=threads, durability=durability, **data)

    def start(self):
        self.node.start()
        self.port = self.node.port
        return self

    @property
    def pid(self):
        return self.node.pid

    def stop(self):
        self.node.stop()


def measure(args):
    servers = [*(KvNode(t) for t in args.kv_threads), common.redis_server(common.free_port()),
               common.memcached(common.free_port(), args.memcached_threads)]
    rows = []
    try:
        for s in servers:
            s.start()
            common.log(f"preloading {s.name} with {args.preload:,} random SETs over {args.keyspace:,} keys")
            common.run_kvstore_bench(s.port, s.protocol, "SET", 16, args.conns, args.preload, args.keyspace,
                              args.value_size, args.client_threads)
        loads = [(tool, op, p) for tool in ("redis-benchmark", "kvstore-bench")
                 for op in ("SET", "GET") for p in args.pipelines]
        total = args.rounds * sum(1 for t, _, _ in loads for s in servers
                                  if not (t == "redis-benchmark" and s.protocol != "resp"))
        done = 0
        t0 = time.monotonic()
        for rnd in range(args.rounds):
            for tool, op, p in loads:
                for s in servers:
                    if tool == "redis-benchmark" and s.protocol != "resp":
                        continue  # redis-benchmark speaks RESP only
                    n = args.requests if p > 1 else args.requests // 4
                    cpu0 = common.cpu_seconds(s.pid)
                    w0 = time.monotonic()
                    if tool == "redis-benchmark":
                        r = common.run_redis_benchmark(s.port, op, p, args.conns, n, args.keyspace, args.value_size)
                    else:
                        r = common.run_kvstore_bench(s.port, s.protocol, op, p, args.conns, n, args.keyspace,
                                              args.value_size, args.client_threads)
                    wall = time.monotonic() - w0
                    cpu = common.cpu_seconds(s.pid) - cpu0
                    row = {"round": rnd, "tool": tool, "server": s.name, "op": op, "pipeline": p,
                           "conns": args.conns, "requests": n, "wall_s": round(wall, 3),
                           "server_cpu_s": round(cpu, 3), "req_per_cpu_s": round(n / cpu) if cpu else "",
                           **{k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()}}
                    rows.append(row)
                    done += 1
                    eta = (time.monotonic() - t0) / done * (total - done)
                    common.log(f"[{done}/{total}, eta {eta:.0f} s] round {rnd} {tool:15s} {s.name:9s} {op} "
                               f"P{p:<3d} {r['throughput']:>12,.0f} req/s  p50 {r['p50_us']:7.0f} us  "
                               f"p99 {r['p99_us']:7.0f} us  server cpu {cpu:5.2f} s")
                    common.write_csv(args.csv, rows)  # keep what is measured even if interrupted
    finally:
        for s in servers:
            s.stop()
    return rows


def summarize(rows):
    """Median per (tool, op, pipeline, server) and kvstore's ratios to the others."""
    groups = {}
    for r in rows:
        key = (r["tool"], r["op"], int(r["pipeline"]), r["server"])
        groups.setdefault(key, []).append(r)
    med = {}
    for key, rs in groups.items():
        med[key] = {f: statistics.median(float(r[f]) for r in rs if r[f] not in ("", None))
                    for f in ("throughput", "p50_us", "p99_us", "server_cpu_s", "req_per_cpu_s")}
    lines = []
    for (tool, op, p, server), m in sorted(med.items()):
        line = (f"{tool:15s} {op} P{p:<3d} {server:9s} {m['throughput']:>11,.0f} req/s  p50 {m['p50_us']:6.0f} us"
                f"  p99 {m['p99_us']:6.0f} us  {m['req_per_cpu_s']:>11,.0f} req/cpu-s")
        lines.append(line)
        if not server.startswith("kvstore"):
            for kv in sorted(k[3] for k in med if k[:3] == (tool, op, p) and k[3].startswith("kvstore")):
                k = med[(tool, op, p, kv)]
                lines.append(f"{'':40s}{kv}/{server}: {k['throughput'] / m['throughput']:.2f}x req/s, "
                             f"{k['req_per_cpu_s'] / m['req_per_cpu_s']:.2f}x req/cpu-s, "
                             f"p99 {k['p99_us'] / m['p99_us']:.2f}x")
    return med, "\n".join(lines)


def report(rows):
    print(summarize(rows)[1])


def draw(rows, path):
    plt = common.pyplot()
    med, _ = summarize(rows)
    tools = sorted({k[0] for k in med})
    loads = sorted({(k[1], k[2]) for k in med})
    servers = sorted({k[3] for k in med if k[3].startswith("kvstore")}, reverse=True) + ["redis", "memcached"]
    palette = ["#1f77b4", "#6baed6", "#9ecae1"]
    colors = {"redis": "#d62728", "memcached": "#2ca02c",
              **{s: palette[i % 3] for i, s in enumerate(x for x in servers if x.startswith("kvstore"))}}
    metrics = (("throughput", "requests/s"), ("req_per_cpu_s", "requests per server CPU-second"),
               ("p99_us", "p99 latency (us), lower is better"))
    fig, axes = plt.subplots(len(metrics), len(tools), figsize=(7 * len(tools), 11), squeeze=False)
    for ti, tool in enumerate(tools):
        for mi, (metric, label) in enumerate(metrics):
            ax = axes[mi][ti]
            width = 0.8 / len(servers)
            for si, s in enumerate(servers):
                xs, ys = [], []
                for li, (op, p) in enumerate(loads):
                    if (tool, op, p, s) in med:
                        xs.append(li + si * width)
                        ys.append(med[(tool, op, p, s)][metric])
                if xs:  # redis-benchmark cannot drive memcached
                    ax.bar(xs, ys, width, label=s, color=colors[s])
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(loads))])
            ax.set_xticklabels([f"{op} P{p}" for op, p in loads])
            ax.set_ylabel(label)
            ax.set_title(f"{tool}: {label} (median)")
            ax.legend()
            ax.grid(axis="y", alpha=0.3)
    fig.suptitle("kvstore (N pollers: kvstore-Np) vs Redis 7 vs memcached -t2 — 85-byte values, 1 M keys, "
                 "50 connections; client and servers share a 2-core VM")
    common.save_figure(fig, path)


def add_args(ap):
    ap.add_argument("--rounds", type=int, default=3, help="A B C rounds per load")
    ap.add_argument("--requests", type=int, default=1_000_000, help="requests per P16 run (P1 runs use a quarter)")
    ap.add_argument("--preload", type=int, default=3_000_000, help="random SETs before measuring")
    ap.add_argument("--keyspace", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=85)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--pipelines", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--kv-threads", type=int, nargs="+", default=[2, 1],
                    help="kvstore poller counts to measure, each as its own server")
    ap.add_argument("--memcached-threads", type=int, default=2)
    ap.add_argument("--client-threads", type=int, default=2, help="kvstore bench client threads")


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
