"""A key's lifetime: EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT (NX, XX, GT, LT), TTL, PTTL,
EXPIRETIME, PEXPIRETIME, PERSIST (ext/cmd/expire.c).

Replies that do not depend on the clock (errors, 0/1, -2/-1, absolute expire times)
are compared byte for byte with redis-server; time left (TTL, PTTL) is compared with
a tolerance. Then redis-py's calls, durability across a restart (an expire time is
absolute: a restart neither shortens nor lengthens it, and a key deleted by an expire
time in the past stays deleted), and keys that left memory for the data file keep
their expire time."""
import time

import pytest

from helpers.conn import Raw, client
from helpers.faultlib import persistence, start_disk_node
from helpers.keyspace import SPILL, assert_same_replies, exchange, fill, wait_flushed
from helpers.resp import resp_cmd

pytestmark = pytest.mark.timeout(120)

C = resp_cmd
FAR = 4102444800        # 2100-01-01 in unix seconds: absolute times whose replies never vary
FAR_MS = FAR * 1000
MAXLL = "9223372036854775807"

CASES = [
    ("absent", C("EXPIRE", "nokey", "100") + C("PEXPIRE", "nokey", "100") + C("EXPIREAT", "nokey", FAR)
     + C("PEXPIREAT", "nokey", FAR_MS) + C("TTL", "nokey") + C("PTTL", "nokey") + C("EXPIRETIME", "nokey")
     + C("PEXPIRETIME", "nokey") + C("PERSIST", "nokey") + C("EXISTS", "nokey"), 10),
    ("no-expire-time", C("SET", "k", "v") + C("TTL", "k") + C("PTTL", "k") + C("EXPIRETIME", "k")
     + C("PEXPIRETIME", "k") + C("PERSIST", "k"), 6),
    ("absolute-times", C("SET", "k", "v") + C("EXPIREAT", "k", FAR) + C("EXPIRETIME", "k") + C("PEXPIRETIME", "k")
     + C("PEXPIREAT", "k", FAR_MS + 499) + C("EXPIRETIME", "k") + C("PEXPIREAT", "k", FAR_MS + 500)
     + C("EXPIRETIME", "k") + C("PEXPIRETIME", "k") + C("GET", "k"), 10),
    ("persist", C("SET", "k", "v", "EXAT", FAR) + C("PERSIST", "k") + C("PERSIST", "k") + C("TTL", "k")
     + C("EXPIRETIME", "k") + C("GET", "k"), 6),
    ("nx-xx", C("SET", "k", "v") + C("EXPIREAT", "k", FAR, "XX") + C("EXPIREAT", "k", FAR, "NX")
     + C("EXPIREAT", "k", FAR + 1, "NX") + C("EXPIRETIME", "k") + C("EXPIREAT", "k", FAR + 2, "XX")
     + C("EXPIRETIME", "k") + C("EXPIRE", "k", "100", "nx", "NX"), 8),
    ("gt-lt-without-expire-time", C("SET", "k", "v") + C("EXPIREAT", "k", FAR, "GT") + C("TTL", "k")
     + C("EXPIREAT", "k", FAR, "LT") + C("EXPIRETIME", "k"), 5),
    ("gt-lt", C("SET", "k", "v", "EXAT", FAR) + C("EXPIREAT", "k", FAR + 1, "GT") + C("EXPIREAT", "k", FAR, "GT")
     + C("EXPIREAT", "k", FAR + 1, "GT") + C("EXPIREAT", "k", FAR, "LT") + C("EXPIREAT", "k", FAR, "LT")
     + C("EXPIREAT", "k", FAR + 5, "lt") + C("EXPIRETIME", "k") + C("EXPIRE", "k", "100", "XX", "GT")
     + C("EXPIREAT", "k", FAR - 1, "XX", "LT") + C("EXPIRETIME", "k") + C("PEXPIREAT", "k", FAR_MS - 1000, "gt")
     + C("PEXPIREAT", "k", FAR_MS - 999, "Gt") + C("PEXPIRETIME", "k"), 14),
    ("past-deletes", C("SET", "k", "v") + C("EXPIRE", "k", "0") + C("EXISTS", "k") + C("SET", "k", "v")
     + C("EXPIRE", "k", "-1") + C("SET", "k", "v") + C("PEXPIRE", "k", "-9223372036854775808") + C("EXISTS", "k")
     + C("SET", "k", "v") + C("EXPIREAT", "k", "1") + C("SET", "k", "v") + C("PEXPIREAT", "k", "0")
     + C("EXISTS", "k") + C("GET", "k") + C("DBSIZE"), 15),
    ("past-with-conditions", C("SET", "k", "v") + C("EXPIRE", "k", "-1", "GT") + C("EXISTS", "k")
     + C("EXPIRE", "k", "-1", "LT") + C("EXISTS", "k") + C("SET", "k", "v", "EXAT", FAR)
     + C("EXPIRE", "k", "0", "XX") + C("EXISTS", "k") + C("SET", "k", "v", "EXAT", FAR)
     + C("EXPIRE", "k", "-5", "NX") + C("EXPIRE", "k", "-5", "GT") + C("EXPIRETIME", "k"), 12),
    ("option-errors", C("SET", "k", "v") + C("EXPIRE", "k", "100", "foo") + C("EXPIRE", "k", "100", "NX", "XX")
     + C("EXPIRE", "k", "100", "NX", "GT") + C("EXPIRE", "k", "100", "LT", "NX") + C("EXPIRE", "k", "100", "GT", "LT")
     + C("EXPIRE", "k", "100", "XX", "GT", "LT") + C("EXPIRE", "k", "100", "lt", "gt")
     + C("PEXPIREAT", "k", "1", "nx", "xx", "bogus") + C("TTL", "k"), 10),
    ("options-before-number", C("SET", "k", "v") + C("EXPIRE", "k", "abc", "foo")
     + C("EXPIRE", "k", "abc", "NX", "XX") + C("EXPIRE", "k", "abc", "NX"), 4),
    ("bad-numbers", C("SET", "k", "v") + C("EXPIRE", "k", "abc") + C("EXPIRE", "k", "1.5") + C("EXPIRE", "k", "")
     + C("EXPIRE", "k", " 1") + C("EXPIRE", "k", "010") + C("PEXPIRE", "k", "+5") + C("EXPIREAT", "k", "1e3")
     + C("EXPIRE", "k", "99999999999999999999") + C("TTL", "k"), 10),
    ("unsupported-option-bytes", C("SET", "k", "v") + C("EXPIRE", "k", "1", "fo\x00o") + C("EXPIRE", "k", "1", "a\r\nb")
     + C("EXPIRE", "k", "1", "ab\r\n") + C("EXPIRE", "k", "1", "\n") + C("EXPIRE", "k", "1", "x" * 700), 6),
    ("overflow", C("SET", "k", "v") + C("EXPIRE", "k", MAXLL) + C("EXPIRE", "k", "9223372036854775")
     + C("EXPIRE", "k", "-9223372036854776") + C("PEXPIRE", "k", MAXLL) + C("EXPIREAT", "k", MAXLL)
     + C("EXPIREAT", "k", "-9223372036854776") + C("PEXPIREAT", "k", MAXLL) + C("PEXPIRETIME", "k")
     + C("EXPIREAT", "k", "9223372036854775") + C("PEXPIRETIME", "k"), 11),
    ("overflow-absent-key", C("EXPIRE", "nokey", MAXLL) + C("PEXPIRE", "nokey", MAXLL)
     + C("PEXPIREAT", "nokey", MAXLL) + C("PEXPIRE", "nokey", "-9223372036854775808"), 4),
    ("arity", C("EXPIRE", "k") + C("PEXPIRE") + C("EXPIREAT", "k") + C("PEXPIREAT", "k") + C("TTL")
     + C("TTL", "a", "b") + C("PTTL") + C("EXPIRETIME", "a", "b") + C("PEXPIRETIME") + C("PERSIST")
     + C("PERSIST", "a", "b"), 11),
    ("set-and-expire-time", C("SET", "k", "v", "EXAT", FAR) + C("SET", "k", "w") + C("TTL", "k")
     + C("SET", "k", "v", "EXAT", FAR) + C("SET", "k", "w", "KEEPTTL") + C("EXPIRETIME", "k")
     + C("INCR", "n") + C("EXPIREAT", "n", FAR) + C("INCR", "n") + C("EXPIRETIME", "n")
     + C("APPEND", "n", "0") + C("EXPIRETIME", "n") + C("GET", "n"), 13),
    ("on-a-hash", C("HSET", "h", "f", "v") + C("EXPIREAT", "h", FAR) + C("EXPIRETIME", "h") + C("PERSIST", "h")
     + C("TTL", "h") + C("EXPIRE", "h", "0") + C("EXISTS", "h"), 7),
]


