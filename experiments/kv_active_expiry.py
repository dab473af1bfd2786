"""Active expiry: how fast a million keys with a 1 s TTL are reclaimed while a write load
runs, and what the reclaim costs that load (issue 13).

Each round runs every server configuration (kvstore serve --durability none; --durability
disk with its data file, the server's default; redis-server as the reference) twice, each
time on a fresh server: pass A, then pass B.
  - A steady write load runs through the whole pass: kvstore bench, SET of 85-byte values on
    --load-keys keys without a TTL (key:...), 1 client thread, closed loop, in back-to-back
    --window s runs (throughput, p99, and server CPU per request from /proc/PID/stat).
    The load's keys are written once before the pass, so its memory stays level.
  - After --warm s, the fill: --keys SETs of 85-byte values on other keys (exp:...) through
    redis-cli --pipe (one connection, pipelined). A: PX 1000, so they expire; B: PX 3600000,
    the same keys, memory and TTL bookkeeping, but nothing expires during the pass.
  - INFO every --sample s (keys with a TTL, expired_keys, used_memory, log bytes, shards
    rehashing) until the TTL keys are gone (A, at most --max-reclaim s after the fill) or as
    long as A's took (B), then --tail s more (with the data file a reclaimed key stays as a
    tombstone until the flusher has written its deletion: memory returns later).
Nothing reads the exp: keys, so every key reclaimed is reclaimed by the active cycle.
Reported per configuration (medians over rounds with min-max): the time from the last key's
expiry (fill end + 1 s; keys written early expire during the fill, so a negative time means
reached before) to 50, 90 and 100 % reclaimed, the reclaim rate (keys/s from 10 to 90 %), the
memory returned; and the cost: the load's windows from the fill's end to 100 % reclaimed in A
against the same span in B of the same round (throughput and server CPU per request, paired
ratios). Who else used the cores is measured too: /proc/stat minus this run's processes, and the
other processes that used the most CPU over the run.

    kvstore experiment run kv_active_expiry [-- --rounds 5 --modes none disk redis]
        -> OUT/kv_active_expiry.{csv,png}
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import redis

from kvstore import Node
from kvstore import bench as kvbench
from kvstore.experiments import common

NAME = "kv_active_expiry"
QUICK = ["--keys", "50000", "--rounds", "1", "--modes", "none", "disk", "--load-keys", "10000",
         "--warm", "1", "--tail", "1", "--max-reclaim", "15"]
MODES = ("none", "disk", "redis")
PASSES = {"A": 1000, "B": 3_600_000}  # the fill's PX: A expires 1 s after each write, B not in the pass
CLK_TCK = os.sysconf("SC_CLK_TCK")
KVT_SHARDS = 256  # ext/core/table.h: the table's shards (INFO table_rehashing_shards counts them)


# ---- servers

class Server:
    """A kvstore serve (mode none/disk, a fresh data directory) or redis-server (mode redis)."""

    def __init__(self, mode, threads):
        self.mode = mode
        if mode == "redis":
            self.proc = common.redis_server(common.free_port())
            self.dir = self.proc.argv[self.proc.argv.index("--dir") + 1]
        else:
            self.dir = tempfile.mkdtemp(prefix="kv-active-expiry-")
            self.proc = Node(port=0, threads=threads, durability=mode, data_dir=self.dir)

    def __enter__(self):
        self.proc.start()
        self.port, self.pid = self.proc.port, self.proc.pid
        return self

    def __exit__(self, *exc):
        self.proc.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def info(client):
    """The INFO fields the reclaim curve needs, as numbers."""
    i = client.info()
    db = i.get("db0") or {}
    return {"keys": db.get("keys", 0), "ttl_keys": db.get("expires", 0), "expired_keys": i["expired_keys"],
            "used_memory": i["used_memory"], "log_bytes": i.get("log_bytes", ""),
            "rehashing_shards": i.get("table_rehashing_shards", "")}


# ---- CPU accounting: this run's processes and everyone else's

def busy_seconds():
    """CPU seconds of the whole machine (all cores, from /proc/stat): (user and system; in
    interrupts and softirqs, loopback TCP's receive work among them, which a process's own
    times may include too when it was the one interrupted; stolen by the hypervisor for other
    guests)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2]) / CLK_TCK, (v[5] + v[6]) / CLK_TCK, v[7] / CLK_TCK


