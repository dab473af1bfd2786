"""Paper 004, pull throughput of the two-level pull cache: UDP pulls of sealed stream batches
answered by the first level (an XDP program on the server's interface, --pull-cache-slots)
against the second (the engine behind the kernel's UDP stack), and the packet rate this veth
can bounce at all, all in one run.

The server runs in a test host (network namespace + veth pair, 198.18.0.0/15, native XDP). The
load is written by an XDP program on this side's veth end (the kernel's test runner in
live-frame mode: no socket, no network stack on the client side; ext/bench/pullgen.h) and the
answers are taken by another there, so a pull costs the client little next to what the server
spends on it: the rates compare the server's paths. At most --window pulls in flight, random
batch numbers of --streams streams. The client is CPU 0, the server CPU 1: the server's
receive side runs in a NAPI thread pinned there, with kvstore (the engine) pinned beside it,
so everything the server does for a pull - XDP, the kernel's UDP stack, the engine, and
handing the answer to the veth - is on CPU 1 and counted in its busy time.

Modes, alternated A B C D within each round:
  bounce     no kvstore: an XDP program that only turns each pull around at the size of an
             average batch answer (the padded pull shrunk to it; the yardstick: the paper's
             "line rate");
  bounce-copy the same, with the answer's bytes written into the frame from one buffer (what
             putting any answer in a frame costs, with no lookup);
  l1-hot     the first level, pulls of the first --hot batches of each stream only: a hot
             set whose answers stay in the CPU's caches, as when consumers keep up with the tail;
  l1-hit     --pull-cache-slots larger than the batches: the kernel answers every pull, of any
             of the --batches batches (answers spread over 1.1 MB of slots at the defaults);
  l1-miss    one slot: nearly every pull misses it, the engine answers (and refills the slot);
  detached   no pull cache (an XDP program that passes everything, so the veth takes the
             generator's frames): the engine answers every pull.
Each kvstore mode preloads its streams (--batches batches of ~14 messages of 85 bytes each)
and measures for --duration seconds after --warmup.

Paper (MultiMQC, FPGA NIC cache): L1-hit pulls reach 95.8 % of 10 GbE line rate. The issue's
targets: l1-hit >= 0.9x bounce and >= 3x l1-miss. A hit copies its answer (1.4 KB) out of the
slot map, which a bounce does not: with the server's core the limit, the ratio to the bounce is
what that copy costs next to turning a packet around, so the hot set is measured too; the line
rate of the paper's 10 GbE link at this answer size is drawn for scale.

    kvstore experiment run p004_pull          -> OUT/p004_pull.{csv,png}   (root, 2 CPUs)
"""
import contextlib
import os
import statistics
import subprocess
import sys
import time

from kvstore import Node, bench, netns
from kvstore.udpstreams import UdpStreams
from kvstore.experiments import common

NAME = "p004_pull"
QUICK = ["--rounds", "1", "--duration", "1", "--warmup", "0.2", "--batches", "30", "--hot", "8"]
MODES = ["bounce", "bounce-copy", "l1-hot", "l1-hit", "l1-miss", "detached"]
COLORS = {"bounce": "#7f7f7f", "bounce-copy": "#bdbdbd", "l1-hot": "#08306b", "l1-hit": "#08519c", "l1-miss": "#6baed6", "detached": "#d62728"}
MSG = 85
PER_DATAGRAM = 14  # messages per preload datagram: about one sealed batch (core/stream.h: 1,400 bytes)
HOST_INDEX = 62
CLIENT_CPU, SERVER_CPU = 0, 1
WIRE_OVERHEAD = 14 + 4 + 8 + 12 + 20 + 8 + 8  # Ethernet header, FCS, preamble, gap; IPv4, UDP, kvstore header


def line_rate_pps(answer_bytes, gbps=10.0):
    """Answers per second a link of gbps carries at this answer size (the paper's 10 GbE)."""
    return gbps * 1e9 / 8 / (answer_bytes + WIRE_OVERHEAD)


def helper_main():
    """`python -c 'from kvstore.experiments.p004_pull import helper_main; helper_main()' IF PROGRAM PORT LEN`,
    run inside the test host: attach one of the pull cache object's programs ("pull_bounce",
    "pass"), say "ready", hold it until stdin closes, print how many pulls it bounced."""
    ifname, program, port, blen = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with netns.XdpProgram(ifname, program, port, blen) as prog:
        print("ready", flush=True)
        sys.stdin.read()
        print(prog.bounced(), flush=True)


