"""Paper 002 (FlexPoll): how a poller keeps its epoll interest set, measured.

Three kvstore servers identical but for --poll-policy:
  strict    EPOLLOUT added for every reply and removed once it is sent (what Redis
            did before it began writing replies directly): one or two epoll_ctl per reply;
  flexpoll  writes on EPOLLOUT like strict, but keeps EPOLLOUT registered while the
            connection's replies come often (adaptive, see ext/pollpolicy.c);
  direct    replies written at the end of each poll round, EPOLLOUT only after a
            short write (Redis >= 3.2).
Loads (redis-benchmark, 85-byte values, 1 M keys): SET and GET at pipeline 1 and 16,
with 50 and 1,000 connections; and a "real-world-like" mix: 1,000 connections of
which 950 are devices that each send now and then (an open-loop kvstore bench at a
fixed total rate) and 50 are busy gateways (closed loop, pipeline 4), SET:GET 9:1 —
IoT ingestion is skewed (a few hot clients carry most requests) and bursty (most
connections are idle between readings), which is where keeping or dropping
EPOLLOUT per connection matters. Servers alternate per load (A B C, C B A, ...);
medians of --rounds; syscalls per request from INFO pollers; server CPU per request.

    kvstore experiment run p002_flexpoll    -> OUT/p002_flexpoll.{csv,png}
"""
import json
import shutil
import subprocess
import sys
import tempfile

from kvstore import Client, Node
from kvstore.experiments import common

NAME = "p002_flexpoll"
QUICK = ["--rounds", "1", "--requests", "50000", "--conns", "50", "--mix-seconds", "1", "--device-rate", "5000"]
POLICIES = ["strict", "flexpoll", "direct"]
PAPER = {"micro": 1.469, "real-world": 1.678}  # FlexPoll / Redis (strict) throughput


def counters(port):
    with Client(port=port) as c:
        s = c.kvstore_stats()
    return {k: int(s[k]) for k in ("total_commands_processed", "total_epoll_wait_calls", "total_epoll_ctl_calls",
                                    "total_read_calls", "total_write_calls")}


def mix_load(port, seconds, device_rate, prefix=()):
    """950 open-loop devices + 50 closed-loop gateways at once; returns the gateways' throughput."""
    kv = [*prefix, sys.executable, "-m", "kvstore.cli", "bench", "-p", str(port), "-d", "85", "-r", "1000000",
          "--ratio", "9:1", "--duration", str(seconds), "--json"]
    devices = subprocess.Popen(kv + ["-t", "1", "-c", "950", "-P", "1", "--rate", str(device_rate)],
                               stdout=subprocess.PIPE, text=True)
    gateways = subprocess.run(kv + ["-t", "1", "-c", "50", "-P", "4"], capture_output=True, text=True,
                              timeout=seconds + 60, check=True)
    dev_out, _ = devices.communicate(timeout=seconds + 60)
    g, d = json.loads(gateways.stdout), json.loads(dev_out)
    return {"throughput": g["throughput"] + d["throughput"], "p99_us": g["lat_p99_us"]}


def load_name(op, p, conns):
    return f"{op} P{p} c{conns}" if op != "MIX" else "mix c1000"


def measure(args):
    dirs, nodes = [], {}
    loads = [(op, p, c) for c in args.conns for p in args.pipelines for op in ("SET", "GET")] + [("MIX", 0, 1000)]
    names = {load_name(*ld) for ld in loads}
    sweep = common.Sweep(args.csv, ("round", "load", "policy"), args.rounds * len(loads) * len(POLICIES), args,
                         selected=lambda r: r["load"] in names, desc="flexpoll")
    client = ("taskset", "-c", "0") if args.pin else ()
    try:
        for pol in POLICIES:
            d = tempfile.mkdtemp(prefix=f"kv-flex-{pol}-")
            dirs.append(d)
            nodes[pol] = Node(port=0, threads=args.threads, data_dir=d, poll_policy=pol, maxclients=4000,
                              durability="none").start()
            if args.pin:  # every thread of the server on CPU 1, the client on CPU 0
                common.pin_process(nodes[pol].pid, {1})
            common.run_redis_benchmark(nodes[pol].port, "SET", 16, 50, 200_000, 1_000_000, 85)  # keys for GET
        for rnd in range(args.rounds):
            for op, p, conns in loads:
                order = POLICIES if rnd % 2 == 0 else list(reversed(POLICIES))
                for pol in order:
                    if sweep.has(round=rnd, load=load_name(op, p, conns), policy=pol):
                        continue
                    n = nodes[pol]
                    c0, cpu0 = counters(n.port), common.cpu_seconds(n.pid)
                    if op == "MIX":
                        r = mix_load(n.port, args.mix_seconds, args.device_rate, client)
                    else:
                        req = args.requests if p > 1 else args.requests // 5
                        r = common.run_redis_benchmark(n.port, op, p, conns, req, 1_000_000, 85, prefix=client)
                    cpu = common.cpu_seconds(n.pid) - cpu0
                    c1 = counters(n.port)
                    cmds = max(1, c1["total_commands_processed"] - c0["total_commands_processed"])
                    per = {name: round((c1[f"total_{name}_calls"] - c0[f"total_{name}_calls"]) / cmds, 4)
                           for name in ("epoll_ctl", "epoll_wait", "read", "write")}
                    row = {"round": rnd, "load": load_name(op, p, conns), "policy": pol,
                           "throughput": round(r["throughput"]), "p99_us": round(r["p99_us"], 1),
                           "server_cpu_us_per_req": round(cpu / cmds * 1e6, 3), "pinned": int(args.pin),
                           **{f"{name}_per_req": v for name, v in per.items()}}
                    sweep.add(row, f"{row['load']:14s} {pol:8s} {r['throughput']:>10,.0f} req/s "
                                   f"ctl/req {row['epoll_ctl_per_req']:.3f} wait/req {row['epoll_wait_per_req']:.3f}")
    finally:
        for n in nodes.values():
            n.stop()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        sweep.close()
    return sweep.rows


