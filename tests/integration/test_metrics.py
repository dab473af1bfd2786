"""The Prometheus endpoint (--metrics-port, kvstore/metrics.py): real servers started by
`kvstore serve` (and one in-process kvstore.Server), traffic from redis-py, /metrics
scraped over HTTP, parsed with prometheus_client's parser and checked by promtool
(Debian's prometheus package). Counters are compared before and after the traffic
(they grow by at least what the test did), never to exact totals. Also: the parser
of INFO's k=v lines against a real redis-server's commandstats, disk and remote
modes, the default (no endpoint) and a port already taken."""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

import kvstore
from kvstore.errors import ConfigError, ServerError
from kvstore.metrics import Collector, parse_info

from helpers.conn import Raw, client
from helpers.pair import Pair, wait_for
from helpers.servers import free_port, listening_ports, need, start_node, stop_node

pytestmark = pytest.mark.timeout(120)

_ENDPOINT = re.compile(r"metrics on http://([\d.]+):(\d+)/metrics")


def scrape(port):
    """(text, samples_of(text)) of one scrape of /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    return text, samples_of(text)


def samples_of(text):
    """{sample name: {labels as a sorted tuple: value}} of an exposition, by prometheus_client's parser."""
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def promtool_ok(text):
    """`promtool check metrics` on a scrape: exit 0 and no lint complaint."""
    need("promtool")
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), (p.stdout, p.stderr)


def value(samples, name, **labels):
    return samples[name][tuple(sorted(labels.items()))]


def metrics_port(node):
    """The endpoint's port, from the line `kvstore serve` prints at start."""
    m = _ENDPOINT.search(node.log())
    assert m, f"no 'metrics on http://...' line in the server's output:\n{node.log()}"
    return int(m.group(2))


def histogram_ok(samples, name):
    """Buckets cumulative (monotone in le), +Inf equal to _count; returns _count."""
    buckets = sorted(((float(dict(k)["le"]), v) for k, v in samples[name + "_bucket"].items()))
    assert len(buckets) >= 2 and buckets[-1][0] == float("inf")
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), f"{name}: buckets not monotone: {buckets}"
    count = value(samples, name + "_count")
    assert buckets[-1][1] == count
    assert value(samples, name + "_sum") >= 0
    return count


# ---- INFO's k=v format: the parser against Redis itself

def test_parse_info_reads_redis_commandstats(redis_server):
    """parse_info reads a real redis-server's INFO commandstats lines as redis-py does, and
    the collector turns them into per-command counters."""
    r = redis.Redis(port=redis_server.port)
    r.set("metrics:k", "v")
    r.get("metrics:k")
    with pytest.raises(redis.ResponseError):
        r.incr("metrics:k")  # INCRBY, a failed call (not an integer)
    with Raw(redis_server.port) as raw:
        text = raw.call("INFO", "commandstats", "errorstats").decode()
    parsed = parse_info(text)
    reference = r.info("commandstats")  # later: its own INFO call counted, nothing else
    for cmd in ("set", "get", "incrby"):
        assert parsed[f"cmdstat_{cmd}"] == reference[f"cmdstat_{cmd}"]
    assert parsed["cmdstat_incrby"]["failed_calls"] >= 1
    _, samples = _collect({"info": parsed, "sync": None})
    assert value(samples, "kvstore_commands_total", cmd="set") == parsed["cmdstat_set"]["calls"]
    assert value(samples, "kvstore_commands_failed_calls_total", cmd="incrby") >= 1
    assert value(samples, "kvstore_commands_duration_seconds_total", cmd="get") == \
        pytest.approx(parsed["cmdstat_get"]["usec"] / 1e6)
    assert value(samples, "kvstore_errors_total", err="ERR") >= 1


