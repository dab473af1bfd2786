"""kvstore.Store (the C table behind every front end) against a dict model.

Two Hypothesis state machines: an unbounded store, where every operation's result is
predicted exactly, and a store with a small max_memory, where writes may be refused
(OutOfMemoryError) but a refused write must change nothing and nothing is ever
evicted. Plain tests cover expiry, the Redis integer rules of INCR, a large value and
use from several Python threads at once (cffi releases the GIL around C calls).
Store's own Python API (key types, argument checks) is in test_store.py.
"""
import ctypes
import ctypes.util
import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kvstore import IntegerOverflowError, NotAnIntegerError, OutOfMemoryError, Store

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
SHARDS, INITIAL_BUCKETS = 256, 4
ENTRY_HEADER = 40  # sizeof(struct kvt_entry) in ext/table.c: a lower bound of any entry


def _usable_size_of_empty_bucket_array():
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.calloc.restype = ctypes.c_void_p
    libc.calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    libc.malloc_usable_size.restype = ctypes.c_size_t
    libc.malloc_usable_size.argtypes = [ctypes.c_void_p]
    libc.free.argtypes = [ctypes.c_void_p]
    # The smallest of many: one probe may land in a chunk 16 bytes larger than the smallest
    # fit (the heap's history decides; shared libraries' constructors, DPDK's among them, change it).
    ps = [libc.calloc(INITIAL_BUCKETS, 8) for _ in range(64)]
    try:
        return min(libc.malloc_usable_size(p) for p in ps)
    finally:
        for p in ps:
            libc.free(p)


# An empty table holds exactly one 4-bucket array per shard, charged at its
# malloc_usable_size. glibc may hand a 32-byte request a chunk up to 16 bytes larger
# than the smallest fit (when splitting would leave less than a minimum chunk), so the
# exact figure depends on the heap's history: a fresh Store in this process measures
# anything in this range, as does a flushed one.
EMPTY_MIN = SHARDS * _usable_size_of_empty_bucket_array()
EMPTY_MAX = EMPTY_MIN + SHARDS * 16


def assert_empty_memory(store):
    st_ = store.stats()
    assert st_["keys"] == 0 and len(store) == 0
    assert st_["buckets"] == SHARDS * INITIAL_BUCKETS
    assert st_["rehashing"] == 0
    assert EMPTY_MIN <= st_["used_memory"] <= EMPTY_MAX, (st_["used_memory"], EMPTY_MIN, EMPTY_MAX)


def redis_int(v):
    """Redis string2ll: optional '-', no '+', no leading zeros or spaces, int64 range."""
    if len(v) > 20 or not re.fullmatch(rb"0|-?[1-9][0-9]*", v):
        return None
    n = int(v)
    return n if INT64_MIN <= n <= INT64_MAX else None


def compact(store, rounds=200):
    """Housekeep until no shard is rehashing and no shard wants to shrink."""
    for _ in range(rounds):
        before = store.stats()
        store.housekeep(1 << 16)
        after = store.stats()
        if after["rehashing"] == 0 and before["rehashing"] == 0 and after["buckets"] == before["buckets"]:
            return after
    raise AssertionError(f"housekeeping did not converge: {store.stats()}")


# ---------------------------------------------------------------- strategies

SMALL_KEYS = [b"a", b"b", b"c", b"ab", b"ba", b"", b"\x00", b"\xff\x00", b"k1", b"10"]
keys = st.one_of(
    st.sampled_from(SMALL_KEYS),
    st.sampled_from(SMALL_KEYS),
    st.binary(max_size=16),
    st.integers(0, 2999).map(lambda i: b"bulk:%d" % i),
)
int_values = st.one_of(st.integers(-1000, 1000), st.integers(INT64_MIN, INT64_MAX),
                       st.sampled_from([INT64_MIN, INT64_MIN + 1, INT64_MAX, INT64_MAX - 1, 0])
                       ).map(lambda i: str(i).encode())