def medians(rows, field="throughput"):
    return common.medians(rows, ("load", "policy"), field)


def paired(rows, load, a, b):
    x = common.paired(rows, "policy", a, b, load=load)
    return float("nan") if x is None else x


def report(rows):
    med, ctl, wait = medians(rows), medians(rows, "epoll_ctl_per_req"), medians(rows, "epoll_wait_per_req")
    loads = list(dict.fromkeys(r["load"] for r in rows))
    print(f"{'load':16s}" + "".join(f"{p:>12s}" for p in POLICIES)
          + "  flex/strict  flex/direct (paired)  ctl/req s/f/d   wait/req s/f/d")
    for ld in loads:
        v = [med[(ld, p)] for p in POLICIES]
        print(f"{ld:16s}" + "".join(f"{x:>12,.0f}" for x in v)
              + f"  {paired(rows, ld, 'flexpoll', 'strict'):10.2f}x  {paired(rows, ld, 'flexpoll', 'direct'):10.2f}x"
              + "           " + "/".join(f"{ctl[(ld, p)]:.2f}" for p in POLICIES)
              + "  " + "/".join(f"{wait[(ld, p)]:.2f}" for p in POLICIES))
    print(f"paper: FlexPoll / Redis (strict) {PAPER['micro']:.3f}x micro, {PAPER['real-world']:.3f}x real-world")


def draw(rows, path):
    plt = common.pyplot()
    loads = list(dict.fromkeys(r["load"] for r in rows))
    fig, axes = plt.subplots(2, 1, figsize=(12, 7.5), sharex=True)
    xs = {}
    for ax, field in ((axes[0], "throughput"), (axes[1], "epoll_ctl_per_req")):
        vals = {}
        for r in rows:
            vals.setdefault((r["load"], r["policy"]), []).append(float(r[field]))
        xs[field] = common.bar_chart(ax, loads, POLICIES, vals)
    # the paper reports FlexPoll / Redis (strict): marked over flexpoll's bar as strict's median x that ratio
    med = medians(rows)
    common.paper_marks(axes[0], [xs["throughput"]["flexpoll"].get(ld) for ld in loads], [med[(ld, "strict")] * (PAPER["real-world"] if "mix" in ld.lower()
                                                             else PAPER["micro"]) for ld in loads],
                       label=f"paper: flexpoll = strict x {PAPER['micro']} (micro), x {PAPER['real-world']} "
                             "(real-world)", s=250)
    axes[0].set_ylabel("requests/s (median, bars: min-max)")
    axes[1].set_ylabel("epoll_ctl calls per request")
    axes[1].set_xticklabels(loads, rotation=30, ha="right", fontsize=8)
    axes[0].set_ylim(top=axes[0].get_ylim()[1] * 1.3)  # room for the legend above the paper's marks
    axes[0].legend(fontsize=8, ncol=4, loc="upper left")
    axes[1].legend(fontsize=8, ncol=3, loc="upper right")
    pinned = rows and str(rows[0].get("pinned")) in ("1", "True")
    axes[0].set_title("EPOLLOUT policies on kvstore (2 pollers; the client is redis-benchmark or kvstore bench)\n"
                      + common.cores_note("servers on CPU 1, clients on CPU 0" if pinned else "",
                                          "" if pinned else "servers, clients"), fontsize=9)
    common.save_figure(fig, path)


def add_args(ap):
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every load (the VM drifts); medians, min-max")
    ap.add_argument("--requests", type=int, default=1_000_000, help="per P16 run (P1: a fifth)")
    ap.add_argument("--conns", type=int, nargs="+", default=[50, 1000])
    ap.add_argument("--pipelines", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mix-seconds", type=float, default=4.0)
    ap.add_argument("--device-rate", type=float, default=20_000, help="total req/s of the 950 devices")
    ap.add_argument("--pin", action="store_true", help="servers on CPU 1, clients on CPU 0 (steadier on 2 cores)")
    common.add_sweep_args(ap)


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
