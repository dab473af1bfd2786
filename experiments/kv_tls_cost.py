"""What TLS costs on the RESP port: kvstore and redis-server, each serving a plain port and a
TLS port (--tls-port; certificates made for the run by `openssl`, kvstore.tlscerts), loaded by
redis-benchmark (plain, and --tls) in the same run: SET, 50 connections, pipeline 1 and 16.
Servers alternate A B A B over the rounds; each point records throughput, p50/p99 and the
server's CPU time (user + system, /proc) per request. Reported: medians with their spread
(min-max over rounds) and, per round, TLS/plain of the same server (the paired ratio).
Both servers run with persistence off and tls-auth-clients no (the client certificate only
costs at the handshake, once per connection: redis-benchmark keeps its connections).

    kvstore experiment run kv_tls_cost [-- --rounds 3]   -> OUT/kv_tls_cost.{csv,png}
"""
import os
import statistics
import shutil
import sys
import tempfile

from kvstore import Node
from kvstore.experiments import common
from kvstore.tlscerts import make_certs

NAME = "kv_tls_cost"
QUICK = ["--rounds", "1", "--requests", "20000"]
SERVERS = ("kvstore", "redis")
TRANSPORTS = ("plain", "tls")
PIPELINES = (1, 16)


class Server:
    """One server under test with a plain and a TLS port: start() -> self, stop()."""

    def __init__(self, kind, certs, threads):
        self.kind, self.certs, self.threads = kind, certs, threads
        self.node = self.proc = None
        self.port = self.tls_port = self.pid = None

    def start(self):
        c = self.certs
        if self.kind == "kvstore":
            self.node = Node(port=0, threads=self.threads, durability="none", tls_port=0,
                             tls_cert_file=c["server_crt"], tls_key_file=c["server_key"],
                             tls_ca_cert_file=c["ca_crt"], tls_auth_clients="no").start(timeout=60)
            self.port, self.tls_port, self.pid = self.node.port, self.node.tls_port, self.node.pid
        else:
            self.port, self.tls_port = common.free_port(), common.free_port()
            self.proc = common.redis_server(self.port, "redis-server", "--tls-port", str(self.tls_port),
                                            "--tls-cert-file", c["server_crt"], "--tls-key-file", c["server_key"],
                                            "--tls-ca-cert-file", c["ca_crt"], "--tls-auth-clients", "no")
            self.proc.start()
            self.pid = self.proc.proc.pid
        return self

    def stop(self):
        if self.node:
            self.node.stop()
        if self.proc:
            self.proc.stop()


def bench(server, transport, pipeline, args):
    port = server.tls_port if transport == "tls" else server.port
    extra = ["--tls", "--cacert", server.certs["ca_crt"]] if transport == "tls" else []
    n = args.requests if pipeline > 1 else max(1000, args.requests // 4)
    cpu0 = common.cpu_seconds(server.pid)
    r = common.run_redis_benchmark(port, "SET", pipeline, args.conns, n, 100_000, args.value_size, extra=extra)
    cpu = common.cpu_seconds(server.pid) - cpu0
    return {**r, "requests": n, "server_cpu_s": round(cpu, 3), "cpu_us_per_req": round(cpu * 1e6 / n, 3)}


def measure(args):
    certs = make_certs(tempfile.mkdtemp(prefix="kv-tls-cost-"))
    rows = []
    for rnd in range(args.rounds):
        order = SERVERS if rnd % 2 == 0 else SERVERS[::-1]  # A B, then B A: drift hits both alike
        for kind in order:
            s = Server(kind, certs, args.threads).start()
            try:
                for p in PIPELINES:
                    for t in TRANSPORTS:
                        r = bench(s, t, p, args)
                        rows.append({"round": rnd, "server": kind, "transport": t, "pipeline": p,
                                     "throughput": round(r["throughput"]), "p50_us": round(r["p50_us"], 1),
                                     "p99_us": round(r["p99_us"], 1), "requests": r["requests"],
                                     "server_cpu_s": r["server_cpu_s"], "cpu_us_per_req": r["cpu_us_per_req"]})
                        common.log(f"round {rnd} {kind:7s} {t:5s} P{p:<2d} {r['throughput']:>11,.0f} req/s  "
                                   f"p99 {r['p99_us']:7.0f} us  server CPU {r['cpu_us_per_req']:.2f} us/req")
                        common.write_csv(args.csv, rows)
            finally:
                s.stop()
    return rows


def summary(rows):
    """{(server, transport, pipeline): (median, min, max) throughput and median CPU us/req}."""
    out = {}
    for r in rows:
        out.setdefault((r["server"], r["transport"], str(r["pipeline"])), []).append(r)
    return {k: {"median": statistics.median(float(r["throughput"]) for r in v),
                "min": min(float(r["throughput"]) for r in v), "max": max(float(r["throughput"]) for r in v),
                "cpu": statistics.median(float(r["cpu_us_per_req"]) for r in v)} for k, v in out.items()}


def report(rows):
    s = summary(rows)
    for p in PIPELINES:
        for kind in SERVERS:
            a, b = s[(kind, "plain", str(p))], s[(kind, "tls", str(p))]
            ratio = common.paired([r for r in rows if r["server"] == kind], "transport", "tls", "plain",
                                  pipeline=p)
            print(f"P{p:<2d} {kind:7s} plain {a['median']:>10,.0f} ({a['min']:,.0f}-{a['max']:,.0f}) "
                  f"{a['cpu']:.2f} us/req   tls {b['median']:>10,.0f} ({b['min']:,.0f}-{b['max']:,.0f}) "
                  f"{b['cpu']:.2f} us/req   tls/plain {ratio:.2f}")


def draw(rows, path):
    plt = common.pyplot()
    s = summary(rows)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"{k} {t}" for k in SERVERS for t in TRANSPORTS]
    width = 0.8 / len(labels)
    for i, (kind, t) in enumerate((k, t) for k in SERVERS for t in TRANSPORTS):
        xs = [j + i * width for j in range(len(PIPELINES))]
        pts = [s[(kind, t, str(p))] for p in PIPELINES]
        med = [x["median"] for x in pts]
        err = [[m - x["min"] for m, x in zip(med, pts)], [x["max"] - m for m, x in zip(med, pts)]]
        axes[0].bar(xs, med, width, yerr=err, capsize=3, label=labels[i], hatch="//" if t == "tls" else None)
        axes[1].bar(xs, [x["cpu"] for x in pts], width, label=labels[i], hatch="//" if t == "tls" else None)
    for ax, title in zip(axes, ("SET requests/s (median, min-max)", "server CPU time per request (us)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(PIPELINES))], [f"P{p}" for p in PIPELINES])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"TLS cost: kvstore vs redis-server, plain vs TLS, redis-benchmark, {os.cpu_count()}-core machine")
    common.save_figure(fig, path)


def check_args(args):
    for tool in ("redis-benchmark", "redis-server", "openssl"):
        if not args.plot_only and shutil.which(tool) is None:
            raise SystemExit(f"{NAME}: {tool} is not installed (make deps installs it)")


def add_args(ap):
    ap.add_argument("--rounds", type=int, default=3, help="rounds; servers alternate A B A B")
    ap.add_argument("--requests", type=int, default=400_000, help="requests at P16 (a quarter at P1)")
    ap.add_argument("--conns", type=int, default=50, help="redis-benchmark connections")
    ap.add_argument("--value-size", type=int, default=32, help="SET value bytes")
    ap.add_argument("--threads", type=int, default=2, help="kvstore poller threads")


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
