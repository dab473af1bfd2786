"""Shared pieces of the experiments: the command line and run flow every experiment
module shares (parse_args, main, pyplot/save_figure), servers under test, CPU
accounting, CSV. The module interface itself is described in __init__.py."""
import argparse
import base64
import csv
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from kvstore import bench as kvbench
from kvstore.process import Process

# where `--update-results` writes: the committed results/ of the clone these sources are in
# (realpath: an editable install may reach them through links)
REPO_RESULTS = os.path.normpath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "results"))
OUT_BASE = "kvstore-results"  # runs go to ./kvstore-results/NAME-<time> by default


def repo_results_dir():
    """The clone's results/ (the README's full-scale files), or SystemExit when these
    sources are not in a clone (an installed package has no results/ to refresh)."""
    if not os.path.isdir(REPO_RESULTS):
        raise SystemExit(f"--update-results writes into the repository's results/, but {REPO_RESULTS} does not "
                         "exist: run it from a clone (make dev), or give --out DIR")
    return REPO_RESULTS


def fresh_out_dir(name):
    """A directory that does not exist yet under the working directory: $KVSTORE_RESULTS if
    set (the tests' and notebooks' choice), else ./kvstore-results/NAME-YYYYmmdd-HHMMSS
    (with -2, -3 ... when a run started in the same second). Not created here."""
    if os.environ.get("KVSTORE_RESULTS"):
        return os.environ["KVSTORE_RESULTS"]
    base = os.path.join(OUT_BASE, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    path, n = base, 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}"
    return path


def log(msg):
    """Progress and 'wrote ...' lines: on stderr, so stdout keeps only the report."""
    print(msg, file=sys.stderr, flush=True)


OUT_HELP = """\
Results (NAME.csv, then NAME.png drawn from it) go to a fresh directory
./kvstore-results/NAME-<date>-<time> (or $KVSTORE_RESULTS), never over the committed
results/ unless --update-results is given. --plot-only reads the CSV from --out DIR
(by default the committed results/NAME.csv) and writes the PNG beside the new run's."""


def parser(mod, prog=None):
    """The experiment's argparse parser: its docstring as help, --out, --update-results,
    --plot-only and --tag for all, then the experiment's own options (mod.add_args); every
    option's help ends with its default."""
    ap = argparse.ArgumentParser(prog=prog, description=mod.__doc__, epilog=OUT_HELP.replace("NAME", mod.NAME),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="DIR",
                       help=f"directory for the result files (default: a new ./{OUT_BASE}/{mod.NAME}-<date>-<time>, "
                            "or $KVSTORE_RESULTS)")
    where.add_argument("--update-results", action="store_true",
                       help=f"write into the repository's results/ ({REPO_RESULTS}), replacing the committed "
                            "files the README quotes")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the CSV, measure nothing")
    ap.add_argument("--tag", default="", help=f"suffix of the result files: {mod.NAME}_TAG.csv/.png "
                                              "(another setup, kept beside the default one)")
    mod.add_args(ap)
    for a in ap._actions:  # argparse shows no default by itself (and none for an option without help)
        if a.default not in (None, False, "", argparse.SUPPRESS) and "(default" not in (a.help or ""):
            shown = " ".join(map(str, a.default)) if isinstance(a.default, list) else a.default
            a.help = ((a.help or "") + f" (default: {shown})").strip().replace("%", "%%")
    return ap


def parse_args(mod, argv=None, prog=None):
    """argv (a list; None: sys.argv) parsed for experiment module mod. args.out is the
    result directory (not created yet: main does), args.csv and args.png the result files
    (args.csv is read from the committed results/ for --plot-only without --out), and
    mod.check_args(args), if any, may adjust or refuse the rest."""
    ap = parser(mod, prog)
    args = ap.parse_args(argv)
    explicit = args.out or os.environ.get("KVSTORE_RESULTS")
    if (getattr(args, "resume", False) or getattr(args, "rerun", False)) and not (explicit or args.update_results):
        ap.error("--resume and --rerun continue an earlier run: give its --out DIR (or --update-results)")
    if args.update_results:
        args.out = repo_results_dir()
    elif not args.out:
        args.out = fresh_out_dir(mod.NAME)
    base = mod.NAME + (f"_{args.tag}" if args.tag else "")
    args.csv, args.png = os.path.join(args.out, base + ".csv"), os.path.join(args.out, base + ".png")
    if args.plot_only and not (explicit or args.update_results):
        args.csv = os.path.join(REPO_RESULTS, base + ".csv")  # the committed CSV, only read
    if hasattr(mod, "check_args"):
        mod.check_args(args)
    return args


