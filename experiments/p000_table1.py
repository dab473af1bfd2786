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
  threadpool        a pool of workers, one blocking request at a time (the paper's LinuxTCP);
                    every --workers size is measured (threadpool-8, threadpool-32, ...) and the
                    table reports the pool at its best per row: in the L rows each worker
                    blocks for the peer's ack, so a small pool caps the row by Little's law
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
flight per socket), each point --requests or --point-seconds, whichever ends first. The
servers of a row are measured in alternation (A B C ..., then reversed), medians of
--rounds with their min-max; server CPU time is recorded too (a dpdk
lcore busy-polls: its CPU time is its whole run). N and NH are one group: the servers of
both rows run at once and alternate (N a, NH a, N b, NH b ..., reversed the next round),
so N/NH compares points measured seconds apart, not minutes apart, on a VM whose speed
drifts (measured row after row, the thread pool's N came out below its NH: 3 rounds
spanning 126-283 K for N and 99-258 K for NH). Nothing is pinned unless --client-cpus
pins the client; servers, clients and log peers share the machine's CPUs. Needs root for
the namespaces; without root everything runs on loopback and dpdk is left out (and it
says so).

Run time at the defaults: 5 rows x 9 units (4 pool sizes + 5 architectures) x 3 rounds = 135
points, each up to --point-seconds (5 s); plus each server's warm-up (up to --warmup-seconds,
D rows --full-warmup-seconds) and, before each of the 54 D points, a re-fill of up to
--rewarm-seconds: ~28 min here (the bounds add up to more; the
warm-ups and re-fills end when their key count is done). --rows/--archs/--workers/--rounds
cut it down.

    kvstore experiment run p000_table1        -> OUT/p000_table1.{csv,png}
"""
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

from kvstore import Node, netns
from kvstore import server as kvserver
from kvstore.experiments import common

NAME = "p000_table1"
QUICK = ["--archs", "threadpool", "poller-direct", "udp", "dpdk", "--rounds", "1", "--requests", "10000",
         "--keyspace", "20000", "--conns", "20", "--workers", "8", "--full-memory", "2mb", "--warmup-seconds", "10",
         "--full-warmup-seconds", "20", "--rewarm-seconds", "3", "--point-seconds", "4"]
ROWS = ["N", "NH", "NHD", "NHL", "NHDL"]
ARCHS = ["threadpool", "poller-strict", "poller-flexpoll", "poller-direct", "udp", "dpdk"]
PAPER = {"LinuxTCP thread pool": [799_706, 540_093, 417_006, 300_796, 250_405],
         "mTCP/DPDK pollers": [2_208_262, 897_920, 634_251, 740_663, 624_477]}
TOGETHER = ("N", "NH")  # rows whose servers run at once, measured in alternation


def kind(unit):
    """The architecture of a measured unit: 'threadpool-32' -> 'threadpool'."""
    return "threadpool" if unit.startswith("threadpool") else unit


def units(args):
    """The servers of a row: every architecture, the thread pool once per --workers size."""
    out = []
    for a in args.archs:
        out += [f"threadpool-{w}" for w in args.workers] if a == "threadpool" else [a]
    return out


def schedule(rows, us, rounds):
    """The measuring order: [(group, [(round, row, unit), ...])], one entry per group of rows
    whose servers run at once. In a round the rows of a group alternate per unit (N a, NH a,
    N b, NH b ...), so the rows of an arch are measured seconds apart; every other round
    runs in reverse, so no unit always goes first."""
    out = []
    for g in groups(rows):
        units_rows = [(row, u) for u in us for row in g]
        pts = []
        for rnd in range(rounds):
            pts += [(rnd, row, u) for row, u in (units_rows if rnd % 2 == 0 else reversed(units_rows))]
        out.append((g, pts))
    return out


def groups(rows):
    """Rows in measuring order, those of TOGETHER (when more than one is chosen) as one group."""
    together = [r for r in rows if r in TOGETHER]
    out, done = [], False
    for r in rows:
        if r in TOGETHER and len(together) > 1:
            if not done:
                out.append(together)
                done = True
        else:
            out.append([r])
    return out


def settings_for(row, unit, args, peer_addr, dpdk_host=None):
    s = {"durability": "none"}  # memory only unless the row has the remote log (L)
    arch = kind(unit)
    if arch == "threadpool":
        s.update(arch="threadpool", threads=int(unit.rsplit("-", 1)[1]))
    elif arch.startswith("poller"):
        s.update(threads=args.pollers, poll_policy=arch.split("-")[1])
    else:
        # a free port each: the N and NH servers of an arch run at once
        s.update(arch=arch, udp_port=common.free_port(udp=True), udp_workers=args.udp_workers)
        if arch == "dpdk":
            s["dpdk_iface"] = dpdk_host.host_if
    if row == "N":
        s["network_only"] = True
    if "D" in row:
        s.update(data_file=True, max_memory=args.full_memory)
    if "L" in row:
        s.update(durability="remote", peer=peer_addr, peer_startup_wait_ms=20000, init=True,  # new node, new peer
                 repl_secret_file=common.repl_secret())
    return s


class Target:
    """Where an architecture's clients connect from (a namespace or this host) and to."""

    def __init__(self, host, addr, udp, args):
        self.host, self.addr, self.udp, self.args = host, addr, udp, args

    def bench(self, port, pipeline, conns, requests, keyspace, value_size, seconds=120):
        """--requests, or fewer if --seconds pass first (a slow unit, e.g. 8 workers each
        waiting for the peer's ack, must not stretch the run)."""
        cmd = [sys.executable, "-m", "kvstore.cli", "bench", "--host", self.addr, "-p", str(port),
               "-t", str(self.args.client_threads),
               "-c", str(conns), "-P", str(pipeline), "-n", str(requests), "-r", str(keyspace),
               "-d", str(value_size), "--ratio", "1:0", "--duration", str(seconds), "--json"]
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


