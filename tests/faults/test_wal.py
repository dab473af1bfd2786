"""The write-ahead log (ext/durability/wal.h) in `--durability disk`: real server processes,
logs cut and bit-flipped on disk, `kvstore recover`, and real clients. Nothing is mocked.
The durability of a served node under kill -9 and the held replies: test_disk_durability.py.

What is checked (see ext/durability/wal.h for the log format):
  1. the recovery line and LSNs across restarts;
  2. a torn tail is truncated, later writes survive;
  3. a flipped bit with valid data after it stops the server (and `kvstore recover`);
     a flipped bit in the very last record is a torn tail;
  4. foreign files / bad segment headers are refused, a missing middle segment is a gap;
  5. group commit (many records per fdatasync);
  6. --durability none writes no log;
  7. segments prepared over zeros (KVSWAL03): kill -9 under load loses nothing acknowledged,
     the zeros end a segment cleanly, damage within one piece (1 MiB) of the end of the last
     one is a torn tail, damage with more data after it (or in an earlier segment) is refused.
"""
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest

from helpers import faultlib as fl
from helpers.conn import client
from helpers.faultlib import mget_all, persistence, recovery_of, write_keys
from kvstore import Node, Store, durability
from kvstore.errors import CorruptLogError, ServerError

pytestmark = pytest.mark.timeout(120)


# ================================================================ 1. recovery line and LSNs

@pytest.mark.timeout(60)
def test_recovery_line_and_lsns_continue_across_restarts(data_dir, nodes):
    # run 1: writes of every kind, then a clean stop (SIGTERM)
    n1 = nodes(data_dir)
    assert fl.parse_recovery(n1.log()) == "empty"
    with client(n1.port) as c:
        for i in range(40):
            c.set(f"a{i}", f"one-{i}")
        for _ in range(7):
            c.incr("counter")
        c.append("a1", "+more")
        c.delete("a2", "a3")
        c.mset({"m1": "x", "m2": "y", "m3": "z"})
        c.set("short-lived", "v", px=150)
        c.set("long-lived", "v", ex=100000)
        snapshot1 = {k: c.get(k) for k in [f"a{i}" for i in range(40)] + ["counter", "m1", "m2", "m3",
                                                                          "long-lived"]}
    info1 = persistence(n1.port)
    l1 = info1["log_durable_lsn"]
    assert info1["durability"] == "disk"
    assert l1 == info1["log_appended_lsn"] == info1["log_records"] >= 40 + 7 + 1 + 2 + 3 + 2
    assert n1.stop() == 0
    segs = fl.segments(data_dir)
    assert [os.path.basename(p) for p in segs] == [fl.seg_name(1)]
    _, recs = fl.parse_segment(segs[0])
    # Active expiry may have deleted "short-lived" (150 ms) between INFO and the stop, one
    # more record (when depends on the machine's load): the log is what run 2 recovers.
    if len(recs) == l1 + 1:
        assert (recs[-1].op, recs[-1].key) == (fl.OP_DEL, b"short-lived"), recs[-1]
        l1 += 1
    assert [r.lsn for r in recs] == list(range(1, l1 + 1))
    # our encoder (used by the exhaustive bit-flip tests) writes exactly what the server writes
    assert all(fl.encode_record(r.op, r.key, r.value, r.lsn, r.expire_ms) == r.raw for r in recs)
    assert any(r.expire_ms > 0 for r in recs) and {r.op for r in recs} == {fl.OP_SET, fl.OP_DEL}

    # run 2: recovers run 1, continues its LSNs; FLUSHALL, new writes; SIGKILL
    time.sleep(0.2)  # "short-lived" has expired by now
    n2 = nodes(data_dir)
    rec = recovery_of(n2)
    assert (rec.records, rec.first, rec.last, rec.segments, rec.torn) == (l1, 1, l1, 1, False), rec
    info = persistence(n2.port)
    assert info["log_durable_lsn"] == l1 + info["log_records"] and info["log_records"] <= 1  # (an expiry?)
    with client(n2.port) as c:
        assert {k: c.get(k) for k in snapshot1} == snapshot1
        assert c.get("short-lived") is None
        c.flushall()
        for i in range(25):
            c.set(f"b{i}", f"two-{i}")
        c.incrby("counter", 5)
        snapshot2 = {k: c.get(k) for k in list(snapshot1) + [f"b{i}" for i in range(25)]}
        assert c.dbsize() == 26
    info2 = persistence(n2.port)
    l2 = info2["log_durable_lsn"]
    assert l2 == l1 + info2["log_records"] and info2["log_records"] >= 1 + 25 + 1
    assert info2["log_appended_lsn"] == l2
    n2.kill()
    segs = fl.segments(data_dir)
    assert [os.path.basename(p) for p in segs] == [fl.seg_name(1), fl.seg_name(l1 + 1)]
    _, recs2 = fl.parse_segment(segs[1])
    assert [r.lsn for r in recs2] == list(range(l1 + 1, l2 + 1))
    assert fl.OP_FLUSH in [r.op for r in recs2[:2]]

    # run 3: the recovery line covers both runs
    n3 = nodes(data_dir)
    rec = recovery_of(n3)
    assert (rec.records, rec.first, rec.last, rec.segments, rec.torn) == (l2, 1, l2, 2, False), rec
    assert persistence(n3.port)["log_durable_lsn"] == l2
    with client(n3.port) as c:
        assert {k: c.get(k) for k in snapshot2} == snapshot2
        assert c.dbsize() == 26
        c.set("c", "three")
    assert persistence(n3.port)["log_durable_lsn"] == l2 + 1
    n3.kill()
    rc, out, err = fl.run_recover(data_dir, "--check-only")
    assert rc == 0, err
    rec = fl.parse_recovery(out)
    assert (rec.records, rec.last, rec.segments) == (l2 + 1, l2 + 1, 3), out
    assert "keys: 27," in out


