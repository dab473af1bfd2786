"""Streams survive kill -9: every acknowledged XADD, XDEL, XTRIM, XSETID, COPY,
RENAME and EXPIRE of a stream is back after a restart, with the same IDs and
entries, and IDs go on from where they were (the log holds each change as the
delta that ran, ext/core/stream.h; a data file holds whole streams, and replay
skips the changes a loaded stream already has)."""
import random
import shutil
import threading
import time

import pytest
import redis

from helpers import faultlib as fl
from helpers.conn import client
from helpers.keyspace import SPILL, apply_ops, fill, wait_flushed

pytestmark = pytest.mark.timeout(240)


class Model:
    """Streams as {key: [(ms, seq, {field: value})]} with each key's last ID."""

    def __init__(self, keys, rng):
        self.keys, self.rng = keys, rng
        self.s = {}
        self.last = {}

    def ops(self, n):
        """n random stream commands, applied to the model; yields each as a tuple."""
        rng = self.rng
        for _ in range(n):
            k = rng.choice(self.keys)
            entries = self.s.get(k)
            op = rng.random()
            if op < 0.7 or entries is None:
                ms, seq = self.last.get(k, (0, 0))
                ms += rng.choice((0, 1, 1, 3))
                seq = seq + 1 if (ms, seq) <= self.last.get(k, (0, 0)) else 0
                if (ms, seq) == (0, 0):
                    seq = 1
                fields = {b"t": b"%d" % rng.randrange(10 ** 6), b"d": rng.randbytes(rng.choice((0, 5, 85, 400)))}
                self.s.setdefault(k, []).append((ms, seq, fields))
                self.last[k] = (ms, seq)
                yield ("XADD", k, b"%d-%d" % (ms, seq), *[x for kv in fields.items() for x in kv])
            elif op < 0.85 and entries:
                gone = rng.sample(entries, min(len(entries), rng.randint(1, 3)))
                for e in gone:
                    entries.remove(e)
                yield ("XDEL", k, *[b"%d-%d" % e[:2] for e in gone])
            elif op < 0.92:
                keep = rng.randint(0, len(entries))
                del entries[:len(entries) - keep]
                yield ("XTRIM", k, "MAXLEN", keep)
            else:
                ms, seq = self.last[k]
                self.last[k] = (ms + 10, 0)
                yield ("XSETID", k, b"%d-0" % (ms + 10))

    def check(self, port, others=0):
        with client(port) as c:
            for k in self.keys:
                if k not in self.s:
                    assert not c.exists(k)
                    continue
                got = [(tuple(int(x) for x in i.split(b"-")), f) for i, f in c.xrange(k, "-", "+")]
                assert got == [((ms, seq), f) for ms, seq, f in self.s[k]], k
                # IDs go on above the last one, deleted or trimmed or set
                ms, seq = self.last[k]
                assert c.xadd(k, {b"probe": b"1"}, id=b"%d-*" % ms) == b"%d-%d" % (ms, seq + 1)
                self.s[k].append((ms, seq + 1, {b"probe": b"1"}))
                self.last[k] = (ms, seq + 1)
            assert c.dbsize() == len(self.s) + others


def test_streams_survive_kill9_with_durability_disk(tmp_path):
    m = Model([b"sensor:%02d" % i for i in range(20)], random.Random(1))
    with fl.started_nodes() as start:
        n = start(tmp_path)
        apply_ops(n.port, list(m.ops(3000)))
        with client(n.port) as c:  # whole-state writes and the expire time
            assert c.copy(b"sensor:00", b"copy:00") is True
            assert c.rename(b"sensor:01", b"moved:01") is True
            assert c.expire(b"moved:01", 1000) is True
        m.keys += [b"copy:00", b"moved:01"]
        m.s[b"copy:00"], m.last[b"copy:00"] = list(m.s[b"sensor:00"]), m.last[b"sensor:00"]
        m.s[b"moved:01"], m.last[b"moved:01"] = m.s.pop(b"sensor:01"), m.last.pop(b"sensor:01")
        n.kill()  # every write was acknowledged: each must be back
        n = start(tmp_path)
        m.check(n.port)
        with client(n.port) as c:
            assert 900 < c.ttl(b"moved:01") <= 1000 and c.ttl(b"copy:00") == -1
        apply_ops(n.port, list(m.ops(500)))
        assert n.stop() == 0
        n = start(tmp_path)
        m.check(n.port)
        n.stop()


