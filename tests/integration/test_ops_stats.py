"""Operations statistics against redis-server 7.0 and real redis-cli: SLOWLOG,
LATENCY and MEMORY replies (byte-compared where values cannot differ, shape
otherwise), INFO commandstats/errorstats/latencystats counters moving as commands
run, CONFIG RESETSTAT, and redis-cli --stat/--bigkeys/--memkeys/--scan parsed.
Counts are checked as relations or on commands only the test sends, never as
totals a retry could change."""
import re
import subprocess
import time

import pytest

from helpers.conn import Raw, client
from helpers.resp import info_dict, resp_cmd, resp_parse
from helpers.servers import need

pytestmark = pytest.mark.timeout(120)
C = resp_cmd


def both(kv, redis_server, *cmds):
    """The raw replies of cmds (one connection each server): (kvstore's, redis's)."""
    out = []
    for port in (kv.port, redis_server.port):
        with Raw(port) as r:
            out.append([r.send(C(*cmd)).reply() for cmd in cmds])
    return out


SAME_BYTES = [
    [("SLOWLOG", "HELP")], [("SLOWLOG", "GET", "x")], [("SLOWLOG", "GET", "-2")], [("SLOWLOG", "LEN", "x")],
    [("SLOWLOG", "FOO")], [("SLOWLOG", "GET", "1", "2")], [("SLOWLOG", "RESET", "x")], [("SLOWLOG",)],
    [("LATENCY", "HELP")], [("LATENCY", "HISTORY")], [("LATENCY", "HISTORY", "nosuchevent")],
    [("LATENCY", "LATEST", "x")], [("LATENCY", "RESET", "nosuch", "other")], [("LATENCY", "GRAPH", "nosuch")],
    [("LATENCY", "FOO")],
    [("MEMORY", "HELP")], [("MEMORY", "USAGE")], [("MEMORY", "USAGE", "missing")],
    [("SET", "k", "v"), ("MEMORY", "USAGE", "k", "SAMPLES")], [("SET", "k", "v"), ("MEMORY", "USAGE", "k", "SAMPLES", "x")],
    [("SET", "k", "v"), ("MEMORY", "USAGE", "k", "SAMPLES", "-1")], [("SET", "k", "v"), ("MEMORY", "USAGE", "k", "FOO", "1")],
    [("MEMORY", "PURGE")], [("MEMORY", "NOPE")],
    [("CONFIG", "SET", "slowlog-log-slower-than", "x")], [("CONFIG", "SET", "slowlog-log-slower-than", "-5")],
    [("CONFIG", "GET", "slowlog-max-len")], [("CONFIG", "GET", "latency-tracking-info-percentiles")], [("CONFIG", "GET", "slowlog-log-slower-than")],
]


@pytest.mark.parametrize("cmds", SAME_BYTES, ids=lambda cmds: " ".join(cmds[-1]))
def test_same_bytes_as_redis(kv, redis_server, cmds):
    mine, theirs = both(kv, redis_server, *cmds)
    assert mine == theirs


def test_bounded_settings_say_their_bounds(kv):
    """slowlog-max-len is bounded (10000 entries, each up to 4 KB) where Redis takes any
    64-bit number: Redis's message, with kvstore's bounds."""
    with Raw(kv.port) as r:
        for name, bad, hi in (("slowlog-max-len", "10001", 10000), ("latency-monitor-threshold", "-1", 2147483647)):
            assert r.send(C("CONFIG", "SET", name, bad)).reply() == (
                f"-ERR CONFIG SET failed (possibly related to argument '{name}') - argument must be between "
                f"0 and {hi} inclusive\r\n").encode()


def test_slowlog_entries_shape_and_truncation(kv, redis_server):
    """Every request logged (threshold 0): newest first, 6 fields, long arguments and
    argument lists cut as Redis cuts them; the same entries as redis-server's."""
    long_val = "a" * 300
    many = [str(i) for i in range(40)]
    got = {}
    for name, port in (("kv", kv.port), ("redis", redis_server.port)):
        with Raw(port) as r:
            assert r.call("CONFIG", "SET", "slowlog-log-slower-than", "0") == b"OK"
            assert r.call("CLIENT", "SETNAME", "opsname") == b"OK"
            r.call("SLOWLOG", "RESET")
            r.call("SET", "longkey", long_val)
            r.call("DEL", *many)
            entries = r.call("SLOWLOG", "GET", "2")
            assert r.call("SLOWLOG", "LEN") >= 2
            r.call("CONFIG", "SET", "slowlog-log-slower-than", "10000")
        got[name] = entries
    for entries in got.values():
        assert len(entries) == 2
        dele, setl = entries
        assert all(len(e) == 6 for e in entries)
        assert dele[0] > setl[0]  # ids grow
        assert isinstance(dele[1], int) and isinstance(dele[2], int)
        assert dele[5] == b"opsname" and re.match(rb"127\.0\.0\.1:\d+$", dele[4])
    # argument arrays identical to redis-server's
    assert got["kv"][0][3] == got["redis"][0][3]
    assert got["kv"][1][3] == got["redis"][1][3]
    assert got["kv"][1][3][2].endswith(b"... (172 more bytes)")
    assert got["kv"][0][3][-1] == b"... (10 more arguments)" and len(got["kv"][0][3]) == 32


