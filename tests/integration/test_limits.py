"""Client limits (issue 12, items 3, 5 and 8's AUTH): the thread pool's per-worker timeouts
(--client-timeout-ms) against stalled clients, the open-file limit below maxclients (Redis's
adjustOpenFilesLimit, EMFILE on accept) and failed AUTHs closing the connection."""
import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from helpers.conn import Raw
from helpers.resp import resp_cmd
from helpers.servers import RedisServer, raise_nofile, stop_node
from kvstore import Node

pytestmark = pytest.mark.timeout(180)

C = resp_cmd
MAXCLIENTS_REPLY = b"-ERR max number of clients reached\r\n"


def info_int(port, field, section="everything"):
    with Raw(port) as r:
        text = r.call("INFO", section).decode()
    for line in text.split("\r\n"):
        if line.startswith(field + ":"):
            return int(line.split(":", 1)[1])
    raise KeyError(field)


def ping_within(port, seconds):
    """True if a new connection gets +PONG within `seconds` (connect and reply included)."""
    try:
        with Raw(port, timeout=seconds) as r:
            return r.send(C("PING")).reply(timeout=seconds) == b"+PONG\r\n"
    except (TimeoutError, socket.timeout, EOFError, ConnectionError):
        return False


def wait_for(pred, seconds):
    """pred() until true or `seconds` pass (a wait, generous for a loaded machine)."""
    deadline = time.monotonic() + seconds
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


# ------------------------------------------------------------------ thread pool: stalled clients

def test_threadpool_32_half_requests_do_not_freeze_it(kv_node_factory):
    """32 connections each send `*1\\r\\n` (a request begun, never finished): with the default
    32 workers every one of them used to wait forever for the rest, and PING never answered."""
    n = kv_node_factory(arch="threadpool", threads=0)  # 0: the pool's default, 32 workers
    stalled = [Raw(n.port, timeout=30) for _ in range(32)]
    try:
        for r in stalled:
            r.send(b"*1\r\n")
        assert ping_within(n.port, 30), "PING did not answer while 32 clients stalled mid-request"
        for r in stalled:  # each one closed by its worker, with nothing sent
            assert r.read_until_close(timeout=30) == (b"", True)
        assert wait_for(lambda: info_int(n.port, "client_timeout_disconnections") >= 32, 30)
        assert "stalled 1000 ms mid-request or not reading its reply" in n.log()
    finally:
        for r in stalled:
            r.close()
    with Raw(n.port) as r:  # served as before
        assert r.send(C("SET", "k", "v") + C("GET", "k")).replies(2) == [b"+OK\r\n", b"$1\r\nv\r\n"]


def test_threadpool_32_clients_that_never_read_do_not_freeze_it(kv_node_factory):
    """32 clients pipeline GETs of a 512 KB value and never read: each worker's send blocks
    once the socket buffers are full. Closed after --client-timeout-ms; PING answers."""
    n = kv_node_factory(arch="threadpool", threads=0, client_timeout_ms=500)
    with Raw(n.port) as r:
        assert r.call("SET", "big", "x" * (512 * 1024)) == b"OK"
    readers = []
    try:
        for _ in range(32):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
            s.settimeout(30)
            s.connect(("127.0.0.1", n.port))
            readers.append(s)
            s.sendall(C("GET", "big") * 16)  # 8 MB of replies, more than the kernel buffers hold
        assert ping_within(n.port, 30), "PING did not answer while 32 clients did not read"
        assert wait_for(lambda: info_int(n.port, "client_timeout_disconnections") >= 32, 60)
    finally:
        for s in readers:
            s.close()
    assert ping_within(n.port, 10)


def test_client_timeout_is_a_bound_on_a_stall_not_on_a_request(kv_node_factory):
    """A request sent slowly, each piece within the timeout, is served: the bound restarts
    whenever bytes arrive, so a slow but steady client is not cut off."""
    n = kv_node_factory(arch="threadpool", threads=2, client_timeout_ms=1000)
    req = C("SET", "slow", "v" * 100)
    with Raw(n.port, timeout=30) as r:
        for i in range(0, len(req), 40):
            r.send(req[i:i + 40])
            time.sleep(0.2)  # well below the timeout, 5 pieces: longer than it in total
        assert r.reply(timeout=30) == b"+OK\r\n"
    assert info_int(n.port, "client_timeout_disconnections") == 0


