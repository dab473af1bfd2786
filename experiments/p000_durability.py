"""What durability costs: kvstore none / disk / remote, with and without memory full,
vs Redis appendfsync always / everysec.

Same machine, same loads, servers alternated A B C ... per round, medians quoted:
SET, 85-byte values, 1 M keys, 50 connections, pipeline 16 (and 1), with
redis-benchmark and with kvstore bench. kvstore remote runs with its log peer,
a second kvstore process on loopback (the peer's CPU is counted too). The "-full"
servers have --max-memory well below the data (--full-memory, default 48mb for
~190 MB of keys) and their BOSC data file: every insert waits for the flusher to
have made room (paper 000's D); the others run without one (only their log, as the
paper's NHL and Redis's appendonly rows). Paper 000's rows: NH = none, NHD = none-full
(a spilling cache), NHL = remote, NHDL = remote-full. Claims to check: remote
logging keeps most of the in-memory speed (NHL/NH = 0.82 in the paper; NHD/NH
0.71, NHDL/NH 0.70); the issue's: disk with group commit >= 2x Redis appendfsync
always. Every server is warmed up first with one pass of the load, so the -full
ones start with memory full.

What the paper's setup isolates (the peer on its own machine) is measured two ways:
- CPU: the node's CPU per request (all its threads, from /proc) apart from its
  peer's, so remote vs none compares what logging costs the node itself (the issue's
  target: remote <= 1.25x none at P16);
- pinning (--pinning none pinned, kvstore bench only): in `pinned` loads every server
  (kvstore node, Redis) runs on the first half of the CPUs, and the peer and the load
  generator on the other half (on 2 cores: node on CPU 0, peer + load on CPU 1), so
  the peer takes no cycles from the node; `none` leaves everything to the scheduler.
Rounds alternate the servers A B C ... within each load; the plot shows medians with
the min-max of the rounds and marks the paper's ratios (times this run's NH) on the
NHD, NHL and NHDL bars (none-full, remote, remote-full). Pinned loads record the load
generator's CPU and how busy the peer's + generator's CPUs were (gen_cpus_saturated: over
90 %, the pinned load measures those CPUs, not the node).

    kvstore experiment run p000_durability      -> OUT/p000_durability.{csv,png}
"""
import os
import shutil
import statistics
import sys
import tempfile
import time

from kvstore import Node
from kvstore.experiments import common

NAME = "p000_durability"
QUICK = ["--rounds", "1", "--requests", "20000", "--keyspace", "50000", "--pipelines", "16",
         "--full-memory", "2mb"]
PAPER = {"kvstore-none-full": ("NHD/NH", 0.71), "kvstore-remote": ("NHL/NH", 0.82),
         "kvstore-remote-full": ("NHDL/NH", 0.70)}