@pytest.mark.parametrize("name,request_bytes,n", CASES, ids=[c[0] for c in CASES])
def test_same_replies_as_redis(redis_server, kv, name, request_bytes, n):
    assert_same_replies(redis_server.port, kv.port, request_bytes, n)


def test_resp3_same_replies(redis_server, kv):
    req = C("HELLO", "3") + C("SET", "k", "v") + C("TTL", "nokey") + C("EXPIREAT", "k", FAR) + C("EXPIRETIME", "k") \
        + C("PERSIST", "k") + C("EXPIRE", "k", "1", "NX", "XX")
    want = exchange(redis_server.port, req, 7)[1:]  # HELLO's own reply names the server
    got = exchange(kv.port, req, 7)[1:]
    assert got == want


def _time_left(port, setup):
    """After SET k and `setup` (a raw request): TTL and PTTL of k."""
    with Raw(port) as r:
        r.send(C("FLUSHALL")).reply()
        r.send(C("SET", "k", "v")).reply()
        assert r.send(setup).reply() == b":1\r\n"
        return r.call("TTL", "k"), r.call("PTTL", "k")


@pytest.mark.parametrize("setup,secs", [
    (("EXPIRE", "k", "100"), 100), (("PEXPIRE", "k", "100000"), 100), (("EXPIRE", "k", "1000000000"), 1e9),
    (("PEXPIRE", "k", "99999"), 100), (("EXPIREAT", "k", "+3600"), 3600), (("EXPIRE", "k", "100", "LT"), 100),
])
def test_time_left_close_to_redis(redis_server, kv, setup, secs):
    """TTL and PTTL: the same as redis-server's within what the time between the calls
    explains (never more than the time set; 10 s of slack for a loaded machine).
    "+s": now + s seconds."""
    for port in (redis_server.port, kv.port):
        args = [str(int(time.time()) + int(a[1:])) if a.startswith("+") else a for a in setup]
        ttl, pttl = _time_left(port, C(*args))
        assert secs - 10 <= ttl <= secs, (port, ttl)
        assert secs * 1000 - 10_000 <= pttl <= secs * 1000, (port, pttl)


