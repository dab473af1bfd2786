"""A power cut in the middle of a sweep of the data file (ext/durability/bosc_open.c, scan;
bosc_block.c, bosc_chain_read_other): the sweep writes a bucket's overflow blocks, then
its new home copy, and syncs only after both; the disk may keep the home copy and not
the overflow blocks. That copy was never recorded in the bucket table (the table and the
flushed LSN move only after the sync), so the file's synced state is the older copy, and
the log still holds whatever the newer one held. Opening such a file must use the older
copy (and say so in the log), not refuse to start.

The file images are made in-process (a Store and its DataFile, no log): A after sweep 2,
B after sweep 3; the image opened is A with only B's new home copy of one bucket."""
import os

from kvstore import Store, durability

BLOCK = 4096
FIRST_HOME = 2 + 2 * 1        # superblocks, then the two copies of the one table page (2 buckets)


def open_df(d, store):
    return durability.DataFile(store, str(d), buckets=2, flush_interval_ms=600000, truncate_log=False)


def data_path(d):
    return [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".kvd")][0]


def test_open_after_a_power_cut_kept_a_new_home_copy_without_its_overflow_blocks(tmp_path, capfd):
    d = tmp_path / "d"
    d.mkdir()
    keys = [b"k%02d" % i for i in range(8)]
    store = Store(max_memory=0)
    df = open_df(d, store)
    df.start(None)
    for r in (1, 2):
        for k in keys:
            store.set(k, b"r%d-" % r + k * 2000)    # several blocks per bucket's chain
        df.sync()
    path = data_path(d)
    a = open(path, "rb").read()
    for k in keys:
        store.set(k, b"r3-" + k * 2000)
    df.sync()
    b = open(path, "rb").read()
    df.close()

    changed = [n for n in range(max(len(a), len(b)) // BLOCK) if a[n * BLOCK:(n + 1) * BLOCK] != b[n * BLOCK:(n + 1) * BLOCK]]
    homes = [n for n in changed if FIRST_HOME <= n < FIRST_HOME + 2]        # bucket 0's home copies
    assert len(homes) == 1 and any(n >= FIRST_HOME + 4 for n in changed), changed
    img = bytearray(a.ljust(len(b), b"\0"))
    img[homes[0] * BLOCK:(homes[0] + 1) * BLOCK] = b[homes[0] * BLOCK:(homes[0] + 1) * BLOCK]
    open(path, "wb").write(img)
    capfd.readouterr()

    store = Store(max_memory=0)
    df = open_df(d, store)                     # refused before: "block N belongs to block M ..."
    try:
        df.start(None)
        assert {k: store.get(k) for k in keys} == {k: b"r2-" + k * 2000 for k in keys}   # sweep 2's, synced
        assert "never recorded in the bucket table" in capfd.readouterr().err
        for k in keys:                         # the file goes on: sweeps over the bucket, a reopen
            store.set(k, b"r4-" + k * 2000)
        df.sync()
    finally:
        df.close()
    store = Store(max_memory=0)
    df = open_df(d, store)
    try:
        df.start(None)
        assert {k: store.get(k) for k in keys} == {k: b"r4-" + k * 2000 for k in keys}
        assert "never recorded" not in capfd.readouterr().err
    finally:
        df.close()


def test_the_bucket_tables_pages_are_allocated_at_open(tmp_path):
    # Both copies of every page of the bucket table are allocated when the file opens (new
    # or not), not left as holes of the sparse file until a sweep first writes them: that
    # first write comes after the sweep's chains are written and synced, and on a full
    # disk (ENOSPC) it failed the data file. 4096 buckets: 9 table pages, 18 blocks.
    d = tmp_path / "t"
    d.mkdir()
    store = Store(max_memory=0)
    df = durability.DataFile(store, str(d), buckets=4096, flush_interval_ms=600000, truncate_log=False)
    df.close()
    pages = (4096 + (BLOCK - 40) // 8 - 1) // ((BLOCK - 40) // 8)
    # (st_blocks counts fallocate's unwritten extents, which SEEK_HOLE reports as holes)
    allocated = os.stat(data_path(d)).st_blocks * 512
    assert allocated >= (1 + 2 * pages) * BLOCK, (allocated // BLOCK, 1 + 2 * pages)   # a superblock, the table
