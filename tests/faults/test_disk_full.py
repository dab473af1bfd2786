"""A full disk (ENOSPC) under a disk-mode node with its data file (issue 12, item 6).

The node's data dir is on a small ext4 filesystem made for the test (mkfs.ext4 on an image
file, mounted with -o loop in tmp_path; needs root, as CI runs). A ballast file takes all but
a little of its space; the node is written until the disk refuses. While the disk is full:
writes are refused with a MISCONF error, reads (of present and absent keys), INFO and DBSIZE
answer, INFO persistence says which file cannot be written, and the server's log says why.
Then the ballast goes: writes resume by themselves (no restart), and after kill -9 and a
restart every acknowledged write is there.
"""
import os
import re
import time

import pytest
import redis

from kvstore import Node

from helpers import loopfs
from helpers.conn import Raw, client
from helpers.resp import resp_cmd

pytestmark = pytest.mark.root

IMAGE_MB = 40
VALUE = 8192             # bytes per value while filling: a few hundred writes fill what is left
LEFT_FREE = 3 << 20      # what the ballast leaves free for the node
HELD_S = 3               # a SET unanswered this long waits for the full disk (a held reply)


@pytest.fixture
def small_fs(tmp_path):
    """A mounted ext4 filesystem of IMAGE_MB MiB (4 KiB blocks, no journal: its space is
    what df says), unmounted at the end."""
    with loopfs.small_fs(tmp_path, IMAGE_MB) as mnt:
        yield mnt


def fill_ballast(path, leave):
    """A file taking all the free space of path's filesystem but `leave` bytes."""
    st = os.statvfs(os.path.dirname(path))
    free = st.f_bavail * st.f_frsize
    with open(path, "wb") as f:
        if free > leave:
            os.posix_fallocate(f.fileno(), 0, free - leave)


def start(data_dir, log_path, arch="poller"):
    # flush_interval_ms: the data file is swept only when asked (DBSIZE) or when a retry is due,
    # so each test decides which file meets the full disk first.
    n = Node(port=0, data_dir=str(data_dir), log_path=str(log_path), threads=2, durability="disk", arch=arch,
             data_file=True, data_buckets=1024, flush_interval_ms=600000, log_segment_size="1mb")
    return n.start(timeout=60)


