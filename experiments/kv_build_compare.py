"""Two builds of kvstore side by side: is a change free of cost?

The same loads (kvstore bench: 50 connections, 2 client threads, 85-byte values; SET and GET at
pipeline 1 and 16) against a server of each build, one build after the other in every round and
the order swapped each round (A B, B A, ...), so the machine's drift hits both alike. Reported:
paired ratios this/baseline of throughput and of server CPU per request, medians with min-max.
The baseline is another checkout's venv, e.g. the commit before a change:

    git worktree add ../kv-before <commit> && make -C ../kv-before dev
    kvstore experiment run kv_build_compare -- --baseline ../kv-before/.venv/bin/python
        [--durability disk] [--rounds 10] [--arch threadpool --threads 32]
                                                   -> OUT/kv_build_compare[_TAG].{csv,png}
"""
import os
import statistics
import shutil
import sys
import tempfile

from kvstore import bench as kvbench
from kvstore.experiments import common
from kvstore.process import Process

NAME = "kv_build_compare"
QUICK = ["--rounds", "2", "--requests", "100000"]
LOADS = [("SET", 1, "1:0"), ("GET", 1, "0:1"), ("SET", 16, "1:0"), ("GET", 16, "0:1")]
BUILDS = ("baseline", "this")


def serve(build, python, args, data_dir):
    """A server of the build whose interpreter is python (run from a neutral directory, so
    that a kvstore source folder in the current directory cannot shadow its package)."""
    port = common.free_port()
    argv = [python, "-m", "kvstore.cli", "serve", "--port", port, "--arch", args.arch, "--threads", args.threads,
            "--durability", args.durability, "--no-data-file", "--data-dir", data_dir]
    return Process(argv, port=port, name=f"kvstore-{build}", cwd=tempfile.gettempdir(),
                   log_path=os.path.join(data_dir, "server.log")).start(30)


def measure(args):
    rows = []
    pythons = {"baseline": args.baseline, "this": sys.executable}
    for rnd in range(args.rounds):
        for build in (BUILDS if rnd % 2 == 0 else BUILDS[::-1]):
            data_dir = tempfile.mkdtemp(prefix="kv-build-compare-")
            p = serve(build, pythons[build], args, data_dir)
            try:
                for op, pipe, ratio in LOADS:
                    n = args.requests if pipe > 1 else args.requests // 4
                    cpu0 = common.cpu_seconds(p.pid)
                    r = kvbench.run(port=p.port, threads=2, conns=50, pipeline=pipe, value_size=85,
                                    keyspace=100_000, ratio=ratio, requests=n)
                    cpu = common.cpu_seconds(p.pid) - cpu0
                    rows.append({"round": rnd, "build": build, "load": f"{op} P{pipe}",
                                 "throughput": round(r["throughput"]),
                                 "cpu_us_per_request": round(cpu / max(r["requests"], 1) * 1e6, 3)})
                    common.log(f"round {rnd} {build:8s} {op} P{pipe:<2d} {r['throughput']:>11,.0f} req/s "
                               f"{rows[-1]['cpu_us_per_request']:6.2f} us CPU/request")
            finally:
                p.stop()
                shutil.rmtree(data_dir, ignore_errors=True)
            common.write_csv(args.csv, rows)
    return rows


def ratios(rows, field):
    """{load: [this/baseline of field, one per round]}."""
    out = {}
    for load in dict.fromkeys(r["load"] for r in rows):
        by = {(r["round"], r["build"]): float(r[field]) for r in rows if r["load"] == load}
        out[load] = [by[(k, "this")] / by[(k, "baseline")] for k, b in by if b == "this" and (k, "baseline") in by]
    return out


def report(rows):
    thr, cpu = ratios(rows, "throughput"), ratios(rows, "cpu_us_per_request")
    med = common.medians(rows, ("load", "build"))
    print(f"{'load':8s} {'baseline req/s':>15s} {'this req/s':>12s}   this/baseline: throughput, CPU per request "
          f"(paired medians, min-max, {len(next(iter(thr.values())))} rounds)")
    for load in thr:
        t, c = thr[load], cpu[load]
        print(f"{load:8s} {med[(load, 'baseline')]:15,.0f} {med[(load, 'this')]:12,.0f}   "
              f"{statistics.median(t):.3f} ({min(t):.2f}-{max(t):.2f})   "
              f"{statistics.median(c):.3f} ({min(c):.2f}-{max(c):.2f})")


def draw(rows, path):
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, (field, label) in enumerate((("throughput", "throughput"), ("cpu_us_per_request", "server CPU per request"))):
        r = ratios(rows, field)
        loads = list(r)
        med = [statistics.median(r[x]) for x in loads]
        err = [[m - min(r[x]) for m, x in zip(med, loads)], [max(r[x]) - m for m, x in zip(med, loads)]]
        ax.bar([j + (i - 0.5) * 0.38 for j in range(len(loads))], med, 0.38, yerr=err, capsize=3, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(loads)))
    ax.set_xticklabels(loads)
    ax.set_ylabel("this build / baseline (paired median, min-max)")
    ax.set_title("kvstore: this build against a baseline build, same loads, alternated rounds", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    common.save_figure(fig, path)


def add_args(ap):
    ap.add_argument("--baseline", help="the python of the baseline build's venv (e.g. ../kv-before/.venv/bin/python)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=1_000_000, help="requests per P16 load (P1: a quarter)")
    ap.add_argument("--arch", default="poller", choices=["poller", "threadpool"],
                    help="the servers' --arch (threadpool: paper 000's baseline, Table 1's thread-pool rows)")
    ap.add_argument("--threads", type=int, default=1, help="server pollers (threadpool: workers)")
    ap.add_argument("--durability", default="none", choices=["none", "disk"])


def check_args(args):
    if not args.plot_only:
        if not args.baseline:
            args.baseline = sys.executable  # no baseline given: the build against itself (a noise floor)
        if not os.path.exists(args.baseline):
            raise SystemExit(f"{NAME}: --baseline {args.baseline}: no such interpreter")


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
