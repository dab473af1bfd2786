"""Commands over the keyspace: KEYS, SCAN, RANDOMKEY, TYPE, RENAME, RENAMENX, COPY,
UNLINK, TOUCH, OBJECT (ext/cmd/keys.c, ext/cmd/scan.c).

Replies that do not depend on the order keys are stored in are compared byte for byte
with redis-server; KEYS and whole SCAN iterations are compared as sets (the order is
the table's). SCAN's guarantee - a key present for the whole iteration is returned -
is checked while other clients write, delete and make the table resize, and, with a
data file and a small memory, while keys leave memory and come back; only set
inclusion is asserted, never counts. The documented differences from Redis are
checked on their own: OBJECT IDLETIME (not tracked) and OBJECT ENCODING after an
in-place edit."""
import random
import time

import pytest

from helpers.conn import Raw, client
from helpers.faultlib import persistence, start_disk_node
from helpers.keyspace import (SPILL, assert_same_replies, assert_scans_return, churning, exchange, fill, reply_diffs,
                              scan_all, wait_flushed)
from helpers.resp import resp_cmd
from helpers.servers import RedisServer, need

pytestmark = pytest.mark.timeout(120)

C = resp_cmd
FAR = 4102444800  # 2100-01-01: absolute expire times whose replies never vary

ENCODED = ["0", "9999", "10000", "-1", "-0", "0123", "+1", " 1", "1 ", "12345678901234567890",
           "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
           "x" * 44, "x" * 45, "", "1.5", "a" * 1000]

