"""The data file's suites under each --datafile-io mode other than buffered (the default,
which the whole suite runs): crash and kill -9 (test_integrity's torn home write; test_bosc's
memory-full loads in uring-direct only, which takes both the ring and the O_DIRECT path),
damaged blocks, a full disk (test_disk_full: root), the sweep's coalesced I/O, and the C
stress tests of the data file under ASan (O_DIRECT only: the sanitizer builds have no
liburing). Each runs in a child pytest with KVSTORE_TEST_DATAFILE_IO set (bosc_io.c's test
hook: every data file of a process in that mode), which test_datafile_io's forced-mode test
checks took effect."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
MODES = {"direct": 1, "uring": 2, "uring-direct": 3}
SUITES = ["tests/unit/test_datafile_io.py", "tests/unit/test_datafile_sweep_io.py", "tests/unit/test_datafile_buckets.py",
          "tests/faults/test_integrity.py", "tests/faults/test_disk_full.py"]
# test_bosc's memory-full loads (evictions and loads back under writes, kill -9 while writes
# wait, a sweep forced by a large write) once, in the mode that takes both other paths (the
# ring and the O_DIRECT descriptor): the suite stays within its time budget
BOSC = "tests/faults/test_bosc.py::"
WHOLE = {"uring-direct": [BOSC + "test_memory_full_writes_wait_and_evicted_keys_read_back",
                          BOSC + "test_kill9_while_writes_wait_for_a_slow_log_the_data_file_stays_behind_it",
                          BOSC + "test_a_large_write_into_memory_full_of_dirty_keys_forces_a_sweep"]}
CHECK = "PASSED tests/unit/test_datafile_io.py::test_the_forced_mode_is_in_effect"

pytestmark = pytest.mark.slow


def run_suites(mode, *args):
    env = dict(os.environ, KVSTORE_TEST_DATAFILE_IO=str(MODES[mode]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *args], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, f"--datafile-io {mode}:\n" + r.stdout[-6000:] + r.stderr[-2000:]
    return r.stdout


@pytest.mark.parametrize("mode", MODES)
def test_the_data_files_suites_pass_in_each_mode(mode):
    out = run_suites(mode, *SUITES, *WHOLE.get(mode, []))
    assert CHECK in out, out[-3000:]


def test_the_data_files_c_stress_tests_pass_with_o_direct():
    # the ASan/UBSan builds: O_DIRECT changes the data file's I/O (aligned buffers, lengths),
    # which is what they check; the TSan builds' races are the same in every mode
    run_suites("direct", "tests/c/test_c_sanitizers.py", "-k", "bosc and asan")
