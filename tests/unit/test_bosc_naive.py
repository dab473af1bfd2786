"""The naive baseline of the BOSC experiment (ext/bench/bosc_naive.c): its file is written in
full before the clock starts, as BOSC's data file is, so each naive update overwrites an
allocated block instead of allocating one in a sparse file."""
import os

from kvstore._bench import lib

BLK = 4096


def test_the_naive_file_is_allocated_in_full_not_sparse(tmp_path):
    path = tmp_path / "naive.dat"
    buckets = 1024
    s = lib.bosc_bench_naive(str(path).encode(), buckets, 20, 85, 1)
    assert s > 0
    st = os.stat(path)
    assert st.st_size == buckets * BLK
    # st_blocks counts 512-byte units actually allocated: a sparse file (ftruncate, 20
    # updates into 1,024 blocks) would hold about 20 of its 1,024 blocks
    assert st.st_blocks * 512 >= st.st_size

