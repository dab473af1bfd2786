"""`kvstore` command: serve, bench, stats."""
import json
import logging
import os
import sys

import click

import kvstore
from kvstore import bench as benchmod
from kvstore import log
from kvstore.config import PATH, SIZE, ServerConfig, check_repl_tls_files, parse_address, parse_size
from kvstore.errors import KVError


def _fail(e):
    raise click.ClickException(str(e))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(kvstore.__version__, prog_name="kvstore")
def main():
    """kvstore: a durable in-memory key-value store for IoT ingestion.

    Speaks RESP2, so redis-cli, redis-py and redis-benchmark work unchanged.
    Start a server with `kvstore serve`, load it with `kvstore bench`."""


def setting_options(cls, rename=None, help_prefix=""):
    """A decorator: one click option per setting of cls (ServerConfig, BlockdevConfig), from its
    declaration (name, help, [default: ...], choices, flag or on/off switch). Defaults stay
    None: a flag not given leaves the config file's value (or the setting's default) alone.
    rename: {setting: option and parameter name} where two tables share a name (`blockdev
    serve`'s server_threads, the engine's threads beside the block device's).
    help_prefix: text put before each help, or a function of the setting's name giving it."""
    def decorate(f):
        for field in reversed(cls.settings()):
            prefix = help_prefix(field.name) if callable(help_prefix) else help_prefix
            f = _setting_option(field, (rename or {}).get(field.name, field.name), prefix)(f)
        return f
    return decorate


def _setting_option(field, name, help_prefix):
    m, flag = field.metadata, "--" + name.replace("_", "-")
    shown = field.default if m["shown"] is True else m["shown"]
    kw = dict(help=help_prefix + m["help"] + (f"  [default: {shown}]" if shown is not None else ""), default=None)
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
    return click.option(*decls, name, **kw)


@main.command()
@click.option("-c", "--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML config file (keys as the long options, e.g. max_memory = \"1gib\"); "
                   "options given on the command line override it.")
@setting_options(ServerConfig)
@click.option("--from-peer", help="Before recovery, fetch this node's log from the peer at HOST:PORT "
                                  "(when the local disk is gone or behind). Remote mode always does this "
                                  "with its --peer.")
@click.option("--check-config", is_flag=True,
              help="Load and check the settings (config file and options), print the effective configuration "
                   "as TOML and exit: 0 if valid, 1 with the error. Binds no port, touches no data dir.")
def serve(config_file, from_peer, check_config, **opts):
    """Run a kvstore server until Ctrl-C or SIGTERM."""
    cfg = None
    try:
        for field in ServerConfig.settings():  # sizes parsed here, so that a refusal names the flag
            if field.metadata["type"] is SIZE and opts.get(field.name) is not None:
                opts[field.name] = parse_size(opts[field.name], "--" + field.name.replace("_", "-"))
        cfg = ServerConfig.load(config_file, **opts)
        if check_config:
            click.echo(cfg.to_toml(), nl=False)
            return
        log.configure(cfg.log_level, cfg.log_file)
        log.logger.info("kvstore %s starting, pid %d", kvstore.__version__, os.getpid())
        log.logger.info("configuration: %s", _config_line(cfg))
        os.makedirs(cfg.data_dir, exist_ok=True)
        server = kvstore.Server(config=cfg, from_peer=from_peer)
    except (KVError, OSError) as e:
        _fail_logged(cfg, e)

    def ready(srv):
        udp = ""
        if cfg.arch == "dpdk":
            udp = f"udp port {cfg.udp_port} on {cfg.dpdk_iface} ({cfg.udp_workers} DPDK lcores, AF_XDP), "
        elif cfg.arch == "udp":
            udp = f"udp port {srv.udp_port} ({cfg.udp_workers} workers, kernel sockets), "
        tls = f"tls port {srv.tls_port}, " if srv.tls_port is not None else ""
        tls += f"mqtt port {srv.mqtt_port}, " if srv.mqtt_port is not None else ""
        where = (f"{cfg.bind}:{srv.port if cfg.port >= 0 else srv.tls_port} "
                 f"({tls}{udp}{cfg.effective_threads} {'workers' if cfg.arch == 'threadpool' else 'pollers'}, "
                 f"accept {cfg.accept}, policy {cfg.poll_policy}, durability {cfg.durability}, "
                 f"max-memory {cfg.max_memory or 'unbounded'}, data-dir {os.path.abspath(cfg.data_dir)})")
        level, text = _durability_line(cfg)
        log.logger.log(level, "%s", text)
        log.logger.info("ready to accept connections on %s", where)
        # stdout: the one line scripts and kvstore.Node wait for (the log may be in a file)
        click.echo(f"kvstore {kvstore.__version__} listening on {where}")
        sys.stdout.flush()

    try:
        server.serve_forever(on_ready=ready)
    except KVError as e:
        _fail_logged(cfg, e)
    log.logger.info("kvstore stopped")


