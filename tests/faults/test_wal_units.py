"""Units (MULTI/EXEC transactions) and value types in the write-ahead log
(ext/durability/wal.h): a unit's records carry a flag and a COMMIT record closes them;
recovery applies a unit whole at its COMMIT or drops it whole when the log ends inside
it; the peer's receiver acknowledges only whole units. Logs written by hand and by real
servers, cut at every byte of a unit, replayed in process (the same C recovery the
server runs) and by real servers; a real receiver fed a torn stream.

  1. a whole unit is applied; a unit cut at any byte is dropped whole, with repair the
     log continues after the last whole unit;
  2. broken unit rules and field values a record may not carry are corruption (or a
     torn tail at the end), never a silent skip;
  3. a hash's type is in its record and replays as a hash;
  4. EXEC through a served node is one unit, and survives a cut log and a restart;
  5. replication: an EXEC reaches the peer as a unit; SIGKILL during EXECs in remote
     mode (process or machine lost) keeps each all or nothing; a torn stream is never
     acknowledged inside a unit, and the unit it cut is dropped from the peer's copy.
"""
import errno
import os
import shutil
import struct
import time

import pytest

from helpers import faultlib as fl
from helpers.conn import Raw, client
from helpers.pair import read_node_id, two_free_ports
from helpers.replwire import FakeSender, pair_key, write_secret
from helpers.txwriter import TxWriter
from kvstore import Node, Store, durability
from kvstore._native import ffi, lib
from kvstore.errors import CorruptLogError

pytestmark = pytest.mark.timeout(120)

OP_COMMIT = 4
T_HASH = 1
F_UNIT = 1
KVT_TYPE_HASH = 1 << 4  # kvt_set's flag (core/table.h)
KVT_WRONGTYPE = -errno.EPROTOTYPE


# ---------------------------------------------------------------- records and logs by hand

def reseal(r):
    """Recompute a record's header CRC and CRC after its bytes were changed."""
    r[4:8] = struct.pack("<I", fl.crc32c(bytes(r[8:32])))
    r[0:4] = struct.pack("<I", fl.crc32c(bytes(r[4:])))
    return bytes(r)


def record(op, key=b"", value=b"", lsn=1, type_=0, flags=0, count=0, byte19=0, expire_ms=0):
    """A record with the header fields after the op set (offsets 17, 18, 19 and 28)."""
    r = bytearray(fl.encode_record(op, key, value, lsn, expire_ms))
    r[17], r[18], r[19] = type_, flags, byte19
    r[28:32] = struct.pack("<I", count)
    return reseal(r)


def unit_set(key, value, lsn):
    return record(fl.OP_SET, key, value, lsn, flags=F_UNIT)


def commit(lsn, count):
    return record(OP_COMMIT, lsn=lsn, count=count)


def write_log(data_dir, first_lsn, *recs):
    """A log of one segment holding recs; returns (segment path, its bytes)."""
    return write_segment(data_dir, first_lsn, fl.MAGIC + struct.pack("<Q", first_lsn) + b"".join(recs))


def write_segment(data_dir, first_lsn, body):
    """data_dir's log: one segment with exactly these bytes; returns (path, body)."""
    d = fl.log_dir(data_dir)
    os.makedirs(d, exist_ok=True)
    for n in os.listdir(d):
        os.unlink(os.path.join(d, n))
    path = os.path.join(d, fl.seg_name(first_lsn))
    with open(path, "wb") as f:
        f.write(body)
    return path, body


def recover(data_dir, repair=False, after_lsn=0):
    """(Store, Recovery): the log of data_dir replayed in process."""
    s = Store()
    return s, durability.recover(s, str(data_dir), repair=repair, after_lsn=after_lsn)


def type_of(store, key):
    """'string', 'hash' or None (absent), as the table holds it."""
    rc = lib.kvt_get_copy(store._t, key, len(key), ffi.NULL, 0)
    return None if rc == -errno.ENOENT else "hash" if rc == KVT_WRONGTYPE else "string"


# ================================================================ 1. whole or nothing

def _unit_log():
    """before=1 (LSN 1); a unit: a=1, b=1, DEL before (LSN 2..4); COMMIT (5)."""
    recs = [record(fl.OP_SET, b"before", b"1", 1),
            unit_set(b"a", b"1" * 20, 2), unit_set(b"b", b"1" * 20, 3),
            record(fl.OP_DEL, b"before", b"", 4, flags=F_UNIT), commit(5, 3)]
    return recs, fl.SEG_HDR + len(recs[0])


