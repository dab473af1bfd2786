"""Shared pieces of the experiments: the command line and run flow every experiment
module shares (parse_args, main, pyplot/save_figure), servers under test, CPU
accounting, CSV. The module interface itself is described in __init__.py."""
import argparse
import csv
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

from kvstore import bench as kvbench
from kvstore.process import Process

DEFAULT_RESULTS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results"))


def results_dir():
    """Where CSV + PNG go: results/, or KVSTORE_RESULTS (the notebooks' and `--quick` runs'
    small runs must not overwrite the full-scale results the README quotes). Read at each
    call, so a process may set it after importing the experiments."""
    return os.environ.get("KVSTORE_RESULTS") or DEFAULT_RESULTS


def result_path(name):
    """results_dir()/name, e.g. result_path("p000_fig4.png")."""
    return os.path.join(results_dir(), name)


def quick_results_dir(name):
    """For a smoke-scale run: KVSTORE_RESULTS, set to a new temporary directory unless the
    user chose one, so that small runs never overwrite the committed full-scale files."""
    if not os.environ.get("KVSTORE_RESULTS"):
        os.environ["KVSTORE_RESULTS"] = tempfile.mkdtemp(prefix=f"kv-{name}-")
    return os.environ["KVSTORE_RESULTS"]


def log(msg):
    """Progress and 'wrote ...' lines: on stderr, so stdout keeps only the report."""
    print(msg, file=sys.stderr, flush=True)


def parser(mod, prog=None):
    """The experiment's argparse parser: its docstring as help, --plot-only and --tag for
    all, then the experiment's own options (mod.add_args)."""
    ap = argparse.ArgumentParser(prog=prog, description=mod.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the CSV, measure nothing")
    ap.add_argument("--tag", default="", help=f"suffix of the result files: {mod.NAME}_TAG.csv/.png "
                                              "(another setup, kept beside the default one)")
    mod.add_args(ap)
    return ap


def parse_args(mod, argv=None, prog=None):
    """argv (a list; None: sys.argv) parsed for experiment module mod; args.csv and args.png
    are its result files, and mod.check_args(args), if any, may adjust or refuse the rest."""
    args = parser(mod, prog).parse_args(argv)
    base = mod.NAME + (f"_{args.tag}" if args.tag else "")
    args.csv, args.png = result_path(base + ".csv"), result_path(base + ".png")
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
    else:
        rows = mod.measure(args)
    if hasattr(mod, "report"):
        mod.report(rows)
    mod.draw(rows, args.png)
    return rows


def notebook_run(mod):
    """A notebook cell's run of experiment mod: at its QUICK scale into quick_results_dir(),
    or at the README's scale with KVSTORE_NOTEBOOK_SCALE=full; returns its plot (an
    IPython Image) to display."""
    from IPython.display import Image
    if os.environ.get("KVSTORE_NOTEBOOK_SCALE", "small") == "small":
        quick_results_dir("notebook")
        main(mod, list(mod.QUICK))
    else:
        main(mod, [])
    return Image(result_path(mod.NAME + ".png"))


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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """User + system CPU seconds of a process, all threads (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def run_redis_benchmark(port, op, pipeline, conns, requests, keyspace, value_size, prefix=()):
    cmd = [*prefix, "redis-benchmark", "-p", str(port), "-t", op.lower(), "-P", str(pipeline), "-c", str(conns),
           "-n", str(requests), "-d", str(value_size), "-r", str(keyspace), "--csv", "--threads", "1"]
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
        import tqdm
        tqdm.tqdm.monitor_interval = 0  # no monitor thread: a fork (pyroute2's netns) must not inherit its lock
        self.path, self.key = path, key
        old = read_csv(path) if (args.resume or args.rerun) and os.path.exists(path) else []
        if args.rerun:
            old = [r for r in old if not selected(r)]
        self.rows = old
        self.done = {self._k(r) for r in old}
        todo_done = sum(1 for r in old if selected(r))
        self.bar = tqdm.tqdm(total=total, initial=todo_done, desc=desc, unit="pt", file=sys.stderr, dynamic_ncols=True)

    def _k(self, r):
        return tuple(str(r[k]) for k in self.key)

    def has(self, **point):
        return self._k(point) in self.done

    def add(self, row, note=""):
        self.rows.append(row)
        self.done.add(self._k(row))
        write_csv(self.path, self.rows)
        self.bar.update(1)
        if note:
            self.bar.write(note)

    def close(self):
        self.bar.close()


def medians(rows, keys, field="throughput"):
    """{(r[k] for k in keys): median of r[field]} over the rounds of each point."""
    out = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(float(r[field]))
    return {k: statistics.median(v) for k, v in out.items()}


def paired(rows, side, a, b, field="throughput", **where):
    """Median over rounds of a/b (values of column `side`) for points measured side by side,
    in the same round, among the rows matching `where`: steadier than a ratio of medians
    when the machine's speed drifts between rounds. None without a pair."""
    t = {(str(r[side]), str(r["round"])): float(r[field]) for r in rows
         if all(str(r[k]) == str(v) for k, v in where.items())}
    x = [t[(a, rnd)] / t[(b, rnd)] for (s, rnd) in t if s == a and (b, rnd) in t]
    return statistics.median(x) if x else None
