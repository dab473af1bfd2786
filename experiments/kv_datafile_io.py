"""The data file's sweep I/O modes side by side (--datafile-io): one controlled sweep, and
memory-full inserts of new keys.

sweep (in-process, the real flusher over a Store, as p000_bosc_sweep): --sweep-keys keys of
85 B in --sweep-buckets buckets are written and then rewritten (both home copies of every
bucket on disk), then --sweep-share of them are updated and that one sweep is measured: the
flusher thread's CPU per record (CLOCK_THREAD_CPUTIME_ID), the process's CPU per record over
the sweep (the flusher plus io_uring's kernel workers and whatever the kernel bills to the
process; the main thread only waits), the sweep's time and its I/O time, MB/s over the sweep,
blocks per write call. Modes alternate in one process, the order rotated every round.

nhd: one NHD server per mode (kvstore --durability none --data-file --max-memory M --datafile-io
MODE: a cache spilling to its BOSC data file, as p000_nhd's NHD), each filled until it evicts
and its file holds --file-ratio x memory. Then, per round, each mode in turn (the order rotated
every round: A B C D, B C D A, ...): an unmeasured warm-up of as many new keys as its memory
holds, then a measured run of as many again (or --max-seconds) at --pipeline. The servers not
measured must have stopped writing first (their flusher's backlog; bounded by --idle-seconds).

Per run, from INFO persistence and /proc (p000_nhd's point): insert rate, server CPU per
request, the flusher's CPU per record written (datafile_sweep_cpu_seconds: the flusher thread
only; io_uring's kernel workers and the block layer's completions are not in it, the server's
CPU is), the sweep's write and read MB/s over its own time, records per block, KiB per system
call, the longest wait. The summary gives, per part, each mode's medians (min-max) and its ratios to
buffered, paired by round.

    kvstore experiment run kv_datafile_io   -> OUT/kv_datafile_io.{csv,png}
"""
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

from kvstore import Node, Store, durability
from kvstore.config import parse_size
from kvstore.experiments import common
from kvstore.experiments import p000_nhd as nhd

NAME = "kv_datafile_io"
MODES = ("buffered", "direct", "uring", "uring-direct")
QUICK = ["--rounds", "1", "--max-memory", "16mb", "--max-seconds", "5", "--prefill-seconds", "20",
         "--sweep-buckets", "1024", "--sweep-keys", "20000"]
FIELDS = {"sweep": ("flusher_us_per_record", "process_us_per_record", "sweep_s", "io_s", "sweep_write_MBps",
                    "sweep_read_MBps", "blocks_per_write_call"),
          "nhd": ("throughput", "cpu_us_per_req", "flusher_us_per_record", "sweep_write_MBps", "sweep_read_MBps",
                  "records_per_block", "max_latency_ms")}


def sweep_point(base, mode, args, rnd):
    """One measured sweep in mode (see the module's doc). Returns its row."""
    d = tempfile.mkdtemp(dir=base)
    store = Store(max_memory=0)
    df = durability.DataFile(store, d, buckets=args.sweep_buckets, flush_interval_ms=600000, truncate_log=False,
                             io=mode)
    df.start(None)
    try:
        keys = [b"sensor:%09d" % i for i in range(args.sweep_keys)]
        for value in (b"v" * 85, b"w" * 85):  # every bucket's chain written twice: both home copies on disk
            for k in keys:
                store.set(k, value)
            df.sync()
        for k in random.Random(rnd).sample(keys, int(len(keys) * args.sweep_share)):
            store.set(k, b"u" * 85)
        s0, c0 = df.stats(), common.own_cpu_seconds()
        df.sync()
        s1, c1 = df.stats(), common.own_cpu_seconds()
    finally:
        df.close()
        shutil.rmtree(d, ignore_errors=True)
    dd = {k: s1[k] - s0[k] for k in ("records", "blocks_written", "write_calls", "flusher_cpu_ns", "sweep_ns", "io_ns",
                                      "bytes_written", "bytes_read")}
    rec, sweep = max(1, dd["records"]), dd["sweep_ns"] / 1e9
    return {"part": "sweep", "mode": mode, "round": rnd, "records_written": dd["records"],
            "flusher_us_per_record": round(dd["flusher_cpu_ns"] / 1e3 / rec, 3),
            "process_us_per_record": round((c1 - c0) * 1e6 / rec, 3), "sweep_s": round(sweep, 3),
            "io_s": round(dd["io_ns"] / 1e9, 3),
            "sweep_write_MBps": round(dd["bytes_written"] / sweep / 1e6, 1) if sweep else "",
            "sweep_read_MBps": round(dd["bytes_read"] / sweep / 1e6, 1) if sweep else "",
            "blocks_per_write_call": round(dd["blocks_written"] / max(1, dd["write_calls"]), 2),
            "records_per_block": round(rec / max(1, dd["blocks_written"]), 2)}