values = st.one_of(
    st.binary(max_size=40),
    int_values,
    st.sampled_from([b"-0", b"+1", b" 1", b"1 ", b"01", b"1.5", b"9223372036854775808",
                     b"-9223372036854775809", b"", b"0"]),
    st.builds(lambda c, n: bytes([c]) * n, st.integers(0, 255), st.integers(100, 3000)),
)
amounts = st.one_of(st.integers(-10, 10), st.integers(INT64_MIN, INT64_MAX),
                    st.sampled_from([INT64_MIN, INT64_MAX, 1, -1]))


class StoreMachine(RuleBasedStateMachine):
    """Unbounded store: every result is predicted by the dict model."""

    def __init__(self):
        super().__init__()
        self.store = Store()
        self.model = {}
        assert_empty_memory(self.store)

    # -- writes
    @rule(k=keys, v=values, mode=st.sampled_from([None, "nx", "xx"]))
    def set(self, k, v, mode):
        expected = not ((mode == "nx" and k in self.model) or (mode == "xx" and k not in self.model))
        assert self.store.set(k, v, nx=mode == "nx", xx=mode == "xx") is expected
        if expected:
            self.model[k] = v

    @rule(k=keys, v=values)
    def setitem(self, k, v):
        self.store[k] = v
        self.model[k] = v

    @rule(k=keys)
    def delete(self, k):
        assert self.store.delete(k) == (1 if k in self.model else 0)
        self.model.pop(k, None)

    @rule(k=keys, amount=amounts)
    def incr(self, k, amount):
        cur = redis_int(self.model.get(k, b"0"))
        if cur is None:
            with pytest.raises(NotAnIntegerError):
                self.store.incr(k, amount)
            return
        if not INT64_MIN <= cur + amount <= INT64_MAX:
            with pytest.raises(IntegerOverflowError):
                self.store.incr(k, amount)
            return
        assert self.store.incr(k, amount) == cur + amount
        self.model[k] = str(cur + amount).encode()

    @rule(k=keys, amount=st.integers(-5, 5))
    def decr(self, k, amount):
        cur = redis_int(self.model.get(k, b"0"))
        if cur is None:
            with pytest.raises(NotAnIntegerError):
                self.store.decr(k, amount)
            return
        if not INT64_MIN <= cur - amount <= INT64_MAX:
            with pytest.raises(IntegerOverflowError):
                self.store.decr(k, amount)
            return
        assert self.store.decr(k, amount) == cur - amount
        self.model[k] = str(cur - amount).encode()

    @rule(k=keys, v=values)
    def append(self, k, v):
        new = self.model.get(k, b"") + v
        assert self.store.append(k, v) == len(new)
        self.model[k] = new

    @rule()
    def flush(self):
        self.store.flush()
        self.model.clear()
        assert_empty_memory(self.store)

    @rule(n=st.integers(100, 3000), vlen=st.integers(0, 64), tag=st.integers(0, 9))
    def bulk_set(self, n, vlen, tag):
        """Enough keys to grow many shards (1024 buckets in all at the start)."""
        for i in range(n):
            k = b"bulk:%d" % i
            v = (b"%d:%d:" % (tag, i)) + b"v" * vlen
            self.store.set(k, v)
            self.model[k] = v

    @rule(step=st.integers(1, 4), keep_small=st.booleans())
    def bulk_delete(self, step, keep_small):
        doomed = [k for i, k in enumerate(sorted(self.model)) if i % step == 0
                  and not (keep_small and k in SMALL_KEYS)]
        for k in doomed:
            assert self.store.delete(k) == 1
            del self.model[k]

    # -- reads
    @rule(k=keys)
    def get(self, k):
        assert self.store.get(k) == self.model.get(k)

    @rule(k=keys)
    def contains(self, k):
        assert (k in self.store) == (k in self.model)

    @rule(k=keys)
    def strlen(self, k):
        assert self.store.strlen(k) == len(self.model.get(k, b""))

    @rule()
    def check_all(self):
        for k, v in self.model.items():
            assert self.store.get(k) == v, k

    # -- housekeeping (shrinks tables that emptied, advances rehashes)
    @rule(budget=st.sampled_from([1, 16, 1024]), times=st.integers(1, 20))
    def housekeep(self, budget, times):
        for _ in range(times):
            assert self.store.housekeep(budget) == 0  # no key has a TTL here

    @rule()
    def compact(self):
        compact(self.store)
        if not self.model:
            assert_empty_memory(self.store)
        self.check_all()

    # -- invariants
    @invariant()
    def sizes_agree(self):
        assert len(self.store) == len(self.model)
        st_ = self.store.stats()
        assert st_["keys"] == len(self.model)
        assert st_["expires"] == 0
        assert st_["used_memory"] >= EMPTY_MIN
        assert st_["used_memory"] >= EMPTY_MIN + ENTRY_HEADER * len(self.model)
        assert st_["max_memory"] == 0

    def teardown(self):
        self.check_all()
        self.store.flush()
        assert_empty_memory(self.store)


