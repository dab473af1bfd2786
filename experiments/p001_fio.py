"""Paper 001, Figs. 7-9: the block device under fio, each backend beside nbdkit's memory plugin
(the server a user would otherwise pick), in the same run, points alternated A B A B.

Backends (--backends): nbdkit-memory (`nbdkit memory SIZE`, its default thread pool), and
`kvstore blockdev serve` over embedded (the engine in-process, durability none), kvstore-node
(a kvstore node over RESP, durability none), redis (persistence off) and memcached (the
paper's backend). Our four switch on by themselves once `kvstore blockdev serve` is in the
build (it prints its ready line); one that fails to start is left out with a log line.
Targets (--targets), how fio reaches the device:
  tcp, unix   the raw device through fio's NBD engine (nbd://127.0.0.1:PORT/EXPORT, or
              nbd+unix:///EXPORT?socket=PATH): one NBD connection per fio job;
  ext4, xfs   a filesystem on it: nbdfuse (over TCP) + losetup --direct-io=on + mkfs + mount,
              fio on one file with libaio and O_DIRECT (needs root, /dev/fuse, nbdfuse).
Loads (--loads), scaled from the paper's 20 cores to this machine's 2 (stated on the plot):
  rand-read-4k, rand-write-4k    Fig. 7: IOPS, numjobs 2 x iodepth 32 (paper: 20 x 32);
  seq-read-128k, seq-write-128k  Fig. 8: MiB/s, numjobs 2 x iodepth 8, each job its own half;
  qd1-read-4k, qd1-write-4k      Fig. 9: QD1 latency p50/p99/p99.9, 1 x 1: fio's total latency
                                 (submission to completion, "lat"; its clat is in the CSV too).
The KV servers run one thread each (--kv-threads), as Redis does: on 2 cores shared with fio
and the NBD server a second one costs more than it brings (every server measured slower).
Every point runs --ramp + --runtime seconds (time based, fio killed past a deadline) over a
working set (--work-set) written once with random data when the device is set up (reads then
hit stored blocks, not absent ones, which read as zeros without touching the KVS). Server CPU
per I/O (the NBD server's and its KV server's, from /proc) is in the CSV for every point and
written above each bar. Per round, per target: every backend is set up, then each load runs on
each backend in turn (each round starting one backend further, so none is always first), then
all are torn down (memory: one working set per backend at a time).

Paper (40 GbE, 20 cores, memcached): 4 KiB random read > 1 M IOPS raw and xfs, ~400 K ext4,
random write 200-300 K; 128 KiB sequential read ~3.2 GB/s, write ~1 GB/s; QD1 60-70 us.
The issue's targets: embedded >= 1.5x nbdkit memory on 4 KiB random read and write IOPS (tcp,
unix), QD1 p50 <= nbdkit's, 128 KiB sequential read >= nbdkit's; kvstore-node >= memcached
and >= redis on every load. `report` prints each with the paired ratio over rounds.

    kvstore experiment run p001_fio            -> OUT/p001_fio.{csv,png}
"""
import contextlib
import functools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from kvstore import Node
from kvstore.experiments import common
from kvstore.process import Process

NAME = "p001_fio"
QUICK = ["--rounds", "1", "--runtime", "0.5", "--ramp", "0", "--size", "512M", "--work-set", "32M",
         "--targets", "tcp", "--loads", "rand-read-4k", "rand-write-4k", "seq-read-128k", "qd1-read-4k"]

BACKENDS = ["nbdkit-memory", "embedded", "kvstore-node", "redis", "memcached"]
TARGETS = ["tcp", "unix", "ext4", "xfs"]
REFERENCE = "nbdkit-memory"
NBDFUSE_CONNS = 4  # nbdfuse's --connections default when the server offers multi-conn (ours and nbdkit do)
COLORS = {"nbdkit-memory": "#7f7f7f", "embedded": "#08519c", "kvstore-node": "#6baed6", "redis": "#d62728",
          "memcached": "#2ca02c"}