def _fail_logged(cfg, e):
    """Refuse to start: the reason on stderr (click's "Error: ...") and, when the log
    goes to a file, there too (stderr has it already otherwise)."""
    if cfg is not None and cfg.log_file and log.logger.handlers:
        log.logger.warning("cannot start: %s", e)
    _fail(e)


def _config_line(cfg):
    """The effective configuration on one line, `name=value` as in the TOML file
    (requirepass hidden)."""
    out = []
    for field in ServerConfig.settings():
        v = getattr(cfg, field.name)
        if field.name == "requirepass" and v:
            v = "(set)"
        if field.name == "threads":
            v = cfg.effective_threads
        out.append(f"{field.name}=" + (json.dumps(v) if isinstance(v, (str, bool)) else str(v)))
    return " ".join(out)


def _durability_line(cfg):
    """(logging level, text): what a write's acknowledgement means with this configuration."""
    log_dir = os.path.join(os.path.abspath(cfg.data_dir), "log")
    if cfg.durability == "disk":
        return logging.INFO, (f"durability disk: a write is acknowledged once its log record is synced to "
                              f"{log_dir}; the log is replayed at start")
    if cfg.durability == "remote":
        return logging.INFO, (f"durability remote: a write is acknowledged once it is in this node's memory and "
                              f"in its peer's ({cfg.peer}); the local log ({log_dir}) is synced every "
                              f"{cfg.disk_log_interval_ms} ms, and every write while the peer is lost")
    spill = " (the data file only spills memory to disk; it is not recovered)" if cfg.data_file else ""
    return logging.WARNING, ("durability none: NOTHING WRITTEN WILL SURVIVE A RESTART: data is kept in memory "
                             f"only{spill}. Use --durability disk to keep it.")


@main.command()
@click.option("--data-dir", default="data", show_default=True, type=click.Path(file_okay=False),
              help="The node's data directory (its log is <data-dir>/log).")
@click.option("--max-memory", default="0", help="Memory bound for the replay (Redis units; 0 = unbounded).")
@click.option("--check-only", is_flag=True, help="Change nothing: report a torn log tail instead of truncating it. "
                                               "Any damage or loss found exits 1 with the reason.")
@click.option("--from-peer", help="First fetch this node's log from the peer's receiver at HOST:PORT; it "
                                  "replaces the local log if it reaches further (the old one is kept aside).")
@click.option("--repl-secret-file", type=click.Path(dir_okay=False),
              help="With --from-peer: the pair's replication secret (the nodes' --repl-secret-file); the peer "
                   "serves its copy of the log only to a client that proves it holds it.")
@click.option("--repl-tls", is_flag=True,
              help="With --from-peer: fetch inside mutual TLS, as the nodes' --repl-tls (the peer refuses a plain "
                   "connection then); needs --tls-cert-file, --tls-key-file and --tls-ca-cert-file.")
@click.option("--tls-cert-file", type=click.Path(dir_okay=False), help="--repl-tls: this node's certificate (PEM).")
@click.option("--tls-key-file", type=click.Path(dir_okay=False), help="--repl-tls: its private key (PEM).")
@click.option("--tls-ca-cert-file", type=click.Path(dir_okay=False),
              help="--repl-tls: the CA certificate(s) the peer's certificate must chain to (PEM).")
