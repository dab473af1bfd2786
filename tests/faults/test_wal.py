"""Fault injection for `--durability disk`: real server processes killed with SIGKILL
under load, logs cut and bit-flipped on disk, a slow disk (KVSTORE_FAULT_SYNC_DELAY_US),
and real clients (raw RESP sockets and redis-py). Nothing is mocked.

What is checked (see ext/wal.h for the log format):
  1. kill -9 under a write load loses no acknowledged write;
  2. the recovery line and LSNs across restarts;
  3. a torn tail is truncated, later writes survive;
  4. a flipped bit with valid data after it stops the server (and `kvstore recover`);
     a flipped bit in the very last record is a torn tail;
  5. foreign files / bad segment headers are refused;
  6. replies are held until durable (writes and the reads that see them), in order;
  7. group commit (many records per fdatasync);
  8. --durability none writes no log.
"""
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from helpers import faultlib as fl
from helpers.conn import Raw, UdpConn, client
from helpers.resp import Incomplete, resp_cmd, resp_parse, resp_reply_end
from kvstore import Node, Store, durability
from kvstore.errors import CorruptLogError, ServerError

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- helpers (fixtures: faults/conftest.py)

def recovery_of(node):
    rec = fl.parse_recovery(node.log())
    assert rec is not None, f"no recovery line in the server's stderr:\n{node.log()}"
    return rec


def persistence(port):
    with client(port) as c:
        return c.info("persistence")


def mget_all(port, keys, chunk=500):
    out = {}
    with client(port) as c:
        for i in range(0, len(keys), chunk):
            part = keys[i:i + chunk]
            for k, v in zip(part, c.mget(part)):
                out[k] = v
    return out


def write_keys(port, items):
    """SET each (key, value), one request each (one log record each), in order."""
    with client(port) as c:
        for k, v in items:
            assert c.set(k, v) is True


# ================================================================ 1. kill -9 under load

KEYS_PER_WRITER = 600