READY = rb"kvstore blockdev listening on (nbd\S*)"


class Load:
    def __init__(self, name, fig, rw, bs, jobs, depth, metric):
        self.name, self.fig, self.rw, self.bs, self.jobs, self.depth = name, fig, rw, bs, jobs, depth
        self.metric = metric  # the figure's number: iops, bw_mib_s, or p50_us (lower is better)
        self.kind = "write" if "write" in rw else "read"


LOADS = [Load("rand-read-4k", 7, "randread", "4k", 2, 32, "iops"),
         Load("rand-write-4k", 7, "randwrite", "4k", 2, 32, "iops"),
         Load("seq-read-128k", 8, "read", "128k", 2, 8, "bw_mib_s"),
         Load("seq-write-128k", 8, "write", "128k", 2, 8, "bw_mib_s"),
         Load("qd1-read-4k", 9, "randread", "4k", 1, 1, "p50_us"),
         Load("qd1-write-4k", 9, "randwrite", "4k", 1, 1, "p50_us")]
BY_LOAD = {ld.name: ld for ld in LOADS}
PAPER = {"rand-read-4k": "> 1 M IOPS raw/xfs, ~400 K ext4", "rand-write-4k": "200-300 K IOPS",
         "seq-read-128k": "~3.2 GB/s", "seq-write-128k": "~1 GB/s", "qd1-read-4k": "60-70 us",
         "qd1-write-4k": "60-70 us"}


@functools.lru_cache(maxsize=None)
def blockdev_serve_available():
    """True when this build has `kvstore blockdev serve` (issue 15's server)."""
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", "blockdev", "serve", "--help"], capture_output=True,
                       timeout=60)
    return r.returncode == 0


def fs_missing(fs):
    """Why a filesystem target cannot run here, or None."""
    if os.geteuid() != 0:
        return "losetup and mount need root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    for tool in ("nbdfuse", "fusermount3", "losetup", f"mkfs.{fs}"):
        if not shutil.which(tool):
            return f"{tool} is not installed (make deps installs it)"
    return None


class Polled(Process):
    """A child process ready once ready() is true (a unix socket accepts, a pid file exists)."""

    def __init__(self, argv, ready, name):
        super().__init__(argv, port=0, name=name)  # port is not probed: _wait_port below asks ready()
        self._ready = ready

    def _wait_port(self, deadline, within):
        while self.proc.poll() is None:
            if self._ready():
                return None
            if time.monotonic() > deadline:
                return f"not ready within {within}"
            time.sleep(0.02)
        return "it exited"


def unix_accepts(path):
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