def persistence(node):
    """INFO persistence of a server (datafile_* counters of the D rows)."""
    with node.client() as c:
        return c.info("persistence")


def dpdk_unavailable():
    if os.geteuid() != 0:
        return "not root"
    if not kvserver.have_dpdk():
        return "kvstore was built without DPDK"
    return ""


def make_hosts(archs, ndpdk=1, base=17):
    """Test hosts for the clients ('tcp': every kernel-socket arch; 'dpdk', 'dpdk2' ...: one
    per dpdk server running at once, each takes over its own pair), or {} without root.
    base: the first /30's index (198.18.<base>.0/30) and the names' number; two runs at once
    need bases at least 4 apart (a host's create() removes a namespace of the same name)."""
    ok, why = netns.available()
    if not ok:
        print(f"note: {why}: clients and the log peer run on loopback", file=sys.stderr)
        return {}
    tag = "t1" if base == 17 else str(base)
    hosts = {"peer": netns.TestHost(f"kv{tag}peer", index=base).create(),
             "tcp": netns.TestHost(f"kv{tag}cli", index=base + 1).create()}
    for i in range(ndpdk if "dpdk" in archs else 0):
        h = hosts[dpdk_key(i)] = netns.TestHost(f"kv{tag}dp" + (str(i + 1) if i else ""), index=base + 2 + i).create()
        h.tx_checksum_offload_off()  # or every reply built from an offloaded frame is dropped
        h.set_neighbour(h.local_addr, h.mac())  # the bypassed end answers no ARP
    return hosts


def dpdk_key(i):
    return "dpdk" + (str(i + 1) if i else "")


def start_peer(hosts, d):
    """A log peer for one node (a peer holds one node's log: a fresh node that starts
    in remote mode takes the log, and identity, it finds there). Returns (Node, addr)."""
    repl = common.free_port()
    if hosts:
        h = hosts["peer"]
        peer = Node(netns=h.name, bind=h.addr, port=0, threads=1, repl_port=repl, data_dir=d, durability="none",
                    repl_bind=h.addr, repl_secret_file=common.repl_secret())
        addr = f"{h.addr}:{repl}"
    else:
        peer = Node(port=0, threads=1, repl_port=repl, data_dir=d, durability="none",
                    repl_secret_file=common.repl_secret())
        addr = f"127.0.0.1:{repl}"
    return peer.start(timeout=30), addr


def pause_idle_lcores(servers, active=None):
    """A dpdk lcore busy-polls a whole CPU even with nothing to do: every dpdk server but the
    one being measured (active: its (row, unit)) is stopped (SIGSTOP), so that it takes no CPU
    from the other servers' points; SIGCONT resumes it for its own."""
    for key, n in servers.items():
        if key[1] == "dpdk" and n.pid:
            os.kill(n.pid, signal.SIGCONT if key == active else signal.SIGSTOP)