TestStoreModel = StoreMachine.TestCase
TestStoreModel.settings = settings(max_examples=150, stateful_step_count=50, deadline=None,
                                   suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- bounded store

MAX_MEMORY = 200_000
SLACK = 128  # malloc_usable_size may exceed a request by a little; never by this much

bounded_values = st.one_of(
    st.binary(max_size=24),
    int_values,
    st.builds(lambda c, n: bytes([c]) * n, st.integers(0, 255), st.integers(500, 40000)),
)


class BoundedStoreMachine(RuleBasedStateMachine):
    """max_memory = 200 KB: a write may be refused, but then nothing changed; a write
    with room to spare is never refused; nothing is evicted; deletes always work."""

    def __init__(self):
        super().__init__()
        self.store = Store(max_memory=MAX_MEMORY)
        self.model = {}
        self.ooms = 0

    def _write(self, op, room_needed, apply):
        """Run op(); on success apply(result) to the model. room_needed: an upper bound
        of the bytes the write may allocate."""
        used = self.store.used_memory
        rejected = self.store.stats()["oom_rejections"]
        try:
            result = op()
        except OutOfMemoryError:
            self.ooms += 1
            assert used + room_needed > MAX_MEMORY, ("refused with room to spare", used, room_needed)
            assert self.store.stats()["oom_rejections"] == rejected + 1
            self.check_all()  # nothing half-written, nothing evicted
            return
        assert self.store.stats()["oom_rejections"] == rejected
        apply(result)

    @rule(k=keys, v=bounded_values, mode=st.sampled_from([None, None, "nx", "xx"]))
    def set(self, k, v, mode):
        expected = not ((mode == "nx" and k in self.model) or (mode == "xx" and k not in self.model))

        def apply(r):
            assert r is expected
            if expected:
                self.model[k] = v
        self._write(lambda: self.store.set(k, v, nx=mode == "nx", xx=mode == "xx"),
                    ENTRY_HEADER + len(k) + len(v) + SLACK, apply)

    @rule(k=keys, c=st.integers(0, 255), n=st.integers(5000, 60000))
    def set_big(self, k, c, n):
        self.set(k, bytes([c]) * n, None)

    @rule(k=keys, c=st.integers(0, 255), n=st.integers(1000, 30000))
    def append_big(self, k, c, n):
        self.append(k, bytes([c]) * n)

    @rule(k=keys, v=bounded_values)
    def append(self, k, v):
        old = self.model.get(k, b"")

        def apply(r):
            assert r == len(old) + len(v)
            self.model[k] = old + v
        # growth keeps room for as much again (amortized appends)
        self._write(lambda: self.store.append(k, v),
                    ENTRY_HEADER + len(k) + 2 * (len(old) + len(v)) + SLACK, apply)

    @rule(k=keys, amount=amounts)
    def incr(self, k, amount):
        cur = redis_int(self.model.get(k, b"0"))
        if cur is None:
            with pytest.raises(NotAnIntegerError):
                self.store.incr(k, amount)
            return
        if not INT64_MIN <= cur + amount <= INT64_MAX:
            with pytest.raises(IntegerOverflowError):
                self.store.incr(k, amount)
            return

        def apply(r):
            assert r == cur + amount
            self.model[k] = str(r).encode()
        self._write(lambda: self.store.incr(k, amount), ENTRY_HEADER + len(k) + 20 + SLACK, apply)

    @rule(n=st.integers(50, 1500), vlen=st.integers(0, 400))
    def fill(self, n, vlen):
        """Write until the bound refuses (and a little past it)."""
        refused = 0
        for i in range(n):
            k, v = b"bulk:%d" % i, b"f" * vlen
            try:
                self.store.set(k, v)
            except OutOfMemoryError:
                refused += 1
                if refused > 20:
                    break
                continue
            self.model[k] = v
        self.check_all()

    @rule(k=keys)
    def delete(self, k):
        before = self.store.used_memory
        if k in self.model:
            assert self.store.delete(k) == 1
            del self.model[k]
            assert self.store.used_memory < before
        else:
            assert self.store.delete(k) == 0

    @rule(step=st.integers(1, 3))
    def delete_many(self, step):
        for i, k in enumerate(sorted(self.model)):
            if i % step == 0:
                before = self.store.used_memory
                assert self.store.delete(k) == 1
                assert self.store.used_memory < before
                del self.model[k]

    @rule()
    def flush(self):
        self.store.flush()
        self.model.clear()
        assert_empty_memory(self.store)

    @rule(times=st.integers(1, 10))
    def housekeep(self, times):
        for _ in range(times):
            self.store.housekeep(256)

    @rule(k=keys)
    def get(self, k):
        assert self.store.get(k) == self.model.get(k)
        assert self.store.strlen(k) == len(self.model.get(k, b""))
        assert (k in self.store) == (k in self.model)

    @rule()
    def check_all(self):
        assert len(self.store) == len(self.model)
        for k, v in self.model.items():
            assert self.store.get(k) == v, k

    @invariant()
    def bounded(self):
        st_ = self.store.stats()
        assert st_["max_memory"] == MAX_MEMORY
        assert 0 < st_["used_memory"] <= MAX_MEMORY
        assert st_["keys"] == len(self.model) == len(self.store)

    def teardown(self):
        self.check_all()


TestBoundedStoreModel = BoundedStoreMachine.TestCase
TestBoundedStoreModel.settings = settings(max_examples=150, stateful_step_count=50, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])


