"""Paper 003 (LDU), Figs 2.8-2.10 and Table 2.1 analogue: throughput and idle time of an
update-heavy shared list vs thread count, for a mutex (stock Linux), an rwlock, the
ordered and unordered Harris lock-free lists, and LDU with a global or per-thread queue.

ext/bench/ldu_bench.c is compiled (gcc -O2 -pthread, against ext/core/ldu.c) into
build/ldu_bench/; every (variant, thread count) point is run once per round, the rounds
interleaved (A B A B) with the variant order rotated each round, and the median over
rounds is kept. cpu_util is the benchmark's CPU-seconds per wall second (below
min(threads, cores) when threads block); other_cpu is what everything else on the
machine used meanwhile (noise); a run with other_cpu above --max-other-cpu is run once
more at the end and the quieter of the two kept.

    kvstore experiment run p003_ldu_scalability
        -> OUT/p003_ldu_scalability.csv (medians), OUT/p003_ldu_scalability_runs.csv
           (every run), OUT/p003_ldu_scalability.png
    kvstore experiment run p003_ldu_scalability -- --threads 1,2,4,8,15,30,60,120 --duration-ms 2000
    kvstore experiment run p003_ldu_scalability -- --read-pct 0 --tag read0
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

from kvstore.experiments import common

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCE = os.path.join(ROOT, "ext", "bench", "ldu_bench.c")
BUILD_DIR = os.path.join(ROOT, "build", "ldu_bench")
VARIANTS = ["mutex", "rwlock", "harris", "harris-unordered", "ldu-global", "ldu-percore"]
STYLE = {"mutex": ("#d62728", "o-"), "rwlock": ("#ff7f0e", "s-"), "harris": ("#7f7f7f", "v:"),
         "harris-unordered": ("#9467bd", "^:"), "ldu-global": ("#1f77b4", "D-"), "ldu-percore": ("#2ca02c", "P-")}
NAME = "p003_ldu_scalability"
QUICK = ["--threads", "1,2", "--variants", "mutex,ldu-global", "--rounds", "1", "--duration-ms", "100"]
STAT_KEYS = ("logs", "pushes", "absorbed", "reused", "applies", "flush_read", "flush_bound", "flush_age",
             "flush_collision")


def build_bench():
    """Compile ldu_bench.c + ext/ldu.c; returns the binary's path."""
    if not shutil.which("gcc"):
        raise SystemExit("gcc is not installed (make deps installs it)")
    os.makedirs(BUILD_DIR, exist_ok=True)
    out = os.path.join(BUILD_DIR, "ldu_bench")
    tmp = f"{out}.{os.getpid()}"
    cmd = ["gcc", "-std=gnu11", "-O2", "-g", "-Wall", "-pthread", "-I", os.path.join(ROOT, "ext"), SOURCE,
           os.path.join(ROOT, "ext", "bench", "ldu_bench_lists.c"), os.path.join(ROOT, "ext", "core", "ldu.c"), "-o", tmp]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"build failed:\n$ {' '.join(cmd)}\n{r.stderr}")
    os.replace(tmp, out)
    common.log(f"built {os.path.relpath(out, ROOT)}")
    return out


def run_point(binary, variant, threads, read_pct, duration_ms, objs, seed, extra=()):
    """One run of the benchmark: a dict of its CSV line, cpu_util (the benchmark's CPU-s per
    wall s), other_cpu (everything else's, incl. steal: noise from other load) and its stats."""
    argv = [binary, variant, str(threads), str(read_pct), str(duration_ms), str(objs), str(seed), *extra]
    busy0, t0 = common.machine_busy_seconds(), os.times()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60 + duration_ms / 1000 * 5)
    busy1, t1 = common.machine_busy_seconds(), os.times()
    if r.returncode:
        raise SystemExit(f"{' '.join(argv)} failed (exit {r.returncode}):\n{r.stderr}")
    f = r.stdout.strip().split(",")
    row = {"variant": f[0], "threads": int(f[1]), "read_pct": int(f[2]), "ops": int(f[3]),
           "ops_per_s": float(f[4]), "idle_frac": float(f[5])}
    stats = dict(kv.split("=", 1) for line in r.stderr.splitlines() if line.startswith("stats:")
                 for kv in line.split()[1:])
    wall = float(stats["wall_s"])
    cpu = (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system)
    row["cpu_util"] = round(cpu / wall, 3)
    if busy0 is not None:
        # /proc/stat ticks are coarse (10 ms) and t1-t0 includes process start-up: approximate
        row["other_cpu"] = round(max(0.0, (busy1 - busy0 - cpu) / (t1.elapsed - t0.elapsed)), 2)
    for k in STAT_KEYS:
        if k in stats:
            row[k] = int(stats[k])
    return row


