"""A sweep of the data file settles its keys a chunk of buckets at a time
(ext/durability/bosc_sweep.c, --sweep-chunk-pct): after each chunk it syncs the chains
written, records them (home copies, bucket table, superblock with the flushed LSN
unchanged), frees the blocks they dropped and marks their keys clean; the flusher then
evicts and wakes the writers waiting for room, who so wait for one chunk, not for the
whole sweep. In-process (a Store and its DataFile, as in the server), no server, no
timing: the counts depend on the keys and the memory bound only."""
from kvstore import Store, durability

MB = 1 << 20


def open_df(tmp_path, store, **kw):
    return durability.DataFile(store, str(tmp_path), buckets=1024, flush_interval_ms=600000, truncate_log=False,
                               **kw)


def values(n):
    return {b"c%06d" % i: b"%06d." % i * 10 for i in range(n)}


def written(tmp_path, store, pct, vals):
    """Start a data file behind store, write vals through it; its stats after."""
    df = open_df(tmp_path, store, sweep_chunk_pct=pct)
    df.start(None)
    try:
        for k, v in vals.items():
            store.set(k, v)
        return df, df.stats()
    except BaseException:
        df.close()
        raise


def assert_reopened_holds(tmp_path, vals):
    """The file opened again on a new table holds exactly vals."""
    store = Store(max_memory=0)
    df = open_df(tmp_path, store)
    try:
        assert df.info["disk_keys"] == len(vals)
        df.start(None)
        wrong = [k for k, v in vals.items() if store.get(k) != v]
        assert not wrong, wrong[:5]
    finally:
        df.close()


def test_one_sweep_settles_in_chunks_and_what_it_wrote_reads_back_after_a_reopen(tmp_path):
    # 20,000 dirty keys (a few MB), far below the 64 MB bound: no pressure, one sweep when asked
    store, vals = Store(max_memory=64 * MB), values(20000)
    df, before = written(tmp_path, store, 1, vals)
    try:
        df.sync()
        after = df.stats()
        for i, k in enumerate(list(vals)):  # a second sweep: every chain rewritten, some shrink
            if i % 3 == 0:
                store.delete(k)
                del vals[k]
            elif i % 3 == 1:
                vals[k] = vals[k][:7]
                store.set(k, vals[k])
        df.sync()
    finally:
        df.close()
    assert after["records"] - before["records"] == 20000, (before, after)
    # 1 % of 64 MB is a few thousand keys: the sweep settled several chunks before its end
    # (before: the whole sweep was one, and the counter did not exist)
    assert after["sweep_chunks"] - before["sweep_chunks"] >= 2, (before, after)
    assert b"c000000" not in vals  # deleted (i % 3 == 0)
    assert_reopened_holds(tmp_path, vals)


def test_writers_waiting_for_room_get_it_from_a_chunk_before_the_sweep_ends(tmp_path):
    """Three times the 8 MB bound of new keys, written by one writer that blocks whenever
    memory is full: every sweep starts with most of memory dirty (tens of thousands of
    keys, ~40 chunks of 2 %), so its first chunk is settled while memory is past the
    high mark (or the writer waits): the keys it settled are evicted then, before the
    sweep's end. Before chunks, keys were evicted only after a whole sweep."""
    store, vals = Store(max_memory=8 * MB), values(120000)
    df, st = written(tmp_path, store, 2, vals)
    try:
        assert st["evicted"] > 0, st
        assert st["chunk_evicted"] > 0, st
        assert st["sweep_chunks"] > 0, st
        wrong = [k for k, v in list(vals.items())[::97] if store.get(k) != v]  # loaded back from blocks
        assert not wrong, wrong[:5]
        df.sync()
    finally:
        df.close()
    assert_reopened_holds(tmp_path, vals)


def test_chunks_off_is_one_chunk_per_sweep(tmp_path):
    store = Store(max_memory=64 * MB)  # (referenced: the table must outlive its data file)
    df, _ = written(tmp_path, store, 0, values(20000))
    try:
        df.sync()
        st = df.stats()
    finally:
        df.close()
    assert st["records"] == 20000 and st["sweep_chunks"] == 0, st


def test_a_sweep_that_writes_no_chain_does_not_sync_the_file(tmp_path):
    # Keys written and deleted before any sweep never reached their blocks (absorbed
    # inserts): the sweep takes them, writes nothing, and has nothing to sync. Without a
    # log no superblock is due either. (Each chunk synced, written or not: a chunk of such
    # keys cost a sync for nothing.)
    store = Store(max_memory=64 * MB)
    df = open_df(tmp_path, store, sweep_chunk_pct=1)
    df.start(None)
    try:
        df.sync()
        for i in range(5000):
            store.set(b"gone%05d" % i, b"x" * 50)
        for i in range(5000):
            store.delete(b"gone%05d" % i)
        before = df.stats()
        df.sync()
        after = df.stats()
        assert after["sweeps"] > before["sweeps"] and after["blocks_written"] == before["blocks_written"]
        assert after["syncs"] == before["syncs"], (before["syncs"], after["syncs"])
    finally:
        df.close()


def test_keys_read_lately_stay_in_memory_when_a_chunk_evicts(tmp_path):
    # Memory 85 % full of dirty keys, a fiftieth of them read (their recently-used bit
    # set), then a write that needs 16 % more: the writer waits for room, each chunk of
    # the sweep (half of memory here) evicts the clean keys it settled. It must pass over
    # the keys read lately, as the clock does, and evict no further than the low mark:
    # they are still in memory after (a GET of them loads nothing).
    store = Store(max_memory=16 * MB)
    df = open_df(tmp_path, store, sweep_chunk_pct=50)
    df.start(None)
    try:
        n = 0
        while store.stats()["used_memory"] < 0.85 * 16 * MB:
            store.set(b"k%07d" % n, b"x" * 100)
            n += 1
        hot = [b"k%07d" % i for i in range(0, n, 50)]
        for k in hot:
            assert store.get(k) == b"x" * 100
        store.set(b"big", b"y" * (16 * MB * 16 // 100))   # (the low mark, 25 %, still has room for hot)
        df.sync()
        assert df.stats()["evicted"] > n // 2               # (the eviction happened)
        loads = df.stats()["loads"]
        for k in hot:
            assert store.get(k) == b"x" * 100
        assert df.stats()["loads"] - loads < len(hot) // 10, (df.stats()["loads"] - loads, len(hot))
    finally:
        df.close()