def measure(args):
    # a SIGTERM unwinds the finally blocks below: servers stopped, namespaces removed
    old_term = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    hosts = {}
    sweep = None
    us = units(args)
    try:
        # before any thread that a fork could inherit a lock from
        hosts = make_hosts(args.archs, max(len(g) for g in groups(args.rows)), args.netns_base)
        sweep = common.Sweep(args.csv, ("row", "arch", "round"), len(args.rows) * len(us) * args.rounds, args,
                             selected=lambda r: r["row"] in args.rows and r["arch"] in us, desc="table 1")
        shares = "servers, clients" + (", log peers" if any("L" in r for r in args.rows) else "")

        def target(unit, i):
            """Where unit's clients run; i: the unit's row within its group (its dpdk pair)."""
            udp = unit in ("udp", "dpdk")
            if unit == "dpdk":
                h = hosts[dpdk_key(i)]
                return Target(h, h.local_addr, True, args)
            return Target(hosts.get("tcp"), hosts["tcp"].local_addr if hosts else "127.0.0.1", udp, args)

        for group, points in schedule(args.rows, us, args.rounds):
            servers, peers, dirs = {}, [], []
            todo = list(dict.fromkeys((row, u) for rnd, row, u in points if not sweep.has(row=row, arch=u, round=rnd)))
            try:
                for row, u in todo:
                    i = group.index(row)
                    d = tempfile.mkdtemp(prefix=f"kv-t1-{row}-")
                    dirs.append(d)
                    bind = hosts["tcp"].local_addr if hosts and u != "dpdk" else "127.0.0.1"
                    peer_addr = None
                    if "L" in row:
                        dirs.append(tempfile.mkdtemp(prefix=f"kv-t1-{row}-peer-"))
                        peer, peer_addr = start_peer(hosts, dirs[-1])
                        peers.append(peer)
                    n = Node(bind=bind, port=0, data_dir=d,
                             **settings_for(row, u, args, peer_addr, hosts.get(dpdk_key(i))))
                    servers[(row, u)] = n.start(60)
                    # warm up: a pass of the key space, at most --warmup-seconds (D:
                    # --full-warmup-seconds, it must fill memory); the UDP front ends one datagram
                    # in flight per socket (see the README on AF_XDP bursts)
                    udp = u in ("udp", "dpdk")
                    port = n.udp_port if udp else n.port
                    target(u, i).bench(port, 1 if udp else 16, args.conns if udp else 50, args.keyspace,
                                       args.keyspace, args.value_size,
                                       args.full_warmup_seconds if "D" in row else args.warmup_seconds)
                    pause_idle_lcores(servers)
                for rnd, row, u in points:
                    if sweep.has(row=row, arch=u, round=rnd):
                        continue
                    n = servers[(row, u)]
                    pause_idle_lcores(servers, (row, u))
                    udp = u in ("udp", "dpdk")
                    port = n.udp_port if udp else n.port
                    blocks0 = None
                    if "D" in row:
                        # A D server sat idle while the group's other units were measured and its
                        # flusher cleaned memory meanwhile: a point started on that evicts clean keys
                        # for free. Insert a memory's worth of keys first (unmeasured) so memory is
                        # full and dirty again, then count the blocks the point itself writes.
                        d0 = persistence(n)
                        target(u, group.index(row)).bench(port, 1 if udp else 16, args.conns if udp else 50,
                                                          max(1000, int(d0.get("memory_keys", 0)) or args.keyspace),
                                                          args.keyspace, args.value_size, args.rewarm_seconds)
                        blocks0 = int(persistence(n).get("datafile_blocks_written", 0))
                    busy0 = int(n.stats()["udp_busy_us"]) if udp else 0
                    cpu0 = common.cpu_seconds(n.pid)
                    r = target(u, group.index(row)).bench(port, args.pipeline, args.conns, args.requests,
                                                          args.keyspace, args.value_size, args.point_seconds)
                    cpu = common.cpu_seconds(n.pid) - cpu0
                    busy = int(n.stats()["udp_busy_us"]) - busy0 if udp else ""
                    # D rows: blocks the flusher wrote during the point (0: it evicted clean keys only)
                    blocks = int(persistence(n).get("datafile_blocks_written", 0)) - blocks0 if blocks0 is not None else ""
                    sweep.add({"round": rnd, "row": row, "arch": u, "pipeline": args.pipeline,
                               "conns": args.conns, "requests": r["requests"],
                               "throughput": round(r["throughput"]), "p50_us": round(r["lat_p50_us"], 1),
                               "p99_us": round(r["lat_p99_us"], 1), "timeouts": r.get("timeouts", 0),
                               "server_cpu_s": round(cpu, 3),
                               "server_cpu_us_per_req": round(cpu * 1e6 / max(1, r["requests"]), 2),
                               "udp_busy_us_per_req": round(busy / max(1, r["requests"]), 3) if udp else "",
                               "blocks_written": blocks,
                               "net": "netns" if hosts else "loopback",
                               "workers": u.rsplit("-", 1)[1] if kind(u) == "threadpool" else "",
                               "group": "+".join(group), "client_threads": args.client_threads,
                               "client_cpus": args.client_cpus, "ncpu": os.cpu_count(), "shares": shares},
                              f"[{row:4s} round {rnd + 1}/{args.rounds}] {u:16s} {r['throughput']:>10,.0f} "
                              f"SET/s p99 {r['lat_p99_us']:8.0f} us cpu {cpu:5.2f} s")
            finally:
                for key, n in servers.items():
                    if key[1] == "dpdk" and n.pid:
                        os.kill(n.pid, signal.SIGCONT)  # a stopped process cannot act on its SIGTERM
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


