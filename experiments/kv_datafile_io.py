"""The data file's sweep I/O modes side by side (--datafile-io): memory-full inserts of new keys.

One NHD server per mode (kvstore --durability none --data-file --max-memory M --datafile-io
MODE: a cache spilling to its BOSC data file, as p000_nhd's NHD), each filled until it evicts
and its file holds --file-ratio x memory. Then, per round, each mode in turn (the order rotated
every round: A B C D, B C D A, ...): an unmeasured warm-up of as many new keys as its memory
holds, then a measured run of as many again (or --max-seconds) at --pipeline. The servers not
measured must have stopped writing first (their flusher's backlog; bounded by --idle-seconds).

Per run, from INFO persistence and /proc (p000_nhd's point): insert rate, server CPU per
request, the flusher's CPU per record written (datafile_sweep_cpu_seconds: the flusher thread
only; io_uring's kernel workers and the block layer's completions are not in it, the server's
CPU is), the sweep's write and read MB/s over its own time, records per block, KiB per system
call, the longest wait. The summary gives each mode's medians (min-max) as ratios to buffered,
paired by round.

    kvstore experiment run kv_datafile_io   -> OUT/kv_datafile_io.{csv,png}
"""
import os
import shutil
import statistics
import sys
import tempfile
import time

from kvstore import Node
from kvstore.config import parse_size
from kvstore.experiments import common
from kvstore.experiments import p000_nhd as nhd

NAME = "kv_datafile_io"
MODES = ("buffered", "direct", "uring", "uring-direct")
QUICK = ["--rounds", "1", "--max-memory", "16mb", "--max-seconds", "5", "--prefill-seconds", "20"]
FIELDS = ("throughput", "cpu_us_per_req", "flusher_us_per_record", "sweep_write_MBps", "sweep_read_MBps",
          "records_per_block", "max_latency_ms")


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
                row.update(mode=s.mode, start_full=round(full, 3))
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


def _num(v):
    return float(v) if v not in ("", None) else None


def summary(rows):
    """{mode: {field: (median, min, max)}} and {mode: {field: (median, min, max) of the ratio
    to buffered in the same round}}."""
    by = {}
    for r in rows:
        by.setdefault(r["mode"], {}).setdefault(int(r["round"]), r)
    med, ratio = {}, {}
    for mode, rounds in by.items():
        med[mode], ratio[mode] = {}, {}
        for f in FIELDS:
            vals = [_num(r.get(f)) for r in rounds.values() if _num(r.get(f)) is not None]
            if vals:
                med[mode][f] = (statistics.median(vals), min(vals), max(vals))
            base = by.get("buffered", {})
            q = [_num(r.get(f)) / _num(base[n].get(f)) for n, r in rounds.items()
                 if n in base and _num(r.get(f)) is not None and _num(base[n].get(f))]
            if q:
                ratio[mode][f] = (statistics.median(q), min(q), max(q))
    return med, ratio


def report(rows):
    med, ratio = summary(rows)
    print(f"{'mode':13s}" + "".join(f"{f:>26s}" for f in FIELDS))
    for mode in med:
        print(f"{mode:13s}" + "".join(f"{'%.4g (%.4g-%.4g)' % med[mode][f]:>26s}" if f in med[mode] else f"{'':>26s}"
                                      for f in FIELDS))
    print("ratio to buffered, paired by round: median (min-max)")
    for mode in ratio:
        print(f"{mode:13s}" + "".join(f"{'%.3f (%.3f-%.3f)' % ratio[mode][f]:>26s}" if f in ratio[mode]
                                      else f"{'':>26s}" for f in FIELDS))


def draw(rows, path):
    plt = common.pyplot()
    med, _ = summary(rows)
    modes = list(med)
    shown = ("throughput", "flusher_us_per_record", "cpu_us_per_req", "sweep_write_MBps")
    fig, axes = plt.subplots(1, len(shown), figsize=(4 * len(shown), 3.6))
    for ax, f in zip(axes, shown):
        vals = [med[m].get(f, (0, 0, 0)) for m in modes]
        ax.bar(range(len(modes)), [v[0] for v in vals],
               yerr=[[v[0] - v[1] for v in vals], [v[2] - v[0] for v in vals]], capsize=3)
        ax.set_xticks(range(len(modes)), modes, rotation=20)
        ax.set_title(f, fontsize=9)
    fig.suptitle("--datafile-io: memory-full inserts of new keys (median, min-max of rounds; "
                 + common.cores_note(shares="server, load generator and flusher share 2 CPUs") + ")", fontsize=9)
    common.save_figure(fig, path)


def add_args(ap):
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="default: all four")
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