def test_a_whole_unit_is_applied(tmp_path):
    recs, _ = _unit_log()
    write_log(tmp_path, 1, *recs, record(fl.OP_SET, b"after", b"2", 6))
    s, r = recover(tmp_path)
    assert (r.records, r.first_lsn, r.last_lsn, r.problem) == (6, 1, 6, "")
    assert s.get(b"a") == s.get(b"b") == b"1" * 20
    assert s.get(b"before") is None and s.get(b"after") == b"2"


def test_a_unit_cut_at_every_byte_is_dropped_whole_and_repair_continues_the_log(tmp_path):
    """The file cut at every offset from inside the unit's first record to the last
    byte of its COMMIT (what a crash can leave): the unit's records are all absent,
    the record before it stays, the log is reported to end at LSN 1; with repair the
    unit is cut away, a new log continues at LSN 2, and a restart sees both."""
    recs, unit_start = _unit_log()
    _, body = write_log(tmp_path / "whole", 1, *recs)
    bad = []
    for cut in range(unit_start + 1, len(body)):
        d = tmp_path / f"cut{cut}"
        path, _ = write_segment(d, 1, body[:cut])
        s, r = recover(d)
        state = (s.get(b"before"), s.get(b"a"), s.get(b"b"), r.records, r.last_lsn)
        if state != (b"1", None, None, 1, 1) or not r.problem:
            bad.append((cut, "no repair", state, r.problem))
            continue
        s, r = recover(d, repair=True)
        if os.path.getsize(path) != unit_start or (s.get(b"a"), r.last_lsn) != (None, 1):
            bad.append((cut, "repair", os.path.getsize(path), r.last_lsn, r.problem))
            continue
        log = durability.Log(s, str(d), r.last_lsn + 1)
        s.set(b"after", b"2")
        log.close()
        s, r = recover(d)
        if (s.get(b"before"), s.get(b"a"), s.get(b"after"), r.last_lsn, r.problem) != (b"1", None, b"2", 2, ""):
            bad.append((cut, "after repair", s.get(b"a"), r.last_lsn, r.problem))
    assert not bad, f"{len(bad)} of {len(body) - unit_start - 1} cuts went wrong, e.g. {bad[:5]}"


def test_a_unit_without_commit_reports_where_it_began(tmp_path):
    recs, unit_start = _unit_log()
    write_log(tmp_path, 1, *recs[:-1])  # every record of the unit, no COMMIT
    s, r = recover(tmp_path)
    assert "unit of 3 records from LSN 2" in r.problem and f"at offset {unit_start}" in r.problem, r.problem
    assert "has no COMMIT" in r.problem and r.truncated_bytes == sum(len(x) for x in recs[1:-1])
    assert s.get(b"a") is None and s.get(b"before") == b"1"


def test_a_log_that_begins_inside_a_unit_replays_its_rest(tmp_path):
    """Segments below the data file's LSN are deleted; one may have held a unit's
    first records (LSN 8, 9 here): the COMMIT counts more records than the log has."""
    write_log(tmp_path, 10, unit_set(b"a", b"x", 10), unit_set(b"b", b"y", 11), commit(12, 4),
              record(fl.OP_SET, b"c", b"z", 13))
    s, r = recover(tmp_path, after_lsn=9)
    assert (s.get(b"a"), s.get(b"b"), s.get(b"c"), r.last_lsn, r.problem) == (b"x", b"y", b"z", 13, "")


# ================================================================ 2. what is corruption

BROKEN_UNITS = {
    "COMMIT without a unit": ([record(fl.OP_SET, b"x", b"1", 1), commit(2, 1)], "closes a unit of 1 records but no unit is open"),
    "plain record inside a unit": ([unit_set(b"a", b"1", 1), record(fl.OP_SET, b"b", b"1", 2), commit(3, 2)],
                                   "is not part of the unit open since LSN 1"),
    "COMMIT counting more": ([record(fl.OP_SET, b"x", b"1", 1), unit_set(b"a", b"1", 2), commit(3, 2)],
                             "closes a unit of 2 records but the unit from LSN 2 has 1"),
    "COMMIT counting fewer": ([unit_set(b"a", b"1", 1), unit_set(b"b", b"1", 2), commit(3, 1)],
                              "closes a unit of 1 records but the unit from LSN 1 has 2"),
}