def sweep(binary, points, rounds, duration_ms, objs, seed, extra=(), max_other_cpu=0.3):
    """points: [(variant, threads, read_pct)]. Runs every point once per round, rounds
    interleaved, variant order rotated each round. A run during which other processes
    used more than max_other_cpu CPUs is run once more after all rounds, and the run
    with less interference is kept (shared machines are noisy). Returns every run's row."""
    rows = []
    total = rounds * len(points)
    variants = list(dict.fromkeys(p[0] for p in points))
    t_start = time.monotonic()

    def one(variant, threads, read_pct, rnd, tag):
        row = run_point(binary, variant, threads, read_pct, duration_ms, objs, seed + rnd, extra)
        row["round"] = rnd
        common.log(f"[{tag} {time.monotonic() - t_start:5.0f}s] {variant:>16} threads {threads:>3} "
            f"read {read_pct:>2}%: {row['ops_per_s'] / 1e6:8.2f} M ops/s, idle {row['idle_frac']:.2f}, "
            f"cpu {row['cpu_util']:.2f}, others {row.get('other_cpu', float('nan')):.2f}")
        return row

    for rnd in range(rounds):
        order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
        ranked = sorted(points, key=lambda p: (p[1], p[2], order.index(p[0])))
        for variant, threads, read_pct in ranked:
            rows.append(one(variant, threads, read_pct, rnd, f"{len(rows) + 1}/{total}"))
    noisy = [i for i, r in enumerate(rows) if r.get("other_cpu", 0) > max_other_cpu]
    if noisy:
        common.log(f"{len(noisy)} runs had other load above {max_other_cpu} CPUs: running them once more")
    for k, i in enumerate(noisy):
        r = rows[i]
        again = one(r["variant"], r["threads"], r["read_pct"], r["round"], f"rerun {k + 1}/{len(noisy)}")
        again["rerun"] = 1
        if again.get("other_cpu", 0) < r["other_cpu"]:
            rows[i] = again
    return rows


def medians(rows, keys):
    """One row per distinct keys: medians of the measured columns, min/max of ops_per_s."""
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for key, rs in groups.items():
        m = dict(zip(keys, key))
        vals = [float(r["ops_per_s"]) for r in rs]
        m["ops_per_s"] = round(statistics.median(vals))
        m["ops_per_s_min"], m["ops_per_s_max"] = round(min(vals)), round(max(vals))
        m["idle_frac"] = round(statistics.median(float(r["idle_frac"]) for r in rs), 4)
        m["cpu_util"] = round(statistics.median(float(r["cpu_util"]) for r in rs), 3)
        other = [float(r["other_cpu"]) for r in rs if r.get("other_cpu") not in (None, "")]
        if other:
            m["other_cpu"] = round(statistics.median(other), 2)
        logs = [int(r["logs"]) for r in rs if r.get("logs") not in (None, "")]
        if logs and sum(logs):
            m["pushes_per_log"] = round(sum(int(r["pushes"]) for r in rs if r.get("logs")) / sum(logs), 3)
            m["absorbed_per_log"] = round(sum(int(r["absorbed"]) for r in rs if r.get("logs")) / sum(logs), 3)
        m["rounds"] = len(rs)
        out.append(m)
    return out


def machine_note(fig, med, threads):
    """A caption under the plots: cores vs threads (oversubscription) and the other load."""
    cores = os.cpu_count() or 1
    over = [t for t in threads if t > cores]
    text = f"This machine has {cores} cores (paper: 120 cores, 8 sockets)"
    text += (f"; thread counts above {cores} ({', '.join(map(str, over))}) are oversubscribed."
             if over else f"; every run here uses at most {cores} threads.")
    other = [float(r["other_cpu"]) for r in med if r.get("other_cpu") not in (None, "")]
    if other:
        text += f" Median CPU used by other processes during the runs: {statistics.median(other):.2f}."
    fig.text(0.5, 0.01, text, ha="center", va="bottom", fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1))


def draw(med, path):
    plt = common.pyplot()
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in med)]
    xs = sorted({int(r["threads"]) for r in med})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for v in variants:
        rs = sorted((r for r in med if r["variant"] == v), key=lambda r: int(r["threads"]))
        color, style = STYLE.get(v, (None, "o-"))
        t = [int(r["threads"]) for r in rs]
        y = [float(r["ops_per_s"]) / 1e6 for r in rs]
        lo = [y_ - float(r["ops_per_s_min"]) / 1e6 for y_, r in zip(y, rs)]
        hi = [float(r["ops_per_s_max"]) / 1e6 - y_ for y_, r in zip(y, rs)]
        ax.errorbar(t, y, yerr=[lo, hi], fmt=style, color=color, capsize=3, label=v)
        ax2.plot(t, [float(r["idle_frac"]) * 100 for r in rs], style, color=color, label=v)
    read_pct = med[0]["read_pct"]
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("threads")
    ax.set_ylabel("operations / s (millions; median, bars = min-max of rounds)")
    ax.set_title(f"update-heavy shared list ({read_pct}% traversals): throughput\n(paper: LDU + unordered Harris "
                 "1.7x stock Linux on AIM7, 120 cores; nothing pinned)", fontsize=9)
    ax.grid(alpha=0.3)

    ax2.set_xscale("log", base=2)
    ax2.set_xticks(xs, [str(x) for x in xs])
    ax2.set_xlabel("threads")
    ax2.set_ylabel("idle: % of thread time blocked acquiring a lock (median)")
    ax2.set_title("Table 2.1 analogue: time waiting for locks")
    ax2.set_ylim(0, 100)
    ax2.grid(alpha=0.3)
    for (name, pct), ls_ in zip(PAPER_IDLE.items(), ("--", ":")):
        common.paper_line(ax2, pct, f"paper, AIM7 on 120 cores: {name} {pct} % idle", ls=ls_)
    ax2.legend(loc="upper left", fontsize=8)
    cores = os.cpu_count() or 1
    above = [x for x in xs if x > cores]
    if above:
        start = (max(x for x in xs if x <= cores) * min(above)) ** 0.5 if min(xs) <= cores else min(xs) / 1.2
        for a in (ax, ax2):
            a.axvspan(start, max(xs) * 1.2, color="grey", alpha=0.1)
            a.text(start * 1.03, a.get_ylim()[1] * 0.98, f"oversubscribed (> {cores} cores)", va="top",
                   fontsize=8, color="dimgrey")
    machine_note(fig, med, xs)
    common.save_figure(fig, path, tight=False)