def main(mod, argv=None, prog=None):
    """An experiment's whole run: measure (mod.measure writes args.csv and returns its rows),
    or with --plot-only read the CSV back; print mod.report(rows), if any; draw args.png."""
    args = parse_args(mod, argv, prog)
    if args.plot_only:
        if not os.path.exists(args.csv):
            raise SystemExit(f"{mod.NAME}: no {args.csv} to plot; run the experiment first")
        rows = read_csv(args.csv)
    os.makedirs(args.out, exist_ok=True)
    log(f"{mod.NAME}: results go to {args.out}")
    if not args.plot_only:
        rows = mod.measure(args)
    if hasattr(mod, "report"):
        mod.report(rows)
    mod.draw(rows, args.png)
    return rows


NOTEBOOK_SCALES = ("small", "full")
NOTEBOOK_TABLE_ROWS = 60  # rows of a result CSV a notebook cell shows (the CSV has them all)


def notebook_argv(mod, scale):
    """The experiment's arguments at a notebook scale: "small" is its QUICK (what
    `kvstore experiment run NAME --quick` runs), "full" none at all, i.e. its defaults,
    the scale of the committed results/ (`kvstore experiment run NAME -- --update-results`)."""
    if scale not in NOTEBOOK_SCALES:
        raise ValueError(f"KVSTORE_NOTEBOOK_SCALE: expected one of {', '.join(NOTEBOOK_SCALES)}, got {scale!r}")
    return list(mod.QUICK) if scale == "small" else []


class CsvTable:
    """A result CSV's rows for a notebook: an HTML table (what Jupyter and GitHub show) and
    a plain-text one (nbconvert to text, terminals); at most NOTEBOOK_TABLE_ROWS rows."""

    def __init__(self, rows, path):
        self.rows, self.path = rows, path
        self.cols = list(rows[0]) if rows else []

    def _shown(self):
        left = len(self.rows) - NOTEBOOK_TABLE_ROWS
        note = f"{self.path}: {len(self.rows)} rows" + (f", the first {NOTEBOOK_TABLE_ROWS} shown" if left > 0 else "")
        return self.rows[:NOTEBOOK_TABLE_ROWS], note

    def _repr_html_(self):
        import html
        rows, note = self._shown()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.cols)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in self.cols) + "</tr>"
                       for r in rows)
        return (f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
                f"<p><small>{html.escape(note)}</small></p>")

    def __repr__(self):
        rows, note = self._shown()
        cells = [self.cols] + [[str(r.get(c, "")) for c in self.cols] for r in rows]
        width = [max(len(row[i]) for row in cells) for i in range(len(self.cols))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(row, width)).rstrip() for row in cells]
        return "\n".join(lines + [note])


def notebook_run(mod):
    """A notebook cell's run of experiment mod (a module, or its name: "p000_nhd"): at its
    QUICK scale, or with KVSTORE_NOTEBOOK_SCALE=full at its defaults, the scale of the
    committed results/ (notebook_argv), into fresh_out_dir() (under the notebook's directory,
    or $KVSTORE_RESULTS), never into results/. Displays its plot, then its CSV as a table;
    its report (medians, ratios, the paper's numbers) is printed as the experiment runs."""
    import importlib
    from IPython.display import Image, display
    if isinstance(mod, str):
        mod = importlib.import_module(f"{__package__}.{mod}")
    scale = os.environ.get("KVSTORE_NOTEBOOK_SCALE", "small")
    argv = notebook_argv(mod, scale)
    out = fresh_out_dir(mod.NAME)
    log(f"{mod.NAME} at the {scale} scale: kvstore experiment run {mod.NAME}"
        + (" --quick" if scale == "small" else ""))
    rows = main(mod, argv + ["--out", out])
    display(Image(os.path.join(out, mod.NAME + ".png")))
    csv_path = os.path.join(out, mod.NAME + ".csv")
    display(CsvTable(read_csv(csv_path) if os.path.exists(csv_path) else list(rows or []), csv_path))