CASES = [
    ("type", C("SET", "s", "v") + C("HSET", "h", "f", "v") + C("TYPE", "s") + C("TYPE", "h") + C("TYPE", "nokey")
     + C("TYPE") + C("TYPE", "a", "b"), 7),
    ("rename", C("RENAME", "nokey", "x") + C("SET", "a", "1") + C("RENAME", "a", "a") + C("RENAME", "a", "b")
     + C("EXISTS", "a") + C("GET", "b") + C("SET", "c", "3") + C("RENAME", "b", "c") + C("GET", "c") + C("DBSIZE")
     + C("RENAME", "a") + C("RENAME", "a", "b", "c"), 12),
    ("rename-keeps-expire-time", C("SET", "a", "1", "EXAT", FAR) + C("SET", "b", "2", "EXAT", FAR + 5)
     + C("RENAME", "a", "b") + C("EXPIRETIME", "b") + C("SET", "c", "3") + C("RENAME", "c", "b")
     + C("TTL", "b") + C("GET", "b"), 8),
    ("renamenx", C("RENAMENX", "nokey", "x") + C("SET", "a", "1") + C("RENAMENX", "a", "a") + C("SET", "b", "2")
     + C("RENAMENX", "a", "b") + C("GET", "b") + C("RENAMENX", "a", "c") + C("EXISTS", "a") + C("GET", "c")
     + C("RENAMENX", "c"), 10),
    ("rename-hash", C("HSET", "h", "f", "v", "g", "w") + C("RENAME", "h", "h2") + C("TYPE", "h2")
     + C("HGET", "h2", "g") + C("COPY", "h2", "h3") + C("TYPE", "h3") + C("HGET", "h3", "f"), 7),
    ("copy", C("SET", "c", "v", "EXAT", FAR) + C("COPY", "c", "d") + C("GET", "d") + C("EXPIRETIME", "d")
     + C("COPY", "c", "d") + C("SET", "c", "w") + C("COPY", "c", "d", "replace") + C("GET", "d") + C("TTL", "d")
     + C("COPY", "c", "d", "REPLACE", "REPLACE") + C("COPY", "nokey", "d") + C("COPY", "nokey", "nokey")
     + C("COPY", "c", "c") + C("COPY", "c"), 14),
    ("copy-db", C("SET", "c", "v") + C("COPY", "c", "d", "DB", "0") + C("COPY", "c", "e", "db", "0", "REPLACE")
     + C("COPY", "c", "d", "DB", "1") + C("COPY", "c", "d", "DB", "-1") + C("COPY", "c", "d", "DB", "abc")
     + C("COPY", "c", "d", "DB", "2147483648") + C("COPY", "c", "d", "DB", "-2147483649")
     + C("COPY", "c", "d", "DB", "1", "foo") + C("COPY", "c", "d", "foo", "DB", "1") + C("COPY", "c", "d", "DB")
     + C("COPY", "c", "c", "DB", "0") + C("COPY", "nokey", "d", "DB", "1") + C("DBSIZE"), 14),
    ("object-encoding", b"".join(C("SET", "k", v) + C("OBJECT", "ENCODING", "k") + C("OBJECT", "REFCOUNT", "k")
                                 for v in ENCODED), 3 * len(ENCODED)),
    ("object-encoding-by-command", C("INCR", "n") + C("OBJECT", "ENCODING", "n") + C("INCRBY", "n", "20000")
     + C("OBJECT", "ENCODING", "n") + C("OBJECT", "REFCOUNT", "n") + C("HSET", "h", "f", "v")
     + C("OBJECT", "ENCODING", "h") + C("OBJECT", "REFCOUNT", "h"), 8),
    ("object-misc", C("SET", "k", "v") + C("OBJECT", "FREQ", "k") + C("OBJECT", "FREQ", "nokey")
     + C("OBJECT", "IDLETIME", "nokey") + C("OBJECT", "ENCODING", "nokey") + C("OBJECT", "REFCOUNT", "nokey")
     + C("OBJECT", "encoding", "k") + C("OBJECT", "HELP") + C("object", "help") + C("OBJECT", "HELP", "x")
     + C("OBJECT", "ENCODING") + C("OBJECT", "ENCODING", "a", "b") + C("OBJECT", "FREQ") + C("OBJECT", "foo")
     + C("OBJECT", "foo", "k") + C("OBJECT") + C("OBJECT", "x" * 200), 17),
    ("unlink-touch", C("MSET", "a", "1", "b", "2") + C("TOUCH", "a", "b", "nokey", "a") + C("UNLINK", "a", "nokey", "a")
     + C("EXISTS", "a", "b") + C("TOUCH") + C("UNLINK") + C("DBSIZE"), 7),
    ("randomkey", C("RANDOMKEY") + C("SET", "only", "1") + C("RANDOMKEY") + C("RANDOMKEY") + C("DEL", "only")
     + C("RANDOMKEY") + C("RANDOMKEY", "x") + C("DBSIZE"), 8),
    ("keys-one", C("SET", "key1", "v") + C("KEYS", "*") + C("KEYS", "key?") + C("KEYS", "k[a-z]y[0-9]")
     + C("KEYS", "nomatch*") + C("KEYS", "KEY1") + C("KEYS", "") + C("KEYS") + C("KEYS", "a", "b"), 9),
    ("in-multi", C("MULTI") + C("SET", "a", "1") + C("EXPIREAT", "a", FAR) + C("RENAME", "a", "b")
     + C("COPY", "b", "c") + C("RENAMENX", "c", "b") + C("TTL", "nokey") + C("TYPE", "b") + C("EXPIRETIME", "c")
     + C("KEYS", "b") + C("SCAN", "0", "MATCH", "c", "COUNT", "1000") + C("OBJECT", "ENCODING", "b")
     + C("PERSIST", "b") + C("RENAME", "nokey", "x") + C("EXEC") + C("TTL", "b"), 16),
    ("scan-errors", C("SCAN", "0", "COUNT", "0") + C("SCAN", "0", "COUNT", "-1") + C("SCAN", "0", "COUNT", "abc")
     + C("SCAN", "0", "COUNT", "9223372036854775808") + C("SCAN", "abc") + C("SCAN", "18446744073709551616")
     + C("SCAN", " 1") + C("SCAN", "1 ") + C("SCAN", "+") + C("SCAN", "-") + C("SCAN", "0x10")
     + C("SCAN", "0", "MATCH") + C("SCAN", "0", "TYPE") + C("SCAN", "0", "foo", "bar") + C("SCAN", "0", "COUNT")
     + C("SCAN") + C("SCAN", "abc", "COUNT", "0") + C("SCAN", "0", "COUNT", "0", "MATCH"), 18),
    ("scan-empty", C("SCAN", "0") + C("SCAN", "") + C("SCAN", "+0") + C("SCAN", "-0") + C("SCAN", "000")
     + C("SCAN", "0", "MATCH", "*", "COUNT", "9223372036854775807", "TYPE", "string")
     + C("SCAN", "0", "TYPE", "nosuchtype") + C("SCAN", "0\x00junk"), 8),
]


@pytest.mark.parametrize("name,request_bytes,n", CASES, ids=[c[0] for c in CASES])
def test_same_replies_as_redis(redis_server, kv, name, request_bytes, n):
    assert_same_replies(redis_server.port, kv.port, request_bytes, n)