@pytest.mark.parametrize("case", list(BROKEN_UNITS))
def test_broken_unit_rules_are_corruption(tmp_path, case):
    recs, why = BROKEN_UNITS[case]
    recs = recs + [record(fl.OP_SET, b"later", b"1", len(recs) + 1)]
    write_log(tmp_path, 1, *recs)
    with pytest.raises(CorruptLogError) as e:
        recover(tmp_path)
    assert why in str(e.value), str(e.value)
    off = fl.SEG_HDR + sum(len(r) for r in recs[:-2]) if case != "plain record inside a unit" else \
        fl.SEG_HDR + len(recs[0])
    assert f"at offset {off}" in str(e.value), (off, str(e.value))


# Header fields with a valid header CRC that no record may carry (wal_rec_len).
BAD_FIELDS = {
    "type 3": dict(op=fl.OP_SET, key=b"k", value=b"v", type_=3),
    "hash type on a DEL": dict(op=fl.OP_DEL, key=b"k", type_=T_HASH),
    "stream type on a stream change": dict(op=5, key=b"k", type_=2),
    "count on a stream change": dict(op=5, key=b"k", count=1),
    "unknown flag": dict(op=fl.OP_SET, key=b"k", value=b"v", flags=2),
    "byte 19 set": dict(op=fl.OP_SET, key=b"k", value=b"v", byte19=1),
    "count on a SET": dict(op=fl.OP_SET, key=b"k", value=b"v", count=1),
    "COMMIT with a key": dict(op=OP_COMMIT, key=b"k", count=1),
    "COMMIT with a value": dict(op=OP_COMMIT, value=b"v", count=1),
    "COMMIT counting 0": dict(op=OP_COMMIT, count=0),
    "COMMIT with an expire time": dict(op=OP_COMMIT, count=1, expire_ms=5),
    "COMMIT flagged as in a unit": dict(op=OP_COMMIT, count=1, flags=F_UNIT),
    "op 6": dict(op=6, key=b"k"),
    "op 0": dict(op=0, key=b"k"),
}


@pytest.mark.parametrize("where", ["middle", "last"])
@pytest.mark.parametrize("case", list(BAD_FIELDS))
def test_field_values_no_record_may_carry(tmp_path, case, where):
    """In the middle (valid records after it): refused as a damaged header at its
    offset. As the last record: a torn tail, the records before it kept."""
    f = dict(BAD_FIELDS[case])
    bad = record(f.pop("op"), lsn=2, **f)
    good = [record(fl.OP_SET, b"k%d" % i, b"v", i) for i in (1, 3)]
    recs = [good[0], bad] + (good[1:] if where == "middle" else [])
    write_log(tmp_path, 1, *recs)
    off = fl.SEG_HDR + len(good[0])
    if where == "middle":
        with pytest.raises(CorruptLogError) as e:
            recover(tmp_path)
        assert f"at offset {off} (damaged record header)" in str(e.value), str(e.value)
    else:
        s, r = recover(tmp_path)
        assert (r.records, r.last_lsn) == (1, 1) and "torn tail" in r.problem and f"at offset {off}" in r.problem


def test_old_records_with_zeros_read_as_strings_outside_units(tmp_path):
    """Segments written before types and units: bytes 17..19 and 28..31 are zero."""
    write_log(tmp_path, 1, fl.encode_record(fl.OP_SET, b"s", b"v", 1), fl.encode_record(fl.OP_DEL, b"s", b"", 2),
              fl.encode_record(fl.OP_SET, b"t", b"w", 3))
    s, r = recover(tmp_path)
    assert (r.records, r.problem, s.get(b"s"), type_of(s, b"t")) == (3, "", None, "string")


# ================================================================ 3. types

def test_hash_records_replay_as_hashes(tmp_path):
    """Through the table's logger into a real log (kvt_set with the hash type, as
    HSET's state is written), back through recovery into a new table."""
    s = Store()
    log = durability.Log(s, str(tmp_path), 1)
    assert lib.kvt_set(s._t, b"h", 1, b"\x01encoded", 8, KVT_TYPE_HASH, 0, ffi.NULL, ffi.NULL) >= 0
    s.set(b"s", b"plain")
    assert lib.kvt_set(s._t, b"h2", 2, b"\x02enc", 4, KVT_TYPE_HASH, 0, ffi.NULL, ffi.NULL) >= 0
    assert lib.kvt_del(s._t, b"h2", 2) == 1
    log.close()
    recs = [r for _, r in fl.all_records(tmp_path)]
    assert [(r.op, r.key, r.raw[17]) for r in recs] == [(1, b"h", T_HASH), (1, b"s", 0), (1, b"h2", T_HASH),
                                                        (2, b"h2", 0)]
    s2, r = recover(tmp_path)
    assert (r.records, r.problem) == (4, "")
    assert (type_of(s2, b"h"), type_of(s2, b"s"), s2.get(b"s"), type_of(s2, b"h2")) == ("hash", "string", b"plain",
                                                                                        None)


