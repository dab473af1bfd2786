"""How connections reach pollers: SO_REUSEPORT listeners vs accept-and-hand-off.

reuseport: every poller has its own listener on the port and the kernel hashes
each new connection to one of them (no cross-thread step, but the split of a
small number of connections can be uneven). handoff: poller 0 accepts and deals
connections round-robin through a queue + eventfd (exact balance, one extra
wake-up per connection). Measured, alternating A B A B:
  - steady load: kvstore bench, 50 connections, SET, pipeline 1 and 16;
  - connection churn: redis-benchmark -k 0 (a new connection per request);
  - balance: commands served per poller (INFO pollers).

    python experiments/accept_modes.py [--rounds 3]   -> results/accept_modes.{csv,png}
"""
import argparse
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from kvstore import Node  # noqa: E402
from kvstore import bench as kvbench  # noqa: E402

CSV = os.path.join(common.RESULTS, "accept_modes.csv")
PNG = os.path.join(common.RESULTS, "accept_modes.png")


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
        for mode in ("reuseport", "handoff"):
            with Node(port=0, threads=args.threads, accept=mode) as node:
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
                    print(f"round {rnd} {mode:9s} SET P{p:<2d} {r['throughput']:>11,.0f} req/s  p99 {r['lat_p99_us']:6.0f} us"
                          f"  per-poller commands {per} (max/mean {imbalance:.2f})", flush=True)
                rate = churn(node.port, args.churn)
                rows.append({"round": rnd, "mode": mode, "load": "new connection per request",
                             "throughput": round(rate)})
                print(f"round {rnd} {mode:9s} churn      {rate:>11,.0f} conn+req/s", flush=True)
            common.write_csv(CSV, rows)
    return rows


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = list(dict.fromkeys(r["load"] for r in rows))
    fig, axes = plt.subplots(1, len(loads), figsize=(4.5 * len(loads), 4))
    for ax, load in zip(axes, loads):
        meds = [statistics.median(float(r["throughput"]) for r in rows if r["load"] == load and r["mode"] == m)
                for m in ("reuseport", "handoff")]
        ax.bar(["reuseport", "handoff"], meds, color=["#1f77b4", "#ff7f0e"])
        ax.set_title(load)
        ax.set_ylabel("requests/s (median)")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("kvstore: SO_REUSEPORT listeners vs accept-and-hand-off (2 pollers, 2-core VM)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="kvstore poller threads")
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--churn", type=int, default=20_000, help="requests in the connection-churn run")
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    rows = common.read_csv(CSV) if args.plot_only else measure(args)
    for load in dict.fromkeys(r["load"] for r in rows):
        med = {m: statistics.median(float(r["throughput"]) for r in rows if r["load"] == load and r["mode"] == m)
               for m in ("reuseport", "handoff")}
        print(f"{load:28s} reuseport {med['reuseport']:>11,.0f}  handoff {med['handoff']:>11,.0f}  "
              f"ratio {med['reuseport'] / med['handoff']:.2f}")
    plot(rows, PNG)


if __name__ == "__main__":
    main()