def rounds_of(rows, field="throughput"):
    """{(row, unit): [value of each round]}."""
    out = {}
    for r in rows:
        out.setdefault((r["row"], r["arch"]), []).append(float(r[field]))
    return out


def by_round(rows, row, unit, field="throughput"):
    """{round: value} of one row's unit: CSV order is not round order after --resume/--rerun."""
    return {str(r["round"]): float(r[field]) for r in rows if r["row"] == row and r["arch"] == unit}


def ratios_to_nh(rows, series, ratio_rows, best):
    """{(row, series): [X/NH of each round both have]}: round k's X over round k's NH, paired
    by the round column (CSV order is not round order after --resume/--rerun); the thread
    pool's series pairs the best pool size of X with the best of NH."""
    out = {}
    for u in series:
        nh = by_round(rows, "NH", best.get("NH") if u == "threadpool" else u)
        for row in ratio_rows:
            a = by_round(rows, row, best.get(row) if u == "threadpool" else u)
            x = [a[k] / nh[k] for k in sorted(a) if k in nh and nh[k]]
            if x:
                out[(row, u)] = x
    return out


def best_pool(rows):
    """{row: the thread-pool unit with the highest median in that row} (the pool at its best)."""
    med = medians(rows)
    best = {}
    for (row, u), v in med.items():
        if kind(u) == "threadpool" and (row not in best or v > med[(row, best[row])]):
            best[row] = u
    return best


def shown_units(rows):
    """The units measured, in the table's order: pool sizes ascending, then the other archs."""
    seen = {r["arch"] for r in rows}
    pools = sorted((u for u in seen if kind(u) == "threadpool"), key=lambda u: int(u.rsplit("-", 1)[1])
                   if "-" in u else 0)
    return pools + [a for a in ARCHS if a != "threadpool" and a in seen]


def setup_title(rows):
    r = rows[0] if rows else {}
    pinned = f"client pinned to CPU {r['client_cpus']}" if r.get("client_cpus") else ""
    net = "over a veth pair" if r.get("net") == "netns" else "on loopback"
    return (f"kvstore, P{r.get('pipeline', 1)}, {r.get('conns', '?')} conns, clients {net}\n"
            + common.cores_note(pinned, r.get("shares") or "servers, clients, log peers"))