def cpu_halves():
    """(the node's CPUs, the peer's and load generator's CPUs) for pinned loads, or None
    with fewer than 2 CPUs to split."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return set(cpus[:len(cpus) // 2]), set(cpus[len(cpus) // 2:])


ALL_CPUS = set(os.sched_getaffinity(0))


pin = common.pin_process  # every thread of a process onto a set of CPUs


def pinned_title(halves):
    if not halves:
        return "nothing pinned"
    node, rest = (",".join(map(str, sorted(c))) for c in halves)
    return (f"pinned loads: server on CPU {node}; log peer + load generator on CPU {rest}\n"
            "loopback TCP bills part of the receiver's softirq work to the sender's CPU: the node's CPU "
            "in remote includes some of its peer's receive path")


class KvServer:
    protocol = "resp"

    def __init__(self, mode, threads, full_memory=None):
        self.name = f"kvstore-{mode}" + ("-full" if full_memory else "")
        self.mode, self.threads, self.full_memory = mode, threads, full_memory
        self.dirs = [tempfile.mkdtemp(prefix=f"kv-{mode}-")]
        self.peer = None

    def start(self):
        # Without memory full there is no data file (on by default in disk and remote): the
        # paper's NL/NHL log only, as Redis's appendonly rows do; the -full rows are the
        # data file's (paper's NHD/NHDL)
        settings = {"durability": self.mode, "data_file": bool(self.full_memory)}
        if self.full_memory:
            settings.update(max_memory=self.full_memory)
        if self.mode == "remote":
            self.dirs.append(tempfile.mkdtemp(prefix="kv-peer-"))
            repl = common.free_port()
            self.peer = Node(port=0, threads=1, repl_port=repl, data_dir=self.dirs[1], durability="none",
                             repl_secret_file=common.repl_secret()).start()
            settings.update(peer=f"127.0.0.1:{repl}", repl_secret_file=common.repl_secret(),
                            init=True)  # a brand-new node (its peer is new too)
        self.node = Node(port=0, threads=self.threads, data_dir=self.dirs[0], **settings).start()
        self.port = self.node.port
        if self.mode == "remote":  # wait until the peer has acknowledged the (empty) log
            deadline = time.monotonic() + 10
            while self.node.stats().get("log_peer_degraded", 1) and time.monotonic() < deadline:
                time.sleep(0.05)
        return self

    def cpu(self):
        """(the node's CPU seconds, its peer's: 0 without one)."""
        return common.cpu_seconds(self.node.pid), (common.cpu_seconds(self.peer.pid) if self.peer else 0.0)

    def pin(self, node_cpus, other_cpus):
        pin(self.node.pid, node_cpus)
        if self.peer:
            pin(self.peer.pid, other_cpus)

    def stop(self):
        self.node.stop()
        if self.peer:
            self.peer.stop()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


class RedisServer:
    protocol = "resp"

    def __init__(self, fsync):
        self.name = f"redis-aof-{fsync}"
        self.proc = common.redis_server(common.free_port(), self.name, "--appendonly", "yes",
                                        "--appendfsync", fsync)
        self.port = self.proc.port

    def start(self):
        self.proc.start()
        return self

    def cpu(self):
        return common.cpu_seconds(self.proc.pid), 0.0

    def pin(self, node_cpus, other_cpus):
        pin(self.proc.pid, node_cpus)

    def stop(self):
        self.proc.stop()


def measure(args):
    servers = [KvServer(m, args.kv_threads, full) for m in ("none", "disk", "remote")
               for full in (None, args.full_memory)] + [RedisServer("always"), RedisServer("everysec")]
    if args.servers:
        servers = [s for s in servers if s.name in args.servers]
    rows = []
    try:
        for s in servers:
            s.start()
            common.log(f"warming up {s.name} ...")
            common.run_kvstore_bench(s.port, "resp", "SET", 16, args.conns, args.keyspace, args.keyspace,
                                     args.value_size, 2)
        halves = cpu_halves()
        if "pinned" in args.pinning and not halves:
            common.log("one CPU only: no pinned loads")
        loads = [(tool, p, "none") for tool in ("redis-benchmark", "kvstore-bench") for p in args.pipelines]
        loads += [("kvstore-bench", p, "pinned") for p in args.pipelines if "pinned" in args.pinning and halves]
        if "none" not in args.pinning:
            loads = [ld for ld in loads if ld[2] != "none"]
        total = args.rounds * len(loads) * len(servers)
        for rnd in range(args.rounds):
            for tool, p, pinning in loads:
                for s in servers:
                    rows.append(run_one(s, tool, p, pinning, halves, args, rnd))
                    common.write_csv(args.csv, rows)
                    r = rows[-1]
                    common.log(f"[{len(rows)}/{total}] {tool:15s} P{p:<2d} {pinning:6s} {s.name:19s} "
                               f"{r['throughput']:>11,} SET/s p99 {r['p99_us']:7.0f} us  node cpu "
                               f"{r['cpu_us_per_req']:.2f} us/req  peer {r['peer_cpu_us_per_req']:.2f}"
                               + (f"  load CPUs {r['gen_cpus_busy']:.0%} busy" if pinning == "pinned" else ""))
    finally:
        for s in servers:
            s.stop()
    return rows


def run_one(s, tool, p, pinning, halves, args, rnd):
    """One load on server s, pinned or not; the node's and the peer's CPU apart."""
    n = args.requests if p > 1 else args.requests // 8
    mine = os.sched_getaffinity(0)
    if pinning == "pinned":
        s.pin(*halves)
        os.sched_setaffinity(0, halves[1])  # the load generator's C threads inherit this thread's CPUs
    else:
        s.pin(ALL_CPUS, ALL_CPUS)
    # the load generator's CPU (this process: kvstore bench runs in it; redis-benchmark is a
    # waited child) and how busy the generator's CPUs were: pinned, the peer shares them
    gen_cpus = halves[1] if pinning == "pinned" else None
    try:
        gen0, busy0 = common.own_cpu_seconds(), common.cpu_jiffies(gen_cpus)
        (node0, peer0), w0 = s.cpu(), time.monotonic()
        if tool == "redis-benchmark":
            r = common.run_redis_benchmark(s.port, "SET", p, args.conns, n, args.keyspace, args.value_size)
        else:
            r = common.run_kvstore_bench(s.port, "resp", "SET", p, args.conns, n, args.keyspace,
                                         args.value_size, 2)
        node1, peer1 = s.cpu()
        gen, busy = common.own_cpu_seconds() - gen0, common.busy_share(busy0, common.cpu_jiffies(gen_cpus))
    finally:
        os.sched_setaffinity(0, mine)
    node, peer = node1 - node0, peer1 - peer0
    return {"round": rnd, "tool": tool, "server": s.name, "pipeline": p, "pinning": pinning, "requests": n,
            "throughput": round(r["throughput"]), "p50_us": round(r["p50_us"], 1), "p99_us": round(r["p99_us"], 1),
            "wall_s": round(time.monotonic() - w0, 3), "server_cpu_s": round(node + peer, 3),
            "node_cpu_s": round(node, 3), "peer_cpu_s": round(peer, 3), "cpu_us_per_req": round(node / n * 1e6, 2),
            "peer_cpu_us_per_req": round(peer / n * 1e6, 2), "loadgen_cpu_s": round(gen, 3),
            # pinned: the peer's + load generator's CPUs; not pinned: all CPUs. Over 90 % busy, the
            # pinned load is bound by those CPUs (peer and generator compete), not by the node
            "gen_cpus_busy": round(busy, 3), "gen_cpus_saturated": int(busy > 0.9)}


SERVERS = ["kvstore-none", "kvstore-none-full", "kvstore-disk", "kvstore-disk-full", "kvstore-remote",
           "kvstore-remote-full", "redis-aof-always", "redis-aof-everysec"]
MARK = "paper 000's ratio x NH"
COLORS = ["#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#084594", "#d62728", "#fc9272"]


def _rows(rows):
    """The CSV's rows with the columns older runs lacked: pinning 'none' (they pinned
    nothing); no node/peer CPU split (their server_cpu_s is the two together)."""
    return [{"pinning": "none", **r} for r in rows]


def spread(rows, field="throughput"):
    """{(tool, pipeline, pinning, server): (median, min, max)} of field over the rounds."""
    out = {}
    for r in _rows(rows):
        if r.get(field) in ("", None):
            continue
        out.setdefault((r["tool"], int(r["pipeline"]), r["pinning"], r["server"]), []).append(float(r[field]))
    return {k: (statistics.median(v), min(v), max(v)) for k, v in out.items()}


def medians(rows):
    return {k: v[0] for k, v in spread(rows).items()}


def ratio(rows, tool, p, pinning, a, b="kvstore-none", field="throughput"):
    """Median over rounds of a/b measured in the same round and load."""
    return common.paired(_rows(rows), "server", a, b, field, tool=tool, pipeline=p, pinning=pinning)


def report(rows):
    med, cpu, peer = spread(rows), spread(rows, "cpu_us_per_req"), spread(rows, "peer_cpu_us_per_req")
    for (tool, p, pinning, server), (v, lo, hi) in sorted(med.items()):
        line = f"{tool:15s} P{p:<2d} {pinning:6s} {server:19s} {v:>11,.0f} SET/s ({lo:,.0f}-{hi:,.0f})"
        if server in PAPER:
            x = ratio(rows, tool, p, pinning, server)
            if x is not None:
                line += f"   {PAPER[server][0]} {x:.2f} (paper {PAPER[server][1]:.2f})"
        if server == "kvstore-disk" and (tool, p, pinning, "redis-aof-always") in med:
            line += f"   disk/redis-always {v / med[(tool, p, pinning, 'redis-aof-always')][0]:.2f}x"
        c = cpu.get((tool, p, pinning, server))
        if c:
            line += f"   node CPU {c[0]:.2f} us/req"
            pc = peer.get((tool, p, pinning, server))
            if pc and pc[0]:
                line += f" + peer {pc[0]:.2f}"
        print(line)
    sat = [r for r in _rows(rows) if r["pinning"] == "pinned" and str(r.get("gen_cpus_saturated")) == "1"]
    if sat:
        print(f"warning: {len(sat)} pinned loads ran with the peer's + load generator's CPUs > 90 % busy: "
              "those loads are bound by that CPU, not by the node: " +
              ", ".join(sorted({f"{r['server']} P{r['pipeline']}" for r in sat})))
    for tool, p, pinning in sorted({k[:3] for k in cpu}):
        x = ratio(rows, tool, p, pinning, "kvstore-remote", field="cpu_us_per_req")
        if x is not None:
            print(f"{tool} P{p} {pinning}: node CPU per request, remote / none = {x:.2f}x (the issue's target <= 1.25x)")


def _bars(ax, groups, servers, values, paper=False):
    """common.bar_chart of the servers measured: values[(group..., server)] = (median, min,
    max), min-max as error bars (as a point's "rounds" the three give bar_chart's spread()
    the same median, min and max); paper: mark the paper's ratio times the group's
    kvstore-none median on its server's bar. Returns ({server: {group: x}}, bar width)."""
    servers = [s for s in servers if any((*g, s) in values for g in groups)]
    v = {(g, s): [values[(*g, s)][1], values[(*g, s)][0], values[(*g, s)][2]]
         for g in groups for s in servers if (*g, s) in values}
    xs = common.bar_chart(ax, groups, servers, v, colors={s: COLORS[SERVERS.index(s)] for s in servers})
    if paper:
        marks = [(xs[s][g], values[(*g, "kvstore-none")][0] * PAPER[s][1]) for s in servers if s in PAPER
                 for g in groups if g in xs[s] and (*g, "kvstore-none") in values]
        common.paper_marks(ax, [m[0] for m in marks], [m[1] for m in marks], label=MARK)
    return xs, 0.8 / max(1, len(servers))


