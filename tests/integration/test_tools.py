"""Off-the-shelf tools against kvstore: redis-cli, redis-cli --pipe, redis-benchmark,
and kvstore's own `kvstore bench` (also against redis-server, as a reference)."""
import json
import os
import re
import subprocess
import socket
import sys
import time

import pytest

from helpers.conn import client
from helpers.resp import resp_cmd
from helpers.servers import PASSWORD, free_port, need

pytestmark = pytest.mark.timeout(120)

KVSTORE = [sys.executable, "-m", "kvstore.cli"]


def run(args, input=None, timeout=60):
    return subprocess.run(args, input=input, capture_output=True, timeout=timeout)


def cli(port, *args, input=None):
    need("redis-cli")
    return run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args], input=input)


def info_int(port, field, password=None):
    with client(port, password=password) as c:
        return int(c.info("everything")[field])


# ------------------------------------------------------------------ redis-cli

def test_redis_cli_ping_set_get(kv_fresh):
    p = kv_fresh.port
    r = cli(p, "ping")
    assert (r.returncode, r.stdout) == (0, b"PONG\n"), r.stderr
    assert cli(p, "set", "foo", "bar baz").stdout == b"OK\n"
    assert cli(p, "get", "foo").stdout == b"bar baz\n"
    assert cli(p, "incr", "n").stdout == b"1\n"
    assert cli(p, "get", "nothing").stdout == b"\n"
    assert cli(p, "--no-raw", "get", "nothing").stdout == b"(nil)\n"
    assert cli(p, "--no-raw", "incr", "n").stdout == b"(integer) 2\n"
    assert cli(p, "--no-raw", "mget", "foo", "nothing").stdout == b'1) "bar baz"\n2) (nil)\n'
    r = cli(p, "--no-raw", "incr", "foo")
    assert r.stdout == b"(error) ERR value is not an integer or out of range\n"
    assert cli(p, "dbsize").stdout == b"2\n"


def test_redis_cli_same_output_as_redis(kv_fresh, redis_server):
    """redis-cli's rendering of the same commands is identical for both servers."""
    cmds = [["ping"], ["set", "k", "v"], ["get", "k"], ["--no-raw", "get", "k"], ["--no-raw", "exists", "k", "k"],
            ["--no-raw", "mget", "k", "x"], ["--no-raw", "set", "k", "v", "nx", "xx"], ["--no-raw", "nosuch", "a"],
            ["--no-raw", "append", "k", "w"], ["--no-raw", "strlen", "k"], ["--no-raw", "del", "k", "x"],
            ["--no-raw", "config", "get", "maxmemory"], ["--no-raw", "select", "1"], ["flushall"]]
    cli(redis_server.port, "flushall")
    for c in cmds:
        want = cli(redis_server.port, *c)
        got = cli(kv_fresh.port, *c)
        assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr), c


def test_redis_cli_info_server(kv_fresh):
    r = cli(kv_fresh.port, "--no-raw", "info", "server")
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert out.startswith("# Server")
    assert f"tcp_port:{kv_fresh.port}" in out
    assert f"process_id:{kv_fresh.pid}" in out
    assert "redis_version:" in out
    assert "# Clients" not in out


def test_redis_cli_password(kv_auth, redis_auth):
    for port in (kv_auth.port, redis_auth.port):
        r = cli(port, "-a", PASSWORD, "ping")
        assert (r.returncode, r.stdout) == (0, b"PONG\n"), (port, r.stderr)
        assert cli(port, "-a", PASSWORD, "set", "pwkey", "1").stdout == b"OK\n"
        assert cli(port, "-a", PASSWORD, "get", "pwkey").stdout == b"1\n"
        assert cli(port, "--no-auth-warning", "-a", PASSWORD, "ping").stderr == b""
    for args in (["ping"], ["get", "pwkey"], ["-a", "wrong", "ping"], ["--user", "default", "--pass", "wrong", "ping"],
                 ["--no-raw", "--user", "default", "--pass", PASSWORD, "get", "pwkey"]):
        want = cli(redis_auth.port, "--no-auth-warning", *args)
        got = cli(kv_auth.port, "--no-auth-warning", *args)
        assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr), args
    assert b"NOAUTH" in cli(kv_auth.port, "ping").stdout
    assert b"WRONGPASS" in cli(kv_auth.port, "--no-auth-warning", "-a", "wrong", "ping").stdout + \
        cli(kv_auth.port, "--no-auth-warning", "-a", "wrong", "ping").stderr


