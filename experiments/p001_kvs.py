"""Paper 001, Fig. 6: the key-value stores alone with 4 KiB values (the block size the block
device stores), GET and SET throughput against p50 / p99 latency, kvstore vs Redis vs
memcached (the paper's backend), and the server's CPU per request.

Open-loop rate sweep with `kvstore bench --rate` (memcached through its text protocol,
--protocol memcache): each point offers a fixed request rate for --duration seconds and
measures latency from each request's scheduled send time (no coordinated omission), so
past a server's capacity the achieved throughput flattens and latency climbs: the knee of
each curve is the server's capacity. A last closed-loop point per server ("max", rate 0)
gives its saturated throughput. Every server is preloaded first (--preload random SETs of
4 KiB values over --keyspace keys, so GETs hit; the hit ratio is in the CSV). Rounds
alternate the servers A B C within each (rate, op) point, so drift on this shared machine
hits all alike; the plot shows medians over rounds.

kvstore runs memory only (durability none, --kv-threads pollers), as Redis (persistence
off) and memcached (-t --memcached-threads) beside it: what is compared is the serving
path a block device's 4 KiB requests take. Load generator and servers share this 2-core
machine (the paper ran 20-core servers and clients apart on 40 GbE): read ratios, not
absolute rates. Server CPU per request comes from /proc (all the server's threads).

Paper (memcached, 40 GbE, 20 cores): GET 1.2 M qps, SET 400 K qps (network bound).

    kvstore experiment run p001_kvs            -> OUT/p001_kvs.{csv,png}
"""
import statistics
import sys
import time

from kvstore.experiments import common
from kvstore.experiments.kv_peer_compare import KvNode

NAME = "p001_kvs"
QUICK = ["--rounds", "1", "--rates", "5000", "20000", "--duration", "0.5", "--keyspace", "2000",
         "--preload", "6000"]
PAPER = {"GET": 1_200_000, "SET": 400_000}  # memcached, requests/s (40 GbE bound)
SERVERS = ["kvstore", "redis", "memcached"]
COLORS = {"kvstore": "#1f77b4", "redis": "#d62728", "memcached": "#2ca02c"}


def kvstore_node(threads):
    """A kvstore node, memory only (durability none) as Redis and memcached beside it."""
    s = KvNode(threads)
    s.name = "kvstore"
    return s


def servers(args):
    out = {"kvstore": lambda: kvstore_node(args.kv_threads),
           "redis": lambda: common.redis_server(common.free_port()),
           "memcached": lambda: common.memcached(common.free_port(), args.memcached_threads)}
    return [out[s]() for s in SERVERS if s in args.servers]


def bench(s, op, rate, args):
    """One point: op at rate requests/s (0: closed loop) for args.duration seconds on server s.
    The request count is bounded too: the offered rate's worth, or --max-requests closed loop."""
    n = int(rate * args.duration) if rate else args.max_requests
    r = common.kvbench.run(port=s.port, protocol=s.protocol, threads=args.client_threads, conns=args.conns,
                           pipeline=args.pipeline, value_size=args.value_size, keyspace=args.keyspace,
                           ratio="1:0" if op == "SET" else "0:1", requests=n, duration=args.duration, rate=rate)
    if r["errors"]:
        raise RuntimeError(f"{s.name} {op} at {rate}/s: {r['errors']} errors, first: {r['first_error']}")
    return r


def measure(args):
    srv = servers(args)
    points = [(rate, op) for rate in sorted(args.rates) + [0] for op in args.ops]
    sweep = common.Sweep(args.csv, ("round", "rate", "op", "server"), args.rounds * len(points) * len(srv), args)
    try:
        for s in srv:
            s.start()
            common.log(f"preloading {s.name}: {args.preload:,} random SETs of {args.value_size} B over "
                       f"{args.keyspace:,} keys")
            common.run_kvstore_bench(s.port, s.protocol, "SET", 8, args.conns, args.preload, args.keyspace,
                                     args.value_size, args.client_threads)
        for rnd in range(args.rounds):
            for rate, op in points:
                for s in srv:
                    if sweep.has(round=rnd, rate=rate, op=op, server=s.name):
                        continue
                    cpu0, w0 = common.cpu_seconds(s.pid), time.monotonic()
                    r = bench(s, op, rate, args)
                    cpu, wall = common.cpu_seconds(s.pid) - cpu0, time.monotonic() - w0
                    row = {"round": rnd, "server": s.name, "op": op, "rate": rate,
                           "offered": rate or "max", "value_size": args.value_size, "conns": args.conns,
                           "pipeline": args.pipeline, "duration_s": args.duration, "requests": r["requests"],
                           "throughput": round(r["throughput"]), "p50_us": round(r["lat_p50_us"], 1),
                           "p99_us": round(r["lat_p99_us"], 1), "p999_us": round(r["lat_p999_us"], 1),
                           "hit_ratio": round(r["hits"] / r["gets"], 4) if r["gets"] else "",
                           "wall_s": round(wall, 3), "server_cpu_s": round(cpu, 3),
                           "cpu_us_per_req": round(cpu / r["requests"] * 1e6, 2) if r["requests"] else ""}
                    sweep.add(row, f"round {rnd} {s.name:9s} {op} offered {rate or 'max':>7} -> "
                                   f"{row['throughput']:>9,} req/s  p50 {row['p50_us']:8.0f} us  "
                                   f"p99 {row['p99_us']:8.0f} us  cpu {row['cpu_us_per_req']} us/req")
    finally:
        sweep.close()
        for s in srv:
            s.stop()
    return sweep.rows