PAPER_IDLE = {"stock Linux (mutex)": 51, "LDU": 21}  # % idle on AIM7, 120 cores (paper 003, Table 2.1)


def report_table(med, col):
    """Medians (M ops/s) of every variant by `col` (threads or read_pct), then each variant
    over the mutex: the numbers the README's text quotes, Harris's lists beside LDU's."""
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in med)]
    keys = sorted({int(r[col]) for r in med}, reverse=(col == "read_pct"))
    by = {(r["variant"], int(r[col])): r for r in med}
    print(f"M ops/s, median [min-max]; rows: {col}")
    print(f"{col:>9s}" + "".join(f"{v:>22s}" for v in variants))
    for k in keys:
        print(f"{k:>9d}" + "".join(
            f"{float(by[(v, k)]['ops_per_s']) / 1e6:>9.1f} [{float(by[(v, k)]['ops_per_s_min']) / 1e6:.1f}-"
            f"{float(by[(v, k)]['ops_per_s_max']) / 1e6:.1f}]".rjust(22) if (v, k) in by else f"{'-':>22s}"
            for v in variants))
    if "mutex" in variants:
        print("over the mutex (ratio of medians)")
        for k in keys:
            m = float(by[("mutex", k)]["ops_per_s"]) if ("mutex", k) in by else 0
            print(f"{k:>9d}" + "".join(f"{float(by[(v, k)]['ops_per_s']) / m:>21.2f}x" if m and (v, k) in by
                                       else f"{'-':>22s}" for v in variants))


def report(med):
    report_table(med, "threads")


def parse_list(s, what):
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: expected comma-separated integers, got {s!r}") from None
    if not vals:
        raise argparse.ArgumentTypeError(f"{what}: empty list")
    return vals


def variants_arg(args):
    """--variants as a list, every name checked."""
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    return variants


def add_bench_args(ap):
    """The options of ldu_bench runs, shared with p003_ldu_rw_ratio."""
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, default all")
    ap.add_argument("--duration-ms", type=int, default=500, help="per run (default 500)")
    ap.add_argument("--objs", type=int, default=64, help="objects per thread (default 64)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds, median kept (default 5)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bench-opt", action="append", default=[],
                    help="extra key=value passed to ldu_bench (roots=, slots=, batch=, age_us=)")
    ap.add_argument("--max-other-cpu", type=float, default=0.3,
                    help="rerun once a run during which other processes used more CPUs than this (default 0.3)")


def run_sweep(args, points, keys, sort_key):
    """Builds the benchmark, runs points [(variant, threads, read_pct)], writes every run to
    <csv>_runs.csv and the medians (sorted by sort_key) to args.csv; returns the medians."""
    binary = build_bench()
    rows = sweep(binary, points, args.rounds, args.duration_ms, args.objs, args.seed, args.bench_opt,
                 args.max_other_cpu)
    common.write_csv(args.csv[:-len(".csv")] + "_runs.csv", rows)
    med = medians(rows, keys)
    med.sort(key=sort_key)
    common.write_csv(args.csv, med)
    common.log(f"wrote {args.csv}")
    return common.read_csv(args.csv)


def add_args(ap):
    ap.add_argument("--threads", type=lambda s: parse_list(s, "--threads"), default=[1, 2, 4, 8],
                    help="comma-separated thread counts (default 1,2,4,8)")
    ap.add_argument("--read-pct", type=int, default=1, help="percentage of operations that traverse (default 1)")
    add_bench_args(ap)


def measure(args):
    variants = variants_arg(args)
    order = {v: i for i, v in enumerate(VARIANTS)}
    return run_sweep(args, [(v, t, args.read_pct) for t in args.threads for v in variants],
                     ("variant", "threads", "read_pct"), lambda r: (r["threads"], order[r["variant"]]))


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