@pytest.mark.timeout(60)
def test_redis_cli_pipe_mass_insertion(kv_fresh):
    n = 10_000
    data = b"".join(resp_cmd("SET", f"mass:{i}", f"value:{i}:" + "x" * (i % 40)) for i in range(n))
    r = cli(kv_fresh.port, "--pipe", input=data)
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode()
    assert "errors: 0, replies: 10000" in out, out
    with client(kv_fresh.port) as c:
        assert c.dbsize() == n
        vals = c.mget([f"mass:{i}" for i in range(n)])
    assert vals == [f"value:{i}:".encode() + b"x" * (i % 40) for i in range(n)]


def test_redis_cli_pipe_counts_errors(kv_fresh):
    data = resp_cmd("SET", "a", "1") + resp_cmd("INCR", "a") + resp_cmd("SET", "a", "x") + resp_cmd("INCR", "a") \
        + resp_cmd("NOSUCH")
    r = cli(kv_fresh.port, "--pipe", input=data)
    assert "errors: 2, replies: 5" in r.stdout.decode(), r.stdout


# ------------------------------------------------------------------ redis-benchmark

def bench_lines(out):
    """Final result lines of redis-benchmark -q (progress is overwritten with \\r)."""
    text = out.decode(errors="replace").replace("\r", "\n")
    return [ln.strip() for ln in text.split("\n") if "requests per second" in ln and "rps=" not in ln]


@pytest.mark.timeout(120)
def test_redis_benchmark_set_get(kv_fresh):
    need("redis-benchmark")
    before = info_int(kv_fresh.port, "total_commands_processed")
    r = run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(kv_fresh.port),
             "-t", "set,get", "-n", "20000", "-P", "16", "-c", "20", "-d", "85", "-r", "10000", "-q"], timeout=100)
    assert r.returncode == 0, r.stdout.decode()[-2000:] + r.stderr.decode()[-2000:]
    lines = bench_lines(r.stdout)
    assert any(re.match(r"SET: [\d.]+ requests per second", ln) for ln in lines), lines
    assert any(re.match(r"GET: [\d.]+ requests per second", ln) for ln in lines), lines
    assert b"rror" not in r.stdout + r.stderr
    after = info_int(kv_fresh.port, "total_commands_processed")
    assert after - before >= 40_000
    assert info_int(kv_fresh.port, "total_error_replies_protocol") == 0
    with client(kv_fresh.port) as c:
        n = c.dbsize()
        assert 0 < n <= 10_000
        v = c.get(b"key:%012d" % 0) or next(c.get(b"key:%012d" % i) for i in range(10_000)
                                            if c.exists(b"key:%012d" % i))
        assert len(v) == 85


@pytest.mark.timeout(120)
def test_redis_benchmark_custom_command(kv_fresh):
    """redis-benchmark randomizes every __rand_int__ on its own (checked against
    redis-server 7.0: key:000000000003 holds val:000000000952), so a key's value
    cannot carry the key's number; every stored pair must still be exactly what a
    SET of that command wrote."""
    need("redis-benchmark")
    before = info_int(kv_fresh.port, "total_commands_processed")
    r = run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(kv_fresh.port), "-n", "5000", "-r", "1000",
             "-c", "10", "-q", "set", "key:__rand_int__", "val:__rand_int__"], timeout=100)
    assert r.returncode == 0, r.stdout.decode()[-2000:] + r.stderr.decode()[-2000:]
    assert bench_lines(r.stdout), r.stdout
    assert b"rror" not in r.stdout + r.stderr
    assert info_int(kv_fresh.port, "total_commands_processed") - before >= 5000
    keys = [b"key:%012d" % i for i in range(1000)]
    with client(kv_fresh.port) as c:
        vals = c.mget(keys)
        present = {k: v for k, v in zip(keys, vals) if v is not None}
        assert c.dbsize() == len(present)  # no other key was created
    # 5,000 uniform draws over 1,000 keys leave ~7 unset; 100 would be absurd
    assert len(present) >= 900
    for k, v in present.items():
        assert re.fullmatch(rb"val:\d{12}", v), (k, v)
        assert int(v[4:]) < 1000, (k, v)


