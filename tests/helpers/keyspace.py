"""What the expiry and keyspace tests share: the same raw request to redis-server and to
kvstore side by side, a whole SCAN iteration, clients churning in the background, and a
node whose keys leave memory for the data file (a small --max-memory) with the wait for
its flusher."""
import contextlib
import threading
import time

from .conn import Raw, client
from .faultlib import persistence
from .resp import resp_cmd, resp_parse

# Settings of a node whose keys leave memory: 256 KiB of memory, the data file swept
# every 100 ms, 1,024 home buckets (several keys per block, some chains overflow).
SPILL = dict(data_file=True, max_memory="256kb", flush_interval_ms=100, data_buckets=1024)


def exchange(port, request, n, flush=True):
    """On a new connection (the keyspace emptied first unless flush=False): send
    `request`, read its n raw replies, then a PING's (a server that closed or sent
    more than n replies shows there)."""
    with Raw(port) as r:
        if flush:
            assert r.send(resp_cmd("FLUSHALL")).reply() == b"+OK\r\n"
        r.send(request + resp_cmd("PING"))
        try:
            return [r.reply(timeout=5) for _ in range(n + 1)]
        except (EOFError, TimeoutError, OSError) as e:
            return [f"<{type(e).__name__}: {e}>"]


def assert_same_replies(redis_port, kv_port, request, n):
    want = exchange(redis_port, request, n)
    got = exchange(kv_port, request, n)
    assert got == want, f"request {request[:300]!r}"


HELLO3 = resp_cmd("HELLO", "3")


def case_replies(port, requests):
    """The requests' replies on a fresh keyspace, then a PING's (HELLO 3's, which names
    the server, masked)."""
    out = exchange(port, b"".join(requests), len(requests))
    return [b"<hello>" if req == HELLO3 else r for req, r in zip(requests + [b""], out)]


def assert_case_matches(redis_port, kv_port, requests):
    """The same requests on redis-server and on kvstore: every reply byte for byte."""
    want = case_replies(redis_port, requests)
    got = case_replies(kv_port, requests)
    diffs = [f"{req[:120]!r}: kvstore {g[:300]!r}, redis {w[:300]!r}"
             for req, g, w in zip(requests + [resp_cmd("PING")], got, want) if g != w]
    assert got == want, "\n".join(diffs)


def apply_ops(port, ops):
    """Pipelined commands (tuples of arguments), none of them refused."""
    with client(port) as c:
        p = c.pipeline(transaction=False)
        for op in ops:
            p.execute_command(*op)
        for op, r in zip(ops, p.execute(raise_on_error=False)):
            assert not isinstance(r, Exception), (op, r)


def reply_diffs(kv_port, redis_port, cmds, timeout=10):
    """Each command (a tuple of arguments) sent in turn to kvstore and to redis-server,
    one connection each: a line for every pair of replies that differ."""
    diffs = []
    with Raw(kv_port, timeout=timeout) as a, Raw(redis_port, timeout=timeout) as b:
        for cmd in cmds:
            got, want = a.send(resp_cmd(*cmd)).reply(), b.send(resp_cmd(*cmd)).reply()
            if got != want:
                diffs.append(f"{cmd!r}: kvstore {got!r}, redis {want!r}")
    return diffs


def scan_all(conn, *options, calls=None):
    """Every key a whole SCAN iteration returns (a list, repeats kept), on a Raw
    connection; `calls` (a list) gets each call's (cursor, keys)."""
    cursor, keys = b"0", []
    while True:
        reply = resp_parse(conn.send(resp_cmd("SCAN", cursor, *options)).reply())[0]
        assert isinstance(reply, list) and len(reply) == 2, reply
        cursor, got = reply
        keys += got
        if calls is not None:
            calls.append((cursor, got))
        if cursor == b"0":
            return keys


def wait_flushed(port, timeout=30.0):
    """Until the data file holds everything the log holds; INFO persistence then."""
    deadline = time.monotonic() + timeout
    while True:
        i = persistence(port)
        assert not i["datafile_failed"], i["datafile_error"]
        if i["datafile_flushed_lsn"] == i["log_durable_lsn"] == i["log_appended_lsn"]:
            return i
        assert time.monotonic() < deadline, f"data file not flushed after {timeout} s: {i}"
        time.sleep(0.05)


def fill(port, prefix, n, size=80):
    """n keys prefix:<i> of `size` bytes each, pipelined: memory filler that makes
    earlier keys leave memory."""
    with client(port) as c:
        for s in range(0, n, 500):
            p = c.pipeline(transaction=False)
            for i in range(s, min(n, s + 500)):
                p.set(b"%s:%06d" % (prefix, i), b"%06d" % i * (size // 6))
            assert all(r is True for r in p.execute())


@contextlib.contextmanager
def churning(work, threads=2):
    """Run work(seed, stop) in `threads` threads (seed 0, 1, ...; stop a threading.Event
    to return on) for the duration of the block; an exception in one is raised after."""
    stop, errors = threading.Event(), []

    def run(seed):
        try:
            work(seed, stop)
        except Exception as e:  # raised by the main thread below
            errors.append(e)

    ts = [threading.Thread(target=run, args=(s,)) for s in range(threads)]
    for t in ts:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in ts:
            t.join()
    assert not errors, errors


def assert_scans_return(port, stable, counts=("5", "50", "500")):
    """Whole SCAN iterations with each COUNT: every key of `stable` returned."""
    with Raw(port, timeout=30) as r:
        for count in counts:
            got = set(scan_all(r, "COUNT", count))
            missing = set(stable) - got
            assert not missing, f"COUNT {count}: {len(missing)} keys missed, e.g. {sorted(missing)[:3]}"
