"""Paper 000, section 3.3: effective disk updates per second of the BOSC sweep.

The BOSC flusher turns random record updates into a sweep up the data file:
each block with pending updates is read, updated and written once, then one
fdatasync. Its effective update rate (records made durable in the data file per
second of sweep time) grows with the updates per block, so with the request rate
and with the memory that holds the pending updates. The baseline is the naive
way: every update reads its block, modifies it, writes it back in place and
syncs it, on a file written in full first, so each update overwrites an
allocated block. BOSC's data file is created sparse, but every point preloads
--keys keys (200 K into 16,384 blocks by default) before its clock starts, which
writes every home block: BOSC's updates overwrite allocated blocks too.

Every point runs the real flusher (kvstore.durability.DataFile over a Store, as
in the server) on a data file on this machine's disk:
  - memory: writers update random keys as fast as they can with the store's
    memory bounded; the flusher sweeps when memory passes 90 % of the bound
    (the NHD regime): more memory, more updates per sweep;
  - rate: writers update random keys at a fixed rate with unbounded memory and
    a sweep every --interval-ms: more requests, more updates per sweep;
  - naive: random in-place updates, each read + write + fdatasync of its block.
Updates/s = records written / seconds the flusher spent sweeping (its I/O and
syncs included); the writers' own time is not counted (they run in memory).

    kvstore experiment run p000_bosc_sweep   -> OUT/p000_bosc_sweep.{csv,png}
    kvstore experiment run p000_bosc_sweep -- --memory-mb 2 8 32 --rates 10000 100000 --seconds 3
"""
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

from kvstore import Store, durability
from kvstore._bench import lib
from kvstore.experiments import common

NAME = "p000_bosc_sweep"
QUICK = ["--buckets", "1024", "--keys", "10000", "--memory-mb", "2", "--rates", "10000", "--seconds", "1",
         "--naive-updates", "200", "--rounds", "1"]
VALUE = 85  # bytes, the paper's IoT record


def preload(store, datafile, keys):
    value = b"v" * VALUE
    for k in keys:
        store.set(k, value)
    datafile.sync()


def run_point(workdir, buckets, nkeys, seconds, interval_ms, max_memory=0, rate=0.0, seed=1):
    """Random updates for `seconds` through a real flusher. Returns the flusher's counters."""
    d = tempfile.mkdtemp(dir=workdir)  # removed after the point: points must not fill the disk
    store = Store(max_memory=0)  # unbounded while preloading
    df = durability.DataFile(store, d, buckets=buckets, flush_interval_ms=interval_ms, truncate_log=False)
    df.start(None)
    try:
        keys = [b"sensor:%09d" % i for i in range(nkeys)]
        preload(store, df, keys)
        store.max_memory = max_memory
        if max_memory:  # start from a full memory, as a server in the NHD regime
            df.sync()
        s0 = df.stats()
        stop = time.monotonic() + seconds
        rng = random.Random(seed)
        n = 0
        value = b"u" * VALUE
        t0 = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= stop:
                break
            if rate and n >= (now - t0) * rate:
                time.sleep(0.0005)
                continue
            for _ in range(256):
                store.set(keys[rng.randrange(nkeys)], value)  # waits for the flusher when memory is full
            n += 256
        df.sync()  # the last updates too
        s1 = df.stats()
    finally:
        df.close()
        shutil.rmtree(d, ignore_errors=True)
    recs = s1["records"] - s0["records"]
    sweep_s = (s1["sweep_ns"] - s0["sweep_ns"]) / 1e9
    return {"updates": n, "records": recs, "sweeps": s1["sweeps"] - s0["sweeps"],
            "blocks_written": s1["blocks_written"] - s0["blocks_written"], "sweep_s": sweep_s,
            "updates_per_s": recs / sweep_s if sweep_s else 0.0,
            "records_per_block": recs / max(1, s1["blocks_written"] - s0["blocks_written"])}


def naive_point(workdir, buckets, n, seed=1):
    d = tempfile.mkdtemp(dir=workdir)
    try:
        s = lib.bosc_bench_naive(os.path.join(d, "naive.dat").encode(), buckets, n, VALUE, seed)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if s < 0:
        raise OSError(-int(s), os.strerror(-int(s)))
    return {"updates": n, "records": n, "sweeps": 0, "blocks_written": n, "sweep_s": s,
            "updates_per_s": n / s, "records_per_block": 1.0}


def add_args(ap):
    ap.add_argument("--buckets", type=int, default=16384, help="data-file home blocks (4 KiB each)")
    ap.add_argument("--keys", type=int, default=200_000, help="distinct keys (~12 per block by default)")
    ap.add_argument("--memory-mb", type=float, nargs="+", default=[4, 8, 16, 32, 64])
    ap.add_argument("--rates", type=float, nargs="+", default=[2_000, 10_000, 50_000, 200_000])
    ap.add_argument("--interval-ms", type=int, default=1000, help="sweep interval of the rate series")
    ap.add_argument("--seconds", type=float, default=4.0, help="length of a point")
    ap.add_argument("--naive-updates", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5, help="points are repeated, interleaved; medians and min-max")
    ap.add_argument("--dir", default=None, help="where the data files go (default: the system's temporary "
                                                "directory; it must be on a real disk, not tmpfs)")