def run(argv, timeout=120):
    """argv's stdout; RuntimeError with the end of its stderr when it fails."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"{' '.join(argv[:4])}: exit code {r.returncode}: {r.stderr.strip()[-1000:]}")
    return r.stdout


class Device:
    """One block device under test: its KV server (none for nbdkit and embedded), its NBD
    server on TCP or a unix socket, and for ext4/xfs the filesystem mounted on it through
    nbdfuse + a loop device. start() sets it all up and writes the working set; fio_args()
    is how fio reaches it; cpu() the NBD and KV servers' CPU seconds; stop() undoes it all."""

    def __init__(self, backend, target, args):
        self.backend, self.target, self.args = backend, target, args
        self.tmp = tempfile.mkdtemp(prefix=f"p001-{backend}-{target}-")
        self.kv = self.nbd = self.fuse = None
        self.loop = self.mnt = None
        self.uri = None

    def _kv_server(self):
        if self.backend == "kvstore-node":
            return Node(port=0, threads=self.args.kv_threads, durability="none", data_dir=self.tmp)
        if self.backend == "redis":
            return common.redis_server(common.free_port())
        if self.backend == "memcached":
            mc = common.memcached(common.free_port(), self.args.kv_threads)
            mc.argv.append("-M")  # full memory: refuse SETs rather than evict blocks (which would read as zeros)
            return mc
        return None

    def _nbd_server(self):
        size, unix = self.args.size, self.target == "unix"
        sock = os.path.join(self.tmp, "nbd.sock")
        if self.backend == REFERENCE:
            if unix:
                self.uri = f"nbd+unix:///?socket={sock}"
                return Polled(["nbdkit", "-f", "--exit-with-parent", "-U", sock, "memory", size],
                              lambda: unix_accepts(sock), "nbdkit")
            port = common.free_port()
            self.uri = f"nbd://127.0.0.1:{port}/"
            return common.Proc("nbdkit", ["nbdkit", "-f", "--exit-with-parent", "-i", "127.0.0.1", "-p", port,
                                          "memory", size], port)
        if self.backend == "embedded":
            backend = ["--backend", "embedded", "--durability", "none", "--data-dir", self.tmp,
                       "--port", "0"]  # its RESP port: any free one
        else:
            scheme = {"kvstore-node": "kvstore", "redis": "redis", "memcached": "memcached"}[self.backend]
            backend = ["--backend", f"{scheme}://127.0.0.1:{self.kv.port}"]
        where = ["--unix", sock] if unix else ["--listen", "127.0.0.1:0"]  # the ready line says the port
        poll = [] if self.args.busy_poll_us is None else ["--busy-poll-us", self.args.busy_poll_us]
        threads = self.args.nbd_threads or (NBDFUSE_CONNS if self.target in ("ext4", "xfs") else 2)
        return Process([sys.executable, "-m", "kvstore.cli", "blockdev", "serve", "--size", size, *backend, *where,
                        "--threads", threads, *poll], ready_line=READY, name=f"blockdev-{self.backend}")

    def start(self):
        t0 = time.monotonic()
        self.kv = self._kv_server()
        if self.kv:
            self.kv.start()
        self.nbd = self._nbd_server()
        self.nbd.start()
        if self.nbd.match:
            self.uri = self.nbd.match.group(1).decode()
        if self.target in ("ext4", "xfs"):
            self._mount()
        self.fio(["--rw=write", "--bs=1M", "--iodepth=4", "--numjobs=1", f"--size={self.args.work_set}"],
                 timeout=300)  # the working set, random data, once
        common.log(f"{self.backend} on {self.target}: {self.uri} set up in {time.monotonic() - t0:.1f} s")
        return self

    def _mount(self):
        fdir, self.mnt = os.path.join(self.tmp, "fuse"), os.path.join(self.tmp, "mnt")
        os.makedirs(fdir), os.makedirs(self.mnt)
        pidfile, disk = os.path.join(self.tmp, "nbdfuse.pid"), os.path.join(fdir, "disk")
        self.fuse = Polled(["nbdfuse", "-P", pidfile, disk, self.uri], lambda: os.path.exists(pidfile), "nbdfuse")
        self.fuse.start()
        self.loop = run(["losetup", "--direct-io=on", "-f", "--show", disk]).strip()
        mkfs = {"ext4": ["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"],
                "xfs": ["mkfs.xfs", "-q", "-f"]}[self.target]
        run([*mkfs, self.loop], timeout=300)
        run(["mount", "-t", self.target, self.loop, self.mnt])

    def fio_args(self):
        if self.mnt:
            return ["--ioengine=libaio", "--direct=1", f"--filename={os.path.join(self.mnt, 'fio.dat')}"]
        return ["--ioengine=nbd", f"--uri={self.uri}"]

    def fio(self, opts, timeout):
        """fio's JSON result of one job group on this device."""
        cmd = ["fio", "--name=p001", *self.fio_args(), *opts, "--group_reporting", "--output-format=json",
               "--percentile_list=50:99:99.9", "--lat_percentiles=1", "--clat_percentiles=1"]
        out = run(cmd, timeout=timeout)
        return json.loads(out[out.index("{"):])  # the nbd engine prints "connected" lines first

    def cpu(self):
        """(CPU seconds of the NBD server, of its KV server: 0 without one)."""
        return (common.cpu_seconds(self.nbd.pid),
                common.cpu_seconds(self.kv.pid) if self.kv else 0.0)

    def stop(self):
        if self.mnt and os.path.ismount(self.mnt):
            if subprocess.run(["umount", self.mnt], capture_output=True, timeout=120).returncode:
                subprocess.run(["umount", "-l", self.mnt], capture_output=True, timeout=60)
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], capture_output=True, timeout=60)
            self.loop = None
        if self.fuse:
            subprocess.run(["fusermount3", "-u", os.path.join(self.tmp, "fuse")], capture_output=True, timeout=60)
            self.fuse.stop()
        for p in (self.nbd, self.kv):
            if p:
                p.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def size_bytes(text):
    """'128M' -> 134217728 (fio and nbdkit's K/M/G suffixes, powers of 1024)."""
    t = str(text).strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    return int(float(t[:-1]) * mult[t[-1]]) if t and t[-1] in mult else int(t)