@pytest.mark.timeout(60)
def test_restart_without_writes_in_between(data_dir, nodes):
    """Stop a disk-mode server that took no writes (since its start) and start it again."""
    n = nodes(data_dir)
    n.stop()
    n = nodes(data_dir)  # an empty log (one header-only segment): must start
    with client(n.port) as c:
        c.set("k", "v")
    n.kill()
    n = nodes(data_dir)
    n.kill()             # a run with no writes after one with writes
    n = nodes(data_dir)
    rec = recovery_of(n)
    assert (rec.records, rec.last) == (1, 1), rec
    with client(n.port) as c:
        assert c.get("k") == b"v"


# ================================================================ 2. torn tail

def _torn_setup(data_dir, nodes, rng, nkeys=40, sig=signal.SIGKILL):
    n = nodes(data_dir)
    items = [(f"torn:{i:03d}", f"value-{i:03d}-" + "v" * rng.randint(60, 300)) for i in range(nkeys)]
    write_keys(n.port, items)
    n.stop(sig=sig)
    (path,) = fl.segments(data_dir)
    _, recs = fl.parse_segment(path)
    assert len(recs) == nkeys and [r.key.decode() for r in recs] == [k for k, _ in items]
    return items, path, recs


# (where to damage the tail, seed)
TORN_CASES = [
    ("record-header", 1), ("record-header", 2), ("key", 3), ("value", 4), ("value", 5),
    ("lsn", 6), ("second-to-last", 7), ("third-to-last", 8), ("zero-filled", 9),
    ("partly-written", 10), ("anywhere-in-last-3", 11), ("anywhere-in-last-3", 12),
    ("header-then-zeros", 13), ("header-then-zeros", 14),
    ("partly-written-then-zero-filled", 15), ("partly-written-then-zero-filled", 16),
]


@pytest.mark.parametrize("where,seed", TORN_CASES, ids=[f"{w}-{s}" for w, s in TORN_CASES])
@pytest.mark.timeout(60)
def test_torn_tail_is_truncated_and_later_writes_survive(data_dir, nodes, where, seed):
    rng = random.Random(seed)
    items, path, recs = _torn_setup(data_dir, nodes, rng, sig=signal.SIGKILL if seed % 2 else signal.SIGTERM)
    size = os.path.getsize(path)
    last = recs[-1]
    klen = len(last.key)
    if where == "zero-filled":  # preallocated / unwritten space after the last record
        with open(path, "ab") as f:
            f.write(b"\0" * rng.choice([1, 100, 4096]))
        keep, cut_at = len(recs), size
    elif where == "header-then-zeros":  # part of the last header written (up to its op byte at
        # most), zeros where the rest was due and beyond: unwritten, zero-filled space
        os.truncate(path, last.off + rng.randint(1, fl.OFF_OP))
        with open(path, "ab") as f:
            f.write(b"\0" * rng.choice([last.length, 4096]))
        keep, cut_at = len(recs) - 1, last.off
    elif where == "partly-written-then-zero-filled":  # the header and part of the payload
        # written, zeros from there to the end of the record and on (the file grew further)
        os.truncate(path, rng.randint(last.off + fl.REC_HDR, last.end - 8))
        with open(path, "ab") as f:
            f.write(b"\0" * (last.end - os.path.getsize(path) + rng.choice([1, 512, 4096])))
        keep, cut_at = len(recs) - 1, last.off
    elif where == "partly-written":  # the last record's bytes from some point on never made it
        z = rng.randint(last.off + fl.REC_HDR + klen, last.end - 8)  # up to the LSN's low byte
        with open(path, "r+b") as f:
            f.seek(z)
            f.write(b"\0" * (last.end - z))
        keep, cut_at = len(recs) - 1, last.off
    else:
        if where == "record-header":
            idx, lo, hi = -1, 1, fl.REC_HDR - 1
        elif where == "key":
            idx, lo, hi = -1, fl.REC_HDR, fl.REC_HDR + klen - 1
        elif where == "value":
            idx, lo, hi = -1, fl.REC_HDR + klen + 1, last.length - fl.REC_TRAILER - 1
        elif where == "lsn":
            idx, lo, hi = -1, last.length - fl.REC_TRAILER, last.length - 1
        elif where == "second-to-last":
            idx, lo, hi = -2, 1, recs[-2].length - 1
        elif where == "third-to-last":
            idx, lo, hi = -3, 1, recs[-3].length - 1
        else:
            idx = rng.choice([-1, -2, -3])
            lo, hi = 1, recs[idx].length - 1
        cut_rec = recs[idx]
        os.truncate(path, cut_rec.off + rng.randint(lo, hi))
        keep, cut_at = len(recs) + idx, cut_rec.off

    n = nodes(data_dir)
    rec = recovery_of(n)
    assert rec.torn and "truncated" in rec.rest, rec
    assert f"torn tail in {path} at offset {cut_at} " in rec.line, rec
    assert f"after LSN {keep}" in rec.line, rec
    assert (rec.records, rec.first, rec.last, rec.segments) == (keep, 1, keep, 1), rec
    assert os.path.getsize(path) == cut_at, "the torn tail was not truncated on disk"
    assert persistence(n.port)["log_durable_lsn"] == keep
    keys = [k for k, _ in items]
    got = mget_all(n.port, keys)
    for i, (k, v) in enumerate(items):
        assert got[k] == (v.encode() if i < keep else None), (k, i, keep)

    # new writes after the repair, then another crash and restart
    new = [(f"after:{i}", f"new-{i}") for i in range(10)] + [(items[0][0], "overwritten")]
    write_keys(n.port, new)
    assert persistence(n.port)["log_durable_lsn"] == keep + len(new)
    n.kill()
    n = nodes(data_dir)
    rec = recovery_of(n)
    assert not rec.torn and (rec.records, rec.last, rec.segments) == (keep + len(new), keep + len(new), 2), rec
    expect = {k: (v.encode() if i < keep else None) for i, (k, v) in enumerate(items)}
    expect.update({k: v.encode() for k, v in new})
    assert mget_all(n.port, list(expect)) == expect
    n.kill()


