"""Silent damage to a node's files, made with the server stopped (issue 12, item 7): real
`kvstore serve` processes on a data file, real redis-py clients, files changed on disk.

What is checked, one test per case:
  1. a torn write of a home block (a power cut mid-write, made by the fault hook
     KVSTORE_FAULT_TEAR_HOME_WRITE) needs no peer: the node starts and every
     acknowledged write reads back;
  2. a zeroed 4 KiB data block is detected: the server refuses to start and
     `kvstore recover --check-only` exits non-zero, naming the bucket and what is lost;
  3. an older but valid copy of a block put back in its place: the same;
  4. the log's last segment deleted: the same, naming the segment;
  5. a middle segment deleted: the same;
  6. a data file in the previous format: a clear message.
The data file layout read here is the one described in ext/durability/bosc.h.
"""
import os
import struct

import pytest

from helpers import faultlib as fl
from helpers.conn import client

BLOCK = 4096
FIRST_TABLE = 2               # blocks 0 and 1 are the superblock copies; the bucket table follows
BHDR = 40                     # block header: magic crc no next gen(u64) used home seq(u64)
TAB_PER_PAGE = (BLOCK - BHDR) // 8
BLK_MAGIC = b"KVB1"
NODE_DEFAULTS = {"data_file": True}
BUCKETS = 64


def datafile(data_dir):
    return os.path.join(str(data_dir), "data.kvd")


