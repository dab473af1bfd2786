"""The threadpool front end (--arch threadpool, ext/frontend/threadpool.c): a pool of
worker threads serving TCP connections; real servers, redis-py and raw sockets."""
import pytest

from helpers.conn import client

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