def ms(seconds):
    """fio's time option for a number of seconds (it takes whole seconds or units: 500ms)."""
    return f"{round(seconds * 1000)}ms"


def load_opts(ld, args):
    """fio options of one measured point of load ld."""
    ws = size_bytes(args.work_set)
    opts = [f"--rw={ld.rw}", f"--bs={ld.bs}", f"--numjobs={ld.jobs}", f"--iodepth={ld.depth}", "--time_based",
            f"--runtime={ms(args.runtime)}", f"--ramp_time={ms(args.ramp)}", "--norandommap", "--randrepeat=0"]
    if ld.rw in ("read", "write") and ld.jobs > 1:  # sequential: each job streams its own part
        part = ws // ld.jobs // (1 << 20) * (1 << 20)
        return opts + [f"--size={part}", f"--offset_increment={part}"]
    return opts + [f"--size={ws}"]


P50, P99, P999 = "50.000000", "99.000000", "99.900000"  # fio's JSON percentile keys


def measure_point(dev, ld, args):
    c0, w0 = dev.cpu(), time.monotonic()
    f0 = common.cpu_seconds(dev.fuse.pid) if dev.fuse else 0.0
    j = dev.fio(load_opts(ld, args), timeout=args.ramp + args.runtime + 60)
    c1, wall = dev.cpu(), time.monotonic() - w0
    fuse = (common.cpu_seconds(dev.fuse.pid) - f0) if dev.fuse else 0.0
    job = j["jobs"][0]
    st = job[ld.kind]
    if job.get("error"):
        raise RuntimeError(f"fio {ld.name} on {dev.backend}/{dev.target}: error {job['error']}")
    ios = st["total_ios"]
    nbd, kv = c1[0] - c0[0], c1[1] - c0[1]

    def us(kind, p):
        return round(st[kind].get("percentile", {}).get(p, 0) / 1000, 1)
    return {"backend": dev.backend, "target": dev.target, "load": ld.name, "figure": ld.fig, "rw": ld.rw,
            "bs": ld.bs, "numjobs": ld.jobs, "iodepth": ld.depth, "runtime_s": args.runtime,
            "iops": round(st["iops"]), "bw_mib_s": round(st["bw_bytes"] / (1 << 20), 1),
            # latency from fio's submission to the completion (lat); clat leaves out the submission,
            # which with the nbd engine can hold most of the round trip (a reply that arrives while
            # libnbd is still sending completes the I/O with a clat of a few us)
            "p50_us": us("lat_ns", P50), "p99_us": us("lat_ns", P99), "p999_us": us("lat_ns", P999),
            "lat_mean_us": round(st["lat_ns"]["mean"] / 1000, 1), "clat_p50_us": us("clat_ns", P50),
            "clat_p99_us": us("clat_ns", P99), "clat_p999_us": us("clat_ns", P999), "ios": ios,
            "wall_s": round(wall, 2),
            "nbd_cpu_s": round(nbd, 3), "kv_cpu_s": round(kv, 3), "server_cpu_s": round(nbd + kv, 3),
            "cpu_us_per_io": round((nbd + kv) / ios * 1e6, 2) if ios else "", "fuse_cpu_s": round(fuse, 3),
            "fio_cpu_pct": round(job["usr_cpu"] + job["sys_cpu"], 1)}


