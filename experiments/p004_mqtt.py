"""Paper 004, MQTT: kvstore's MQTT 3.1.1 front end (--mqtt-port: topics are streams, served on
the pollers) against Debian's Mosquitto, the broker an IoT user would otherwise pick, side by
side in one run. 85-byte messages, --conns publishers each keeping --window PUBLISHes in
flight to --topics topics t/<i mod topics>, and --subscribers clients subscribed to t/#, each
receiving every message (`kvstore.bench.mqtt`, ext/bench/mqttgen.h). Loads:

  qos0  publishers QoS 0 (rounds of --window PUBLISHes closed by a PINGREQ: the PINGRESP
        acknowledges them), subscribers QoS 0: kvstore memory only (durability none),
        kvstore-disk (durability disk) and Mosquitto (persistence off, its default);
  qos1  publishers QoS 1, subscribers QoS 1: kvstore-disk, whose PUBACK leaves after the log's
        fdatasync group commit, against Mosquitto, which acknowledges from memory.

Per point: published msg/s (acknowledged by PUBACK or PINGRESP), delivered msg/s (what the
subscribers received, over the time to the last delivery), publish-to-ack p50/p99 (QoS 0: the
round's PINGREQ round trip), publish-to-delivery p50/p99/p99.9, wall seconds, the server's CPU
seconds (all its threads, from /proc) and CPU us per delivered message, and `lost` =
published x subscribers - delivered (at least 0): what the broker dropped. Mosquitto drops
QoS 1 messages past max_queued_messages (1000) per subscriber that is behind; kvstore slows
QoS 1/2 publishers instead (withholds their PUBACKs while a subscriber's queue is past
--mqtt-max-queued, also 1000) and drops only QoS 0 messages past it.
Each kvstore point starts from empty streams (FLUSHALL over RESP before it). Rounds alternate
the servers A B C within each load (and subscriber count), so drift on this shared machine
hits all alike; medians over rounds, min-max in the plot, ratios paired by round.

Cores: the servers and the load generator (--client-threads 2) share this 2-core machine,
and kvstore runs --kv-threads 1 poller, as Mosquitto runs one thread (with two, the pollers and
the load generator's threads contend for the cores: at QoS 0 with one subscriber the same
messages/s at 1.2x the CPU per message and 2x the p99 delivery latency): read ratios, not
absolute rates. Targets (the issue): QoS 0 kvstore delivered msg/s >= 3x Mosquitto's; QoS 1
kvstore-disk delivered msg/s >= 5x Mosquitto's QoS 1.

    kvstore experiment run p004_mqtt          -> OUT/p004_mqtt.{csv,png}
"""
import statistics
import sys
import time

import redis

from kvstore.experiments import common
from kvstore.experiments.kv_peer_compare import KvNode

NAME = "p004_mqtt"
QUICK = ["--rounds", "1", "--duration", "0.5", "--conns", "4", "--topics", "16", "--subscribers", "1"]
LOADS = {"qos0": (0, 0, ["kvstore", "kvstore-disk", "mosquitto"]),  # load: (publish QoS, subscribe QoS, servers)
         "qos1": (1, 1, ["kvstore-disk", "mosquitto"])}
SERVERS = ["kvstore", "kvstore-disk", "mosquitto"]
COLORS = {"kvstore": "#1f77b4", "kvstore-disk": "#0b3d91", "mosquitto": "#9467bd"}
MSG = 85  # bytes of a message: IoT's small writes
TARGETS = (("qos0", "kvstore", "mosquitto", 3.0), ("qos1", "kvstore-disk", "mosquitto", 5.0))


class MqttNode(KvNode):
    """kvstore serving MQTT on its pollers (--mqtt-port 0): .port is the MQTT port the load
    generator talks to, .resp_port the RESP one (FLUSHALL between points)."""
    protocol = "mqtt"

    def __init__(self, threads, durability, name):
        super().__init__(threads, durability, name)
        self.node.settings["mqtt_port"] = 0

    def start(self):
        self.node.start()
        self.resp_port = self.node.port
        self.port = self.node.mqtt_port
        if not self.port:
            raise RuntimeError(f"{self.name}: the node reported no MQTT port")
        return self