def report(rows):
    med = medians(rows)
    rnd = rounds_of(rows)
    cpu = medians(rows, "server_cpu_us_per_req")
    us = shown_units(rows)
    best = best_pool(rows)
    print("req/s: median [min-max] of " + str(max(len(v) for v in rnd.values())) + " rounds")
    print(f"{'':17s}" + "".join(f"{r:>24s}" for r in ROWS))

    def cell(row, u):
        v = rnd.get((row, u))
        return f"{med[(row, u)]:>10,.0f} [{min(v) / 1e3:,.0f}-{max(v) / 1e3:,.0f}K]" if v else f"{'-':>23s}"

    if best:
        print("threadpool best: in each row, the pool size with the highest median of rounds")
        print(f"{'threadpool best':17s}" + "".join(f" {cell(r, best[r]) if r in best else '-':>23s}" for r in ROWS))
        print(f"{'  (workers)':17s}" + "".join(f"{best[r].rsplit('-', 1)[-1] if r in best else '-':>24s}"
                                               for r in ROWS))
    for u in us:
        print(f"{u:17s}" + "".join(f" {cell(r, u)}" for r in ROWS))
    for name, vals in PAPER.items():
        print(f"{'paper ' + name:17.17s}" + "".join(f"{v:>24,}" for v in vals))
    print("server CPU us/request (median)")
    for u in us:
        print(f"{u:17s}" + "".join(f"{cpu[(r, u)]:>24.2f}" if (r, u) in cpu else f"{'-':>24s}" for r in ROWS))
    busy = medians([r for r in rows if r.get("udp_busy_us_per_req") not in (None, "")], "udp_busy_us_per_req")
    if busy:
        print("UDP worker busy time, us/request (median; a dpdk lcore busy-polls, so its CPU time is all of it)")
        for a in ("udp", "dpdk"):
            if any(k[1] == a for k in busy):
                print(f"{a:17s}" + "".join(f"{busy.get((r, a), 0):>24.3f}" for r in ROWS))
    idle = [r for r in rows if "D" in r["row"] and str(r.get("blocks_written")) == "0"]
    if idle:  # a D point whose flusher wrote nothing evicted clean keys only: not memory-full inserts
        print("D points that wrote no data-file block: " + ", ".join(
            f"{r['row']} {r['arch']} round {r['round']}" for r in idle))
    # N and NH run side by side (one group): their ratio is paired by round
    side = any(r.get("group") == "+".join(TOGETHER) for r in rows)
    how = "side by side, same round" if side else "same round index, rows measured apart"
    for u in us:
        per = common.paired_rounds(rows, "row", "N", "NH", arch=u)
        if per:
            print(f"{u:17s} N/NH ({how}) {statistics.median(per):.2f} [{min(per):.2f}-{max(per):.2f}]")
    for u in us:
        nh = med.get(("NH", u))
        if nh and any((r, u) in med for r in ("NHD", "NHL", "NHDL")):
            print(f"{u:17s} ratios to NH (medians): " + ", ".join(
                f"{r}/NH {med[(r, u)] / nh:.2f}" for r in ("NHD", "NHL", "NHDL") if (r, u) in med))
    # ratios of points measured side by side (same row and round), then their median:
    # steadier than a ratio of medians when the machine's speed drifts between rounds
    for u in us:
        if kind(u) == "threadpool":
            continue
        pairs = [(row, common.paired(rows, "arch", u, best[row], row=row)) for row in ROWS if row in best]
        pairs = [(row, x) for row, x in pairs if x is not None]
        if pairs:
            print(f"{u} / best threadpool (paired): " + ", ".join(f"{r} {x:.2f}x" for r, x in pairs))
    if "udp" in us and "dpdk" in us:
        pairs = [(row, common.paired(rows, "arch", "dpdk", "udp", row=row)) for row in ROWS]
        print("dpdk / udp (paired): " + ", ".join(f"{r} {x:.2f}x" for r, x in pairs if x is not None))
    print("paper mTCP / LinuxTCP: " + ", ".join(f"{r} {m / l:.2f}x" for r, m, l in
                                                zip(ROWS, PAPER["mTCP/DPDK pollers"], PAPER["LinuxTCP thread pool"])))


