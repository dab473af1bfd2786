"""The block device (`kvstore blockdev serve`, issue 15) driven by real NBD clients, unchanged:
nbdinfo, nbdcopy, nbdsh, qemu-img, fio's nbd engine, nbdfuse + losetup + mkfs + mount + fsck.

Each test runs against nbdkit's memory plugin too (kind "nbdkit"), the reference a user
would otherwise pick: it proves the test itself, and ours must behave the same. Backends:
embedded and a kvstore node get every client; Redis and memcached get nbdcopy and fio
verify (the issue's matrix). Device sizes are small (sparse in every backend); each test
starts and stops its own servers.
"""
import json
import os
import random
import subprocess

import pytest

from helpers.blockdev import (MiB, Backend, Device, fuse_loop, mounted, nbdsh, random_image, run,
                              sha256_file)
from helpers.conn import client

FULL = ["nbdkit", "embedded", "kvstore"]
ALL = FULL + ["redis", "memcached"]
NBD_MAX_PAYLOAD = 32 * MiB

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def make_device(tmp_path):
    """make_device(kind, size, *options) -> a started Device: kind "nbdkit" (memory plugin,
    advertising the block sizes ours does), "embedded", or a network backend ("kvstore",
    "redis", "memcached") started here. .backend is the Backend (or None); all stopped after."""
    made = []

    def make(kind, size, *options):
        backend = None
        if kind == "nbdkit":
            dev = Device("nbdkit", size, "--filter=blocksize-policy", "blocksize-minimum=1",
                         "blocksize-preferred=4096", f"blocksize-maximum={NBD_MAX_PAYLOAD}", *options,
                         workdir=str(tmp_path / f"dev{len(made)}"))
        elif kind == "embedded":
            dev = Device("kvstore", size, "--backend", "embedded", "--durability", "none", "--port", 0,
                         "--server-threads", 1, "--threads", 2, "--data-dir", tmp_path / f"data{len(made)}",
                         *options, workdir=str(tmp_path / f"dev{len(made)}"))
        else:
            backend = Backend(kind)
            made.append(backend)
            backend.start()
            dev = Device("kvstore", size, "--backend", backend.url, "--threads", 2, *options,
                         workdir=str(tmp_path / f"dev{len(made)}"))
        os.makedirs(dev.workdir, exist_ok=True)
        made.append(dev)
        dev.backend = backend
        return dev.start()

    yield make
    for x in reversed(made):
        x.cleanup() if isinstance(x, Device) else x.stop()


def stored_blocks(dev):
    """How many block keys the device's KV store holds: its keys but the device's record,
    PREFIX meta (None for nbdkit, which has none)."""
    return None if dev.kind == "nbdkit" else stored_keys(dev) - 1


