"""The NBD server (nbd.h, eng NULL) over each network backend, driven by real clients:
a random image round-trips through nbdcopy; an unaligned write and a trim through nbdsh
(the trimmed block is no key at all in the KV server); the KV server killed while a copy
runs fails that copy with EIO and leaves the NBD server up, and once the KV server is back
on its port a new copy succeeds (the backend reconnected in the background); a refused
AUTH makes nbd_create fail with the server's words. The backends themselves are tested
directly in test_nbd_backends.py; the full client suites are test_blockdev_clients.py."""
import hashlib
import os
import signal
import socket
import subprocess
import time

import pytest

from kvstore._native import ffi, lib

from helpers.netkv import KVServer
from helpers.pair import stop_process
from helpers.servers import PASSWORD, need

pytestmark = pytest.mark.skipif(not hasattr(lib, "nbd_create"), reason="the NBD server is not built in")

SIZE = 32 << 20
BIG = 256 << 20  # the copy the KV server is killed under
TIMEOUT = 120


class Served:
    """An NBD server (2 threads, 2 backend connections each) over one backend URL."""

    def __init__(self, url, threads=2, conns=2, size=SIZE, block_size=4096):
        self._keep = [ffi.new("char[]", b"127.0.0.1"), ffi.new("char[]", b"kvstore"), ffi.new("char[]", url.encode())]
        cfg = ffi.new("struct nbd_config *")
        cfg.bind, cfg.port, cfg.unix_path, cfg.export_name = self._keep[0], 0, ffi.NULL, self._keep[1]
        cfg.size, cfg.block_size, cfg.threads, cfg.conns_per_thread = size, block_size, threads, conns
        cfg.max_clients, cfg.backend, cfg.key_prefix = 16, self._keep[2], ffi.NULL
        out, err = ffi.new("struct nbd_server **"), ffi.new("char[1024]")
        self.rc = lib.nbd_create(out, cfg, ffi.NULL, err, len(err))
        self.error = ffi.string(err).decode(errors="replace")
        self.s = out[0] if self.rc == 0 else None
        if self.s is not None:
            assert lib.nbd_start(self.s, err, len(err)) == 0, ffi.string(err)
            self.uri = f"nbd://127.0.0.1:{lib.nbd_port(self.s)}/kvstore"

    def stats(self):
        st = ffi.new("struct nbd_stats *")
        lib.nbd_get_stats(self.s, st)
        return st

    def close(self):
        if self.s is not None:
            lib.nbd_stop(self.s)
            lib.nbd_destroy(self.s)
            self.s = None


@pytest.fixture
def served():
    made = []

    def make(url, **kw):
        made.append(Served(url, **kw))
        return made[-1]
    yield make
    for s in made:
        s.close()


@pytest.fixture
def kv_server():
    made = []

    def make(kind, **kw):
        made.append(KVServer(kind, **kw).start())
        return made[-1]
    yield make
    for s in made:
        s.close()


def has_key(srv, key):
    """Whether the KV server holds key (asked with a plain client)."""
    with socket.create_connection(("127.0.0.1", srv.port), 10) as s:
        if srv.kind == "memcached":
            s.sendall(b"mg %s\r\n" % key)
            want = (b"HD\r\n", b"EN\r\n")
        else:
            s.sendall(b"*2\r\n$6\r\nEXISTS\r\n$%d\r\n%s\r\n" % (len(key), key))
            want = (b":1\r\n", b":0\r\n")
        got = b""
        while not got.endswith(b"\r\n"):
            got += s.recv(100)
    assert got in want, got
    return got == want[0]