class Progress:
    """A progress bar over total points: a widget in a notebook (tqdm.auto), a line on stderr
    in a terminal; notes about finished points print above it, on stderr."""

    def __init__(self, total, desc="points", initial=0):
        from tqdm import auto, std
        std.tqdm.monitor_interval = 0  # no monitor thread: nothing may fork while it holds a lock
        self.bar = auto.tqdm(total=total, initial=initial, desc=desc, unit="pt", file=sys.stderr,
                             dynamic_ncols=True)

    def step(self, note=""):
        self.bar.update(1)
        if note:
            self.bar.write(note, file=sys.stderr)

    def close(self):
        self.bar.close()


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only: no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path, dpi=110, tight=True):
    """Write fig to path (tight_layout first unless the caller laid it out) and close it."""
    if tight:
        fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    log(f"wrote {path}")


def spread(values):
    """(median, median - min, max - median) of a point's rounds: a bar's height and its
    min-max error bar as matplotlib's yerr wants it."""
    v = sorted(float(x) for x in values)
    m = statistics.median(v)
    return m, m - v[0], v[-1] - m


def bar_chart(ax, groups, series, values, labels=None, colors=None, annotate=None):
    """Grouped bars with min-max error bars on ax: one group per x tick (groups), one bar
    per series in each group. values: {(group, series): [round values]}; a missing point
    leaves a gap. labels: {series: legend text}. annotate: {(group, series): text} drawn
    above the bar. Returns {series: x of that series' bar in each group} (for markers)."""
    w = 0.8 / max(1, len(series))
    xs = {}
    for i, s in enumerate(series):
        x, h, lo, hi = [], [], [], []
        for g, grp in enumerate(groups):
            if values.get((grp, s)):
                m, dl, dh = spread(values[(grp, s)])
                x.append(g + (i - (len(series) - 1) / 2) * w)
                h.append(m), lo.append(dl), hi.append(dh)
        xs[s] = dict(zip([grp for grp in groups if values.get((grp, s))], x))
        if not x:
            continue
        ax.bar(x, h, w, yerr=[lo, hi], capsize=2, error_kw={"elinewidth": 0.8},
               label=(labels or {}).get(s, s), color=(colors or {}).get(s))
        for grp, xx, hh, dh in zip([grp for grp in groups if values.get((grp, s))], x, h, hi):
            if annotate and annotate.get((grp, s)):
                ax.annotate(annotate[(grp, s)], (xx, hh + dh), textcoords="offset points", xytext=(0, 2),
                            ha="center", fontsize=6)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.grid(axis="y", alpha=0.3)
    return xs


PAPER_STYLE = {"color": "black", "marker": "_", "s": 500, "linewidths": 2.5, "zorder": 5}


def paper_marks(ax, xs, ys, label="paper", **style):
    """The paper's values as short black bars at (xs, ys) (points without a value, None,
    are skipped), with one legend entry."""
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
    if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=label, **{**PAPER_STYLE, **style})


def paper_line(ax, y, label, **style):
    """A paper's single value (a peak, a ratio) as a dashed horizontal line."""
    ax.axhline(y, **{"color": "black", "ls": "--", "lw": 1, **style}, label=label)


def cores_note(pinned="", shares=""):
    """A title's second line: what is pinned and what shares this machine's CPUs, e.g.
    cores_note("servers on CPU 1, clients on CPU 0") or cores_note(shares="server, clients, peer")."""
    n = os.cpu_count()
    parts = [pinned or "nothing pinned"]
    if shares:
        parts.append(f"{shares} share the {n} CPUs" if not pinned else f"sharing: {shares}")
    return f"{n}-CPU VM; " + "; ".join(parts)


