"""Hostile and heavy clients: garbage, absurd lengths, half requests, a client that
never reads, 1,000 connections, maxclients, and shutdown by signal while clients
are connected. The server must stay bounded, keep serving others, and stay up."""
import asyncio
import random
import signal
import socket
import time

import pytest
import redis

from helpers.conn import Raw, client
from helpers.resp import Incomplete, resp_cmd, resp_reply_end
from helpers.servers import raise_nofile, rss_bytes, start_node, stop_node

pytestmark = pytest.mark.timeout(90)

C = resp_cmd
MB = 1024 * 1024


@pytest.fixture(scope="module")
def node():
    raise_nofile(4096)  # the server inherits the limit: 1,000 clients need fds on both sides
    n = start_node(threads=2)
    yield n
    stop_node(n)


def assert_serving(n):
    assert n.proc.poll() is None, f"server died: {n.log()[-2000:]}"
    with Raw(n.port) as r:
        assert r.send(C("PING")).reply() == b"+PONG\r\n"
        assert r.send(C("SET", "alive", "yes") + C("GET", "alive")).replies(2) == [
            b"+OK\r\n", b"$3\r\nyes\r\n"]


def stat(n, field, section="everything"):
    with Raw(n.port) as r:
        text = r.call("INFO", section).decode()
    for line in text.split("\r\n"):
        if line.startswith(field + ":"):
            return int(line.split(":", 1)[1])
    raise KeyError(field)


# ------------------------------------------------------------------ garbage

def test_random_garbage_on_several_connections(node):
    rng = random.Random(20240611)
    before_err = stat(node, "total_error_replies_protocol")
    closed_count = 0
    for i in range(12):
        with Raw(node.port, timeout=3) as r:
            blob = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 40_000)))
            if i % 3 == 0:
                blob = b"*" + blob          # looks like a multibulk header
            elif i % 3 == 1:
                blob = b"*2\r\n$" + blob    # inside a multibulk
            try:
                for off in range(0, len(blob), 4096):
                    r.send(blob[off:off + 4096])
            except OSError:
                pass  # the server may close before everything is sent
            data, closed = r.read_until_close(timeout=2)
            closed_count += closed
            # whatever came back is well-formed RESP: replies and errors, nothing else
            pos = 0
            while pos < len(data):
                try:
                    pos = resp_reply_end(data, pos)
                except Incomplete:
                    pytest.fail(f"truncated reply to garbage: {data[pos:pos + 100]!r}")
    assert closed_count >= 1
    assert stat(node, "total_error_replies_protocol") > before_err
    assert_serving(node)


def test_structured_fuzz(node):
    """Random mixes of valid and broken RESP pieces, many connections at once."""
    rng = random.Random(7)
    pieces = [b"*", b"$", b"\r\n", b"\r", b"\n", b"-1", b"0", b"3", b"99999999999", b"SET", b"GET", b"k",
              b"PING", b"\x00", b"\"", b"'", b" ", b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", b"$-1\r\n",
              b"*1\r\n$4\r\nPING\r\n", b"*-5\r\n", b":1\r\n"]
    conns = [Raw(node.port, timeout=3) for _ in range(20)]
    try:
        for _round in range(30):
            for r in conns:
                if r.eof:
                    continue
                msg = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 30)))
                try:
                    r.send(msg)
                except OSError:
                    r.eof = True
        for r in conns:
            r.read_until_close(timeout=0.2)
    finally:
        for r in conns:
            r.close()
    assert_serving(node)


# ------------------------------------------------------------------ absurd lengths, partial requests

def test_2gb_bulk_length(node):
    rss0 = rss_bytes(node.pid)
    with Raw(node.port) as r:
        r.send(b"*1\r\n$2147483648\r\n")
        try:
            r.send(b"x" * 65536)
        except OSError:
            pass
        assert r.read_until_close(timeout=3) == (b"-ERR Protocol error: invalid bulk length\r\n", True)
    assert rss_bytes(node.pid) - rss0 < 64 * MB
    assert_serving(node)