def draw(rows, path):
    plt = common.pyplot()
    rnd = rounds_of(rows)
    best = best_pool(rows)
    others = [u for u in shown_units(rows) if kind(u) != "threadpool"]
    series = (["threadpool"] if best else []) + others
    values = {(row, u): rnd[(row, u)] for row in ROWS for u in others if (row, u) in rnd}
    values.update({(row, "threadpool"): rnd[(row, u)] for row, u in best.items()})
    note = {(row, "threadpool"): f"{u.rsplit('-', 1)[-1]} w" for row, u in best.items() if "-" in u}
    labels = {"threadpool": "threadpool (best pool size by median of rounds, workers above)"}
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.2), gridspec_kw={"width_ratios": [3, 2]})
    ax = axes[0]
    xs = common.bar_chart(ax, ROWS, series, values, labels=labels, annotate=note)
    # the paper's two columns, over the bars they correspond to
    lin, mtcp = PAPER["LinuxTCP thread pool"], PAPER["mTCP/DPDK pollers"]
    bypass = "dpdk" if "dpdk" in xs else ("poller-direct" if "poller-direct" in xs else None)
    if "threadpool" in xs:
        common.paper_marks(ax, [xs["threadpool"].get(r) for r in ROWS], lin, label="paper: LinuxTCP thread pool")
    if bypass:
        common.paper_marks(ax, [xs[bypass].get(r) for r in ROWS], mtcp, label="paper: mTCP/DPDK pollers",
                           color="dimgrey")
    ax.set_yscale("log")
    ax.set_ylabel("inserts/s (median, bars: min-max of rounds)")
    ax.set_title(setup_title(rows), fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    # right: what durability keeps of the in-memory rate, X/NH per round
    ax = axes[1]
    ratio_rows = ["N", "NHD", "NHL", "NHDL"]
    rv = ratios_to_nh(rows, series, ratio_rows, best)
    xs = common.bar_chart(ax, ratio_rows, series, rv, labels=labels)
    for name, vals, col in (("LinuxTCP", lin, "black"), ("mTCP/DPDK", mtcp, "dimgrey")):
        u = "threadpool" if name == "LinuxTCP" else bypass
        if u in xs:
            common.paper_marks(ax, [xs[u].get(r) for r in ratio_rows],
                               [vals[ROWS.index(r)] / vals[1] for r in ratio_rows], label=f"paper: {name}",
                               color=col)
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    ax.set_ylabel("X / NH (pool: best size of X over best of NH; bars: min-max)", fontsize=8)
    side = any(r.get("group") == "+".join(TOGETHER) for r in rows)
    ax.set_title("what each row keeps of the in-memory rate, round by round\n(paper's pollers: NHD/NH 0.71, "
                 f"NHL/NH 0.82; {'N and NH measured side by side' if side else 'rows measured apart'})",
                 fontsize=9)
    common.save_figure(fig, path)


def add_args(ap):
    ap.add_argument("--rows", nargs="+", default=ROWS, choices=ROWS)
    ap.add_argument("--archs", nargs="+", default=ARCHS, choices=ARCHS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200_000, help="per point, or fewer if --point-seconds pass first")
    ap.add_argument("--point-seconds", type=float, default=5.0, help="a point's time bound")
    ap.add_argument("--warmup-seconds", type=float, default=20.0,
                    help="a server's warm-up pass over the key space ends after this long (D rows: "
                         "--full-warmup-seconds)")
    ap.add_argument("--full-warmup-seconds", type=float, default=120.0,
                    help="the D rows' first warm-up pass (it must fill memory) ends after this long")
    ap.add_argument("--rewarm-seconds", type=float, default=10.0,
                    help="bound of the D rows' unmeasured re-fill right before each point (a memory's worth of "
                         "new inserts, so the point starts with memory full and dirty)")
    ap.add_argument("--keyspace", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=85)
    ap.add_argument("--conns", type=int, default=100)
    ap.add_argument("--pipeline", type=int, default=1)
    ap.add_argument("--pollers", type=int, default=2)
    ap.add_argument("--workers", type=int, nargs="+", default=[8, 32, 128, 512],
                    help="thread-pool sizes, each measured (the table reports the best per row)")
    ap.add_argument("--udp-workers", type=int, default=1, help="threads (udp) or lcores (dpdk) of the UDP front ends")
    ap.add_argument("--client-threads", type=int, default=2, help="kvstore bench threads")
    ap.add_argument("--client-cpus", default="", help="pin the client to these CPUs (taskset -c), e.g. 0")
    ap.add_argument("--full-memory", default="48mb", help="--max-memory of the D rows")
    ap.add_argument("--netns-base", type=int, default=17,
                    help="the test hosts' first 198.18.X.0/30 (X = this, +1, +2 ...); another run at once needs "
                         "another base, 4 or more apart")
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
