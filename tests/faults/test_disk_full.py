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
import shutil
import subprocess
import time

import pytest
import redis

from kvstore import Node

from helpers.conn import client

pytestmark = pytest.mark.root

IMAGE_MB = 40
VALUE = 8192             # bytes per value while filling: a few hundred writes fill what is left
LEFT_FREE = 3 << 20      # what the ballast leaves free for the node


def _run(*args):
    subprocess.run(args, check=True, capture_output=True, timeout=60)


@pytest.fixture
def small_fs(tmp_path):
    """A mounted ext4 filesystem of IMAGE_MB MiB (4 KiB blocks, no journal: its space is
    what df says), unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a loop filesystem (CI runs as root)")
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    img, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(IMAGE_MB << 20)
    _run("mkfs.ext4", "-q", "-F", "-b", "4096", "-m", "0", "-O", "^has_journal", str(img))
    _run("mount", "-o", "loop", str(img), str(mnt))
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill_ballast(path, leave):
    """A file taking all the free space of path's filesystem but `leave` bytes."""
    st = os.statvfs(os.path.dirname(path))
    free = st.f_bavail * st.f_frsize
    with open(path, "wb") as f:
        if free > leave:
            os.posix_fallocate(f.fileno(), 0, free - leave)


def start(data_dir, log_path):
    n = Node(port=0, data_dir=str(data_dir), log_path=str(log_path), threads=2, durability="disk",
             data_file=True, data_buckets=1024, flush_interval_ms=100, log_segment_size="1mb")
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


def test_disk_full_reads_answer_and_writes_resume(small_fs, tmp_path):
    data = small_fs / "data"
    log_path = tmp_path / "server.log"    # the server's log is not on the full disk
    node = start(data, log_path)
    acked = {}
    try:
        with client(node.port, socket_timeout=20) as c:
            for i in range(200):
                k, v = f"base:{i}", f"v{i}".encode()
                assert c.set(k, v)
                acked[k] = v
            fill_ballast(str(small_fs / "ballast"), LEFT_FREE)

            # Write until the disk refuses (bounded: LEFT_FREE / VALUE is a few hundred writes).
            refused = None
            for i in range(4 * LEFT_FREE // VALUE):
                k, v = f"fill:{i}", (b"%08d" % i) * (VALUE // 8)
                try:
                    assert c.set(k, v)
                    acked[k] = v
                except redis.ResponseError as e:
                    refused = str(e)
                    break
            assert refused is not None, "the disk never filled"
            assert refused.startswith("MISCONF"), refused
            assert "No space left on device" in refused, refused

            # The node is not half-dead: reads, INFO and DBSIZE answer.
            assert c.get("base:7") == b"v7"
            assert c.get("never:written") is None      # an absent key: no write error
            assert c.exists("never:written") == 0
            assert c.dbsize() >= len(acked) - 1       # (the refused key may be counted or not)
            p = info_fields(c)
            # (which file the disk refused first depends on timing: the log or the data file)
            assert "err" in (p["log_write_status"], p["datafile_write_status"]), p
            assert p["aof_last_write_status"] == p["log_write_status"]   # Redis's field: the log
            assert c.ping()
            with pytest.raises(redis.ResponseError, match="^MISCONF"):
                c.set("while:full", "x")
            log = wait_for(lambda: (t := log_path.read_text(errors="replace")) and
                           "No space left on device" in t and t, 10, "a log line for the write error")
            assert re.search(r"(log|data file).*No space left on device", log), log[-2000:]

            # Free the space: writes come back by themselves.
            os.unlink(small_fs / "ballast")

            def writable():
                try:
                    return c.set("after:0", "x")
                except redis.ResponseError as e:
                    assert str(e).startswith("MISCONF"), e
                    return False
            wait_for(writable, 60, "writes resumed after the space was freed")
            acked["after:0"] = b"x"
            for i in range(1, 200):
                k, v = f"after:{i}", f"a{i}".encode()
                assert c.set(k, v)
                acked[k] = v
            p = wait_for(lambda: (q := info_fields(c))["aof_last_write_status"] == "ok" and
                         q["datafile_write_status"] == "ok" and q, 30, "INFO persistence ok again")
            assert p["log_write_status"] == "ok"
            assert p["log_write_errors"] >= 1 or p["datafile_write_errors"] >= 1
        assert "writable again" in log_path.read_text(errors="replace")
    finally:
        node.kill()

    # Nothing acknowledged was lost: kill -9 above, recover from the log and the data file.
    node = start(data, tmp_path / "server2.log")
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
