"""`kvstore` command: serve, bench, stats."""
import json
import os
import sys

import click

import kvstore
from kvstore import bench as benchmod
from kvstore.config import ServerConfig, parse_address, parse_size
from kvstore.errors import KVError


def _fail(e):
    raise click.ClickException(str(e))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(kvstore.__version__, prog_name="kvstore")
def main():
    """kvstore: a durable in-memory key-value store for IoT ingestion.

    Speaks RESP2, so redis-cli, redis-py and redis-benchmark work unchanged.
    Start a server with `kvstore serve`, load it with `kvstore bench`."""


@main.command()
@click.option("-c", "--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML config file (keys as the long options, e.g. max_memory = \"1gib\"); "
                   "options given on the command line override it.")
@click.option("--bind", help="IPv4 address to listen on.  [default: 127.0.0.1]")
@click.option("--port", type=int, help="TCP port (0 = any free port).  [default: 6380]")
@click.option("--threads", type=int, help="Poller threads (0 = one per core).  [default: 0]")
@click.option("--max-memory", help="Memory bound for the table: bytes or a size with Redis's units, "
                                   "e.g. 512mb, 4gb (1024-based) or 500m (1000-based); 0 = unbounded. "
                                   "Writes past it get -OOM; nothing is evicted.")
@click.option("--maxclients", type=int, help="Maximum client connections.  [default: 10000]")
@click.option("--requirepass", help="Password clients must AUTH with.")
@click.option("--accept", type=click.Choice(["reuseport", "handoff"]),
              help="reuseport: one SO_REUSEPORT listener per poller; handoff: poller 0 accepts "
                   "and hands connections round-robin.  [default: reuseport]")
@click.option("--arch", type=click.Choice(["poller", "threadpool", "udp", "dpdk"]),
              help="Request handling: poller = one non-blocking epoll poller per core; threadpool = a pool "
                   "of --threads workers (default 32), each serving one request at a time with blocking "
                   "calls (read, run, wait for the log, reply): paper 000's baseline; udp = a UDP front end "
                   "on kernel sockets (--udp-workers threads, recvmmsg/sendmmsg, on --bind:--udp-port); dpdk = "
                   "the same UDP front end bypassing the kernel (DPDK lcores on an AF_XDP port, --dpdk-iface). "
                   "UDP: one RESP request per datagram after an 8-byte id header, same durability and data "
                   "file, no AUTH; --threads TCP pollers (default 1) beside it for the control path.  "
                   "[default: poller]")
@click.option("--udp-port", type=int, help="arch udp/dpdk: UDP port of the front end (udp: 0 = any free port).  "
                                           "[default: 6380]")
@click.option("--udp-workers", type=int, help="arch udp/dpdk: UDP worker threads (dpdk: lcores, one RX/TX queue "
                                              "pair each).  [default: 1]")
@click.option("--dpdk-iface", help="arch dpdk: interface for DPDK's AF_XDP port (e.g. one end of a veth pair; "
                                   "turn its TX checksum offload off).")
@click.option("--dpdk-eal-args", help="arch dpdk: extra DPDK EAL arguments, space separated.")
@click.option("--network-only", is_flag=True, default=None,
              help="Benchmark switch (paper 000's N row): SET answers +OK without touching the table. "
                   "Nothing is stored.")
@click.option("--poll-policy", type=click.Choice(["direct", "strict", "flexpoll"]),
              help="EPOLLOUT policy: direct writes replies at the end of each poll round (EPOLLOUT only "
                   "after a short write); strict registers EPOLLOUT for every reply and removes it when "
                   "sent; flexpoll (paper 002) writes on EPOLLOUT like strict but keeps it registered "
                   "while replies come often.  [default: direct]")
@click.option("--data-dir", type=click.Path(file_okay=False),
              help="Directory for this node's files; the durability log is <data-dir>/log.  [default: ./data]")