def backends_of(args):
    """The backends to measure: --backends as given (all must be runnable), or by default every
    one this build and machine can run."""
    wanted = args.backends or BACKENDS
    ours = [b for b in wanted if b != REFERENCE]
    if ours and not blockdev_serve_available():
        if args.backends:
            raise SystemExit(f"{NAME}: {', '.join(ours)} need `kvstore blockdev serve`, not in this build")
        common.log(f"{NAME}: `kvstore blockdev serve` is not in this build: measuring {REFERENCE} only")
        return [b for b in wanted if b == REFERENCE]
    return list(wanted)


def targets_of(args):
    out = []
    for t in args.targets:
        why = fs_missing(t) if t in ("ext4", "xfs") else None
        if why:
            if t in (args.require or []):
                raise SystemExit(f"{NAME}: target {t}: {why}")
            common.log(f"{NAME}: skipping target {t}: {why}")
        else:
            out.append(t)
    return out


def measure(args):
    backends, targets = backends_of(args), targets_of(args)
    loads = [BY_LOAD[n] for n in args.loads]
    # --rerun measures again only the points of the loads, targets and backends named (the rest stay)
    names = {ld.name for ld in loads}
    sweep = common.Sweep(args.csv, ("round", "target", "load", "backend"),
                         args.rounds * len(targets) * len(loads) * len(backends), args,
                         selected=lambda r: r["load"] in names and r["target"] in targets and r["backend"] in backends)
    dropped = {}
    try:
        for rnd in range(args.rounds):
            for target in targets:
                with contextlib.ExitStack() as stack:
                    devs = []
                    for b in backends:
                        if (b, target) in dropped:
                            continue
                        dev = Device(b, target, args)
                        stack.callback(dev.stop)
                        try:
                            devs.append(dev.start())
                        except Exception as e:  # noqa: BLE001 -- one backend's failure leaves the others
                            if args.backends:
                                raise
                            dropped[(b, target)] = f"{type(e).__name__}: {e}"[:500]
                            common.log(f"{NAME}: leaving out {b} on {target}: {dropped[(b, target)]}")
                    turn = rnd % len(devs) if devs else 0  # each round starts with the next backend
                    devs = devs[turn:] + devs[:turn]
                    for ld in loads:
                        for dev in devs:
                            if sweep.has(round=rnd, target=target, load=ld.name, backend=dev.backend):
                                continue
                            row = {"round": rnd, **measure_point(dev, ld, args)}
                            sweep.add(row, f"round {rnd} {target:4s} {ld.name:14s} {dev.backend:13s} "
                                           f"{row['iops']:>8,} IOPS {row['bw_mib_s']:>8,.1f} MiB/s  p50 "
                                           f"{row['p50_us']:7.1f} us  p99 {row['p99_us']:8.1f} us  server "
                                           f"{row['cpu_us_per_io']} us/IO")
    finally:
        sweep.close()
    for (b, target), why in dropped.items():
        common.log(f"{NAME}: {b} on {target} was left out: {why}")
    return sweep.rows


def spread(rows, field):
    """{(target, load, backend): [the rounds' values of field]}."""
    out = {}
    for r in rows:
        if r.get(field) not in ("", None):
            out.setdefault((r["target"], r["load"], r["backend"]), []).append(float(r[field]))
    return out


def ratio(rows, load, target, a, b):
    """Median over rounds of a/b on the load's own metric, paired by round (None without a pair)."""
    return common.paired(rows, "backend", a, b, BY_LOAD[load].metric, load=load, target=target)


