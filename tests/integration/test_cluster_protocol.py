"""Redis Cluster's client protocol on kvstore nodes (--cluster-enabled; ext/cmd/cluster.c,
ext/core/slot.c), with the slot map set by hand as the control plane sets it (CLUSTER SETMAP,
CLUSTER LEASE). Checked with real clients: redis-py's RedisCluster, redis-cli -c and
redis-benchmark --cluster, and against Redis itself: CLUSTER KEYSLOT of a redis-server in
cluster mode, the errors' texts (Redis 7's cluster.c), and redis-py's parsers of CLUSTER
SLOTS / SHARDS / NODES.

Three nodes split the slots as redis-cli --cluster create would (0-5460, 5461-10922,
10923-16383). Every wait has a deadline; loads are bounded in count."""
import random
import subprocess

import pytest
import redis
from redis.cluster import RedisCluster, parse_cluster_shards
from redis.crc import key_slot

from helpers.conn import Raw
from helpers.servers import RedisServer, need, start_node, stop_node

pytestmark = pytest.mark.timeout(120)

IDS = ["a" * 40, "b" * 40, "c" * 40]
RANGES = [(0, 5460), (5461, 10922), (10923, 16383)]


def setmap(node, epoch, me, ports, ranges=RANGES, migrating=(), importing=()):
    """CLUSTER SETMAP on node: nodes IDS[i] at 127.0.0.1:ports[i], ranges[i] owned by node i."""
    args = ["CLUSTER", "SETMAP", epoch, me, "NODES", len(ports)]
    for i, p in enumerate(ports):
        args += [IDS[i], "127.0.0.1", p]
    args += ["SLOTS", len(ranges)]
    for i, r in enumerate(ranges):
        args += [r[0], r[1], r[2] if len(r) > 2 else i]
    for word, pairs in (("MIGRATING", migrating), ("IMPORTING", importing)):
        if pairs:
            args += [word, len(pairs)] + [x for pair in pairs for x in pair]
    return node.execute_command(*args)


@pytest.fixture
def cluster():
    """Three cluster nodes, the map set on each and a lease of 10 minutes; yields (nodes, clients)."""
    nodes = [start_node(cluster_enabled=True) for _ in range(3)]
    clients = [redis.Redis(host="127.0.0.1", port=n.port, socket_timeout=10, protocol=2) for n in nodes]
    ports = [n.port for n in nodes]
    for i, c in enumerate(clients):
        assert setmap(c, 1, IDS[i], ports) == b"OK"
        assert c.execute_command("CLUSTER", "LEASE", 600000) == b"OK"
    yield nodes, clients
    for c in clients:
        c.close()
    for n in nodes:
        stop_node(n)


def error(port, *args):
    """The exact error text (no '-') a command gets, read off the wire."""
    with Raw(port) as r:
        v = r.call(*args)
    assert isinstance(v, tuple) and v[0] == "ERR", f"{args}: not an error: {v!r}"
    return v[1].decode()


def owner(key):
    s = key_slot(key.encode() if isinstance(key, str) else key)
    return next(i for i, (lo, hi) in enumerate(RANGES) if lo <= s <= hi)


def test_keyslot_matches_redis():
    """CRC16 and the hash-tag rule against a redis-server in cluster mode, key by key."""
    need("redis-server")
    ref = RedisServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf").start()
    n = start_node(cluster_enabled=True)
    try:
        r = redis.Redis(host="127.0.0.1", port=ref.port)
        k = redis.Redis(host="127.0.0.1", port=n.port)
        rng = random.Random(7)
        keys = [b"", b"foo", b"123456789", b"{}", b"{", b"}", b"{}a", b"a{}", b"{a", b"a}", b"{a}", b"x{a}y",
                b"{a}{b}", b"{{a}}", b"a{b}c{d}", b"}{a}", b"{}{a}", b"\x00{\xff}", b"{user1000}.following"]
        keys += [bytes(rng.choice(b"ab{}\x00\xff") for _ in range(rng.randint(0, 12))) for _ in range(300)]
        keys += [rng.randbytes(rng.randint(1, 64)) for _ in range(100)]
        for key in keys:
            assert k.execute_command("CLUSTER", "KEYSLOT", key) == r.execute_command("CLUSTER", "KEYSLOT", key), key
    finally:
        ref.stop()
        stop_node(n)