def own_seconds():
    """CPU seconds of this process (the load generator's threads, the sampler) and its reaped
    children (redis-cli)."""
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


def process_cpu():
    """{pid: (name, CPU seconds)} of every process now running."""
    out = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    s = f.read()
            except OSError:
                continue
            name, rest = s[s.index("(") + 1:s.rindex(")")], s[s.rindex(")") + 2:].split()
            if name.startswith("kworker"):  # a kernel worker's name ends in its current work item
                name = "kworker"
            out[int(p)] = (name, (int(rest[11]) + int(rest[12])) / CLK_TCK)
    return out


class Sharers:
    """CPU seconds of the processes not ours (pids in .ours), by name, from /proc snapshots
    about once a second: a process that lives for less than that is only in the /proc/stat
    total, and one that ends loses its last second."""

    def __init__(self, ours):
        self.ours, self.use = set(ours), {}
        self.last, self.at = process_cpu(), time.monotonic()

    def poll(self, force=False):
        if not force and time.monotonic() - self.at < 1.0:
            return
        now, self.at = process_cpu(), time.monotonic()
        for pid, (name, cpu) in now.items():
            if pid not in self.ours:
                self.use[name] = self.use.get(name, 0.0) + cpu - (self.last[pid][1] if pid in self.last else 0.0)
        self.last = now

    def top(self, n=8):
        """[(name, CPU seconds)], the largest first."""
        return sorted(((k, c) for k, c in self.use.items() if c > 0.05), key=lambda x: -x[1])[:n]


# ---- the load, the fill and the sampler

class Load(threading.Thread):
    """The steady write load in back-to-back windows until stopped (or --max-pass s)."""

    def __init__(self, srv, args, t0):
        super().__init__(name="expiry-load", daemon=True)
        self.srv, self.args, self.t0 = srv, args, t0
        self.windows, self.error = [], None
        self.halt = threading.Event()

    def run(self):
        a, i = self.args, 0
        deadline = time.monotonic() + a.max_pass
        try:
            while not self.halt.is_set() and time.monotonic() < deadline:
                c0, s = common.cpu_seconds(self.srv.pid), time.monotonic()
                r = kvbench.run(port=self.srv.port, threads=1, conns=a.load_conns, pipeline=a.load_pipeline,
                                value_size=85, keyspace=a.load_keys, ratio="1:0", duration=a.window, seed=i + 1)
                e, c1 = time.monotonic(), common.cpu_seconds(self.srv.pid)
                if r["errors"]:
                    raise RuntimeError(f"load: {r['errors']} errors, first: {r['first_error']}")
                self.windows.append({"t0": s - self.t0, "t1": e - self.t0, "throughput": r["throughput"],
                                     "p99_us": r["lat_p99_us"],
                                     "cpu_us_per_request": (c1 - c0) / max(r["requests"], 1) * 1e6})
                i += 1
        except Exception as exc:  # reported by the pass, which stops
            self.error = exc


def write_fill(path, n, px):
    """RESP for n SET exp:NNNNNNNNNNNN <85 bytes> PX px, as redis-cli --pipe sends it."""
    tail = b"\r\n$2\r\nPX\r\n$%d\r\n%d\r\n" % (len(str(px)), px)
    pad = b"-reading-" * 10
    with open(path, "wb") as f:
        for lo in range(0, n, 10_000):
            f.write(b"".join(b"*5\r\n$3\r\nSET\r\n$16\r\nexp:%012d\r\n$85\r\n%012d" % (i, i) + pad[:73] + tail
                             for i in range(lo, min(n, lo + 10_000))))