@pytest.mark.parametrize("fake_lsn", [2 ** 62, 12], ids=["lsn-2^62", "lsn-12"])
@pytest.mark.timeout(60)
def test_torn_tail_whose_value_holds_bytes_that_look_like_a_record(data_dir, nodes, fake_lsn):
    """A client stores a value that happens to contain a well-formed log record (say,
    a copy of a kvstore log segment). A crash cuts the log inside that value, after the
    embedded bytes: still a torn tail of the last record (nothing was written after it),
    and the server must start."""
    n = nodes(data_dir)
    items = [(f"k{i}", f"v{i}") for i in range(10)]
    write_keys(n.port, items)
    fake = fl.encode_record(fl.OP_SET, b"fake-key", b"fake-value", fake_lsn)
    blob = b"B" * 8 + fake + b"P" * 300
    with client(n.port) as c:
        c.set("blob", blob)
    n.kill()
    (path,) = fl.segments(data_dir)
    _, recs = fl.parse_segment(path)
    last = recs[-1]
    assert last.key == b"blob" and last.lsn == 11
    fake_end = last.off + fl.REC_HDR + len(b"blob") + 8 + len(fake)
    os.truncate(path, fake_end + random.Random(fake_lsn).randint(1, 299))
    try:
        n = nodes(data_dir)
    except ServerError as e:
        pytest.fail(f"kvstore serve refused to start after a crash that tore the last record: {e}")
    rec = recovery_of(n)
    assert rec.torn and (rec.records, rec.last) == (10, 10), rec
    with client(n.port) as c:
        assert c.get("blob") is None and c.get("k9") == b"v9"


@pytest.mark.timeout(60)
def test_torn_tail_that_removes_every_record_of_the_last_segment(data_dir, nodes):
    """Crash during the first group written after a restart: the last segment's only
    record is cut. Recovery ends at the previous segment's last LSN; the server must
    still start (its new segment starts at the same LSN as the torn one)."""
    rng = random.Random(5)
    n = nodes(data_dir)
    write_keys(n.port, [(f"k{i}", f"v{i}") for i in range(5)])
    n.kill()
    n = nodes(data_dir)
    write_keys(n.port, [("lost", "x" * 100)])
    n.kill()
    seg1, seg2 = fl.segments(data_dir)
    assert os.path.basename(seg2) == fl.seg_name(6)
    _, (only,) = fl.parse_segment(seg2)
    os.truncate(seg2, only.off + rng.randint(1, only.length - 1))
    n = nodes(data_dir)
    rec = recovery_of(n)
    assert rec.torn and (rec.records, rec.last) == (5, 5), rec
    with client(n.port) as c:
        assert c.get("lost") is None and c.get("k4") == b"v4"
        c.set("later", "1")
    n.kill()
    n = nodes(data_dir)
    with client(n.port) as c:
        assert c.get("later") == b"1" and c.get("k0") == b"v0"


@pytest.mark.parametrize("keep_bytes", [0, 7])
@pytest.mark.timeout(60)
def test_segment_header_cut_short_by_a_crash(data_dir, nodes, keep_bytes):
    """A crash right after a segment file was created, before its 16-byte header was
    written: the last segment is 0..15 bytes. Recovery ignores it (says so); the
    server must start with everything before it."""
    n = nodes(data_dir)
    write_keys(n.port, [(f"k{i}", f"v{i}") for i in range(3)])
    n.kill()
    with open(os.path.join(fl.log_dir(data_dir), fl.seg_name(4)), "wb") as f:
        f.write(fl.MAGIC[:keep_bytes])
    n = nodes(data_dir)
    rec = recovery_of(n)
    assert (rec.records, rec.last) == (3, 3) and "header cut short" in rec.rest, rec
    with client(n.port) as c:
        assert [c.get(f"k{i}") for i in range(3)] == [b"v0", b"v1", b"v2"]
        c.set("k3", "v3")
    n.kill()
    n = nodes(data_dir)
    with client(n.port) as c:
        assert c.get("k3") == b"v3"