def test_redis_py_cluster_client_spreads_keys_by_slot(cluster):
    nodes, clients = cluster
    rc = RedisCluster(host="127.0.0.1", port=nodes[0].port, socket_timeout=10)
    keys = [f"k{i}" for i in range(600)] + [f"{{tag}}.{i}" for i in range(50)]
    for i, key in enumerate(keys):
        assert rc.set(key, i)
    assert [int(rc.get(key)) for key in keys] == list(range(len(keys)))
    assert rc.mget([f"{{tag}}.{i}" for i in range(5)]) == [str(600 + i).encode() for i in range(5)]
    # each key lives on the node that owns its slot, and only there
    for i, c in enumerate(clients):
        mine = [key for key in keys if owner(key) == i]
        assert c.dbsize() == len(mine)
        assert all(c.exists(key) for key in mine[:20])  # (one at a time: each its own slot)
    assert len(rc.get_nodes()) == 3
    rc.close()


def test_moved_crossslot_and_what_any_node_serves(cluster):
    nodes, clients = cluster
    c0 = clients[0]
    p0 = nodes[0].port
    assert key_slot(b"foo") == 12182
    assert error(p0, "SET", "foo", "x") == f"MOVED 12182 127.0.0.1:{nodes[2].port}"
    assert error(p0, "MSET", "a", 1, "b", 2) == "CROSSSLOT Keys in request don't hash to the same slot"
    assert error(p0, "XREAD", "STREAMS", "a", "b", "0", "0") == "CROSSSLOT Keys in request don't hash to the same slot"
    tag = next(f"t{i}" for i in range(10000) if owner(f"t{i}") == 0)
    assert c0.mset({f"{{{tag}}}1": 1, f"{{{tag}}}2": 2})  # one slot, this node's
    assert c0.ping() and c0.execute_command("CLUSTER", "MYID") == IDS[0].encode()
    # a transaction with a redirected command fails as a whole (EXECABORT), as in Redis
    with Raw(p0) as r:
        assert r.call("MULTI") == b"OK"
        assert r.call("SET", "foo", "1")[0] == "ERR"
        assert r.call("EXEC")[1].startswith(b"EXECABORT")
    # redis-cli -c follows the redirection
    need("redis-cli")
    out = subprocess.run(["redis-cli", "-c", "-p", str(nodes[0].port), "SET", "foo", "bar"], capture_output=True,
                         text=True, timeout=30)
    assert out.stdout.strip() == "OK"
    assert clients[2].get("foo") == b"bar"


def test_slots_shards_nodes_info_as_redis_py_reads_them(cluster):
    nodes, clients = cluster
    c1 = clients[1]
    slots = c1.execute_command("CLUSTER", "SLOTS")
    assert [(s[0], s[1], s[2][1], s[2][2]) for s in slots] == [
        (lo, hi, nodes[i].port, IDS[i].encode()) for i, (lo, hi) in enumerate(RANGES)]
    parsed = c1.cluster("NODES")  # redis-py's parser of CLUSTER NODES
    assert {v["node_id"]: (k, v["flags"], v["slots"]) for k, v in parsed.items()} == {
        IDS[i]: (f"127.0.0.1:{nodes[i].port}", "myself,master" if i == 1 else "master", [[str(lo), str(hi)]])
        for i, (lo, hi) in enumerate(RANGES)}
    shards = parse_cluster_shards(c1.execute_command("CLUSTER", "SHARDS"))  # RedisCluster's parser
    assert [(s["slots"], s["nodes"][0][b"port"], s["nodes"][0][b"id"]) for s in shards] == [
        ([(lo, hi)], nodes[i].port, IDS[i].encode()) for i, (lo, hi) in enumerate(RANGES)]
    with redis.Redis(host="127.0.0.1", port=nodes[1].port, protocol=3) as r3:  # maps in RESP3
        assert [s[b"nodes"][0][b"port"] for s in r3.execute_command("CLUSTER", "SHARDS")] == [n.port for n in nodes]
    info = c1.cluster("INFO")
    assert info["cluster_state"] == "ok" and int(info["cluster_slots_assigned"]) == 16384
    assert int(info["cluster_known_nodes"]) == 3 and int(info["cluster_size"]) == 3
    assert int(info["cluster_current_epoch"]) == 1
    assert c1.info("cluster")["cluster_enabled"] == 1