class Server(nhd.Server):
    """p000_nhd's NHD server with --datafile-io mode."""

    def __init__(self, mode, base, args):  # pylint: disable=super-init-not-called
        self.label, self.mode = "NHD", mode
        self.dir = os.path.join(base, mode)
        os.makedirs(self.dir)
        self.node = Node(port=0, data_dir=self.dir, durability="none", threads=args.kv_threads, data_file=True,
                         max_memory=args.max_memory, data_buckets=args.data_buckets, datafile_io=mode)
        self.data_path = os.path.join(self.dir, "data.kvd")


def measure(args):
    base = tempfile.mkdtemp(prefix="kv-dfio-", dir=args.dir)
    rows, servers = [], []
    try:
        if "sweep" in args.parts:
            for rnd in range(args.rounds):
                k = rnd % len(args.modes)
                for mode in args.modes[k:] + args.modes[:k]:
                    row = sweep_point(base, mode, args, rnd)
                    rows.append(row)
                    common.write_csv(args.csv, rows)
                    common.log(f"sweep round {rnd} {mode:12s} flusher {row['flusher_us_per_record']} us/rec, process "
                               f"{row['process_us_per_record']} us/rec, sweep {row['sweep_s']} s (I/O {row['io_s']} s)")
        if "nhd" not in args.parts:
            return rows
        load = nhd.Load(args)
        servers = [Server(m, base, args).start() for m in args.modes]
        keys = {}
        for s in servers:
            keys[s.mode] = nhd.prefill(s, load, args)
            nhd.wait_flusher_idle(s.node, args)
        bar = common.Progress(args.rounds * len(servers), "runs")
        for rnd in range(args.rounds):
            k = rnd % len(servers)
            for s in servers[k:] + servers[:k]:
                n = args.requests or keys[s.mode]
                full = nhd.warm(s, load, keys[s.mode], args)
                for o in servers:
                    if o is not s:
                        nhd.wait_flusher_idle(o.node, args)
                row = nhd.point(s, load, args.pipeline, n, args, rnd)
                row.update(part="nhd", mode=s.mode, start_full=round(full, 3))
                rows.append(row)
                common.write_csv(args.csv, rows)
                bar.step(f"round {rnd} {s.mode:12s} {row['throughput']:>9,} SET/s  cpu {row['cpu_us_per_req']:.2f} "
                         f"us/req  flusher {row.get('flusher_us_per_record', '')} us/rec  write "
                         f"{row.get('sweep_write_MBps', '')} read {row.get('sweep_read_MBps', '')} MB/s (sweep)  "
                         f"max {row['max_latency_ms']:,} ms")
        bar.close()
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(base, ignore_errors=True)
    return rows


def summary(rows, part):
    """For part's rows: {mode: {field: (median, min, max)}} and {mode: {field: (median, min,
    max) of the ratio to buffered in the same round}}."""
    by = {}
    for r in rows:
        if r.get("part", "nhd") == part:
            by.setdefault(r["mode"], {}).setdefault(int(r["round"]), r)
    med, ratio = {}, {}
    base = by.get("buffered", {})
    for mode, rounds in by.items():
        med[mode], ratio[mode] = {}, {}
        for f in FIELDS[part]:
            vals = [nhd._num(r.get(f)) for r in rounds.values() if nhd._num(r.get(f)) is not None]
            if vals:
                med[mode][f] = (statistics.median(vals), min(vals), max(vals))
            q = [nhd._num(r.get(f)) / nhd._num(base[n].get(f)) for n, r in rounds.items()
                 if n in base and nhd._num(r.get(f)) is not None and nhd._num(base[n].get(f))]
            if q:
                ratio[mode][f] = (statistics.median(q), min(q), max(q))
    return med, ratio


