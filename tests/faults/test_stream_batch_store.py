"""A stream's sealed batches in the data file's batch store (ext/durability/bstore.h):
each batch is written once, appended to a segment file, and the stream's record
refers to it, so a write-back costs the batches sealed since the last one, not
the stream's size. Checked on a real server: the cost, kill -9 and restart from
the data file alone, trimmed batches' segments deleted, FLUSHALL, a damaged or
missing segment reported by name, never read as other data."""
import glob
import os
import random

import pytest
import redis

from helpers import faultlib as fl
from helpers.conn import client
from helpers.keyspace import SPILL, wait_flushed

pytestmark = pytest.mark.timeout(240)

STORE = dict(SPILL, max_memory="64mb")  # the streams stay in memory unless a test fills it


def xadd_many(port, key, n, start_ms=1, size=85, seed=0):
    """n entries of `size` bytes with IDs start_ms-0, start_ms+1-0, ...; returns them."""
    rng = random.Random(seed)
    added = []
    with client(port) as c:
        for s in range(0, n, 1000):
            p = c.pipeline(transaction=False)
            for i in range(s, min(n, s + 1000)):
                eid, v = b"%d-0" % (start_ms + i), rng.randbytes(size)
                p.xadd(key, {b"v": v}, id=eid)
                added.append((eid, {b"v": v}))
            p.execute()
    return added


def batch_files(data_dir):
    dirs = glob.glob(os.path.join(str(data_dir), "**", "*.batches"), recursive=True)
    assert len(dirs) == 1, dirs
    return sorted(glob.glob(os.path.join(dirs[0], "*.seg")))


def test_a_write_back_writes_the_new_batches_only(tmp_path):
    with fl.started_nodes() as start:
        n = start(tmp_path, **STORE)
        xadd_many(n.port, b"s", 20_000)  # ~1,300 batches of ~15 entries
        i = wait_flushed(n.port)
        first = i["datafile_batches_written"]
        assert first >= 1_000, i
        assert i["datafile_batch_live_bytes"] >= 20_000 * 85, i
        xadd_many(n.port, b"s", 150, start_ms=100_000)  # ~10 batches more
        i = wait_flushed(n.port)
        assert first < i["datafile_batches_written"] <= first + 40, (first, i)
        n.stop()


def test_streams_come_back_from_the_batch_store_after_kill9(tmp_path):
    with fl.started_nodes() as start:
        n = start(tmp_path, **STORE)
        added = {k: xadd_many(n.port, k, 3000, seed=j) for j, k in enumerate((b"a", b"b", b"c"))}
        with client(n.port) as c:
            assert c.xdel(b"b", b"10-0", b"2000-0") == 2  # sealed batches changed: written again
            added[b"b"] = [e for e in added[b"b"] if e[0] not in (b"10-0", b"2000-0")]
        wait_flushed(n.port)  # the log holds nothing the data file lacks: it is truncated
        n.kill()
        n = start(tmp_path, **STORE)
        with client(n.port) as c:
            for k, want in added.items():
                assert c.xrange(k) == want, k
        assert fl.persistence(n.port)["datafile_batch_reads"] > 0
        n.stop()


def test_trimmed_batches_leave_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSTORE_TEST_BATCH_SEGMENT_BYTES", "65536")  # a segment every ~45 batches
    with fl.started_nodes() as start:
        n = start(tmp_path, **STORE)
        xadd_many(n.port, b"s", 10_000)
        wait_flushed(n.port)
        many = len(batch_files(tmp_path))
        assert many >= 10, many
        with client(n.port) as c:
            c.xtrim(b"s", maxlen=100)
        i = wait_flushed(n.port)
        assert i["datafile_batch_live_bytes"] < 20_000, i
        assert len(batch_files(tmp_path)) <= 3, (many, batch_files(tmp_path))
        n.kill()  # and what is left is what the stream needs
        n = start(tmp_path, **STORE)
        with client(n.port) as c:
            assert c.xlen(b"s") == 100 and c.xrange(b"s", count=1)[0][0] == b"9901-0"
        with client(n.port) as c:
            assert c.flushall() is True
        wait_flushed(n.port)
        assert batch_files(tmp_path) == []
        n.stop()