def test_no_map_no_owner_and_an_expired_lease_refuse_keys(cluster):
    nodes, clients = cluster
    fresh = start_node(cluster_enabled=True)
    try:
        f = redis.Redis(host="127.0.0.1", port=fresh.port)
        assert error(fresh.port, "GET", "foo") == "CLUSTERDOWN Hash slot not served"
        assert f.ping() and f.execute_command("CLUSTER", "MYID") is None
        assert f.cluster("INFO")["cluster_state"] == "fail"
    finally:
        stop_node(fresh)
    c0 = clients[0]
    k = next(f"k{i}" for i in range(1000) if owner(f"k{i}") == 0)
    # slots 0-99 unowned in the next epoch
    assert setmap(c0, 2, IDS[0], [n.port for n in nodes], [(100, 5460, 0), (5461, 10922, 1), (10923, 16383, 2)])
    s0 = next(f"x{i}" for i in range(10000) if key_slot(f"x{i}".encode()) < 100)
    assert error(nodes[0].port, "SET", s0, 1) == "CLUSTERDOWN Hash slot not served"
    assert c0.cluster("INFO")["cluster_state"] == "fail"
    assert c0.set(k, "v")
    # the lease is the fence: once it has run out, reads and writes of its own slots are refused
    assert c0.execute_command("CLUSTER", "LEASE", 0) == b"OK"
    for args in (("GET", k), ("SET", k, "w")):
        assert error(nodes[0].port, *args).startswith("CLUSTERDOWN The cluster is down")
    assert c0.ping()  # what names no key is still served
    assert c0.execute_command("CLUSTER", "LEASE", 60000) == b"OK"
    assert c0.get(k) == b"v"


def test_setmap_refuses_an_older_epoch_and_bad_maps_and_keeps_the_one_in_force(cluster):
    nodes, clients = cluster
    c0 = clients[0]
    ports = [n.port for n in nodes]
    with pytest.raises(redis.ResponseError, match="CLUSTER SETMAP: epoch 0 is older than the map's, 1$"):
        setmap(c0, 0, IDS[0], ports, [(0, 16383, 1)])
    bad = [
        ["CLUSTER", "SETMAP", 2, IDS[0], "NODES", 1, "short", "127.0.0.1", 1, "SLOTS", 0],
        ["CLUSTER", "SETMAP", 2, IDS[0], "NODES", 1, IDS[0], "127.0.0.1", 0, "SLOTS", 0],
        ["CLUSTER", "SETMAP", 2, IDS[0], "NODES", 1, IDS[0], "127.0.0.1", 1, "SLOTS", 1, 0, 16384, 0],
        ["CLUSTER", "SETMAP", 2, IDS[0], "NODES", 1, IDS[0], "127.0.0.1", 1, "SLOTS", 2, 0, 10, 0, 10, 20, 0],
        ["CLUSTER", "SETMAP", 2, IDS[0], "NODES", 1, IDS[0], "127.0.0.1", 1, "SLOTS", 1, 0, 10, 1],
        ["CLUSTER", "SETMAP", 2, IDS[0], "NODES", 2, IDS[0], "h", 1, IDS[0], "h", 2, "SLOTS", 0],
        ["CLUSTER", "SETMAP", 2, IDS[0], "NODES", 1, IDS[0], "h", 1, "SLOTS", 1, 0, 10, 0, "IMPORTING", 1, 5, 0],
        ["CLUSTER", "SETMAP", 2, IDS[0], "NODES", 1, IDS[0], "h", 1, "SLOTS", 0, "BOGUS"],
        ["CLUSTER", "SETMAP", -1, IDS[0], "NODES", 1, IDS[0], "h", 1, "SLOTS", 0],
    ]
    for args in bad:
        assert error(nodes[0].port, *args).startswith("ERR CLUSTER SETMAP: "), args
    assert error(nodes[0].port, "CLUSTER", "LEASE", -1) == "ERR CLUSTER LEASE: expected <milliseconds> from 0 to 600000"
    info = c0.cluster("INFO")
    assert info["cluster_state"] == "ok" and int(info["cluster_current_epoch"]) == 1
    assert c0.execute_command("CLUSTER", "SLOTS")[0][:2] == [0, 5460]
    # replaced maps are freed ten seconds later: more than 64 within that time are refused
    accepted, refused = 1, 0
    for epoch in range(2, 80):
        try:
            setmap(c0, epoch, IDS[0], ports)
            accepted = epoch
        except redis.ResponseError as e:
            assert "CLUSTER SETMAP: more than 64 maps in 10 seconds: try again later" in str(e)
            refused += 1
    assert refused > 0 and int(c0.cluster("INFO")["cluster_current_epoch"]) == accepted