def measure(args):
    workdir = tempfile.mkdtemp(prefix="kv-bosc-", dir=args.dir)
    points = ([("naive", 0, 0)] + [("memory", m, 0) for m in args.memory_mb] + [("rate", 0, r) for r in args.rates])
    results = {p: [] for p in points}
    bar = common.Progress(args.rounds * len(points), "points")
    try:
        for rnd in range(args.rounds):
            for p in points:
                kind, mem, rate = p
                if kind == "naive":
                    r = naive_point(workdir, args.buckets, args.naive_updates, seed=rnd + 1)
                elif kind == "memory":
                    r = run_point(workdir, args.buckets, args.keys, args.seconds, 60_000,
                                  max_memory=int(mem * 1024 * 1024), seed=rnd + 1)
                else:
                    r = run_point(workdir, args.buckets, args.keys, args.seconds, args.interval_ms, rate=rate,
                                  seed=rnd + 1)
                bar.step(f"[round {rnd + 1}/{args.rounds}] {kind} memory={mem} MB rate={rate:g}/s: "
                          f"{r['updates_per_s']:,.0f} effective updates/s, {r['records_per_block']:.2f} records "
                          f"per block written, {r['sweeps']} sweeps")
                results[p].append(r)
    finally:
        bar.close()
        shutil.rmtree(workdir, ignore_errors=True)
    naive = statistics.median(r["updates_per_s"] for r in results[("naive", 0, 0)])
    rows = []
    for (kind, mem, rate), rs in results.items():
        med = statistics.median(r["updates_per_s"] for r in rs)
        rows.append({"series": kind, "memory_mb": mem, "rate": rate,
                     "updates_per_s": round(med), "vs_naive": round(med / naive, 2),
                     "records_per_block": round(statistics.median(r["records_per_block"] for r in rs), 2),
                     "records_per_sweep": round(statistics.median(r["records"] / max(1, r["sweeps"]) for r in rs)),
                     "rounds": len(rs), "runs": " ".join(str(round(r["updates_per_s"])) for r in rs),
                     # the setup, for the plot's labels when it is redrawn from the CSV
                     "keys": args.keys, "buckets": args.buckets, "interval_ms": args.interval_ms,
                     "naive_file": "preallocated"})
    common.write_csv(args.csv, rows)
    common.log(f"wrote {args.csv}")
    return common.read_csv(args.csv)


def draw(rows, path):
    plt = common.pyplot()
    # CSVs written before the setup columns existed were made with the default setup
    setup = {k: int(rows[0].get(k) or common.parser(sys.modules[__name__]).get_default(k))
             for k in ("keys", "buckets", "interval_ms")}
    naive_row = next(r for r in rows if r["series"] == "naive")
    naive = float(naive_row["updates_per_s"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, kind, xkey, xlabel in ((axes[0], "memory", "memory_mb", "memory bound (MB), writers at full speed"),
                                   (axes[1], "rate", "rate", f"request rate (updates/s), a sweep every "
                                                             f"{setup['interval_ms']} ms")):
        rs = sorted((r for r in rows if r["series"] == kind), key=lambda r: float(r[xkey]))
        xs, ys = [float(r[xkey]) for r in rs], [float(r["updates_per_s"]) for r in rs]
        runs = [[float(x) for x in str(r.get("runs") or r["updates_per_s"]).split()] for r in rs]
        ax.errorbar(xs, ys, yerr=[[y - min(v) for y, v in zip(ys, runs)], [max(v) - y for y, v in zip(ys, runs)]],
                    fmt="o-", capsize=3, label="BOSC sweep (median, bars: min-max of rounds)")
        for r, x, y in zip(rs, xs, ys):
            ax.annotate(f"{float(r['records_per_block']):.1f}/blk", (x, y),
                        textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        nv = [float(x) for x in str(naive_row.get("runs") or naive).split()]
        ax.axhline(naive, color="tab:red", ls="--",
                   label=f"naive in place (+fdatasync{', file preallocated' if naive_row.get('naive_file') else ''})"
                         f": {naive:,.0f}/s")
        ax.axhspan(min(nv), max(nv), color="tab:red", alpha=0.1)
        ax.axhline(10 * naive, color="tab:red", ls=":", label="10 x naive (target)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("effective disk updates / s")
    fig.suptitle(f"BOSC effective updates: {setup['keys']:,} keys in {setup['buckets']:,} blocks, {VALUE}-byte "
                 f"values (medians of {rows[0]['rounds']}); writers and the flusher in one process, "
                 f"{common.cores_note()}", fontsize=9)
    common.save_figure(fig, path, dpi=120)


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