def report(rows):
    for part in FIELDS:
        med, ratio = summary(rows, part)
        if not med:
            continue
        print(f"\n{part}: median (min-max) of the rounds")
        print(f"{'mode':13s}" + "".join(f"{f:>26s}" for f in FIELDS[part]))
        for table, fmt in ((med, "%.4g (%.4g-%.4g)"), (ratio, "%.3f (%.3f-%.3f)")):
            if table is ratio:
                print("ratio to buffered, paired by round:")
            for mode in table:
                print(f"{mode:13s}" + "".join(f"{fmt % table[mode][f]:>26s}" if f in table[mode] else f"{'':>26s}"
                                              for f in FIELDS[part]))


def draw(rows, path):
    plt = common.pyplot()
    shown = [("sweep", "flusher_us_per_record"), ("sweep", "process_us_per_record"), ("sweep", "sweep_s"),
             ("nhd", "throughput"), ("nhd", "cpu_us_per_req"), ("nhd", "flusher_us_per_record")]
    shown = [(p, f) for p, f in shown if summary(rows, p)[0]]
    fig, axes = plt.subplots(1, max(1, len(shown)), figsize=(3.6 * max(1, len(shown)), 3.6), squeeze=False)
    for ax, (part, f) in zip(axes[0], shown):
        med, _ = summary(rows, part)
        modes = list(med)
        vals = [med[m].get(f, (0, 0, 0)) for m in modes]
        ax.bar(range(len(modes)), [v[0] for v in vals],
               yerr=[[v[0] - v[1] for v in vals], [v[2] - v[0] for v in vals]], capsize=3)
        ax.set_xticks(range(len(modes)), modes, rotation=20)
        ax.set_title(f"{part}: {f}", fontsize=9)
    fig.suptitle("--datafile-io (median, min-max of rounds; "
                 + common.cores_note(shares="server (nhd), load generator (nhd) and flusher") + ")", fontsize=9)
    common.save_figure(fig, path)


def add_args(ap):
    ap.add_argument("--parts", nargs="+", choices=("sweep", "nhd"), default=["sweep", "nhd"],
                    help="default: both")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="default: all four")
    ap.add_argument("--sweep-buckets", type=int, default=65536, help="sweep: the file's buckets (default 65536)")
    ap.add_argument("--sweep-keys", type=int, default=800_000, help="sweep: keys (default 800000: ~12 a bucket)")
    ap.add_argument("--sweep-share", type=float, default=0.5,
                    help="sweep: the share of the keys the measured sweep writes (default 0.5)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-memory", type=parse_size, default="256mb", help="each server's --max-memory (default 256mb)")
    ap.add_argument("--data-buckets", type=int, help="default: max-memory / 4 KiB")
    ap.add_argument("--file-ratio", type=float, default=2.0,
                    help="grow each file to this many times --max-memory before measuring (default 2.0)")
    ap.add_argument("--prefill-seconds", type=float, default=300, help="bound of each unmeasured fill (default 300)")
    ap.add_argument("--requests", type=int, default=0, help="inserts per run; 0 (default): as many as memory holds")
    ap.add_argument("--max-seconds", type=float, default=30, help="bound of each measured run (default 30)")
    ap.add_argument("--idle-seconds", type=float, default=60,
                    help="bound of the wait for the other servers' flushers to stop writing (default 60)")
    ap.add_argument("--pipeline", type=int, default=16, help="default 16")
    ap.add_argument("--conns", type=int, default=50, help="default 50")
    ap.add_argument("--value-size", type=int, default=85, help="default 85")
    ap.add_argument("--kv-threads", type=int, default=2, help="pollers (default 2)")
    ap.add_argument("--bench-threads", type=int, default=2, help="default 2")
    ap.add_argument("--dir", help="where the run's temp dir goes (default: $TMPDIR); needs ~4x --max-memory per mode")


def check_args(args):
    if isinstance(args.max_memory, str):
        args.max_memory = parse_size(args.max_memory)
    if args.data_buckets is None:
        args.data_buckets = max(1024, args.max_memory // nhd.BLK)


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
