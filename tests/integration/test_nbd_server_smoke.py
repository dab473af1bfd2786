"""The NBD server in C (ext/frontend/nbd*.c) with the embedded backend, created through
cffi over a kvstore.Store and driven by real clients: nbdinfo, nbdcopy, nbdsh.

Each test starts the server as a Server over a Store with kv_config.nbd set (the C path
kvstore.BlockDevice takes), checks what the client sees, and looks at the Store underneath:
block n is the key "nbd:kvstore:n", a zero block is no key at all. The fuller client and
protocol suites are tests/integration/test_blockdev_clients.py and test_nbd_protocol.py.
"""
import hashlib
import json
import os
import socket
import struct
import subprocess

import pytest

import kvstore.server as kvserver
from kvstore._native import ffi, lib
from kvstore.server import Server
from kvstore.store import Store

from helpers.servers import need

BS = 4096
SIZE = 16 << 20
TIMEOUT = 60
PLAIN_C_CONFIG = kvserver.c_config  # Server.start's, before any test wraps it


class Device:
    """A kvstore Server serving RESP and, through kv_config.nbd, a block device."""

    def __init__(self, monkeypatch, tmp_path, durability="none", unix=False, read_only=False, threads=2,
                 max_memory=0):
        self.store = Store(max_memory=max_memory)
        self._keep = [ffi.new("char[]", b"127.0.0.1"), ffi.new("char[]", b"kvstore"), ffi.new("char[]", b"embedded"),
                      ffi.new("char[]", str(tmp_path / "nbd.sock").encode())]
        cfg = ffi.new("struct nbd_config *")
        cfg.bind, cfg.export_name, cfg.backend = self._keep[0], self._keep[1], self._keep[2]
        cfg.port = -1 if unix else 0
        cfg.unix_path = self._keep[3] if unix else ffi.NULL
        cfg.size, cfg.block_size, cfg.threads, cfg.conns_per_thread = SIZE, BS, threads, 1
        cfg.read_only, cfg.max_clients = int(read_only), 64
        self.cfg = cfg
        monkeypatch.setattr(kvserver, "c_config", lambda config, **extra: PLAIN_C_CONFIG(config, nbd=cfg, **extra))
        self.server = Server(self.store, port=0, threads=1, durability=durability, data_dir=str(tmp_path / "data"),
                             max_memory=max_memory)
        self.server.start()
        self.nbd = lib.srv_nbd(self.server._srv)
        assert self.nbd != ffi.NULL
        if unix:
            self.uri = f"nbd+unix:///kvstore?socket={tmp_path / 'nbd.sock'}"
        else:
            self.uri = f"nbd://127.0.0.1:{lib.nbd_port(self.nbd)}/kvstore"

    def stats(self):
        st = ffi.new("struct nbd_stats *")
        lib.nbd_get_stats(self.nbd, st)
        return {k: getattr(st, k) for k in dir(st)}

    def stop(self):
        self.server.stop()


@pytest.fixture
def device(monkeypatch, tmp_path):
    devs = []

    def make(**kw):
        devs.append(Device(monkeypatch, tmp_path, **kw))
        return devs[-1]

    yield make
    for d in devs:
        d.stop()


def run(*argv, env=None):
    r = subprocess.run(argv, capture_output=True, timeout=TIMEOUT, env=env)
    assert r.returncode == 0, f"{argv[0]} failed: {r.stderr.decode(errors='replace')}"
    return r


def nbdsh(uri, code):
    """Run code in nbdsh (system python's libnbd binding) connected to uri; its stdout."""
    need("nbdsh")
    # nbdsh runs `python3` from PATH: the system one has the binding (python3-libnbd), a venv's not
    env = dict(os.environ, PATH="/usr/bin:" + os.environ.get("PATH", ""))
    return run("nbdsh", "-u", uri, "-c", code, env=env).stdout.decode()


def test_nbdinfo_shows_size_flags_and_block_sizes(device):
    need("nbdinfo")
    d = device()
    info = json.loads(run("nbdinfo", "--json", d.uri).stdout)
    exp = info["exports"][0]
    assert exp["export-name"] == "kvstore"
    assert exp["export-size"] == SIZE
    assert exp["is_read_only"] is False
    for flag in ("can_flush", "can_fua", "can_trim", "can_zero", "can_fast_zero", "can_multi_conn"):
        assert exp[flag] is True, flag
    assert exp["block_size_minimum"] == 1
    assert exp["block_size_preferred"] == BS
    assert exp["block_size_maximum"] == 32 << 20