def servers(args):
    make = {"kvstore": lambda: MqttNode(args.kv_threads, "none", "kvstore"),
            "kvstore-disk": lambda: MqttNode(args.kv_threads, "disk", "kvstore-disk"),
            "mosquitto": lambda: common.mosquitto(common.free_port(), "mosquitto")}
    wanted = {s for load in args.loads for s in LOADS[load][2]} & set(args.servers)
    return [make[s]() for s in SERVERS if s in wanted]


def points(args, srv):
    """[(round, load, subscribers, server)] in the order measured: A B C within each load."""
    return [(rnd, load, n, s) for rnd in range(args.rounds) for load in args.loads for n in args.subscribers
            for s in srv if s.name in LOADS[load][2]]


def measure(args):
    srv = servers(args)
    todo = points(args, srv)
    sweep = common.Sweep(args.csv, ("round", "load", "subscribers", "server"), len(todo), args)
    try:
        for s in srv:
            s.start()
        for i, (rnd, load, n, s) in enumerate(todo):
            if sweep.has(round=rnd, load=load, subscribers=n, server=s.name):
                continue
            qos, sub_qos, _ = LOADS[load]
            if isinstance(s, MqttNode):  # each point starts from empty streams
                with redis.Redis(port=s.resp_port) as c:
                    c.flushall()
            cpu0, w0 = common.cpu_seconds(s.pid), time.monotonic()
            r = common.kvbench.mqtt(port=s.port, threads=args.client_threads, conns=args.conns, qos=qos,
                                    window=args.window, msg_size=MSG, topics=args.topics, duration=args.duration,
                                    messages=args.max_messages, seed=1000 + i, subscribers=n, sub_qos=sub_qos)
            cpu, wall = common.cpu_seconds(s.pid) - cpu0, time.monotonic() - w0
            pub, dlv = r["messages"], r["delivered"]
            row = {"round": rnd, "load": load, "server": s.name, "subscribers": n, "pub_qos": qos,
                   "sub_qos": sub_qos, "conns": args.conns, "window": args.window, "topics": args.topics,
                   "message_bytes": MSG, "duration_s": args.duration, "published": pub, "delivered": dlv,
                   "lost": max(0, pub * n - dlv),
                   "throughput": round(r["throughput"]), "deliver_throughput": round(r["deliver_throughput"]),
                   "ack_p50_us": round(r["lat_p50_us"], 1), "ack_p99_us": round(r["lat_p99_us"], 1),
                   "dlv_p50_us": round(r["dlat_p50_us"], 1), "dlv_p99_us": round(r["dlat_p99_us"], 1),
                   "dlv_p999_us": round(r["dlat_p999_us"], 1),
                   "wall_s": round(wall, 3), "server_cpu_s": round(cpu, 3),
                   "cpu_us_per_delivered": round(cpu / dlv * 1e6, 3) if dlv else ""}
            sweep.add(row, f"round {rnd} {load} subs {n} {s.name:12s} pub {row['throughput']:>9,} msg/s  "
                           f"dlv {row['deliver_throughput']:>9,} msg/s  lost {row['lost']:,}  "
                           f"dlv p99 {row['dlv_p99_us']:8.0f} us  cpu {row['cpu_us_per_delivered']} us/dlv")
    finally:
        sweep.close()
        for s in srv:
            s.stop()
    return sweep.rows


FIELDS = ("throughput", "deliver_throughput", "ack_p50_us", "ack_p99_us", "dlv_p50_us", "dlv_p99_us", "dlv_p999_us",
          "cpu_us_per_delivered", "lost")