def test_slowlog_max_len_and_off(kv):
    with Raw(kv.port) as r:
        r.call("CONFIG", "SET", "slowlog-log-slower-than", "0")
        r.call("CONFIG", "SET", "slowlog-max-len", "3")
        for i in range(10):
            r.call("SET", f"sl{i}", "v")
        assert r.call("SLOWLOG", "LEN") == 3
        assert len(r.call("SLOWLOG", "GET", "-1")) == 3
        r.call("CONFIG", "SET", "slowlog-log-slower-than", "-1")
        r.call("SLOWLOG", "RESET")
        r.call("SET", "x", "y")
        assert r.call("SLOWLOG", "LEN") == 0
        r.call("CONFIG", "SET", "slowlog-max-len", "128")
        r.call("CONFIG", "SET", "slowlog-log-slower-than", "10000")


def test_slowlog_redacts_auth(kv):
    with Raw(kv.port) as r:
        r.call("CONFIG", "SET", "slowlog-log-slower-than", "0")
        r.call("SLOWLOG", "RESET")
        r.call("AUTH", "secret-password")
        e = r.call("SLOWLOG", "GET", "1")
        r.call("CONFIG", "SET", "slowlog-log-slower-than", "10000")
    assert b"secret-password" not in repr(e).encode()


def stats(port, section):
    with Raw(port) as r:
        return info_dict(r.call("INFO", section))


def cmdstat(info, name):
    v = info.get(f"cmdstat_{name}")
    return dict((k, float(x)) for k, x in (p.split("=") for p in v.split(","))) if v else {}


def test_commandstats_errorstats_move(kv):
    """A command only this test sends: its counters move by exactly what the test did."""
    before = stats(kv.port, "everything")
    with Raw(kv.port) as r:
        for _ in range(3):
            r.call("HSTRLEN", "ops:h", "f")
        r.send(C("HSTRLEN", "ops:h")).reply()                   # arity: rejected
        r.send(C("SET", "ops:s", "x")).reply()
        r.send(C("HSTRLEN", "ops:s", "f")).reply()              # WRONGTYPE: failed
        r.send(C("CONFIG", "GET")).reply()                      # subcommand arity: rejected
    after = stats(kv.port, "everything")
    b, a = cmdstat(before, "hstrlen"), cmdstat(after, "hstrlen")
    assert a["calls"] - b.get("calls", 0) == 4
    assert a["rejected_calls"] - b.get("rejected_calls", 0) == 1
    assert a["failed_calls"] - b.get("failed_calls", 0) == 1
    assert a["usec_per_call"] >= 0
    assert cmdstat(after, "config|get")["rejected_calls"] >= 1
    assert "latency_percentiles_usec_hstrlen" in after
    assert re.match(r"p50=[\d.]+,p99=[\d.]+,p99\.9=[\d.]+$", after["latency_percentiles_usec_hstrlen"])
    wt = lambda i: int(i.get("errorstat_WRONGTYPE", "count=0").split("=")[1])  # noqa: E731
    assert wt(after) - wt(before) >= 1
    assert int(after["total_error_replies"]) - int(before["total_error_replies"]) >= 3
    # INFO's default sections, as Redis's: errorstats yes, commandstats and latencystats no
    default = stats(kv.port, "default")["__sections__"]
    assert "errorstats" in default and "commandstats" not in default and "latencystats" not in default


