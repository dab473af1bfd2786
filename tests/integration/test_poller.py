"""The poller front end (--arch poller: ext/server/server.c) and its poll policies
(direct, strict, flexpoll) with both accept modes: real servers, redis-py and raw
sockets. The policies' own unit tests are in tests/unit/test_pollpolicy.py."""
import socket
import time

import pytest

from helpers.conn import Raw, client
from helpers.resp import resp_cmd

pytestmark = pytest.mark.timeout(60)

C = resp_cmd


@pytest.mark.timeout(60)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("poll_policy", ["direct", "strict", "flexpoll"])
@pytest.mark.parametrize("accept", ["reuseport", "handoff"])
def test_smoke_modes(kv_node_factory, accept, poll_policy, threads):
    n = kv_node_factory(accept=accept, poll_policy=poll_policy, threads=threads)
    clients = [client(n.port, decode_responses=True, single_connection_client=True, protocol=2 + i % 2)
               for i in range(6)]  # RESP2 and RESP3 connections side by side
    try:
        for i, cl in enumerate(clients):
            assert cl.ping()
            assert cl.set(f"k{i}", f"v{i}")
        for i, cl in enumerate(clients):
            assert cl.get(f"k{(i + 1) % 6}") == f"v{(i + 1) % 6}"
            assert cl.incr("shared") >= 1
        assert clients[0].get("shared") == "6"
        p = clients[1].pipeline(transaction=False)
        for i in range(500):
            p.set(f"p{i}", "x" * (i % 50))
            p.strlen(f"p{i}")
        res = p.execute()
        assert res[1::2] == [i % 50 for i in range(500)]
        big = "y" * 300_000
        assert clients[2].set("big", big) and clients[3].get("big") == big
        info = clients[0].info("everything")
        assert info["poll_policy"] == poll_policy
        assert info["accept_mode"] == accept
        assert info["pollers"] == threads
        assert len([k for k in info if k.startswith("poller") and k[6:].isdigit()]) == threads
        assert info["connected_clients"] >= 6
    finally:
        for cl in clients:
            cl.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("poll_policy", ["strict", "flexpoll", "direct"])
def test_replies_held_for_the_log_do_not_spin_the_poller(kv_node_factory, monkeypatch, poll_policy):
    """While a reply waits for a slow log sync, nothing can be sent: a policy that kept
    EPOLLOUT registered then would wake its poller every round (a busy loop)."""
    monkeypatch.setenv("KVSTORE_FAULT_SYNC_DELAY_US", "20000")  # every log sync takes 20 ms
    n = kv_node_factory(durability="disk", poll_policy=poll_policy, threads=1)
    c = client(n.port, single_connection_client=True)
    try:
        before = c.info("pollers")["total_epoll_wait_calls"]
        t0 = time.monotonic()
        for i in range(30):  # each SET waits ~20 ms for its group's sync
            assert c.set(f"h{i}", i)
        waits = c.info("pollers")["total_epoll_wait_calls"] - before
        ticks = (time.monotonic() - t0) / 0.1  # the cron's epoll timeout (TCP_CRON_MS)
    finally:
        c.close()
    # per request: a wake-up for it, one for the log, a cron tick every 100 ms (more of them
    # when a loaded machine makes the 30 SETs slow; flexpoll's EPOLLOUT stays registered,
    # edge-triggered: no wake-up while the reply waits); a spinning poller would make
    # thousands in each 20 ms wait
    assert waits < 30 * 15 + 2 * ticks, f"{waits} epoll_wait calls for 30 held replies ({poll_policy})"