@click.option("--durability", type=click.Choice(["none", "disk", "remote"]),
              help="none: memory only. disk: a write is acknowledged once its log record is on disk "
                   "(group commit: one write + one fdatasync for every record gathered meanwhile). "
                   "remote: acknowledged once the record is in this node's memory and in its peer's "
                   "(--peer); the local log is written in large batches; if the peer is lost "
                   "(--peer-timeout-ms) writes are synced to the local disk instead. The log is "
                   "replayed at start.  [default: none]")
@click.option("--peer", help="remote mode: HOST:PORT of the peer's log receiver (the peer's --repl-port).")
@click.option("--repl-port", type=int,
              help="Run a log receiver on this port, storing a peer's log so that it survives the "
                   "loss of that machine (0 = any free port).  [default: off]")
@click.option("--ship-interval-us", type=int, help="remote: ship gathered log records every N µs.  [default: 100]")
@click.option("--max-batch-records", type=int, help="remote: at most N records per shipped batch.  [default: 65536]")
@click.option("--peer-timeout-ms", type=int,
              help="remote: an ack overdue this long means the peer is lost: fall back to disk mode "
                   "until it is back and caught up.  [default: 1000]")
@click.option("--disk-log-interval-ms", type=int,
              help="remote: write and sync the local log every N ms (or every 16 MiB).  [default: 1000]")
@click.option("--peer-startup-wait-ms", type=int,
              help="remote: at start, the node compares its log with the peer's copy (which may reach "
                   "further: the local log lags); wait this long for the peer, then refuse to start.  "
                   "[default: 10000]")
@click.option("--data-file/--no-data-file", default=None,
              help="Keep the BOSC data file <data-dir>/data.kvd. With it memory is bounded by --max-memory "
                   "(when full, writes wait for the flusher instead of failing; evicted keys are read back from "
                   "their block) and log segments are deleted once flushed.  [default: on with --durability "
                   "disk/remote; off with none, where it makes a cache that spills to disk, not durable]")
@click.option("--data-buckets", type=int,
              help="Home blocks (4 KiB each) of a new data file; an existing file keeps its own.  [default: 65536]")
@click.option("--flush-interval-ms", type=int,
              help="The flusher sweeps the dirty blocks at least this often (sooner when memory is "
                   "nearly full): the longer, the more updates each block write carries.  [default: 5000]")
@click.option("--dirty-queue", type=click.Choice(["ldu", "locked"]),
              help="The data file's dirty-key queue: ldu (lock-less, paper 003) or locked (a mutex-protected "
                   "list, kept to measure LDU against).  [default: ldu]")
@click.option("--log-segment-size",
              help="Start a new log segment past this size (Redis units); with a data file, segments wholly "
                   "below the flushed LSN are deleted (disk mode).  [default: 64mb]")
@click.option("--from-peer", help="Before recovery, fetch this node's log from the peer at HOST:PORT "
                                  "(when the local disk is gone or behind). Remote mode always does this "
                                  "with its --peer.")