def test_streams_leave_memory_and_come_back_across_kill9(tmp_path):
    """A data file and 256 KiB of memory: streams are written whole to the data file,
    evicted by filler strings, loaded back and changed; after kill -9 the log's deltas
    replay on top of the loaded streams without applying any twice."""
    m = Model([b"dev:%03d" % i for i in range(80)], random.Random(2))
    filler = 3000
    with fl.started_nodes() as start:
        n = start(tmp_path, **SPILL)
        apply_ops(n.port, list(m.ops(1500)))
        fill(n.port, b"fill", filler)
        i = wait_flushed(n.port)
        assert i["datafile_evicted_keys"] > 0, i
        loads = i["datafile_loads"]
        apply_ops(n.port, list(m.ops(1000)))  # changes to streams that left memory: each loaded first
        assert fl.persistence(n.port)["datafile_loads"] > loads, "no stream was read back from the data file"
        fill(n.port, b"fill", filler)
        wait_flushed(n.port)
        apply_ops(n.port, list(m.ops(500)))  # in the log only, on top of what the file holds
        n.kill()
        n = start(tmp_path, **SPILL)
        m.check(n.port, filler)
        n.stop()


# ---------------------------------------------------------------- under load

class StreamWriter(threading.Thread):
    """XADD with server-made IDs to its own stream until stopped or cut off; keeps what
    was acknowledged (ID -> fields)."""

    def __init__(self, port, key, stop):
        super().__init__(daemon=True)
        self.port, self.key, self.stop = port, key, stop
        self.acked = {}

    def run(self):
        i = 0
        try:
            with client(self.port) as c:
                while not self.stop.is_set():
                    fields = {b"n": b"%d" % i, b"v": b"x" * (i % 90)}
                    self.acked[c.xadd(self.key, fields)] = fields
                    i += 1
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            pass  # the server was killed: the last request may or may not have been applied


class GroupReader(threading.Thread):
    """XREADGROUP > then XACK of half of what it got; keeps the IDs it was given (the
    server's reply acknowledges the delivery) and those it acknowledged."""

    def __init__(self, port, key, stop):
        super().__init__(daemon=True)
        self.port, self.key, self.stop = port, key, stop
        self.delivered, self.acked = set(), set()
        self.inflight = set()  # an XACK sent and not answered: the server may have applied it

    def run(self):
        try:
            with client(self.port) as c:
                while not self.stop.is_set():
                    got = c.xreadgroup("g", "reader", {self.key: ">"}, count=50, block=50)
                    ids = [i for _, entries in got for i, _ in entries]
                    self.delivered.update(ids)
                    half = ids[::2]
                    self.inflight = set(half)
                    if half and c.xack(self.key, "g", *half) == len(half):
                        self.acked.update(half)
                    self.inflight = set()
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            pass


def parse_id(i):
    return tuple(int(x) for x in i.split(b"-"))


def check_after_loss(port, writers, readers):
    with client(port) as c:
        for w, r in zip(writers, readers):
            have = dict(c.xrange(w.key, "-", "+"))
            lost = [i for i in w.acked if i not in have]
            assert not lost, f"{w.key}: {len(lost)} acknowledged XADDs lost, e.g. {lost[:3]}"
            assert all(have[i] == f for i, f in w.acked.items())
            pending = {p["message_id"] for p in c.xpending_range(w.key, "g", "-", "+", 10 ** 6)}
            assert not (pending & r.acked), f"{w.key}: acknowledged XACKs undone"
            unacked = r.delivered - r.acked - r.inflight
            assert unacked <= pending, f"{w.key}: delivered entries left the PEL unacknowledged"
            [g] = c.xinfo_groups(w.key)
            last = max((parse_id(i) for i in r.delivered), default=(0, 0))
            assert parse_id(g["last-delivered-id"]) >= last, f"{w.key}: the group's last ID went back"