def test_hashes_replay_from_the_log_of_a_served_node(nodes, data_dir):
    """HSET and HDEL, alone and inside EXEC, then kill -9: the log alone (no data file)
    brings the hashes back as hashes, field for field."""
    n = nodes(data_dir)
    with Raw(n.port) as r:
        if r.call("COMMAND", "INFO", "hset") == [None]:
            pytest.skip("HSET is not in this build's command table yet")
    with client(n.port) as c:
        c.hset(b"dev:1", mapping={b"t": b"21.5", b"h": b"40"})
        c.hdel(b"dev:1", b"h")
        with c.pipeline(transaction=True) as p:
            p.hset(b"dev:2", mapping={b"t": b"19"}).set(b"s", b"x").hset(b"dev:1", b"p", b"1013")
            p.execute()
    n.kill()
    assert any(r.raw[17] == T_HASH for _, r in fl.all_records(data_dir))
    n = nodes(data_dir)
    with client(n.port) as c:
        assert [c.type(k) for k in (b"dev:1", b"dev:2", b"s")] == [b"hash", b"hash", b"string"]
        assert c.hgetall(b"dev:1") == {b"t": b"21.5", b"p": b"1013"} and c.hgetall(b"dev:2") == {b"t": b"19"}


# ================================================================ 4. EXEC through a server

def _exec(port, prefix, n):
    with client(port) as c:
        with c.pipeline(transaction=True) as p:
            p.set(f"{prefix}:a", n).set(f"{prefix}:b", "v" * 50).incr(f"{prefix}:c")
            assert p.execute() == [True, True, n]


def test_exec_is_one_unit_in_the_log_and_a_cut_one_is_dropped_by_the_server(nodes, data_dir):
    n = nodes(data_dir)
    with client(n.port) as c:
        c.set("x", "1")
    _exec(n.port, "t", 1)
    with client(n.port) as c:
        c.set("y", "2")
    n.kill()
    recs = fl.all_records(data_dir)
    shape = [(r.op, r.key, r.raw[18], struct.unpack_from("<I", r.raw, 28)[0]) for _, r in recs]
    assert shape == [(1, b"x", 0, 0), (1, b"t:a", F_UNIT, 0), (1, b"t:b", F_UNIT, 0), (1, b"t:c", F_UNIT, 0),
                     (OP_COMMIT, b"", 0, 3), (1, b"y", 0, 0)], shape
    assert len(fl.segments(data_dir)) == 1
    with open(recs[0][0], "rb") as f:
        body = f.read()
    unit = [r for _, r in recs[1:5]]
    # A crash left part of the unit: cut inside its first record, between two of its
    # records, inside the COMMIT. The server drops the unit and continues the log.
    for cut in (unit[0].off + 10, unit[1].off, unit[3].off + unit[3].length - 1):
        write_segment(data_dir, 1, body[:cut])
        n = nodes(data_dir)
        rec = fl.recovery_of(n)
        assert rec.last == 1 and ("has no COMMIT" in rec.rest or rec.torn), rec
        with client(n.port) as c:
            assert c.mget("x", "t:a", "t:b", "t:c") == [b"1", None, None, None]
            _exec(n.port, "t", 1)  # a whole unit after the repair: LSN 2..5 again
        n.kill()
        n = nodes(data_dir)
        rec = fl.recovery_of(n)
        assert rec.last == 5 and not rec.torn and "COMMIT" not in rec.rest, rec
        with client(n.port) as c:
            assert c.mget("x", "t:a", "t:c") == [b"1", b"1", b"1"]
        n.kill()


# ================================================================ 5. replication

def test_exec_replicates_as_a_unit_and_the_peer_copy_rebuilds_it(pair, tmp_path):
    pair.start_both()
    a = pair.nodes["a"]
    for i in range(1, 21):
        _exec(a.port, "r", i)
    _, ip, ir = pair.wait_in_sync("a")
    assert ir["log_receiver_held_lsn"] == ip["log_appended_lsn"]
    pdir = os.path.join(pair.dirs["b"], "peer", read_node_id(pair.dirs["a"]))
    recs = []
    for name in sorted(os.listdir(pdir)):
        if name.endswith(".log"):
            recs += fl.parse_segment(os.path.join(pdir, name))[1]
    commits = [r for r in recs if r.op == OP_COMMIT]
    assert len(commits) == 20 and all(struct.unpack_from("<I", r.raw, 28)[0] == 3 for r in commits)
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    durability.fetch_from_peer(str(fetched), "127.0.0.1", pair.rport["b"], key=pair_key())
    s, r = recover(fetched)
    assert (s.get(b"r:a"), s.get(b"r:c"), r.problem) == (b"20", b"20", "")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("loss", ["process", "machine"])
