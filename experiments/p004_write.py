"""Paper 004, write throughput against the batch size: 85-byte messages appended to streams
(XADD KEY * v VALUE, a stream per key) in batches of k messages per connection and round
trip (`kvstore bench --xadd -P k`), k = 1, 2, 4, ... 64, kvstore and Redis 7 side by side.

The paper (MultiMQC) packs small messages into batches and claims write throughput grows in
proportion to the batch size. Over RESP a batch is k pipelined XADDs: the server reads them
with one read, appends them to the stream's open batch (core/stream.h) and, in disk mode, makes
them durable with one group commit of the log, so the per-message cost of the round trip,
the system calls and the fsync is shared by k. Measured closed loop, --conns connections, each
with k XADDs in flight, for --duration seconds per point; rounds alternate the servers
A B C D within each k, so drift on this shared machine hits all alike; medians over rounds.
Each point starts from empty streams (FLUSHALL before it), so what it measures does not depend
on what earlier points left (a kvstore already holding 1.3 GB appended at 0.7x the rate, a
fifth of its CPU in the kernel zeroing the pages it newly touched).

Servers: kvstore memory only (durability none) and kvstore durable (durability disk: every
XADD's reply waits for its fsync), the same two over kvstore's UDP front end (kvstore-udp,
kvstore-udp-disk: --arch udp, `kvstore bench --udp --xadd --batch k`, each of --conns sockets
with one datagram of k messages in flight, appended as one change with one log record),
Redis with persistence off and Redis with AOF and appendfsync always (its durable setting),
and Mosquitto (the broker an IoT user would otherwise pick; persistence off, its default) with
MQTT publishers (`kvstore.bench.mqtt`) keeping k PUBLISHes in flight per client: QoS 0 (rounds
closed by a PINGREQ) and QoS 1 (each counted at its PUBACK, which Mosquitto sends from
memory). Load generator and servers share this 2-core machine: read ratios and the shape of
each curve, not absolute rates. kvstore runs one poller (--kv-threads 1), as Redis runs one
thread: with two, the pollers and the load generator's two threads contend for the two cores
and kvstore does 0.83x the messages/s at 1.5x the CPU per message (XADD at P16, side by side).
Server CPU per message comes from /proc (all the server's threads).

    kvstore experiment run p004_write          -> OUT/p004_write.{csv,png}
"""
import statistics
import sys
import time

import redis

from kvstore.experiments import common
from kvstore.experiments.kv_peer_compare import KvNode

NAME = "p004_write"
QUICK = ["--rounds", "1", "--batches", "1", "8", "--duration", "0.5", "--conns", "4"]
SERVERS = ["kvstore", "kvstore-disk", "kvstore-udp", "kvstore-udp-disk", "redis", "redis-aof", "mosquitto-qos0",
           "mosquitto-qos1"]
COLORS = {"kvstore": "#1f77b4", "kvstore-disk": "#0b3d91", "kvstore-udp": "#2ca02c", "kvstore-udp-disk": "#145214",
          "redis": "#ff9896", "redis-aof": "#d62728", "mosquitto-qos0": "#c5b0d5", "mosquitto-qos1": "#9467bd"}
MSG = 85  # bytes of a message: IoT's small writes


class UdpNode(KvNode):
    """kvstore's UDP front end (--arch udp, one worker; one TCP poller for control): a batch
    of k messages is one datagram (udpfront.h's KVU_F_XADD), appended as one change."""

    def __init__(self, durability, name):
        super().__init__(1, durability, name)
        self.node.settings.update(arch="udp", udp_port=0, udp_workers=1)

    def start(self):
        super().start()
        self.udp_port = self.node.udp_port
        return self


