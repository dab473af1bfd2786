"""A writer that needs more memory than the room left below the flusher's high mark
(ext/durability/bosc_flusher.c): memory is mostly clean keys (swept), under the high
mark, and one value needs more than what is left of --max-memory. The writer blocks in
bosc_make_room; the flusher must evict clean keys for it (a writer waiting counts as
one asking for room), not only run empty sweeps and wake it to fail again forever.
In-process (a Store and its DataFile), run in a child process so that a writer waiting
forever fails the test instead of hanging it."""
import subprocess
import sys

SCRIPT = r"""
import sys, threading
from kvstore import Store, durability
MB = 1 << 20
store = Store(max_memory=4 * MB)
df = durability.DataFile(store, sys.argv[1], buckets=1024, flush_interval_ms=600000, truncate_log=False)
df.start(None)
i = 0
while store.stats()["used_memory"] <= 0.68 * 4 * MB:   # clean keys, under the high mark (90 %)
    store.set(b"k%07d" % i, b"x" * 100)
    i += 1
    if i % 2000 == 0:
        df.sync()
df.sync()
used = store.stats()["used_memory"]
assert used < 0.9 * 4 * MB, used
done = []
def big():   # needs 40 % of the bound: more than the room left, less than what evicting frees
    store.set(b"big", b"y" * int(0.40 * 4 * MB))
    done.append(1)
t = threading.Thread(target=big, daemon=True)
t.start()
t.join(30)
print("keys", i, "used before", used, "evicted", df.stats()["evicted"], "sweeps", df.stats()["sweeps"],
      "big written" if done else "big STILL WAITING", flush=True)
if done:
    assert store.get(b"big") == b"y" * int(0.40 * 4 * MB)
    df.close()
import os
os._exit(0 if done else 3)
"""


def test_a_writer_needing_more_than_the_room_below_the_high_mark_gets_it(tmp_path):
    try:
        p = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the child hung: {e.stdout!r} {e.stderr!r}")
    assert p.returncode == 0 and "big written" in p.stdout, (p.returncode, p.stdout, p.stderr[-2000:])
