"""Sweeps of the BOSC data file that meet a fault half way (ext/durability/bosc_sweep.c):

  1. a sweep the disk refuses (ENOSPC) after it wrote some buckets' new chains, then a
     FLUSHALL, then sweeps that go through, then a torn write of such a bucket's home
     copy: the bucket's recorded chain must still be whole (its blocks were not given
     to another bucket), so the file opens and holds what the last sweeps wrote;
  2. FLUSHALL racing sweeps of huge values (chains longer than a write batch, each
     written on its own under gen_lock): after each, the data file counts and holds no
     key from before it, and a restart after kill -9 agrees.

Case 1 runs the store and its data file in process (no log: only the data file meets
the full disk) on a small loop-mounted ext4 (root, as CI runs). The file is read here
with the layout described in ext/durability/bosc.h.
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
    """{key: bucket} for keys each found in exactly one bucket's newest chain."""
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
            assert x_b == x_a2 ^ 1 and x_bseq > img.recorded(0), "sweep B did not write X's other copy"
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