@pytest.mark.parametrize("damage", ["flip", "missing"])
def test_a_damaged_batch_store_is_reported_not_read(tmp_path, damage):
    with fl.started_nodes() as start:
        n = start(tmp_path, **STORE)
        xadd_many(n.port, b"s", 2000)
        wait_flushed(n.port)
        n.kill()
        seg = batch_files(tmp_path)[0]
        if damage == "flip":
            fl.flip_bit(seg, os.path.getsize(seg) // 2, 3)
        else:
            os.unlink(seg)
        n = start(tmp_path, **STORE)
        with client(n.port) as c:
            with pytest.raises(Exception) as e:
                c.xrange(b"s")
        why = "a batch fails its checksum" if damage == "flip" else "a batch segment is missing"
        assert "stream s cannot be read back" in str(e.value) and why in str(e.value), str(e.value)
        n.kill()


@pytest.mark.root
def test_a_full_disk_under_the_batch_store_loses_nothing(tmp_path):
    """The disk fills while a stream's batches are written back (log segments prepared
    ahead, so the log still takes writes): the sweep fails in the batch store and is
    retried; once there is room everything acknowledged is there after kill -9."""
    from helpers import loopfs
    from test_disk_full import LEFT_FREE, fill_ballast, start, wait_for
    with loopfs.small_fs(tmp_path, 40) as mnt:
        node = start(mnt / "data", tmp_path / "server.log")
        try:
            with client(node.port, socket_timeout=20) as c:
                added = xadd_many(node.port, b"s", 2000)
                assert c.dbsize() == 1  # a sweep: the batches so far are in the store
                fill_ballast(str(mnt / "ballast"), LEFT_FREE)
                # bigger entries: ~2/3 of what is left, which the log (prepared ahead) takes
                added += xadd_many(node.port, b"s", 2 * LEFT_FREE // 3 // 4096, start_ms=10_000, size=4000)
                c.dbsize()  # a sweep: refused by the full disk
                p = c.info("persistence")
                assert p["datafile_write_status"] == "err", p
                assert "cannot write the batch store" in p["datafile_write_error"], p
                assert "No space left" in p["datafile_write_error"], p
                assert c.xlen(b"s") == len(added)
                os.unlink(mnt / "ballast")
                wait_for(lambda: c.info("persistence")["datafile_write_status"] == "ok", 60, "the sweep retried")
                c.dbsize()
            node.kill()
            node = start(mnt / "data", tmp_path / "server.log")
            with client(node.port) as c:
                assert c.xrange(b"s") == added
        finally:
            node.kill()


def test_a_stream_larger_than_memory_leaves_it_batch_by_batch(tmp_path):
    """4 MiB of memory and a stream of ~25 MiB: its old batches leave memory (the
    stream stays), reads of old ranges bring them back (a command waits for them,
    the poller does not), inside MULTI/EXEC too; RENAME reads a stream back whole
    (one too large for that gets an error); XREADGROUP reads it all, XDEL of an old
    entry works, and kill -9 loses nothing."""
    small = dict(SPILL, max_memory="4mb")
    with fl.started_nodes() as start:
        n = start(tmp_path, **small)
        little = xadd_many(n.port, b"little", 2_000, size=100)
        added = xadd_many(n.port, b"big", 150_000, size=100)
        i = fl.persistence(n.port)
        assert i["datafile_batches_evicted"] > 1000, i
        with client(n.port) as c:
            used = c.info("memory")["used_memory"]
            assert used < 12 << 20, used  # the stream alone is ~25 MiB
            assert c.xlen(b"big") == len(added)
            assert c.xrange(b"big", min=b"1000-0", max=b"1099-0") == added[999:1099]
            assert c.xrevrange(b"big", max=b"60000-0", count=5) == added[59999:59994:-1]
            p = c.pipeline(transaction=True)  # MULTI/EXEC: its streams' batches come back before it runs
            p.xrange(b"big", min=b"5000-0", max=b"5009-0")
            p.xlen(b"big")
            assert p.execute() == [added[4999:5009], len(added)]
            loaded = c.info("persistence")["datafile_batches_loaded"]
            assert c.rename(b"little", b"moved")  # whole: its batches out of memory read back first
            assert c.info("persistence")["datafile_batches_loaded"] > loaded + 50
            assert c.xrange(b"moved") == little
            with pytest.raises(redis.ResponseError, match="too large to copy or rename"):
                c.copy(b"big", b"copy")
            assert c.xdel(b"big", b"20-0", b"70000-0") == 2
            del added[69999]
            del added[19]
            c.xgroup_create(b"big", b"g", id=b"0")
            got = []
            while len(got) < len(added):  # a consumer: read, acknowledge (pending entries take memory)
                r = c.xreadgroup(b"g", b"c", {b"big": b">"}, count=5000)
                assert r, len(got)
                got += r[0][1]
                assert c.xack(b"big", b"g", *[e[0] for e in r[0][1]]) == len(r[0][1])
            assert got == added
            added += xadd_many(n.port, b"big", 10, start_ms=200_000)
            c.xreadgroup(b"g", b"c", {b"big": b">"})  # pending: these 10, not acknowledged
            assert c.xpending(b"big", b"g")["pending"] == 10
        assert fl.persistence(n.port)["datafile_batches_loaded"] > 1000
        n.kill()
        n = start(tmp_path, **small)
        with client(n.port) as c:
            assert c.xlen(b"big") == len(added)
            assert c.xrange(b"big", count=3) == added[:3]
            assert c.xrange(b"big", min=b"149990-0") == added[-21:]
            assert c.xpending(b"big", b"g")["pending"] == 10
            assert c.xreadgroup(b"g", b"c", {b"big": b"0"})[0][1] == added[-10:]
        n.stop()


def test_a_read_with_a_count_brings_back_the_batches_it_covers(tmp_path):
    """A read that met a gone batch brings it back with the ones after it that hold the rest
    of its COUNT, not the whole read-ahead: random XRANGE/XREVRANGE ... COUNT 10 of a stream
    larger than memory each bring back a few batches (about 13 entries to a batch here), and
    give the entries they would give from memory. A read without COUNT reads ahead further."""
    small = dict(SPILL, max_memory="4mb")
    with fl.started_nodes() as start:
        n = start(tmp_path, **small)
        added = xadd_many(n.port, b"big", 150_000, size=100)
        assert fl.persistence(n.port)["datafile_batches_evicted"] > 1000
        rng = random.Random(5)
        with client(n.port) as c:
            before, reads = c.info("persistence")["datafile_batches_loaded"], 0
            for _ in range(40):
                i = rng.randrange(1_000, 140_000)
                assert c.xrange(b"big", min=b"%d-0" % (i + 1), count=10) == added[i:i + 10]
                assert c.xrevrange(b"big", max=b"%d-0" % (i + 1), count=10) == added[i:i - 10:-1]
                reads += 2
            loaded = c.info("persistence")["datafile_batches_loaded"] - before
            assert 0 < loaded <= 3 * reads, (loaded, reads)  # 17 a read before
            before = c.info("persistence")["datafile_batches_loaded"]
            assert c.xrange(b"big", min=b"100001-0", max=b"100400-0") == added[100_000:100_400]
            assert c.info("persistence")["datafile_batches_loaded"] - before > 10  # no COUNT: read ahead
        n.stop()
