"""Paper 000, Table 1: the same store behind different request-handling architectures,
for five workloads of ~85-byte inserts.

Rows (the paper's columns):
  N     network only: SET answers +OK without touching the table (--network-only)
  NH    + the hash table (durability none)
  NHD   + memory full: --max-memory far below the data with the BOSC data file, so an
        insert waits until the flusher has made room
  NHL   + remote log: durability remote, the log peer on a test host in its own network
        namespace (a veth pair, 198.18.0.0/15), so log batches cross a (virtual) network
  NHDL  all of them
Architectures: threadpool (a pool of workers, one blocking request at a time: the
paper's LinuxTCP), and the per-core pollers with each EPOLLOUT policy (strict,
flexpoll, direct). The paper's mTCP/DPDK column has no counterpart here (no DPDK
poller yet): the pollers are the kernel-socket version of that design.

Load: kvstore bench, SET, 85-byte values, fresh random keys (1 M key space), --conns
connections at pipeline --pipeline; servers of a row measured in alternation
(A B C D, A B C D, ...), medians of --rounds. Server CPU time is recorded too.
Needs root for the namespace (without it NHL/NHDL use a peer on loopback, and say so).

    python experiments/table1_archs.py        -> results/table1_archs.{csv,png}
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from kvstore import Node, netns  # noqa: E402

CSV = os.path.join(common.RESULTS, "table1_archs.csv")
PNG = os.path.join(common.RESULTS, "table1_archs.png")


def name_outputs(tag):
    """--tag X writes table1_archs_X.{csv,png} (another load, kept beside the default one)."""
    global CSV, PNG
    if tag:
        CSV = os.path.join(common.RESULTS, f"table1_archs_{tag}.csv")
        PNG = os.path.join(common.RESULTS, f"table1_archs_{tag}.png")
ROWS = ["N", "NH", "NHD", "NHL", "NHDL"]
ARCHS = ["threadpool", "poller-strict", "poller-flexpoll", "poller-direct"]
PAPER = {"LinuxTCP thread pool": [799_706, 540_093, 417_006, 300_796, 250_405],
         "mTCP/DPDK pollers": [2_208_262, 897_920, 634_251, 740_663, 624_477]}


def settings_for(row, arch, args, peer_addr):
    s = {"threads": args.workers if arch == "threadpool" else args.pollers}
    if arch == "threadpool":
        s["arch"] = "threadpool"
    else:
        s["poll_policy"] = arch.split("-")[1]
    if row == "N":
        s["network_only"] = True
    if "D" in row:
        s.update(data_file=True, max_memory=args.full_memory)
    if "L" in row:
        s.update(durability="remote", peer=peer_addr, peer_startup_wait_ms=20000)
    return s


def measure(args):
    host = None
    ok, why = netns.available()
    peer_dir = tempfile.mkdtemp(prefix="kv-t1-peer-")
    repl = common.free_port()
    rows = []
    peer = None
    try:
        if ok:
            host = netns.TestHost("kvt1peer", index=17).create()
            peer = Node(netns=host.name, bind=host.addr, port=0, threads=1, repl_port=repl, data_dir=peer_dir)
            peer_addr = f"{host.addr}:{repl}"
        else:
            print(f"note: {why}: the log peer runs on loopback", file=sys.stderr)
            peer = Node(port=0, threads=1, repl_port=repl, data_dir=peer_dir)
            peer_addr = f"127.0.0.1:{repl}"
        peer.start(timeout=30)
        for row in args.rows:
            servers = {}
            dirs = []
            try:
                for arch in args.archs:
                    d = tempfile.mkdtemp(prefix=f"kv-t1-{row}-")
                    dirs.append(d)
                    servers[arch] = Node(port=0, data_dir=d, **settings_for(row, arch, args, peer_addr)).start(30)
                    # warm up: a full pass of the key space (fills memory for D)
                    common.run_kvstore_bench(servers[arch].port, "resp", "SET", 16, 50, args.keyspace,
                                             args.keyspace, args.value_size, 2)
                for rnd in range(args.rounds):
                    order = args.archs if rnd % 2 == 0 else list(reversed(args.archs))
                    for arch in order:
                        n = servers[arch]
                        cpu0 = common.cpu_seconds(n.pid)
                        r = common.run_kvstore_bench(n.port, "resp", "SET", args.pipeline, args.conns, args.requests,
                                                     args.keyspace, args.value_size, 2)
                        cpu = common.cpu_seconds(n.pid) - cpu0
                        rows.append({"round": rnd, "row": row, "arch": arch, "pipeline": args.pipeline,
                                     "conns": args.conns, "requests": args.requests,
                                     "throughput": round(r["throughput"]), "p99_us": round(r["p99_us"], 1),
                                     "server_cpu_s": round(cpu, 3), "peer": "netns" if host else "loopback"})
                        common.write_csv(CSV, rows)
                        print(f"[{row:4s} round {rnd + 1}/{args.rounds}] {arch:16s} {r['throughput']:>10,.0f} SET/s "
                              f"p99 {r['p99_us']:8.0f} us cpu {cpu:5.2f} s", file=sys.stderr, flush=True)
            finally:
                for n in servers.values():
                    n.stop()
                for d in dirs:
                    shutil.rmtree(d, ignore_errors=True)
    finally:
        if peer:
            peer.stop()
        if host:
            host.close()
        shutil.rmtree(peer_dir, ignore_errors=True)
    return rows


def medians(rows):
    out = {}
    for r in rows:
        out.setdefault((r["row"], r["arch"]), []).append(float(r["throughput"]))
    return {k: statistics.median(v) for k, v in out.items()}


def report(rows):
    med = medians(rows)
    archs = [a for a in ARCHS if any(k[1] == a for k in med)]
    print("req/s (median) " + "".join(f"{r:>12s}" for r in ROWS))
    for a in archs:
        print(f"{a:15s}" + "".join(f"{med.get((r, a), 0):>12,.0f}" for r in ROWS))
    for name, vals in PAPER.items():
        print(f"{'paper ' + name:15.15s}" + "".join(f"{v:>12,}" for v in vals))
    for a in archs:
        nh = med.get(("NH", a))
        if nh:
            print(f"{a:15s} ratios to NH: " + ", ".join(
                f"{r}/NH {med[(r, a)] / nh:.2f}" for r in ("NHD", "NHL", "NHDL") if (r, a) in med))
    tp = {r: med.get((r, "threadpool")) for r in ROWS}
    for a in archs[1:]:
        print(f"{a} / threadpool: " + ", ".join(f"{r} {med[(r, a)] / tp[r]:.2f}x" for r in ROWS
                                                if tp.get(r) and (r, a) in med))
    print("paper mTCP / LinuxTCP: " + ", ".join(f"{r} {m / l:.2f}x" for r, m, l in
                                                zip(ROWS, PAPER["mTCP/DPDK pollers"], PAPER["LinuxTCP thread pool"])))


def plot(rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    med = medians(rows)
    archs = [a for a in ARCHS if any(k[1] == a for k in med)]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    w = 0.8 / len(archs)
    for i, a in enumerate(archs):
        axes[0].bar([x + i * w for x in range(len(ROWS))], [med.get((r, a), 0) for r in ROWS], w, label=a)
    axes[0].set_title("kvstore on this 2-core VM (kernel TCP, loopback + netns peer)", fontsize=10)
    w2 = 0.8 / len(PAPER)
    for i, (name, vals) in enumerate(PAPER.items()):
        axes[1].bar([x + i * w2 for x in range(len(ROWS))], vals, w2, label=name)
    axes[1].set_title("paper 000, Table 1 (4 machines, 10 GbE)", fontsize=10)
    for ax, ww in ((axes[0], w * len(archs)), (axes[1], w2 * len(PAPER))):
        ax.set_xticks([x + ww / 2 - (w if ax is axes[0] else w2) / 2 for x in range(len(ROWS))])
        ax.set_xticklabels(ROWS)
        ax.set_ylabel("inserts/s")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(PNG, dpi=110)
    print(f"wrote {PNG}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    ap.add_argument("--full-memory", default="48mb", help="--max-memory of the D rows")
    ap.add_argument("--tag", default="", help="suffix of the output files (for a second load)")
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    name_outputs(args.tag)
    rows = common.read_csv(CSV) if args.plot_only else measure(args)
    report(rows)
    plot(rows)


if __name__ == "__main__":
    main()
