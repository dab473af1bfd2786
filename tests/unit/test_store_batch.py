"""Store.mget / Store.mset (kvstore/_ext_store.pyx): the batch calls against the single
ones and a dict model, their edge cases (missing keys, wrong types, the memory bound,
values larger than any internal buffer, empty keys and values), a Store served over
RESP seen from redis-py, and the spill-mode retries (keys evicted to a data file are
loaded back) that every Cython call must keep.
"""
import threading

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstore import NotAnIntegerError, OutOfMemoryError, Server, Store


def encoded(x):
    """The bytes a key or value stands for (Store's documented rule)."""
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode()
    return str(x).encode()


keys = st.one_of(st.binary(max_size=12), st.text(max_size=6), st.integers(-1000, 1000))
values = st.one_of(st.binary(max_size=600), st.text(max_size=40), st.integers())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs=st.lists(st.tuples(keys, values), max_size=40), extra=st.lists(keys, max_size=10),
       as_dict=st.booleans())
def test_mset_then_mget_matches_single_calls_and_a_dict(pairs, extra, as_dict):
    batch, single, model = Store(), Store(), {}
    batch.mset(dict(pairs) if as_dict else pairs)
    for k, v in (dict(pairs).items() if as_dict else pairs):
        single.set(k, v)
        model[encoded(k)] = encoded(v)
    asked = [k for k, _ in pairs] + extra
    expect = [model.get(encoded(k)) for k in asked]
    assert batch.mget(asked) == expect
    assert single.mget(asked) == expect
    assert [batch.get(k) for k in asked] == expect
    assert len(batch) == len(single) == len(model)


def test_mget_missing_keys_are_none_and_order_is_kept():
    s = Store()
    s.mset([(b"a", b"1"), (b"c", b"3")])
    assert s.mget([b"c", b"b", b"a", b"b"]) == [b"3", None, b"1", None]
    assert s.mget([]) == []
    assert s.mget(iter([b"a"])) == [b"1"]  # any iterable


def test_mset_forms_and_last_value_wins():
    s = Store()
    assert s.mset({b"a": b"1", "b": "2", 3: 4}) is True
    assert s.mset([(b"d", b"x"), [b"e", b"y"], (b"d", b"z")]) is True  # pairs, a key given twice
    assert s.mset(((b"f", bytearray(b"ba")), (memoryview(b"mv"), b"m"))) is True
    assert s.mset({}) is True
    assert s.mset([b"gh"]) is True  # a pair is whatever unpacks to two items, as for dict(): 103 -> 104
    assert s.get(103) == b"104"
    assert s.mget([b"a", b"b", b"3", b"d", b"e", b"f", b"mv"]) == [b"1", b"2", b"4", b"z", b"y", b"ba", b"m"]


def test_mset_removes_the_expire_time_as_redis():
    s = Store()
    s.set(b"k", b"old", ex=100)
    s.mset({b"k": b"new"})
    assert s.stats()["expires"] == 0 and s.get(b"k") == b"new"


@pytest.mark.parametrize("call, message", [
    (lambda s: s.mget([b"a", 1.5]), "key must be bytes, str or int, not float"),
    (lambda s: s.mget([None]), "key must be bytes, str or int, not NoneType"),
    (lambda s: s.mget([True]), "key must be bytes, str or int, not bool"),
    (lambda s: s.mset({b"a": b"1", b"b": None}), "value must be bytes, str or int, not NoneType"),
    (lambda s: s.mset({b"a": b"1", 2.0: b"x"}), "key must be bytes, str or int, not float"),
    (lambda s: s.mset([(b"a", b"1"), (b"b", b"2", b"3")]),
     "mset takes a mapping or (key, value) pairs, item 1 is (b'b', b'2', b'3')"),
    (lambda s: s.mset([(b"a", b"1"), 7]), "mset takes a mapping or (key, value) pairs, item 1 is 7"),
])
def test_wrong_types_are_refused_before_anything_is_set(call, message):
    s = Store()
    with pytest.raises(TypeError) as e:
        call(s)
    assert str(e.value) == message
    assert len(s) == 0  # mset checks every pair first: the good ones before the bad were not set


def test_type_error_texts_are_those_of_the_single_calls():
    s = Store()
    for bad in (1.5, None, True, object()):
        with pytest.raises(TypeError) as single:
            s.get(bad)
        with pytest.raises(TypeError) as batch:
            s.mget([bad])
        assert str(single.value) == str(batch.value)
        with pytest.raises(TypeError) as single:
            s.set(b"k", bad)
        with pytest.raises(TypeError) as batch:
            s.mset({b"k": bad})
        assert str(single.value) == str(batch.value)


