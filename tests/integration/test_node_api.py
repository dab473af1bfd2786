"""The Python API: Store served in-process (one table for both), Server, Node, Client."""
import os
import signal
import threading

import pytest
import redis

import kvstore
from kvstore import Node, Server, Store


def test_store_and_server_share_one_table():
    store = Store(max_memory=8 << 20)
    with Server(store, port=0, threads=2, durability="none") as srv:
        r = redis.Redis(port=srv.port)
        store.set("from-python", b"\x00py\r\n")
        assert r.get("from-python") == b"\x00py\r\n"
        r.set("from-resp", "wire")
        assert store.get("from-resp") == b"wire"
        r.incrby("counter", 5)
        assert store.incr("counter") == 6
        assert r.dbsize() == len(store) == 3
        info = r.info("memory")
        assert info["used_memory"] == store.used_memory or abs(info["used_memory"] - store.used_memory) < 4096
        assert info["maxmemory"] == 8 << 20
        st = srv.stats()
        assert st["total_commands"] >= 5
        assert len(st["pollers"]) == 2
        r.close()


def test_server_stop_closes_connections_and_frees_port():
    store = Store()
    srv = Server(store, port=0, threads=1, durability="none").start()
    port = srv.port
    r = redis.Redis(port=port, socket_timeout=10)
    assert r.ping()
    srv.stop()
    with pytest.raises(redis.ConnectionError):
        r.ping()
    # the port can be bound again at once (SO_REUSEADDR, listener closed)
    srv2 = Server(store, port=port, threads=1, durability="none").start()
    assert redis.Redis(port=port).get("x") is None
    srv2.stop()


def test_server_reports_bind_errors_clearly():
    with Server(Store(), port=0, threads=1, durability="none") as srv:
        with pytest.raises(kvstore.ServerError, match=r"cannot listen on 127\.0\.0\.1:\d+"):
            Server(Store(), port=srv.port, threads=1, accept="handoff", durability="none").start()
    with pytest.raises(kvstore.ConfigError, match="bind: expected an IPv4 address"):
        Server(Store(), bind="localhost:1")


def test_node_lifecycle_health_and_stats(tmp_path):
    node = Node(port=0, threads=2, max_memory="16mb", data_dir=tmp_path)
    assert not node.health()
    with node:
        assert node.health()
        c = node.client()
        for i in range(100):
            c.set(f"k{i}", "v" * 85)
        st = node.stats()
        assert st["total_commands_processed"] >= 100
        assert st["maxmemory"] == 16 * 1024 * 1024  # Redis units: mb = 1024*1024
        assert len(st["poller_stats"]) == 2
        assert sum(p["commands"] for p in st["poller_stats"]) >= 100
        assert st["total_epoll_wait_calls"] > 0 and st["total_read_calls"] > 0
        pid = node.pid
        c.close()
    assert not node.health()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_node_exit_code_on_sigterm_is_zero(tmp_path):
    node = Node(port=0, threads=1, data_dir=tmp_path).start()
    c = node.client()
    c.set("a", "b")
    assert node.stop(sig=signal.SIGTERM) == 0
    assert "kvstore stopped" in node.log()


def test_node_start_failure_has_the_reason(tmp_path):
    with Node(port=0, data_dir=tmp_path / "a") as first:
        n = Node(port=first.port, data_dir=tmp_path / "b")
        with pytest.raises(kvstore.ServerError, match="cannot listen"):
            n.start()


def test_client_kvstore_stats_counts_syscalls():
    with Server(Store(), port=0, threads=1, durability="none") as srv:
        c = kvstore.Client(port=srv.port)
        before = c.kvstore_stats()
        p = c.pipeline(transaction=False)
        for i in range(1000):
            p.set(f"k{i}", i)
        p.execute()
        after = c.kvstore_stats()
        assert after["total_commands_processed"] - before["total_commands_processed"] >= 1000
        # a pipeline of 1000 commands needs far fewer reads/writes than commands
        reads = after["total_read_calls"] - before["total_read_calls"]
        writes = after["total_write_calls"] - before["total_write_calls"]
        assert 0 < reads < 200 and 0 < writes < 200
        # direct policy: replies written at the end of the round, no EPOLLOUT churn
        assert after["total_epoll_ctl_calls"] - before["total_epoll_ctl_calls"] <= 2
        c.close()


def test_python_threads_and_server_concurrently():
    store = Store()
    with Server(store, port=0, threads=2, durability="none") as srv:
        errors = []

        def py_writer(t):
            try:
                for i in range(2000):
                    store.set(f"py{t}:{i}", str(i))
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        def resp_writer(t):
            try:
                r = redis.Redis(port=srv.port)
                p = r.pipeline(transaction=False)
                for i in range(2000):
                    p.set(f"rs{t}:{i}", str(i))
                p.execute()
                r.close()
            except Exception as e:  # pragma: no cover
                errors.append(e)

        ts = [threading.Thread(target=f, args=(t,)) for t in range(2) for f in (py_writer, resp_writer)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors
        assert len(store) == 8000
        assert store.get("rs1:1999") == b"1999" and store.get("py0:0") == b"0"