def serve(config_file, from_peer, **opts):
    """Run a kvstore server until Ctrl-C or SIGTERM."""
    try:
        if opts.get("max_memory") is not None:
            opts["max_memory"] = parse_size(opts["max_memory"], "--max-memory")
        cfg = ServerConfig.load(config_file, **opts)
        os.makedirs(cfg.data_dir, exist_ok=True)
        server = kvstore.Server(config=cfg, from_peer=from_peer)
    except (KVError, OSError) as e:
        _fail(e)

    def ready(srv):
        if srv.fetched is not None:
            peer_lsn, local_lsn, replaced = srv.fetched
            click.echo(f"kvstore: fetched the log from {from_peer or cfg.peer} up to LSN {peer_lsn} (local log ended at "
                       f"{local_lsn}); " + ("it replaces the local log" if replaced else "local log kept"),
                       err=True)
        if srv.local_complete:
            click.echo(f"kvstore: peer {cfg.peer} unreachable; this node last ran without it, syncing every "
                       f"acknowledged write locally (LOCAL-COMPLETE), so it starts from its own log", err=True)
        if srv.receiver is not None:
            click.echo(f"kvstore: log receiver on {cfg.bind}:{srv.receiver.port}", err=True)
        if srv.datafile is not None:
            click.echo(f"kvstore: {srv.datafile.summary()}", err=True)
        if srv.recovery is not None:
            click.echo(f"kvstore: {srv.recovery.summary()}", err=True)
        mm = cfg.max_memory or "unbounded"
        udp = ""
        if cfg.arch == "dpdk":
            udp = f"udp port {cfg.udp_port} on {cfg.dpdk_iface} ({cfg.udp_workers} DPDK lcores, AF_XDP), "
        elif cfg.arch == "udp":
            udp = f"udp port {srv.udp_port} ({cfg.udp_workers} workers, kernel sockets), "
        click.echo(f"kvstore {kvstore.__version__} listening on {cfg.bind}:{srv.port} "
                   f"({udp}{cfg.effective_threads} {'workers' if cfg.arch == 'threadpool' else 'pollers'}, "
                   f"accept {cfg.accept}, policy {cfg.poll_policy}, "
                   f"durability {cfg.durability}, max-memory {mm}, data-dir {os.path.abspath(cfg.data_dir)})")
        sys.stdout.flush()

    try:
        server.serve_forever(on_ready=ready)
    except KVError as e:
        _fail(e)
    click.echo("kvstore stopped", err=True)


@main.command()
@click.option("--data-dir", default="data", show_default=True, type=click.Path(file_okay=False),
              help="The node's data directory (its log is <data-dir>/log).")
@click.option("--max-memory", default="0", help="Memory bound for the replay (Redis units; 0 = unbounded).")
@click.option("--check-only", is_flag=True, help="Do not truncate a torn log tail; only report it.")
@click.option("--from-peer", help="First fetch this node's log from the peer's receiver at HOST:PORT; it "
                                  "replaces the local log if it reaches further (the old one is kept aside).")
def recover(data_dir, max_memory, check_only, from_peer):
    """Check a node's data file and replay its log offline; report what they hold.

    Reads and checks every block of the data file (if any), then checks every
    log record's CRC. A torn tail (a record cut short by a crash) is
    truncated unless --check-only; damage anywhere else stops the replay, is
    reported, and exits 1. `kvstore serve --durability disk` runs the same
    recovery at start."""
    from kvstore import durability

    try:
        store = kvstore.Store(max_memory=parse_size(max_memory, "--max-memory"))
        if from_peer:
            host, port = parse_address(from_peer, "--from-peer")
            os.makedirs(data_dir, exist_ok=True)
            peer_lsn, local_lsn, replaced = durability.fetch_from_peer(data_dir, host, port)
            click.echo(f"fetched the log from {from_peer} up to LSN {peer_lsn} (local log ended at {local_lsn}); "
                       + ("it replaces the local log" if replaced else "local log kept"))
        datafile = None
        if os.path.exists(durability.data_file(data_dir)):
            # every block is read and checked; the log replays after what the file holds
            datafile = durability.DataFile(store, data_dir)
            click.echo(datafile.summary())
        r = durability.recover(store, data_dir, repair=not check_only,
                               after_lsn=datafile.flushed_lsn if datafile else 0)
    except KVError as e:
        _fail(e)
    click.echo(r.summary())
    click.echo(f"keys: {len(store):,}, memory: {store.used_memory:,} bytes")
    if datafile:
        datafile.close()


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Server address (IPv4).")
@click.option("-p", "--port", default=6380, show_default=True, help="Server port.")
@click.option("-t", "--threads", default=2, show_default=True, help="Client threads.")
@click.option("-c", "--conns", default=50, show_default=True, help="Connections in total.")
@click.option("-P", "--pipeline", default=1, show_default=True, help="Requests in flight per connection.")
@click.option("-d", "--value-size", default=85, show_default=True, help="SET value size in bytes.")
@click.option("-r", "--keyspace", default=1_000_000, show_default=True, help="Distinct keys (uniform).")
@click.option("--ratio", default="1:0", show_default=True, help="SET:GET mix, e.g. 1:0, 1:9, 0:1.")
@click.option("-n", "--requests", default=0, help="Stop after this many requests (0 = no bound).")
@click.option("--duration", default=0.0, help="Stop after this many seconds (0 = no bound).")
@click.option("--rate", default=0.0, help="Open loop at this many requests/s in total (0 = closed loop); "
                                          "latency is measured from each request's scheduled time.")