# ================================================================ 3. flipped bits

def _flip_setup(data_dir, nodes, nkeys=30):
    n = nodes(data_dir)
    items = [(f"flip:{i:02d}", f"value-{i:02d}-" + "p" * (20 + i)) for i in range(nkeys)]
    write_keys(n.port, items)
    n.kill()
    (path,) = fl.segments(data_dir)
    _, recs = fl.parse_segment(path)
    assert len(recs) == nkeys
    return items, path, recs


def _assert_refused(data_dir, path, off, after_lsn, why=None):
    """`kvstore serve` refuses to start and `kvstore recover` (with and without
    --check-only) exits 1, all naming the file, the offset, the reason (if given) and
    the last good LSN; the log is left as it was."""
    with open(path, "rb") as f:
        before = f.read()
    details = [f"log corrupt in {path} at offset {off} (", f") after LSN {after_lsn}:",
               "nothing after it was applied"] + ([f"({why})"] if why else [])
    rc, out, err = fl.run_serve(data_dir)
    assert rc is not None, f"kvstore serve STARTED on a corrupt log:\nstdout: {out}\nstderr: {err}"
    assert rc != 0 and "listening on" not in out, (rc, out, err)
    assert all(d in err for d in details), (details, err)
    assert "move a damaged segment away" in err, err  # the advice
    for extra in ([], ["--check-only"]):
        rc, out, err = fl.run_recover(data_dir, *extra)
        assert rc == 1 and all(d in err for d in details), (extra, rc, out, err, details)
        assert "keys:" not in out
    with open(path, "rb") as f:
        assert f.read() == before, "a refused log was modified"


FLIP_FIELDS = ["crc", "expire", "key", "value", "lsn"]


@pytest.mark.parametrize("field", FLIP_FIELDS)
@pytest.mark.timeout(60)
def test_flipped_bit_in_a_middle_record_is_refused(data_dir, nodes, field):
    rng = random.Random(field)
    items, path, recs = _flip_setup(data_dir, nodes)
    m = rng.randint(5, len(recs) - 5)
    r = recs[m]
    klen = len(r.key)
    lo, hi = {"crc": (0, 3), "expire": (fl.OFF_EXPIRE, fl.OFF_EXPIRE + 7),
              "key": (fl.REC_HDR, fl.REC_HDR + klen - 1), "value": (fl.REC_HDR + klen, r.length - 9),
              "lsn": (r.length - 8, r.length - 1)}[field]
    fl.flip_bit(path, r.off + rng.randint(lo, hi), rng.randrange(8))
    # a payload bit: the record's CRC; a header bit: the header's own CRC
    _assert_refused(data_dir, path, r.off, r.lsn - 1, why=None if field == "expire" else "CRC mismatch")


@pytest.mark.parametrize("case", ["vlen+65536", "klen+16M"])
@pytest.mark.timeout(60)
def test_flipped_length_bit_in_a_middle_record_is_refused(data_dir, nodes, case):
    """A flipped bit in a middle record's key or value length that makes the record
    claim to run past the end of the file: valid records follow, so this is corruption,
    not a torn tail. (A torn-tail repair here would truncate away acknowledged writes.)"""
    items, path, recs = _flip_setup(data_dir, nodes)
    r = recs[10]
    pos, bit = {"vlen+65536": (fl.OFF_VLEN + 2, 0), "klen+16M": (fl.OFF_KLEN + 3, 0)}[case]
    fl.flip_bit(path, r.off + pos, bit)
    with open(path, "rb") as f:
        damaged = f.read()
    rc, out, err = fl.run_serve(data_dir)
    size_after = os.path.getsize(path)
    assert rc is not None and rc != 0, (
        f"kvstore serve started on a log with {len(recs) - 11} valid records after the damaged one "
        f"(file {len(damaged)} bytes before the start, {size_after} after)\nstderr: {err}")
    assert f"log corrupt in {path} at offset {r.off}" in err, err
    assert os.path.getsize(path) == len(damaged)


@pytest.mark.timeout(60)
def test_flipped_bit_in_the_last_record_is_a_torn_tail(data_dir, nodes):
    items, path, recs = _flip_setup(data_dir, nodes)
    last = recs[-1]
    rng = random.Random(77)
    fl.flip_bit(path, last.off + rng.randint(fl.REC_HDR + len(last.key), last.length - 9), rng.randrange(8))
    n = nodes(data_dir)
    rec = recovery_of(n)
    assert rec.torn and f"at offset {last.off} (CRC mismatch)" in rec.line and "truncated" in rec.line, rec
    assert (rec.records, rec.last) == (len(recs) - 1, len(recs) - 1), rec
    assert os.path.getsize(path) == last.off
    got = mget_all(n.port, [k for k, _ in items])
    assert got == {k: (v.encode() if i < len(items) - 1 else None) for i, (k, v) in enumerate(items)}
    with client(n.port) as c:
        c.set(items[-1][0], "rewritten")
    n.kill()
    n = nodes(data_dir)
    assert not recovery_of(n).torn
    with client(n.port) as c:
        assert c.get(items[-1][0]) == b"rewritten"