def test_parse_info_values():
    text = ("# Server\r\nredis_version:7.0.0\r\nuptime_in_seconds:12\r\n\r\n# Persistence\r\n"
            "log_peer_last_error:connect: a=b, c\r\nused_cpu_sys:0.250000\r\n# Keyspace\r\n"
            "db0:keys=3,expires=1,avg_ttl=0\r\npoller1:clients=2,commands=5\r\n")
    assert parse_info(text) == {
        "redis_version": "7.0.0", "uptime_in_seconds": 12, "log_peer_last_error": "connect: a=b, c",
        "used_cpu_sys": 0.25, "db0": {"keys": 3, "expires": 1, "avg_ttl": 0},
        "poller1": {"clients": 2, "commands": 5}}


def _collect(snapshot):
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Collector(lambda: snapshot))
    text = generate_latest(reg).decode()
    return text, samples_of(text)


# ---- a served node

def test_off_by_default(kv_node_factory):
    n = kv_node_factory(durability="none")
    assert not _ENDPOINT.search(n.log())
    assert listening_ports(n.pid) == {n.port}


def test_disk_mode_scrape(kv_node_factory):
    """`kvstore serve --metrics-port 0`: every family kvstore exports in disk mode, promtool
    clean, counters growing by at least the traffic sent, the sync histogram consistent."""
    n = kv_node_factory(durability="disk", metrics_port=0, flush_interval_ms=100)
    port = metrics_port(n)
    text0, before = scrape(port)
    promtool_ok(text0)

    c = client(n.port)
    writes = 200
    for i in range(writes):
        c.set(f"m:{i}", i)
    for i in range(50):
        c.get(f"m:{i}")
    c.expire("m:0", 1000)
    text1, after = scrape(port)
    promtool_ok(text1)

    def grew(name, by, **labels):
        # a per-command series appears with the command's first call: absent before = 0
        was = value(before, name, **labels) if tuple(sorted(labels.items())) in before.get(name, {}) else 0
        assert value(after, name, **labels) - was >= by, name

    grew("kvstore_commands_processed_total", writes + 50)
    grew("kvstore_log_records_total", writes)
    grew("kvstore_log_written_bytes_total", writes * 10)
    grew("kvstore_log_syncs_total", 1)
    grew("kvstore_net_input_bytes_total", writes * 10)
    grew("kvstore_connections_received_total", 1)
    grew("kvstore_keyspace_hits_total", 50)
    assert value(after, "kvstore_keys") >= writes
    assert value(after, "kvstore_keys_with_expiry") >= 1
    assert value(after, "kvstore_connected_clients") >= 1
    assert value(after, "kvstore_memory_used_bytes") > value(before, "kvstore_memory_used_bytes")
    assert value(after, "kvstore_memory_max_bytes") == 0
    assert value(after, "kvstore_log_durable_lsn") >= writes
    assert value(after, "kvstore_log_failed") == 0
    assert value(after, "kvstore_log_write_error") == 0 and value(after, "kvstore_log_write_errors_total") == 0
    assert value(after, "process_resident_memory_bytes") > 0
    build = dict(next(iter(after["kvstore_build_info"])))
    assert build["kvstore_version"] == kvstore.__version__ and build["durability"] == "disk"

    # the log's sync histogram: one observation per sync, more after the writes
    count0 = histogram_ok(before, "kvstore_log_sync_duration_seconds")
    count1 = histogram_ok(after, "kvstore_log_sync_duration_seconds")
    assert count1 > count0
    assert count1 >= value(after, "kvstore_log_syncs_total")  # the histogram is read just after INFO

    # per poller (threads=2): every syscall counter labelled poller="0" and "1"
    for name in ("kvstore_poller_epoll_wait_calls_total", "kvstore_poller_epoll_ctl_calls_total",
                 "kvstore_poller_read_calls_total", "kvstore_poller_write_calls_total"):
        assert {dict(k)["poller"] for k in after[name]} == {"0", "1"}, name
    assert sum(after["kvstore_poller_read_calls_total"].values()) > \
        sum(before["kvstore_poller_read_calls_total"].values())

    # per command, when the server has INFO commandstats; else only the totals above
    if "kvstore_commands_total" in after:
        grew("kvstore_commands_total", writes, cmd="set")
        grew("kvstore_commands_total", 50, cmd="get")
    else:
        assert "cmdstat_set" not in _raw_info_text(n.port)

    # the flusher sweeps the dirty keys into the data file within a few sweeps
    def flushed():
        _, s = scrape(port)
        return s if value(s, "kvstore_datafile_blocks_written_total") > 0 else None
    s = wait_for("the flusher to write blocks", flushed, timeout=20)
    assert value(s, "kvstore_datafile_sweeps_total") >= 1
    assert value(s, "kvstore_datafile_records_written_total") >= 1
    c.close()


