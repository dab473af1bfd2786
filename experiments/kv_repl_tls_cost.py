"""What --repl-tls costs: remote-mode SET throughput and server CPU per request, with the
replication link in plain TCP (HMAC handshake + per-frame MAC) and inside mutual TLS (the
same MACs inside it).

Each variant is a remote-mode node shipping its log to a receiver-only peer (durability
none), as p000_durability's remote row; the load is `kvstore bench` SET (85-byte values, 50
connections, 2 client threads) at pipeline 1 and 16. Every round runs both variants, the order
swapped each round (A B, B A, ...); medians with min-max over the rounds, server CPU (node +
peer, all threads, from /proc) per request. Certificates: kvstore.tlscerts (the `openssl`
command).

    kvstore experiment run kv_repl_tls_cost            # -> OUT/kv_repl_tls_cost.{csv,png}
    kvstore experiment run kv_repl_tls_cost --quick
"""
import shutil
import statistics
import sys
import tempfile
import time

from kvstore import Node
from kvstore import bench as kvbench
from kvstore.experiments import common
from kvstore.tlscerts import make_certs

NAME = "kv_repl_tls_cost"
QUICK = ["--rounds", "2", "--requests", "50000"]
VARIANTS = ("plain", "repl-tls")
LOADS = ((1, "SET P1"), (16, "SET P16"))


class Pair:
    """A remote-mode node and its receiver-only peer, the link plain or --repl-tls."""

    def __init__(self, variant, certs):
        self.dirs = [tempfile.mkdtemp(prefix="kv-repltls-"), tempfile.mkdtemp(prefix="kv-repltls-peer-")]
        tls = {}
        if variant == "repl-tls":
            tls = dict(repl_tls=True, tls_cert_file=certs["server_crt"], tls_key_file=certs["server_key"],
                       tls_ca_cert_file=certs["ca_crt"])
        repl = common.free_port()
        self.peer = Node(port=0, threads=1, repl_port=repl, data_dir=self.dirs[1], durability="none",
                         repl_secret_file=common.repl_secret(), **tls).start()
        self.node = Node(port=0, threads=1, data_dir=self.dirs[0], durability="remote", peer=f"127.0.0.1:{repl}",
                         repl_secret_file=common.repl_secret(), init=True, data_file=False, **tls).start()
        deadline = time.monotonic() + 10  # until the peer has acknowledged the (empty) log
        while self.node.stats().get("log_peer_degraded", 1) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.port = self.node.port

    def cpu(self):
        return common.cpu_seconds(self.node.pid) + common.cpu_seconds(self.peer.pid)

    def stop(self):
        self.node.stop()
        self.peer.stop()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


def measure(args):
    certs = make_certs(tempfile.mkdtemp(prefix="kv-repltls-certs-"))
    rows = []
    for rnd in range(args.rounds):
        for variant in (VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]):
            p = Pair(variant, certs)
            try:
                for pipe, load in LOADS:
                    n = args.requests if pipe > 1 else args.requests // 4
                    cpu0 = p.cpu()
                    r = kvbench.run(port=p.port, threads=2, conns=50, pipeline=pipe, value_size=85,
                                    keyspace=100_000, ratio="1:0", requests=n)
                    cpu = p.cpu() - cpu0
                    rows.append({"round": rnd, "variant": variant, "load": load,
                                 "throughput": round(r["throughput"]),
                                 "cpu_us_per_request": round(cpu / max(r["requests"], 1) * 1e6, 3)})
                    common.log(f"round {rnd} {variant:8s} {load} {r['throughput']:>11,.0f} req/s "
                               f"{rows[-1]['cpu_us_per_request']:6.2f} us CPU/request")
            finally:
                p.stop()
            common.write_csv(args.csv, rows)
    return rows


def spread(rows, load, variant, field):
    v = [float(r[field]) for r in rows if r["load"] == load and r["variant"] == variant]
    return statistics.median(v), min(v), max(v)


def report(rows):
    print(f"{'load':8s} {'variant':9s} {'req/s median (min-max)':>30s} {'CPU us/request median (min-max)':>34s}")
    for _, load in LOADS:
        for variant in VARIANTS:
            t, c = spread(rows, load, variant, "throughput"), spread(rows, load, variant, "cpu_us_per_request")
            print(f"{load:8s} {variant:9s} {t[0]:>12,.0f} ({t[1]:,.0f}-{t[2]:,.0f})"
                  f"   {c[0]:10.2f} ({c[1]:.2f}-{c[2]:.2f})")
        ratio = common.paired(rows, "variant", "repl-tls", "plain", load=load)
        print(f"{load:8s} repl-tls/plain throughput, paired median: {ratio:.3f}")


def draw(rows, path):
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ax, (field, label) in zip(axes, (("throughput", "SET req/s"), ("cpu_us_per_request", "server CPU us/request"))):
        for i, variant in enumerate(VARIANTS):
            s = [spread(rows, load, variant, field) for _, load in LOADS]
            ax.bar([j + (i - 0.5) * 0.38 for j in range(len(LOADS))], [m for m, _, _ in s], 0.38,
                   yerr=[[m - lo for m, lo, _ in s], [hi - m for m, _, hi in s]], capsize=3, label=variant)
        ax.set_xticks(range(len(LOADS)))
        ax.set_xticklabels([load for _, load in LOADS])
        ax.set_ylabel(label + " (median, min-max)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
    fig.suptitle("kvstore remote mode: the replication link plain vs --repl-tls, alternated rounds", fontsize=9)
    common.save_figure(fig, path)


def add_args(ap):
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=400_000, help="requests per P16 load (P1: a quarter)")


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