def servers(args):
    make = {"kvstore": lambda: KvNode(args.kv_threads, "none", "kvstore"),
            "kvstore-disk": lambda: KvNode(args.kv_threads, "disk", "kvstore-disk"),
            "kvstore-udp": lambda: UdpNode("none", "kvstore-udp"),
            "kvstore-udp-disk": lambda: UdpNode("disk", "kvstore-udp-disk"),
            "redis": lambda: common.redis_server(common.free_port()),
            "redis-aof": lambda: common.redis_server(common.free_port(), "redis-aof", "--appendonly", "yes",
                                                     "--appendfsync", "always"),
            "mosquitto-qos0": lambda: common.mosquitto(common.free_port(), "mosquitto-qos0"),
            "mosquitto-qos1": lambda: common.mosquitto(common.free_port(), "mosquitto-qos1")}
    return [make[s]() for s in SERVERS if s in args.servers]


def measure(args):
    srv = servers(args)
    sweep = common.Sweep(args.csv, ("round", "batch", "server"), args.rounds * len(args.batches) * len(srv), args)
    try:
        for s in srv:
            s.start()
        for rnd in range(args.rounds):
            for k in args.batches:
                for s in srv:
                    if sweep.has(round=rnd, batch=k, server=s.name):
                        continue
                    udp = isinstance(s, UdpNode)
                    if not s.name.startswith("mosquitto"):  # each point starts from empty streams
                        with redis.Redis(port=s.port) as c:
                            c.flushall()
                    cpu0, w0 = common.cpu_seconds(s.pid), time.monotonic()
                    if s.name.startswith("mosquitto"):  # k PUBLISHes in flight per client
                        r = common.kvbench.mqtt(port=s.port, threads=args.client_threads, conns=args.conns,
                                                qos=int(s.name[-1]), window=k, msg_size=MSG, topics=args.streams,
                                                duration=args.duration, messages=args.max_requests)
                        r.update(errors=0, requests=r["messages"])
                    else:  # UDP: each socket one datagram of k messages in flight; RESP: k XADDs per connection
                        r = common.kvbench.run(port=s.udp_port if udp else s.port, threads=args.client_threads,
                                               conns=args.conns, pipeline=1 if udp else k, value_size=MSG,
                                               keyspace=args.streams, ratio="1:0", requests=args.max_requests,
                                               duration=args.duration, xadd=True, udp=udp, batch=k if udp else 1)
                    cpu, wall = common.cpu_seconds(s.pid) - cpu0, time.monotonic() - w0
                    if r["errors"]:
                        raise RuntimeError(f"{s.name} k={k}: {r['errors']} errors, first: {r['first_error']}")
                    msgs = r["sets"] if udp else r["requests"]  # UDP: requests are datagrams
                    tput = msgs / r["elapsed"] if r["elapsed"] else 0.0
                    row = {"round": rnd, "server": s.name, "batch": k, "conns": args.conns, "streams": args.streams,
                           "message_bytes": MSG, "duration_s": args.duration, "messages": msgs,
                           "timeouts": r.get("timeouts", 0),
                           "throughput": round(tput), "mb_s": round(tput * MSG / 1e6, 2),
                           "p50_us": round(r["lat_p50_us"], 1), "p99_us": round(r["lat_p99_us"], 1),
                           "wall_s": round(wall, 3), "server_cpu_s": round(cpu, 3),
                           "cpu_us_per_msg": round(cpu / msgs * 1e6, 3) if msgs else ""}
                    sweep.add(row, f"round {rnd} k={k:<3} {s.name:13s} {row['throughput']:>10,} msg/s "
                                   f"{row['mb_s']:7.1f} MB/s  p50 {row['p50_us']:8.0f} us  "
                                   f"cpu {row['cpu_us_per_msg']} us/msg")
    finally:
        sweep.close()
        for s in srv:
            s.stop()
    return sweep.rows


def curves(rows, x="batch"):
    """{server: [(x, median msg/s, min, max, median cpu us/msg)] by the column x}."""
    pts = {}
    for r in rows:
        pts.setdefault((r["server"], int(r[x])), []).append(r)
    out = {}
    for (server, k), rs in sorted(pts.items()):
        t = [float(r["throughput"]) for r in rs]
        cpu = statistics.median(float(r["cpu_us_per_msg"]) for r in rs if r["cpu_us_per_msg"] not in ("", None))
        out.setdefault(server, []).append((k, statistics.median(t), min(t), max(t), cpu))
    return out


