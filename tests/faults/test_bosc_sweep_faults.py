"""Sweeps of the BOSC data file that meet a fault half way (ext/durability/bosc_sweep.c):

  1. a sweep the disk refuses (ENOSPC) after it wrote some buckets' new chains, then a
     FLUSHALL, then sweeps that go through, then a torn write of such a bucket's home
     copy: the bucket's recorded chain must still be whole (its blocks were not given
     to another bucket), so the file opens and holds what the last sweeps wrote;
  2. FLUSHALL racing sweeps of huge values (chains longer than a write batch, each
     written on its own under gen_lock): after each, the data file counts and holds no
     key from before it, and a restart after kill -9 agrees;
  3. a load of a key whose bucket's chain is being written sleeps until the write is
     done (ext/durability/bosc_load.c), instead of spinning on a CPU meanwhile.

Cases 1 and 3 run the store and its data file in process, without a log (case 1: only
the data file meets the full disk, a small loop-mounted ext4: root, as CI runs); case 2
runs `kvstore serve` in disk mode. The file is read here with the layout described in
ext/durability/bosc.h.
"""
import os
import struct
import threading
import time

import pytest

from kvstore import Store, durability

from helpers import faultlib as fl
from helpers.conn import client
from helpers.loopfs import fill_up, small_fs

BLOCK = 4096
BHDR = 40                     # block header: magic crc no next gen(u64) used home seq(u64)
FIRST_TABLE = 2               # blocks 0 and 1: the superblock copies; the bucket table follows
TAB_PER_PAGE = (BLOCK - BHDR) // 8
BLK_MAGIC, TAB_MAGIC = 0x3142564B, 0x3254564B
MB = 1 << 20
WB_BLOCKS = 512               # bosc_int.h: a write batch; a longer chain is written on its own
NODE_DEFAULTS = {"data_file": True}  # the nodes fixture (faults/conftest.py) starts them with the data file