def test_resp3_same_replies(redis_server, kv):
    req = C("HELLO", "3") + C("SET", "k", "v") + C("TYPE", "k") + C("OBJECT", "ENCODING", "nokey") \
        + C("OBJECT", "HELP") + C("KEYS", "k") + C("SCAN", "0", "MATCH", "k", "COUNT", "1000") + C("DEL", "k") \
        + C("RANDOMKEY") + C("SCAN", "0")
    want = exchange(redis_server.port, req, 9)[1:]  # HELLO's own reply names the server
    got = exchange(kv.port, req, 9)[1:]
    assert got == want


def test_documented_differences(kv):
    """OBJECT IDLETIME: access times are not tracked, and kvstore says so (Redis would
    count seconds). OBJECT ENCODING after APPEND: Redis says "raw" for a value edited in
    place; kvstore answers what a SET of the same bytes gives."""
    with Raw(kv.port) as r:
        r.call("FLUSHALL")
        r.call("SET", "k", "1")
        idle = r.call("OBJECT", "IDLETIME", "k")
        assert idle[0] == "ERR" and b"not supported" in idle[1]
        r.call("APPEND", "k", "2")
        assert r.call("OBJECT", "ENCODING", "k") == b"int"


# ----------------------------------------------------------------- KEYS and SCAN, as sets

def _load(port, n=3000):
    with client(port) as c:
        c.flushall()
        p = c.pipeline(transaction=False)
        for i in range(n):
            p.set(b"user:%d" % i, b"u%d" % i)
            if i % 3 == 0:
                p.set(b"item:%d" % i, b"%d" % i)
        p.set(b"weird\x00key\r\n*", b"x")
        p.set(b"ttl:gone", b"x", px=1)  # expired by the time it is listed: never listed
        p.execute()


SCAN_OPTIONS = [(), ("MATCH", "user:*"), ("MATCH", "*1*"), ("MATCH", "user:1?"), ("MATCH", "item:[0-2]*"),
                ("COUNT", "1"), ("COUNT", "1000"), ("COUNT", "100000"), ("TYPE", "string"), ("TYPE", "STRING"),
                ("TYPE", "hash"), ("TYPE", "list"), ("MATCH", "user:2*", "COUNT", "3", "TYPE", "string"),
                ("MATCH", ""), ("MATCH", "weird*")]


def test_scan_and_keys_same_keys_as_redis(redis_server, kv):
    _load(redis_server.port)
    _load(kv.port)
    time.sleep(0.01)
    with Raw(redis_server.port) as rr, Raw(kv.port) as rk:
        for opts in SCAN_OPTIONS:
            want, got = scan_all(rr, *opts), scan_all(rk, *opts)
            assert set(got) == set(want), opts
        for pat in ("*", "user:*", "*1*", "item:?", "nomatch", "weird*", "[ui]*:1"):
            want, got = rr.call("KEYS", pat), rk.call("KEYS", pat)
            assert sorted(got) == sorted(want), pat
            assert len(set(got)) == len(got), f"KEYS {pat} returned a key twice"


def test_scan_count_bounds_each_call(kv):
    """COUNT is a hint: over 3,000 keys, COUNT 10 takes many calls and none returns most
    of the keys; the cursor is always a decimal number."""
    _load(kv.port)
    calls = []
    with Raw(kv.port) as r:
        keys = scan_all(r, "COUNT", "10", calls=calls)
    assert len(set(keys)) >= 4000 and len(calls) > 20
    assert all(cur.isdigit() for cur, _ in calls)
    assert max(len(k) for _, k in calls) < 1000


def test_scan_returns_every_key_present_throughout_while_others_churn(kv):
    """Keys present for the whole iteration are all returned, while other clients add
    and delete tens of thousands of keys between the SCAN calls (the table's shards
    grow and shrink, rehashing incrementally meanwhile). Inclusion only: keys added
    or deleted during the scan may or may not be returned."""
    stable = {b"stable:%05d" % i for i in range(5000)}
    with client(kv.port) as c:
        c.flushall()
        for chunk in range(0, 5000, 1000):
            c.mset({k: b"s" for k in sorted(stable)[chunk:chunk + 1000]})

    sizes = set()

    def churn(seed, stop):
        rng = random.Random(seed)
        with client(kv.port) as c:
            while seed == 2 and not stop.is_set():  # the third thread watches the table's size
                sizes.add(c.info("memory")["table_buckets"])
                time.sleep(0.005)
            while not stop.is_set():
                batch = [b"churn:%d:%d" % (seed, rng.randrange(1 << 30)) for _ in range(20000)]
                for s in range(0, len(batch), 2000):
                    c.mset({k: b"c" for k in batch[s:s + 2000]})
                for s in range(0, len(batch), 2000):
                    c.delete(*batch[s:s + 2000])

    with churning(churn, threads=3):
        assert_scans_return(kv.port, stable, counts=("7", "50", "500"))
        with Raw(kv.port, timeout=20) as r:
            got = set(scan_all(r, "COUNT", "20"))
            assert all(k in stable or k.startswith(b"churn:") for k in got)
            assert set(scan_all(r, "MATCH", "stable:*", "COUNT", "20")) == stable
    assert len(sizes) > 1, "the table's bucket arrays never changed size during the scans"