def _recover_in_process(data_dir):
    """The same C recovery `kvstore serve` and `kvstore recover` run (no repair)."""
    return durability.recover(Store(), str(data_dir), repair=False)


def _write_log(data_dir, first_lsn, data):
    d = fl.log_dir(data_dir)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, fl.seg_name(first_lsn)), "wb") as f:
        f.write(data)


def _summarize_flips(bad):
    """[(byte, bit, outcome)] -> one line per (byte, outcome): 'byte 12 bits 0,1,...: outcome'."""
    groups = {}
    for byte, bit, outcome in bad:
        groups.setdefault((byte, outcome), []).append(bit)
    return "\n".join(f"  record byte {byte:3d}, bits {','.join(map(str, bits))}: {outcome}"
                     for (byte, outcome), bits in sorted(groups.items()))


def _thirty_record_segment():
    """30 SET records (LSN 1..30) and the bytes of a segment holding them."""
    recs = [fl.encode_record(fl.OP_SET, b"key%02d" % i, b"value%02d" % i, i + 1) for i in range(30)]
    return recs, fl.MAGIC + struct.pack("<Q", 1) + b"".join(recs)


@pytest.mark.timeout(60)
def test_every_bit_flip_in_a_middle_record_is_refused(tmp_path):
    """Exhaustive: each of the 8 bits of each byte of record 10 of 30 (valid records
    after it). Every one must be refused as corruption (none may be taken for a torn
    tail, which would truncate the 19 acknowledged records after it)."""
    recs, body = _thirty_record_segment()
    off = fl.SEG_HDR + sum(len(r) for r in recs[:10])
    bad = []
    for byte in range(len(recs[10])):
        for bit in range(8):
            d = bytearray(body)
            d[off + byte] ^= 1 << bit
            _write_log(tmp_path, 1, d)
            try:
                r = _recover_in_process(tmp_path)
                bad.append((byte, bit, f"accepted: {r.records} records; {r.problem[r.problem.find('('):]}"))
            except CorruptLogError as e:
                if f"at offset {off}" not in str(e):
                    bad.append((byte, bit, str(e)[:120]))
    assert not bad, (f"{len(bad)} of {8 * len(recs[10])} single-bit flips in record 10 of 30 were not "
                     f"refused:\n" + _summarize_flips(bad))


@pytest.mark.timeout(60)
def test_every_bit_flip_in_the_last_record_is_a_torn_tail(tmp_path):
    """Exhaustive: each bit of each byte of the last of 30 records. Nothing valid
    follows it, so each must be reported as a torn tail with the 29 records before it."""
    recs, body = _thirty_record_segment()
    off = len(body) - len(recs[-1])
    bad = []
    for byte in range(len(recs[-1])):
        for bit in range(8):
            d = bytearray(body)
            d[off + byte] ^= 1 << bit
            _write_log(tmp_path, 1, d)
            try:
                r = _recover_in_process(tmp_path)
                if r.records != 29 or "torn tail" not in r.problem or f"at offset {off}" not in r.problem:
                    bad.append((byte, bit, f"{r.records} records; {r.problem[-80:]}"))
            except CorruptLogError as e:
                m = re.search(r"\(([^)]*)\) after LSN", str(e))
                bad.append((byte, bit, "refused: " + (m.group(1) if m else str(e)[:100])))
    assert not bad, (f"{len(bad)} of {8 * len(recs[-1])} single-bit flips in the last of 30 records were "
                     f"not treated as a torn tail (the record's header is bytes 0-31):\n" + _summarize_flips(bad))


@pytest.mark.timeout(60)
def test_damage_in_an_earlier_segment_is_refused_even_at_its_end(data_dir, nodes):
    """The last record of a segment that is followed by another segment with records is
    not a tail: a flipped bit there, or a cut, is corruption."""
    n = nodes(data_dir)
    write_keys(n.port, [(f"s1:{i}", f"one-{i}") for i in range(10)])
    n.kill()
    n = nodes(data_dir)
    write_keys(n.port, [(f"s2:{i}", f"two-{i}") for i in range(10)])
    n.kill()
    seg1, seg2 = fl.segments(data_dir)
    _, recs1 = fl.parse_segment(seg1)
    last = recs1[-1]
    pristine = open(seg1, "rb").read()

    fl.flip_bit(seg1, last.off + fl.REC_HDR + len(last.key) + 2, 4)   # a value bit
    _assert_refused(data_dir, seg1, last.off, last.lsn - 1, why="CRC mismatch")

    with open(seg1, "wb") as f:                                       # cut short instead
        f.write(pristine[:last.off + 20])
    _assert_refused(data_dir, seg1, last.off, last.lsn - 1, why="record header cut short")

    with open(seg1, "wb") as f:                                       # repaired by hand: fine again
        f.write(pristine)
    n = nodes(data_dir)
    rec = recovery_of(n)
    assert (rec.records, rec.last, rec.torn) == (20, 20, False), rec