@click.option("--protocol", type=click.Choice(["resp", "memcache"]), default="resp", show_default=True,
              help="resp for kvstore/Redis, memcache for memcached's text protocol.")
@click.option("--check/--no-check", default=False, help="Verify every reply's content.")
@click.option("-a", "--password", default=None, help="AUTH password (RESP).")
@click.option("--udp", is_flag=True, help="Drive the UDP front end (--arch udp or dpdk) with kernel UDP sockets "
                                          "(sendmmsg/recvmmsg): -c sockets, -P requests in flight per socket, "
                                          "replies matched by id; lost replies count as timeouts.")
@click.option("--timeout-ms", default=500, show_default=True, help="--udp: a request without a reply after this "
                                                                    "long counts as a timeout.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench(as_json, **kw):
    """Load a server and report throughput and latency percentiles.

    Works against kvstore and any RESP server (Redis), or memcached with
    --protocol memcache. Give --requests and/or --duration (default: 10 s)."""
    if not kw["requests"] and not kw["duration"]:
        kw["duration"] = 10.0
    limit = f"{kw['duration']:g} s" if kw["duration"] else f"{kw['requests']} requests"

    def progress(elapsed):
        click.echo(f"\r  running {elapsed:5.1f} s (limit {limit})", nl=False, err=True)

    live = not as_json and sys.stderr.isatty()  # a progress line only where it can be redrawn
    try:
        r = benchmod.run(progress=progress if live else None, **kw)
    except KVError as e:
        _fail(e)
    if live:
        click.echo("\r\033[K", nl=False, err=True)
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    click.echo(f"{r['requests']} requests in {r['elapsed']:.2f} s: {r['throughput']:,.0f} req/s "
               f"({r['sets']} SET, {r['gets']} GET, {r['hits']} hits, {r['misses']} misses, "
               f"{r['errors']} errors" + (f", {r['timeouts']} timeouts" if kw["udp"] else "") + ")")
    click.echo(f"latency us: mean {r['lat_mean_us']:.1f}  p50 {r['lat_p50_us']:.1f}  "
               f"p90 {r['lat_p90_us']:.1f}  p99 {r['lat_p99_us']:.1f}  p99.9 {r['lat_p999_us']:.1f}  "
               f"max {r['lat_max_us']:.1f}")
    if r["errors"]:
        click.echo(f"first error: {r['first_error']}", err=True)
        sys.exit(1)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("-p", "--port", default=6380, show_default=True)
@click.option("-a", "--password", default=None)
def stats(host, port, password):
    """Print a running server's counters (commands, memory, syscalls per poller) as JSON."""
    try:
        with kvstore.Client(host=host, port=port, password=password, socket_timeout=5) as c:
            click.echo(json.dumps(c.kvstore_stats(), indent=2, default=str))
    except Exception as e:  # connection refused, auth, ...
        _fail(f"cannot read stats from {host}:{port}: {e}")


from kvstore.cli.experiment import experiment  # noqa: E402  (registered last: a group of its own)
main.add_command(experiment)


if __name__ == "__main__":
    main()