def recover(data_dir, max_memory, check_only, from_peer, repl_secret_file, repl_tls, tls_cert_file, tls_key_file,
            tls_ca_cert_file):
    """Check a node's data file and replay its log offline; report what they hold.

    Reads and checks every block of the data file (if any): checksums, chains,
    and each bucket's blocks against the sweep its bucket table records, so a
    zeroed block or an older copy put back is reported with the buckets whose
    writes are lost. Then checks the log: every record's CRC, LSNs without
    gaps, and its newest segment present (named by <log>/wal.manifest). A torn
    tail (a record cut short by a crash) is truncated unless --check-only;
    anything else found exits 1 with the reason. `kvstore serve` runs the same
    checks at start and refuses to start."""
    from kvstore import durability

    try:
        store = kvstore.Store(max_memory=parse_size(max_memory, "--max-memory"))
        if from_peer:
            host, port = parse_address(from_peer, "--from-peer")
            key = durability.repl_key(repl_secret_file)
            tls = None
            if repl_tls:
                check_repl_tls_files(tls_cert_file, tls_key_file, tls_ca_cert_file)
                tls = (tls_cert_file, tls_key_file, tls_ca_cert_file)
            os.makedirs(data_dir, exist_ok=True)
            peer_lsn, local_lsn, replaced = durability.fetch_from_peer(data_dir, host, port, key=key, tls=tls)
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
@click.option("--xadd", is_flag=True, help="Writes are XADD KEY * v VALUE, a stream per key (RESP; --ratio N:0): "
                                           "the message-queue load. -P is the batch of XADDs a connection sends "
                                           "at once.")
@click.option("--batch", default=1, show_default=True,
              help="--udp --xadd: messages per datagram (1..1024), appended as one batch (paper 004's batch "
                   "transfer); throughput counts datagrams, the XADD count messages.")
@click.option("--pull", default=0, show_default=True,
              help="--udp: every request pulls one batch of a stream KEY, a batch number below this (the "
                   "pull cache's load; write the streams first); hits: batches returned.")
@click.option("--consume", is_flag=True,
              help="The read side of the message queue: -c consumers, each reading stream KEY (-r streams) with "
                   "XREADGROUP GROUP --group c<i> COUNT --count and acknowledging every batch with XACK (sent with "
                   "the next read), until the streams are drained, --duration or -n messages. The group must "
                   "exist. Works against Redis too.")
@click.option("--group", default="g", show_default=True, help="--consume: the consumer group.")
@click.option("--count", default=100, show_default=True, help="--consume: COUNT of each XREADGROUP.")
@click.option("--ack/--no-ack", default=True, show_default=True, help="--consume: XACK what was read.")
@click.option("-a", "--password", default=None, help="AUTH password (RESP).")
@click.option("--udp", is_flag=True, help="Drive the UDP front end (--arch udp or dpdk) with kernel UDP sockets "
                                          "(sendmmsg/recvmmsg): -c sockets, -P requests in flight per socket, "
                                          "replies matched by id; lost replies count as timeouts.")
@click.option("--timeout-ms", default=500, show_default=True, help="--udp: a request without a reply after this "
                                                                    "long counts as a timeout.")
@click.option("--mqtt", is_flag=True, help="MQTT 3.1.1 instead of RESP (kvstore --mqtt-port, Mosquitto, any "
                                           "broker): -c publishers each keeping -P messages of -d bytes in flight "
                                           "to topics t/<i mod --topics>, and --subscribers clients subscribed to "
                                           "t/#; reports published and delivered msg/s and publish-to-delivery "
                                           "latency. -p is the MQTT port.")
@click.option("--qos", type=click.IntRange(0, 2), default=0, show_default=True, help="--mqtt: publishers' QoS.")
@click.option("--subscribers", default=0, show_default=True, help="--mqtt: subscribers, each getting every message.")
@click.option("--sub-qos", type=click.IntRange(0, 2), default=0, show_default=True,
              help="--mqtt: the subscriptions' QoS (a message is delivered at the lower of the two).")