def test_nbdcopy_round_trip_lands_in_the_store(device, tmp_path):
    need("nbdcopy")
    d = device()
    data = os.urandom(4 << 20)
    data = data[:BS] + bytes(BS) + data[2 * BS:]  # block 1 all zeros: no key
    src, back = tmp_path / "src.img", tmp_path / "back.img"
    src.write_bytes(data)
    run("nbdcopy", str(src), d.uri)
    run("nbdcopy", d.uri, str(back))
    got = back.read_bytes()
    assert len(got) == SIZE
    assert hashlib.sha256(got[:len(data)]).digest() == hashlib.sha256(data).digest()
    assert got[len(data):] == bytes(SIZE - len(data))  # never written: zeros
    # the blocks are the Store's keys: block n = "nbd:kvstore:n", one block each
    assert d.store.get(b"nbd:kvstore:0") == data[:BS]
    assert d.store.get(b"nbd:kvstore:2") == data[2 * BS:3 * BS]
    assert d.store.get(b"nbd:kvstore:1") is None
    assert d.store.get(b"nbd:kvstore:%d" % (len(data) // BS)) is None
    st = d.stats()
    assert st["writes"] > 0 and st["reads"] > 0
    assert st["kv_puts"] >= len(data) // BS - 1
    assert st["bytes_written"] >= len(data) - BS  # nbdcopy sends the zero block as a zero request
    info = d.server.info("blockdev")  # INFO blockdev, as redis-cli sees it on the RESP port
    assert info["blockdev_export"] == "kvstore" and info["blockdev_size"] == SIZE
    assert info["blockdev_kv_puts"] == st["kv_puts"] and info["blockdev_kv_per_io"] >= 1
    # one read of the whole device (4096 blocks: four windows of operations), then one TRIM of it
    out = nbdsh(d.uri, "import hashlib\nprint(hashlib.sha256(h.pread(h.get_size(), 0)).hexdigest())\n"
                       "h.trim(h.get_size(), 0)\nprint(h.pread(h.get_size(), 0) == bytes(h.get_size()))")
    assert out.split() == [hashlib.sha256(got).hexdigest(), "True"]
    # every block gone (no KV memory for zeros); the device's record stays
    assert len(d.store) == 1
    assert d.store.get(b"nbd:kvstore:meta") == b"kvstore-blockdev size=%d block_size=%d" % (SIZE, BS)


def test_unaligned_writes_trim_and_zero_over_a_unix_socket(device):
    d = device(unix=True)
    out = nbdsh(d.uri, "\n".join([
        "h.pwrite(b'a' * 10000, 1000)",          # blocks 0..2, both edges partial: read-modify-write
        "h.pwrite(b'b' * 10, 4090)",             # across the 0/1 boundary
        "h.flush()",
        "buf = h.pread(12000, 0)",
        "assert buf == bytes(1000) + b'a' * 3090 + b'b' * 10 + b'a' * 6900 + bytes(1000), 'rmw'",
        "h.trim(4096, 4096)",                    # block 1: gone
        "h.zero(100, 8192 + 50)",                # 100 bytes inside block 2
        "buf = h.pread(12288, 0)",
        "assert buf == bytes(1000) + b'a' * 3090 + b'b' * 6 + bytes(4096) + b'a' * 50 + bytes(100) + b'a' * 2658"
        " + bytes(1288), 'zero'",
        "h.pwrite(b'c' * 5, 8192 + 8000, nbd.CMD_FLAG_FUA)",
        "print('ok', h.get_size(), h.can_multi_conn())",
    ]))
    assert out.split() == ["ok", str(SIZE), "True"]
    assert d.store.get(b"nbd:kvstore:1") is None
    assert len(d.store.get(b"nbd:kvstore:2")) == BS
    st = d.stats()
    assert st["rmw"] >= 4 and st["trims"] == 1 and st["zeroes"] == 1 and st["fua"] == 1 and st["flushes"] == 1


def test_errors_and_read_only(device):
    d = device(read_only=True)
    out = nbdsh(d.uri, "\n".join([
        "import errno",
        "assert h.is_read_only()",
        "assert h.pread(4096, 0) == bytes(4096)",
        "try:\n    h.pread(4096, h.get_size() - 100)\nexcept nbd.Error as e:\n    print('past-end', e.errnum)",
        "print('done')",
    ]))
    assert "past-end 22" in out and "done" in out  # EINVAL
    d2 = device()
    out = nbdsh(d2.uri, "\n".join([
        "h.pwrite(b'x' * 4096, 0)",
        "try:\n    h.pwrite(b'y' * 4096, h.get_size() - 4095)\nexcept nbd.Error as e:\n    print('enospc', e.errnum)",
        "assert h.pread(4096, 0) == b'x' * 4096",   # the connection keeps working
        "print('done')",
    ]))
    assert "enospc 28" in out and "done" in out


def test_flush_with_a_disk_log(device):
    """durability disk: FLUSH and FUA wait for the log's fsync; the writes are logged."""
    d = device(durability="disk")
    out = nbdsh(d.uri, "h.pwrite(b'z' * 8192, 0)\nh.flush()\nh.pwrite(b'q' * 100, 50, nbd.CMD_FLAG_FUA)\nprint('ok')")
    assert out.strip() == "ok"
    assert d.store.get(b"nbd:kvstore:1") == b"z" * BS
    st = d.stats()
    assert st["kv_syncs"] == 2 and st["fua"] == 1 and st["errors"] == 0


def test_create_errors_name_the_setting():
    cfg = ffi.new("struct nbd_config *")
    keep = [ffi.new("char[]", b"embedded")]
    cfg.backend, cfg.port, cfg.size, cfg.block_size, cfg.threads, cfg.conns_per_thread = keep[0], 0, SIZE, 3000, 1, 1
    out, err = ffi.new("struct nbd_server **"), ffi.new("char[256]")
    assert lib.nbd_create(out, cfg, ffi.NULL, err, 256) < 0
    assert "block size 3000" in ffi.string(err).decode()
    cfg.block_size, cfg.busy_poll_us = BS, 1001
    assert lib.nbd_create(out, cfg, ffi.NULL, err, 256) < 0
    assert "busy poll 1001 us: expected 0 (off) to 1000" in ffi.string(err).decode()
    cfg.busy_poll_us = 0
    assert lib.nbd_create(out, cfg, ffi.NULL, err, 256) < 0  # embedded without an engine
    assert "embedded" in ffi.string(err).decode()
    keep.append(ffi.new("char[]", b"nosuch://x"))
    cfg.backend = keep[-1]
    assert lib.nbd_create(out, cfg, ffi.NULL, err, 256) < 0
    assert "unknown backend 'nosuch://x'" in ffi.string(err).decode()


def test_blocks_that_left_memory_for_the_data_file(device, tmp_path):
    """durability disk with memory far below the device: blocks are flushed to the data file
    and leave memory; reading them back goes through the session's GET, which stalls for the
    load and resumes on the thread's eventfd."""
    need("nbdcopy")
    d = device(durability="disk", max_memory=4 << 20)
    data = os.urandom(SIZE)
    src, back = tmp_path / "src.img", tmp_path / "back.img"
    src.write_bytes(data)
    run("nbdcopy", str(src), d.uri)
    run("nbdcopy", d.uri, str(back))
    assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert d.stats()["errors"] == 0
    info = d.server.info("everything")
    assert info["used_memory"] <= 4 << 20 and info["memory_keys"] < SIZE // BS  # most blocks left memory
    assert info["datafile_loads"] >= SIZE // BS // 2  # and were read back from the data file


def _recv(s, n):
    b = b""
    while len(b) < n:
        chunk = s.recv(n - len(b))
        assert chunk, f"end of stream after {len(b)} of {n} bytes"
        b += chunk
    return b


def test_disconnect_after_a_burst_still_answers_it(device):
    """Requests sent with DISCONNECT and a shutdown of the client's side in one burst are all
    answered before the server closes, as the protocol asks (raw socket: the newstyle handshake,
    64 WRITEs with FUA, which wait for the log's fsync, then DISC)."""
    d = device(durability="disk")
    s = socket.create_connection(("127.0.0.1", lib.nbd_port(d.nbd)), timeout=10)
    assert _recv(s, 18)[:16] == b"NBDMAGICIHAVEOPT"
    s.sendall(struct.pack(">I", 3) + struct.pack(">QII", 0x49484156454F5054, 7, 6) + struct.pack(">IH", 0, 0))
    while True:  # INFO replies, then ACK
        _, _, rtype, length = struct.unpack(">QIII", _recv(s, 20))
        _recv(s, length)
        if rtype == 1:
            break
    burst = b"".join(struct.pack(">IHHQQI", 0x25609513, 1, 1, i, i * BS, BS) + bytes([i + 1]) * BS for i in range(64))
    s.sendall(burst + struct.pack(">IHHQQI", 0x25609513, 0, 2, 99, 0, 0))
    s.shutdown(socket.SHUT_WR)
    replies = [struct.unpack(">IIQ", _recv(s, 16)) for _ in range(64)]
    assert sorted(r[2] for r in replies) == list(range(64)) and all(r[:2] == (0x67446698, 0) for r in replies)
    assert s.recv(1) == b""  # then it closes
    assert d.store.get(b"nbd:kvstore:63") == bytes([64]) * BS