def nbdsh(uri, code):
    need("nbdsh")
    # nbdsh is the system python's (python3-libnbd): run it with the system's PATH
    r = subprocess.run(["nbdsh", "-u", uri, "-c", code], capture_output=True, text=True, timeout=TIMEOUT,
                       env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("kind", ["redis", "memcached", "kvstore"])
def test_served_over_backend(kv_server, served, tmp_path, kind):
    need("nbdcopy")
    srv = kv_server(kind)
    dev = served(srv.url)
    assert dev.rc == 0, dev.error
    image = tmp_path / "image"
    image.write_bytes(os.urandom(SIZE))
    subprocess.run(["nbdcopy", str(image), dev.uri], check=True, timeout=TIMEOUT)
    subprocess.run(["nbdcopy", dev.uri, str(tmp_path / "back")], check=True, timeout=TIMEOUT)
    assert hashlib.sha256((tmp_path / "back").read_bytes()).digest() == hashlib.sha256(image.read_bytes()).digest()
    # an unaligned write (read-modify-write of two blocks) and a trimmed block
    out = nbdsh(dev.uri, "h.pwrite(b'x' * 5000, 4000)\n"
                         "assert h.pread(5000, 4000) == b'x' * 5000\n"
                         "h.trim(4096, 16384)\n"
                         "assert h.pread(4096, 16384) == bytes(4096)\n"
                         "h.flush()\nprint('nbdsh ok')")
    assert "nbdsh ok" in out
    assert has_key(srv, b"nbd:kvstore:3") and not has_key(srv, b"nbd:kvstore:4")  # a zero block is no key
    st = dev.stats()
    assert st.kv_gets >= SIZE // 4096 and st.kv_puts >= SIZE // 4096 and st.backend_errors == 0


@pytest.mark.parametrize("kind", ["redis", "memcached", "kvstore"])
def test_kv_server_killed_under_a_copy(kv_server, served, kind):
    need("nbdcopy")
    need("nbdkit")
    srv = kv_server(kind)
    dev = served(srv.url, size=BIG)
    assert dev.rc == 0, dev.error
    copy = subprocess.Popen(["nbdcopy", "--", "[", "nbdkit", "random", str(BIG), "]", dev.uri],
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while dev.stats().kv_puts < 256 and time.monotonic() < deadline:  # the copy is under way
            time.sleep(0.01)
        stop_process(srv.pid)  # the copy cannot finish now: its writes wait for replies
        srv.stop(sig=signal.SIGKILL)
        err = copy.communicate(timeout=TIMEOUT)[1]
    finally:
        if copy.poll() is None:
            copy.kill()
            copy.wait()
    assert copy.returncode != 0 and "Input/output error" in err, err
    srv.start()  # the same port
    deadline = time.monotonic() + 30
    while True:  # the first I/O may come before every connection is back
        r = subprocess.run(["nbdcopy", "--", "[", "nbdkit", "pattern", "4M", "]", dev.uri], capture_output=True,
                           stdin=subprocess.DEVNULL, text=True, timeout=TIMEOUT)
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.returncode == 0, r.stderr
    st = dev.stats()
    assert st.backend_errors > 0 and st.backend_reconnects >= 1


def test_auth_refused_at_create(kv_server, served):
    srv = kv_server("redis", password=PASSWORD)
    dev = served(f"redis://:wrong@127.0.0.1:{srv.port}")
    assert dev.rc == -13 and "AUTH refused: WRONGPASS" in dev.error, (dev.rc, dev.error)
    dev = served(f"redis://:{PASSWORD}@127.0.0.1:{srv.port}")
    assert dev.rc == 0, dev.error


def get_key(srv, key):
    """key's value in the KV server, or None (asked with a plain client)."""
    with socket.create_connection(("127.0.0.1", srv.port), 10) as s:
        if srv.kind == "memcached":
            s.sendall(b"mg %s v\r\n" % key)
        else:
            s.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(key), key))
        got = b""
        while not (got.startswith((b"EN\r\n", b"$-1\r\n")) or got.count(b"\r\n") >= 2):
            got += s.recv(1000)
    return None if got.startswith((b"EN", b"$-1")) else got.split(b"\r\n")[1]


def set_key(srv, key, value):
    with socket.create_connection(("127.0.0.1", srv.port), 10) as s:
        if srv.kind == "memcached":
            s.sendall(b"ms %s %d\r\n%s\r\n" % (key, len(value), value))
        else:
            s.sendall(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, len(value), value))
        assert s.recv(100) in (b"HD\r\n", b"+OK\r\n")


@pytest.mark.parametrize("kind", ["redis", "memcached", "kvstore"])
def test_device_record_in_the_backend(kv_server, served, kind):
    """The first open stores the device's record under PREFIX meta; an open with another block
    size or a smaller size is refused with what the store holds, a larger one grows the record;
    a key of that name holding something else is refused, untouched."""
    srv = kv_server(kind)
    url = srv.url
    key = b"nbd:kvstore:meta"
    assert get_key(srv, key) is None
    served(url).close()
    assert get_key(srv, key) == b"kvstore-blockdev size=%d block_size=4096" % SIZE
    small = served(url, size=SIZE // 2)
    assert small.rc < 0 and f"the store holds a block device of {SIZE} bytes in 4096-byte blocks" in small.error
    other = served(url, block_size=512)
    assert other.rc < 0 and "its blocks would read garbled" in other.error, other.error
    assert get_key(srv, key) == b"kvstore-blockdev size=%d block_size=4096" % SIZE
    served(url, size=2 * SIZE).close()
    assert get_key(srv, key) == b"kvstore-blockdev size=%d block_size=4096" % (2 * SIZE)
    set_key(srv, key, b"something else")
    taken = served(url, size=2 * SIZE)
    assert taken.rc < 0 and "holds something other than a kvstore block device's record" in taken.error, taken.error
    assert get_key(srv, key) == b"something else"