def start_fill(port, path):
    """redis-cli --pipe < path, started; returns (Popen, {"end": monotonic time it finished})."""
    with open(path, "rb") as f:
        proc = subprocess.Popen(["redis-cli", "-p", str(port), "--pipe"], stdin=f,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = {}

    def wait():
        done["out"] = proc.communicate(timeout=600)[0]
        done["end"] = time.monotonic()
    threading.Thread(target=wait, daemon=True).start()
    return proc, done


def fill_errors(out):
    """redis-cli --pipe's summary line 'errors: E, replies: R' -> E (a missing line is an error)."""
    for ln in out.splitlines():
        if ln.startswith("errors:"):
            return int(ln.split(",")[0].split(":")[1])
    raise RuntimeError(f"redis-cli --pipe: no summary in its output: {out[-300:]!r}")


def run_pass(srv, args, rnd, pas, fill_path, span):
    """One pass on a fresh server: load, fill, sample. span: how long after the fill to
    sample (B: A's time to 100 %); None: until the TTL keys are gone (A).
    Returns (rows, summary)."""
    a = args
    kvbench.run(port=srv.port, threads=1, conns=a.load_conns, pipeline=16, value_size=85,
                keyspace=a.load_keys, ratio="1:0", requests=5 * a.load_keys)  # the load's keys, once
    cli = redis.Redis(port=srv.port)
    sharers = Sharers({os.getpid(), srv.pid})
    busy0, (self0, kids0), srv0 = busy_seconds(), own_seconds(), common.cpu_seconds(srv.pid)
    t0, load_avg = time.monotonic(), os.getloadavg()[0]
    load = Load(srv, a, t0)
    load.start()
    samples = []

    def sample():
        s = info(cli)
        s["t"] = time.monotonic() - t0
        samples.append(s)
        sharers.poll()
        if load.error:
            raise load.error
        return s

    try:
        while time.monotonic() - t0 < a.warm:
            sample()
            time.sleep(a.sample)
        base = sample()
        fill_start = time.monotonic()
        proc, done = start_fill(srv.port, fill_path)
        sharers.ours.add(proc.pid)
        while "end" not in done:
            if time.monotonic() - fill_start > a.max_pass:
                proc.kill()
                raise RuntimeError("the fill did not finish")
            sample()
            time.sleep(a.sample)
        if proc.returncode or fill_errors(done["out"]):
            raise RuntimeError(f"redis-cli --pipe failed: {done['out'][-300:]!r}")
        fill_end = done["end"] - t0
        at_end = sample()
        t100 = None
        limit = fill_end + (span if span is not None else a.max_reclaim)
        while time.monotonic() - t0 < limit:
            s = sample()
            if span is None and s["expired_keys"] - base["expired_keys"] >= a.keys:
                t100 = s["t"] - fill_end
                break
            time.sleep(a.sample)
        tail_end = time.monotonic() - t0 + a.tail
        while time.monotonic() - t0 < tail_end:
            sample()
            time.sleep(a.sample)
    finally:
        load.halt.set()
        load.join()
        cli.close()
    if load.error:
        raise load.error
    wall = time.monotonic() - t0
    self1, kids1 = own_seconds()
    server_s = common.cpu_seconds(srv.pid) - srv0
    tasks, irq, steal = (b - a for a, b in zip(busy0, busy_seconds()))
    sharers.poll(force=True)
    key = {"round": rnd, "mode": srv.mode, "pass": pas}
    rows = [{"kind": "sample", **key, **s, "t": s["t"] - fill_end} for s in samples]
    rows += [{"kind": "window", **key, **w, "t0": w["t0"] - fill_end, "t1": w["t1"] - fill_end}
             for w in load.windows]
    summary = {"kind": "pass", **key, "keys": a.keys, "fill_s": fill_end - (fill_start - t0),
               "ttl_keys_at_fill_end": at_end["ttl_keys"],
               "reclaimed_at_fill_end": at_end["expired_keys"] - base["expired_keys"],
               "span_s": t100 if span is None else span, "t100_s": t100 if span is None else "",
               "wall_s": wall, "server_cpu_s": server_s, "bench_cpu_s": self1 - self0, "fill_cpu_s": kids1 - kids0,
               "others_cpu_s": tasks - server_s - (self1 - self0) - (kids1 - kids0), "irq_cpu_s": irq,
               "steal_cpu_s": steal,
               "loadavg1": load_avg, "other_processes": "; ".join(f"{n} {c:.1f}s" for n, c in sharers.top())}
    return rows, summary


# ---- measure

def measure(args):
    rows = []
    tmp = tempfile.mkdtemp(prefix="kv-active-expiry-fill-")
    try:
        fills = {}
        for pas, px in PASSES.items():
            fills[pas] = os.path.join(tmp, f"fill-{pas}.resp")
            write_fill(fills[pas], args.keys, px)
        for rnd in range(args.rounds):
            for mode in args.modes:
                span = None
                for pas in PASSES:
                    with Server(mode, args.threads) as srv:
                        got, summary = run_pass(srv, args, rnd, pas, fills[pas], span)
                    if pas == "A":
                        span = summary["span_s"] if summary["span_s"] is not None else args.max_reclaim
                    rows += got + [summary]
                    common.write_csv(args.csv, rows)
                    log_pass(summary, got)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def else_cpu(p):
    """CPU seconds of a pass that went neither to the server, nor to this process, nor to
    redis-cli: other processes and interrupt work. (Softirq time is charged to whatever process
    it interrupted as well as to /proc/stat's softirq field, so others_cpu_s, from user +
    system alone, can be below zero on a quiet machine; adding irq_cpu_s makes an upper bound.)"""
    return max(num(p["others_cpu_s"]) + num(p["irq_cpu_s"]), 0.0)


def log_pass(p, rows):
    w = [float(r["throughput"]) for r in rows if r["kind"] == "window"]
    t100 = f"100 % reclaimed {fill_end_plus(p['t100_s'])}" if p["pass"] == "A" else f"span {p['span_s']:.1f} s"
    common.log(f"round {p['round']} {p['mode']:5s} {p['pass']}: fill {p['fill_s']:.2f} s, {t100}; "
               f"load median {statistics.median(w) if w else 0:,.0f} req/s; CPU s: server {p['server_cpu_s']:.1f} "
               f"bench {p['bench_cpu_s']:.1f} redis-cli {p['fill_cpu_s']:.1f} else {else_cpu(p):.1f} "
               f"(irq {p['irq_cpu_s']:.1f}) steal {p['steal_cpu_s']:.1f} "
               f"of {p['wall_s'] * os.cpu_count():.1f}; top others: {p['other_processes']}")


def fill_end_plus(t):
    return f"{float(t) - 1:+.2f} s after the last expiry" if t not in ("", None) else "not within the bound"


# ---- analysis (from rows as measured or as read back from the CSV: every value may be a string)

def num(x):
    return float(x) if x not in ("", None) else None


def group(rows, kind, **where):
    return [r for r in rows if r["kind"] == kind and all(str(r[k]) == str(v) for k, v in where.items())]


def reclaim_times(rows, mode, rnd):
    """Pass A of (mode, round): {"t50", "t90", "t100": seconds after the last expiry (fill end
    + 1 s), None if not reached; "rate": keys/s from 10 to 90 %; "mem_freed", "mem_freed_end":
    bytes returned from the peak to 100 % reclaimed and to the pass's end; "stall": seconds
    after the last expiry with keys left to reclaim and none reclaimed; "stall_rehashing": the median
    number of shards rehashing meanwhile (kvstore; None for Redis)}."""
    p = group(rows, "pass", mode=mode, round=rnd, **{"pass": "A"})[0]
    s = group(rows, "sample", mode=mode, round=rnd, **{"pass": "A"})
    n = num(p["keys"])
    first = num(s[0]["expired_keys"])  # before the fill (the warm-up's first sample)
    when = {}
    for q in (0.1, 0.5, 0.9, 1.0):
        hit = [num(r["t"]) for r in s if num(r["expired_keys"]) - first >= q * n]
        when[q] = hit[0] if hit else None
    done = [r for r in s if when[1.0] is not None and num(r["t"]) >= when[1.0]]
    peak = max(num(r["used_memory"]) for r in s if not done or num(r["t"]) <= when[1.0])
    out = {f"t{int(q * 100)}": (when[q] - 1 if when[q] is not None else None) for q in (0.5, 0.9, 1.0)}
    out["rate"] = 0.8 * n / (when[0.9] - when[0.1]) if when[0.9] is not None and when[0.9] > when[0.1] else None
    out["mem_freed"] = peak - num(done[0]["used_memory"]) if done else None  # the load's keys: level
    out["mem_freed_end"] = peak - num(s[-1]["used_memory"]) if done else None
    after = [r for r in s if num(r["t"]) >= 1 and (not done or num(r["t"]) <= when[1.0])]
    flat = [(x, y) for x, y in zip(after, after[1:]) if x["expired_keys"] == y["expired_keys"]]
    out["stall"] = sum(num(y["t"]) - num(x["t"]) for x, y in flat)
    rh = [num(y["rehashing_shards"]) for x, y in flat if num(y.get("rehashing_shards")) is not None]
    out["stall_rehashing"] = statistics.median(rh) if rh else None
    return out


def span_windows(rows, mode, rnd, pas):
    """The load's windows of a pass whose middle lies in [fill end, fill end + span]."""
    span = num(group(rows, "pass", mode=mode, round=rnd, **{"pass": "A"})[0]["span_s"])
    return [w for w in group(rows, "window", mode=mode, round=rnd, **{"pass": pas})
            if span is not None and 0 <= (num(w["t0"]) + num(w["t1"])) / 2 <= span]


def before_windows(rows, mode, rnd, pas):
    """The load's windows of a pass that ended before its fill began."""
    fill = num(group(rows, "pass", mode=mode, round=rnd, **{"pass": pas})[0]["fill_s"])
    return [w for w in group(rows, "window", mode=mode, round=rnd, **{"pass": pas}) if num(w["t1"]) <= -fill]


def costs(rows, mode, rnd):
    """{field: (A's median over its reclaim span, B's over the same span, their ratio A/B, and
    the ratio of A's to B's own before-the-fill ratios: the same with each pass's drift taken
    out)}, None for a field without windows."""
    out = {}
    for f in ("throughput", "cpu_us_per_request", "p99_us"):
        med = {}
        for pas in PASSES:
            for side, ws in (("span", span_windows(rows, mode, rnd, pas)), ("before", before_windows(rows, mode, rnd, pas))):
                med[pas, side] = statistics.median(num(w[f]) for w in ws) if ws else None
        if None in med.values():
            out[f] = None
        else:
            a, b = med["A", "span"], med["B", "span"]
            out[f] = (a, b, a / b, (a / med["A", "before"]) / (b / med["B", "before"]))
    return out


def rounds_by_mode(rows):
    """{mode: [rounds with both passes in rows]} (a run stopped early leaves a pass alone)."""
    have = {(p["mode"], str(p["round"]), p["pass"]) for p in group(rows, "pass")}
    out = {}
    for m, r, _ in sorted(have, key=lambda x: (MODES.index(x[0]) if x[0] in MODES else 9, int(x[1]))):
        if all((m, r, pas) in have for pas in PASSES) and r not in out.setdefault(m, []):
            out[m].append(r)
    return out


def spread(xs, fmt):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    return f"{fmt(statistics.median(xs))} ({fmt(min(xs))}..{fmt(max(xs))})"


def report(rows):
    print(f"active expiry: {num(group(rows, 'pass')[0]['keys']):,.0f} keys with PX 1000 under a write load; "
          f"medians over rounds (min..max)")
    for m, rounds in rounds_by_mode(rows).items():
        rt = [reclaim_times(rows, m, r) for r in rounds]
        cs = [costs(rows, m, r) for r in rounds]
        pa, pb = ([p for p in group(rows, "pass", mode=m, **{"pass": x}) if str(p["round"]) in rounds] for x in PASSES)
        fills = {x: [num(p["fill_s"]) for p in ps] for x, ps in (("A", pa), ("B", pb))}
        at_fill = [num(p["reclaimed_at_fill_end"]) / num(p["keys"]) * 100 for p in pa]
        print(f"\n{m} ({len(rounds)} rounds): fill A {spread(fills['A'], lambda x: f'{x:.2f}')} s "
              f"(B {spread(fills['B'], lambda x: f'{x:.2f}')} s, paired A/B "
              f"{spread([a / b for a, b in zip(fills['A'], fills['B'])], lambda x: f'{x:.2f}')}), "
              f"reclaimed by its end {spread(at_fill, lambda x: f'{x:.0f}')} %")
        for k in ("t50", "t90", "t100"):
            print(f"  {k[1:]:>3s} % reclaimed, s after the last expiry: {spread([x[k] for x in rt], lambda x: f'{x:+.2f}')}")
        print(f"  reclaim rate 10->90 %, keys/s: {spread([x['rate'] for x in rt], lambda x: f'{x:,.0f}')}")
        print(f"  memory returned, MB: by 100 % reclaimed {spread([x['mem_freed'] for x in rt], lambda x: f'{x / 1e6:.1f}')}"
              f", by the pass's end {spread([x['mem_freed_end'] for x in rt], lambda x: f'{x / 1e6:.1f}')}")
        print(f"  stalled after the last expiry (keys left, none reclaimed), s: {spread([x['stall'] for x in rt], lambda x: f'{x:.1f}')}"
              f"; shards rehashing meanwhile: {spread([x['stall_rehashing'] for x in rt], lambda x: f'{x:.0f}')}"
              f" of {KVT_SHARDS}")
        for f, label in (("throughput", "load throughput, req/s"), ("cpu_us_per_request", "server CPU per request, us"),
                         ("p99_us", "load p99, us")):
            v = [c[f] for c in cs]
            print(f"  {label}: reclaiming {spread([x and x[0] for x in v], lambda x: f'{x:,.1f}')}  "
                  f"not {spread([x and x[1] for x in v], lambda x: f'{x:,.1f}')}  "
                  f"paired A/B {spread([x and x[2] for x in v], lambda x: f'{x:.3f}')}, "
                  f"each over its own before-fill {spread([x and x[3] for x in v], lambda x: f'{x:.3f}')}")
    ps = group(rows, "pass")
    share = {k: statistics.median(num(p[k]) / (num(p["wall_s"]) * os.cpu_count()) * 100 for p in ps)
             for k in ("server_cpu_s", "bench_cpu_s", "fill_cpu_s", "irq_cpu_s", "steal_cpu_s")}
    share["else"] = statistics.median(else_cpu(p) / (num(p["wall_s"]) * os.cpu_count()) * 100 for p in ps)
    print(f"\ncores ({os.cpu_count()}) during a pass, median % of their time: server {share['server_cpu_s']:.0f}, "
          f"load generator + INFO sampler {share['bench_cpu_s']:.0f}, redis-cli {share['fill_cpu_s']:.0f}, "
          f"everything else {share['else']:.0f} (other processes, and interrupt work not charged to a "
          f"process; interrupts/softirqs in all {share['irq_cpu_s']:.0f}, much of it this run's loopback TCP), "
          f"stolen by the hypervisor {share['steal_cpu_s']:.0f}; load average at pass start "
          f"{spread([num(p['loadavg1']) for p in ps], lambda x: f'{x:.1f}')}")
    tops = {}
    for p in ps:
        for item in filter(None, p["other_processes"].split("; ")):
            name, sec = item.rsplit(" ", 1)
            tops[name] = tops.get(name, 0) + float(sec.rstrip("s"))
    print("other processes, CPU s over all passes: " + ", ".join(f"{n} {s:.0f}" for n, s in
                                                                  sorted(tops.items(), key=lambda x: -x[1])[:8]))


# ---- plot

def typical_round(rows, mode, rounds):
    """The round whose time to 100 % is the median (the first round if none finished)."""
    t = [reclaim_times(rows, mode, r)["t100"] for r in rounds]
    t = sorted((1e9 if x is None else x, r) for x, r in zip(t, rounds))
    return t[(len(t) - 1) // 2][1]


def draw(rows, path):
    plt = common.pyplot()
    by_mode = rounds_by_mode(rows)
    modes = list(by_mode)
    colors = dict(zip(MODES, ("#1f77b4", "#d62728", "#7f7f7f")))
    fig = plt.figure(figsize=(12, 2.6 * max(len(modes), 2)))
    gs = fig.add_gridspec(len(modes), 2)
    ax = fig.add_subplot(gs[:, 0])
    for m, rounds in by_mode.items():
        for r in rounds:
            s = group(rows, "sample", mode=m, round=r, **{"pass": "A"})
            ax.plot([num(x["t"]) for x in s], [num(x["ttl_keys"]) for x in s], color=colors.get(m), alpha=0.7,
                    linewidth=1, label=m if r == rounds[0] else None)
    ax.axvline(0, color="black", linewidth=0.8, linestyle=":")
    ax.axvline(1, color="black", linewidth=0.8, linestyle="--", label="last key expired (fill end + 1 s)")
    ax.set_xlabel("seconds since the fill ended")
    ax.set_ylabel("keys with a TTL still in the table")
    ax.set_title("reclaim of keys written with PX 1000, every round", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    for i, m in enumerate(modes):
        bx = fig.add_subplot(gs[i, 1])
        r = typical_round(rows, m, by_mode[m])
        p = group(rows, "pass", mode=m, round=r, **{"pass": "A"})[0]
        for pas, style in (("A", "-"), ("B", "--")):
            w = group(rows, "window", mode=m, round=r, **{"pass": pas})
            bx.plot([(num(x["t0"]) + num(x["t1"])) / 2 for x in w], [num(x["throughput"]) for x in w], style,
                    color=colors.get(m), label={"A": f"A: {num(p['keys']):,.0f} keys expiring", "B": "B: same keys, PX 1 h"}[pas])
        bx.axvspan(-num(p["fill_s"]), 0, color="#cccccc", alpha=0.5, label="fill (A)")
        if num(p["span_s"]) is not None:
            bx.axvspan(0, num(p["span_s"]), color="#ffbb78", alpha=0.4, label="reclaim (A)")
        bx.set_ylim(bottom=0)
        bx.set_ylabel("load SET/s")
        bx.set_title(f"{m}: write load during the pass (round {r})", fontsize=9)
        bx.grid(alpha=0.3)
        bx.legend(fontsize=7, loc="lower left")
        if i == len(modes) - 1:
            bx.set_xlabel("seconds since the fill ended")
    fig.suptitle("active expiry under a write load: kvstore durability none / disk, redis-server reference "
                 f"({os.cpu_count()}-core shared VM)", fontsize=10)
    common.save_figure(fig, path)


# ---- options

def add_args(ap):
    ap.add_argument("--keys", type=int, default=1_000_000, help="keys written with a TTL in each pass")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                    help="kvstore --durability none / disk (with its data file), redis-server (reference)")
    ap.add_argument("--threads", type=int, default=2, help="kvstore poller threads")
    ap.add_argument("--load-keys", type=int, default=100_000, help="keys the steady load writes (no TTL)")
    ap.add_argument("--load-conns", type=int, default=50)
    ap.add_argument("--load-pipeline", type=int, default=1)
    ap.add_argument("--window", type=float, default=0.5, help="seconds per load window")
    ap.add_argument("--warm", type=float, default=3.0, help="seconds of load before the fill")
    ap.add_argument("--sample", type=float, default=0.1, help="seconds between INFO samples")
    ap.add_argument("--max-reclaim", type=float, default=60.0, help="stop waiting this long after the fill")
    ap.add_argument("--tail", type=float, default=8.0,
                    help="seconds of load after the reclaim (disk: longer than the data file's 5 s flush "
                         "interval, as a reclaimed key's memory goes once the flusher has written its deletion)")
    ap.add_argument("--max-pass", type=float, default=300.0, help="bound on a whole pass (the load stops)")


def check_args(args):
    if args.plot_only:
        return
    for tool in ("redis-cli", *(["redis-server"] if "redis" in args.modes else [])):
        if not shutil.which(tool):
            raise SystemExit(f"{NAME}: {tool} is not installed (make deps installs it)")
    if args.keys < 1000 or args.keys >= 10**12:
        raise SystemExit(f"{NAME}: --keys must be 1000..10^12, got {args.keys}")


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