# ------------------------------------------------------------------ open-file limit

class LimitedNode(Node):
    """A node started under `prlimit --nofile=1024:1024`. As root, CAP_SYS_RESOURCE is also
    dropped (setpriv), or the server could raise its hard limit and never be short of fds."""

    def command(self):
        wrap = ["prlimit", "--nofile=1024:1024", "--"]
        if os.geteuid() == 0:
            wrap = ["setpriv", "--inh-caps", "-sys_resource", "--bounding-set", "-sys_resource"] + wrap
        return wrap + super().command()


async def _attempt(port, hold, held, outcomes):
    """One connection attempt: PING. hold: keep the connection if served. Records what the
    attempt got: served, refused (Redis's error, then closed) or reset (refused and closed
    with our PING unread: the kernel resets, which may drop the error line)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
    except (OSError, asyncio.TimeoutError) as e:
        outcomes.append(f"connect failed: {e!r}")
        return
    try:
        writer.write(C("PING"))
        line = await asyncio.wait_for(reader.readline(), 30)
    except asyncio.TimeoutError:
        outcomes.append("hung")
        writer.close()
        return
    except ConnectionError:
        line = b"reset"
    if line == b"+PONG\r\n" and hold:
        held.append(writer)
        outcomes.append("served")
        return
    outcomes.append({b"+PONG\r\n": "served", MAXCLIENTS_REPLY: "refused", b"reset": "reset",
                     b"": "reset"}.get(line, f"other: {line[:80]!r}"))
    writer.close()


async def _flood(port, hold_n, total, concurrency):
    held, first, rest = [], [], []
    for i in range(0, hold_n, 100):  # fill the server, 100 at a time
        await asyncio.gather(*(_attempt(port, True, held, first) for _ in range(min(100, hold_n - i))))
    sem = asyncio.Semaphore(concurrency)

    async def one():
        async with sem:
            await _attempt(port, False, held, rest)
    await asyncio.gather(*(one() for _ in range(total - hold_n)))
    return held, first, rest


def flood(port, hold_n, total, concurrency, while_full=None):
    """hold_n attempts that keep what is served, then the rest (`concurrency` at a time) that
    close at once; while_full() runs before the held ones close. (first, rest) outcomes;
    checks that every attempt was served or refused (none hung) and that the server
    answers PING afterwards."""
    loop = asyncio.new_event_loop()
    try:
        held, first, rest = loop.run_until_complete(_flood(port, hold_n, total, concurrency))
        assert set(first) | set(rest) <= {"served", "refused", "reset"}, sorted(set(first) | set(rest))[:5]
        if while_full:
            while_full()
        for w in held:
            w.close()
        loop.run_until_complete(asyncio.sleep(0.1))
    finally:
        loop.close()
    assert wait_for(lambda: ping_within(port, 5), 60), "the server stopped answering"
    return first, rest


@pytest.fixture
def limited_node(request):
    """A LimitedNode(arch=request.param, threads=2), stopped after the test."""
    if not shutil.which("prlimit") or (os.geteuid() == 0 and not shutil.which("setpriv")):
        pytest.skip("prlimit/setpriv (util-linux) are not installed")
    if raise_nofile(3000) < 2500:
        pytest.skip("cannot raise this process's RLIMIT_NOFILE for 1,200 held sockets")
    n = LimitedNode(port=0, data_dir=tempfile.mkdtemp(prefix="kvstore-test-"), durability="none",
                    threads=2, arch=request.param)
    n.start(timeout=60)
    yield n
    assert n.proc.poll() is None, f"server died: {n.log()[-2000:]}"
    stop_node(n)


@pytest.mark.parametrize("limited_node", ["poller", "threadpool"], indirect=True)
def test_nofile_1024_and_10000_connection_attempts(limited_node):
    """Started with 1024 descriptors (and maxclients' default 10,000): maxclients is lowered
    with Redis's log lines, and past it every client is told so, as by Redis."""
    n = limited_node
    log = n.log()
    assert "You requested maxclients of 10000 requiring at least" in log
    assert "maxclients has been reduced to" in log
    maxclients = info_int(n.port, "maxclients")
    assert 1 <= maxclients < 1024

    def full():
        with Raw(n.port) as r:  # a new client is told so and closed, at once
            assert r.read_until_close(timeout=10) == (MAXCLIENTS_REPLY, True)
    first, rest = flood(n.port, 1200, 10000, 100, full)
    assert "served" not in rest  # maxclients held: every later attempt refused
    assert first.count("served") <= maxclients and first.count("refused") >= 1  # told why, as by Redis
    assert info_int(n.port, "rejected_connections") >= 10000 - maxclients


@pytest.mark.parametrize("limited_node", ["poller", "threadpool"], indirect=True)
def test_out_of_fds_on_accept_refuses_and_keeps_serving(limited_node):
    """The fd limit lowered under a running server (prlimit --pid), below its maxclients: accept
    fails with EMFILE while connections wait. The reserved descriptor takes each one, answers
    Redis's error and closes it; the listener neither spins nor leaves clients hanging."""
    n = limited_node
    subprocess.run(["prlimit", f"--pid={n.pid}", "--nofile=200:200"], check=True)
    first, _ = flood(n.port, 400, 2000, 50)
    assert 1 <= first.count("served") < 200 and first.count("refused") >= 1
    assert "out of file descriptors" in n.log()


# ------------------------------------------------------------------ CONFIG: client-timeout-ms, maxclients

def config_error(port, *args):
    """The raw error line CONFIG answers to args."""
    with Raw(port) as r:
        return r.send(C("CONFIG", *args)).reply()


def test_config_get_set_client_timeout_ms(kv_node_factory):
    """CONFIG GET/SET client-timeout-ms, with Redis's errors for integer parameters; the
    new value bounds the workers' next wait (the log line names it)."""
    n = kv_node_factory(arch="threadpool", threads=2)
    with Raw(n.port) as r:
        assert r.call("CONFIG", "GET", "client-timeout-ms") == [b"client-timeout-ms", b"1000"]
        assert r.call("CONFIG", "SET", "client-timeout-ms", "300") == b"OK"
        assert r.call("CONFIG", "GET", "client-timeout*") == [b"client-timeout-ms", b"300"]
    prefix = b"-ERR CONFIG SET failed (possibly related to argument 'client-timeout-ms') - "
    assert config_error(n.port, "SET", "client-timeout-ms", "-1") == \
        prefix + b"argument must be between 0 and 3600000 inclusive\r\n"
    assert config_error(n.port, "SET", "client-timeout-ms", "soon") == \
        prefix + b"argument couldn't be parsed into an integer\r\n"
    with Raw(n.port, timeout=30) as r:
        r.send(b"*1\r\n")  # stalled mid-request: closed after 300 ms, no longer 1000
        assert r.read_until_close(timeout=30) == (b"", True)
    assert wait_for(lambda: "stalled 300 ms mid-request" in n.log(), 10)
    with Raw(n.port) as r:
        assert r.call("CONFIG", "GET", "client-timeout-ms") == [b"client-timeout-ms", b"300"]


def limited_redis(tmp_path):
    """A redis-server under the same limits as LimitedNode (a wrapper exec's it, so the
    helper's process handling is unchanged)."""
    wrapper = tmp_path / "redis-server-limited"
    drop = "setpriv --inh-caps -sys_resource --bounding-set -sys_resource " if os.geteuid() == 0 else ""
    wrapper.write_text(f"#!/bin/sh\nexec {drop}prlimit --nofile=1024:1024 -- {shutil.which('redis-server')} \"$@\"\n")
    wrapper.chmod(0o755)
    r = RedisServer()
    r.binary = str(wrapper)
    return r.start()


@pytest.mark.parametrize("limited_node", ["poller", "threadpool"], indirect=True)
def test_config_set_maxclients_checks_the_fd_limit(limited_node, tmp_path):
    """CONFIG SET maxclients re-checks the open-file limit as Redis does: above what 1024
    descriptors hold it is refused with Redis's error (naming what would fit) and left as
    it was; up to that it is taken, and enforced."""
    n = limited_node
    if not shutil.which("redis-server"):
        pytest.skip("redis-server is not installed")
    fits = info_int(n.port, "maxclients")  # lowered at start to what 1024 descriptors hold
    assert 1 <= fits < 1024
    redis = limited_redis(tmp_path)
    try:
        theirs = config_error(redis.port, "SET", "maxclients", "5000")
        for bad in ("0", "many"):
            assert config_error(n.port, "SET", "maxclients", bad) == config_error(redis.port, "SET", "maxclients", bad)
    finally:
        redis.stop()
    ours = config_error(n.port, "SET", "maxclients", "5000")
    text = b"-ERR CONFIG SET failed (possibly related to argument 'maxclients') - The operating system is not able " \
           b"to handle the specified number of clients, try with "
    assert theirs.startswith(text) and ours == text + b"%d\r\n" % fits
    assert config_error(n.port, "SET", "maxclients", str(fits + 1)).startswith(text)
    with Raw(n.port) as r:
        assert r.call("CONFIG", "GET", "maxclients") == [b"maxclients", b"%d" % fits]  # unchanged
        assert r.call("CONFIG", "SET", "maxclients", str(fits)) == b"OK"
        assert r.call("CONFIG", "SET", "maxclients", "2") == b"OK"  # lowering is always possible
        assert r.call("CONFIG", "GET", "maxclients") == [b"maxclients", b"2"]
        with Raw(n.port) as second, Raw(n.port) as third:  # this one and `second` fill it
            assert second.call("PING") == b"PONG"
            assert third.read_until_close(timeout=10) == (MAXCLIENTS_REPLY, True)


def test_config_set_maxclients_raises_the_fd_limit(kv_node_factory):
    """CONFIG SET maxclients raises the server's soft RLIMIT_NOFILE (up to the hard one) to
    hold the new value, as Redis's adjustOpenFilesLimit: the soft limit is first lowered
    under the running server (prlimit --pid), 2,000 below the hard one."""
    if not shutil.which("prlimit"):
        pytest.skip("prlimit (util-linux) is not installed")
    n = kv_node_factory(threads=2, maxclients=100)

    def limits():
        line = next(x for x in open(f"/proc/{n.pid}/limits") if x.startswith("Max open files"))
        return [int(v) if v != "unlimited" else 1 << 40 for v in line.split()[3:5]]
    hard = limits()[1]
    if hard < 4000:
        pytest.skip(f"the hard open-file limit ({hard}) is below 4000")
    soft = hard - 2000
    subprocess.run(["prlimit", f"--pid={n.pid}", f"--nofile={soft}:{hard}"], check=True)
    want = soft + 1000  # more than the soft limit holds, less than the hard one
    with Raw(n.port) as r:
        assert r.call("CONFIG", "SET", "maxclients", str(want)) == b"OK"
        assert r.call("CONFIG", "GET", "maxclients") == [b"maxclients", b"%d" % want]
    assert hard >= limits()[0] >= want > soft


# ------------------------------------------------------------------ AUTH failures

def test_auth_failures_close_the_connection(kv_node_factory):
    n = kv_node_factory(requirepass="s3cret-pass")
    wrong = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    with Raw(n.port) as r:  # 5 guesses, then closed: the rest of the pipeline is never run
        assert r.send(C("AUTH", "guess") * 20).read_until_close(timeout=10) == (wrong * 5, True)
    with Raw(n.port) as r:  # HELLO AUTH counts too, and a success resets the count
        r.send(C("AUTH", "a") * 3 + C("HELLO", "2", "AUTH", "default", "b") + C("AUTH", "s3cret-pass"))
        assert r.replies(5)[3:] == [wrong, b"+OK\r\n"]
        assert r.send(C("AUTH", "c") * 4 + C("PING")).replies(5) == [wrong] * 4 + [b"+PONG\r\n"]
        assert r.send(C("AUTH", "d")).read_until_close(timeout=10) == (wrong, True)  # the 5th in a row
    with Raw(n.port) as r:
        assert r.call("AUTH", "s3cret-pass") == b"OK"
        text = r.call("INFO", "stats").decode()
    assert int(text.split("acl_access_denied_auth:")[1].split("\r\n")[0]) >= 14
    assert "after 5 failed AUTH attempts" in n.log()
