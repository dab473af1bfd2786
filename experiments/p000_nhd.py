"""Paper 000's NHD at a realistic scale: memory-full inserts of new keys, NH vs NHD side by side.

NH  = kvstore --durability none, everything in memory (no data file, no memory bound),
      prefilled with as many keys as NHD holds in memory.
NHD = kvstore --durability none --data-file --max-memory M (a cache that spills to its
      BOSC data file): memory is filled first, then the file is grown until it holds
      --file-ratio x M on disk, so every measured insert waits for the flusher to make room.

Each round runs NH at each pipeline depth, then NHD (A B, B A ... by round) with `kvstore bench`
inserting NEW keys (keyspace 10^12, a fresh seed per run), bounded in requests (by default
as many as NHD's memory holds: a run shorter than an eviction cycle measures inserts that
never wait) and in seconds. Right before NHD's runs of a round, as many new keys as its
memory holds are inserted at P16 (while NH ran, the flusher cleaned NHD's backlog: a run
started on that evicts clean keys for free); NH is emptied and refilled when its runs have
grown it past 1.5x NHD's memory keys (neither measured). At the default scale (3gb) a run
takes ~30 min (plus up to --idle-seconds per NH run waiting for NHD's flusher), ~10 GB of RAM and
~35 GB of disk (the file ends at up to ~7x memory: see --dir).
Before each NH run NHD's flusher must have stopped writing (bounded by --idle-seconds), and
NHD's CPU during NH's runs is in the CSV (NHD_cpu_s) as the check; the order of NH and NHD
is reversed every other round.
Per NHD point, from the deltas of INFO persistence over the run: records per block written,
KiB per write and read system call (when the server counts its calls), the data file's write
and read MB/s (over the run's wall time, and over the sweeps' own time when the server reports
datafile_sweep_seconds), the flusher thread's CPU (INFO datafile_sweep_cpu_seconds, else
/proc/PID/task/TID/stat of a thread named for the flusher, else of the busiest unnamed
non-main thread: the CSV's flusher_cpu_source says which) and server CPU per request for
both. fio's sequential 1 MiB O_DIRECT write and read bandwidth on the same filesystem is
measured in the same run (before and after the rounds) as the bar the sweep is held to (the
issue's target: >= 50 %). Paper 000: NHD/NH = 0.71 (160 M records in memory); the issue's
targets: NHD/NH >= 0.5 at P16, >= 8 records per block written, with >= 10 M keys in memory
(the report says how many NHD held).
All files (both data dirs, fio's file) live in one temp dir (--dir), removed at the end.

    kvstore experiment run p000_nhd            -> OUT/p000_nhd.{csv,png}
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from kvstore import Node
from kvstore.config import parse_size
from kvstore.experiments import common

NAME = "p000_nhd"
QUICK = ["--rounds", "1", "--max-memory", "16mb", "--max-seconds", "8",
         "--fio-size", "64mb", "--fio-seconds", "2", "--prefill-seconds", "15"]

KEYSPACE = 10 ** 12  # new keys: with a fresh seed per run, a repeat is a one-in-10^5 event at 10 M keys
PAPER = {"NHD/NH": 0.71}
TARGET = {"NHD/NH": 0.5, "records_per_block": 8, "sweep_share_of_fio": 0.5}
BLK = 4096


# ---- what the server tells (INFO persistence, /proc)

def persistence(node):
    with node.client() as c:
        return c.info("persistence")


def thread_cpu(pid):
    """{tid: (comm, CPU seconds)} of every thread of pid (empty once it is gone)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            cpu = common.stat_cpu_seconds(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue  # the thread ended meanwhile
        out[int(tid)] = (comm, cpu)
    return out


def flusher_cpu(node, info, tid=None):
    """(CPU seconds of the data file's flusher so far, where the number comes from, the thread
    read when it is the busiest unnamed one). Pass the tid returned at the start of a run to
    read the same thread at its end: the busiest thread may change during the run."""
    if "datafile_sweep_cpu_seconds" in info:
        return float(info["datafile_sweep_cpu_seconds"]), "info", None
    threads = thread_cpu(node.pid)
    named = [cpu for comm, cpu in threads.values() if any(w in comm for w in ("flush", "bosc", "sweep"))]
    if named:
        return sum(named), "thread-name", None
    if tid is not None:  # the thread chosen at the start of the run (None if it has gone)
        return (threads[tid][1], "busiest-unnamed-thread", tid) if tid in threads else (None, "none", None)
    # The flusher is unnamed today: the process's own name, like the main thread and the
    # loader (which reads only for misses on evicted keys, none with new keys): take the busiest.
    main = threads.get(node.pid, ("", 0))[0]
    unnamed = [(cpu, t) for t, (comm, cpu) in threads.items() if t != node.pid and comm == main]
    if unnamed:
        cpu, t = max(unnamed)
        return cpu, "busiest-unnamed-thread", t
    return None, "none", None


def datafile_counters(node, flusher_tid=None):
    """The data file's counters now: bytes from the INFO byte counters when the server has
    them, else blocks x 4 KiB; sweep seconds only when reported. flusher_tid: the thread
    whose CPU to read as the flusher's (the one chosen by an earlier call, see flusher_cpu)."""
    i = persistence(node)
    c = {"records": int(i.get("datafile_records_written", 0)), "blocks_w": int(i.get("datafile_blocks_written", 0)),
         "blocks_r": int(i.get("datafile_blocks_read", 0)), "memory_keys": int(i.get("memory_keys", 0)),
         "datafile_keys": int(i.get("datafile_keys", 0)), "evicted": int(i.get("datafile_evicted_keys", 0))}
    c["bytes_w"] = int(i["datafile_bytes_written"]) if "datafile_bytes_written" in i else c["blocks_w"] * BLK
    c["bytes_r"] = int(i["datafile_bytes_read"]) if "datafile_bytes_read" in i else c["blocks_r"] * BLK
    c["bytes_source"] = "info" if "datafile_bytes_written" in i else "blocks"
    c["sweep_s"] = float(i["datafile_sweep_seconds"]) if "datafile_sweep_seconds" in i else None
    c["io_s"] = float(i["datafile_io_seconds"]) if "datafile_io_seconds" in i else None
    for k in ("write_calls", "read_calls"):  # how far the sweep coalesces its blocks into one system call
        c[k] = int(i[f"datafile_{k}"]) if f"datafile_{k}" in i else None
    c["flusher_cpu"], c["flusher_source"], c["flusher_tid"] = flusher_cpu(node, i, flusher_tid)
    return c


def wait_flusher_idle(node, args):
    """Wait (bounded by --idle-seconds) until NHD's flusher has stopped writing: INFO's blocks
    written unchanged over two reads 0.5 s apart. Measuring NH while NHD's flusher writes out
    its backlog on the same cores would slow NH and flatter NHD/NH. Returns the seconds waited
    and whether it went idle."""
    t0 = time.monotonic()
    last = datafile_counters(node)["blocks_w"]
    while time.monotonic() - t0 < args.idle_seconds:
        time.sleep(0.5)
        now = datafile_counters(node)["blocks_w"]
        if now == last:
            return time.monotonic() - t0, True
        last = now
    common.log(f"NHD's flusher still writing after --idle-seconds {args.idle_seconds:g}")
    return time.monotonic() - t0, False


def file_size(path):
    """(apparent size, bytes allocated on disk) of the data file: sparse, empty buckets cost nothing."""
    try:
        st = os.stat(path)
    except OSError:
        return 0, 0
    return st.st_size, st.st_blocks * 512


# ---- the servers and the load

class Server:
    def __init__(self, label, base, args):
        self.label = label
        self.dir = os.path.join(base, label)
        os.makedirs(self.dir)
        settings = {"durability": "none", "threads": args.kv_threads}
        if label == "NHD":
            settings.update(data_file=True, max_memory=args.max_memory, data_buckets=args.data_buckets)
        self.node = Node(port=0, data_dir=self.dir, **settings)
        self.data_path = os.path.join(self.dir, "data.kvd")

    def start(self):
        self.node.start(timeout=60)
        return self

    def cpu(self):
        return common.cpu_seconds(self.node.pid)

    def stop(self):
        self.node.stop(timeout=30)  # then SIGKILL: nothing here needs to survive


class Load:
    """kvstore bench inserting new keys: a fresh seed for every run."""

    def __init__(self, args):
        self.args, self.seed = args, 1000

    def run(self, port, pipeline, requests, seconds):
        from kvstore import bench as kvbench
        self.seed += 1
        r = kvbench.run(port=port, threads=self.args.bench_threads, conns=self.args.conns, pipeline=pipeline,
                        value_size=self.args.value_size, keyspace=KEYSPACE, ratio="1:0", requests=requests,
                        duration=seconds, seed=self.seed)
        if r["errors"]:
            raise RuntimeError(f"kvstore bench on port {port}: {r['errors']} errors, first: {r['first_error']}")
        return r


def prefill(nhd, load, args):
    """Fill NHD's memory (until it evicts), then grow its file to --file-ratio x memory
    (bounded by --prefill-seconds). Returns how many keys NHD then holds in memory (NH is
    filled with as many by refill_nh)."""
    deadline = time.monotonic() + args.prefill_seconds
    step = max(20_000, args.max_memory // 400)  # ~2/3 of memory per step at ~270 B a key (see --max-memory)
    target = args.file_ratio * args.max_memory
    while time.monotonic() < deadline:
        load.run(nhd.node.port, 16, step, max(1.0, deadline - time.monotonic()))
        c = datafile_counters(nhd.node)
        alloc = file_size(nhd.data_path)[1]
        common.log(f"prefill NHD: {c['memory_keys']:,} keys in memory, {c['datafile_keys']:,} in the file, "
                   f"{alloc / 2**20:,.0f} MiB on disk (target {target / 2**20:,.0f})")
        if c["evicted"] and alloc >= target:
            break
    else:
        common.log(f"prefill NHD: stopped at --prefill-seconds {args.prefill_seconds}: the file has "
                   f"{file_size(nhd.data_path)[1] / args.max_memory:.2f}x memory")
    return datafile_counters(nhd.node)["memory_keys"]


def refill_nh(nh, load, keys, args):
    """NH holding `keys` keys, as NHD holds in memory: filled at the start, and emptied
    (FLUSHALL) and filled again once its runs have grown it past 1.5x that, so its table
    stays the size of NHD's memory and the machine's RAM holds the run (not measured)."""
    with nh.node.client() as c:
        have = c.dbsize()
        if have and have < 1.5 * keys:
            return
        if have:
            c.flushall()
    t0 = time.monotonic()
    load.run(nh.node.port, 16, keys, args.prefill_seconds)
    common.log(f"fill NH: {keys:,} keys in {time.monotonic() - t0:.1f} s")


def fio(directory, rw, args):
    """fio's sequential 1 MiB O_DIRECT bandwidth (MB/s) of rw (write or read) in directory,
    or None when fio is missing or fails (the run goes on without the bar)."""
    if not shutil.which("fio"):
        common.log("fio is not installed (make deps-test installs it): no disk bar in this run")
        return None
    cmd = ["fio", "--name=seq", f"--filename={os.path.join(directory, 'fio.dat')}", f"--rw={rw}", "--bs=1M",
           "--direct=1", "--ioengine=libaio", "--iodepth=16", f"--size={args.fio_size}", "--runtime",
           str(args.fio_seconds), "--time_based=0", "--output-format=json"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.fio_seconds + 120, check=True).stdout
        job = json.loads(out[out.index("{"):])["jobs"][0]
        return job[rw]["bw_bytes"] / 1e6
    except (subprocess.SubprocessError, ValueError, KeyError, IndexError) as e:
        common.log(f"fio {rw} failed ({e}): no disk bar for it")
        return None


def measure_fio(base, args, rows, when):
    d = os.path.join(base, "fio")
    os.makedirs(d, exist_ok=True)
    for rw in ("write", "read"):  # write first: read needs the file
        bw = fio(d, rw, args)
        rows.append({"round": when, "server": "fio", "pipeline": "", "kind": rw, "MBps": round(bw, 1) if bw else ""})
        common.log(f"fio {when}: sequential 1 MiB direct {rw} {bw or 0:,.0f} MB/s")
    shutil.rmtree(d, ignore_errors=True)


def used_memory(node):
    with node.client() as c:
        return int(c.info("memory")["used_memory"])


def warm(nhd, load, keys, args):
    """NHD in its steady state right before its run (unmeasured): as many new keys as its memory
    holds, inserted at P16. While NH ran, NHD's flusher cleaned its backlog; a run started on
    that evicts clean keys for free and never waits for a write (a 512 MiB run inserted 1.5 M
    keys and wrote no block). After a whole memory's worth of inserts, memory holds only this
    load's keys, dirty or written while it ran. Returns the share of memory then used."""
    load.run(nhd.node.port, 16, keys, args.prefill_seconds)
    return used_memory(nhd.node) / args.max_memory


def table_buckets(node):
    with node.client() as c:
        return int(c.info("memory").get("table_buckets", 0))


def point(srv, load, pipeline, n, args, rnd, other=None):
    """One measured run on srv; other: the server not measured (its CPU over the run is
    recorded as a check: NHD's flusher must not be working while NH is measured)."""
    before = datafile_counters(srv.node) if srv.label == "NHD" else None
    buckets0 = table_buckets(srv.node)
    ocpu0 = other.cpu() if other else None
    cpu0, w0 = srv.cpu(), time.monotonic()
    r = load.run(srv.node.port, pipeline, n, args.max_seconds)
    wall, cpu = time.monotonic() - w0, srv.cpu() - cpu0
    row = {"round": rnd, "server": srv.label, "pipeline": pipeline, "kind": "insert", "requests": r["requests"],
           "throughput": round(r["throughput"]), "p99_us": round(r["lat_p99_us"], 1),
           "max_latency_ms": round(r["lat_max_us"] / 1000, 1), "wall_s": round(wall, 3),
           "server_cpu_s": round(cpu, 3), "cpu_us_per_req": round(cpu / max(1, r["requests"]) * 1e6, 2),
           # the hash table grew (an incremental rehash ran) during the run: NH grows, NHD's memory is bounded
           "table_buckets_grew": int(table_buckets(srv.node) > buckets0)}
    if other:
        row[f"{other.label}_cpu_s"] = round(other.cpu() - ocpu0, 3)
    if before:
        after = datafile_counters(srv.node, before["flusher_tid"])
        d = {k: after[k] - before[k] for k in ("records", "blocks_w", "blocks_r", "bytes_w", "bytes_r")}
        size, alloc = file_size(srv.data_path)
        row.update(records_written=d["records"], blocks_written=d["blocks_w"], blocks_read=d["blocks_r"],
                   records_per_block=round(d["records"] / d["blocks_w"], 2) if d["blocks_w"] else "",
                   write_MBps=round(d["bytes_w"] / wall / 1e6, 1), read_MBps=round(d["bytes_r"] / wall / 1e6, 1),
                   bytes_source=after["bytes_source"], memory_keys=after["memory_keys"],
                   datafile_keys=after["datafile_keys"], file_bytes=size, file_alloc_bytes=alloc,
                   file_to_memory=round(alloc / args.max_memory, 2))
        if after["sweep_s"] is not None:
            sweep = after["sweep_s"] - before["sweep_s"]
            row.update(sweep_s=round(sweep, 3),
                       sweep_write_MBps=round(d["bytes_w"] / sweep / 1e6, 1) if sweep > 0 else "",
                       sweep_read_MBps=round(d["bytes_r"] / sweep / 1e6, 1) if sweep > 0 else "")
        if after["io_s"] is not None:
            row["io_s"] = round(after["io_s"] - before["io_s"], 3)
        for k, b in (("write_calls", "bytes_w"), ("read_calls", "bytes_r")):
            if after[k] is not None:
                calls = after[k] - before[k]
                row[f"KiB_per_{k[:-1]}"] = round(d[b] / calls / 1024, 1) if calls else ""
        if after["flusher_cpu"] is not None and before["flusher_cpu"] is not None:
            fc = after["flusher_cpu"] - before["flusher_cpu"]
            row.update(flusher_cpu_s=round(fc, 3), flusher_cpu_source=after["flusher_source"],
                       flusher_us_per_record=round(fc / d["records"] * 1e6, 3) if d["records"] else "")
    return row


def measure(args):
    base = tempfile.mkdtemp(prefix="kv-nhd-", dir=args.dir)
    rows, servers = [], []
    try:
        measure_fio(base, args, rows, "before")
        common.write_csv(args.csv, rows)
        load = Load(args)
        nh, nhd = Server("NH", base, args), Server("NHD", base, args)
        servers = [nh, nhd]
        for s in servers:
            s.start()
        keys = prefill(nhd, load, args)
        n = args.requests or keys  # the default: as many new keys as NHD's memory holds
        common.log(f"each run: {n:,} new keys (or --max-seconds {args.max_seconds:g})")
        bar = common.Progress(args.rounds * len(args.pipelines) * 2, "NH/NHD points")
        for rnd in range(args.rounds):
            # NH's pipelines, then NHD's, NHD's then NH's the next round (A B, B A ...): neither
            # side always runs on a machine the other has just warmed or loaded. NHD's runs
            # follow each other, so one warm-up keeps it in its steady state (see warm); before
            # each NH run NHD's flusher must have finished writing out its backlog (it would share
            # the cores with NH), and NHD's CPU over the NH run is recorded (NHD_cpu_s) to show it.
            for s in (servers if rnd % 2 == 0 else servers[::-1]):
                full = warm(nhd, load, keys, args) if s is nhd else None
                for p in args.pipelines:
                    waited = None
                    if s is nh:
                        refill_nh(nh, load, keys, args)
                        waited = wait_flusher_idle(nhd.node, args)
                    row = point(s, load, p, n, args, rnd, other=nhd if s is nh else None)
                    if waited is not None:
                        row.update(NHD_idle_wait_s=round(waited[0], 1), NHD_went_idle=int(waited[1]))
                    if full is not None:
                        row["start_full"] = round(full, 3)
                        full = None
                    rows.append(row)
                    common.write_csv(args.csv, rows)
                    note = (f"round {rnd} P{p:<2d} {s.label:3s} {row['throughput']:>10,} SET/s cpu {row['cpu_us_per_req']:.1f} us/req"
                            f"  max {row['max_latency_ms']:,} ms")
                    if s.label == "NHD":
                        note += (f"  {row['records_per_block']} rec/block  write {row['write_MBps']} MB/s "
                                 f"read {row['read_MBps']} MB/s  file {row['file_to_memory']}x memory")
                    bar.step(note)
        bar.close()
        for s in servers:
            s.stop()
        servers = []
        measure_fio(base, args, rows, "after")
        common.write_csv(args.csv, rows)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(base, ignore_errors=True)
    return rows


# ---- the summary and the plot (both from the CSV's rows)

def _num(v):
    return float(v) if v not in ("", None) else None


def summary(rows):
    """{pipeline: {...}}: medians and min-max over rounds, the paired NHD/NH ratio, the fio bars."""
    ins = [r for r in rows if r.get("kind") == "insert"]
    fio_bw = {rw: [_num(r["MBps"]) for r in rows if r.get("server") == "fio" and r.get("kind") == rw
                   and _num(r.get("MBps"))] for rw in ("write", "read")}
    out = {"fio": {rw: statistics.median(v) if v else None for rw, v in fio_bw.items()}}
    for p in sorted({int(r["pipeline"]) for r in ins}, reverse=True):
        pt = {}
        for label in ("NH", "NHD"):
            rr = [r for r in ins if int(r["pipeline"]) == p and r["server"] == label]
            for f in ("throughput", "cpu_us_per_req", "records_per_block", "write_MBps", "read_MBps",
                      "sweep_write_MBps", "sweep_read_MBps", "flusher_us_per_record", "file_to_memory",
                      "KiB_per_write_call", "KiB_per_read_call"):
                v = [x for x in (_num(r.get(f)) for r in rr) if x is not None]
                if v:
                    pt[(label, f)] = (statistics.median(v), min(v), max(v))
        rs = common.paired_rounds([r for r in ins if int(r["pipeline"]) == p], "server", "NHD", "NH")
        pt["ratio"] = statistics.median(rs) if rs else None
        pt["ratio_range"] = (min(rs), max(rs)) if rs else None
        out[p] = pt
    return out


def report(rows):
    s = summary(rows)
    fw, fr = s["fio"]["write"], s["fio"]["read"]
    keys = [int(r["memory_keys"]) for r in rows if r.get("server") == "NHD" and r.get("memory_keys")]
    if keys:
        print(f"NHD held {min(keys):,}-{max(keys):,} keys in memory at the end of its runs")
    grew = [r for r in rows if r.get("server") == "NH" and str(r.get("table_buckets_grew")) == "1"]
    if grew:
        print(f"check: NH's hash table grew (an incremental rehash) during {len(grew)} of its runs; NHD's never does")
    busy = [_num(r.get("NHD_cpu_s")) for r in rows if r.get("server") == "NH" and _num(r.get("NHD_cpu_s")) is not None]
    if busy:
        print(f"check: NHD's CPU during NH's runs: max {max(busy):.2f} s (its flusher should be idle)")
    print(f"fio sequential 1 MiB direct: write {fw or 0:,.0f} MB/s, read {fr or 0:,.0f} MB/s (median of before/after)")
    for p, pt in s.items():
        if p == "fio":
            continue
        med = lambda k: pt.get(k, (None,))[0]  # noqa: E731
        line = (f"P{p:<2d} NH {med(('NH', 'throughput')) or 0:>10,.0f} SET/s  NHD {med(('NHD', 'throughput')) or 0:>10,.0f}"
                f" SET/s")
        if pt["ratio"] is not None:
            lo, hi = pt["ratio_range"]
            line += (f"  NHD/NH {pt['ratio']:.2f} (rounds {lo:.2f}-{hi:.2f}; paper {PAPER['NHD/NH']}, "
                     f"target >= {TARGET['NHD/NH']})")
        print(line)
        cpu = f"    CPU per request: NH {med(('NH', 'cpu_us_per_req')) or 0:.1f} us, NHD {med(('NHD', 'cpu_us_per_req')) or 0:.1f} us"
        rpb = med(("NHD", "records_per_block"))
        cpu += f"; records per block written {rpb:.1f}" if rpb else "; no block written"
        print(cpu)
        w, r = med(("NHD", "sweep_write_MBps")), med(("NHD", "sweep_read_MBps"))
        over = "while sweeping"
        if w is None:
            w, r, over = med(("NHD", "write_MBps")), med(("NHD", "read_MBps")), "over the run"
        if w is not None:
            line = f"    data file {over}: write {w:,.0f} MB/s" + (f" ({w / fw:.0%} of fio)" if fw else "")
            line += f", read {r or 0:,.0f} MB/s" + (f" ({(r or 0) / fr:.0%} of fio)" if fr else "")
            fl = med(("NHD", "flusher_us_per_record"))
            if fl is not None:
                line += f"; flusher CPU {fl:.2f} us per record written"
            io = [med(("NHD", f"KiB_per_{k}_call")) for k in ("write", "read")]
            if io[0] is not None:
                line += f"; {io[0]:,.0f} KiB per write call, {io[1] or 0:,.0f} KiB per read call"
            ftm = med(("NHD", "file_to_memory"))
            if ftm is not None:
                line += f"; file {ftm:.1f}x memory"
            print(line)


def _bars(ax, groups, series, colors, med_err, ylabel):
    """common.bar_chart of medians with min-max error bars: med_err(group, series) -> (med,
    lo, hi) or None (the summary keeps those three per point: as a point's "rounds" they give
    bar_chart's spread() the same median, min and max). Returns bar_chart's x positions."""
    values = {}
    for g in groups:
        for n in series:
            v = med_err(g, n)
            if v:
                values[(g, n)] = [v[1], v[0], v[2]]
    xs = common.bar_chart(ax, groups, series, values, colors=dict(zip(series, colors)))
    ax.set_ylabel(ylabel)
    return xs


def _legend(ax):
    """A legend when the panel drew something labelled (a short run may leave one empty)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def draw(rows, path):
    plt = common.pyplot()
    s = summary(rows)
    ps = [p for p in s if p != "fio"]
    mem = [r for r in rows if r.get("server") == "NHD" and r.get("memory_keys")]
    fig, axs = plt.subplots(2, 2, figsize=(12, 8))
    ax = axs[0][0]
    xs = _bars(ax, ps, ["NH", "NHD"], ["#9ecae1", "#2171b5"], lambda p, n: s[p].get((n, "throughput")),
               "inserts of new keys / s (median, min-max)")
    ax.set_xticklabels([f"P{p}" + (f"\nNHD/NH {s[p]['ratio']:.2f}" if s[p]["ratio"] else "") for p in ps])
    nh = {p: s[p].get(("NH", "throughput")) for p in ps}  # the paper's ratio, applied to this run's NH
    marked = [p for p in ps if nh[p] and p in xs.get("NHD", {})]
    common.paper_marks(ax, [xs["NHD"][p] for p in marked], [nh[p][0] * PAPER["NHD/NH"] for p in marked],
                       label="paper NHD = 0.71 x NH", color="r")
    _legend(ax)
    ax.set_title("Throughput (paired NHD/NH under each group)", fontsize=9)
    ax = axs[0][1]
    _bars(ax, ps, ["NH", "NHD"], ["#9ecae1", "#2171b5"], lambda p, n: s[p].get((n, "cpu_us_per_req")),
          "server CPU per request, us (median, min-max)")
    ax.set_xticklabels([f"P{p}" for p in ps])
    ax.set_title("Server CPU per request (all threads)", fontsize=9)
    _legend(ax)
    ax = axs[1][0]
    _bars(ax, ps, ["NHD"], ["#2171b5"], lambda p, n: s[p].get((n, "records_per_block")),
          "records per 4 KiB block written")
    ax.axhline(TARGET["records_per_block"], color="r", ls="--", lw=1, label="issue's target: 8")
    ax.set_xticklabels([f"P{p}" for p in ps])
    ax.set_title("Records per block written by the sweep", fontsize=9)
    _legend(ax)
    ax = axs[1][1]
    sweeping = any(("NHD", "sweep_write_MBps") in s[p] for p in ps)
    kw, kr = ("sweep_write_MBps", "sweep_read_MBps") if sweeping else ("write_MBps", "read_MBps")
    _bars(ax, ps, ["write", "read"], ["#fd8d3c", "#74c476"],
          lambda p, n: s[p].get(("NHD", kw if n == "write" else kr)), "MB/s (median, min-max)")
    ax.set_xticklabels([f"P{p}" for p in ps])
    for rw, c in (("write", "#d94801"), ("read", "#238b45")):
        if s["fio"][rw]:
            ax.axhline(s["fio"][rw] * TARGET["sweep_share_of_fio"], color=c, ls="--", lw=1,
                       label=f"50 % of fio {rw} ({s['fio'][rw]:,.0f} MB/s)")
    ax.set_yscale("log")  # the sweep's MB/s may be a hundredth of fio's: both must show
    tops = [s["fio"][rw] or 0 for rw in ("write", "read")] + [s[p][("NHD", k)][2] for p in ps for k in (kw, kr)
                                                              if ("NHD", k) in s[p]]
    ax.set_ylim(0.5, max(tops + [1]) * 3)
    ax.set_title("Data file I/O " + ("while sweeping" if sweeping else "over the run (wall time)"), fontsize=9)
    _legend(ax)
    keys = f", ~{statistics.median(int(r['memory_keys']) for r in mem):,.0f} keys in memory" if mem else ""
    fig.suptitle("Paper 000 NHD: memory-full inserts of new keys vs in-memory NH, side by side per round"
                 f"{keys}\n2-core VM: server, its flusher and the load generator share both cores; nothing pinned",
                 fontsize=10)
    common.save_figure(fig, path)


def add_args(ap):
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-memory", type=parse_size, default="3gb",
                    help="NHD's --max-memory (bytes or Redis units): with a data file a key with an 85 B value takes "
                         "~300-400 B of memory today and eviction runs from 90 %% down to 25 %%: 3gb held ~10 M keys at "
                         "its high mark; the report says how many it held")
    ap.add_argument("--data-buckets", type=int,
                    help="NHD's home blocks (default: max-memory / 4 KiB: the two home copies alone make 2x memory)")
    ap.add_argument("--file-ratio", type=float, default=2.0,
                    help="grow NHD's file to this many times --max-memory (on disk) before measuring")
    ap.add_argument("--prefill-seconds", type=float, default=900,
                    help="bound of each unmeasured fill: NHD's first, NH's, NHD's warm-up before each run")
    ap.add_argument("--requests", type=int, default=0,
                    help="inserts per run; 0: as many as NHD holds in memory after the prefill, so that a run spans "
                         "eviction cycles (90 %% -> 60 %% of memory), not a stretch between two of them")
    ap.add_argument("--max-seconds", type=float, default=40, help="bound of each measured run")
    ap.add_argument("--idle-seconds", type=float, default=120,
                    help="bound of the wait, before each NH run, for NHD's flusher to stop writing")
    ap.add_argument("--pipelines", type=int, nargs="+", default=[16, 1])
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--value-size", type=int, default=85)
    ap.add_argument("--kv-threads", type=int, default=2, help="pollers of both servers")
    ap.add_argument("--bench-threads", type=int, default=2)
    ap.add_argument("--fio-size", default="2g", help="fio's file")
    ap.add_argument("--fio-seconds", type=int, default=10, help="bound of each fio job")
    ap.add_argument("--dir", help="where the run's temp dir goes (default: $TMPDIR); needs ~8x --max-memory free: the "
                                  "data file starts at --file-ratio x memory and grows with every run, to up to ~7x "
                                  "memory at the default scale; plus fio's file")


def check_args(args):
    if isinstance(args.max_memory, str):
        args.max_memory = parse_size(args.max_memory)
    if args.data_buckets is None:
        args.data_buckets = max(1024, args.max_memory // BLK)


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