def first_home(buckets=BUCKETS):
    return FIRST_TABLE + 2 * ((buckets + TAB_PER_PAGE - 1) // TAB_PER_PAGE)


def wait_flushed(port, timeout=60.0):
    """Until the data file holds everything the log made durable (a sweep is also asked
    for: DBSIZE waits for one)."""
    import time
    deadline = time.monotonic() + timeout
    while True:
        with client(port) as c:
            c.dbsize()
            i = c.info("persistence")
        assert not i["datafile_failed"], i["datafile_error"]
        if i["datafile_flushed_lsn"] == i["log_durable_lsn"] == i["log_appended_lsn"]:
            return i
        assert time.monotonic() < deadline, f"data file not flushed after {timeout} s: {i}"
        time.sleep(0.05)


def home_copies(path, bucket, buckets=BUCKETS):
    """[(block number, seq or None if not a valid-looking data block)] of bucket's two home copies."""
    out = []
    with open(path, "rb") as f:
        for s in (0, 1):
            no = first_home(buckets) + 2 * bucket + s
            f.seek(no * BLOCK)
            b = f.read(BLOCK).ljust(BLOCK, b"\0")
            ok = b[:4] == BLK_MAGIC and struct.unpack_from("<I", b, 4)[0] == fl.crc32c(b[8:])
            out.append((no, struct.unpack_from("<Q", b, 32)[0] if ok else None, b))
    return out


def newest_copy(path, bucket):
    copies = [c for c in home_copies(path, bucket) if c[1] is not None]
    return max(copies, key=lambda c: c[1]) if copies else None


def items(n, ver):
    return [(b"int:%05d" % i, (b"%05d.v%d." % (i, ver)) * 12) for i in range(n)]


def set_all(port, kv, per=500):
    with client(port) as c:
        for i in range(0, len(kv), per):
            p = c.pipeline(transaction=False)
            for k, v in kv[i:i + per]:
                p.set(k, v)
            assert all(r is True for r in p.execute())


def check_all(port, kv):
    with client(port) as c:
        for i in range(0, len(kv), 500):
            part = kv[i:i + 500]
            got = c.mget([k for k, _ in part])
            wrong = [(k, v, g) for (k, v), g in zip(part, got) if g != v]
            assert not wrong, f"{len(wrong)} keys read back wrong, e.g. {wrong[:2]}"


def assert_refused(data_dir, *details):
    """`kvstore serve` and `kvstore recover` (with and without --check-only) refuse data_dir,
    saying every one of details."""
    rc, out, err = fl.run_serve(data_dir, extra=["--data-file"])
    assert rc is not None, f"kvstore serve STARTED on a damaged node:\nstdout: {out}\nstderr: {err}"
    assert rc != 0 and "listening on" not in out, (rc, out, err)
    assert all(d in err for d in details), (details, err)
    for extra in (["--check-only"], []):
        rc, out, err = fl.run_recover(data_dir, *extra)
        assert rc != 0 and all(d in err for d in details), (extra, rc, out, err, details)
        assert "keys:" not in out


# ================================================================ 1. torn home block write

@pytest.mark.timeout(120)
def test_torn_home_block_write_needs_no_peer(data_dir, nodes, monkeypatch):
    """Sweep 1 writes v1 of 3,000 keys (64 buckets: chains of two blocks). The next run
    acknowledges v2 of every key, then its first home-block write is torn (half the
    block written, the process killed). The restart must come up from the file and the
    log alone, with v2 everywhere: a torn block never needs the peer."""
    v1, v2 = items(3000, 1), items(3000, 2)
    n = nodes(data_dir, data_buckets=BUCKETS, flush_interval_ms=100)
    set_all(n.port, v1)
    wait_flushed(n.port)
    assert n.stop() == 0
    monkeypatch.setenv("KVSTORE_FAULT_TEAR_HOME_WRITE", "1")
    n = nodes(data_dir, data_buckets=BUCKETS, flush_interval_ms=600000)
    set_all(n.port, v2)  # acknowledged: in the synced log
    with pytest.raises(Exception):
        with client(n.port) as c:
            c.dbsize()  # asks for a sweep: its first home-block write tears and the process dies
    n.proc.wait(30)
    assert n.proc.returncode == -9, n.log()
    monkeypatch.delenv("KVSTORE_FAULT_TEAR_HOME_WRITE")
    n = nodes(data_dir, data_buckets=BUCKETS, flush_interval_ms=100)
    check_all(n.port, v2)
    wait_flushed(n.port)
    n.stop()


# ================================================================ 2, 3. a zeroed block, an older copy

def blocks_holding(path, needle):
    """Offsets of the 4 KiB blocks of path that contain needle (a record's key + value)."""
    with open(path, "rb") as f:
        data = f.read()
    return [off for off in range(0, len(data), BLOCK) if needle in data[off:off + BLOCK]]


def latest_block_holding(path, needle):
    """The offset of the block that holds needle and was written last (both home copies
    hold it when round 2 wrote the bucket in two sweeps; the header's u64 at 32 says which
    sweep wrote a block)."""
    offs = blocks_holding(path, needle)
    assert offs, needle
    data = open(path, "rb").read()
    return max(offs, key=lambda off: struct.unpack_from("<Q", data, off + 32)[0])


def two_rounds(data_dir, nodes, tmp_path):
    """1,024 buckets, 3,000 keys (no overflow blocks: every record lives in a home block).
    Round 1 writes every key twice (two sweeps), then a copy of the stopped node is kept;
    round 2 writes every key again. Returns (the copy's data file, round 2's items)."""
    v1, v1b, v2 = items(3000, 1), items(3000, 3), items(3000, 2)
    s = dict(data_buckets=1024, flush_interval_ms=100)
    n = nodes(data_dir, **s)
    for kv in (v1, v1b):
        set_all(n.port, kv)
        wait_flushed(n.port)
    assert n.stop() == 0
    old = tmp_path / "round1.kvd"
    old.write_bytes(open(datafile(data_dir), "rb").read())
    n = nodes(data_dir, **s)
    set_all(n.port, v2)
    wait_flushed(n.port)
    assert n.stop() == 0
    return old, v2


@pytest.mark.timeout(120)
def test_zeroed_block_is_detected(data_dir, nodes, tmp_path):
    """The blocks holding two keys' latest records, zeroed with the server stopped:
    before, their buckets read as empty and their keys were silently gone. Every
    damaged bucket is reported, not just the first."""
    _, v2 = two_rounds(data_dir, nodes, tmp_path)
    path = datafile(data_dir)
    offs = [latest_block_holding(path, k + v) for k, v in v2[42:43] + v2[2000:2001]]
    if offs[0] // (2 * BLOCK) == offs[1] // (2 * BLOCK):  # the same bucket: take another key
        offs[1] = next(o for o in (latest_block_holding(path, k + v) for k, v in v2[2001:])
                       if o // (2 * BLOCK) != offs[0] // (2 * BLOCK))
    with open(path, "r+b") as f:
        for off in offs:
            f.seek(off)
            f.write(bytes(BLOCK))
    assert_refused(data_dir, f"data file {path} damaged: bucket ", "a block was zeroed", "is lost",
                   "(2 bucket(s) of 1024 lost writes so: ")


@pytest.mark.timeout(120)
def test_older_copy_of_a_block_is_detected(data_dir, nodes, tmp_path):
    """The block holding key 42's latest record replaced by what the same place held
    after round 1 (a valid block, checksum and all): before, 13 stale values were served."""
    old, v2 = two_rounds(data_dir, nodes, tmp_path)
    path = datafile(data_dir)
    k, v = v2[42]
    off = latest_block_holding(path, k + v)
    prev = old.read_bytes()[off:off + BLOCK]
    assert prev[:4] == BLK_MAGIC and prev != open(path, "rb").read()[off:off + BLOCK]
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(prev)
    assert_refused(data_dir, f"data file {path} damaged: bucket ", "the bucket table records its write of sweep",
                   "is lost")


# ================================================================ 4, 5. a deleted log segment

def many_segments(data_dir, nodes):
    """1,000 acknowledged SETs in 4 KiB log segments (a new one after each group commit that
    passes 4 KiB), none flushed to the data file (its sweep is 10 minutes away), then kill -9.
    Pipelines of 50 (about 6 KB each, every one acknowledged before the next is sent) make
    at least 20 group commits however loaded the machine is. Returns the segments holding
    records, oldest first."""
    n = nodes(data_dir, log_segment_size=4096, flush_interval_ms=600000)
    set_all(n.port, items(1000, 1), per=50)
    n.kill()
    segs = [p for p in fl.segments(data_dir) if fl.parse_segment(p)[1]]
    assert len(segs) >= 3, segs
    return segs


@pytest.mark.timeout(120)
def test_deleted_last_log_segment_is_detected(data_dir, nodes):
    """Before, the log just ended early: the keys of the last segment were gone and
    `kvstore recover --check-only` returned 0."""
    segs = many_segments(data_dir, nodes)
    for p in fl.segments(data_dir):
        if p >= segs[-1]:  # the last segment holding records (and an empty newer one, if any)
            os.unlink(p)
    assert_refused(data_dir, f"log {fl.log_dir(data_dir)} is missing segment", "the records from LSN")


@pytest.mark.timeout(120)
def test_deleted_middle_log_segment_is_detected(data_dir, nodes):
    segs = many_segments(data_dir, nodes)
    os.unlink(segs[len(segs) // 2])
    assert_refused(data_dir, "a segment or records are missing")


# ================================================================ 6. the previous format

def test_previous_format_gets_a_clear_message(data_dir):
    """A data file whose superblock says format 1 (kvstore before the bucket table)."""
    sb = bytearray(BLOCK)
    sb[0:8] = b"KVSBOSC1"
    struct.pack_into("<IQIIQQQQQ", sb, 12, 1, 1, BLOCK, 16, 0, 1, 7, 9, 2 + 16)
    struct.pack_into("<I", sb, 8, fl.crc32c(bytes(sb[12:])))
    with open(datafile(data_dir), "wb") as f:
        f.write(bytes(sb) + bytes(BLOCK * 17))
    assert_refused(data_dir, "data file format version 1, this kvstore reads version 2")


def table_entry(path, bucket):
    """(the sweep the bucket table records for bucket, from its newest valid page copy)."""
    pg, best = bucket // TAB_PER_PAGE, None
    with open(path, "rb") as f:
        for c in (0, 1):
            f.seek((FIRST_TABLE + 2 * pg + c) * BLOCK)
            b = f.read(BLOCK).ljust(BLOCK, b"\0")
            if b[:4] == b"KVT2" and struct.unpack_from("<I", b, 4)[0] == fl.crc32c(b[8:]):
                if best is None or struct.unpack_from("<Q", b, 32)[0] > struct.unpack_from("<Q", best, 32)[0]:
                    best = b
    assert best is not None, "no valid copy of bucket table page %d" % pg
    return struct.unpack_from("<Q", best, BHDR + 8 * (bucket % TAB_PER_PAGE))[0]


@pytest.mark.timeout(120)
def test_torn_home_write_in_a_later_chunk_keeps_the_chunks_settled_before_it(data_dir, nodes, monkeypatch):
    """A sweep settled chunk by chunk (--sweep-chunk-pct; 3,000 keys over 64 buckets: the
    1,024 keys a chunk holds at least span ~22 buckets, so the sweep has three chunks).
    Run 1 writes v1; run 2 acknowledges v2 of every key, then its sweep's 40th home-block
    write (a bucket of the second chunk) is torn and the process killed. The first chunk
    was settled before: the file records it (the bucket table names the sweep that wrote
    bucket 0's newest copy, which holds v2) while the flushed LSN has not moved; the
    restart comes up from the file and the log alone with v2 everywhere. Before chunks,
    nothing of the sweep was recorded before its end."""
    v1, v2 = items(3000, 1), items(3000, 2)
    s = dict(data_buckets=BUCKETS, max_memory="4mb", sweep_chunk_pct=1)
    n = nodes(data_dir, flush_interval_ms=100, **s)
    set_all(n.port, v1)
    flushed = wait_flushed(n.port)["datafile_flushed_lsn"]
    assert n.stop() == 0
    path = datafile(data_dir)
    before = table_entry(path, 0)
    monkeypatch.setenv("KVSTORE_FAULT_TEAR_HOME_WRITE", "40")
    n = nodes(data_dir, flush_interval_ms=600000, **s)
    set_all(n.port, v2)  # acknowledged: in the synced log
    with pytest.raises(Exception):
        with client(n.port) as c:
            c.dbsize()  # asks for a sweep: its 40th home-block write tears and the process dies
    n.proc.wait(30)
    assert n.proc.returncode == -9, n.log()
    monkeypatch.delenv("KVSTORE_FAULT_TEAR_HOME_WRITE")
    recorded, newest = table_entry(path, 0), newest_copy(path, 0)
    assert recorded > before and recorded == newest[1], (before, recorded, newest[1])
    assert b".v2." in newest[2] and b".v1." not in newest[2]
    assert b".v1." in newest_copy(path, BUCKETS - 1)[2]  # the last chunk: not written before the kill
    with open(path, "rb") as f:  # the superblock's flushed LSN (u64 at 32): run 1's
        sbs = [f.read(BLOCK) for _ in (0, 1)]
    newest_sb = max((b for b in sbs if b[:8] == b"KVSBOSC1"), key=lambda b: struct.unpack_from("<Q", b, 16)[0])
    assert struct.unpack_from("<Q", newest_sb, 32)[0] == flushed
    n = nodes(data_dir, flush_interval_ms=100, **s)
    check_all(n.port, v2)
    wait_flushed(n.port)
    n.stop()
