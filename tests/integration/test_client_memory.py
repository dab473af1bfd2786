"""Client memory (ext/cmd/client_mem.c, issue 12 items 4 and 8): the sum over every
connection bounded by maxmemory-clients (its default: 10% of --max-memory, at least
64 MB), replies built under that bound, argument arrays costing about what was
received, and the memory of clients that leave given back. Measured as the server's
RSS, never as exact counts. The servers here run with --max-memory 256mb and
--maxclients 1100 (a default client bound of 64 MB + 1100 x 20 KB = 86 MB) and
otherwise default settings, so that a server without the bound shows the growth
these tests refuse. The giant MGET, the non-reading clients and the empty bulks run
against both TCP front ends: the pollers and the thread pool (--arch threadpool, whose
workers publish their connections' memory as the pollers do)."""
import socket
import time

import pytest

from helpers.conn import Raw
from helpers.servers import raise_nofile, rss_bytes, start_node, stop_node

MB = 1024 * 1024


def info(node, section):
    with Raw(node.port) as r:
        text = r.call("INFO", section).decode()
    return {k: v for k, _, v in (line.partition(":") for line in text.split("\r\n")) if v}


def serving(node):
    with Raw(node.port) as r:
        return r.call("PING") == b"PONG"


def read_to_close(sock, timeout):
    """Bytes read until the server closed the connection (or timeout); (bytes, closed)."""
    got, end = 0, time.monotonic() + timeout
    sock.settimeout(0.5)
    while time.monotonic() < end:
        try:
            d = sock.recv(1 << 20)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return got, True
        if not d:
            return got, True
        got += len(d)
    return got, False


def peak_rss_since(pid):
    """Reset the process's peak RSS (VmHWM) to its RSS now; returns a function
    giving how far the peak has risen above that since (a reply built and dropped at
    once leaves no trace in the RSS a moment later, but does in the peak)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    rss0 = rss_bytes(pid)

    def risen():
        with open(f"/proc/{pid}/status") as f:
            hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
        return hwm - rss0
    return risen


def command(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


@pytest.fixture
def node(request):
    """A server with an 86 MB client bound; request.param (indirect) the front end: the
    pollers (2 threads) or the thread pool (its default 32 workers: each blocks on one
    client, so it takes that many to hold much memory at once)."""
    arch = getattr(request, "param", "poller")
    n = start_node(arch=arch, threads=2 if arch == "poller" else 32, max_memory="256mb", maxclients=1100)
    yield n
    stop_node(n)


@pytest.fixture
def slow_node(request):
    """node's bound, 2 threads, and a thread pool that waits 30 s for a client to read."""
    n = start_node(arch=request.param, threads=2, max_memory="256mb", maxclients=1100, client_timeout_ms=30000)
    yield n
    stop_node(n)


both_archs = pytest.mark.parametrize("node", ["poller", "threadpool"], indirect=True)


@both_archs
def test_giant_mget_is_not_built(node):
    """MGET of one 100 KB key 3,000 times asks a 300 MB reply of a 12 KB request: the
    reply stops at the client bound (86 MB here) and the client is closed."""
    with Raw(node.port) as r:
        assert r.call("SET", "big", "x" * 100_000) == b"OK"
    rss0 = rss_bytes(node.pid)
    s = socket.create_connection(("127.0.0.1", node.port))
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        s.sendall(command("MGET", *["big"] * 3000))
        time.sleep(1.0)  # the reply, if built, is built by now (and mostly unread)
        grown = rss_bytes(node.pid) - rss0
        got, closed = read_to_close(s, timeout=20)
    finally:
        s.close()
    assert grown < 150 * MB, f"RSS grew {grown / MB:.0f} MB for one MGET (client bound 86 MB)"
    assert closed and got < 86 * MB
    assert serving(node)
    assert int(info(node, "stats")["evicted_clients"]) >= 1