def test_mset_over_the_memory_bound_sets_nothing():
    s = Store(max_memory=256 * 1024)
    s.set(b"before", b"x")
    used = s.used_memory
    big = {b"k%d" % i: b"v" * 4096 for i in range(100)}  # ~400 KiB
    with pytest.raises(OutOfMemoryError):
        s.mset(big)
    assert s.used_memory == used and len(s) == 1
    assert s.mget(list(big)) == [None] * 100
    assert s.mset({b"k%d" % i: b"v" * 4096 for i in range(10)}) is True  # a batch that fits
    assert len(s) == 11
    with pytest.raises(OutOfMemoryError):  # single sets still stop at the bound
        for k, v in big.items():
            s.set(k, v)


def test_values_larger_than_any_internal_buffer():
    s = Store()
    mib = 1 << 20
    big1, big2 = bytes(range(256)) * (mib // 256), b"\xff" * (mib + 1)
    s.mset({b"big1": big1, b"small": b"s", b"big2": big2})
    for _ in range(2):  # the second time with the buffer the first batch left
        assert s.mget([b"big1", b"small", b"nope", b"big2", b"big1"]) == [big1, b"s", None, big2, big1]
    assert s.get(b"big1") == big1 and s.get(b"big2") == big2
    assert s.mget([b"small"] * 3) == [b"s"] * 3
    # around the single get's buffer size
    for n in (511, 512, 513, 4096):
        s.set(b"n", b"q" * n)
        assert s.get(b"n") == b"q" * n and s.mget([b"n"]) == [b"q" * n]


def test_empty_key_and_empty_value():
    s = Store()
    s.mset({b"": b"", b"e": b""})
    assert s.mget([b"", b"e", b"missing"]) == [b"", b"", None]
    assert s.get(b"") == b"" and s.get("e") == b"" and b"" in s
    assert s.delete(b"") == 1 and s.mget([b""]) == [None]


def test_threads_batching_on_one_store():
    """Batches run without the GIL and share one buffer per Store when they can: several
    threads at once must each get their own values (sizes vary so buffers grow)."""
    s = Store()
    failures = []

    def worker(t):
        try:
            for it in range(60):
                kv = {b"t%d:%d" % (t, i): (b"%d:%d:" % (t, it)) * (1 + (i * it) % 3000) for i in range(50)}
                s.mset(kv)
                assert s.mget(list(kv)) == list(kv.values())
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failures.append((t, e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures, failures


def test_a_served_store_and_redis_py_see_the_same_keys():
    s = Store()
    with Server(s, port=0, bind="127.0.0.1", durability="none") as srv:
        r = redis.Redis(port=srv.port)
        s.mset({b"py:%d" % i: b"v%d" % i for i in range(100)})
        s.set(b"py:one", b"1")
        assert r.mget([b"py:%d" % i for i in range(100)]) == [b"v%d" % i for i in range(100)]
        assert r.get(b"py:one") == b"1"
        r.mset({b"r:%d" % i: b"w%d" % i for i in range(100)})
        r.set(b"r:n", 41)
        assert s.mget([b"r:%d" % i for i in range(100)] + [b"nope"]) == [b"w%d" % i for i in range(100)] + [None]
        assert s.incr(b"r:n") == 42 and r.get(b"r:n") == b"42"
        assert s.delete(b"r:0", b"py:0") == 2 and r.exists(b"r:0", b"py:0") == 0
        r.close()


@pytest.mark.slow
def test_batches_and_single_calls_load_evicted_keys_back(tmp_path):
    """Spill mode: with a data file and a small bound, writes wait for the flusher and
    read keys that left memory are loaded back (the -ENODATA and -ENOMEM retries)."""
    with Server(port=0, bind="127.0.0.1", data_dir=str(tmp_path), durability="none", data_file=True, max_memory="256kb",
                flush_interval_ms=50, data_buckets=1024) as srv:
        s = srv.store
        n = 3000
        model = {b"e:%d" % i: b"%d:" % i * 40 for i in range(n)}  # ~1 MB of values: most must leave memory
        items = list(model.items())
        for i in range(0, n, 100):
            s.mset(items[i:i + 100])  # each batch waits for room when memory is full
        for i in range(n, n + 200):
            assert s.set(b"e:%d" % i, b"single")  # single writes wait too
            model[b"e:%d" % i] = b"single"
        assert srv.durability.datafile.stats()["evicted"] > 0
        loads = srv.durability.datafile.stats()["loads"]
        ks = list(model)
        assert s.mget(ks) == list(model.values())
        assert srv.durability.datafile.stats()["loads"] > loads, "mget loaded no key back: were none evicted?"
        # single calls on keys that left memory again
        for i in range(0, n, 97):
            k = b"e:%d" % i
            assert s.get(k) == model[k] and k in s
            assert s.set(k, b"nx", nx=True) is False  # NX must look in the block
        with pytest.raises(NotAnIntegerError):
            s.incr(b"e:2")
        assert s.delete(*[b"e:%d" % i for i in range(1, n, 101)]) == len(range(1, n, 101))