class DataFileImage:
    """A data file read with the server stopped (or between sweeps): its blocks, home
    copies, bucket table and chains."""

    def __init__(self, path, buckets):
        with open(path, "rb") as f:
            self.data = f.read()
        self.buckets = buckets
        self.first_home = FIRST_TABLE + 2 * ((buckets + TAB_PER_PAGE - 1) // TAB_PER_PAGE)

    def block(self, no):
        return self.data[no * BLOCK:(no + 1) * BLOCK].ljust(BLOCK, b"\0")

    def header(self, no):
        """(magic, next, gen, used, home, seq) of block no, or None if its checksum fails."""
        b = self.block(no)
        magic, crc, _no, nxt, gen, used, home, seq = struct.unpack_from("<IIIIQIIQ", b)
        return (magic, nxt, gen, used, home, seq) if crc == fl.crc32c(b[8:]) else None

    def copies(self, bucket):
        """[(block number, its header or None)] of bucket's two home copies."""
        no = self.first_home + 2 * bucket
        return [(no + s, self.header(no + s)) for s in (0, 1)]

    def newest(self, bucket):
        """(block number, seq) of the valid home copy with the higher sequence."""
        valid = [(no, h[5]) for no, h in self.copies(bucket) if h and h[0] == BLK_MAGIC]
        return max(valid, key=lambda c: c[1]) if valid else None

    def generation(self):
        """The generation the newest valid superblock copy records (older blocks read as empty)."""
        best = None
        for slot in (0, 1):
            p = self.block(slot)
            if p[:8] == b"KVSBOSC1" and fl.crc32c(p[12:]) == struct.unpack_from("<I", p, 8)[0]:
                seq, gen = struct.unpack_from("<Q", p, 16)[0], struct.unpack_from("<Q", p, 40)[0]
                best = max(best or (seq, gen), (seq, gen))
        return best[1]

    def recorded(self, bucket):
        """The sweep the bucket table records for bucket (its last synced write)."""
        pg, i = divmod(bucket, TAB_PER_PAGE)
        pages = [self.header(FIRST_TABLE + 2 * pg + s) for s in (0, 1)]
        s = max((s for s in (0, 1) if pages[s] and pages[s][0] == TAB_MAGIC), key=lambda s: pages[s][5])
        return struct.unpack_from("<Q", self.block(FIRST_TABLE + 2 * pg + s), BHDR + 8 * i)[0]

    def chain(self, copy):
        """The record stream and the block numbers of the chain whose home copy is block copy."""
        base = copy - (copy - self.first_home) % 2         # every block of the chain names it
        stream, blocks, no = b"", [], copy
        while no:
            h = self.header(no)
            assert h and h[0] == BLK_MAGIC and h[4] == base, (no, h)
            blocks.append(no)
            stream += self.block(no)[BHDR:BHDR + h[3]]
            no = h[1]
        return stream, blocks


def bucket_of_keys(img, keys):
    """{key: the bucket whose newest chain holds it} (keys that are no substring of another)."""
    found = {}
    for b in range(img.buckets):
        stream, _ = img.chain(img.newest(b)[0])
        for k in keys:
            if k in stream:
                found[k] = b
    return found


# ================================================================ 1. a failed sweep, then a torn home write

@pytest.mark.root
@pytest.mark.timeout(120)
def test_blocks_of_a_failed_sweep_are_not_reused_while_a_recorded_chain_names_them(tmp_path):
    """Two buckets, X (0) and Y (1), each a chain of several blocks, written twice (sweeps
    A1, A2: both home copies on disk; X's recorded chain is A2's, its overflow blocks OX).
    Then the disk fills up, and sweep B writes X's new chain into X's other home copy and
    fails on Y (a huge value: the file must grow). B dropped OX from X's chain, but that
    chain was never synced as X's (the table still records A2), so A2's chain still uses
    OX. A FLUSHALL follows: the retry settles X's keys without writing X. The disk frees
    up and sweep D writes new keys into Y alone. Finally X's home copy from B is torn,
    as the next sweep of X writing that copy leaves it when the power goes (the fault hook
    KVSTORE_FAULT_TEAR_HOME_WRITE cannot be aimed here: it counts home writes from the
    start of the process, and B's retries vary): the reader falls back to A2's chain.
    Before the fix (bosc_sweep.c: b->nfreed = 0 at the start of a sweep), OX went to the
    free list at the retry's sync, D reused them for Y, and the file no longer opened
    (EILSEQ: X's chain led into Y's blocks)."""
    with small_fs(tmp_path, 24) as mnt:
        d = mnt / "data"
        d.mkdir()
        path = str(d / "data.kvd")
        store = Store(max_memory=0)
        df = durability.DataFile(store, str(d), buckets=2, flush_interval_ms=600000, truncate_log=False)
        df.start(None)
        try:
            cand = [b"cand:%02d:" % i for i in range(24)]
            for k in cand:
                store.set(k, b"a1-" + k * 300)                  # ~3 KB each: several blocks a bucket
            df.sync()                                           # A1
            where = bucket_of_keys(DataFileImage(path, 2), cand)
            xs = [k for k in cand if where.get(k) == 0]
            ys = [k for k in cand if where.get(k) == 1]
            assert len(xs) >= 2 and len(ys) >= 2 and len(xs) + len(ys) == len(cand), where
            for k in cand:
                store.set(k, b"a2-" + k * 300)
            df.sync()                                           # A2
            img = DataFileImage(path, 2)
            x_a2, x_seq = img.newest(0)
            assert img.recorded(0) == x_seq
            _, ox = img.chain(x_a2)
            assert len(ox) >= 3, ox                             # home + at least two overflow blocks

            fill_up(str(mnt / "ballast"))
            for k in xs:
                store.set(k, b"b--" + k * 300)                  # X: as long as before, fits the free list
            store.set(ys[0], b"huge" * (3 * MB // 4))          # Y: > WB_BLOCKS blocks: needs new space
            df.sync()                                           # B: X written, Y refused (ENOSPC)
            img = DataFileImage(path, 2)
            x_b, x_bseq = img.newest(0)
            assert x_b == x_a2 ^ 1 and x_bseq > img.recorded(0), \
                "sweep B did not leave X's other copy written but unrecorded: the case needs a sweep that " \
                "writes one bucket and fails on a later one before its sync (did the sweep change?)"
            assert b"b--" + xs[0] in img.chain(x_b)[0]
            assert b"huge" * 16 not in img.chain(img.newest(1)[0])[0], "sweep B did not fail on Y"
            assert os.path.getsize(path) < 2 * MB

            store.flush()                                       # FLUSHALL: X's keys need no write now
            df.sync()                                           # (a retry: nothing to write, synced)
            os.unlink(mnt / "ballast")
            fresh = {k: b"d--" + k * 100 for k in ys}          # D: Y only, a chain of several blocks
            for k, v in fresh.items():
                store.set(k, v)
            df.sync()
            img = DataFileImage(path, 2)
            assert img.newest(0) == (x_b, x_bseq)               # X untouched since B
            assert img.recorded(0) == x_seq                     # ... and still recorded as A2
            assert all(v in img.chain(img.newest(1)[0])[0] for v in fresh.values())
        finally:
            df.close()

        # The torn write: the first half of a newer block over X's copy from B.
        with open(path, "r+b") as f:
            f.seek(x_b * BLOCK + 32)
            f.write(struct.pack("<Q", x_bseq + 1))             # (the checksum no longer matches)

        store = Store(max_memory=0)
        df = durability.DataFile(store, str(d), buckets=2, flush_interval_ms=600000, truncate_log=False)
        try:
            df.start(None)
            assert df.info["disk_keys"] == len(fresh), df.info
            for k, v in fresh.items():
                assert store.get(k) == v, k
            assert all(store.get(k) is None for k in xs)        # gone with the FLUSHALL
        finally:
            df.close()


# ================================================================ 2. FLUSHALL racing huge chains

HUGE = 5 * MB // 2            # > WB_BLOCKS blocks: each such chain is written on its own
assert HUGE // (BLOCK - BHDR) > WB_BLOCKS
RACE = dict(data_buckets=64, flush_interval_ms=600000, max_memory="512mb")


def write_round(port, r, nbig=8, nsmall=300):
    """nbig huge values and nsmall small ones for round r: {key: value}."""
    kv = {b"big:%d:%d" % (r, i): (b"<%d.%d>" % (r, i)).ljust(8, b".") * (HUGE // 8) for i in range(nbig)}
    kv.update({b"small:%d:%d" % (r, i): b"s%d.%d" % (r, i) * 20 for i in range(nsmall)})
    with client(port, socket_timeout=60) as c:
        p = c.pipeline(transaction=False)
        for k, v in kv.items():
            p.set(k, v)
        assert all(x is True for x in p.execute())
    return kv


def sweep_in_background(port):
    """DBSIZE on its own connection (it waits for a sweep of everything dirty); returns
    (thread, its result: {start, end} monotonic times or an error)."""
    out = {}

    def run():
        try:
            with client(port, socket_timeout=60) as c:
                out["start"] = time.monotonic()
                c.dbsize()
                out["end"] = time.monotonic()
        except Exception as e:   # (the last round kills the server under it)
            out["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def current_records(path, buckets):
    """The record streams of every chain of the generation the superblock records (what a
    restart reads; older chains read as empty), concatenated."""
    img = DataFileImage(path, buckets)
    gen = img.generation()
    return b"".join(img.chain(c[0])[0] for b in range(buckets) if (c := img.newest(b)) and img.header(c[0])[2] == gen)


@pytest.mark.timeout(240)
def test_flushall_racing_sweeps_of_huge_chains(data_dir, nodes):
    """Each round writes 8 values of 2.5 MiB (chains past a write batch: the sweep writes
    each on its own, under gen_lock, the generation checked there) and 300 small keys,
    asks for a sweep, and sends FLUSHALL from another connection at a different point of
    the sweep each round. After each: DBSIZE is 0 once the sweep is done, the data file
    counts no key, and once a later write is swept (the superblock then records the new
    generation) no chain of that generation holds a key from before. The last
    round is killed (-9) right after its FLUSHALL and a few later writes: the restart
    holds the later writes and no key from before."""
    path = os.path.join(str(data_dir), "data.kvd")
    n = nodes(data_dir, **RACE)
    write_round(n.port, 0)
    t0 = time.monotonic()
    with client(n.port, socket_timeout=60) as c:
        c.dbsize()                                   # how long a round's sweep takes here
        took = time.monotonic() - t0
        assert c.flushall() is True
    before, overlapped = [], 0
    fracs = (0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95, 0.2, 0.5)
    for r, frac in enumerate(fracs, start=1):
        before += list(write_round(n.port, r))
        t, out = sweep_in_background(n.port)
        time.sleep(took * frac)
        with client(n.port, socket_timeout=60) as c:
            assert c.flushall() is True
            flushed_at = time.monotonic()
        t.join(60)
        assert "error" not in out, out
        overlapped += out["start"] < flushed_at < out["end"]
        with client(n.port, socket_timeout=60) as c:
            assert c.dbsize() == 0                   # (waits for the sweep: the race is over)
            i = c.info("persistence")
            assert i["datafile_keys"] == 0 and not i["datafile_failed"], i
            assert c.set(b"mark:%d" % r, b"x")        # swept: the superblock takes the new generation
            assert c.dbsize() == 1
            assert c.info("persistence")["datafile_keys"] == 1
        held = current_records(path, RACE["data_buckets"])
        assert b"big:" not in held and b"small:" not in held, f"round {r}: keys from before the FLUSHALL in the file"
        assert b"mark:%d" % r in held
        before.append(b"mark:%d" % r)
    print(f"{overlapped} of {len(fracs)} FLUSHALLs answered while the sweep ran (a sweep took {took:.2f} s)")

    before += list(write_round(n.port, len(fracs) + 1))
    t, out = sweep_in_background(n.port)
    time.sleep(took * 0.4)
    after = {b"after:%d" % i: b"kept-%d" % i for i in range(50)}
    with client(n.port, socket_timeout=60) as c:
        assert c.flushall() is True
        for k, v in after.items():
            assert c.set(k, v)
    n.kill()
    t.join(60)

    n = nodes(data_dir, **RACE)
    with client(n.port, socket_timeout=60) as c:
        assert c.dbsize() == len(after)
        for i in range(0, len(before), 200):
            part = before[i:i + 200]
            back = [k for k, v in zip(part, c.mget(part)) if v is not None]
            assert not back, f"{len(back)} keys from before the FLUSHALL are back, e.g. {back[:3]}"
        assert c.mget(list(after)) == list(after.values())
        assert c.dbsize() == len(after)              # (swept: the later writes are in the file)
        assert not c.info("persistence")["datafile_failed"]
    assert n.stop() == 0
    held = current_records(path, RACE["data_buckets"])
    assert b"big:" not in held and b"small:" not in held and b"mark:" not in held, \
        "keys from before the FLUSHALL in the data file"
    assert all(k in held for k in after), "the later writes are not in the data file"


# ================================================================ 3. a load waits for a chain's write

def switches():
    """This thread's involuntary context switches so far: sched_yield that let another
    task run counts here (the thread stays runnable), a sleep on a lock does not."""
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("nonvoluntary_ctxt_switches"))


def test_a_load_sleeps_while_its_buckets_chain_is_written(tmp_path):
    """One bucket. A sweep writes a 128 MiB value (a huge chain: its bucket's version odd
    for the whole write, block by block). A GET of a key the bucket may hold, sent once
    the write has begun, waits for the write; the key is set meanwhile, so the load
    reads nothing afterwards and its thread's CPU time is the wait alone. Before, the
    load spun on sched_yield for the whole write: its thread's CPU time was most of the
    time it waited (the whole of it with a CPU to spare); now it sleeps on gen_lock."""
    store = Store(max_memory=0)
    df = durability.DataFile(store, str(tmp_path), buckets=1, flush_interval_ms=600000, truncate_log=False)
    df.start(None)
    try:
        store.set(b"small", b"x")
        df.sync()                                        # the bucket holds a key: GETs ask the file
        value = b"0123456789abcdef" * (128 * MB // 16)
        chain = len(value) // (BLOCK - BHDR)
        waited = []
        for attempt in range(5):
            store.set(b"huge", value + b"%d" % attempt)
            base = df.stats()["blocks_written"]
            sweep = threading.Thread(target=df.sync)
            sweep.start()
            while df.stats()["blocks_written"] < base + 64 and sweep.is_alive():
                time.sleep(0.001)                        # the chain's write has begun
            key, got = b"absent:%d" % attempt, {}

            def get():
                s0, c0, w0 = switches(), time.thread_time(), time.monotonic()
                got["value"] = store.get(key)            # (the load runs in this thread: Store._op)
                got["cpu"], got["wall"] = time.thread_time() - c0, time.monotonic() - w0
                got["yields"] = switches() - s0
            t = threading.Thread(target=get)
            t.start()
            while df.stats()["blocks_written"] < base + chain // 3 and sweep.is_alive():
                time.sleep(0.001)
            store.set(key, b"set meanwhile")
            mid = df.stats()["blocks_written"] < base + chain   # still writing: the GET waited on it
            t.join(60)
            sweep.join(60)
            assert got["value"] == b"set meanwhile"
            if mid and got["wall"] > 0.02:
                waited.append((got["cpu"], got["wall"], got["yields"]))
            if len(waited) >= 2:
                break
        assert waited, "no GET met the chain's write (the write was over too soon every time)"
        print("load waits (cpu s, wall s, switches away while runnable):",
              [(round(c, 4), round(w, 3), y) for c, w, y in waited])
        for cpu, wall, yields in waited:
            assert cpu < wall / 5, f"the waiting load used {cpu:.3f} s of CPU in {wall:.3f} s"
            assert yields < 15, f"the waiting load gave up the CPU {yields} times while runnable"
    finally:
        df.close()