@click.option("--topics", default=64, show_default=True, help="--mqtt: distinct topics published to.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench(as_json, **kw):
    """Load a server and report throughput and latency percentiles.

    Works against kvstore and any RESP server (Redis), or memcached with
    --protocol memcache. Give --requests and/or --duration (default: 10 s)."""
    consume = {k: kw.pop(k) for k in ("consume", "group", "count", "ack")}
    mq = {k: kw.pop(k) for k in ("mqtt", "qos", "subscribers", "sub_qos", "topics")}
    if consume["consume"]:
        return _consume(as_json, kw, consume)
    if mq["mqtt"]:
        return _mqtt(as_json, kw, mq)
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
               f"({r['sets']} {'XADD' if kw['xadd'] else 'SET'}, {r['gets']} {'PULL' if kw['pull'] else 'GET'}, "
               f"{r['hits']} hits, {r['misses']} misses, "
               f"{r['errors']} errors" + (f", {r['timeouts']} timeouts" if kw["udp"] else "") + ")")
    click.echo(f"latency us: mean {r['lat_mean_us']:.1f}  p50 {r['lat_p50_us']:.1f}  "
               f"p90 {r['lat_p90_us']:.1f}  p99 {r['lat_p99_us']:.1f}  p99.9 {r['lat_p999_us']:.1f}  "
               f"max {r['lat_max_us']:.1f}")
    if r["errors"]:
        click.echo(f"first error: {r['first_error']}", err=True)
        sys.exit(1)


def _mqtt(as_json, kw, mq):
    if not kw["requests"] and not kw["duration"]:
        kw["duration"] = 10.0
    try:
        r = benchmod.mqtt(host=kw["host"], port=kw["port"], threads=kw["threads"], conns=kw["conns"],
                          qos=mq["qos"], window=kw["pipeline"], msg_size=kw["value_size"], topics=mq["topics"],
                          duration=kw["duration"], messages=kw["requests"], subscribers=mq["subscribers"],
                          sub_qos=mq["sub_qos"])
    except KVError as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    ack = {0: "confirmed by PINGRESP", 1: "PUBACKed", 2: "PUBCOMPed"}[mq["qos"]]
    click.echo(f"{r['messages']} messages published ({ack}) in {r['elapsed']:.2f} s: {r['throughput']:,.0f} msg/s; "
               f"publish to {ack.split()[-1]} us: p50 {r['lat_p50_us']:.1f}  p99 {r['lat_p99_us']:.1f}")
    if mq["subscribers"]:
        click.echo(f"{r['delivered']} deliveries to {mq['subscribers']} subscribers: {r['deliver_throughput']:,.0f} "
                   f"msg/s; publish to delivery us: p50 {r['dlat_p50_us']:.1f}  p99 {r['dlat_p99_us']:.1f}  "
                   f"p99.9 {r['dlat_p999_us']:.1f}")


def _consume(as_json, kw, c):
    try:
        r = benchmod.consume(host=kw["host"], port=kw["port"], threads=kw["threads"], conns=kw["conns"],
                             streams=kw["keyspace"], group=c["group"], count=c["count"], ack=c["ack"],
                             duration=kw["duration"], max_messages=kw["requests"], password=kw["password"])
    except KVError as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    click.echo(f"{r['messages']} messages in {r['elapsed']:.2f} s: {r['throughput']:,.0f} msg/s ({r['reads']} reads, "
               f"{r['acked']} acknowledged, {r['empty_reads']} empty, {r['errors']} errors)")
    click.echo(f"round trip us (a read and the previous batch's XACK): p50 {r['lat_p50_us']:.1f}  "
               f"p99 {r['lat_p99_us']:.1f}")
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
import kvstore.cli.cluster  # noqa: E402,F401  (`kvstore cluster ...`: registers itself)
import kvstore.cli.blockdev  # noqa: E402,F401  (`kvstore blockdev serve`: it registers itself, as it uses
#                                       this module's helpers and may be imported first)


if __name__ == "__main__":
    main()