# ================================================================ 4. foreign files, bad headers

def _log_with_data(data_dir, nodes):
    n = nodes(data_dir)
    write_keys(n.port, [(f"k{i}", f"v{i}") for i in range(5)])
    n.kill()
    (seg,) = fl.segments(data_dir)
    return seg


def _assert_bad_header(data_dir, path):
    msg = f"{path}: bad segment header: not a kvstore log segment or corrupt"
    rc, out, err = fl.run_serve(data_dir)
    assert rc is not None, f"kvstore serve STARTED:\nstdout: {out}\nstderr: {err}"
    assert rc != 0 and "listening on" not in out and msg in err, (rc, out, err)
    rc, out, err = fl.run_recover(data_dir, "--check-only")
    assert rc == 1 and msg in err, (rc, out, err)


@pytest.mark.parametrize("name_lsn", [0, 3, 6, 0x100])
@pytest.mark.timeout(60)
def test_garbage_file_named_like_a_segment_is_refused(data_dir, nodes, name_lsn):
    """Random bytes (and a text file) in a file named wal-<16 hex>.log, before, among
    and after a real segment's LSNs."""
    _log_with_data(data_dir, nodes)
    rng = random.Random(name_lsn)
    foreign = os.path.join(fl.log_dir(data_dir), fl.seg_name(name_lsn))
    with open(foreign, "wb") as f:
        f.write(bytes(rng.randrange(256) for _ in range(rng.randint(16, 600))))
    _assert_bad_header(data_dir, foreign)
    with open(foreign, "w") as f:
        f.write("these are my notes, not a log segment\n" * 3)
    _assert_bad_header(data_dir, foreign)


@pytest.mark.timeout(60)
def test_garbage_segment_alone_is_refused(data_dir):
    os.makedirs(fl.log_dir(data_dir))
    path = os.path.join(fl.log_dir(data_dir), fl.seg_name(1))
    with open(path, "wb") as f:
        f.write(os.urandom(4096))
    _assert_bad_header(data_dir, path)


@pytest.mark.parametrize("damage", ["magic", "version", "header-lsn", "copied-under-another-name"])
@pytest.mark.timeout(60)
def test_segment_with_a_bad_header_is_refused(data_dir, nodes, damage):
    seg = _log_with_data(data_dir, nodes)
    path = seg
    if damage == "magic":
        fl.flip_bit(seg, 2, 5)
    elif damage == "version":
        with open(seg, "r+b") as f:
            f.seek(6)
            f.write(b"99")  # a version this build does not know
    elif damage == "header-lsn":
        fl.flip_bit(seg, 8, 1)
    else:  # a copy of a real segment, under the name of a later one
        path = os.path.join(fl.log_dir(data_dir), fl.seg_name(50))
        shutil.copyfile(seg, path)
    _assert_bad_header(data_dir, path)


@pytest.mark.timeout(60)
def test_files_not_named_like_segments_are_ignored(data_dir, nodes):
    _log_with_data(data_dir, nodes)
    d = fl.log_dir(data_dir)
    for name in ["notes.txt", "wal-1.log", fl.seg_name(9) + ".bak", "wal-00000000000000zz.log", ".wal.swp"]:
        with open(os.path.join(d, name), "wb") as f:
            f.write(os.urandom(100))
    os.mkdir(os.path.join(d, "old"))
    n = nodes(data_dir)
    rec = recovery_of(n)
    assert (rec.records, rec.segments, rec.torn) == (5, 1, False), rec
    with client(n.port) as c:
        assert c.get("k4") == b"v4"


# ================================================================ 5. group commit

