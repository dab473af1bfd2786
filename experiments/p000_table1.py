"""Paper 000, Table 1: the same store behind different request-handling architectures,
for five workloads of ~85-byte inserts.

Rows (the paper's columns):
  N     network only: SET answers +OK without touching the table (--network-only)
  NH    + the hash table (durability none)
  NHD   + memory full: --max-memory far below the data with the BOSC data file, so an
        insert waits until the flusher has made room
  NHL   + remote log: durability remote, each node's log peer on a test host in its own
        network namespace (a veth pair, 198.18.0.0/15), so log batches cross a (virtual) network
  NHDL  all of them
Architectures:
  threadpool        a pool of workers, one blocking request at a time (the paper's LinuxTCP)
  poller-strict, poller-flexpoll, poller-direct
                    the per-core epoll pollers with each EPOLLOUT policy (kernel TCP)
  udp               the UDP front end on kernel sockets (recvmmsg/sendmmsg)
  dpdk              the same UDP front end on DPDK lcores over AF_XDP (kernel bypass: the
                    paper's mTCP/DPDK column; mTCP itself is not packaged, so UDP as in MICA)
The two UDP front ends run --udp-workers threads/lcores (default 1: per core).

Topology: every client runs in a test host's namespace and crosses a veth pair to the
servers (198.18.18.0/30; dpdk gets its own pair, 198.18.19.0/30, whose host end it takes
over with AF_XDP). Load: kvstore bench, SET, 85-byte values, fresh random keys (1 M key
space), --conns connections (UDP: sockets) at pipeline --pipeline (UDP: datagrams in
flight per socket). The servers of a row are measured in alternation (A B C ..., then
reversed), medians of --rounds; server CPU time is recorded too (a dpdk lcore busy-polls:
its CPU time is its whole run). Needs root for the namespaces; without root everything
runs on loopback and dpdk is left out (and it says so).

    kvstore experiment run p000_table1        -> OUT/p000_table1.{csv,png}
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from kvstore import Node, netns
from kvstore import server as kvserver
from kvstore.experiments import common

NAME = "p000_table1"
QUICK = ["--archs", "threadpool", "poller-direct", "udp", "dpdk", "--rounds", "1", "--requests", "20000",
         "--keyspace", "50000", "--conns", "20", "--workers", "8", "--full-memory", "4mb"]
ROWS = ["N", "NH", "NHD", "NHL", "NHDL"]
ARCHS = ["threadpool", "poller-strict", "poller-flexpoll", "poller-direct", "udp", "dpdk"]
UDP_PORT = 6390
PAPER = {"LinuxTCP thread pool": [799_706, 540_093, 417_006, 300_796, 250_405],
         "mTCP/DPDK pollers": [2_208_262, 897_920, 634_251, 740_663, 624_477]}


def settings_for(row, arch, args, peer_addr, hosts):
    s = {"durability": "none"}  # memory only unless the row has the remote log (L)
    if arch == "threadpool":
        s.update(arch="threadpool", threads=args.workers)
    elif arch.startswith("poller"):
        s.update(threads=args.pollers, poll_policy=arch.split("-")[1])
    else:
        s.update(arch=arch, udp_port=UDP_PORT, udp_workers=args.udp_workers)
        if arch == "dpdk":
            s["dpdk_iface"] = hosts["dpdk"].host_if
    if row == "N":
        s["network_only"] = True
    if "D" in row:
        s.update(data_file=True, max_memory=args.full_memory)
    if "L" in row:
        s.update(durability="remote", peer=peer_addr, peer_startup_wait_ms=20000, init=True)  # new node, new peer
    return s


class Target:
    """Where an architecture's clients connect from (a namespace or this host) and to."""

    def __init__(self, host, addr, udp, args):
        self.host, self.addr, self.udp, self.args = host, addr, udp, args

    def bench(self, port, pipeline, conns, requests, keyspace, value_size):
        cmd = [sys.executable, "-m", "kvstore.cli", "bench", "--host", self.addr, "-p", str(port),
               "-t", str(self.args.client_threads),
               "-c", str(conns), "-P", str(pipeline), "-n", str(requests), "-r", str(keyspace),
               "-d", str(value_size), "--ratio", "1:0", "--duration", "120", "--json"]
        if self.udp:
            cmd += ["--udp", "--timeout-ms", "2000"]
        if self.args.client_cpus:
            cmd = ["taskset", "-c", self.args.client_cpus] + cmd
        if self.host:
            cmd = self.host.exec_prefix() + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode:
            raise RuntimeError(f"kvstore bench failed: {r.stderr.strip()[-500:]}")
        out = json.loads(r.stdout)
        if out["errors"]:
            raise RuntimeError(f"kvstore bench: {out['errors']} errors, first: {out['first_error']}")
        return out


def dpdk_unavailable():
    if os.geteuid() != 0:
        return "not root"
    if not kvserver.have_dpdk():
        return "kvstore was built without DPDK"
    return ""


