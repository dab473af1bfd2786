"""What the expiry and keyspace tests share: the same raw request to redis-server and to
kvstore side by side, a whole SCAN iteration, and a node whose keys leave memory for the
data file (a small --max-memory) with the wait for its flusher."""
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