class TcpConn:
    """A pipelined RESP connection: exchange sends a batch, yields each one-line reply."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def exchange(self, requests):
        self.sock.sendall(b"".join(requests))
        for _ in requests:
            while b"\r\n" not in self.buf:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise EOFError("server closed the connection")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\r\n", 1)
            yield line + b"\r\n"

    def close(self):
        self.sock.close()


class Writer(threading.Thread):
    """One connection writing only its own keys, `depth` requests per round trip.

    state: the acknowledged state of every key it owns (bytes or None).
    pending: [(request number, key, value after it)] for requests sent whose reply
    has not been read, in request order (an MSET contributes one entry per key).
    After a crash, for some j the recovered state must equal state + pending[:j]:
    requests on one connection get ascending LSNs, and recovery replays a prefix
    of the log."""

    def __init__(self, wid, port, state, depth, seed, seq0, max_ops, deadline, udp=False):
        super().__init__(daemon=True, name=f"writer-{wid}")
        self.wid, self.port, self.depth, self.udp = wid, port, depth, udp
        self.state = state
        self.rng = random.Random(seed)
        self.seq = seq0
        self.max_ops, self.deadline = max_ops, deadline
        self.pending = []
        self.acked = 0
        self.wrong = []          # replies that do not match the model: server bugs
        self.ended_by = None
        self.keys = list(state)
        self.skeys = [k for k in self.keys if b":s:" in k]

    def _value(self, key):
        self.seq += 1
        return b"%s@%d#" % (key, self.seq) + b"x" * (self.seq % 61)

    def _make(self, proj):
        """One request: (bytes, [(key, new value)], expected reply)."""
        key = self.rng.choice(self.keys)
        cur = proj.get(key, self.state[key])
        r = self.rng.random()
        if b":s:" in key:
            if r < 0.1:
                return resp_cmd("DEL", key), [(key, None)], b":%d\r\n" % (cur is not None)
            if r < 0.2:
                ks = self.rng.sample(self.skeys, 3)
                pairs = [(k, self._value(k)) for k in ks]
                args = [x for kv in pairs for x in kv]
                return resp_cmd("MSET", *args), pairs, b"+OK\r\n"
            v = self._value(key)
            return resp_cmd("SET", key, v), [(key, v)], b"+OK\r\n"
        if b":c:" in key:
            if r < 0.05:
                return resp_cmd("DEL", key), [(key, None)], b":%d\r\n" % (cur is not None)
            by = 1 if r < 0.8 else self.rng.randint(-50, 1000)
            new = (int(cur) if cur is not None else 0) + by
            cmd = resp_cmd("INCR", key) if by == 1 else resp_cmd("INCRBY", key, by)
            return cmd, [(key, b"%d" % new)], b":%d\r\n" % new
        # append key
        if r < 0.08:
            return resp_cmd("DEL", key), [(key, None)], b":%d\r\n" % (cur is not None)
        self.seq += 1
        piece = b"|%d" % self.seq
        new = (cur or b"") + piece
        return resp_cmd("APPEND", key, piece), [(key, new)], b":%d\r\n" % len(new)

    def run(self):
        try:
            conn = UdpConn(self.port, timeout=3.0) if self.udp else TcpConn(self.port)
        except OSError as e:
            self.ended_by = f"connect: {e}"
            return
        reqno = 0
        ops = 0
        try:
            while ops < self.max_ops and time.monotonic() < self.deadline:
                proj, batch = {}, []
                for _ in range(self.depth):
                    data, changes, expect = self._make(proj)
                    reqno += 1
                    for k, v in changes:
                        proj[k] = v
                        self.pending.append((reqno, k, v))
                    batch.append((reqno, data, changes, expect))
                ops += len(batch)
                for (no, _, changes, expect), reply in zip(batch, conn.exchange([b[1] for b in batch])):
                    if reply != expect:
                        self.wrong.append((no, changes, expect, reply))
                    # acknowledged: its effect is now part of the acked state
                    for k, v in changes:
                        self.state[k] = v
                    self.pending = [p for p in self.pending if p[0] != no]
                    self.acked += 1
            self.ended_by = "limit"
        except (OSError, EOFError) as e:
            self.ended_by = f"{type(e).__name__}: {e}"
        finally:
            conn.close()

    def check(self, observed):
        """Problems (empty if fine) comparing the recovered state with the model; on
        success self.state becomes the recovered state."""
        pend_keys = {k for _, k, _ in self.pending}
        problems = []
        for k in self.keys:
            if k not in pend_keys and observed[k] != self.state[k]:
                problems.append(f"{k!r}: acknowledged {self.state[k]!r:.80}, recovered {observed[k]!r:.80}")
        if problems:
            return problems
        cand = {k: self.state[k] for k in pend_keys}
        if all(observed[k] == cand[k] for k in pend_keys):
            ok_j = 0
        else:
            ok_j = None
            for j, (_, k, v) in enumerate(self.pending, 1):
                cand[k] = v
                if all(observed[k2] == cand[k2] for k2 in pend_keys):
                    ok_j = j
                    break
        if ok_j is None:
            return [f"no prefix of the {len(self.pending)} unacknowledged changes explains the recovered "
                    f"state: acked {[(k, self.state[k]) for k in sorted(pend_keys)]!r:.600}, pending "
                    f"{self.pending!r:.600}, recovered {[(k, observed[k]) for k in sorted(pend_keys)]!r:.600}"]
        for k in pend_keys:
            self.state[k] = observed[k]
        self.pending = []
        return []


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("arch", ["poller", "threadpool", "udp"])
def test_kill9_under_write_load_loses_no_acknowledged_write(data_dir, nodes, monkeypatch, arch):
    """4 connections (pipelines of 1, 1, 8 and 32; with arch udp, UDP sockets with as many
    datagrams in flight) write SET/MSET/DEL/INCR/INCRBY/APPEND
    on 2,400 keys (each key has one writer); SIGKILL at a seeded random point; restart
    on the same directory; every acknowledged write must be there with its last
    acknowledged value (or, for keys with requests in flight, a prefix of those).
    8 kills in a row on one directory. The node runs as deployed: with its BOSC data
    file, and with memory bounded far below the data (512 KiB for ~1.5 MB), so keys
    are flushed, evicted, loaded back on reads and INCR/APPEND, and writes wait for
    the flusher; each recovery reads the data file and replays the log after it."""
    depths = [1, 1, 8, 32]
    states = [{b"w%d:%s:%d" % (w, b"sca"[i % 3:i % 3 + 1], i): None for i in range(KEYS_PER_WRITER)}
              for w in range(len(depths))]
    all_keys = [k for st in states for k in st]
    seed = int(os.environ.get("KVSTORE_TEST_SEED", "20240611"))  # set it to explore other kill points
    rng = random.Random(seed)
    last_lsn = 0
    runs = []
    iterations = 8
    t_start = time.monotonic()

    def set_disk_speed(it):
        # every other run a slower disk: bigger groups, more in flight at the kill
        if it % 2:
            monkeypatch.setenv("KVSTORE_FAULT_SYNC_DELAY_US", str(rng.choice([500, 2000, 5000])))
        else:
            monkeypatch.delenv("KVSTORE_FAULT_SYNC_DELAY_US", raising=False)

    spill = dict(data_file=True, max_memory="512kb", flush_interval_ms=100, arch=arch)
    if arch == "udp":
        spill["udp_port"] = 0
    set_disk_speed(0)
    node = nodes(data_dir, **spill)
    for it in range(iterations):
        deadline = time.monotonic() + 8.0
        udp = arch == "udp"
        writers = [Writer(w, node.udp_port if udp else node.port, states[w], d, rng.random(),
                          (it + 1) * 10_000_000, 40_000, deadline, udp=udp)
                   for w, d in enumerate(depths)]
        for w in writers:
            w.start()
        # the kill point: after a random number of acknowledged writes, or a random time
        target = rng.randint(2000, 15000) if it % 3 != 2 else 10 ** 9
        kill_after = 6.0 if it % 3 != 2 else rng.uniform(0.3, 1.5)
        t0 = time.monotonic()
        while sum(w.acked for w in writers) < target and time.monotonic() - t0 < kill_after \
                and any(w.is_alive() for w in writers):
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.01))
        node.kill()
        for w in writers:
            w.join(15)
            assert not w.is_alive(), f"{w.name} still running after the kill"
        acked = sum(w.acked for w in writers)
        wrong = [x for w in writers for x in w.wrong]
        assert not wrong, f"run {it}: replies that do not match the model: {wrong[:5]}"
        assert acked >= 200, f"run {it}: only {acked} writes acknowledged before the kill"

        # Restart on the same directory (the next run's load goes to this server).
        nsegs = len(fl.segments(data_dir))
        set_disk_speed(it + 1)
        node = nodes(data_dir, **spill)
        rec = recovery_of(node)
        flushed = fl.parse_datafile(node.log())
        assert flushed is not None, node.log()
        # the data file holds up to `flushed`, the log replays from just after it
        assert rec.first in (None, flushed + 1) and rec.last >= last_lsn and rec.segments == nsegs, (rec, flushed)
        assert "log corrupt" not in node.log()
        info = persistence(node.port)
        assert info["log_durable_lsn"] == rec.last, (info, rec)
        last_lsn = rec.last
        in_flight = sum(len(w.pending) for w in writers)
        observed = mget_all(node.port, all_keys)
        problems = [p for w in writers for p in w.check(observed)]
        assert not problems, (f"run {it} (kill after {acked} acknowledged writes, {rec.line}):\n"
                              + "\n".join(problems[:20]))
        runs.append((acked, in_flight, rec.line))
    node.stop()
    # The final directory also reads back cleanly offline.
    rc, out, err = fl.run_recover(data_dir, "--check-only")
    assert rc == 0, err
    rec = fl.parse_recovery(out)
    assert rec.last == last_lsn
    print("runs (acknowledged writes, unacknowledged changes at the kill, recovery):", *runs, sep="\n  ")
    assert time.monotonic() - t_start < 110


# ================================================================ 2. recovery line and LSNs

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


# ================================================================ 3. torn tail

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


# ================================================================ 4. flipped bits

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
    assert "move the damaged segment away" in err, err  # the advice
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


# ================================================================ 5. foreign files, bad headers

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


# ================================================================ 6. held replies

def collect(conns, timeout=15.0):
    """conns: {name: (Raw, replies wanted)} -> {name: [(arrival time, reply bytes)]}.
    Reads all sockets from one thread, timestamping each reply as it completes."""
    out = {k: [] for k in conns}
    deadline = time.monotonic() + timeout
    while True:
        for k, (r, want) in conns.items():
            while len(out[k]) < want:
                try:
                    end = resp_reply_end(r.buf)
                except Incomplete:
                    break
                out[k].append((time.monotonic(), r.buf[:end]))
                r.buf = r.buf[end:]
        waiting = {r.sock: r for k, (r, want) in conns.items() if len(out[k]) < want}
        if not waiting:
            return out
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"replies so far: {out}")
        ready, _, _ = select.select(list(waiting), [], [], left)
        for s in ready:
            chunk = s.recv(65536)
            if not chunk:
                raise EOFError(f"server closed; replies so far: {out}")
            waiting[s].buf += chunk


def _slow_node(data_dir, nodes, monkeypatch, delay_us):
    monkeypatch.setenv("KVSTORE_FAULT_SYNC_DELAY_US", str(delay_us))
    n = nodes(data_dir)
    monkeypatch.delenv("KVSTORE_FAULT_SYNC_DELAY_US")
    return n


DELAY = 0.3


@pytest.mark.timeout(60)
def test_write_reply_waits_for_the_sync(data_dir, nodes, monkeypatch):
    n = _slow_node(data_dir, nodes, monkeypatch, int(DELAY * 1e6))
    with Raw(n.port, timeout=10) as a:
        t0 = time.monotonic()
        assert a.call("PING") == b"PONG"          # no write: not held
        for cmd in (("SET", "k", "v"), ("INCR", "n"), ("APPEND", "k", "w"), ("DEL", "k"),
                    ("MSET", "a", "1", "b", "2"), ("FLUSHALL",)):
            t0 = time.monotonic()
            a.send(resp_cmd(*cmd))
            assert a.read_for(DELAY * 0.6)[0] == b"", f"{cmd}: reply before the sync"
            reply = a.reply(timeout=10)
            dt = time.monotonic() - t0
            assert not reply.startswith(b"-"), (cmd, reply)
            assert dt >= DELAY - 0.005, f"{cmd} acknowledged after {dt:.3f} s, the sync takes {DELAY} s"
    info = persistence(n.port)
    assert info["log_durable_lsn"] == info["log_appended_lsn"]


@pytest.mark.parametrize("read", [("GET", "k"), ("MGET", "k", "other"), ("EXISTS", "k"), ("STRLEN", "k")],
                         ids=lambda r: r[0])
@pytest.mark.timeout(60)
def test_read_of_a_pending_write_waits_for_its_sync(data_dir, nodes, monkeypatch, read):
    n = _slow_node(data_dir, nodes, monkeypatch, int(DELAY * 1e6))
    with client(n.port) as c:
        c.set("k", "old")
        c.set("other", "o")
    with Raw(n.port, timeout=10) as a, Raw(n.port, timeout=10) as b:
        t_set = time.monotonic()
        a.send(resp_cmd("SET", "k", "new-value"))
        time.sleep(0.05)
        b.send(resp_cmd(*read))
        assert b.read_for(0.15)[0] == b"", "the read was answered before the write it sees was durable"
        got = collect({"a": (a, 1), "b": (b, 1)})
    (ta, ra), = got["a"]
    (tb, rb), = got["b"]
    assert ra == b"+OK\r\n"
    expect = {"GET": b"$9\r\nnew-value\r\n", "MGET": b"*2\r\n$9\r\nnew-value\r\n$1\r\no\r\n",
              "EXISTS": b":1\r\n", "STRLEN": b":9\r\n"}[read[0]]
    assert rb == expect
    assert ta - t_set >= DELAY - 0.005
    assert tb - t_set >= DELAY - 0.005, f"read answered {tb - t_set:.3f} s after the SET (sync: {DELAY} s)"
    assert tb >= ta - 0.05, f"read answered {ta - tb:.3f} s before the SET's acknowledgement"


CRASH_WRITES = {  # write -> (key read by the other client, its value before, its value after)
    "SET": (("SET", "k", "new"), "k", b"old", b"new"),
    "INCR": (("INCR", "n"), "n", b"41", b"42"),
    "APPEND": (("APPEND", "k", "+x"), "k", b"old", b"old+x"),
    "MSET": (("MSET", "k2", "z", "k", "m"), "k", b"old", b"m"),
    "DEL": (("DEL", "k"), "k", b"old", None),
    "FLUSHALL": (("FLUSHALL",), "k", b"old", None),
}


@pytest.mark.parametrize("write", list(CRASH_WRITES))
@pytest.mark.timeout(60)
def test_no_read_reveals_a_write_that_a_crash_undoes(data_dir, nodes, monkeypatch, write):
    """With a 1 s sync: connection X's SET occupies the log thread; connection A's write
    (DEL, FLUSHALL, SET, ...) then waits in the next group; connection B reads the key;
    SIGKILL about 0.5 s in, before A's record is written. Whatever B was told before
    the kill must still be true after the restart: a reply that reveals A's write
    (e.g. nil after A's DEL) may only leave once that write is durable."""
    cmd, key, before, after = CRASH_WRITES[write]
    n = _slow_node(data_dir, nodes, monkeypatch, 1_000_000)
    with client(n.port) as c:
        c.mset({"k": "old", "n": "41"})
    with Raw(n.port, timeout=10) as x, Raw(n.port, timeout=10) as a, Raw(n.port, timeout=10) as b:
        t0 = time.monotonic()
        x.send(resp_cmd("SET", "filler", "f"))
        time.sleep(0.1)
        a.send(resp_cmd(*cmd))
        time.sleep(0.05)
        b.send(resp_cmd("GET", key))
        seen, _ = b.read_for(0.3)
        a_reply, _ = a.read_for(0.01)
        elapsed = time.monotonic() - t0
        n.kill()
    assert a_reply == b"", f"{write} acknowledged before its sync: {a_reply!r}"
    n = nodes(data_dir)
    with client(n.port) as c:
        now = c.get(key)
    assert now in (before, after), now
    if seen:
        told = resp_parse(seen)[0]
        assert told == now, (
            f"before the crash ({elapsed:.2f} s after X's SET) a reader was told {key}={told!r}, "
            f"revealing the unacknowledged {' '.join(cmd)}; after the restart {key}={now!r}")


@pytest.mark.timeout(60)
def test_replies_on_one_connection_leave_in_order(data_dir, nodes, monkeypatch):
    n = _slow_node(data_dir, nodes, monkeypatch, int(DELAY * 1e6))
    with client(n.port) as c:
        c.set("old", "durable")
    with Raw(n.port, timeout=10) as a:
        t0 = time.monotonic()
        a.send(resp_cmd("SET", "k", "v"))
        a.send(resp_cmd("PING"))                  # right after, separately
        a.send(resp_cmd("GET", "old") + resp_cmd("ECHO", "e"))
        assert a.read_for(0.2)[0] == b"", "a reply overtook the pending SET's +OK"
        got = collect({"a": (a, 4)})["a"]
    assert [r for _, r in got] == [b"+OK\r\n", b"+PONG\r\n", b"$7\r\ndurable\r\n", b"$1\r\ne\r\n"]
    assert got[0][0] - t0 >= DELAY - 0.005
    assert all(t >= got[0][0] for t, _ in got)


@pytest.mark.timeout(60)
def test_reads_of_durable_keys_are_not_delayed(data_dir, nodes, monkeypatch):
    """With a 2 s sync, a GET of a key written long ago, from a third connection,
    while another connection's SET waits for its sync, is answered at once."""
    delay = 2.0
    n = _slow_node(data_dir, nodes, monkeypatch, int(delay * 1e6))
    with client(n.port) as c:
        c.mset({"old1": "a", "old2": "b"})
    with Raw(n.port, timeout=10) as a, Raw(n.port, timeout=10) as b, Raw(n.port, timeout=10) as c3:
        t_set = time.monotonic()
        a.send(resp_cmd("SET", "k", "v"))
        time.sleep(0.05)  # the SET is applied (on whichever poller) before b's GET arrives
        b.send(resp_cmd("GET", "k"))
        time.sleep(0.05)
        t_read = time.monotonic()
        c3.send(resp_cmd("GET", "old1") + resp_cmd("GET", "missing") + resp_cmd("PING")
                + resp_cmd("MGET", "old1", "old2"))
        got = collect({"c": (c3, 4)})["c"]
        rest = collect({"a": (a, 1), "b": (b, 1)})
    assert [r for _, r in got] == [b"$1\r\na\r\n", b"$-1\r\n", b"+PONG\r\n", b"*2\r\n$1\r\na\r\n$1\r\nb\r\n"]
    assert got[-1][0] - t_read < 1.0, f"reads of durable keys took {got[-1][0] - t_read:.3f} s"
    ta = rest["a"][0][0]
    assert got[-1][0] < ta, "the reads were not answered while the SET was pending"
    assert ta - t_set >= delay - 0.005
    assert rest["b"][0][1] == b"$1\r\nv\r\n" and rest["b"][0][0] - t_set >= delay - 0.005


# ================================================================ 7. group commit

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


# ================================================================ 8. durability none

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


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cmd", [("INCR", "k"), ("APPEND", "k", "x"), ("DBSIZE",), ("EXISTS", "k")])
def test_replies_that_reveal_a_pending_write_wait_for_it(data_dir, nodes, monkeypatch, cmd):
    """An error from INCR on a value not yet durable, APPEND's new length, DBSIZE, EXISTS:
    each reveals the pending SET, so none may arrive before the SET's own +OK."""
    n = _slow_node(data_dir, nodes, monkeypatch, 700_000)
    with Raw(n.port, timeout=10) as a, Raw(n.port, timeout=10) as b:
        a.send(resp_cmd("SET", "k", "not-a-number"))
        time.sleep(0.05)
        b.send(resp_cmd(*cmd))
        got = collect({"a": (a, 1), "b": (b, 1)})
    (ta, ra), (tb, rb) = got["a"][0], got["b"][0]
    assert ra == b"+OK\r\n"
    assert tb >= ta - 0.005, f"{cmd[0]} answered {ta - tb:.3f} s before the write it reveals was durable: {rb!r}"
