"""Streams survive kill -9: every acknowledged XADD, XDEL, XTRIM, XSETID, COPY,
RENAME and EXPIRE of a stream is back after a restart, with the same IDs and
entries, and IDs go on from where they were (the log holds each change as the
delta that ran, ext/core/stream.h; a data file holds whole streams, and replay
skips the changes a loaded stream already has)."""
import random

import pytest

from helpers import faultlib as fl
from helpers.conn import client
from helpers.keyspace import SPILL, fill, wait_flushed

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


def apply(port, ops):
    with client(port) as c:
        p = c.pipeline(transaction=False)
        for op in ops:
            p.execute_command(*op)
        for op, r in zip(ops, p.execute(raise_on_error=False)):
            assert not isinstance(r, Exception), (op, r)


def test_streams_survive_kill9_with_durability_disk(tmp_path):
    m = Model([b"sensor:%02d" % i for i in range(20)], random.Random(1))
    with fl.started_nodes() as start:
        n = start(tmp_path)
        apply(n.port, list(m.ops(3000)))
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
        apply(n.port, list(m.ops(500)))
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
        apply(n.port, list(m.ops(1500)))
        fill(n.port, b"fill", filler)
        i = wait_flushed(n.port)
        assert i["datafile_evicted_keys"] > 0, i
        loads = i["datafile_loads"]
        apply(n.port, list(m.ops(1000)))  # changes to streams that left memory: each loaded first
        assert fl.persistence(n.port)["datafile_loads"] > loads, "no stream was read back from the data file"
        fill(n.port, b"fill", filler)
        wait_flushed(n.port)
        apply(n.port, list(m.ops(500)))  # in the log only, on top of what the file holds
        n.kill()
        n = start(tmp_path, **SPILL)
        m.check(n.port, filler)
        n.stop()