def test_a_migrating_slot_asks_for_what_left_and_redis_py_follows(cluster):
    """Slot s moving from node 0 to node 1: keys still on 0 are served there, a missing key
    gets -ASK to node 1, which serves it after ASKING (and only then); a multi-key request
    with part of its keys moved gets -TRYAGAIN. Then the move ends in a new epoch: -MOVED."""
    nodes, clients = cluster
    ports = [n.port for n in nodes]
    c0, c1 = clients[0], clients[1]
    tag = next(f"t{i}" for i in range(10000) if owner(f"t{i}") == 0)
    s = key_slot(tag.encode())
    here, gone = f"{{{tag}}}here", f"{{{tag}}}gone"
    assert c0.set(here, "h")
    assert setmap(c0, 2, IDS[0], ports, migrating=[(s, 1)]) == b"OK"
    assert setmap(c1, 2, IDS[1], ports, importing=[(s, 0)]) == b"OK"
    assert c0.get(here) == b"h"
    assert error(ports[0], "GET", gone) == f"ASK {s} 127.0.0.1:{ports[1]}"
    assert error(ports[0], "MGET", here, gone) == "TRYAGAIN Multiple keys request during rehashing of slot"
    # without ASKING the importing node redirects to the owner
    assert error(ports[1], "SET", gone, "g") == f"MOVED {s} 127.0.0.1:{ports[0]}"
    with Raw(ports[1]) as r:
        assert r.call("ASKING") == b"OK"
        assert r.call("SET", gone, "g") == b"OK"
        assert r.call("GET", gone) == ("ERR", f"MOVED {s} 127.0.0.1:{ports[0]}".encode())  # one command only
    rc = RedisCluster(host="127.0.0.1", port=ports[0], socket_timeout=10)
    assert rc.get(gone) == b"g" and rc.get(here) == b"h"
    assert rc.set(f"{{{tag}}}new", "n")  # not on node 0: written on node 1 after ASK
    assert c1.dbsize() >= 2 and error(ports[0], "EXISTS", f"{{{tag}}}new").startswith("ASK ")  # not here
    nodes_line = [ln for ln in c0.execute_command("CLUSTER", "NODES").decode().splitlines() if "myself" in ln][0]
    assert f"[{s}->-{IDS[1]}]" in nodes_line
    # the move is over: node 1 owns s in epoch 3
    moved = [(0, s - 1, 0), (s, s, 1), (s + 1, 5460, 0), (5461, 10922, 1), (10923, 16383, 2)]
    moved = [r for r in moved if r[0] <= r[1]]
    for i, c in enumerate(clients):
        assert setmap(c, 3, IDS[i], ports, moved) == b"OK"
    assert error(ports[0], "GET", gone) == f"MOVED {s} 127.0.0.1:{ports[1]}"
    assert c1.get(gone) == b"g"
    rc.close()