def print_ratios(rows, pairs, x="batch", label="k="):
    """Per value of column x, each pair's paired ratio over rounds (a/b msg/s)."""
    for k in sorted({int(r[x]) for r in rows}):
        line = f"{label}{k}:"
        for a, b in pairs:
            v = common.paired(rows, "server", a, b, **{x: str(k)})
            if v is not None:
                line += f"  {a}/{b} {v:.2f}x"
        print(line)


def report(rows):
    for server, pts in curves(rows).items():
        base = pts[0][1] / pts[0][0]  # msg/s per unit of batch at the smallest k
        for k, t, lo, hi, cpu in pts:
            print(f"{server:16s} k={k:<3} {t:>11,.0f} msg/s [{lo:,.0f}-{hi:,.0f}]  {t * MSG / 1e6:7.1f} MB/s  "
                  f"{t / (base * k):5.2f} of proportional  cpu {cpu:6.2f} us/msg")
    c = curves(rows)
    for server in ("kvstore-udp", "kvstore-udp-disk"):
        at = {k: t for k, t, *_ in c.get(server, [])}
        if 1 in at and 16 in at and at[1]:
            x = at[16] / at[1]
            print(f"target {server}: k=16 >= 8x k=1 in messages/s: {x:.1f}x -> {'met' if x >= 8 else 'NOT met'}")
    print_ratios(rows, (("kvstore", "redis"), ("kvstore-disk", "redis-aof"), ("kvstore-udp", "kvstore"),
                        ("kvstore-udp-disk", "kvstore-disk"), ("kvstore", "mosquitto-qos0"),
                        ("kvstore-disk", "mosquitto-qos1")))


def draw(rows, path):
    plt = common.pyplot()
    c = curves(rows)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5.5))
    for server, pts in c.items():
        ks = [p[0] for p in pts]
        ax.errorbar(ks, [p[1] for p in pts], yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                    fmt="o-", color=COLORS.get(server), label=server, capsize=3)
        base = pts[0][1] / pts[0][0]
        ax.plot(ks, [base * k for k in ks], ":", color=COLORS.get(server), alpha=0.6)
        bx.plot(ks, [p[4] for p in pts], "o-", color=COLORS.get(server), label=server)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size k (per connection in flight: pipelined XADDs, messages of one UDP datagram, "
                  "or MQTT PUBLISHes)", fontsize=8)
    ax.set_ylabel("messages/s (median of rounds, min-max)")
    ax.set_title("write throughput vs batch size; dotted: proportional to k from k=1\n"
                 "(the paper's claim: throughput grows in proportion to the batch size)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    bx.set_xscale("log", base=2)
    bx.set_yscale("log")
    bx.set_xlabel("batch size k")
    bx.set_ylabel("server CPU us per message (all its threads)")
    bx.set_title("what a message costs the server", fontsize=9)
    bx.grid(alpha=0.3, which="both")
    bx.legend(fontsize=8)
    r0 = rows[0] if rows else {}
    fig.suptitle(f"Paper 004: {MSG}-byte messages to streams (XADD over RESP, batches over UDP) and to Mosquitto "
                 f"(MQTT), {r0.get('conns', '?')} connections x k in "
                 f"flight, {r0.get('streams', '?')} streams, {r0.get('duration_s', '?')} s per point, "
                 f"{len({r['round'] for r in rows})} rounds A B C D\n"
                 + common.cores_note(shares="servers, load generator"), fontsize=10)
    common.save_figure(fig, path)


def add_args(ap):
    common.add_sweep_args(ap)
    ap.add_argument("--rounds", type=int, default=3, help="A B C D rounds per batch size")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64],
                    help="batch sizes k: XADDs in flight per connection")
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per point")
    ap.add_argument("--max-requests", type=int, default=20_000_000, help="bound of a point's messages")
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--streams", type=int, default=64, help="streams (keys) the messages go to")
    ap.add_argument("--client-threads", type=int, default=2)
    ap.add_argument("--kv-threads", type=int, default=1,
                    help="kvstore pollers (1, as Redis: the load generator needs the other core)")
    ap.add_argument("--servers", nargs="+", choices=SERVERS, default=SERVERS)


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