def curves(rows):
    """{(server, op): [(rate, median throughput, p50, p99, cpu us/req)] by offered rate, the
    closed-loop point (rate 0) last}."""
    pts = {}
    for r in rows:
        pts.setdefault((r["server"], r["op"], int(r["rate"])), []).append(r)
    out = {}
    for (server, op, rate), rs in pts.items():
        med = [statistics.median(float(r[f]) for r in rs if r[f] not in ("", None))
               for f in ("throughput", "p50_us", "p99_us", "cpu_us_per_req")]
        out.setdefault((server, op), []).append((rate, *med))
    for v in out.values():
        v.sort(key=lambda p: (p[0] == 0, p[0]))
    return out


def capacity(rows, server, op):
    """The server's saturated throughput: the median of its closed-loop points, or None."""
    v = [float(r["throughput"]) for r in rows if r["server"] == server and r["op"] == op and int(r["rate"]) == 0]
    return statistics.median(v) if v else None


def report(rows):
    c = curves(rows)
    for (server, op), pts in sorted(c.items()):
        for rate, tput, p50, p99, cpu in pts:
            print(f"{op} {server:9s} offered {rate or 'max':>8}  {tput:>10,.0f} req/s  p50 {p50:8.0f} us  "
                  f"p99 {p99:8.0f} us  cpu {cpu:6.2f} us/req")
    for op in sorted({k[1] for k in c}):
        caps = {s: capacity(rows, s, op) for s in SERVERS}
        line = f"{op} closed-loop max: " + ", ".join(f"{s} {v:,.0f}/s" for s, v in caps.items() if v)
        for other in ("redis", "memcached"):
            x = common.paired(rows, "server", "kvstore", other, op=op, rate="0")
            if x is not None:
                line += f"; kvstore/{other} {x:.2f}x"
        print(line + f"   (paper, memcached on 40 GbE: {PAPER[op]:,}/s)")


def draw(rows, path):
    plt = common.pyplot()
    c = curves(rows)
    ops = [op for op in ("GET", "SET") if any(k[1] == op for k in c)]
    fig, axes = plt.subplots(2, max(1, len(ops)), figsize=(7 * max(1, len(ops)), 9), squeeze=False)
    for i, op in enumerate(ops):
        ax, bx = axes[0][i], axes[1][i]
        for s in SERVERS:
            pts = [p for p in c.get((s, op), []) if p[0]]  # open-loop points make the curve
            if pts:
                x = [p[1] for p in pts]
                ax.plot(x, [p[3] for p in pts], "o-", color=COLORS[s], label=f"{s} p99")
                ax.plot(x, [p[2] for p in pts], "s--", color=COLORS[s], alpha=0.7, label=f"{s} p50")
                bx.plot(x, [p[4] for p in pts], "o-", color=COLORS[s], label=s)
            closed = [p for p in c.get((s, op), []) if not p[0]]
            if closed:
                bx.plot([closed[0][1]], [closed[0][4]], "*", ms=12, color=COLORS[s], label=f"{s} closed loop")
            cap = capacity(rows, s, op)
            if cap:
                ax.axvline(cap, color=COLORS[s], ls=":", lw=1, label=f"{s} closed-loop max {cap:,.0f}/s")
        ax.set_yscale("log")
        ax.set_xlabel("achieved requests/s (median of rounds)")
        ax.set_ylabel("latency (us, log), from the scheduled send time")
        ax.set_title(f"{op} 4 KiB: latency vs throughput (open-loop sweep)\n"
                     f"paper: memcached {op} {PAPER[op] / 1e6:g} M/s on 40 GbE, 20 cores", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
        bx.set_xlabel("achieved requests/s")
        bx.set_ylabel("server CPU us per request (all its threads)")
        bx.set_title(f"{op}: server CPU per request", fontsize=9)
        bx.grid(alpha=0.3)
        bx.legend(fontsize=7)
    r0 = rows[0] if rows else {}
    fig.suptitle(f"Paper 001 Fig. 6: the KVS alone, 4 KiB values — {r0.get('conns', '?')} conns x "
                 f"{r0.get('pipeline', '?')} in flight, {r0.get('duration_s', '?')} s per point, "
                 f"{len({r['round'] for r in rows})} rounds A B C\n"
                 + common.cores_note(shares="servers, load generator"),
                 fontsize=10)
    common.save_figure(fig, path)


def add_args(ap):
    common.add_sweep_args(ap)
    ap.add_argument("--rounds", type=int, default=3, help="A B C rounds per point")
    ap.add_argument("--rates", type=int, nargs="+",
                    default=[10000, 25000, 50000, 100000, 200000, 300000, 400000, 500000, 700000],
                    help="offered requests/s of the open-loop points (a closed-loop 'max' point follows)")
    ap.add_argument("--ops", nargs="+", choices=("GET", "SET"), default=["GET", "SET"])
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per point")
    ap.add_argument("--max-requests", type=int, default=3_000_000, help="bound of a closed-loop point's requests")
    ap.add_argument("--value-size", type=int, default=4096)
    ap.add_argument("--keyspace", type=int, default=100_000, help="keys (x value size: the data each server holds)")
    ap.add_argument("--preload", type=int, default=300_000,
                    help="random SETs before measuring (3x keyspace: ~95 % of the keys exist)")
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--pipeline", type=int, default=8, help="requests in flight per connection, at most")
    ap.add_argument("--client-threads", type=int, default=2)
    ap.add_argument("--kv-threads", type=int, default=2, help="kvstore pollers")
    ap.add_argument("--memcached-threads", type=int, default=2)
    ap.add_argument("--servers", nargs="+", choices=SERVERS, default=SERVERS)


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