def test_redis_benchmark_cluster_mode(cluster):
    need("redis-benchmark")
    nodes, clients = cluster
    out = subprocess.run(["redis-benchmark", "--cluster", "-p", str(nodes[0].port), "-t", "set,get", "-n", "3000",
                          "-c", "4", "-q"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "SET:" in out.stdout and "GET:" in out.stdout and "requests per second" in out.stdout, out.stdout
    assert sum(c.dbsize() for c in clients) >= 2  # its keys went to more than one node


def test_a_node_without_cluster_mode_says_so():
    n = start_node()
    try:
        r = redis.Redis(host="127.0.0.1", port=n.port)
        for args in (["CLUSTER", "INFO"], ["CLUSTER", "SLOTS"], ["ASKING"], ["READONLY"]):
            assert error(n.port, *args) == "ERR This instance has cluster support disabled"
        assert r.info("cluster") == {"cluster_enabled": 0}
        assert r.set("foo", "bar") and r.get("foo") == b"bar"  # no slot rules
    finally:
        stop_node(n)


def test_keys_in_a_slot_are_counted_and_listed_from_memory_and_the_data_file():
    """CLUSTER COUNTKEYSINSLOT / GETKEYSINSLOT on a node whose memory holds a fraction of its
    keys (durability disk, a data file, 256 KB of memory): the evicted ones count too."""
    n = start_node(cluster_enabled=True, durability="disk", max_memory="256kb", flush_interval_ms=100,
                   data_buckets=1024)
    try:
        r = redis.Redis(host="127.0.0.1", port=n.port, socket_timeout=30, protocol=2)
        assert r.execute_command("CLUSTER", "SETMAP", 1, IDS[0], "NODES", 1, IDS[0], "127.0.0.1", n.port,
                                 "SLOTS", 1, 0, 16383, 0) == b"OK"
        assert r.execute_command("CLUSTER", "LEASE", 600000) == b"OK"
        tags = ["alpha", "beta", "gamma"]
        want = {key_slot(t.encode()): {f"{{{t}}}:{i}".encode() for i in range(k)}
                for t, k in zip(tags, (2000, 500, 1))}
        value = b"v" * 200
        for keys in want.values():
            p = r.pipeline(transaction=False)
            for key in keys:
                p.set(key, value)
            p.execute()
        others = [f"o{i}" for i in range(300)]  # keys of other slots
        for key in others:
            r.set(key, value)
        info = r.info("persistence")
        assert info["datafile_evicted_keys"] > 0 and info["memory_keys"] < 2000, info  # most are on disk only
        for slot, keys in want.items():
            expect = keys | {k.encode() for k in others if key_slot(k.encode()) == slot}
            assert r.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == len(expect)
            assert set(r.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100000)) == expect
            some = r.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 10)
            assert len(some) == min(10, len(expect)) and set(some) <= expect
        empty = next(s for s in range(16384) if s not in want and all(key_slot(k.encode()) != s for k in others))
        assert r.execute_command("CLUSTER", "COUNTKEYSINSLOT", empty) == 0
        assert r.execute_command("CLUSTER", "GETKEYSINSLOT", empty, 5) == []
        assert error(n.port, "CLUSTER", "COUNTKEYSINSLOT", 16384) == "ERR Invalid slot"
        assert error(n.port, "CLUSTER", "GETKEYSINSLOT", 0, -1) == "ERR Invalid slot or number of keys"
        assert error(n.port, "CLUSTER", "GETKEYSINSLOT", "x", 1) == "ERR value is not an integer or out of range"
        r.close()
    finally:
        stop_node(n)