def make_hosts(archs):
    """Test hosts for the clients ('tcp': every kernel-socket arch; 'dpdk'), or {} without root."""
    ok, why = netns.available()
    if not ok:
        print(f"note: {why}: clients and the log peer run on loopback", file=sys.stderr)
        return {}
    hosts = {"peer": netns.TestHost("kvt1peer", index=17).create(),
             "tcp": netns.TestHost("kvt1cli", index=18).create()}
    if "dpdk" in archs:
        h = hosts["dpdk"] = netns.TestHost("kvt1dp", index=19).create()
        h.tx_checksum_offload_off()  # or every reply built from an offloaded frame is dropped
        h.set_neighbour(h.local_addr, h.mac())  # the bypassed end answers no ARP
    return hosts


def start_peer(hosts, d):
    """A log peer for one node (a peer holds one node's log: a fresh node that starts
    in remote mode takes the log, and identity, it finds there). Returns (Node, addr)."""
    repl = common.free_port()
    if hosts:
        h = hosts["peer"]
        peer = Node(netns=h.name, bind=h.addr, port=0, threads=1, repl_port=repl, data_dir=d, durability="none")
        addr = f"{h.addr}:{repl}"
    else:
        peer = Node(port=0, threads=1, repl_port=repl, data_dir=d, durability="none")
        addr = f"127.0.0.1:{repl}"
    return peer.start(timeout=30), addr


def measure(args):
    # a SIGTERM unwinds the finally blocks below: servers stopped, namespaces removed
    old_term = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    hosts = {}
    sweep = None
    try:
        hosts = make_hosts(args.archs)  # before any thread that a fork could inherit a lock from
        sweep = common.Sweep(args.csv, ("row", "arch", "round"), len(args.rows) * len(args.archs) * args.rounds, args,
                             selected=lambda r: r["row"] in args.rows and r["arch"] in args.archs, desc="table 1")

        def target(arch):
            udp = arch in ("udp", "dpdk")
            if arch == "dpdk":
                return Target(hosts["dpdk"], hosts["dpdk"].local_addr, True, args)
            return Target(hosts.get("tcp"), hosts["tcp"].local_addr if hosts else "127.0.0.1", udp, args)

        for row in args.rows:
            servers, peers, dirs = {}, [], []
            archs = [a for a in args.archs if any(not sweep.has(row=row, arch=a, round=i) for i in range(args.rounds))]
            try:
                for arch in archs:
                    d = tempfile.mkdtemp(prefix=f"kv-t1-{row}-")
                    dirs.append(d)
                    bind = hosts["tcp"].local_addr if hosts and arch != "dpdk" else "127.0.0.1"
                    peer_addr = None
                    if "L" in row:
                        dirs.append(tempfile.mkdtemp(prefix=f"kv-t1-{row}-peer-"))
                        peer, peer_addr = start_peer(hosts, dirs[-1])
                        peers.append(peer)
                    n = Node(bind=bind, port=0, data_dir=d, **settings_for(row, arch, args, peer_addr, hosts))
                    servers[arch] = n.start(60)
                    # warm up: a full pass of the key space (fills memory for D); the UDP front
                    # ends one datagram in flight per socket (see the README on AF_XDP bursts)
                    udp = arch in ("udp", "dpdk")
                    port = n.udp_port if udp else n.port
                    target(arch).bench(port, 1 if udp else 16, args.conns if udp else 50, args.keyspace,
                                       args.keyspace, args.value_size)
                for rnd in range(args.rounds):
                    order = archs if rnd % 2 == 0 else list(reversed(archs))
                    for arch in order:
                        if sweep.has(row=row, arch=arch, round=rnd):
                            continue
                        n = servers[arch]
                        port = n.udp_port if arch in ("udp", "dpdk") else n.port
                        udp = arch in ("udp", "dpdk")
                        busy0 = int(n.stats()["udp_busy_us"]) if udp else 0
                        cpu0 = common.cpu_seconds(n.pid)
                        r = target(arch).bench(port, args.pipeline, args.conns, args.requests, args.keyspace,
                                               args.value_size)
                        cpu = common.cpu_seconds(n.pid) - cpu0
                        busy = int(n.stats()["udp_busy_us"]) - busy0 if udp else ""
                        sweep.add({"round": rnd, "row": row, "arch": arch, "pipeline": args.pipeline,
                                   "conns": args.conns, "requests": args.requests,
                                   "throughput": round(r["throughput"]), "p50_us": round(r["lat_p50_us"], 1),
                                   "p99_us": round(r["lat_p99_us"], 1), "timeouts": r.get("timeouts", 0),
                                   "server_cpu_s": round(cpu, 3),
                                   "server_cpu_us_per_req": round(cpu * 1e6 / max(1, r["requests"]), 2),
                                   "udp_busy_us_per_req": round(busy / max(1, r["requests"]), 3) if udp else "",
                                   "net": "netns" if hosts else "loopback"},
                                  f"[{row:4s} round {rnd + 1}/{args.rounds}] {arch:16s} {r['throughput']:>10,.0f} "
                                  f"SET/s p99 {r['lat_p99_us']:8.0f} us cpu {cpu:5.2f} s")
            finally:
                for n in list(servers.values()) + peers:
                    n.stop()
                for d in dirs:
                    shutil.rmtree(d, ignore_errors=True)
    finally:
        for h in hosts.values():
            h.close()
        if sweep:
            sweep.close()
        signal.signal(signal.SIGTERM, old_term)
    return sweep.rows