def test_bounded_store_refuses_then_recovers():
    """Deterministic: fill to the bound, see refusals, delete, write again."""
    s = Store(max_memory=MAX_MEMORY)
    written = []
    with pytest.raises(OutOfMemoryError):
        for i in range(10_000):
            s.set(b"k%d" % i, b"x" * 1000)
            written.append(b"k%d" % i)
    assert 100 < len(written) < 200
    assert s.used_memory <= MAX_MEMORY
    assert len(s) == len(written)
    assert s.stats()["oom_rejections"] == 1
    # an in-place overwrite needs no memory and still works at the bound
    s.set(written[0], b"y" * 1000)
    assert s.get(written[0]) == b"y" * 1000
    for k in written[:10]:
        assert s.delete(k) == 1
    s.set(b"new", b"z" * 1000)
    assert s.get(b"new") == b"z" * 1000
    assert all(s.get(k) == b"x" * 1000 for k in written[10:])


def test_lowered_max_memory_refuses_writes_but_allows_deletes():
    s = Store()
    for i in range(500):
        s.set(i, b"v" * 200)
    s.max_memory = s.used_memory // 2
    with pytest.raises(OutOfMemoryError):
        s.set(b"new", b"v" * 200)
    assert b"new" not in s
    for i in range(500):
        assert s.delete(i) == 1
    assert len(s) == 0
    s.set(b"new", b"v" * 200)
    assert s.get(b"new") == b"v" * 200


FLUSH_AFTER_LOWERING = textwrap.dedent("""
    import kvstore
    s = kvstore.Store()
    for i in range(100):
        s.set(i, b"x" * 100)
    s.max_memory = 20000      # below what is in use (about 26 KB), above an empty table
    s.flush()                 # FLUSHALL must always work: it only frees memory
    assert len(s) == 0, len(s)
    print("used", s.used_memory)
""")