def machine_busy_seconds():
    """CPU-seconds all CPUs have spent busy (user+nice+system+irq+softirq+steal), from /proc/stat:
    what no process is charged for (softirq: XDP, the network stack) included. None without it."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def free_port(udp=False):
    """A port no socket of that kind (TCP, or UDP) holds on 127.0.0.1 now."""
    with socket.socket(type=socket.SOCK_DGRAM if udp else socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0" if udp else "127.0.0.1", 0))  # UDP servers here bind other addresses too
        return s.getsockname()[1]


def free_port_run(n, start=21000, stop=40000):
    """A TCP port b with b .. b+n-1 all free on 127.0.0.1 now (a cluster's nodes on consecutive
    ports)."""
    for b in range(start, stop - n, 97):
        socks = []
        try:
            for p in range(b, b + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return b
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} free consecutive ports in {start}..{stop}")


_SECRET = []


def repl_secret():
    """A replication secret file (mode 600) for the pairs an experiment starts: one per
    process, as an operator makes it (--repl-secret-file)."""
    if not _SECRET:
        path = os.path.join(tempfile.mkdtemp(prefix="kv-secret-"), "repl.secret")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(base64.b64encode(os.urandom(32)).decode() + "\n")
        _SECRET.append(path)
    return _SECRET[0]


def stat_cpu_seconds(path):
    """User + system CPU seconds in a /proc stat file (/proc/PID/stat: the process, all its
    threads; /proc/PID/task/TID/stat: one thread). Raises OSError once it is gone."""
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU seconds of a process, all threads (from /proc)."""
    return stat_cpu_seconds(f"/proc/{pid}/stat")


def pin_process(pid, cpus):
    """Every thread of process pid onto cpus (sched_setaffinity moves one thread: a
    process's threads are moved one by one; threads started later inherit from their
    creator). A thread that ended meanwhile is skipped; pid None does nothing."""
    if pid is None:
        return
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, FileNotFoundError):
            pass


def cpu_jiffies(cpus=None):
    """(busy, total) jiffies summed over the CPUs in cpus (all when None), from /proc/stat:
    busy_share(a, b) of two readings is the share of the time those CPUs were busy."""
    busy = total = 0
    with open("/proc/stat") as f:
        for line in f:
            name = line.split(" ", 1)[0]
            if not name.startswith("cpu") or name == "cpu" or (cpus is not None and int(name[3:]) not in cpus):
                continue
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
            t = sum(v[:8])  # guest time is already counted in user
            busy, total = busy + t - idle, total + t
    return busy, total


def busy_share(before, after):
    """Share (0-1) of the time the CPUs of two cpu_jiffies readings were busy between them."""
    dt = after[1] - before[1]
    return (after[0] - before[0]) / dt if dt > 0 else 0.0


def own_cpu_seconds():
    """CPU seconds of this process (all threads: the in-process load generator's too) plus
    its waited-for children (redis-benchmark)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class Proc(Process):
    """A server process started for a measurement and stopped after it: kvstore's process
    wrapper, ready once its port accepts, plus the protocol the load generator speaks to it."""

    def __init__(self, name, argv, port, protocol="resp"):
        super().__init__(argv, port=port, name=name)
        self.protocol = protocol

    def start(self, timeout=10.0):
        if not shutil.which(self.argv[0]):
            raise RuntimeError(f"{self.argv[0]} is not installed (make deps installs it)")
        return super().start(timeout)

    def stop(self, *a, **kw):
        rc = super().stop(*a, **kw)
        if self.log_path and os.path.exists(self.log_path):  # its temporary log: a failure to start
            os.unlink(self.log_path)                         # has already shown it
        self.log_path = None
        return rc


def redis_server(port, name="redis", *extra):
    """redis-server with persistence off, unless extra options (e.g. --appendonly yes) turn it on."""
    d = tempfile.mkdtemp(prefix="kv-redis-")
    return Proc(name, ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                       "--dir", d, "--bind", "127.0.0.1", *extra], port)


def mosquitto(port, name="mosquitto"):
    """Debian's mosquitto (MQTT 3.1.1/5 broker) on 127.0.0.1:port, anonymous, persistence off (its
    default): QoS 1 is acknowledged from memory. As root it runs as root (-u is its config's `user`)."""
    d = tempfile.mkdtemp(prefix="kv-mosquitto-")
    conf = os.path.join(d, "mosquitto.conf")
    with open(conf, "w") as f:
        f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                + ("user root\n" if os.geteuid() == 0 else ""))
    return Proc(name, ["mosquitto", "-c", conf], port, "mqtt")