@pytest.mark.timeout(90)
def test_group_commit_many_records_per_sync(data_dir, nodes):
    n = nodes(data_dir)
    c = subprocess.run([sys.executable, "-m", "kvstore.cli", "bench", "-p", str(n.port), "-n", "50000",
                        "-P", "16", "-c", "20", "-r", "20000", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert c.returncode == 0, c.stderr
    r = json.loads(c.stdout)
    assert r["requests"] == r["sets"] == 50000 and r["errors"] == 0, r
    info = persistence(n.port)
    assert info["log_records"] == 50000 and info["log_durable_lsn"] == info["log_appended_lsn"] == 50000
    assert info["log_syncs"] == info["log_groups"] > 0
    assert info["log_records"] / info["log_syncs"] > 10, info
    assert info["log_max_group_records"] > 16, info   # more than one connection's pipeline
    with client(n.port) as cl:
        dbsize = cl.dbsize()
    n.kill()
    n = nodes(data_dir)
    rec = recovery_of(n)
    assert (rec.records, rec.last, rec.torn) == (50000, 50000, False), rec
    with client(n.port) as cl:
        assert cl.dbsize() == dbsize


# ================================================================ 6. durability none

@pytest.mark.timeout(60)
def test_durability_none_writes_no_log(data_dir):
    n = Node(port=0, data_dir=str(data_dir), threads=2, durability="none")
    n.start()
    try:
        assert fl.parse_recovery(n.log()) is None
        with client(n.port) as c:
            for i in range(200):
                c.set(f"k{i}", "v" * 100)
            c.incr("n")
            c.flushall()
            c.set("last", "x")
            info = c.info("persistence")
        assert info["durability"] == "none" and not any(k.startswith("log_") for k in info), info
        d = fl.log_dir(data_dir)
        assert not os.path.exists(d) or os.listdir(d) == []
    finally:
        n.kill()
    d = fl.log_dir(data_dir)
    assert not os.path.exists(d) or os.listdir(d) == []
    n = Node(port=0, data_dir=str(data_dir), threads=2, durability="none")
    n.start()
    try:
        with client(n.port) as c:
            assert c.dbsize() == 0 and c.get("last") is None
    finally:
        n.stop()


# ================================================================ review regressions

def _write_segment(path, first, records):
    """A hand-made segment: header (magic + first LSN) and (op, key, value, lsn) records."""
    with open(path, "wb") as f:
        f.write(fl.MAGIC + first.to_bytes(8, "little"))
        for op, key, value, lsn in records:
            f.write(fl.encode_record(op, key, value, lsn))


@pytest.mark.timeout(60)
def test_a_missing_middle_segment_is_a_gap_not_skipped(data_dir):
    """Three segments, LSN 1-5, 6-10, 11-12; the middle one lost: recovery must refuse,
    not apply 1-5 then 11-12 as if nothing were missing."""
    d = fl.log_dir(data_dir)
    os.makedirs(d)
    for first, last in ((1, 5), (6, 10), (11, 12)):
        _write_segment(os.path.join(d, fl.seg_name(first)), first,
                       [(1, b"k%d" % i, b"v%d" % i, i) for i in range(first, last + 1)])
    rc, out, err = fl.run_recover(data_dir, "--check-only")
    assert rc == 0 and "recovered 12 records" in out, (rc, out, err)
    os.remove(os.path.join(d, fl.seg_name(6)))
    rc, out, err = fl.run_recover(data_dir, "--check-only")
    assert rc == 1 and "LSN 11 where 6 was expected" in err, (rc, out, err)
    rc, out, err = fl.run_serve(data_dir)
    assert rc not in (None, 0) and "listening on" not in out and "missing" in err, (rc, out, err)


# ================================================================ 7. segments prepared over zeros

PIECE = 1 << 20  # WAL_PIECE: the log thread syncs at most this much of a prepared segment at once


def _write_zeroed_segment(path, first, records, size=None, damage=None):
    """A hand-made prepared segment (KVSWAL03): header, records, then zeros up to size
    bytes; damage(data, offsets) may change the record bytes first. Returns the records'
    offsets."""
    data, offs = bytearray(fl.MAGIC_ZEROED + first.to_bytes(8, "little")), []
    for op, key, value, lsn in records:
        offs.append(len(data))
        data += fl.encode_record(op, key, value, lsn)
    if damage:
        damage(data, offs)
    data += bytes(max(0, (size or len(data) + 4096) - len(data)))
    with open(path, "wb") as f:
        f.write(data)
    return offs


def _sets(first, last, value=b"v" * 40):
    return [(fl.OP_SET, b"k%d" % i, value + b"%d" % i, i) for i in range(first, last + 1)]


@pytest.mark.timeout(120)
def test_prepared_segments_lose_nothing_acknowledged_under_kill9(data_dir, nodes):
    """Small segments (64 KiB: the next is prepared once the log holds 32 KiB), four writers
    recording what was acknowledged, kill -9 mid-load: every acknowledged write is there
    after the restart, the log's later segments were prepared over zeros, and the zeros
    after the last record end the log without a torn-tail report."""
    n = nodes(data_dir, log_segment_size="64kb")
    acked, stop = {}, time.monotonic() + 1.5
    errors = []

    def writer(w):
        try:
            with client(n.port) as c:
                i = 0
                while time.monotonic() < stop:
                    k, v = f"w{w}:{i % 500}", f"{w}-{i}-" + "x" * 150
                    assert c.set(k, v) is True
                    acked[k] = v
                    i += 1
        except Exception as e:  # noqa: BLE001 - the kill ends the last request
            errors.append(e)

    import threading
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    while time.monotonic() < stop - 0.5:
        time.sleep(0.05)
    info = persistence(n.port)
    assert info["log_segments_prepared"] >= 2 and info["log_segments"] > info["log_segments_prepared"], info
    n.kill()
    snapshot = dict(acked)  # what was acknowledged before the kill
    for t in threads:
        t.join()
    segs = fl.segments(data_dir)
    magics = [open(p, "rb").read(8) for p in segs]
    assert magics[0] == fl.MAGIC and fl.MAGIC_ZEROED in magics[1:], magics
    last_size = os.path.getsize(segs[-1])
    n = nodes(data_dir, log_segment_size="64kb")
    rec = recovery_of(n)
    assert not rec.torn and rec.records >= len(snapshot), rec
    got = mget_all(n.port, list(snapshot))
    lost = [k for k, v in snapshot.items() if got[k] is None]
    assert not lost, f"{len(lost)} acknowledged keys lost, e.g. {lost[:5]}"
    # a key's value is the acknowledged one or a later write of the same key
    for k, v in snapshot.items():
        w, i = k[1:].split(":")
        assert got[k].decode().split("-")[0] == w and int(got[k].decode().split("-")[1]) >= int(v.split("-")[1])
    _, recs = fl.parse_segment(segs[-1])
    end = recs[-1].off + recs[-1].length if recs else fl.SEG_HDR
    assert os.path.getsize(segs[-1]) == end <= last_size, "the zeros after the last record were not given back"
    n.kill()


@pytest.mark.timeout(60)
def test_zeros_end_prepared_segments_cleanly(data_dir, nodes):
    """Three prepared segments, each with zeros after its records (a segment left early
    when the next was ready, or the last one): recovery reads through them, reports no
    problem, and gives the last one's zeros back."""
    d = fl.log_dir(data_dir)
    os.makedirs(d)
    for first, last, size in ((1, 40, 16384), (41, 90, 65536), (91, 100, 65536)):
        _write_zeroed_segment(os.path.join(d, fl.seg_name(first)), first, _sets(first, last), size)
    rc, out, err = fl.run_recover(data_dir, "--check-only")
    assert rc == 0 and "recovered 100 records" in out and "torn" not in out + err, (rc, out, err)
    n = nodes(data_dir)
    rec = recovery_of(n)
    assert not rec.torn and (rec.records, rec.last, rec.segments) == (100, 100, 3), rec
    with client(n.port) as c:
        assert c.get("k1") == b"v" * 40 + b"1" and c.get("k100") == b"v" * 40 + b"100"
    _, recs = fl.parse_segment(os.path.join(d, fl.seg_name(91)))
    assert os.path.getsize(os.path.join(d, fl.seg_name(91))) == recs[-1].off + recs[-1].length
    assert os.path.getsize(os.path.join(d, fl.seg_name(41))) == 65536  # not the last: left as it is
    n.kill()


@pytest.mark.parametrize("hole", ["page-of-zeros", "flipped-bit", "header-zeroed"])
@pytest.mark.timeout(60)
def test_damage_within_a_piece_of_the_end_of_a_prepared_segment_is_a_torn_tail(data_dir, nodes, hole):
    """A power cut while the log thread writes a piece over zeros may keep later pages of it
    and lose an earlier one: records after the damage, zeros after them. Within one piece
    of the end that is a torn tail (none of the piece was acknowledged): truncated, the
    records before it kept."""
    d = fl.log_dir(data_dir)
    os.makedirs(d)
    path = os.path.join(d, fl.seg_name(1))
    bad = 150

    def damage(data, offs):
        o = offs[bad - 1]
        if hole == "page-of-zeros":
            data[o + 20:o + 60] = bytes(40)
        elif hole == "flipped-bit":
            data[o + 40] ^= 0x10
        else:
            data[o:o + fl.REC_HDR] = bytes(fl.REC_HDR)

    offs = _write_zeroed_segment(path, 1, _sets(1, 200), 262144, damage)
    n = nodes(data_dir)
    rec = recovery_of(n)
    assert rec.torn and f"torn tail in {path} at offset {offs[bad - 1]} " in rec.line, rec
    assert (rec.records, rec.last) == (bad - 1, bad - 1) and "truncated" in rec.rest, rec
    assert os.path.getsize(path) == offs[bad - 1]
    with client(n.port) as c:
        assert c.get(f"k{bad - 1}") is not None and c.get(f"k{bad}") is None and c.get("k200") is None
    n.kill()


@pytest.mark.timeout(60)
def test_damage_more_than_a_piece_before_the_end_of_a_prepared_segment_is_refused(data_dir):
    """Damage followed by more than a piece (1 MiB) of records cannot be a torn piece: the
    records after it were synced after it was, so it was acknowledged. Refused."""
    d = fl.log_dir(data_dir)
    os.makedirs(d)
    path = os.path.join(d, fl.seg_name(1))
    big = b"b" * 4000
    recs = [(fl.OP_SET, b"k%d" % i, big, i) for i in range(1, 321)]  # 1.25 MiB after record 10

    def damage(data, offs):
        data[offs[9] + 100] ^= 0x01

    offs = _write_zeroed_segment(path, 1, recs, 4 << 20, damage)
    assert offs[-1] - offs[9] > PIECE
    _assert_refused(data_dir, path, offs[9], 9, why="CRC mismatch")


@pytest.mark.timeout(60)
def test_damage_in_an_earlier_prepared_segment_is_refused(data_dir):
    """Only the last segment can hold a torn piece: the log syncs a segment's records
    before it starts the next."""
    d = fl.log_dir(data_dir)
    os.makedirs(d)
    path = os.path.join(d, fl.seg_name(1))

    def damage(data, offs):
        data[offs[35] + 50] ^= 0x04

    offs = _write_zeroed_segment(path, 1, _sets(1, 40), 65536, damage)
    _write_zeroed_segment(os.path.join(d, fl.seg_name(41)), 41, _sets(41, 60), 65536)
    _assert_refused(data_dir, path, offs[35], 35, why="CRC mismatch")