TARGET_CHECKS = [  # (a, b, loads, targets, how a/b must compare, the words)
    ("embedded", REFERENCE, ("rand-read-4k", "rand-write-4k"), ("tcp", "unix"), 1.5, "embedded >= 1.5x nbdkit IOPS"),
    ("embedded", REFERENCE, ("qd1-read-4k",), TARGETS, 1.0, "embedded QD1 p50 <= nbdkit's"),
    ("embedded", REFERENCE, ("seq-read-128k",), TARGETS, 1.0, "embedded 128 KiB seq read >= nbdkit's"),
    ("kvstore-node", "memcached", [ld.name for ld in LOADS], TARGETS, 1.0, "kvstore-node >= memcached"),
    ("kvstore-node", "redis", [ld.name for ld in LOADS], TARGETS, 1.0, "kvstore-node >= redis"),
]


def report(rows):
    units = {"iops": "IOPS", "bw_mib_s": "MiB/s", "p50_us": "us p50"}
    vals, cpu = {f: spread(rows, f) for f in ("iops", "bw_mib_s", "p50_us", "p99_us", "p999_us")}, \
        spread(rows, "cpu_us_per_io")
    for (target, load, backend), v in sorted(vals["iops"].items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
        ld = BY_LOAD[load]
        m = vals[ld.metric][(target, load, backend)]
        line = (f"{load:14s} {target:4s} {backend:13s} {statistics.median(m):>10,.1f} {units[ld.metric]}"
                f" ({min(m):,.1f}-{max(m):,.1f})")
        if ld.fig == 9:
            line += (f"  p99 {statistics.median(vals['p99_us'][(target, load, backend)]):.0f}"
                     f"  p99.9 {statistics.median(vals['p999_us'][(target, load, backend)]):.0f} us")
        c = cpu.get((target, load, backend))
        if c:
            line += f"  server CPU {statistics.median(c):.2f} us/IO"
        if backend != REFERENCE:
            x = ratio(rows, load, target, backend, REFERENCE)
            if x is not None:
                line += f"  x{x:.2f} of nbdkit"
        print(line + f"   [paper: {PAPER[load]}]")
    for a, b, loads, targets, need, words in TARGET_CHECKS:
        for load in loads:
            for target in targets:
                x = ratio(rows, load, target, a, b)
                if x is None:
                    continue
                lower = BY_LOAD[load].metric == "p50_us"
                ok = x <= need if lower else x >= need
                print(f"target {words}: {load} {target}: {a}/{b} = {x:.2f} -> {'met' if ok else 'NOT met'}")


def draw(rows, path):
    plt = common.pyplot()
    loads = [ld for ld in LOADS if any(r["load"] == ld.name for r in rows)]
    targets = [t for t in TARGETS if any(r["target"] == t for r in rows)]
    backends = [b for b in BACKENDS if any(r["backend"] == b for r in rows)]
    nrow = max(1, len({ld.fig for ld in loads}))
    fig, axes = plt.subplots(nrow, 2, figsize=(14, 4.6 * nrow), squeeze=False)
    cpu = spread(rows, "cpu_us_per_io")
    figs = sorted({ld.fig for ld in loads})
    used = set()
    for ld in loads:
        ax = axes[figs.index(ld.fig)][0 if ld.kind == "read" else 1]
        used.add(id(ax))
        vals = spread(rows, ld.metric)
        values = {(t, b): vals[(t, ld.name, b)] for t in targets for b in backends if (t, ld.name, b) in vals}
        note = {(t, b): f"{statistics.median(cpu[(t, ld.name, b)]):.1f}" for t in targets for b in backends
                if (t, ld.name, b) in cpu}
        xs = common.bar_chart(ax, targets, backends, values, colors=COLORS, annotate=note)
        unit = {"iops": "IOPS", "bw_mib_s": "MiB/s", "p50_us": "QD1 latency p50 (us)"}[ld.metric]
        if ld.fig == 9:  # p99 and p99.9 as markers over the p50 bar
            for f, mk in (("p99_us", "^"), ("p999_us", "x")):
                tail = spread(rows, f)
                pts = [(xs[b][t], statistics.median(tail[(t, ld.name, b)])) for b in backends for t in targets
                       if t in xs.get(b, {}) and (t, ld.name, b) in tail]
                if pts:
                    ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=mk, color="k", s=18, zorder=6,
                               label=f"{f[:-3].replace('p999', 'p99.9')}")
            ax.set_yscale("log")
        ax.set_ylabel(f"{unit} (median, min-max of rounds)")
        ax.set_title(f"Fig. {ld.fig}: {ld.name} — fio bs {ld.bs}, numjobs {ld.jobs} x iodepth {ld.depth}\n"
                     f"paper (40 GbE, 20 cores): {PAPER[ld.name]}; above bars: server CPU us per I/O", fontsize=9)
        ax.legend(fontsize=7, ncol=3)
    for row in axes:
        for ax in row:
            if id(ax) not in used:
                ax.set_axis_off()
    rounds = len({r["round"] for r in rows})
    rt = rows[0]["runtime_s"] if rows else "?"
    fig.suptitle("Paper 001 Figs. 7-9: the block device under fio, each backend beside nbdkit memory, A B A B — "
                 f"{rounds} rounds, {rt} s per point\ntcp/unix: fio's NBD engine on the raw device; ext4/xfs: "
                 "nbdfuse + loop (direct I/O) + libaio O_DIRECT; "
                 + common.cores_note(shares="fio, NBD and KV servers"),
                 fontsize=10)
    common.save_figure(fig, path)