@pytest.mark.parametrize("slow_node", ["poller", "threadpool"], indirect=True)
def test_giant_mget_counts_what_other_clients_hold(slow_node):
    """A client that does not read holds an 80 MB reply (under the 86 MB bound); then a
    second client's 300 MB MGET may build only what the bound leaves (6 MB), and is
    closed. The thread pool's worker blocked sending the first reply used to hold it
    uncounted, and the second reply was built to 86 MB beside it."""
    node = slow_node
    with Raw(node.port) as r:
        assert r.call("SET", "big", "x" * 100_000) == b"OK"
    risen = peak_rss_since(node.pid)
    holder, giant = socket.socket(), socket.socket()
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        holder.connect(("127.0.0.1", node.port))
        holder.sendall(command("MGET", *["big"] * 800))
        time.sleep(1.0)  # built by now, and mostly unsent
        giant.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        giant.connect(("127.0.0.1", node.port))
        giant.sendall(command("MGET", *["big"] * 3000))
        got, closed = read_to_close(giant, timeout=20)
        grown = risen()
    finally:
        giant.close()
        holder.close()
    assert grown < 150 * MB, f"peak RSS grew {grown / MB:.0f} MB for an 80 MB reply and a giant MGET (bound 86 MB)"
    assert closed and got < 20 * MB
    assert serving(node)
    assert int(info(node, "stats")["evicted_clients"]) >= 1


@both_archs
def test_thousand_non_reading_clients_bounded(node):
    """1,000 clients each asking MBs of replies and reading none: without a bound the
    pollers keep ~2 GB for them, and the thread pool's 32 workers each hold a 4 MB reply
    they cannot send (until --client-timeout-ms) while the rest wait. With it, the clients
    using most memory are closed once the sum passes 86 MB, and the server keeps answering."""
    raise_nofile(4096)
    with Raw(node.port) as r:
        assert r.call("SET", "v", "y" * 100_000) == b"OK"
    rss0 = rss_bytes(node.pid)
    if node.settings["arch"] == "poller":  # pipelined replies pile up in each connection's buffer
        pipeline = command("GET", "v") * 20
    else:  # a worker serves one request at a time: one large reply per client
        pipeline = command("MGET", *["v"] * 40)
    socks = []
    try:
        for _ in range(1000):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel keeps little for them
            s.connect(("127.0.0.1", node.port))
            s.sendall(pipeline)
            socks.append(s)
        peak, end = 0, time.monotonic() + 5
        while time.monotonic() < end:
            peak = max(peak, rss_bytes(node.pid) - rss0)
            time.sleep(0.1)
        assert serving(node)
        evicted = int(info(node, "stats").get("evicted_clients", 0))
    finally:
        for s in socks:
            s.close()
    assert peak < 256 * MB, f"RSS grew {peak / MB:.0f} MB for 1,000 non-reading clients (client bound 86 MB)"
    assert evicted > 0
    assert serving(node)


@both_archs
def test_empty_bulks_cost_what_they_take(node):
    """`*1000000000` then empty bulks ("$0\\r\\n\\r\\n", 6 bytes each): the argument array
    grows with what arrives, is counted with the query buffer, and the client is
    closed at the client bound instead of costing 3.7 bytes per byte received."""
    rss0 = rss_bytes(node.pid)
    chunk = b"$0\r\n\r\n" * (1 << 16)  # 384 KiB
    sent, closed = 0, False
    s = socket.create_connection(("127.0.0.1", node.port))
    try:
        s.sendall(b"*1000000000\r\n")
        s.settimeout(10)
        while sent < 96 * MB:
            try:
                s.sendall(chunk)
            except OSError:  # reset: closed by the server
                closed = True
                break
            sent += len(chunk)
        time.sleep(0.5)
        grown = rss_bytes(node.pid) - rss0
        if not closed:
            closed = read_to_close(s, timeout=5)[1]
    finally:
        s.close()
    assert grown < 160 * MB, f"RSS grew {grown / MB:.0f} MB for {sent / MB:.0f} MB of empty bulks"
    assert closed, "a 96 MB request of empty bulks passed a 64 MB client bound"
    assert serving(node)


def test_config_get_set_as_redis(node, redis_server):
    """maxmemory-clients (a size or a percentage) and client-output-buffer-limit as Redis 7
    takes them, errors included; the INFO fields exist where Redis has them."""
    def both(*args):
        with Raw(node.port) as a, Raw(redis_server.port) as b:
            return a.call(*args), b.call(*args)

    for args in (("CONFIG", "SET", "maxmemory-clients", "10%"), ("CONFIG", "GET", "maxmemory-clients"),
                 ("CONFIG", "SET", "maxmemory-clients", "32mb"), ("CONFIG", "SET", "maxmemory-clients", "nope"),
                 ("CONFIG", "SET", "client-output-buffer-limit", "normal 1mb 2"),
                 ("CONFIG", "SET", "client-output-buffer-limit", "other 1 2 3"),
                 ("CONFIG", "SET", "client-output-buffer-limit", "normal 1mb x 3"),
                 ("CONFIG", "SET", "client-output-buffer-limit", "normal 1mb 512kb 3")):
        ours, theirs = both(*args)
        assert ours == theirs, args
    with Raw(node.port) as r:
        assert r.call("CONFIG", "GET", "client-output-buffer-limit") == [b"client-output-buffer-limit",
                                                                         b"normal 1048576 524288 3"]
        assert r.call("CONFIG", "GET", "maxmemory-clients") == [b"maxmemory-clients", b"33554432"]
    for section, fields in (("clients", ["client_recent_max_input_buffer", "client_recent_max_output_buffer",
                                         "blocked_clients"]),
                            ("memory", ["mem_clients_normal", "mem_clients_slaves"]),
                            ("stats", ["evicted_clients"])):
        ours, theirs = info(node, section), info(redis_server, section)
        for f in fields:
            assert f in ours and f in theirs, f