def test_resetstat_resets_all(kv_fresh):
    for _ in range(3):  # connections, commands, hits and misses the reset must forget
        with Raw(kv_fresh.port) as r:
            r.call("SET", "a", "1")
            r.call("GET", "a")
            r.call("GET", "missing")
    with Raw(kv_fresh.port) as r:
        r.send(C("INCR", "a", "b")).reply()
        r.send(C("NOSUCHCOMMAND")).reply()
        before = info_dict(r.call("INFO", "stats"))
        assert r.call("CONFIG", "RESETSTAT") == b"OK"
        info = info_dict(r.call("INFO", "everything"))
    assert not [k for k in info if k.startswith(("cmdstat_", "errorstat_", "latency_percentiles_usec_"))
                and k != "cmdstat_config|resetstat" and k != "latency_percentiles_usec_config|resetstat"]
    assert info["total_error_replies"] == "0"
    # Redis's resetServerStats: the totals count from the reset (this connection's own
    # commands since: CONFIG RESETSTAT's reply round and INFO at most)
    assert int(before["total_connections_received"]) >= 4 and int(info["total_connections_received"]) == 0
    assert int(before["keyspace_hits"]) >= 3 and int(before["keyspace_misses"]) >= 3
    assert info["keyspace_hits"] == "0" and info["keyspace_misses"] == "0"
    assert int(before["total_commands_processed"]) >= 11 and int(info["total_commands_processed"]) <= 2
    assert int(info["total_net_input_bytes"]) < int(before["total_net_input_bytes"])


def test_memory_usage(kv):
    with Raw(kv.port) as r:
        r.call("SET", "mu:small", "v")
        r.call("SET", "mu:big", "x" * 10000)
        r.call("HSET", "mu:h", "a", "1", "b", "2")
        small, big = r.call("MEMORY", "USAGE", "mu:small"), r.call("MEMORY", "USAGE", "mu:big", "SAMPLES", "0")
        h = r.call("MEMORY", "USAGE", "mu:h")
    assert 0 < small < big and big >= 10000 and h > 0


def test_latency_monitor_log_sync(kv_node_factory, tmp_path):
    """With a threshold of 1 ms on a disk log, fsyncs long enough show in LATEST and
    HISTORY; the shapes are Redis's whether or not one was that slow."""
    n = kv_node_factory(durability="disk", latency_monitor_threshold=1)
    with Raw(n.port) as r:
        assert r.call("CONFIG", "GET", "latency-monitor-threshold") == [b"latency-monitor-threshold", b"1"]
        for i in range(50):
            r.call("SET", f"lat{i}", "v" * 100)
        latest = r.call("LATENCY", "LATEST")
        for ev in latest:
            assert ev[0] in (b"log-sync", b"flusher-sweep", b"command", b"fast-command")
            assert len(ev) == 4 and ev[2] >= 1 and ev[3] >= ev[2]
            hist = r.call("LATENCY", "HISTORY", ev[0].decode())
            assert hist and all(len(s) == 2 and s[1] >= 1 for s in hist)
        assert r.call("LATENCY", "RESET") == len(latest)
        assert r.call("LATENCY", "LATEST") == []
        assert isinstance(r.call("LATENCY", "DOCTOR"), bytes)


def cli(port, *args, timeout=30):
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True,
                          timeout=timeout).stdout


def test_redis_cli_tools(kv_fresh):
    need("redis-cli")
    c = client(kv_fresh.port, decode_responses=True)
    for i in range(30):
        c.set(f"cli:s:{i}", "v" * (i + 1))
        c.hset(f"cli:h:{i}", mapping={f"f{j}": "x" for j in range(i + 1)})
    big = cli(kv_fresh.port, "--bigkeys")
    assert "Biggest string found '\"cli:s:29\"' has 30 bytes" in big
    assert "Biggest   hash found '\"cli:h:29\"' has 30 fields" in big
    assert "30 strings with" in big and "30 hashs with" in big
    mem = cli(kv_fresh.port, "--memkeys")
    m = re.search(r"30 strings with (\d+) bytes", mem)
    assert m and int(m.group(1)) > 30 * 16
    scan = sorted(cli(kv_fresh.port, "--scan", "--pattern", "cli:s:1*").split())
    assert scan == sorted([f"cli:s:{i}" for i in [1] + list(range(10, 20))])
    # --stat: the columns redis-cli reads (keys, mem, clients, blocked, requests, connections)
    # (read until the first row arrives: how long that takes depends on the machine's load)
    p = subprocess.Popen(["stdbuf", "-o0", "redis-cli", "-p", str(kv_fresh.port), "--stat", "-i", "0.2"],
                         stdout=subprocess.PIPE, text=True)
    out, deadline = "", time.monotonic() + 60
    try:
        while time.monotonic() < deadline and not re.search(r"^\d", out, re.M):
            line = p.stdout.readline()
            if not line:
                break
            out += line
    finally:
        p.kill()
        p.wait()
    rows = [ln.split() for ln in out.splitlines() if re.match(r"^\d", ln)]
    assert rows, out
    keys, mem, clients, blocked, requests = rows[0][:5]
    assert keys == "60" and mem[-1] in "BKMG" and int(clients) >= 1 and blocked == "0" and int(requests) > 60
    c.close()