def add_args(ap):
    common.add_sweep_args(ap)
    ap.add_argument("--rounds", type=int, default=3, help="A B A B rounds")
    ap.add_argument("--backends", nargs="+", choices=BACKENDS,
                    help="only these, each required to start (default: all that this build can run: "
                         f"{REFERENCE} alone until `kvstore blockdev serve` exists)")
    ap.add_argument("--targets", nargs="+", choices=TARGETS, default=TARGETS,
                    help="how fio reaches the device (ext4/xfs skipped without root, /dev/fuse or nbdfuse)")
    ap.add_argument("--require", nargs="+", choices=TARGETS, help="fail, not skip, when these targets cannot run")
    ap.add_argument("--loads", nargs="+", choices=list(BY_LOAD), default=list(BY_LOAD))
    ap.add_argument("--size", default="1G", help="device size (xfs wants 300M at least)")
    ap.add_argument("--work-set", default="256M", help="the part of the device the loads use, written first")
    ap.add_argument("--runtime", type=float, default=5.0, help="measured seconds per point")
    ap.add_argument("--ramp", type=float, default=1.0, help="warm-up seconds per point, not measured")
    ap.add_argument("--nbd-threads", type=int, default=0,
                    help="kvstore blockdev serve --threads (default 0: one per client connection, 2 on tcp/unix "
                         f"for fio's 2 jobs, {NBDFUSE_CONNS} on ext4/xfs for nbdfuse's multi-conn connections; "
                         "measured: with 2 threads for nbdfuse's 4 connections, 128 KiB reads through the file "
                         "system were 0.89-0.96x nbdkit's, with 4 0.97-1.01x)")
    ap.add_argument("--busy-poll-us", type=int, default=None,
                    help="kvstore blockdev serve --busy-poll-us (default: the server's own default)")
    ap.add_argument("--kv-threads", type=int, default=1,
                    help="threads of the kvstore node and of memcached (default 1, as Redis: fio, the NBD server "
                         "and the KV server share the cores; a second KV thread splits the NBD server's two "
                         "connections over two pollers, each waking for half the batch: 2x the server CPU per I/O, "
                         "0.5x the IOPS measured on 2 cores)")


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