def test_kill_during_execs_in_remote_mode(pair, loss):
    """Remote mode, data file, memory bound below the data: SIGKILL A while three
    clients run transactions, restart it from its own directory (the process died)
    or from the peer's copy alone (the machine is gone). Each transaction is all
    there or not at all, and every acknowledged one is there."""
    pair.start_both()
    done = {}
    for it in range(2):
        a = pair.nodes["a"]
        ws = [TxWriter(a.port, f"g{i}", start=done.get(f"g{i}", 0)) for i in range(3)]
        for w in ws:
            w.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and min(w.acked for w in ws) < done.get("min", 0) + 100:
            time.sleep(0.05)
        pair.kill("a")
        for w in ws:
            w.join(timeout=15)
        assert min(w.acked for w in ws) > done.get("min", 0), "no transaction was acknowledged"
        if loss == "machine":
            shutil.rmtree(pair.dirs["a"])
        a = pair.start("a", from_peer=loss == "machine")
        with client(a.port) as c:
            for w in ws:
                vals = c.mget(f"{w.group}:a", f"{w.group}:b", f"{w.group}:c")
                assert vals[0] == vals[1] == vals[2], f"iteration {it}, {w.group}: half a transaction: {vals}"
                assert int(vals[0]) >= w.acked, f"{w.group}: acknowledged transaction {w.acked} lost ({vals[0]})"
                done[w.group] = int(vals[0])
        done["min"] = min(done[w.group] for w in ws)
        pair.wait_in_sync("a")


@pytest.fixture
def receiver(tmp_path):
    """A real node whose only job is to be a log receiver: its port."""
    rport = two_free_ports()[0]
    n = Node(port=0, data_dir=str(tmp_path / "peer-node"), durability="none", repl_port=rport,
             repl_secret_file=write_secret(tmp_path / "repl.secret"), log_path=str(tmp_path / "peer-node.stderr"))
    n.start()
    yield rport
    n.kill()


def test_a_torn_stream_is_never_acknowledged_inside_a_unit(receiver, tmp_path):
    """Frames cut a unit in two: the ACK after the first half names the record before
    the unit (the sender makes ACKs its durable LSN). The stream then breaks inside
    the next unit: the reconnecting sender is told to resume at that unit's start,
    and the peer's copy never holds half of it."""
    nid = os.urandom(16)
    s = FakeSender(receiver, nid)
    assert s.held == 0
    assert s.batch(record(fl.OP_SET, b"p1", b"1", 1), unit_set(b"u1", b"1", 2)) == 1
    assert s.batch(unit_set(b"u2", b"1", 3), commit(4, 2)) == 4
    assert s.batch(record(fl.OP_SET, b"p2", b"1", 5), unit_set(b"u3", b"1", 6), unit_set(b"u4", b"1", 7)) == 5
    s.close()  # torn: the rest of the unit (and its COMMIT) never arrives
    s = FakeSender(receiver, nid)
    assert s.held == 5, "the receiver kept half a unit"
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    durability.fetch_from_peer(str(fetched), "127.0.0.1", receiver, key=pair_key())
    st, r = recover(fetched)
    assert (r.last_lsn, r.problem) == (5, "")
    assert [st.get(k) for k in (b"p1", b"u1", b"u2", b"p2", b"u3")] == [b"1", b"1", b"1", b"1", None]
    # the sender resends the unit whole
    assert s.batch(unit_set(b"u3", b"1", 6), unit_set(b"u4", b"1", 7), commit(8, 2)) == 8
    s.close()


@pytest.mark.parametrize("case", ["COMMIT without a unit", "plain record inside a unit"])
def test_the_receiver_refuses_a_stream_that_breaks_the_unit_rules(receiver, case):
    s = FakeSender(receiver, os.urandom(16))
    recs = {"COMMIT without a unit": [record(fl.OP_SET, b"p", b"1", 1), commit(2, 1)],
            "plain record inside a unit": [unit_set(b"u", b"1", 1), record(fl.OP_SET, b"p", b"1", 2)]}[case]
    assert s.batch(*recs) is None  # the connection is closed, nothing acknowledged
    s.close()