# ------------------------------------------------------------------ kvstore bench

def kvstore_bench(port, *extra):
    r = run(KVSTORE + ["bench", "-p", str(port), *extra], timeout=100)
    assert r.returncode == 0, r.stdout.decode()[-2000:] + r.stderr.decode()[-2000:]
    return json.loads(r.stdout)


def bench_value(key_num, size=85):
    """The value `kvstore bench` writes for key:%012d (filler with the key's digits
    over its first 12 and, for >= 24 bytes, last 12 bytes)."""
    filler = bytearray(ord("a") + i % 26 for i in range(size))
    d = b"%012d" % key_num
    filler[:min(12, size)] = d[12 - min(12, size):]
    if size >= 24:
        filler[size - 12:] = d
    return bytes(filler)


@pytest.fixture(scope="module")
def bench_available():
    r = run(KVSTORE + ["bench", "--help"], timeout=30)
    if r.returncode != 0:
        pytest.fail(f"kvstore bench --help failed: {r.stderr.decode()[-1000:]}")


@pytest.mark.timeout(120)
def test_kvstore_bench_against_kvstore(kv_fresh, bench_available):
    before = info_int(kv_fresh.port, "total_commands_processed")
    res = kvstore_bench(kv_fresh.port, "-n", "20000", "--check", "-P", "8", "--ratio", "1:1", "--json")
    assert res["errors"] == 0, res["first_error"]
    assert res["requests"] == 20000
    assert res["sets"] + res["gets"] == 20000 and res["sets"] > 0 and res["gets"] > 0
    assert res["hits"] + res["misses"] == res["gets"]
    assert info_int(kv_fresh.port, "total_commands_processed") - before >= 20000
    assert info_int(kv_fresh.port, "total_error_replies_protocol") == 0


@pytest.mark.timeout(120)
def test_kvstore_bench_against_redis(redis_server, bench_available):
    res = kvstore_bench(redis_server.port, "-n", "20000", "--check", "-P", "8", "--ratio", "1:1", "--json")
    assert res["errors"] == 0, res["first_error"]
    assert res["requests"] == 20000


@pytest.mark.timeout(120)
def test_kvstore_bench_small_keyspace_data_checked(kv_fresh, bench_available):
    """With 1,000 keys most GETs hit and are verified; then every key present holds
    exactly the value for its own number."""
    res = kvstore_bench(kv_fresh.port, "-n", "20000", "--check", "-P", "8", "--ratio", "1:1", "-r", "1000",
                        "-c", "10", "--json")
    assert res["errors"] == 0, res["first_error"]
    assert res["requests"] == 20000 and res["hits"] > res["gets"] // 2
    with client(kv_fresh.port) as c:
        vals = c.mget([b"key:%012d" % i for i in range(1000)])
        present = [(i, v) for i, v in enumerate(vals) if v is not None]
        assert c.dbsize() == len(present) >= 900
    for i, v in present:
        assert v == bench_value(i), (i, v)