def test_redis_py_calls(kv):
    with client(kv.port, decode_responses=True) as c:
        c.flushall()
        c.mset({"a:1": "1", "a:2": "2", "b:1": "x" * 100})
        assert sorted(c.scan_iter()) == ["a:1", "a:2", "b:1"]
        assert sorted(c.scan_iter(match="a:*", count=1)) == ["a:1", "a:2"]
        assert sorted(c.scan_iter(_type="string")) == ["a:1", "a:2", "b:1"]
        assert list(c.scan_iter(_type="hash")) == []
        assert sorted(c.keys("a:*")) == ["a:1", "a:2"]
        assert c.type("a:1") == "string" and c.type("nope") == "none"
        assert c.randomkey() in {"a:1", "a:2", "b:1"}
        assert c.object("encoding", "a:1") == "int" and c.object("encoding", "b:1") == "raw"
        assert c.object("refcount", "a:1") == 2147483647
        assert c.rename("a:1", "c:1") is True and c.get("c:1") == "1"
        assert c.renamenx("c:1", "a:2") is False and c.renamenx("c:1", "d:1") is True
        assert c.copy("d:1", "e:1") is True and c.copy("d:1", "e:1") is False
        assert c.copy("b:1", "e:1", replace=True) is True and c.get("e:1") == "x" * 100
        assert c.touch("d:1", "e:1", "nope") == 2
        assert c.unlink("d:1", "e:1", "nope") == 2
        assert sorted(c.keys()) == ["a:2", "b:1"]
        c.flushall()
        assert c.randomkey() is None and list(c.scan_iter()) == [] and c.keys() == []


# ----------------------------------------------------------------- keys that left memory

def _listing(port, *opts):
    with Raw(port, timeout=30) as r:
        return scan_all(r, *opts), r.call("KEYS", opts[1] if opts else "*")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("arch", [{}, {"arch": "threadpool", "threads": 4}], ids=["poller", "threadpool"])
def test_scan_and_keys_list_keys_that_left_memory(tmp_path, arch):
    """With a data file and 256 KiB of memory most keys live only in their blocks: SCAN
    (memory, then the file's buckets) and KEYS list them all, KEYS each once; keys
    deleted or expired while in their blocks are not listed; after a restart (memory
    holds almost nothing) the same, and RANDOMKEY still finds a key. Pollers wait for
    a listing on their eventfd, the thread pool's workers block in ses_wait."""
    n = start_disk_node(tmp_path, **SPILL, **arch)
    try:
        with client(n.port) as c:
            p = c.pipeline(transaction=False)
            for i in range(300):
                p.set(b"short:%03d" % i, b"x" * 50, px=1500)
            p.execute()
        t_short = time.monotonic()
        fill(n.port, b"key", 6000)
        i = wait_flushed(n.port)
        assert i["memory_keys"] < 6000 and i["datafile_evicted_keys"] > 0, i
        every = {b"key:%06d" % j for j in range(6000)}
        time.sleep(max(0.0, t_short + 1.6 - time.monotonic()))
        scanned, keys = _listing(n.port)
        assert set(scanned) == every and sorted(keys) == sorted(every)
        scanned, keys = _listing(n.port, "MATCH", "key:0001*")
        assert set(scanned) == set(keys) == {k for k in every if k.startswith(b"key:0001")}
        with Raw(n.port) as r:
            assert set(scan_all(r, "TYPE", "string", "COUNT", "100")) == every
            assert scan_all(r, "TYPE", "hash") == []
        gone = sorted(every)[::7]
        with client(n.port) as c:  # most of them only in their blocks: deleted there as tombstones
            for s in range(0, len(gone), 500):
                assert c.delete(*gone[s:s + 500]) == len(gone[s:s + 500])
        every -= set(gone)
        scanned, keys = _listing(n.port)
        assert set(scanned) == every and sorted(keys) == sorted(every)
        wait_flushed(n.port)
    finally:
        n.kill()
    n = start_disk_node(tmp_path, **SPILL, **arch)
    try:
        assert persistence(n.port)["memory_keys"] < len(every)
        with client(n.port) as c:
            assert c.randomkey() in every
        scanned, keys = _listing(n.port)
        assert set(scanned) == every and sorted(keys) == sorted(every)
    finally:
        n.kill()