def test_key_goes_when_its_time_comes(kv):
    with Raw(kv.port) as r:
        r.call("FLUSHALL")
        assert r.call("SET", "k", "v") == b"OK"
        assert r.call("PEXPIRE", "k", "300") == 1
        pttl = r.call("PTTL", "k")
        assert pttl == -2 or 0 <= pttl <= 300, pttl  # -2: gone already, on a slow machine
        deadline = time.monotonic() + 10
        while r.call("EXISTS", "k") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert r.call("EXISTS", "k") == 0
        assert r.call("TTL", "k") == -2 and r.call("PTTL", "k") == -2 and r.call("EXPIRETIME", "k") == -2
        assert r.call("GET", "k") is None
        assert r.call("PERSIST", "k") == 0 and r.call("EXPIRE", "k", "100") == 0


def test_redis_py_calls(kv):
    import datetime
    with client(kv.port, decode_responses=True) as c:
        c.flushall()
        c.set("k", "v")
        assert c.ttl("k") == -1 and c.pttl("k") == -1
        assert c.expire("k", 100) is True
        assert 90 <= c.ttl("k") <= 100 and 90_000 <= c.pttl("k") <= 100_000
        assert c.expire("k", 50, gt=True) is False and c.expire("k", 50, lt=True) is True
        assert c.expire("k", 10, nx=True) is False and c.expire("k", 60, xx=True) is True
        assert c.pexpire("k", datetime.timedelta(seconds=30)) is True
        assert 20 <= c.ttl("k") <= 30
        assert c.expireat("k", datetime.datetime.fromtimestamp(FAR)) is True
        assert c.expiretime("k") == FAR and c.pexpiretime("k") == FAR_MS
        assert c.pexpireat("k", FAR_MS + 1500) is True and c.pexpiretime("k") == FAR_MS + 1500
        assert c.persist("k") is True and c.persist("k") is False and c.ttl("k") == -1
        assert c.expire("missing", 10) is False and c.ttl("missing") == -2
        assert c.expire("k", -1) is True and c.exists("k") == 0