def _raw_info_text(port):
    with Raw(port) as r:
        return r.call("INFO", "everything").decode()


def test_remote_mode_peer_metrics(tmp_path):
    """A remote pair: node A's peer metrics while B runs (connected, lag 0 once in sync) and
    after B is killed (disconnected, degraded)."""
    pair = Pair(tmp_path)
    try:
        for attempt in range(3):
            try:
                pair.start("b", wait=False)
                a = pair.start("a", wait=False, metrics_port=0)
                pair.nodes["b"].wait_ready(timeout=30)
                a.wait_ready(timeout=30)
                break
            except Exception:
                pair.close()
                if attempt == 2:
                    raise
                pair.rport = dict(zip("ab", (free_port(), free_port())))
        port = metrics_port(a)
        c = client(a.port)
        for i in range(100):
            c.set(f"r:{i}", i)
        c.close()
        pair.wait_in_sync("a")
        text, s = scrape(port)
        promtool_ok(text)
        assert value(s, "kvstore_peer_connected") == 1
        assert value(s, "kvstore_peer_degraded") == 0
        assert value(s, "kvstore_peer_acked_lsn") >= 100
        assert value(s, "kvstore_peer_lag_lsn") == max(0, value(s, "kvstore_log_appended_lsn")
                                                       - value(s, "kvstore_peer_acked_lsn"))
        assert value(s, "kvstore_peer_records_total") >= 100
        assert "kvstore_receiver_held_lsn" in s  # A also holds B's log
        histogram_ok(s, "kvstore_log_sync_duration_seconds")

        pair.kill("b")

        def lost():
            _, s = scrape(port)
            return s if value(s, "kvstore_peer_connected") == 0 and value(s, "kvstore_peer_degraded") == 1 else None
        s = wait_for("A to see its peer lost", lost, timeout=20)
        promtool_ok(scrape(port)[0])
    finally:
        pair.close()


# ---- start-up errors and the in-process server

def test_port_in_use_is_a_clear_error():
    """A taken --metrics-port: the server does not start, and says which port and what to do."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        srv = kvstore.Server(port=0, threads=1, durability="none", metrics_port=busy)
        with pytest.raises(ServerError, match=rf"metrics_port {busy}: cannot serve metrics on 127.0.0.1:{busy}: "
                                              r"the address is in use.*--metrics-port"):
            srv.start()
        assert srv.metrics_port is None
        with pytest.raises(ServerError, match="not running"):
            srv.info()

        d = tempfile.mkdtemp(prefix="kvstore-test-")
        try:
            p = subprocess.run([sys.executable, "-m", "kvstore.cli", "serve", "--port", "0", "--threads", "1",
                                "--data-dir", d, "--metrics-port", str(busy)],
                               capture_output=True, text=True, timeout=60)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        assert p.returncode != 0
        assert f"metrics_port {busy}" in p.stderr and "in use" in p.stderr, p.stderr


def test_in_process_server_info_and_metrics_stop_with_it():
    srv = kvstore.Server(port=0, threads=1, durability="none", metrics_port=0)
    with srv:
        port = srv.metrics_port
        r = client(srv.port)
        r.set("a", "1")
        assert srv.info("keyspace") == {"db0": {"keys": 1, "expires": 0, "avg_ttl": 0}}
        assert srv.info("server clients")["connected_clients"] >= 1
        assert "used_memory" in srv.info()
        r.close()
        _, s = scrape(port)
        assert value(s, "kvstore_keys") == 1
        assert "kvstore_log_sync_duration_seconds_count" not in s  # durability none: no log
        with pytest.raises(ConfigError, match="section names"):
            srv.info("x " * 20)
    assert srv.metrics_port is None
    with pytest.raises(OSError):
        scrape(port)