def info_fields(c):
    return c.info("persistence")


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def big(i):
    return (b"%08d" % i) * (VALUE // 8)


def fill_log(port, acked):
    """SET VALUE-byte values, one at a time on a raw connection, until the log is refused.
    Returns (the refusal's text or None, the key whose reply is held or None): the write
    whose record the disk refused first waits for its reply until the disk can be written
    (its record is kept and written then: answering it now with an error would say "not
    done" of a write that is applied and will be durable)."""
    with Raw(port) as r:
        for i in range(4 * LEFT_FREE // VALUE):
            r.send(resp_cmd("SET", f"fill:{i}", big(i)))
            try:
                reply = r.reply(timeout=HELD_S)
            except TimeoutError:
                return None, f"fill:{i}"
            if reply != b"+OK\r\n":
                return reply.decode(), None
            acked[f"fill:{i}"] = big(i)
    raise AssertionError("the disk never filled")


def fill_data_file(c, acked):
    """Write what the log still holds but the data file cannot (about 2/3 of what is free),
    then make the flusher sweep (DBSIZE waits for a sweep): the data file is refused.
    Returns DBSIZE's answer, which must come while the disk is full."""
    for i in range(2 * LEFT_FREE // 3 // VALUE):
        assert c.set(f"fill:{i}", big(i))
        acked[f"fill:{i}"] = big(i)
    return c.dbsize()


@pytest.mark.parametrize("arch", ["poller", "threadpool"])
@pytest.mark.parametrize("full", ["log", "datafile"])
def test_disk_full_reads_answer_and_writes_resume(small_fs, tmp_path, full, arch):
    data = small_fs / "data"
    log_path = tmp_path / "server.log"    # the server's log is not on the full disk
    node = start(data, log_path, arch)
    acked = {}
    what = {"log": "durability log", "datafile": "data file"}[full]
    try:
        with client(node.port, socket_timeout=20) as c:
            for i in range(200):
                k, v = f"base:{i}", f"v{i}".encode()
                assert c.set(k, v)
                acked[k] = v
            assert c.dbsize() == 200              # (a sweep: the base keys are in the data file)
            fill_ballast(str(small_fs / "ballast"), LEFT_FREE)
            held = None
            if full == "log":
                refused, held = fill_log(node.port, acked)
                assert refused is None or refused.startswith(
                    f"-MISCONF Errors writing to the {what}: No space left on device"), refused
            else:
                assert fill_data_file(c, acked) == len(acked)
            p = info_fields(c)
            assert p[f"{full}_write_status"] == "err", p
            assert "No space left on device" in p[f"{full}_write_error"], p
            assert p["aof_last_write_status"] == p["log_write_status"]   # Redis's field: the log

            # The node is not half-dead: reads, INFO and DBSIZE answer; writes are refused.
            assert c.get("base:7") == b"v7"
            assert c.get("never:written") is None      # an absent key: no write error
            assert c.exists("never:written") == 0
            assert c.dbsize() >= len(acked)           # (+1: the held SET is applied in memory)
            for refused in (lambda: c.set("while:full", "x"), c.ping):  # PING too, as Redis: health checks see it
                with pytest.raises(redis.ResponseError, match=f"^MISCONF Errors writing to the {what}"):
                    refused()
            with pytest.raises(redis.ResponseError, match="^MISCONF"):
                c.delete("base:1")
            assert c.get("base:1") == b"v1"
            with Raw(node.port) as r:             # in MULTI: refused when queued, EXEC aborts (as Redis)
                assert r.call("MULTI") == b"OK"
                r.send(resp_cmd("SET", "in:multi", "x"))
                assert r.reply().startswith(f"-MISCONF Errors writing to the {what}".encode())
                r.send(resp_cmd("EXEC"))
                assert r.reply().startswith(b"-EXECABORT")
            assert c.info("errorstats")["errorstat_MISCONF"]["count"] >= 4   # as Redis counts them
            log = wait_for(lambda: (t := log_path.read_text(errors="replace")) and
                           "No space left on device" in t and t, 10, "a log line for the write error")
            line = {"log": "durability log cannot write", "datafile": "data file cannot write"}[full]
            assert line in log, log[-2000:]

            # Free the space: writes come back by themselves.
            os.unlink(small_fs / "ballast")

            def writable():
                try:
                    return c.set("after:0", "x")
                except redis.ResponseError as e:
                    assert str(e).startswith("MISCONF"), e
                    return False
            wait_for(writable, 30, "writes resumed after the space was freed")
            acked["after:0"] = b"x"
            for i in range(1, 200):
                k, v = f"after:{i}", f"a{i}".encode()
                assert c.set(k, v)
                acked[k] = v
            assert c.dbsize() >= len(acked)
            if held:   # the held write was kept, and written once the disk could take it
                assert c.get(held) == big(int(held.split(":")[1]))
                acked[held] = c.get(held)
            p = wait_for(lambda: (q := info_fields(c))["log_write_status"] == "ok" and
                         q["datafile_write_status"] == "ok" and q, 30, "INFO persistence ok again")
            assert p["aof_last_write_status"] == "ok" and p[f"{full}_write_errors"] >= 1, p
        log = log_path.read_text(errors="replace")
        assert re.search(rf"{'durability log' if full == 'log' else 'data file'} writable again after", log), log[-2000:]
    finally:
        node.kill()

    # Nothing acknowledged was lost: kill -9 above, recover from the log and the data file.
    node = start(data, tmp_path / "server2.log", arch)
    try:
        with client(node.port, socket_timeout=30) as c:
            keys = list(acked)
            for i in range(0, len(keys), 200):
                part = keys[i:i + 200]
                got = c.mget(part)
                missing = [k for k, v in zip(part, got) if v != acked[k]]
                assert not missing, f"{len(missing)} acknowledged keys lost, e.g. {missing[:5]}"
    finally:
        node.kill()