def test_flush_after_lowering_max_memory_below_usage():
    """CONFIG SET maxmemory below the current usage, then FLUSHALL: the flush must
    succeed (Redis allows both). Run in a child process: the failure mode is abort()."""
    r = subprocess.run([sys.executable, "-c", FLUSH_AFTER_LOWERING], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"


def test_fresh_store_memory_is_an_empty_table():
    s = Store()
    assert_empty_memory(s)
    s.flush()
    assert_empty_memory(s)


def test_memory_returns_to_empty_after_deletes_and_housekeeping():
    s = Store()
    for i in range(20_000):
        s.set(b"key:%d" % i, b"v" * (i % 50))
    grown = s.stats()
    assert grown["buckets"] >= 20_000
    for i in range(20_000):
        assert s.delete(b"key:%d" % i) == 1
    compact(s)
    assert_empty_memory(s)


# ---------------------------------------------------------------- expiry

def test_expire_px():
    s = Store()
    assert s.set(b"k", b"v", px=50)
    assert s.set(b"forever", b"v")
    assert s.stats()["expires"] == 1
    time.sleep(0.4)
    assert s.get(b"k") is None
    assert b"k" not in s
    assert s.strlen(b"k") == 0
    assert s.delete(b"k") == 0
    assert s.get(b"forever") == b"v"
    assert s.stats()["expires"] == 0


def test_expire_ex_and_housekeeping_reclaims():
    s = Store()
    for i in range(300):
        assert s.set(b"t%d" % i, b"v", ex=0.05)
    for i in range(50):
        assert s.set(b"p%d" % i, b"v", ex=3600)
    time.sleep(0.4)
    assert len(s) == 350  # counted until reclaimed
    reclaimed = 0
    for _ in range(100):
        reclaimed += s.housekeep(1024)
        if len(s) == 50:
            break
    assert reclaimed == 300
    assert len(s) == 50
    st_ = s.stats()
    assert st_["expires"] == 50 and st_["expired_keys"] == 300
    assert all(s.get(b"p%d" % i) == b"v" for i in range(50))


def test_expired_key_is_absent_for_every_operation():
    s = Store()
    for name in ("nx", "xx", "incr", "append"):
        s.set(name, b"41", px=30)
    time.sleep(0.3)
    assert s.set("nx", b"new", nx=True) is True
    assert s.get("nx") == b"new"
    assert s.set("xx", b"new", xx=True) is False
    assert "xx" not in s
    assert s.incr("incr") == 1
    assert s.append("append", b"ab") == 2


def test_set_without_ttl_clears_ttl_and_keepttl_keeps_it():
    # The TTL only has to outlast these few calls (a loaded machine may stall them for a
    # while: a key that expired before its KEEPTTL SET would lose the TTL for a good reason).
    s = Store()
    s.set(b"plain", b"v1", px=1000)
    s.set(b"plain", b"v2")                   # SET without KEEPTTL drops the TTL
    s.set(b"keep", b"v1", px=1000)
    s.set(b"keep", b"v2", keepttl=True)      # KEEPTTL keeps it
    s.set(b"incr", b"1", px=1000)
    s.incr(b"incr")                          # INCR keeps the TTL
    s.set(b"app", b"a", px=1000)
    s.append(b"app", b"b" * 100)             # APPEND keeps the TTL (even when reallocated)
    assert s.stats()["expires"] == 3
    time.sleep(1.2)
    assert s.get(b"plain") == b"v2"
    assert s.get(b"keep") is None
    assert s.get(b"incr") is None
    assert s.get(b"app") is None


# ---------------------------------------------------------------- integers

@pytest.mark.parametrize("value", [b"-0", b"+1", b" 1", b"1 ", b"01", b"00", b"", b"-", b"1.5", b"0x10",
                                   b"1e3", b"\x001", b"1\x00", b"9223372036854775808",
                                   b"-9223372036854775809", b"12345678901234567890",
                                   b"000000000000000000001", b"--1", b"abc"])
def test_incr_rejects_non_integers(value):
    s = Store()
    s.set(b"k", value)
    with pytest.raises(NotAnIntegerError):
        s.incr(b"k")
    with pytest.raises(NotAnIntegerError):
        s.decr(b"k")
    assert s.get(b"k") == value


@pytest.mark.parametrize("value,amount,result", [
    (b"0", 1, 1), (b"-1", 1, 0), (b"1", -1, 0), (b"10", 5, 15),
    (b"9223372036854775806", 1, INT64_MAX), (b"-9223372036854775807", -1, INT64_MIN),
    (b"-9223372036854775808", 1, INT64_MIN + 1), (b"9223372036854775807", -1, INT64_MAX - 1),
    (b"9223372036854775807", INT64_MIN, -1), (b"-9223372036854775808", INT64_MAX, -1),
    (None, INT64_MAX, INT64_MAX), (None, INT64_MIN, INT64_MIN), (b"123", 0, 123),
])
def test_incr_values(value, amount, result):
    s = Store()
    if value is not None:
        s.set(b"k", value)
    assert s.incr(b"k", amount) == result
    assert s.get(b"k") == str(result).encode()


@pytest.mark.parametrize("value,amount", [
    (b"9223372036854775807", 1), (b"-9223372036854775808", -1),
    (b"9223372036854775807", INT64_MAX), (b"-9223372036854775808", INT64_MIN),
    (b"1", INT64_MAX), (b"-2", INT64_MIN + 1), (b"-1", INT64_MIN),
])
def test_incr_overflow(value, amount):
    s = Store()
    s.set(b"k", value)
    with pytest.raises(IntegerOverflowError):
        s.incr(b"k", amount)
    assert s.get(b"k") == value


def test_decr_min_overflows():
    s = Store()
    s.set(b"k", b"-9223372036854775808")
    with pytest.raises(IntegerOverflowError):
        s.decr(b"k")
    s.set(b"m", b"9223372036854775807")
    with pytest.raises(IntegerOverflowError):
        s.incr(b"m")
    assert s.get(b"k") == b"-9223372036854775808"


def test_incr_on_grown_value_and_after_append():
    s = Store()
    s.set(b"k", b"1" * 200)  # large block, not an integer
    with pytest.raises(NotAnIntegerError):
        s.incr(b"k")
    s.set(b"k", b"7")
    s.append(b"k", b"00")
    assert s.incr(b"k") == 701
    s.append(b"k", b"x")
    with pytest.raises(NotAnIntegerError):
        s.incr(b"k")


# ---------------------------------------------------------------- large values, threads

def test_ten_megabyte_value():
    s = Store()
    big = bytes(range(256)) * (10 * 1024 * 1024 // 256)
    base = s.used_memory
    assert s.set(b"big", big)
    assert s.used_memory >= base + len(big)
    assert s.get(b"big") == big
    assert s.strlen(b"big") == len(big)
    assert s.append(b"big", b"!") == len(big) + 1
    assert s.get(b"big") == big + b"!"
    s.set(b"big", b"small")
    assert s.get(b"big") == b"small"
    assert s.used_memory < base + 1024 * 1024
    assert s.delete(b"big") == 1
    assert s.used_memory == base


def test_threads_with_disjoint_keys():
    s = Store()
    n_threads, n_keys = 4, 4000
    errors = []
    stop = threading.Event()

    def worker(t):
        try:
            for i in range(n_keys):
                k = b"t%d:%d" % (t, i)
                assert s.set(k, b"v%d" % i)
                assert s.get(k) == b"v%d" % i
                if i % 3 == 0:
                    assert s.incr(b"t%d:counter" % t) == i // 3 + 1
                if i % 5 == 0:
                    s.append(k, b"+")
                if i % 7 == 0:
                    assert s.delete(k) == 1
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append((t, e))

    def housekeeper():
        try:
            while not stop.is_set():
                s.housekeep(64)
                s.stats()
        except BaseException as e:  # noqa: BLE001
            errors.append(("housekeeper", e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    hk = threading.Thread(target=housekeeper)
    hk.start()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    stop.set()
    hk.join()
    assert not errors, errors
    expected = {}
    for t in range(n_threads):
        expected[b"t%d:counter" % t] = str((n_keys - 1) // 3 + 1).encode()
        for i in range(n_keys):
            if i % 7:
                expected[b"t%d:%d" % (t, i)] = b"v%d" % i + (b"+" if i % 5 == 0 else b"")
    assert len(s) == len(expected)
    for k, v in expected.items():
        assert s.get(k) == v, k
    s.flush()
    assert_empty_memory(s)
