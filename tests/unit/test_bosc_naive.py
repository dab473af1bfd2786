"""The naive baseline of the BOSC experiment (ext/bench/bosc_naive.c): its file is written in
full before the clock starts, so each naive update overwrites an
allocated block instead of allocating one in a sparse file."""
import os
import shutil
import subprocess

import pytest

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



def _extents(path):
    """filefrag -v's extent lines of path (None where filefrag or its FIEMAP is missing)."""
    if not shutil.which("filefrag"):
        return None
    r = subprocess.run(["filefrag", "-v", str(path)], capture_output=True, text=True)
    if r.returncode or "FIEMAP" in r.stderr:
        return None
    return [ln for ln in r.stdout.splitlines() if ln.strip()[:1].isdigit() and ":" in ln]


def test_the_naive_file_is_written_not_unwritten_extents(tmp_path):
    """st_blocks also counts fallocate's unwritten extents, whose first write converts the
    extent (a journal commit charged to the naive update): the extents must be written."""
    path = tmp_path / "naive.dat"
    assert lib.bosc_bench_naive(str(path).encode(), 1024, 20, 85, 1) > 0
    ext = _extents(path)
    if ext is None:
        pytest.skip("filefrag -v (FIEMAP) is not available here")
    assert ext, "no extent: the file is sparse"
    assert not [e for e in ext if "unwritten" in e], ext