def groups(rows):
    """{(load, subscribers, server): {field: [values over rounds]}} in load, subscribers, server order."""
    out = {}
    order = {s: i for i, s in enumerate(SERVERS)}
    for r in sorted(rows, key=lambda r: (r["load"], int(r["subscribers"]), order.get(r["server"], 99))):
        g = out.setdefault((r["load"], int(r["subscribers"]), r["server"]), {f: [] for f in FIELDS})
        for f in FIELDS:
            if r.get(f) not in ("", None):
                g[f].append(float(r[f]))
    return out


def med(v):
    return statistics.median(v) if v else float("nan")


def report(rows):
    g = groups(rows)
    for (load, n, server), v in g.items():
        t = v["deliver_throughput"]
        print(f"{load} subs {n:<3} {server:12s} pub {med(v['throughput']):>10,.0f} msg/s  "
              f"dlv {med(t):>10,.0f} msg/s [{min(t, default=0):,.0f}-{max(t, default=0):,.0f}]  "
              f"ack p50/p99 {med(v['ack_p50_us']):7.0f}/{med(v['ack_p99_us']):7.0f} us  "
              f"dlv p50/p99/p99.9 {med(v['dlv_p50_us']):7.0f}/{med(v['dlv_p99_us']):7.0f}/"
              f"{med(v['dlv_p999_us']):7.0f} us  cpu {med(v['cpu_us_per_delivered']):6.2f} us/dlv  "
              f"lost {med(v['lost']):,.0f} (max {max(v['lost'], default=0):,.0f})")
    lost = {s: sum(max(v["lost"], default=0) for (_, _, srv), v in g.items() if srv == s) for s in SERVERS}
    print("lost (published x subscribers - delivered, worst round summed over points): "
          + ", ".join(f"{s} {lost[s]:,.0f}" for s in SERVERS if any(k[2] == s for k in g)))
    kv_lost = sum(v for s, v in lost.items() if s.startswith("kvstore"))
    print("kvstore never drops a QoS 1 message: it slows the publishers of a subscriber whose queue is past "
          "--mqtt-max-queued (1000; QoS 0 past it is dropped); Mosquitto drops QoS 1 past max_queued_messages=1000 "
          "per subscriber"
          + ("" if not kv_lost else f" -- BUT kvstore rows lost {kv_lost:,.0f} here: look into it (the load "
                                     "generator stops waiting for deliveries 5 s after the publishers stop, so a "
                                     "subscriber more than 5 s behind counts as lost: see dlv_p99_us)"))
    for n in sorted({k[1] for k in g}):
        for load, a, b, goal in TARGETS:
            where = {"load": load, "subscribers": str(n)}
            dlv = common.paired(rows, "server", a, b, "deliver_throughput", **where)
            pub = common.paired(rows, "server", a, b, "throughput", **where)
            if dlv is not None:
                print(f"target {load} subs {n}: {a}/{b} delivered msg/s >= {goal:g}x: {dlv:.2f}x -> "
                      f"{'met' if dlv >= goal else 'NOT met'}")
            if pub is not None:
                p99 = common.paired(rows, "server", a, b, "dlv_p99_us", **where)
                ack = common.paired(rows, "server", a, b, "ack_p99_us", **where)
                print(f"{'':8s}{load} subs {n}: {a}/{b} published msg/s {pub:.2f}x, "
                      f"publish-to-delivery p99 {p99:.2f}x ({med(g[(load, n, a)]['dlv_p99_us']):,.0f} vs "
                      f"{med(g[(load, n, b)]['dlv_p99_us']):,.0f} us), publish-to-ack p99 {ack:.2f}x "
                      f"({med(g[(load, n, a)]['ack_p99_us']):,.0f} vs {med(g[(load, n, b)]['ack_p99_us']):,.0f} us)")
        v = common.paired(rows, "server", "kvstore-disk", "mosquitto", "deliver_throughput", load="qos0",
                          subscribers=str(n))
        if v is not None:
            print(f"{'':8s}qos0 subs {n}: kvstore-disk/mosquitto delivered msg/s {v:.2f}x")


