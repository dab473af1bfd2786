"""Paper 003 (LDU), Fig 2.11 analogue: throughput vs read:write ratio (50:50, 30:70, 10:90,
1:99) at a fixed thread count (default 2, this machine's core count), for every variant
of experiments/ldu_bench.c. A read traverses the whole shared list; LDU flushes its log
before every read, so its advantage should shrink as reads grow. Rounds are interleaved
(A B A B) and the median is kept, as in ldu_scalability.py, which builds and runs the
benchmark for both scripts.

    .venv/bin/python experiments/ldu_rw_ratio.py
        -> results/ldu_rw_ratio.csv (medians), results/ldu_rw_ratio_runs.csv, results/ldu_rw_ratio.png
    .venv/bin/python experiments/ldu_rw_ratio.py --threads 120 --ratios 50,30,10,1
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import ldu_scalability as ls  # noqa: E402

CSV = os.path.join(common.RESULTS, "ldu_rw_ratio.csv")
RUNS_CSV = os.path.join(common.RESULTS, "ldu_rw_ratio_runs.csv")
PNG = os.path.join(common.RESULTS, "ldu_rw_ratio.png")


def plot(med, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    ax.set_title(f"Fig 2.11 analogue: read:write ratio at {threads} threads")
    ax.legend(loc="upper left", fontsize=8)
    ax2.set_ylabel("idle: % of thread time blocked acquiring a lock (median)")
    ax2.set_ylim(0, 100)
    ax2.set_title("time waiting for locks")
    ls.machine_note(fig, med, [threads])
    fig.savefig(path, dpi=110)
    ls.log(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="thread count (default 2)")
    ap.add_argument("--ratios", type=lambda s: ls.parse_list(s, "--ratios"), default=[50, 30, 10, 1],
                    help="read percentages, comma-separated (default 50,30,10,1)")
    ap.add_argument("--variants", default=",".join(ls.VARIANTS), help="comma-separated, default all")
    ap.add_argument("--duration-ms", type=int, default=500, help="per run (default 500)")
    ap.add_argument("--objs", type=int, default=64, help="objects per thread (default 64)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds, median kept (default 5)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bench-opt", action="append", default=[],
                    help="extra key=value passed to ldu_bench (roots=, slots=, batch=, age_us=)")
    ap.add_argument("--max-other-cpu", type=float, default=0.3,
                    help="rerun once a run during which other processes used more CPUs than this (default 0.3)")
    ap.add_argument("--plot-only", action="store_true", help="replot from the CSV")
    args = ap.parse_args()
    if args.plot_only:
        plot(common.read_csv(CSV), PNG)
        return
    if any(not 0 <= p <= 100 for p in args.ratios):
        raise SystemExit("--ratios: read percentages must be within 0..100")
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(ls.VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; known: {', '.join(ls.VARIANTS)}")
    binary = ls.build_bench()
    points = [(v, args.threads, p) for p in args.ratios for v in variants]
    rows = ls.sweep(binary, points, args.rounds, args.duration_ms, args.objs, args.seed, args.bench_opt,
                    args.max_other_cpu)
    common.write_csv(RUNS_CSV, rows)
    med = ls.medians(rows, ("variant", "threads", "read_pct"))
    order = {v: i for i, v in enumerate(ls.VARIANTS)}
    med.sort(key=lambda r: (-r["read_pct"], order[r["variant"]]))
    common.write_csv(CSV, med)
    ls.log(f"wrote {CSV}")
    plot(common.read_csv(CSV), PNG)


if __name__ == "__main__":
    main()
