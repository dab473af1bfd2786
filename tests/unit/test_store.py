"""kvstore.Store's Python API over the table: keys and values of any bytes-like type or
str/int encoded, the mapping protocol, and arguments checked before C is called. The
table's own behaviour (a dict model, memory, expiry, integers) is in test_table.py."""
import pytest

import kvstore
from kvstore import Store


def test_key_types_are_encoded():
    s = Store()
    s.set("text", "välue")
    s.set(42, 7)
    s[bytearray(b"ba")] = memoryview(b"mv")
    assert s[b"text"] == "välue".encode()
    assert s[b"42"] == b"7"
    assert s["ba"] == b"mv"
    with pytest.raises(KeyError):
        s[b"absent"]
    with pytest.raises(KeyError):
        del s[b"absent"]
    del s[42]
    assert 42 not in s
    with pytest.raises(TypeError):
        s.set(1.5, b"x")
    assert isinstance(kvstore.OutOfMemoryError("x"), MemoryError)


def test_invalid_arguments():
    with pytest.raises(kvstore.KVError):
        Store(max_memory=1000)  # below an empty table's own bucket arrays
    with pytest.raises(kvstore.ConfigError):
        Store(max_memory=-1)
    s = Store()
    with pytest.raises(kvstore.ConfigError):
        s.set(b"k", b"v", nx=True, xx=True)
    with pytest.raises(kvstore.ConfigError):
        s.set(b"k", b"v", ex=1, px=1000)
    with pytest.raises(kvstore.ConfigError):
        s.set(b"k", b"v", px=0)
    assert len(s) == 0


def test_string_read_of_a_hash_is_wrongtype():
    """A key written as a hash (type beside the value, as HSET stores it) is not a
    string: reading it as one raises WrongTypeError (Redis's WRONGTYPE), writing a
    string over it replaces it."""
    from kvstore import errors
    from kvstore._native import ffi, lib
    s = Store()
    assert lib.kvt_set(s._t, b"h", 1, b"\0\0\0\0", 4, 1 << 4, 0, ffi.NULL, ffi.NULL) == 1  # KVT_TYPE_HASH
    with pytest.raises(errors.WrongTypeError):
        s.get(b"h")
    with pytest.raises(errors.WrongTypeError):
        s.incr(b"h")
    s.set(b"h", b"v")
    assert s.get(b"h") == b"v"