def draw(rows, path):
    plt = common.pyplot()
    g = groups(rows)
    cols = list(dict.fromkeys((load, n) for load, n, _ in g))
    labels = [f"{load.upper().replace('QOS', 'QoS ')}, {n} sub{'s' if n != 1 else ''}" for load, n in cols]
    series = [s for s in SERVERS if any(k[2] == s for k in g)]
    by = {lab: col for lab, col in zip(labels, cols)}

    def values(field):
        return {(lab, s): g[(*by[lab], s)][field] for lab in labels for s in series if (*by[lab], s) in g}

    fig, (ax, bx, cx) = plt.subplots(1, 3, figsize=(17, 5.5))
    lost = {(lab, s): f"lost {med(g[(*by[lab], s)]['lost']):,.0f}" for lab in labels for s in series
            if (*by[lab], s) in g and med(g[(*by[lab], s)]["lost"]) > 0}
    common.bar_chart(ax, labels, series, values("deliver_throughput"), colors=COLORS, annotate=lost)
    ax.set_ylabel("delivered messages/s (median of rounds, min-max)")
    ax.set_title("(a) delivered msg/s, all subscribers together\n(annotated: messages the broker dropped)",
                 fontsize=9)
    ax.legend(fontsize=8)
    xs = common.bar_chart(bx, labels, series, values("dlv_p99_us"), colors=COLORS,
                          labels={s: f"{s} p99" for s in series})
    p50 = values("dlv_p50_us")
    for s in series:
        pts = [(x, med(p50[(lab, s)])) for lab, x in xs.get(s, {}).items() if p50.get((lab, s))]
        if pts:
            bx.scatter([p[0] for p in pts], [p[1] for p in pts], marker="_", s=300, linewidths=2.5, color="black",
                       zorder=5, label="p50" if s == series[0] else None)
    bx.set_yscale("log")
    bx.set_ylabel("publish-to-delivery latency (us): bars p99 (min-max), black p50")
    bx.set_title("(b) publish-to-delivery latency", fontsize=9)
    bx.legend(fontsize=8)
    common.bar_chart(cx, labels, series, values("cpu_us_per_delivered"), colors=COLORS)
    cx.set_ylabel("server CPU us per delivered message (all its threads)")
    cx.set_title("(c) what a delivered message costs the server", fontsize=9)
    cx.legend(fontsize=8)
    for a in (ax, bx, cx):
        a.tick_params(axis="x", labelsize=8)
    r0 = rows[0] if rows else {}
    fig.suptitle(f"Paper 004, MQTT: kvstore (--mqtt-port, {MSG}-byte messages to streams) vs Mosquitto; "
                 f"{r0.get('conns', '?')} publishers x {r0.get('window', '?')} in flight, {r0.get('topics', '?')} "
                 f"topics, subscribers to t/#, {r0.get('duration_s', '?')} s per point, "
                 f"{len({r['round'] for r in rows})} rounds A B C\n"
                 + common.cores_note(shares="servers, load generator"), fontsize=10)
    common.save_figure(fig, path)


def add_args(ap):
    common.add_sweep_args(ap)
    ap.add_argument("--rounds", type=int, default=3, help="A B C rounds per load")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds of publishing per point")
    ap.add_argument("--max-messages", type=int, default=20_000_000, help="bound of a point's published messages")
    ap.add_argument("--conns", type=int, default=8, help="publishers")
    ap.add_argument("--window", type=int, default=16, help="PUBLISHes in flight per publisher")
    ap.add_argument("--topics", type=int, default=64, help="topics t/<i mod topics> the publishers write to")
    ap.add_argument("--subscribers", type=int, nargs="+", default=[1, 4],
                    help="subscriber counts (each subscriber to t/#, receiving every message), one point each")
    ap.add_argument("--client-threads", type=int, default=2, help="load generator threads")
    ap.add_argument("--kv-threads", type=int, default=1,
                    help="kvstore pollers (they serve MQTT; they share the 2 cores with the load generator)")
    ap.add_argument("--loads", nargs="+", choices=list(LOADS), default=list(LOADS))
    ap.add_argument("--servers", nargs="+", choices=SERVERS, default=SERVERS)


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
