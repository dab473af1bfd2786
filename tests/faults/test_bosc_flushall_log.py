"""FLUSHALL and the data file's superblock (ext/durability/bosc_sweep.c, bosc_load.c).

A FLUSHALL bumps the data file's generation as soon as its FLUSH record is appended to
the log, before the log thread has written it. A sweep in that window must not write a
superblock that records the new generation (every block of the file then reads as
empty) unless the FLUSH record is durable: if the server dies before the log holds it,
the restart replays no FLUSH, so the keys the old generation held must still be in the
file. Here the log's write is held (an LD_PRELOAD shim on write() and writev() of the
log's segments, active while a flag file exists) from just before the FLUSHALL; a sweep
runs meanwhile; the server is killed (-9) with the FLUSHALL unanswered; the restart must hold
every key written before it, as the log does.
"""
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

from helpers.conn import client
from helpers.servers import free_port

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/uio.h>
/* write() or writev() to a log segment (".../log/wal-...") waits while
 * $KVSTORE_TEST_STALL exists (at most two minutes): the record stays in the log's
 * memory, never in the file. (The log thread writes its chunks with writev.) */
static void hold(int fd)
{
    const char *flag = getenv("KVSTORE_TEST_STALL");
    struct stat st;
    if (flag && stat(flag, &st) == 0) {
        char p[64], t[512];
        snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
        ssize_t l = readlink(p, t, sizeof t - 1);
        if (l > 0) {
            t[l] = 0;
            if (strstr(t, "/log/wal-"))
                for (int i = 0; i < 12000 && stat(flag, &st) == 0; i++)
                    usleep(10000);
        }
    }
}
ssize_t write(int fd, const void *buf, size_t n)
{
    static ssize_t (*real)(int, const void *, size_t);
    if (!real)
        real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    hold(fd);
    return real(fd, buf, n);
}
ssize_t writev(int fd, const struct iovec *iov, int n)
{
    static ssize_t (*real)(int, const struct iovec *, int);
    if (!real)
        real = (ssize_t (*)(int, const struct iovec *, int))dlsym(RTLD_NEXT, "writev");
    hold(fd);
    return real(fd, iov, n);
}
"""

NODE_DEFAULTS = {"data_file": True}  # the nodes fixture (faults/conftest.py)


@pytest.fixture
def shim(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler for the write shim")
    src = tmp_path / "stall_shim.c"
    src.write_text(SHIM)
    so = tmp_path / "stall_shim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(so), str(src), "-ldl"], check=True)
    return str(so)


def sweeps(metrics_port):
    """The flusher's sweeps, from the metrics endpoint (a request's reply is held while the
    log cannot write; a scrape is not)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("kvstore_datafile_sweeps_total "):
                return float(line.split()[1])
    raise AssertionError("no kvstore_datafile_sweeps_total in the metrics")


@pytest.mark.timeout(180)
def test_flushall_not_durable_leaves_the_superblock_generation(data_dir, nodes, shim, tmp_path, monkeypatch):
    flag = str(tmp_path / "stall")
    monkeypatch.setenv("KVSTORE_TEST_STALL", flag)
    monkeypatch.setenv("LD_PRELOAD", shim)
    mport = int(free_port())
    n = nodes(data_dir, max_memory="64mb", flush_interval_ms=600000, metrics_port=mport)
    monkeypatch.delenv("LD_PRELOAD")
    old = [b"old%03d" % i for i in range(100)]
    with client(n.port, socket_timeout=60) as c:
        for k in old:
            assert c.set(k, b"v")
        assert c.dbsize() == 100                     # a sweep: old* are in the data file
        assert c.info("persistence")["datafile_flushed_lsn"] >= 100
        assert c.set(b"late", b"v")                  # durable in the log, past the flushed LSN
    open(flag, "w").close()                          # the log's writes wait from now on
    res = {}

    def flushall():
        try:
            with client(n.port, socket_timeout=120) as c:
                res["flushall"] = c.flushall()
        except Exception as e:                       # (killed under it)
            res["flushall"] = e

    t = threading.Thread(target=flushall, daemon=True)
    t.start()
    time.sleep(0.5)
    assert "flushall" not in res, "FLUSHALL answered although its record cannot be written"
    before = sweeps(mport)
    sk = socket.create_connection(("127.0.0.1", n.port))
    sk.sendall(b"*1\r\n$6\r\nDBSIZE\r\n")            # asks for a sweep (its reply may be held)
    deadline = time.monotonic() + 30
    while sweeps(mport) <= before:
        assert time.monotonic() < deadline, "no sweep ran"
        time.sleep(0.05)
    assert "flushall" not in res
    n.kill()
    sk.close()
    os.unlink(flag)
    t.join(30)
    assert isinstance(res.get("flushall"), Exception), res   # never answered

    n = nodes(data_dir, max_memory="64mb", flush_interval_ms=600000)
    with client(n.port, socket_timeout=60) as c:
        present = sum(v is not None for v in c.mget(old))
        assert present == len(old) and c.get(b"late") == b"v", \
            f"the log holds no FLUSH, yet after the restart {present} of {len(old)} old keys and " \
            f"late={c.get(b'late')!r} are there"
    assert n.stop() == 0
