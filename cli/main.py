"""`kvstore` command: serve, bench, stats."""
import json
import os
import sys

import click

import kvstore
from kvstore import bench as benchmod
from kvstore.config import PATH, SIZE, ServerConfig, parse_address, parse_size
from kvstore.errors import KVError


def _fail(e):
    raise click.ClickException(str(e))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(kvstore.__version__, prog_name="kvstore")
def main():
    """kvstore: a durable in-memory key-value store for IoT ingestion.

    Speaks RESP2, so redis-cli, redis-py and redis-benchmark work unchanged.
    Start a server with `kvstore serve`, load it with `kvstore bench`."""


def _setting_options(f):
    """One click option per ServerConfig setting, from its declaration (name, help,
    [default: ...], choices, flag or on/off switch). Defaults stay None: a flag not given
    leaves the config file's value (or the setting's default) alone."""
    for field in reversed(ServerConfig.settings()):
        m, flag = field.metadata, "--" + field.name.replace("_", "-")
        shown = field.default if m["shown"] is True else m["shown"]
        kw = dict(help=m["help"] + (f"  [default: {shown}]" if shown is not None else ""), default=None)
        if m["cli"] == "switch":
            decls = [f"{flag}/--no-{flag[2:]}"]
        else:
            decls = [flag]
            if m["cli"] == "flag":
                kw["is_flag"] = True
            elif m["choices"]:
                kw["type"] = click.Choice(list(m["choices"]))
            elif m["type"] is int:
                kw["type"] = int
            elif m["type"] is PATH:
                kw["type"] = click.Path(file_okay=False)
        f = click.option(*decls, field.name, **kw)(f)
    return f


@main.command()
@click.option("-c", "--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML config file (keys as the long options, e.g. max_memory = \"1gib\"); "
                   "options given on the command line override it.")
@_setting_options
@click.option("--from-peer", help="Before recovery, fetch this node's log from the peer at HOST:PORT "
                                  "(when the local disk is gone or behind). Remote mode always does this "
                                  "with its --peer.")
def serve(config_file, from_peer, **opts):
    """Run a kvstore server until Ctrl-C or SIGTERM."""
    try:
        for field in ServerConfig.settings():  # sizes parsed here, so that a refusal names the flag
            if field.metadata["type"] is SIZE and opts.get(field.name) is not None:
                opts[field.name] = parse_size(opts[field.name], "--" + field.name.replace("_", "-"))
        cfg = ServerConfig.load(config_file, **opts)
        os.makedirs(cfg.data_dir, exist_ok=True)
        server = kvstore.Server(config=cfg, from_peer=from_peer)
    except (KVError, OSError) as e:
        _fail(e)

    def ready(srv):
        for line in srv.startup_report():
            click.echo(f"kvstore: {line}", err=True)
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
from kvstore.cli.configfile import config  # noqa: E402  (`kvstore config example`)
main.add_command(config)


if __name__ == "__main__":
    main()