@contextlib.contextmanager
def inside_program(host, program, port=0, blen=0):
    """An XDP program on the test host's veth end for the block's time; yields a dict that
    gets "bounced" (pull_bounce's count) when it is detached."""
    helper = subprocess.Popen(host.exec_prefix() + [sys.executable, "-c",
                              "from kvstore.experiments.p004_pull import helper_main; helper_main()",
                              host.ns_if, program, str(port), str(blen)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out = {}
    try:
        if helper.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the XDP program {program} did not attach in {host.name}")
        yield out
        text, _ = helper.communicate("", timeout=30)
        out["bounced"] = int(text.strip() or 0)
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()


def check_args(args):
    ok, why = netns.available()
    if not ok:
        raise SystemExit(f"{NAME}: {why} (the server runs in a test host on a veth pair)")
    from kvstore._ext import lib
    if (os.cpu_count() or 1) < 2:
        raise SystemExit(f"{NAME}: needs 2 CPUs (the client on CPU {CLIENT_CPU}, the server on CPU {SERVER_CPU})")
    if not lib.pc_available():
        raise SystemExit(f"{NAME}: this build has no pull cache (clang and libbpf-dev were missing when it was "
                         "built; `make dev` installs them)")


def preload(node, args):
    """args.batches datagrams of PER_DATAGRAM messages into each stream, then one more message
    after the seal age (100 ms), so every batch but the newest is sealed. Returns the
    sealed batches every stream has (the pull load's range) and the mean answer size."""
    with UdpStreams(node.bind, node.udp_port) as u:
        for no in range(args.batches):
            for s in range(args.streams):
                u.xadd(f"key:{s:012d}".encode(), [b"%06d" % (no * PER_DATAGRAM + j) + b"." * (MSG - 6)
                                                   for j in range(PER_DATAGRAM)])
        time.sleep(0.15)
        for s in range(args.streams):
            u.xadd(f"key:{s:012d}".encode(), [b"." * MSG])
        sealed, sizes = [], []
        for s in range(args.streams):
            no = 0
            while True:
                body = u.pull(f"key:{s:012d}".encode(), no)
                if body[0] != 0:
                    break
                sizes.append(len(body))
                no += 1
            sealed.append(no)
    return min(sealed), round(statistics.mean(sizes))


def pull_cache_stats(node):
    with node.client() as c:
        s = c.info("stats")
    return {k: int(v) for k, v in s.items() if k in ("pull_cache_hits", "pull_cache_misses")}


def pulled(mode, shape, args):
    """The batches of each stream a mode's load pulls from (batch numbers 0 .. n-1)."""
    return min(args.hot, shape["batches"]) if mode == "l1-hot" else shape["batches"]


def run_load(host, port, nbatches, args, server_pid=None):
    """The XDP generator's load, from CPU 0; with the server's CPU busy share and its process's
    CPU seconds over it."""
    busy0, pcpu0 = common.cpu_jiffies({SERVER_CPU}), common.cpu_seconds(server_pid) if server_pid else 0.0
    r = bench.pull_xdp(host.host_if, host.mac(inside=True), host.local_addr, host.addr, port, streams=args.streams,
                       batches=nbatches, window=args.window, duration=args.duration, warmup=args.warmup,
                       cpu=CLIENT_CPU)
    share = common.busy_share(busy0, common.cpu_jiffies({SERVER_CPU}))
    pcpu = common.cpu_seconds(server_pid) - pcpu0 if server_pid else 0.0
    return r, share, pcpu


def point(host, mode, args, shape):
    """One mode's measurement: (generator result, server CPU busy share, server process CPU s,
    extra row fields)."""
    if mode in ("bounce", "bounce-copy"):
        port = common.free_port(udp=True)
        program = {"bounce": "pull_bounce", "bounce-copy": "pull_bounce_copy"}[mode]
        with inside_program(host, program, port, shape["answer"]) as out:
            host.napi_thread(SERVER_CPU)
            r, share, _ = run_load(host, port, pulled(mode, shape, args), args)
        return r, share, 0.0, {"xdp_answered": out["bounced"]}
    slots = {"l1-hot": 1 << 16, "l1-hit": 1 << 16, "l1-miss": 1, "detached": 0}[mode]
    node = Node(port=0, bind=host.addr, netns=host.name, arch="udp", udp_port=0, durability="none",
                threads=1, udp_workers=1, pull_cache_slots=slots)
    with node, contextlib.ExitStack() as stack:
        # the preload's pulls: a veth hands what its peer sends back with XDP_TX only to a side running XDP
        with netns.XdpProgram(host.host_if, "pass"):
            nb, answer = preload(node, args)
        shape.setdefault("batches", nb)
        shape.setdefault("answer", answer)
        if not slots:
            stack.enter_context(inside_program(host, "pass"))
        host.napi_thread(SERVER_CPU)
        common.pin_process(node.pid, {SERVER_CPU})
        before = pull_cache_stats(node) if slots else {}
        r, share, pcpu = run_load(host, node.udp_port, pulled(mode, shape, args), args, node.pid)
        extra = {}
        if slots:
            after = pull_cache_stats(node)
            extra = {"xdp_answered": after["pull_cache_hits"] - before["pull_cache_hits"],
                     "xdp_missed": after["pull_cache_misses"] - before["pull_cache_misses"]}
    return r, share, pcpu, extra


def measure(args):
    modes = [m for m in MODES if m in args.modes]
    sweep = common.Sweep(args.csv, ("round", "mode"), args.rounds * len(modes), args)
    shape = {}
    try:
        with netns.TestHost("kvp004", index=HOST_INDEX) as host:
            order = ["l1-hit"] + [m for m in modes if m != "l1-hit"]  # l1-hit first: it learns the shape
            for rnd in range(args.rounds):
                turn = order if rnd == 0 else order[rnd % len(order):] + order[:rnd % len(order)]
                for mode in turn:
                    if mode not in modes or sweep.has(round=rnd, mode=mode):
                        continue
                    if mode.startswith("bounce") and not shape:
                        point(host, "l1-hit", args, shape)  # the answer size the bounce sends back
                    r, share, pcpu, extra = point(host, mode, args, shape)
                    if r["bad"] and not mode.startswith("bounce"):  # a bounce sends the pull back: not a batch
                        raise RuntimeError(f"{mode}: {r['bad']} answers were not the batch asked for")
                    n = r["answered"]
                    busy_s = share * r["elapsed"]
                    row = {"round": rnd, "mode": mode, "streams": args.streams, "batches": shape["batches"],
                           "pulled_batches": pulled(mode, shape, args), "answer_bytes": shape["answer"],
                           "duration_s": args.duration, "window": args.window, "pulls": n,
                           "throughput": round(r["throughput"]),
                           "mb_s": round((n * shape["answer"] if mode.startswith("bounce") else r["answer_bytes"])
                                         / r["elapsed"] / 1e6, 1) if r["elapsed"] else 0,
                           "lost": r["lost"], "p50_us": round(r["lat_p50_us"], 1), "p99_us": round(r["lat_p99_us"], 1),
                           "server_cpu_busy": round(share, 3),
                           "server_cpu_us_per_pull": round(busy_s / n * 1e6, 3) if n else "",
                           "server_process_cpu_s": round(pcpu, 3), "xdp_answered": extra.get("xdp_answered", ""),
                           "xdp_missed": extra.get("xdp_missed", "")}
                    sweep.add(row, f"round {rnd} {mode:9s} {row['throughput']:>10,} pulls/s {row['mb_s']:7.1f} MB/s "
                                   f"p50 {row['p50_us']:6.0f} us  server CPU {share:4.0%}, "
                                   f"{row['server_cpu_us_per_pull']} us/pull (kvstore {pcpu:.2f} s)")
    finally:
        sweep.close()
    return sweep.rows


def summary(rows):
    """{mode: (median pulls/s, min, max, median server CPU us/pull, median p50 us, median p99 us)}."""
    by = {}
    for r in rows:
        by.setdefault(r["mode"], []).append(r)
    out = {}
    for m in MODES:
        if m in by:
            t = [float(r["throughput"]) for r in by[m]]
            c = [float(r["server_cpu_us_per_pull"]) for r in by[m] if r["server_cpu_us_per_pull"] not in ("", None)]
            out[m] = (statistics.median(t), min(t), max(t), statistics.median(c) if c else 0.0,
                      statistics.median(float(r["p50_us"]) for r in by[m]),
                      statistics.median(float(r["p99_us"]) for r in by[m]))
    return out


def report(rows):
    s = summary(rows)
    for m, (t, lo, hi, cpu, p50, p99) in s.items():
        print(f"{m:9s} {t:>11,.0f} pulls/s [{lo:,.0f}-{hi:,.0f}]  server cpu {cpu:6.3f} us/pull  "
              f"p50 {p50:.0f} us p99 {p99:.0f} us")
    for a, b, want, what in (("l1-hot", "bounce", 0.9, "l1-hot >= 0.9x bounce (paper: 95.8 % of line rate)"),
                             ("l1-hit", "bounce", 0.9, "l1-hit >= 0.9x bounce"),
                             ("l1-hit", "bounce-copy", None, "l1-hit vs a bounce that writes the answer's bytes"),
                             ("l1-hit", "l1-miss", 3.0, "l1-hit >= 3x l1-miss"),
                             ("l1-hit", "detached", None, "l1-hit vs no first level")):
        x = common.paired(rows, "mode", a, b)
        if x is not None:
            verdict = "" if want is None else (" -> met" if x >= want else " -> NOT met")
            print(f"target {what}: {a}/{b} = {x:.2f}{verdict}")
    answer = next((int(r["answer_bytes"]) for r in rows if r.get("answer_bytes")), 0)
    if answer and "l1-hit" in s:
        line = line_rate_pps(answer)
        print(f"10 GbE carries {line:,.0f} answers/s of {answer} bytes: l1-hit is {s['l1-hit'][0] / line:.2f}x that")


def label(mode, rows):
    """A bar's name with the batches per stream its pulls went to."""
    n = {r.get("pulled_batches") for r in rows if r["mode"] == mode} - {None, ""}
    return f"{mode}\n{n.pop()} batches" if len(n) == 1 and not mode.startswith("bounce") else mode


def draw(rows, path):
    plt = common.pyplot()
    s = summary(rows)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5.5))
    modes = list(s)
    xs = range(len(modes))
    ax.bar(xs, [s[m][0] for m in modes], color=[COLORS[m] for m in modes],
           yerr=[[s[m][0] - s[m][1] for m in modes], [s[m][2] - s[m][0] for m in modes]], capsize=4)
    for i, m in enumerate(modes):
        ax.text(i, s[m][0], f"{s[m][0] / 1e3:,.0f} K", ha="center", va="bottom", fontsize=8)
    if "bounce" in s:
        ax.axhline(0.9 * s["bounce"][0], color="black", ls=":", lw=1, label="0.9 x bounce (the first level's target)")
    answer = next((int(r["answer_bytes"]) for r in rows if r.get("answer_bytes")), 0)
    if answer:
        ax.axhline(line_rate_pps(answer), color="#2ca02c", ls="--", lw=1,
                   label=f"10 GbE line rate at {answer}-byte answers (the paper's link)")
    ax.legend(fontsize=8)
    ax.set_xticks(list(xs), [label(m, rows) for m in modes], fontsize=8)
    ax.set_ylabel("pulls answered per second (median of rounds, min-max)")
    ax.set_title("pull throughput: the kernel's first level vs the engine", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    bx.bar(xs, [s[m][3] for m in modes], color=[COLORS[m] for m in modes])
    for i, m in enumerate(modes):
        bx.text(i, s[m][3], f"{s[m][3]:.2f}", ha="center", va="bottom", fontsize=8)
    bx.set_xticks(list(xs), [label(m, rows) for m in modes], fontsize=8)
    bx.set_ylabel("server CPU us per pull (CPU 1's busy time)")
    bx.set_title("what a pull costs the server: XDP, the UDP stack, kvstore", fontsize=9)
    bx.grid(alpha=0.3, axis="y")
    r0 = rows[0] if rows else {}
    fig.suptitle(f"Paper 004: UDP pulls of sealed batches ({r0.get('answer_bytes', '?')}-byte answers), "
                 f"{r0.get('streams', '?')} streams x {r0.get('batches', '?')} batches, veth in a network namespace, "
                 f"{r0.get('window', '?')} in flight, {r0.get('duration_s', '?')} s per point, "
                 f"{len({r['round'] for r in rows})} rounds\n"
                 + common.cores_note(f"XDP load generator on CPU {CLIENT_CPU}; server (NAPI thread, kvstore) "
                                     f"on CPU {SERVER_CPU}"), fontsize=10)
    common.save_figure(fig, path)


def add_args(ap):
    common.add_sweep_args(ap)
    ap.add_argument("--rounds", type=int, default=3, help="A B C D rounds")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=MODES)
    ap.add_argument("--streams", type=int, default=4, help="streams pulled from (keys key:000000000000 ...)")
    ap.add_argument("--batches", type=int, default=200, help="preload datagrams of 14 messages per stream")
    ap.add_argument("--hot", type=int, default=30, help="l1-hot: the batches of each stream its pulls go to")
    ap.add_argument("--duration", type=float, default=3.0, help="measured seconds per point")
    ap.add_argument("--warmup", type=float, default=0.5, help="seconds of load before each measurement")
    ap.add_argument("--window", type=int, default=128, help="pulls in flight (the generator sends when one is answered)")


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
