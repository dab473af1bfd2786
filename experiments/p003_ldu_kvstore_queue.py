"""LDU in kvstore: what the dirty-key queue costs the writers, LDU vs a mutex-protected queue.

Every write to a server with a data file queues its key for the BOSC flusher.
`--dirty-queue ldu` (the default) pushes with one CAS, queues a key once however
often it changes before the flush, and absorbs an insert deleted before the flush;
`--dirty-queue locked` is the simple queue it replaced: the same nodes behind one
mutex, no absorbing. Two servers, identical but for that option, measured in
alternation (A B A B ...) with kvstore bench (SET, 85-byte values, 50 connections),
throughput and server CPU per request; medians. Memory is unbounded and the log is
off (--durability none --data-file) so that what differs is the queue, not the disk.

    kvstore experiment run p003_ldu_kvstore_queue      -> OUT/p003_ldu_kvstore_queue.{csv,png}
"""
import shutil
import statistics
import sys
import tempfile

from kvstore import Node
from kvstore.experiments import common

NAME = "p003_ldu_kvstore_queue"
QUICK = ["--rounds", "1", "--requests", "20000", "--keyspace", "20000", "--pipelines", "16"]


def measure(args):
    dirs, nodes = {}, {}
    rows = []
    try:
        for q in ("ldu", "locked"):
            dirs[q] = tempfile.mkdtemp(prefix=f"kv-queue-{q}-")
            nodes[q] = Node(port=0, threads=args.threads, data_dir=dirs[q], durability="none", data_file=True,
                            dirty_queue=q).start()
        total = args.rounds * len(args.pipelines) * 2
        for rnd in range(args.rounds):
            for p in args.pipelines:
                for q in (("ldu", "locked") if rnd % 2 == 0 else ("locked", "ldu")):
                    n = nodes[q]
                    cpu0 = common.cpu_seconds(n.pid)
                    r = common.run_kvstore_bench(n.port, "resp", "SET", p, args.conns, args.requests, args.keyspace,
                                                 args.value_size, 2)
                    cpu = common.cpu_seconds(n.pid) - cpu0
                    rows.append({"round": rnd, "queue": q, "pipeline": p, "requests": args.requests,
                                 "throughput": round(r["throughput"]), "p99_us": round(r["p99_us"], 1),
                                 "server_cpu_s": round(cpu, 3),
                                 "cpu_us_per_req": round(cpu / args.requests * 1e6, 3)})
                    common.log(f"[{len(rows)}/{total}] P{p:<2d} {q:6s} {r['throughput']:>11,.0f} SET/s  "
                               f"server cpu {cpu:.2f} s")
                    common.write_csv(args.csv, rows)
    finally:
        for n in nodes.values():
            n.stop()
        for d in dirs.values():
            shutil.rmtree(d, ignore_errors=True)
    return rows


def medians(rows):
    out = {}
    for r in rows:
        k = (int(r["pipeline"]), r["queue"])
        out.setdefault(k, {"throughput": [], "cpu": []})
        out[k]["throughput"].append(float(r["throughput"]))
        out[k]["cpu"].append(float(r["cpu_us_per_req"]))
    return {k: (statistics.median(v["throughput"]), statistics.median(v["cpu"])) for k, v in out.items()}


def report(rows):
    med = medians(rows)
    for p in sorted({k[0] for k in med}):
        (tl, cl), (tk, ck) = med[(p, "ldu")], med[(p, "locked")]
        print(f"P{p:<2d} ldu {tl:>11,.0f} SET/s {cl:.3f} us CPU/req | locked {tk:>11,.0f} SET/s {ck:.3f} us CPU/req"
              f" | ldu/locked throughput {tl / tk:.3f}x, CPU per request {cl / ck:.3f}x")


def draw(rows, path):
    plt = common.pyplot()
    ps = sorted({int(r["pipeline"]) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, field, label in ((axes[0], "throughput", "SET/s (median, bars: min-max)"),
                             (axes[1], "cpu_us_per_req", "server CPU µs per request (median, bars: min-max)")):
        vals = {}
        for r in rows:
            vals.setdefault((f"P{r['pipeline']}", r["queue"]), []).append(float(r[field]))
        common.bar_chart(ax, [f"P{p}" for p in ps], ["ldu", "locked"], vals,
                         labels={"ldu": "LDU queue", "locked": "mutex-protected queue"})
        ax.set_ylabel(label, fontsize=8)
        ax.legend(fontsize=8)
    n = max(len([r for r in rows if r["queue"] == "ldu" and int(r["pipeline"]) == p]) for p in ps)
    fig.suptitle(f"kvstore's dirty-key queue: LDU vs a mutex-protected queue (2 pollers, {n} rounds; paper 003: "
                 "LDU 1.6-2.2x stock Linux on 120 cores)\n" + common.cores_note(shares="server, client"),
                 fontsize=9)
    common.save_figure(fig, path)


def add_args(ap):
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--keyspace", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=85)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--pipelines", type=int, nargs="+", default=[16, 1])
    ap.add_argument("--threads", type=int, default=2, help="server pollers (the writers)")


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