@pytest.mark.timeout(240)
def test_scan_guarantee_while_keys_leave_memory_and_come_back(tmp_path):
    """Stable keys are returned by every whole SCAN while other clients keep writing
    (evicting), reading stable keys back into memory (loads) and deleting: the memory
    phase misses a key only if it left memory, and then its block holds it for the
    file phase (the argument is at the top of ext/cmd/scan.c)."""
    n = start_disk_node(tmp_path, **SPILL)
    stable = [b"stable:%05d" % i for i in range(2000)]

    def churn(seed, stop):
        rng = random.Random(seed)
        with client(n.port) as c:
            i = 0
            while not stop.is_set():
                p = c.pipeline(transaction=False)
                for _ in range(200):
                    p.set(b"churn:%d:%d" % (seed, i % 8000), b"c" * 80)
                    i += 1
                for k in rng.sample(stable, 50):
                    p.get(k)  # back into memory
                p.delete(*(b"churn:%d:%d" % (seed, rng.randrange(8000)) for _ in range(50)))
                p.execute()

    try:
        with client(n.port) as c:
            for s in range(0, len(stable), 200):  # an MSET within a quarter of the memory bound
                c.mset({k: b"s" * 80 for k in stable[s:s + 200]})
        fill(n.port, b"fill", 4000)
        wait_flushed(n.port)
        with churning(churn):
            assert_scans_return(n.port, stable)
        i = persistence(n.port)
        assert i["datafile_evicted_keys"] > 0 and i["datafile_loads"] > 0, i
    finally:
        n.kill()


@pytest.mark.timeout(120)
def test_commands_on_keys_that_left_memory_reply_as_redis(tmp_path):
    """TYPE, RENAME, RENAMENX, COPY, OBJECT, TTL on keys that are only in their blocks:
    loaded first, then the same replies as redis-server's on the same data."""
    need("redis-server")
    n = start_disk_node(tmp_path, **SPILL)
    ref = RedisServer().start()
    try:
        init = [(b"e:%04d" % i, b"%d" % i if i % 2 else b"v" * (i % 90)) for i in range(400)]
        for port in (n.port, ref.port):
            with client(port) as c:
                c.flushall()
                c.mset(dict(init))
                c.expireat(b"e:0007", FAR)
        fill(n.port, b"fill", 6000)
        wait_flushed(n.port)
        assert persistence(n.port)["memory_keys"] < 6000
        cmds = []
        for i in range(0, 400, 9):
            k, k2 = b"e:%04d" % i, b"e:%04d" % (i + 1)
            cmds += [("TYPE", k), ("OBJECT", "ENCODING", k), ("OBJECT", "REFCOUNT", k), ("TTL", k),
                     ("COPY", k, k2), ("COPY", k, b"new:" + k), ("RENAMENX", k, k2), ("RENAME", k2, b"mv:" + k2),
                     ("GET", b"mv:" + k2), ("EXISTS", k, k2), ("RENAME", k, k), ("EXPIRETIME", b"e:0007")]
        loads0 = persistence(n.port)["datafile_loads"]
        diffs = reply_diffs(n.port, ref.port, cmds)
        assert not diffs, "\n".join(diffs[:20])
        assert persistence(n.port)["datafile_loads"] > loads0
        with Raw(n.port, timeout=30) as a, Raw(ref.port) as b:
            assert sorted(a.call("KEYS", "[emn]*")) == sorted(b.call("KEYS", "[emn]*"))
        # Inside EXEC (every shard held) the data file cannot be listed: KEYS says so
        # in its element; the keys the queue names are loaded before EXEC runs.
        fill(n.port, b"fill2", 6000)
        wait_flushed(n.port)
        with Raw(n.port, timeout=30) as a:
            assert a.call("MULTI") == b"OK"
            for cmd in (("KEYS", "*"), ("RENAME", "e:0398", "x"), ("TYPE", "x"), ("COPY", "x", "e:0398")):
                assert a.call(*cmd) == b"QUEUED"
            res = a.call("EXEC")
            assert res[0][0] == "ERR" and b"MULTI/EXEC" in res[0][1], res[0]
            assert res[1:] == [b"OK", b"string", 1]
    finally:
        ref.stop()
        n.kill()
