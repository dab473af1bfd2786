"""A new data file's bucket count follows the memory bound (--data-buckets 0, the
default): a sweep rewrites each dirty bucket's chain, so too few buckets for the
file means long chains rewritten for a few records, and the user should not have
to tune it to get many records per block written."""
from kvstore import Store, durability


def open_file(tmp_path, max_memory, **kw):
    tmp_path.mkdir(exist_ok=True)
    store = Store(max_memory=max_memory)
    df = durability.DataFile(store, str(tmp_path), flush_interval_ms=600000, truncate_log=False, **kw)
    df.start(None)
    try:
        return df.info["buckets"]
    finally:
        df.close()


def test_a_new_data_file_has_a_bucket_per_4_kib_of_memory(tmp_path):
    assert open_file(tmp_path / "a", 1 << 30) == (1 << 30) // 4096
    assert open_file(tmp_path / "b", 0) == durability.AUTO_BUCKETS_MIN  # unbounded memory: the floor
    assert open_file(tmp_path / "c", 64 << 20) == durability.AUTO_BUCKETS_MIN


def test_an_explicit_count_and_an_existing_file_keep_theirs(tmp_path):
    assert open_file(tmp_path, 1 << 30, buckets=1024) == 1024
    assert open_file(tmp_path, 1 << 30) == 1024  # the file keeps its own