def load_then(port, seconds):
    stop = threading.Event()
    keys = [b"load:%d" % i for i in range(3)]
    with client(port) as c:
        for k in keys:
            c.xgroup_create(k, "g", id="$", mkstream=True)
    writers = [StreamWriter(port, k, stop) for k in keys]
    readers = [GroupReader(port, k, stop) for k in keys]
    for t in writers + readers:
        t.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and min(len(w.acked) for w in writers) < 300:
        time.sleep(0.05)
    return stop, writers, readers


@pytest.mark.parametrize("data_file", [False, True], ids=["log", "log+datafile"])
def test_kill9_during_xadd_and_xreadgroup_loses_nothing_acknowledged(tmp_path, data_file):
    settings = dict(SPILL) if data_file else {}
    with fl.started_nodes() as start:
        n = start(tmp_path, **settings)
        stop, writers, readers = load_then(n.port, 20)
        n.kill()
        stop.set()
        for t in writers + readers:
            t.join(timeout=15)
        assert all(w.acked for w in writers) and any(r.delivered for r in readers)
        n = start(tmp_path, **settings)
        check_after_loss(n.port, writers, readers)
        n.stop()


@pytest.mark.timeout(150)
def test_machine_loss_keeps_streams_and_groups_from_the_peer(pair):
    """durability remote: the node is killed and its directory deleted; rebuilt from the
    peer's copy of its log, every acknowledged XADD, delivery and XACK is there."""
    pair.start_both()
    a = pair.nodes["a"]
    stop, writers, readers = load_then(a.port, 20)
    pair.kill("a")
    stop.set()
    for t in writers + readers:
        t.join(timeout=15)
    assert all(w.acked for w in writers)
    shutil.rmtree(pair.dirs["a"])
    a = pair.start("a", from_peer=True)
    check_after_loss(a.port, writers, readers)


def test_kill9_during_udp_batches_loses_no_acknowledged_batch(tmp_path):
    """--arch udp: datagrams of 16 messages (one batch each, one log record) sent until the
    node is killed; every batch whose reply came is back with its consecutive IDs, none in part."""
    from kvstore.udpstreams import UdpStreams
    acked, stop = [], threading.Event()

    def sender(n, key):
        with UdpStreams("127.0.0.1", n.udp_port, timeout=1.0) as u:
            i = 0
            while not stop.is_set():
                msgs = [b"%s:%06d:%02d" % (key, i, j) + b"." * 70 for j in range(16)]
                try:
                    first, k = u.xadd(key, msgs)
                except OSError:  # the node is gone: this batch was never acknowledged
                    return
                acked.append((key, first, msgs))
                i += 1

    with fl.started_nodes() as start:
        n = start(tmp_path, arch="udp", udp_port=0)
        threads = [threading.Thread(target=sender, args=(n, b"udp:%d" % i)) for i in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while len(acked) < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        n.kill()
        stop.set()
        for t in threads:
            t.join(timeout=15)
        assert len(acked) >= 50
        n = start(tmp_path, arch="udp", udp_port=0)
        with client(n.port) as c:
            for key, first, msgs in acked:
                got = c.xrange(key, first, "+", count=16)
                ms, seq = parse_id(first.encode())
                assert [i for i, _ in got] == [b"%d-%d" % (ms, seq + j) for j in range(16)], (key, first)
                assert [f[b"v"] for _, f in got] == msgs
            for key in {a[0] for a in acked}:
                assert c.xlen(key) % 16 == 0  # whole batches: a datagram's messages are one change
        n.stop()
