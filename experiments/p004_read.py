"""Paper 004, the read side of the message queue: consumer groups draining streams with
XREADGROUP ... COUNT k and XACK (`kvstore bench --consume`), kvstore and Redis 7 side by side.

Per point, on each server: --messages 85-byte messages are written to --streams streams
(pipelined XADD), a group is created on each, and --conns consumers (one per connection, each
on stream i mod streams) read batches of k with XREADGROUP GROUP g c<i> COUNT k STREAMS key >
and acknowledge each batch with XACK, sent with the next read, until the streams are drained.
Messages read per second and server CPU per message; rounds alternate the servers A B C D
within each k. Servers as p004_write: kvstore memory only and `disk` (each XREADGROUP and XACK
is a logged change: its reply waits for the fsync), Redis without persistence and with AOF
appendfsync always. Load generator and servers share this 2-core machine; kvstore runs one
poller (--kv-threads 1), as Redis runs one thread: a second poller only takes the load
generator's core (measured side by side: two do 0.86-1.01x the messages/s of one).

    kvstore experiment run p004_read          -> OUT/p004_read.{csv,png}
"""
import sys
import time

import redis

from kvstore.experiments import common
from kvstore.experiments.p004_write import MSG, curves, print_ratios, servers as make_servers

NAME = "p004_read"
QUICK = ["--rounds", "1", "--counts", "1", "100", "--messages", "20000", "--conns", "4", "--streams", "4"]
SERVERS = ["kvstore", "kvstore-disk", "redis", "redis-aof"]
COLORS = {"kvstore": "#1f77b4", "kvstore-disk": "#0b3d91", "redis": "#ff9896", "redis-aof": "#d62728"}


def preload(s, args):
    with redis.Redis(port=s.port) as c:
        c.flushall()
    r = common.kvbench.run(port=s.port, threads=1, conns=4, pipeline=64, value_size=MSG, keyspace=args.streams,
                           ratio="1:0", requests=args.messages, xadd=True)
    if r["errors"]:
        raise RuntimeError(f"{s.name}: preload: {r['first_error']}")
    with redis.Redis(port=s.port) as c:
        p = c.pipeline(transaction=False)
        for i in range(args.streams):
            p.xgroup_create(f"key:{i:012d}", "g", id="0", mkstream=True)
        p.execute()


def check_args(args):
    if args.conns < args.streams:
        raise SystemExit(f"{NAME}: --conns ({args.conns}) must be at least --streams ({args.streams}): consumer i "
                         "reads stream i mod streams, and every stream must be drained")


def measure(args):
    args.servers = [s for s in SERVERS if s in args.servers]
    srv = make_servers(args)
    sweep = common.Sweep(args.csv, ("round", "count", "server"), args.rounds * len(args.counts) * len(srv), args)
    try:
        for s in srv:
            s.start()
        for rnd in range(args.rounds):
            for k in args.counts:
                turn = srv[rnd % len(srv):] + srv[:rnd % len(srv)]
                for s in turn:
                    if sweep.has(round=rnd, count=k, server=s.name):
                        continue
                    preload(s, args)
                    cpu0, w0 = common.cpu_seconds(s.pid), time.monotonic()
                    r = common.kvbench.consume(port=s.port, threads=args.client_threads, conns=args.conns,
                                               streams=args.streams, count=k)
                    cpu, wall = common.cpu_seconds(s.pid) - cpu0, time.monotonic() - w0
                    if r["errors"] or r["messages"] != args.messages or r["acked"] != args.messages:
                        raise RuntimeError(f"{s.name} COUNT {k}: read {r['messages']}, acknowledged {r['acked']} of "
                                           f"{args.messages}; {r['errors']} errors, first: {r['first_error']}")
                    n = r["messages"]
                    row = {"round": rnd, "server": s.name, "count": k, "conns": args.conns, "streams": args.streams,
                           "messages": n, "message_bytes": MSG, "throughput": round(r["throughput"]),
                           "p50_us": round(r["lat_p50_us"], 1), "p99_us": round(r["lat_p99_us"], 1),
                           "wall_s": round(wall, 3), "server_cpu_s": round(cpu, 3),
                           "cpu_us_per_msg": round(cpu / n * 1e6, 3) if n else ""}
                    sweep.add(row, f"round {rnd} COUNT {k:<4} {s.name:13s} {row['throughput']:>10,} msg/s "
                                   f"p50 {row['p50_us']:8.0f} us  cpu {row['cpu_us_per_msg']} us/msg")
    finally:
        sweep.close()
        for s in srv:
            s.stop()
    return sweep.rows


def report(rows):
    for server, pts in curves(rows, "count").items():
        for k, t, lo, hi, cpu in pts:
            print(f"{server:13s} COUNT {k:<4} {t:>11,.0f} msg/s [{lo:,.0f}-{hi:,.0f}]  cpu {cpu:6.2f} us/msg")
    print_ratios(rows, (("kvstore", "redis"), ("kvstore-disk", "redis-aof")), "count", "COUNT ")


def draw(rows, path):
    plt = common.pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    for server, pts in curves(rows, "count").items():
        ks = [p[0] for p in pts]
        ax.errorbar(ks, [p[1] for p in pts], yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                    fmt="o-", color=COLORS.get(server), label=server, capsize=3)
        bx.plot(ks, [p[4] for p in pts], "o-", color=COLORS.get(server), label=server)
    for x, lab in ((ax, "messages read and acknowledged per second"), (bx, "server CPU us per message")):
        x.set_xscale("log")
        x.set_yscale("log")
        x.set_xlabel("COUNT k (entries per XREADGROUP)")
        x.set_ylabel(lab)
        x.grid(alpha=0.3, which="both")
        x.legend(fontsize=8)
    r0 = rows[0] if rows else {}
    fig.suptitle(f"Paper 004, consumers: XREADGROUP COUNT k + XACK, {r0.get('conns', '?')} consumers, "
                 f"{r0.get('messages', '?')} messages of {MSG} bytes over {r0.get('streams', '?')} streams per point, "
                 f"{len({r['round'] for r in rows})} rounds A B C D\n"
                 + common.cores_note(shares="servers, load generator"), fontsize=10)
    common.save_figure(fig, path)


def add_args(ap):
    common.add_sweep_args(ap)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 10, 100])
    ap.add_argument("--messages", type=int, default=200_000, help="messages written, then read, per point")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--conns", type=int, default=8, help="consumers (one connection each)")
    ap.add_argument("--client-threads", type=int, default=2)
    ap.add_argument("--kv-threads", type=int, default=1,
                    help="kvstore pollers (1, as Redis: the load generator needs the other core)")
    ap.add_argument("--servers", nargs="+", choices=SERVERS, default=SERVERS)


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
