"""--datafile-io (ext/durability/bosc_io.c, bosc_uring.c): each mode of the sweep's I/O takes
effect (an O_DIRECT descriptor of the file, an io_uring instance) and a sweep's blocks read
back whole after a reopen in every mode, also when the file was written in another mode.
In-process (a Store and its DataFile, as in the server); the data file's fault suites run
under each mode in tests/faults/test_datafile_io_modes.py."""
import os
import random

import pytest

from kvstore import Store, durability
from kvstore.config import ServerConfig

MODES = ["buffered", "direct", "uring", "uring-direct"]
O_DIRECT = os.O_DIRECT


def open_files():
    """(path the fd points at, its open flags) for this process's descriptors."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
            with open(f"/proc/self/fdinfo/{fd}") as f:
                flags = int(next(line for line in f if line.startswith("flags:")).split()[1], 8)
        except (OSError, StopIteration):
            continue
        out.append((link, flags))
    return out


def datafile(tmp_path, io):
    store = Store(max_memory=0)
    df = durability.DataFile(store, str(tmp_path), buckets=256, flush_interval_ms=600000, truncate_log=False, io=io)
    return store, df


FORCED = os.environ.get("KVSTORE_TEST_DATAFILE_IO")  # the test hook (bosc_io.c): every data file in that mode


@pytest.fixture(autouse=True)
def no_forced_mode(request, monkeypatch):
    if request.node.name != "test_the_forced_mode_is_in_effect":
        monkeypatch.delenv("KVSTORE_TEST_DATAFILE_IO", raising=False)


def in_effect(path):
    """(an O_DIRECT descriptor of path is open, an io_uring instance is open) in this process."""
    files = open_files()
    return (any(p == path and f & O_DIRECT for p, f in files), any("io_uring" in p for p, _ in files))


@pytest.mark.skipif(not FORCED, reason="only when the fault suites run under a forced mode "
                                       "(tests/faults/test_datafile_io_modes.py)")
def test_the_forced_mode_is_in_effect(tmp_path):
    """What test_datafile_io_modes checks ran: a data file opened as buffered is in the forced mode."""
    store, df = datafile(tmp_path, "buffered")
    try:
        mode = int(FORCED)
        assert in_effect(durability.data_file(str(tmp_path))) == (bool(mode & 1), bool(mode & 2))
    finally:
        df.close()


def test_the_setting_offers_each_mode_and_defaults_to_buffered():
    assert ServerConfig().datafile_io == "buffered"
    for m in MODES:
        assert ServerConfig(datafile_io=m).validate().datafile_io == m


@pytest.mark.parametrize("io", MODES)
def test_each_mode_opens_what_it_names(tmp_path, io):
    path = durability.data_file(str(tmp_path))
    store, df = datafile(tmp_path, io)
    try:
        assert in_effect(path) == ("direct" in io, "uring" in io), open_files()
    finally:
        df.close()
    assert not any("io_uring" in p for p, _ in open_files())  # closed with the file


@pytest.mark.parametrize("first,then", [(m, m) for m in MODES] + [("buffered", "uring-direct"),
                                                                  ("uring-direct", "buffered")])
def test_a_sweep_in_each_mode_reads_back_after_a_reopen(tmp_path, first, then):
    rnd = random.Random(7)
    store, df = datafile(tmp_path, first)
    df.start(None)
    want = {}
    try:
        for rnd_no in range(3):  # chains rewritten over each other: both home copies, freed blocks reused
            for i in range(3000):
                k = b"k%05d" % rnd.randrange(5000)
                want[k] = bytes([65 + rnd_no]) * rnd.choice([10, 85, 300, 5000]) + k
                store.set(k, want[k])
            df.sync()
        st = df.stats()
        assert st["blocks_written"] > st["write_calls"] > 0
    finally:
        df.close()
    store, df = datafile(tmp_path, then)
    df.start(None)
    try:
        for k, v in want.items():
            assert store.get(k) == v, k
        assert df.stats()["loads"] >= len(want)  # read from the file, not memory
    finally:
        df.close()
