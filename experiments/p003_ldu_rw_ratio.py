"""Paper 003 (LDU), Fig 2.11 analogue: throughput vs read:write ratio (50:50, 30:70, 10:90,
1:99, and 0:100: updates only) at a fixed thread count (default 2, this machine's core
count), for every variant of ext/bench/ldu_bench.c (the Harris lists beside LDU and the
locks). A read traverses the whole shared list; LDU flushes its log before every read, so
its advantage should shrink as reads grow. Rounds are interleaved
(A B A B) and the median is kept, as in p003_ldu_scalability, which builds and runs the
benchmark for both experiments.

    kvstore experiment run p003_ldu_rw_ratio
        -> OUT/p003_ldu_rw_ratio.csv (medians), OUT/p003_ldu_rw_ratio_runs.csv,
           OUT/p003_ldu_rw_ratio.png
    kvstore experiment run p003_ldu_rw_ratio -- --threads 120 --ratios 50,30,10,1
"""
import sys

from kvstore.experiments import common
from kvstore.experiments import p003_ldu_scalability as ls

NAME = "p003_ldu_rw_ratio"
QUICK = ["--ratios", "50,1", "--variants", "mutex,harris-unordered,ldu-global", "--rounds", "1", "--duration-ms",
         "100"]


def draw(med, path):
    plt = common.pyplot()
    ratios = sorted({int(r["read_pct"]) for r in med}, reverse=True)
    labels = [f"{p}:{100 - p}" for p in ratios]
    variants = [v for v in ls.VARIANTS if any(r["variant"] == v for r in med)]
    threads = int(med[0]["threads"])
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    xs = list(range(len(ratios)))
    for v in variants:
        by = {int(r["read_pct"]): r for r in med if r["variant"] == v}
        color, style = ls.STYLE.get(v, (None, "o-"))
        y = [float(by[p]["ops_per_s"]) / 1e6 for p in ratios]
        lo = [y_ - float(by[p]["ops_per_s_min"]) / 1e6 for y_, p in zip(y, ratios)]
        hi = [float(by[p]["ops_per_s_max"]) / 1e6 - y_ for y_, p in zip(y, ratios)]
        ax.errorbar(xs, y, yerr=[lo, hi], fmt=style, color=color, capsize=3, label=v)
        ax2.plot(xs, [float(by[p]["idle_frac"]) * 100 for p in ratios], style, color=color, label=v)
    for a in (ax, ax2):
        a.set_xticks(xs, labels)
        a.set_xlabel("read : write (% of operations)")
        a.grid(alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("operations / s (millions; median, bars = min-max of rounds)")
    ax.set_title(f"Fig 2.11 analogue: read:write ratio at {threads} threads\n"
                 f"({common.cores_note()}; paper: LDU's lead shrinks as reads grow)", fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    ax2.set_ylabel("idle: % of thread time blocked acquiring a lock (median)")
    ax2.set_ylim(0, 100)
    ax2.set_title("time waiting for locks")
    ls.machine_note(fig, med, [threads])
    common.save_figure(fig, path, tight=False)


def report(med):
    ls.report_table(med, "read_pct")


def add_args(ap):
    ap.add_argument("--threads", type=int, default=2, help="thread count (default 2)")
    ap.add_argument("--ratios", type=lambda s: ls.parse_list(s, "--ratios"), default=[50, 30, 10, 1, 0],
                    help="read percentages, comma-separated (default 50,30,10,1,0)")
    ls.add_bench_args(ap)


def check_args(args):
    if any(not 0 <= p <= 100 for p in args.ratios):
        raise SystemExit("--ratios: read percentages must be within 0..100")


def measure(args):
    variants = ls.variants_arg(args)
    order = {v: i for i, v in enumerate(ls.VARIANTS)}
    return ls.run_sweep(args, [(v, args.threads, p) for p in args.ratios for v in variants],
                        ("variant", "threads", "read_pct"), lambda r: (-r["read_pct"], order[r["variant"]]))


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