def draw(rows, path):
    plt = common.pyplot()
    med = spread(rows)
    groups = sorted({k[:3] for k in med}, key=lambda g: (g[0], -g[1], g[2] != "none"))
    halves = cpu_halves()
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(13, 9), gridspec_kw={"height_ratios": [3, 2]})
    _bars(ax, groups, SERVERS, med, paper=True)
    sat = {(r["tool"], int(r["pipeline"]), r["pinning"]) for r in _rows(rows) if str(r.get("gen_cpus_saturated")) == "1"}
    ax.set_xticklabels([f"{t}\nSET P{p}\n{'pinned' if pin == 'pinned' else 'not pinned'}"
                        + ("\npeer+load CPU > 90 % busy" if pin == "pinned" and (t, p, pin) in sat else "")
                        for t, p, pin in groups], fontsize=8)
    ax.set_ylabel("acknowledged SET/s (median, min-max of rounds)")
    rounds = len({r["round"] for r in rows})
    ax.set_title("Durable writes: kvstore disk (group commit) / remote (peer memory), -full = memory full (BOSC "
                 f"flushing), vs Redis AOF — 85 B, 50 conns, {rounds} rounds, 2-core VM\n"
                 f"not pinned: servers, peer and load generator share both cores; {pinned_title(halves)}", fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    kv = [s for s in SERVERS if s.startswith("kvstore")]
    cpu, peer = spread(rows, "cpu_us_per_req"), spread(rows, "peer_cpu_us_per_req")
    cgroups = [g for g in groups if any((*g, s) in cpu for s in kv)]
    if cgroups:
        xs, w = _bars(bx, cgroups, kv, cpu)
        labelled = False
        for s, at in xs.items():  # the peer's CPU stacked on its node's bar, hatched
            for g, x in at.items():
                pc, nc = peer.get((*g, s)), cpu.get((*g, s))
                if pc and nc and pc[0]:
                    bx.bar(x, pc[0], w, bottom=nc[0], color="none", edgecolor="k", hatch="//", lw=0.5,
                           label=None if labelled else "the log peer's CPU")
                    labelled = True
        bx.set_xticklabels([f"{t} P{p} {'pinned' if pin == 'pinned' else 'not pinned'}" for t, p, pin in cgroups],
                           fontsize=8)
        bx.set_ylabel("CPU us per request (median, min-max)")
        bx.set_title("The node's CPU per request (all its threads); hatched on top: its log peer's", fontsize=9)
        bx.legend(fontsize=7, ncol=4)
    else:
        bx.set_axis_off()
        bx.text(0.5, 0.5, "no node/peer CPU split in this CSV (an older run)", ha="center", transform=bx.transAxes)
    common.save_figure(fig, path)


def add_args(ap):
    ap.add_argument("--rounds", type=int, default=3)  # the scale of the committed results
    ap.add_argument("--requests", type=int, default=1_000_000, help="per P16 run (P1 runs: an eighth)")
    ap.add_argument("--keyspace", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=85)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--pipelines", type=int, nargs="+", default=[16, 1])
    ap.add_argument("--kv-threads", type=int, default=2)
    ap.add_argument("--full-memory", default="48mb", help="--max-memory of the -full servers")
    ap.add_argument("--servers", nargs="+", help="only these (e.g. kvstore-disk redis-aof-always)")
    ap.add_argument("--pinning", nargs="+", choices=("none", "pinned"), default=["none", "pinned"],
                    help="none: the scheduler places everything; pinned (kvstore bench loads only): each server on "
                         "the first half of the CPUs, the log peer and the load generator on the other half")


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