@pytest.mark.parametrize("poll_policy", ["strict", "flexpoll", "direct"])
def test_a_peer_that_closes_after_sending_is_let_go(kv_node_factory, poll_policy):
    """The last bytes and the FIN often arrive together, and one read takes both: an
    edge-triggered registration (flexpoll's) does not report the EOF left behind, so the
    server must look for it, or the connection stays open for good."""
    n = kv_node_factory(poll_policy=poll_policy, threads=1)
    for i in range(20):
        with Raw(n.port) as r:  # half a request, a whole one, a request and a pipeline
            r.send([b"*3\r\n$3\r\nSET\r\n$4\r\nhalf", b"*1\r\n$4\r\nPING\r\n",
                    b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n" * (i + 1), b"PING\r\n"][i % 4])
    with client(n.port) as c:
        deadline = time.monotonic() + 30  # generous for a loaded machine; the bug kept them for good
        while c.info("clients")["connected_clients"] > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.info("clients")["connected_clients"] == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("poll_policy", ["strict", "flexpoll", "direct"])
def test_every_held_reply_arrives_under_load(kv_node_factory, poll_policy):
    """Replies held for the log leave when it syncs, whatever the policy: with flexpoll's
    edge-triggered EPOLLOUT, a reply that became durable just after its round's write
    attempt was once left unsent for good (the client then waits forever)."""
    from kvstore import bench
    n = kv_node_factory(poll_policy=poll_policy, threads=2, durability="disk", data_file=False)
    for pipeline, conns in ((1, 50), (16, 2)):
        r = bench.run(port=n.port, threads=2, conns=conns, pipeline=pipeline, requests=150_000, value_size=85,
                      keyspace=1_000_000, ratio="1:0")
        assert r["errors"] == 0 and r["requests"] == 150_000, r


def test_closed_connection_gets_no_events_after_fork(tmp_path):
    """A forked child keeps copies of the server's sockets; a connection the
    server closes must still leave its epoll set (no events for freed memory)."""
    import os

    from kvstore import Server, Store

    with Server(Store(), port=0, threads=1, durability="none") as srv:
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(C("PING"))
        assert s.recv(100) == b"+PONG\r\n"
        pid = os.fork()
        if pid == 0:  # the child holds every descriptor for a while, then leaves
            time.sleep(1.5)
            os._exit(0)
        try:
            s.sendall(C("QUIT"))
            assert s.recv(100) == b"+OK\r\n"
            for _ in range(20):  # the socket stays open in the child: these reach the server
                s.sendall(C("PING"))
                time.sleep(0.01)
            with client(srv.port) as cl:
                assert cl.ping() and cl.set("after", "fork") and cl.get("after") == b"fork"
        finally:
            s.close()
            os.waitpid(pid, 0)


@pytest.mark.timeout(60)
def test_a_large_reply_buffer_is_kept_while_used_and_given_back_when_idle(kv_node_factory):
    """32 pipelined 4 KiB GETs take a connection's reply buffer past 64 KB (TCP_BUF_KEEP).
    It used to shrink back whenever the batch was sent, and grow again for the next one:
    mremap calls and a page fault per 4 KB page, every batch. It stays while the client
    keeps using it, and shrinks once the client has left it idle (TCP_BUF_IDLE_MS, 1 s)."""
    n = kv_node_factory(threads=1)
    keep = 64 * 1024
    with client(n.port, single_connection_client=True) as watcher, Raw(n.port) as c:
        assert c.call("SET", "block", b"b" * 4096) == b"OK"
        me = c.call("CLIENT", "ID")

        def rbs():
            return next(int(x["rbs"]) for x in watcher.client_list() if int(x["id"]) == me)

        kept = []
        for _ in range(5):  # (a stall of more than 1 s on a loaded machine may shrink it once)
            c.send(C("GET", "block") * 32)  # one write: one read, one batch of replies
            assert c.replies(32) == [b"$4096\r\n" + b"b" * 4096 + b"\r\n"] * 32
            kept.append(rbs())
            if kept[-1] > keep:
                break
        assert max(kept) > keep, f"the reply buffer was shrunk after each batch: rbs {kept}"
        deadline = time.monotonic() + 30  # generous for a loaded machine: the bug kept it for good
        while rbs() > keep and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rbs() <= keep, "an idle client kept its large reply buffer"
        assert c.call("GET", "block") == b"b" * 4096
