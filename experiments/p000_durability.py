"""What durability costs: kvstore none / disk / remote, with and without memory full,
vs Redis appendfsync always / everysec.

Same machine, same loads, servers alternated A B C ... per round, medians quoted:
SET, 85-byte values, 1 M keys, 50 connections, pipeline 16 (and 1), with
redis-benchmark and with kvstore bench. kvstore remote runs with its log peer,
a second kvstore process on loopback (the peer's CPU is counted too). The "-full"
servers have --max-memory well below the data (--full-memory, default 48mb for
~190 MB of keys) and their BOSC data file: every insert waits for the flusher to
have made room (paper 000's D). Paper 000's rows: NH = none, NHD = none-full
(a spilling cache), NHL = remote, NHDL = remote-full. Claims to check: remote
logging keeps most of the in-memory speed (NHL/NH = 0.82 in the paper; NHD/NH
0.71, NHDL/NH 0.70); the issue's: disk with group commit >= 2x Redis appendfsync
always. Every server is warmed up first with one pass of the load, so the -full
ones start with memory full.

    kvstore experiment run p000_durability      -> OUT/p000_durability.{csv,png}
"""
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


class KvServer:
    protocol = "resp"

    def __init__(self, mode, threads, full_memory=None):
        self.name = f"kvstore-{mode}" + ("-full" if full_memory else "")
        self.mode, self.threads, self.full_memory = mode, threads, full_memory
        self.dirs = [tempfile.mkdtemp(prefix=f"kv-{mode}-")]
        self.peer = None

    def start(self):
        settings = {"durability": self.mode}
        if self.full_memory:
            settings.update(data_file=True, max_memory=self.full_memory)
        if self.mode == "remote":
            self.dirs.append(tempfile.mkdtemp(prefix="kv-peer-"))
            repl = common.free_port()
            self.peer = Node(port=0, threads=1, repl_port=repl, data_dir=self.dirs[1], durability="none").start()
            settings.update(peer=f"127.0.0.1:{repl}", init=True)  # a brand-new node (its peer is new too)
        self.node = Node(port=0, threads=self.threads, data_dir=self.dirs[0], **settings).start()
        self.port = self.node.port
        if self.mode == "remote":  # wait until the peer has acknowledged the (empty) log
            deadline = time.monotonic() + 10
            while self.node.stats().get("log_peer_degraded", 1) and time.monotonic() < deadline:
                time.sleep(0.05)
        return self

    def cpu(self):
        return common.cpu_seconds(self.node.pid) + (common.cpu_seconds(self.peer.pid) if self.peer else 0)

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
        return common.cpu_seconds(self.proc.pid)

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
        loads = [(tool, p) for tool in ("redis-benchmark", "kvstore-bench") for p in args.pipelines]
        total = args.rounds * len(loads) * len(servers)
        for rnd in range(args.rounds):
            for tool, p in loads:
                for s in servers:
                    n = args.requests if p > 1 else args.requests // 8
                    cpu0, w0 = s.cpu(), time.monotonic()
                    if tool == "redis-benchmark":
                        r = common.run_redis_benchmark(s.port, "SET", p, args.conns, n, args.keyspace, args.value_size)
                    else:
                        r = common.run_kvstore_bench(s.port, "resp", "SET", p, args.conns, n, args.keyspace,
                                                     args.value_size, 2)
                    cpu = s.cpu() - cpu0
                    rows.append({"round": rnd, "tool": tool, "server": s.name, "pipeline": p, "requests": n,
                                 "throughput": round(r["throughput"]), "p50_us": round(r["p50_us"], 1),
                                 "p99_us": round(r["p99_us"], 1), "wall_s": round(time.monotonic() - w0, 3),
                                 "server_cpu_s": round(cpu, 3)})
                    common.write_csv(args.csv, rows)
                    common.log(f"[{len(rows)}/{total}] {tool:15s} P{p:<2d} {s.name:19s} {r['throughput']:>11,.0f} "
                               f"SET/s p99 {r['p99_us']:7.0f} us  cpu {cpu:.2f} s")
    finally:
        for s in servers:
            s.stop()
    return rows


def medians(rows):
    out = {}
    for r in rows:
        out.setdefault((r["tool"], int(r["pipeline"]), r["server"]), []).append(float(r["throughput"]))
    return {k: statistics.median(v) for k, v in out.items()}


def report(rows):
    med = medians(rows)
    for (tool, p, server), v in sorted(med.items()):
        line = f"{tool:15s} P{p:<2d} {server:19s} {v:>11,.0f} SET/s"
        base = med.get((tool, p, "kvstore-none"))
        paper = {"kvstore-none-full": ("NHD/NH", 0.71), "kvstore-remote": ("NHL/NH", 0.82),
                 "kvstore-remote-full": ("NHDL/NH", 0.70)}
        if server in paper and base:
            line += f"   {paper[server][0]} {v / base:.2f} (paper {paper[server][1]:.2f})"
        if server == "kvstore-disk":
            line += f"   disk/redis-always {v / med[(tool, p, 'redis-aof-always')]:.2f}x"
        print(line)


def draw(rows, path):
    plt = common.pyplot()
    med = medians(rows)
    groups = sorted({(k[0], k[1]) for k in med})
    servers = ["kvstore-none", "kvstore-none-full", "kvstore-disk", "kvstore-disk-full", "kvstore-remote",
               "kvstore-remote-full", "redis-aof-always", "redis-aof-everysec"]
    colors = ["#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#084594", "#d62728", "#fc9272"]
    fig, ax = plt.subplots(figsize=(11, 5))
    w = 0.8 / len(servers)
    for si, (s, c) in enumerate(zip(servers, colors)):
        ax.bar([gi + si * w for gi in range(len(groups))], [med.get((g[0], g[1], s), 0) for g in groups], w,
               label=s, color=c)
    ax.set_xticks([gi + 0.4 - w / 2 for gi in range(len(groups))])
    ax.set_xticklabels([f"{t}\nSET P{p}" for t, p in groups])
    ax.set_ylabel("acknowledged SET/s (median)")
    ax.set_title("Durable writes: kvstore disk (group commit) / remote (peer memory), -full = memory full "
                 "(BOSC flushing), vs Redis AOF — 85 B, 50 conns, 2-core VM", fontsize=9)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    common.save_figure(fig, path)


def add_args(ap):
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=1_000_000, help="per P16 run (P1 runs: an eighth)")
    ap.add_argument("--keyspace", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=85)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--pipelines", type=int, nargs="+", default=[16, 1])
    ap.add_argument("--kv-threads", type=int, default=2)
    ap.add_argument("--full-memory", default="48mb", help="--max-memory of the -full servers")
    ap.add_argument("--servers", nargs="+", help="only these (e.g. kvstore-disk redis-aof-always)")


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