def medians(rows, field="throughput"):
    return common.medians(rows, ("row", "arch"), field)


def report(rows):
    med = medians(rows)
    cpu = medians(rows, "server_cpu_us_per_req")
    archs = [a for a in ARCHS if any(k[1] == a for k in med)]
    print("req/s (median) " + "".join(f"{r:>12s}" for r in ROWS))
    for a in archs:
        print(f"{a:15s}" + "".join(f"{med.get((r, a), 0):>12,.0f}" for r in ROWS))
    for name, vals in PAPER.items():
        print(f"{'paper ' + name:15.15s}" + "".join(f"{v:>12,}" for v in vals))
    print("server CPU us/request (median)")
    for a in archs:
        print(f"{a:15s}" + "".join(f"{cpu.get((r, a), 0):>12.2f}" for r in ROWS))
    busy = medians([r for r in rows if r.get("udp_busy_us_per_req") not in (None, "")], "udp_busy_us_per_req")
    if busy:
        print("UDP worker busy time, us/request (median; a dpdk lcore busy-polls, so its CPU time is all of it)")
        for a in ("udp", "dpdk"):
            if any(k[1] == a for k in busy):
                print(f"{a:15s}" + "".join(f"{busy.get((r, a), 0):>12.3f}" for r in ROWS))
    for a in archs:
        nh = med.get(("NH", a))
        if nh:
            print(f"{a:15s} ratios to NH: " + ", ".join(
                f"{r}/NH {med[(r, a)] / nh:.2f}" for r in ("N", "NHD", "NHL", "NHDL") if (r, a) in med))
    # ratios of points measured side by side (same row and round), then their median:
    # steadier than a ratio of medians when the machine's speed drifts between rounds
    for base in ("threadpool", "udp"):
        for a in archs:
            if a == base or (base == "udp" and a != "dpdk"):
                continue
            pairs = [(row, common.paired(rows, "arch", a, base, row=row)) for row in ROWS]
            pairs = [(row, x) for row, x in pairs if x is not None]
            if pairs:
                print(f"{a} / {base} (paired): " + ", ".join(f"{r} {x:.2f}x" for r, x in pairs))
    print("paper mTCP / LinuxTCP: " + ", ".join(f"{r} {m / l:.2f}x" for r, m, l in
                                                zip(ROWS, PAPER["mTCP/DPDK pollers"], PAPER["LinuxTCP thread pool"])))


def draw(rows, path):
    plt = common.pyplot()
    med = medians(rows)
    archs = [a for a in ARCHS if any(k[1] == a for k in med)]
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8))
    w = 0.8 / len(archs)
    for i, a in enumerate(archs):
        axes[0].bar([x + i * w for x in range(len(ROWS))], [med.get((r, a), 0) for r in ROWS], w, label=a)
    net = rows[0].get("net", "loopback") if rows else "loopback"
    axes[0].set_title(f"kvstore on this 2-core VM (clients over {'a veth pair' if net == 'netns' else net})",
                      fontsize=10)
    w2 = 0.8 / len(PAPER)
    for i, (name, vals) in enumerate(PAPER.items()):
        axes[1].bar([x + i * w2 for x in range(len(ROWS))], vals, w2, label=name)
    axes[1].set_title("paper 000, Table 1 (4 machines, 10 GbE)", fontsize=10)
    for ax, ww in ((axes[0], w), (axes[1], w2)):
        n = len(archs) if ax is axes[0] else len(PAPER)
        ax.set_xticks([x + ww * (n - 1) / 2 for x in range(len(ROWS))])
        ax.set_xticklabels(ROWS)
        ax.set_ylabel("inserts/s")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    common.save_figure(fig, path)


def add_args(ap):
    ap.add_argument("--rows", nargs="+", default=ROWS, choices=ROWS)
    ap.add_argument("--archs", nargs="+", default=ARCHS, choices=ARCHS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=500_000)
    ap.add_argument("--keyspace", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=85)
    ap.add_argument("--conns", type=int, default=100)
    ap.add_argument("--pipeline", type=int, default=1)
    ap.add_argument("--pollers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=32, help="threadpool size")
    ap.add_argument("--udp-workers", type=int, default=1, help="threads (udp) or lcores (dpdk) of the UDP front ends")
    ap.add_argument("--client-threads", type=int, default=2, help="kvstore bench threads")
    ap.add_argument("--client-cpus", default="", help="pin the client to these CPUs (taskset -c), e.g. 0")
    ap.add_argument("--full-memory", default="48mb", help="--max-memory of the D rows")
    common.add_sweep_args(ap)


def check_args(args):
    """dpdk is left out, with a note, where it cannot run."""
    if not args.plot_only and "dpdk" in args.archs and dpdk_unavailable():
        common.log(f"note: dpdk left out: {dpdk_unavailable()}")
        args.archs = [a for a in args.archs if a != "dpdk"]


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
