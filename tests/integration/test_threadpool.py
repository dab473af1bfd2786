"""The threadpool front end (--arch threadpool, ext/frontend/threadpool.c): a pool of
worker threads serving TCP connections: pipelining, many connections per worker, replies
held for the log, protocol errors, shutdown. Real servers, redis-py and raw sockets."""
import time

import pytest

from helpers import faultlib as fl
from helpers.conn import Raw, client
from helpers.faultlib import mget_all, persistence, recovery_of
from helpers.resp import resp_cmd

pytestmark = pytest.mark.timeout(60)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("durability", ["none", "disk"])
def test_threadpool_serves_redis_py_and_waits_for_the_log(kv_node_factory, durability):
    """--arch threadpool: the same commands over many connections, replies after the log."""
    n = kv_node_factory(arch="threadpool", threads=8, durability=durability)
    clients = [client(n.port, decode_responses=True, single_connection_client=True) for _ in range(20)]
    try:
        for i, cl in enumerate(clients):
            assert cl.set(f"t{i}", i) and cl.incr(f"t{i}") == i + 1
        p = clients[0].pipeline(transaction=False)
        for i in range(2000):
            p.set(f"p{i}", i)
        assert all(p.execute())
        assert clients[1].mget([f"p{i}" for i in range(0, 2000, 100)]) == [str(i) for i in range(0, 2000, 100)]
        info = clients[2].info("everything")
        assert info["arch"] == "threadpool" and info["pollers"] == 8
        if durability == "disk":  # every acknowledged write was durable first
            assert info["log_durable_lsn"] >= 2040, info
        assert clients[3].dbsize() == 2020
    finally:
        for cl in clients:
            cl.close()
    assert n.stop() == 0


def test_pipelined_requests_on_one_connection_are_answered_in_order(kv_node_factory):
    n = kv_node_factory(arch="threadpool", threads=4)
    reqs, want = [], []
    for i in range(2000):  # each GET reads the SET just before it: any reordering shows
        reqs.append(resp_cmd("SET", f"k{i % 7}", f"v{i}"))
        want.append(b"+OK\r\n")
        reqs.append(resp_cmd("GET", f"k{i % 7}"))
        want.append(b"$%d\r\nv%d\r\n" % (len(b"v%d" % i), i))
    with Raw(n.port, timeout=30) as r:
        r.send(b"".join(reqs))
        assert r.replies(len(want)) == want
        assert r.send(resp_cmd("PING")).reply() == b"+PONG\r\n"


@pytest.mark.timeout(90)
def test_many_connections_served_by_a_small_pool(kv_node_factory):
    n = kv_node_factory(arch="threadpool", threads=2)
    conns = [Raw(n.port, timeout=30) for _ in range(64)]
    try:
        for rnd in range(5):  # every connection has a request in flight at once, 32 per worker
            for i, r in enumerate(conns):
                r.send(resp_cmd("SET", f"c{i}", f"{rnd}") + resp_cmd("INCR", "shared") + resp_cmd("GET", f"c{i}"))
            for i, r in enumerate(conns):
                ok, incr, got = r.replies(3)
                assert ok == b"+OK\r\n" and incr.startswith(b":") and got == b"$1\r\n%d\r\n" % rnd, (i, rnd)
        with client(n.port) as c:
            assert c.get("shared") == b"%d" % (5 * len(conns))
            assert c.info("clients")["connected_clients"] == len(conns) + 1
    finally:
        for r in conns:
            r.close()


@pytest.mark.timeout(90)
def test_a_reply_in_disk_mode_means_the_write_survives_kill_9(tmp_path, monkeypatch):
    """With every log sync slowed to 0.3 s, a SET's reply does not come before the sync
    (the write is durable when acknowledged), and after kill -9 every acknowledged write
    is recovered."""
    monkeypatch.setenv("KVSTORE_FAULT_SYNC_DELAY_US", "300000")
    with fl.started_nodes(arch="threadpool", threads=2) as start:
        n = start(tmp_path)
        with Raw(n.port, timeout=30) as r:
            r.send(resp_cmd("SET", "first", "1"))
            assert r.read_for(0.1) == (b"", False)  # the sync takes 0.3 s: no reply before it
            assert r.reply() == b"+OK\r\n"
            acked = {"first": b"1"}
            for i in range(20):
                r.send(resp_cmd("SET", f"k{i}", f"v{i}") + resp_cmd("INCR", "n"))
                assert r.replies(2) == [b"+OK\r\n", b":%d\r\n" % (i + 1)]
                acked[f"k{i}"] = b"v%d" % i
            acked["n"] = b"20"
        st = persistence(n.port)
        assert st["log_durable_lsn"] == st["log_appended_lsn"] == 41, st
        n.kill()
        monkeypatch.delenv("KVSTORE_FAULT_SYNC_DELAY_US")
        n = start(tmp_path)
        assert recovery_of(n).records == 41
        assert mget_all(n.port, list(acked)) == acked


def test_a_protocol_error_gets_redis_s_error_and_the_connection_closes(kv_node_factory, redis_server):
    n = kv_node_factory(arch="threadpool", threads=2)
    for request in (b"*1\r\n$-5\r\n", resp_cmd("PING") + b"*abc\r\n" + resp_cmd("PING"), b"SET \"a b\r\n"):
        got, want = [], []
        for port, out in ((redis_server.port, want), (n.port, got)):
            with Raw(port) as r:
                out.extend(r.send(request).read_until_close(timeout=5))
        assert got == want and got[1] is True, (request, got, want)
        assert got[0].startswith(b"-ERR Protocol error") or got[0].startswith(b"+PONG\r\n-ERR Protocol error")


def test_stop_with_idle_connections_returns_promptly(kv_node_factory):
    n = kv_node_factory(arch="threadpool", threads=2)
    conns = [Raw(n.port) for _ in range(30)]
    try:
        for r in conns[:10]:
            assert r.call("PING") == b"PONG"  # some have talked, the others never did
        t0 = time.monotonic()
        assert n.stop(timeout=20) == 0, n.log()
        took = time.monotonic() - t0
        assert took < 10, f"stop took {took:.1f} s with idle connections open"
        for r in conns:
            assert r.read_until_close(timeout=5) == (b"", True)
    finally:
        for r in conns:
            r.close()