def test_expire_times_survive_a_restart_and_past_ones_stay_deleted(tmp_path):
    """Disk durability: each change is logged (the whole state with its expire time, a
    deletion when an expire time in the past removes the key), and expire times are
    absolute, so after kill -9 and recovery they are what they were."""
    n = start_disk_node(tmp_path)
    with client(n.port) as c:
        c.set("far", "1")
        assert c.expireat("far", FAR) is True
        c.set("persisted", "2", exat=FAR)
        assert c.persist("persisted") is True
        c.set("gone", "3")
        assert c.expire("gone", 0) is True  # deleted now: logged as a deletion
        c.set("gone2", "4", exat=FAR)
        assert c.pexpireat("gone2", 1) is True
        c.set("soon", "5")
        assert c.pexpire("soon", 600) is True
        c.set("later", "6")
        assert c.expire("later", 3600) is True
    n.kill()
    time.sleep(0.7)  # "soon" expires while the server is down
    n = start_disk_node(tmp_path)
    try:
        with client(n.port) as c:
            assert c.expiretime("far") == FAR and c.get("far") == b"1"
            assert c.ttl("persisted") == -1 and c.get("persisted") == b"2"
            assert c.exists("gone", "gone2", "soon") == 0
            assert 3500 <= c.ttl("later") <= 3600
    finally:
        n.kill()


@pytest.mark.timeout(180)
def test_expire_time_of_a_key_that_left_memory(tmp_path):
    """With a data file and a small memory: keys whose expire times were set leave
    memory for their blocks (the flusher writes the expire time with the record);
    loaded back they have the same expire time; EXPIRE, PERSIST and TTL on keys that
    are only in their blocks load them first and act as on any key; all of it after a
    restart too."""
    n = start_disk_node(tmp_path, **SPILL)
    keys = [b"ttl:%04d" % i for i in range(300)]
    try:
        with client(n.port) as c:
            p = c.pipeline(transaction=False)
            for i, k in enumerate(keys):
                p.set(k, b"v%04d" % i * 10, exat=FAR + i)
            p.execute()
        fill(n.port, b"fill", 6000)
        i = wait_flushed(n.port)
        assert i["memory_keys"] < len(keys) + 6000 and i["datafile_evicted_keys"] > 0, i
        loads0 = persistence(n.port)["datafile_loads"]
        with client(n.port) as c:
            assert [c.expiretime(k) for k in keys] == [FAR + i for i in range(len(keys))]
            assert persistence(n.port)["datafile_loads"] > loads0, "no key had left memory"
        # again after they left memory once more: change them while they are only in their blocks
        fill(n.port, b"fill2", 6000)
        wait_flushed(n.port)
        with client(n.port) as c:
            assert all(c.persist(k) is True for k in keys[:100])
            assert all(c.expireat(k, FAR + 7) is True for k in keys[100:200])
            assert all(c.expire(k, 0) is True for k in keys[200:250])
        fill(n.port, b"fill3", 6000)
        wait_flushed(n.port)
    finally:
        n.kill()
    n = start_disk_node(tmp_path, **SPILL)
    try:
        with client(n.port) as c:
            assert [c.ttl(k) for k in keys[:100]] == [-1] * 100
            assert [c.expiretime(k) for k in keys[100:200]] == [FAR + 7] * 100
            assert [c.exists(k) for k in keys[200:250]] == [0] * 50
            assert [c.expiretime(k) for k in keys[250:]] == [FAR + i for i in range(250, 300)]
    finally:
        n.kill()
