"""The cluster's control plane on each node (kvstore/etcd.py, kvstore/cluster.py): the etcd
client against a real etcd started by the test, and nodes started with --cluster-etcd whose
agents register them under leases, push the slot maps written to etcd, and fence their node
when etcd stops answering. Every wait has a deadline."""
import threading
import time

import pytest
import redis
from redis.cluster import RedisCluster

from kvstore import Node
from kvstore.cluster import SLOTS, SlotMap, cluster_id, members, prefix
from kvstore.errors import ConfigError, ServerError
from kvstore.etcd import Etcd, EtcdError, Watcher

from helpers.conn import Raw
from helpers.pair import wait_for
from helpers.servers import EtcdServer, need, start_node, stop_node

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def etcd():
    need("etcd")
    s = EtcdServer().start()
    yield s
    s.stop()


def test_etcd_client_keys_transactions_leases_and_watch(etcd):
    e = Etcd(etcd.url)
    assert e.get("/t/a") is None
    e.put("/t/a", "1")
    e.put("/t/b", b"\x00\xff")
    e.put("/tz", "not under /t/")
    kvs, rev = e.get_prefix("/t/")
    assert kvs == {"/t/a": b"1", "/t/b": b"\x00\xff"} and rev > 0
    assert e.create("/t/once", "x") and not e.create("/t/once", "y") and e.get("/t/once") == b"x"
    assert e.replace("/t/once", b"x", "z") and not e.replace("/t/once", b"x", "w") and e.get("/t/once") == b"z"
    seen, done = [], threading.Event()
    w = Watcher(e, "/t/", lambda k, v, r: (seen.append((k, v)), k == "/t/last" and done.set()), rev + 1)
    w.start()
    lease = e.grant(1)
    assert e.keepalive(lease) >= 1
    e.put("/t/leased", "v", lease=lease)
    e.delete("/t/a")
    e.put("/t/last", "end")
    assert done.wait(10), seen
    w.stop()
    assert not w.is_alive()
    assert seen == [("/t/once", b"x"), ("/t/once", b"z"), ("/t/leased", b"v"), ("/t/a", None), ("/t/last", b"end")]
    e.revoke(lease)
    assert e.get("/t/leased") is None and e.keepalive(lease) == 0  # a lease's keys go with it
    assert e.delete("/t/", prefix=True) == 3  # /t/b, /t/once, /t/last (not /tz)
    assert e.get("/tz") == b"not under /t/"
    with pytest.raises(EtcdError, match="etcd at http://127.0.0.1:1"):
        Etcd("http://127.0.0.1:1", timeout=1).get("/x")
    with pytest.raises(ValueError):
        Etcd("https://x")


def test_slot_map_splits_as_redis_cli_and_tells_each_node_its_part():
    ids = ["a" * 40, "b" * 40, "c" * 40]
    m = SlotMap.even(4, [(i, "127.0.0.1", 7000 + n) for n, i in enumerate(ids)])
    assert m.slots == [(0, 5460, 0), (5461, 10922, 1), (10923, 16383, 2)]
    assert sum(last - first + 1 for first, last, _ in SlotMap.even(1, [(i, "h", 1) for i in ids * 2]).slots) == SLOTS
    m.moving = [(7, 1)]
    assert SlotMap.from_json(m.to_json()) == m
    assert m.setmap_args(ids[0])[-4:] == ["MIGRATING", 1, 7, 1]
    assert m.setmap_args(ids[1])[-4:] == ["IMPORTING", 1, 7, 0]
    assert "MIGRATING" not in m.setmap_args(ids[2]) and "IMPORTING" not in m.setmap_args(ids[2])
    assert len(cluster_id(b"\x01" * 16)) == 40 and cluster_id(b"\x01" * 16) != cluster_id(b"\x02" * 16)


def test_agents_register_push_maps_and_fence_their_nodes(etcd):
    name = f"agents-{time.monotonic_ns()}"
    e = Etcd(etcd.url)
    nodes = [start_node(cluster_enabled=True, cluster_etcd=etcd.url, cluster_name=name, cluster_lease_ttl=1)
             for _ in range(3)]
    try:
        joined = wait_for("3 nodes in etcd", lambda: len(members(e, name)) == 3 and members(e, name))
        assert sorted(m[2] for m in joined) == sorted(n.port for n in nodes)
        m = SlotMap.even(1, joined)
        assert e.replace(prefix(name) + "map", None, m.to_json())
        clients = [redis.Redis(host="127.0.0.1", port=n.port, protocol=2) for n in nodes]
        wait_for("maps in force", lambda: all(c.cluster("INFO")["cluster_state"] == "ok" for c in clients))
        rc = RedisCluster(host="127.0.0.1", port=nodes[0].port, socket_timeout=10)
        for i in range(200):
            assert rc.set(f"k{i}", i)
        assert [int(rc.get(f"k{i}")) for i in range(200)] == list(range(200))
        # epoch 2 gives everything to the first node; a map of an older epoch is not taken
        m2 = SlotMap(2, joined, [(0, SLOTS - 1, 0)])
        assert e.replace(prefix(name) + "map", m.to_json().encode(), m2.to_json())
        wait_for("epoch 2", lambda: all(int(c.cluster("INFO")["cluster_current_epoch"]) == 2 for c in clients))
        e.put(prefix(name) + "map", SlotMap.even(1, joined).to_json())
        time.sleep(0.5)
        assert all(int(c.cluster("INFO")["cluster_current_epoch"]) == 2 for c in clients)
        owner = next(c for c, n in zip(clients, nodes) if n.port == joined[0][2])
        assert owner.set("foo", "bar")
        # etcd stops answering: within the lease (1 s) every node stops serving keys ...
        etcd.pause()
        try:
            with Raw(owner.connection_pool.connection_kwargs["port"]) as r:
                wait_for("the fence", lambda: r.call("GET", "foo") != b"bar", timeout=10)
                assert r.call("GET", "foo") == ("ERR", b"CLUSTERDOWN The cluster is down (this node's lease has "
                                                       b"run out)")
                assert r.call("PING") == b"PONG"
        finally:
            etcd.resume()
        # ... and serves again once the agent renews a lease
        with Raw(owner.connection_pool.connection_kwargs["port"]) as r:
            wait_for("serving again", lambda: r.call("GET", "foo") == b"bar", timeout=20)
        # a clean stop gives the lease back: the node leaves etcd at once
        gone = nodes.pop()
        stop_node(gone)
        assert all(mm[2] != gone.port for mm in members(e, name))
        for c in clients:
            c.close()
        rc.close()
    finally:
        for n in nodes:
            stop_node(n)


def test_cluster_settings_are_checked():
    for settings, why in (({"cluster_etcd": "http://127.0.0.1:2379"}, "needs --cluster-enabled"),
                          ({"cluster_enabled": True, "cluster_etcd": "127.0.0.1:2379"}, "http://HOST:PORT"),
                          ({"cluster_name": "a/b"}, "cluster_name")):
        n = Node(port=0, **settings)
        with pytest.raises((ConfigError, ServerError), match=why):
            n.start(timeout=15)
        n.stop()