def memcached(port, threads=2):
    argv = ["memcached", "-p", str(port), "-U", "0", "-l", "127.0.0.1", "-t", str(threads),
            "-m", "4096", "-c", "4096"]
    if os.geteuid() == 0:
        argv += ["-u", "root"]  # memcached refuses to run as root without -u
    return Proc("memcached", argv, port, "memcache")


def write_csv(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_redis_benchmark(port, op, pipeline, conns, requests, keyspace, value_size, prefix=(), extra=()):
    """extra: more redis-benchmark options (e.g. --tls --cacert FILE)."""
    cmd = [*prefix, "redis-benchmark", "-p", str(port), "-t", op.lower(), "-P", str(pipeline), "-c", str(conns),
           "-n", str(requests), "-d", str(value_size), "-r", str(keyspace), "--csv", "--threads", "1", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    line = [ln for ln in out.splitlines() if ln.startswith(f'"{op.upper()}"')][-1]
    f = [x.strip('"') for x in line.split(",")]
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    return {"throughput": float(f[1]), "p50_us": float(f[4]) * 1000, "p99_us": float(f[6]) * 1000}


def run_kvstore_bench(port, protocol, op, pipeline, conns, requests, keyspace, value_size, threads):
    r = kvbench.run(port=port, protocol=protocol, threads=threads, conns=conns, pipeline=pipeline,
                    value_size=value_size, keyspace=keyspace, ratio="1:0" if op == "SET" else "0:1",
                    requests=requests)
    if r["errors"]:
        raise RuntimeError(f"kvstore bench on port {port}: {r['errors']} errors, first: {r['first_error']}")
    return {"throughput": r["throughput"], "p50_us": r["lat_p50_us"], "p99_us": r["lat_p99_us"],
            "hit_ratio": r["hits"] / r["gets"] if r["gets"] else ""}


def add_sweep_args(ap):
    """--resume / --rerun for a sweep whose points are measured one by one (see Sweep)."""
    ap.add_argument("--resume", action="store_true",
                    help="keep the points already in the CSV and measure only the missing ones")
    ap.add_argument("--rerun", action="store_true",
                    help="measure the selected points again, keeping every other point in the CSV")


class Sweep:
    """The points of a sweep, written to the CSV as each finishes, with a progress bar.

    key: the fields that name a point (e.g. ("row", "arch", "round")). With resume, the
    CSV's points are kept and not measured again; with rerun, the CSV's points are kept
    except the selected ones (selected(row) is true), which are measured anew."""

    def __init__(self, path, key, total, args, selected=lambda r: True, desc="points"):
        self.path, self.key = path, key
        old = read_csv(path) if (args.resume or args.rerun) and os.path.exists(path) else []
        if args.rerun:
            old = [r for r in old if not selected(r)]
        self.rows = old
        self.done = {self._k(r) for r in old}
        todo_done = sum(1 for r in old if selected(r))
        self.bar = Progress(total, desc, initial=todo_done)

    def _k(self, r):
        return tuple(str(r[k]) for k in self.key)

    def has(self, **point):
        return self._k(point) in self.done

    def add(self, row, note=""):
        self.rows.append(row)
        self.done.add(self._k(row))
        write_csv(self.path, self.rows)
        self.bar.step(note)

    def close(self):
        self.bar.close()


def medians(rows, keys, field="throughput"):
    """{(r[k] for k in keys): median of r[field]} over the rounds of each point."""
    out = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(float(r[field]))
    return {k: statistics.median(v) for k, v in out.items()}


def paired_rounds(rows, side, a, b, field="throughput", **where):
    """[a/b of each round both have] (values of column `side`), among the rows matching
    `where`, paired by the round column (not by the rows' order), in round order."""
    t = {(str(r[side]), str(r["round"])): float(r[field]) for r in rows
         if all(str(r[k]) == str(v) for k, v in where.items())}
    return [t[(a, rnd)] / t[(b, rnd)] for (s, rnd) in sorted(t) if s == a and (b, rnd) in t and t[(b, rnd)]]


def paired(rows, side, a, b, field="throughput", **where):
    """Median over rounds of a/b (values of column `side`) for points measured side by side,
    in the same round, among the rows matching `where`: steadier than a ratio of medians
    when the machine's speed drifts between rounds. None without a pair."""
    x = paired_rounds(rows, side, a, b, field, **where)
    return statistics.median(x) if x else None
