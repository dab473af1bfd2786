"""How connections reach pollers: SO_REUSEPORT listeners vs accept-and-hand-off.

reuseport: every poller has its own listener on the port and the kernel hashes
each new connection to one of them (no cross-thread step, but the split of a
small number of connections can be uneven). handoff: poller 0 accepts and deals
connections round-robin through a queue + eventfd (exact balance, one extra
wake-up per connection). Measured, alternating A B A B:
  - steady load: kvstore bench, 50 connections, SET, pipeline 1 and 16;
  - connection churn: redis-benchmark -k 0 (a new connection per request);
  - balance: commands served per poller (INFO pollers).

    kvstore experiment run kv_accept_modes [-- --rounds 3]   -> OUT/kv_accept_modes.{csv,png}
"""
import subprocess
import sys

from kvstore import Node
from kvstore import bench as kvbench
from kvstore.experiments import common

NAME = "kv_accept_modes"
QUICK = ["--rounds", "1", "--requests", "20000", "--churn", "1000"]
MODES = ("reuseport", "handoff")


def poller_commands(node):
    st = node.stats()
    return [p["commands"] for p in st["poller_stats"]]


def churn(port, n):
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-t", "ping_mbulk", "-k", "0", "-c", "20",
                          "-n", str(n), "--csv"], capture_output=True, text=True, timeout=300, check=True).stdout
    line = [ln for ln in out.splitlines() if ln.startswith('"PING_MBULK"')][-1]
    return float(line.split(",")[1].strip('"'))


def measure(args):
    rows = []
    for rnd in range(args.rounds):
        for mode in MODES:
            with Node(port=0, threads=args.threads, accept=mode, durability="none") as node:
                for p in (1, 16):
                    before = poller_commands(node)
                    cpu0 = common.cpu_seconds(node.pid)
                    n = args.requests if p > 1 else args.requests // 4
                    r = kvbench.run(port=node.port, pipeline=p, conns=50, requests=n, ratio="1:0")
                    cpu = common.cpu_seconds(node.pid) - cpu0
                    per = [a - b for a, b in zip(poller_commands(node), before)]
                    imbalance = max(per) / (sum(per) / len(per))
                    rows.append({"round": rnd, "mode": mode, "load": f"SET P{p}", "throughput": round(r["throughput"]),
                                 "p99_us": round(r["lat_p99_us"], 1), "server_cpu_s": round(cpu, 3),
                                 "max_over_mean_poller_load": round(imbalance, 3)})
                    common.log(f"round {rnd} {mode:9s} SET P{p:<2d} {r['throughput']:>11,.0f} req/s  "
                               f"p99 {r['lat_p99_us']:6.0f} us  per-poller commands {per} (max/mean {imbalance:.2f})")
                rate = churn(node.port, args.churn)
                rows.append({"round": rnd, "mode": mode, "load": "new connection per request",
                             "throughput": round(rate)})
                common.log(f"round {rnd} {mode:9s} churn      {rate:>11,.0f} conn+req/s")
            common.write_csv(args.csv, rows)
    return rows


def medians(rows):
    """{(load, mode): median throughput}."""
    return common.medians(rows, ("load", "mode"))


def report(rows):
    med = medians(rows)
    for load in dict.fromkeys(r["load"] for r in rows):
        a, b = (med[(load, m)] for m in MODES)
        print(f"{load:28s} reuseport {a:>11,.0f}  handoff {b:>11,.0f}  ratio {a / b:.2f}")


def draw(rows, path):
    plt = common.pyplot()
    med = medians(rows)
    loads = list(dict.fromkeys(r["load"] for r in rows))
    fig, axes = plt.subplots(1, len(loads), figsize=(4.5 * len(loads), 4), squeeze=False)
    for ax, load in zip(axes[0], loads):
        ax.bar(list(MODES), [med[(load, m)] for m in MODES], color=["#1f77b4", "#ff7f0e"])
        ax.set_title(load)
        ax.set_ylabel("requests/s (median)")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("kvstore: SO_REUSEPORT listeners vs accept-and-hand-off (2 pollers, 2-core VM)")
    common.save_figure(fig, path)


def add_args(ap):
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="kvstore poller threads")
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--churn", type=int, default=20_000, help="requests in the connection-churn run")


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