def test_output_buffer_hard_limit_closes_the_client(node):
    """client-output-buffer-limit normal HARD: a reply past it (MGET's, KEYS's) is not
    sent; the client is closed and counted in client_output_buffer_limit_disconnections."""
    with Raw(node.port) as r:
        assert r.call("SET", "v", "z" * 100_000) == b"OK"
        for i in range(0, 20_000, 1000):
            assert r.call("MSET", *[x for j in range(i, i + 1000) for x in (f"key:{j:060}", "1")]) == b"OK"
        assert r.call("CONFIG", "SET", "client-output-buffer-limit", "normal 1mb 0 0") == b"OK"
    for request in (command("MGET", *["v"] * 50), command("KEYS", "*")):  # 5 MB, 1.4 MB
        s = socket.create_connection(("127.0.0.1", node.port))
        try:
            s.sendall(request)
            got, closed = read_to_close(s, timeout=10)
        finally:
            s.close()
        assert closed and got < 1 * MB, request[:20]
    assert int(info(node, "stats")["client_output_buffer_limit_disconnections"]) >= 2
    with Raw(node.port) as r:  # replies under the limit are served
        assert r.call("MGET", "v", "v") == [b"z" * 100_000] * 2


def test_half_command_clients_memory_given_back():
    """5,000 clients each sending 40 KB of a 100 KB bulk, then leaving: the memory their
    input buffers took goes back to the system (kvstore kept 324 MB of it, Redis 78 MB)."""
    if raise_nofile(12000) < 12000:
        pytest.skip("needs 12,000 file descriptors")
    n = start_node(threads=2, max_memory="4gb")  # a 400 MB client bound: none of them evicted
    try:
        rss0 = rss_bytes(n.pid)
        half = command("SET", "k", "x" * 100_000)[:-60_000]
        socks = []
        try:
            for _ in range(5000):
                s = socket.create_connection(("127.0.0.1", n.port))
                s.sendall(half)
                socks.append(s)
            time.sleep(1.0)
            peak = rss_bytes(n.pid) - rss0
        finally:
            for s in socks:
                s.close()
        kept, end = peak, time.monotonic() + 10
        while time.monotonic() < end and kept > peak // 4:
            time.sleep(0.5)
            kept = rss_bytes(n.pid) - rss0
        assert serving(n)
    finally:
        stop_node(n)
    assert peak > 100 * MB, f"5,000 half commands took only {peak / MB:.0f} MB: the test measures nothing"
    assert kept < peak // 4, f"{kept / MB:.0f} MB of {peak / MB:.0f} MB kept after the clients left"


def test_output_buffer_soft_limit_closes_a_slow_reader(node):
    """client-output-buffer-limit normal 0 SOFT SECONDS: a client that keeps asking while
    its unsent replies stay above SOFT for SECONDS is closed (and counted)."""
    with Raw(node.port) as r:
        assert r.call("SET", "v", "w" * 50_000) == b"OK"
        assert r.call("CONFIG", "SET", "client-output-buffer-limit", "normal 0 256kb 1") == b"OK"
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", node.port))
    closed, end = False, time.monotonic() + 8
    try:
        while time.monotonic() < end and not closed:
            try:
                s.sendall(command("GET", "v"))
            except OSError:
                closed = True
            time.sleep(0.05)
        if not closed:
            closed = read_to_close(s, timeout=2)[1]
    finally:
        s.close()
    assert closed, "a client above the soft limit for 8 s was not closed"
    assert int(info(node, "stats").get("client_output_buffer_limit_disconnections", 0)) >= 1
    assert serving(node)