def stored_keys(dev):
    if dev.backend is None:  # embedded: the engine's RESP port, from the server's log
        port = int(_resp_port(dev.log()))
        with client(port) as c:
            return c.dbsize()
    if dev.backend.kind in ("kvstore", "redis"):
        with client(dev.backend.port) as c:
            return c.dbsize()
    import socket
    with socket.create_connection(("127.0.0.1", dev.backend.port), timeout=10) as s:
        s.sendall(b"stats\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            data += s.recv(65536)
    return int(dict(line.split()[1:3] for line in data.decode().splitlines() if line.startswith("STAT"))
               ["curr_items"])


def _resp_port(log):
    import re
    m = re.search(r"RESP on [0-9.]+:(\d+)", log)
    assert m, f"no RESP port in the log: {log[-2000:]}"
    return m.group(1)


def nonzero_blocks(path, block=4096):
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(block):
            n += chunk.count(0) != len(chunk)
    return n


# ---------------------------------------------------------------- nbdinfo

@pytest.mark.parametrize("kind", FULL)
def test_nbdinfo_shows_size_and_flags(make_device, kind):
    dev = make_device(kind, "64M")
    info = json.loads(run("nbdinfo", "--json", dev.uri).stdout)
    assert info["protocol"] == "newstyle-fixed" and info["structured"] is True
    (export,) = info["exports"]
    assert export["export-size"] == 64 * MiB
    for flag in ("can_flush", "can_fua", "can_trim", "can_zero", "can_fast_zero", "can_multi_conn", "can_df"):
        assert export[flag] is True, (flag, export)
    assert export["is_read_only"] is False
    assert (export["block_size_minimum"], export["block_size_preferred"], export["block_size_maximum"]) == \
        (1, 4096, NBD_MAX_PAYLOAD)


@pytest.mark.parametrize("kind", FULL)
def test_read_only_export_refuses_writes(make_device, kind):
    dev = make_device(kind, "16M", "--read-only" if kind != "nbdkit" else "-r")
    (export,) = json.loads(run("nbdinfo", "--json", dev.uri).stdout)["exports"]
    assert export["is_read_only"] is True
    out = nbdsh(dev.uri, "\n".join([
        "assert h.pread(4096, 0) == bytes(4096)",
        "h.set_strict_mode(0)  # send the write: the server must refuse it, not libnbd",
        "try:",
        "    h.pwrite(b'x' * 4096, 0)",
        "    print('written')",
        "except nbd.Error as e:",
        "    print('refused', e.errno)",
    ]))
    assert out.split() == ["refused", "EPERM"], out


# ---------------------------------------------------------------- nbdcopy

@pytest.mark.parametrize("kind", ALL)
def test_nbdcopy_round_trip_by_checksum(make_device, kind, tmp_path):
    """Random extents and holes in, the same bytes out; a zero block is no key."""
    src = random_image(tmp_path / "src.img", 24 * MiB, seed=15)
    dev = make_device(kind, "32M")
    run("nbdcopy", src, dev.uri)
    out = tmp_path / "out.img"
    run("nbdcopy", dev.uri, out)
    assert os.path.getsize(out) == 32 * MiB
    assert sha256_file(out, 24 * MiB) == sha256_file(src)
    assert nonzero_blocks(out) == nonzero_blocks(src)  # the rest reads as zeros
    stored = stored_blocks(dev)
    if stored is not None:  # one key per block with data: zeros, trims and holes are none
        assert stored == nonzero_blocks(src)
    # the same copy again, over what is there: nothing changes
    run("nbdcopy", src, dev.uri)
    run("nbdcopy", dev.uri, out)
    assert sha256_file(out, 24 * MiB) == sha256_file(src)


# ---------------------------------------------------------------- nbdsh

NBDSH_SCRIPT = r"""
import os, random
rng = random.Random(7)
size = h.get_size()
assert size == 16 << 20, size
assert h.can_multi_conn() and h.can_flush() and h.can_fua() and h.can_trim() and h.can_zero()
model = bytearray(size)
# unaligned writes across block edges, with and without FUA; reads of every shape
for i in range(300):
    off = rng.randrange(0, size - 70000)
    n = rng.choice((1, 511, 4095, 4096, 4097, 12345, 65536, 69999))
    data = rng.randbytes(n)
    h.pwrite(data, off, nbd.CMD_FLAG_FUA if i % 7 == 0 else 0)
    model[off:off + n] = data
    r = rng.randrange(0, size - 70000)
    m = rng.choice((1, 4096, 5000, 65536))
    assert h.pread(m, r) == model[r:r + m], (i, r, m)
# trim and zero (whole and partial blocks) read back as zeros
for off, n in ((0, 4096), (8192 + 100, 10000), (1 << 20, 1 << 20)):
    h.trim(n, off)
    model[off:off + n] = bytes(n)
h.zero(3 * 4096 + 7, 2 << 20)
model[2 << 20:(2 << 20) + 3 * 4096 + 7] = bytes(3 * 4096 + 7)
h.zero(4096, 3 << 20, nbd.CMD_FLAG_FAST_ZERO)
model[3 << 20:(3 << 20) + 4096] = bytes(4096)
h.flush()
for off in range(0, size, 1 << 20):
    assert h.pread(1 << 20, off) == model[off:off + (1 << 20)], off
# past the end: the server's error (libnbd's own checks off), and the connection goes on
h.set_strict_mode(0)
for call in (lambda: h.pread(4096, size), lambda: h.pwrite(b"x" * 10, size - 5)):
    try:
        call()
        raise SystemExit("past the end was not refused")
    except nbd.Error as e:
        print("refused", e.errno)
assert h.pread(4096, 0) == model[:4096]
print("ok")
"""


@pytest.mark.parametrize("kind", FULL)
def test_nbdsh_unaligned_io_trim_zero_flush(make_device, kind):
    dev = make_device(kind, "16M")
    lines = nbdsh(dev.uri, NBDSH_SCRIPT).split("\n")
    # EINVAL for the read; the write: ENOSPC as the NBD spec asks (EINVAL from some servers)
    assert lines[0] == "refused EINVAL" and lines[1] in ("refused ENOSPC", "refused EINVAL") and lines[2] == "ok", \
        lines


# ---------------------------------------------------------------- qemu-img

@pytest.mark.parametrize("kind", FULL)
def test_qemu_img_info_convert_compare(make_device, kind, tmp_path):
    src = random_image(tmp_path / "src.img", 16 * MiB, seed=3)
    dev = make_device(kind, "16M")
    info = json.loads(run("qemu-img", "info", "--output=json", dev.uri).stdout)
    assert info["virtual-size"] == 16 * MiB
    run("qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, dev.uri)
    assert run("qemu-img", "compare", "-f", "raw", "-F", "raw", src, dev.uri).returncode == 0
    # one byte changed on the device: compare sees it (exit 1), so the match above meant something
    nbdsh(dev.uri, "h.pwrite(bytes([h.pread(1, 5 << 20)[0] ^ 0xff]), 5 << 20)")
    diff = run("qemu-img", "compare", "-f", "raw", "-F", "raw", src, dev.uri, check=False)
    assert diff.returncode == 1, diff.stdout + diff.stderr
    assert "Content mismatch at offset 5242880" in diff.stdout


# ---------------------------------------------------------------- fio

@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize("bs", ["4k", "1k-64k"])
def test_fio_nbd_engine_random_writes_verify(make_device, kind, bs, tmp_path):
    """fio writes random blocks (4 KiB, or 1-64 KiB: unaligned to the device's blocks, so
    read-modify-write) with a crc32c header in each, reads every one back and checks it."""
    dev = make_device(kind, "32M")
    out = run("fio", "--name=verify", "--ioengine=nbd", f"--uri={dev.uri}", "--rw=randwrite",
              f"--bsrange={bs}" if "-" in bs else f"--bs={bs}", "--size=16M", "--iodepth=16", "--numjobs=1",
              "--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_backlog=256",
              "--runtime=60", "--verify_state_save=0", f"--directory={tmp_path}", "--output-format=json",
              timeout=180).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    assert job["error"] == 0, job
    assert job["write"]["io_bytes"] >= 16 * MiB
    assert job["read"]["io_bytes"] > 0  # verification read back what was written


# ---------------------------------------------------------------- file systems

@pytest.mark.root
@pytest.mark.parametrize("fs", ["ext4", "xfs"])
@pytest.mark.parametrize("kind", FULL)
def test_filesystem_on_the_device(make_device, kind, fs, tmp_path):
    """nbdfuse + losetup make the export a block device: mkfs, mount, write files, unmount,
    fsck clean; then a fresh nbdfuse (new connections: nothing from a cache) mounts it again
    and every file reads back the same."""
    dev = make_device(kind, "400M")  # mkfs.xfs wants at least 300 MiB
    rng = random.Random(fs)
    files = {f"d{i % 3}/f{i}": rng.randbytes(rng.choice((1, 4095, 100_000, 3 * MiB))) for i in range(12)}
    mnt = str(tmp_path / "mnt")
    with fuse_loop(dev.uri, str(tmp_path), connections=2) as loop:
        run("mkfs.ext4", "-q", "-F", loop) if fs == "ext4" else run("mkfs.xfs", "-q", "-f", loop)
        with mounted(loop, mnt):
            for name, data in files.items():
                os.makedirs(os.path.join(mnt, os.path.dirname(name)), exist_ok=True)
                with open(os.path.join(mnt, name), "wb") as f:
                    f.write(data)
            subprocess.run(["sync"], timeout=120)
        _fsck(fs, loop)
    with fuse_loop(dev.uri, str(tmp_path)) as loop:
        _fsck(fs, loop)
        with mounted(loop, mnt):
            for name, data in files.items():
                with open(os.path.join(mnt, name), "rb") as f:
                    assert f.read() == data, name


def _fsck(fs, loop):
    if fs == "ext4":
        p = run("fsck.ext4", "-fn", loop, check=False)
    else:
        p = run("xfs_repair", "-n", loop, check=False)
    assert p.returncode == 0, p.stdout + p.stderr


# ---------------------------------------------------------------- multi-conn

# Two connections (h from nbdsh -u, h2 opened here) write overlapping, unaligned ranges at the
# same time: in each round every zone of ZONE blocks gets one write from each connection, all
# sent before any reply is awaited, in random order. Whatever order the server picks, each
# block must then hold what one order of the two writes gives (A then B, or B then A), never
# a mix (e.g. the stale bytes a read-modify-write read before the other write landed).
MULTICONN_SCRIPT = r"""
import json, random, select
BS, ZONE, NZ, ROUNDS = 4096, 4, 16, int(ROUNDS_)
rng = random.Random(SEED_)
h2 = nbd.NBD()
h2.connect_uri(URI_)
assert h.can_multi_conn()
handles = (h, h2)
span = NZ * ZONE * BS
conflicting = order_ab = order_ba = 0
mixed = []

def drive():
    while any(x.aio_in_flight() for x in handles):
        rl, wl = [], []
        for x in handles:
            if x.aio_in_flight():
                d = x.aio_get_direction()
                (rl if d & nbd.AIO_DIRECTION_READ else []).append(x.aio_get_fd())
                (wl if d & nbd.AIO_DIRECTION_WRITE else []).append(x.aio_get_fd())
        r, w, _ = select.select(rl, wl, [], 30)
        if not r and not w:
            raise SystemExit("no progress in 30 s")
        for x in handles:
            if x.aio_get_fd() in r:
                x.aio_notify_read()
            if x.aio_get_fd() in w:
                x.aio_notify_write()

def apply(base, writes):
    out = bytearray(base)
    for off, data in writes:
        out[off:off + len(data)] = data
    return out

for rnd in range(ROUNDS):
    base = h.pread(span, 0)
    zones, sends = [], []
    for z in range(NZ):
        lo, hi = z * ZONE * BS, (z + 1) * ZONE * BS
        pair = []
        for w in (0, 1):
            a = rng.randrange(lo, hi - 1)
            b = rng.randrange(a + 1, min(hi, a + rng.choice((600, 5000, 3 * BS, ZONE * BS))) + 1)
            pair.append((a, rng.randbytes(b - a)))
            sends.append((w, a, pair[-1][1]))
        zones.append(pair)
    rng.shuffle(sends)
    cookies = []
    for w, off, data in sends:
        buf = nbd.Buffer.from_bytearray(bytearray(data))
        cookies.append((handles[w], handles[w].aio_pwrite(buf, off), buf))
    drive()
    for x, c, _ in cookies:
        assert x.aio_command_completed(c)
    got = h2.pread(span, 0)  # read on the other connection: it sees both writes too
    for z, (wa, wb) in enumerate(zones):
        ab, ba = apply(base, [wa, wb]), apply(base, [wb, wa])
        for blk in range(z * ZONE, (z + 1) * ZONE):
            s = slice(blk * BS, (blk + 1) * BS)
            if ab[s] != ba[s]:
                conflicting += 1
                order_ab += got[s] == ab[s]
                order_ba += got[s] == ba[s]
            if got[s] != ab[s] and got[s] != ba[s] and len(mixed) < 5:
                # bytes of neither order (stale), or each byte of one order but not all of the same
                neither = sum(got[s][i] != ab[s][i] and got[s][i] != ba[s][i] for i in range(BS))
                mixed.append(dict(round=rnd, block=blk, a=(wa[0], len(wa[1])), b=(wb[0], len(wb[1])),
                                  bytes_from_neither=neither))
h2.shutdown()
print(json.dumps(dict(conflicting=conflicting, order_ab=order_ab, order_ba=order_ba, mixed=mixed)))
"""


@pytest.mark.parametrize("kind", FULL + ["redis"])
def test_multiconn_overlapping_unaligned_writes_never_mix(make_device, kind):
    dev = make_device(kind, "16M")
    code = MULTICONN_SCRIPT.replace("ROUNDS_", "150").replace("SEED_", "11").replace("URI_", repr(dev.uri))
    res = json.loads(nbdsh(dev.uri, code, timeout=240).strip().splitlines()[-1])
    assert res["mixed"] == [], res
    # the writes did overlap: blocks whose content depends on the order (both orders are allowed)
    assert res["conflicting"] > 100 and res["order_ab"] + res["order_ba"] >= res["conflicting"], res


# ---------------------------------------------------------------- Python API

@pytest.mark.parametrize("kind", ["embedded", "redis"])
def test_python_block_device_uri_stats_stop(kind, tmp_path):
    """kvstore.BlockDevice as a notebook uses it: start, uri, stats, stop."""
    from helpers.blockdev import have_our_server
    from kvstore import BlockDevice, ServerError
    if not have_our_server():
        pytest.skip("this tree has no C NBD server yet (ext/frontend/nbd.c)")
    backend = Backend("redis").start() if kind == "redis" else None
    try:
        settings = dict(durability="none", data_dir=str(tmp_path / "data")) if backend is None else {}
        dev = BlockDevice(size="8M", backend=backend.url if backend else "embedded", threads=1, **settings)
        with dev:
            assert dev.uri == f"nbd://127.0.0.1:{dev.port}/kvstore" and dev.port > 0
            nbdsh(dev.uri, "h.pwrite(b'\\x01' * (128 << 10), 4096); h.pread(4096, 0); h.flush()")
            st = dev.stats()
            assert st["writes"] == 1 and st["reads"] == 1 and st["flushes"] == 1
            assert st["bytes_written"] == 128 << 10 and st["bytes_read"] == 4096
            assert st["kv_puts"] == 32 and st["kv_gets"] >= 1  # a 128 KiB write: 32 blocks
            assert st["kv_requests_per_io"] == st["kv_requests"] / st["ios"] > 1
            if dev.server is not None:  # embedded: INFO blockdev (redis-cli's view) says the same
                info = dev.server.info("blockdev")
                assert (info["blockdev_writes"], info["blockdev_kv_puts"]) == (st["writes"], st["kv_puts"])
                assert info["blockdev_kv_per_io"] == round(st["kv_requests_per_io"], 2)
        assert not dev.running
        with pytest.raises(ServerError, match="not running"):
            dev.stats()
        with pytest.raises(ServerError, match="not running"):
            dev.uri
    finally:
        if backend:
            backend.stop()


@pytest.mark.parametrize("backend", ["embedded", "redis"])
def test_unix_socket_listener_alone(make_device, backend, tmp_path):
    """--unix without --listen: one ready line, nbd+unix://, and no TCP listener."""
    sock = str(tmp_path / "nbd.sock")
    dev = make_device(backend, "8M", "--unix", sock)
    assert dev.uri == f"nbd+unix:///kvstore?socket={sock}"
    assert "nbd://" not in dev.log()
    (export,) = json.loads(run("nbdinfo", "--json", dev.uri).stdout)["exports"]
    assert export["export-size"] == 8 * MiB and export["export-name"] == "kvstore"
    src = random_image(tmp_path / "src.img", 8 * MiB, seed=9)
    run("nbdcopy", src, dev.uri)
    run("nbdcopy", dev.uri, tmp_path / "out.img")
    assert sha256_file(tmp_path / "out.img") == sha256_file(src)