def test_declared_512mb_bulk_not_allocated_up_front(node):
    """A legal 512 MB bulk length followed by a few bytes: memory follows what arrives."""
    rss0 = rss_bytes(node.pid)
    socks = []
    for _ in range(8):
        r = Raw(node.port)
        r.send(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$536870912\r\n" + b"x" * 100_000)
        socks.append(r)
    time.sleep(0.5)
    grown = rss_bytes(node.pid) - rss0
    for r in socks:
        r.close()
    assert grown < 128 * MB, f"RSS grew {grown / MB:.0f} MB for 8 clients that sent 100 KB each"
    assert_serving(node)


def test_half_command_then_disconnect(node):
    halves = [b"*3\r\n$3\r\nSET\r\n$4\r\nhalf\r\n$5\r\nva", b"*3\r\n$3\r\nSET\r\n$4\r\nhalf",
              b"*3\r\n", b"*3\r\n$3\r\nSE", b"SET half inline-without-newline", b"*1\r\n$4\r\nPING\r"]
    for _ in range(10):
        for h in halves:
            with Raw(node.port) as r:
                r.send(h)
    # one with a shut-down write side: replies to complete requests still arrive
    with Raw(node.port) as r:
        r.send(C("SET", "half2", "ok") + C("GET", "half2") + b"*2\r\n$3\r\nGET")
        r.sock.shutdown(socket.SHUT_WR)
        data, closed = r.read_until_close(timeout=3)
        assert data == b"+OK\r\n$2\r\nok\r\n" and closed
    with Raw(node.port) as r:
        assert r.call("EXISTS", "half") == 0
    assert_serving(node)


# ------------------------------------------------------------------ a client that never reads

@pytest.mark.timeout(120)
def test_pipelining_client_that_never_reads(node):
    with client(node.port) as cl:
        cl.set("big", b"z" * (256 * 1024))
    rss0 = rss_bytes(node.pid)
    hog = socket.create_connection(("127.0.0.1", node.port))
    hog.setblocking(False)
    req = C("GET", "big") * 200  # 200 x 256 KB of replies per 3 KB sent
    sent_reqs, blocked_since, deadline = 0, None, time.monotonic() + 8
    try:
        while time.monotonic() < deadline and sent_reqs < 2_000_000:
            try:
                n = hog.send(req)
                sent_reqs += n // len(C("GET", "big"))
                blocked_since = None
            except BlockingIOError:
                blocked_since = blocked_since or time.monotonic()
                if time.monotonic() - blocked_since > 1.5:
                    break  # the server stopped reading us: back-pressure works
                time.sleep(0.01)
        assert blocked_since is not None, "server kept reading an endless pipeline"
        time.sleep(0.5)
        grown = rss_bytes(node.pid) - rss0
        # replies owed: sent_reqs x 256 KB (gigabytes); the server must hold only a bounded part
        assert grown < 256 * MB, f"RSS grew {grown / MB:.0f} MB while {sent_reqs} GETs of 256 KB were owed"
        # others are still served meanwhile
        with client(node.port, socket_timeout=30) as other:
            assert other.ping()
            assert other.set("while-hog", "1") and other.get("while-hog") == b"1"
            assert len(other.get("big")) == 256 * 1024
        assert stat(node, "used_memory") < 64 * MB
    finally:
        hog.close()
    assert_serving(node)


# ------------------------------------------------------------------ 1,000 connections

async def _many_clients(port, n):
    conns = []
    for i in range(n):
        for attempt in range(50):
            try:
                conns.append(await asyncio.open_connection("127.0.0.1", port))
                break
            except OSError:
                await asyncio.sleep(0.05)  # listen backlog full for a moment
        else:
            raise AssertionError(f"could not open connection {i}")

    async def one(i, reader, writer):
        for rnd in range(3):
            key, val = f"conn:{i}".encode(), f"value-{i}-{rnd}".encode()
            writer.write(C("SET", key, val) + C("GET", key))
            await writer.drain()
            ok = await reader.readexactly(5)
            assert ok == b"+OK\r\n", (i, ok)
            head = await reader.readuntil(b"\r\n")
            assert head == b"$%d\r\n" % len(val), (i, head)
            body = await reader.readexactly(len(val) + 2)
            assert body == val + b"\r\n", (i, body)
        return i

    res = await asyncio.wait_for(asyncio.gather(*(one(i, r, w) for i, (r, w) in enumerate(conns))), 60)
    return conns, res


@pytest.mark.timeout(120)
def test_1000_concurrent_connections(node):
    n = 1000
    if raise_nofile(n + 200) < n + 100:
        pytest.skip("cannot raise RLIMIT_NOFILE for 1,000 sockets")
    loop = asyncio.new_event_loop()
    try:
        conns, res = loop.run_until_complete(_many_clients(node.port, n))
        assert sorted(res) == list(range(n))
        assert stat(node, "connected_clients") >= n
        with client(node.port) as cl:
            vals = cl.mget([f"conn:{i}" for i in range(n)])
        assert vals == [f"value-{i}-2".encode() for i in range(n)]
        for _, w in conns:
            w.close()
        loop.run_until_complete(asyncio.sleep(0.1))
    finally:
        loop.close()
    deadline = time.monotonic() + 60  # a wait: generous for a loaded machine
    while stat(node, "connected_clients") > 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stat(node, "connected_clients") <= 5
    assert_serving(node)


# ------------------------------------------------------------------ maxclients

def test_maxclients(kv_node_factory):
    n = kv_node_factory(maxclients=5)
    first = [Raw(n.port) for _ in range(5)]
    try:
        for r in first:
            assert r.send(C("PING")).reply() == b"+PONG\r\n"
        with Raw(n.port) as sixth:
            assert sixth.read_until_close(timeout=3) == (b"-ERR max number of clients reached\r\n", True)
        for i, r in enumerate(first):
            assert r.call("SET", f"m{i}", i) == b"OK"
            assert r.call("GET", f"m{i}") == str(i).encode()
        info = first[0].call("INFO", "everything").decode()
        assert "\r\nrejected_connections:1\r\n" in info
        assert "\r\nconnected_clients:5\r\n" in info
        # a slot freed is a slot usable again
        first.pop().close()
        deadline = time.monotonic() + 30  # a wait: generous for a loaded machine
        while True:
            with Raw(n.port) as again:
                rep = again.send(C("PING")).read_for(1)[0]
            if rep == b"+PONG\r\n" or time.monotonic() > deadline:
                break
        assert rep == b"+PONG\r\n"
    finally:
        for r in first:
            r.close()
    assert n.proc.poll() is None


# ------------------------------------------------------------------ everything above survived

def test_server_still_alive_after_all(node):
    assert_serving(node)
    with client(node.port) as cl:
        assert cl.get("while-hog") == b"1"


# ------------------------------------------------------------------ signals

@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_server_with_clients_connected(sig):
    n = start_node(threads=2)
    conns = []
    try:
        for i in range(10):
            r = Raw(n.port)
            assert r.call("SET", f"s{i}", "v") == b"OK"
            conns.append(r)
        conns[0].send(b"*3\r\n$3\r\nSET\r\n")       # half a request pending
        hog = Raw(n.port)                             # unread replies pending
        hog.send(C("PING") * 10_000)
        conns.append(hog)
        cl = client(n.port)
        assert cl.ping()
        t0 = time.monotonic()
        n.proc.send_signal(sig)
        rc = n.proc.wait(timeout=15)
        took = time.monotonic() - t0
        assert rc == 0, f"exit code {rc}; log: {n.log()[-2000:]}"
        assert took < 5, f"took {took:.1f} s to stop"
        for r in conns[1:-1]:
            assert r.read_until_close(timeout=3) == (b"", True)
        cl.close()
    finally:
        for r in conns:
            r.close()
        stop_node(n)


def test_inline_request_behind_a_paused_batch(node):
    """Five 1 MiB GETs pause the client mid-batch (4 MiB of unsent replies); the
    inline request after them, unescaped in place when parsed, must still run as
    written once the client drains (it is never parsed twice)."""
    with client(node.port) as cl:
        cl.set("big1m", b"b" * (1 << 20))
    with Raw(node.port, timeout=10) as r:
        r.send(C("GET", "big1m") * 5 + b'SET inl "\\x41B"\r\n' + C("GET", "inl"))
        for _ in range(5):
            assert r.reply() == b"$1048576\r\n" + b"b" * (1 << 20) + b"\r\n"
        assert r.reply() == b"+OK\r\n"
        assert r.reply() == b"$2\r\nAB\r\n"


def test_mset_all_or_nothing_at_the_memory_bound(kv_node_factory):
    """MSET checks the bound once for the whole command: near the bound it is
    refused whole or applied whole, never half (Redis's semantics)."""
    n = kv_node_factory()
    with client(n.port) as cl:
        for room_per_key in (56, 60, 64, 120, 400):  # around the real cost of a small entry
            cl.flushall()
            used = int(cl.info("memory")["used_memory"])
            cl.config_set("maxmemory", used + 2000 * room_per_key)
            pairs = {f"k{i:05d}": "v" for i in range(2000)}
            try:
                assert cl.mset(pairs) is True
                assert cl.dbsize() == 2000
            except redis.exceptions.OutOfMemoryError:
                assert cl.dbsize() == 0, f"MSET half applied with {room_per_key} bytes of room per key"
        cl.config_set("maxmemory", 0)