def test_kvstore_bench_reports_errors(kv_auth, bench_available):
    """A wrong password is reported, not counted as success."""
    r = run(KVSTORE + ["bench", "-p", str(kv_auth.port), "-n", "100", "-a", "wrong", "--json"], timeout=60)
    assert r.returncode != 0 and b"WRONGPASS" in r.stderr, r
    res = kvstore_bench(kv_auth.port, "-n", "100", "--json")  # no password: every request refused
    assert res["errors"] == 100 and res["first_error"].startswith("NOAUTH"), res
    ok = kvstore_bench(kv_auth.port, "-n", "2000", "-a", PASSWORD, "--check", "--ratio", "1:1", "--json")
    assert ok["errors"] == 0 and ok["requests"] == 2000, ok


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", ["kvstore", "redis"])
def test_kvstore_bench_xadd_appends_every_message(kv_fresh, redis_server, bench_available, server):
    """--xadd: every acknowledged write is one entry of its key's stream, holding the
    value kvstore bench writes for that key, against kvstore and Redis alike."""
    port = kv_fresh.port if server == "kvstore" else redis_server.port
    with client(port) as c:
        c.flushall()
    res = kvstore_bench(port, "--xadd", "-n", "20000", "-P", "16", "-r", "50", "-c", "4", "--check", "--json")
    assert res["errors"] == 0, res["first_error"]
    assert res["requests"] == res["sets"] == 20000
    with client(port) as c:
        keys = [b"key:%012d" % i for i in range(50)]
        assert sum(c.xlen(k) for k in keys) == 20000
        for i in (0, 7, 49):
            entries = c.xrange(keys[i], count=3)
            assert entries and all(f == {b"v": bench_value(i)} for _, f in entries)


@pytest.mark.timeout(60)
def test_kvstore_bench_fixed_rate_is_open_loop(kv_fresh, bench_available):
    """--rate schedules requests: never more than rate x duration are sent, and a light
    load reaches its schedule; latency percentiles are ordered."""
    res = kvstore_bench(kv_fresh.port, "--rate", "2000", "--duration", "1.5", "-c", "4", "--json")
    assert res["errors"] == 0
    assert res["requests"] <= 2000 * 1.5 + 4  # the schedule bounds what is sent
    assert res["requests"] >= 2000 * 1.5 * 0.5, res  # and a light load keeps close to it
    assert 0 < res["lat_p50_us"] <= res["lat_p99_us"] <= res["lat_p999_us"] <= res["lat_max_us"]


@pytest.mark.timeout(60)
def test_kvstore_bench_memcache_protocol(bench_available, tmp_path):
    """The same tool drives memcached's text protocol, replies checked."""
    need("memcached")
    port = free_port()
    argv = ["memcached", "-p", str(port), "-U", "0", "-l", "127.0.0.1", "-t", "2"]
    if os.geteuid() == 0:
        argv += ["-u", "root"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        res = kvstore_bench(port, "--protocol", "memcache", "-n", "20000", "-P", "8", "--ratio", "1:1",
                            "-r", "1000", "--check", "--json")
        assert res["errors"] == 0, res["first_error"]
        assert res["requests"] == 20000 and res["hits"] > 0
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("args, message", [
    (["--ratio", "x"], "ratio: expected SET:GET"),
    (["--ratio", "0:0"], "not both 0"),
    (["-P", "0"], "pipeline"),
    (["-c", "1", "-t", "2"], "conns"),
    (["--xadd", "--ratio", "1:1"], "xadd: RESP, writes only"),
    (["--xadd", "--protocol", "memcache"], "xadd: RESP, writes only"),
    (["--xadd", "--batch", "4"], "batch: messages per datagram of --udp --xadd"),
    (["--pull", "5"], "pull: the UDP front end's pulls"),
    (["--udp", "--pull", "5", "--xadd"], "pull: the UDP front end's pulls"),
    (["--udp", "--xadd", "--batch", "2000"], "batch: expected 1..1024"),
    (["--consume", "--count", "0"], "count: expected 1..100000"),
])
def test_kvstore_bench_rejects_bad_options(kv, bench_available, args, message):
    r = run(KVSTORE + ["bench", "-p", str(kv.port), "-n", "10"] + args, timeout=30)
    assert r.returncode != 0 and message in r.stderr.decode(), r.stderr
