"""kvstore.Store: the in-process store, the same C table a server runs on.

The table is created and freed here through cffi (Store._t, which the server and the
durability code pass to C); the hot calls (get, set, delete, in, incr, mget, mset) are
kvstore._ext_store.StoreCore's typed Cython calls on the same table, the rest go through
cffi. Any thread may use a Store.
"""
import errno

from kvstore import _ext_store as _store, errors
from kvstore._cstruct import as_dict
from kvstore._native import ffi, lib

_b = _store.as_bytes
_store.bind_functions({name: int(ffi.cast("uintptr_t", ffi.addressof(lib, name))) for name in _store.FUNCTIONS})


class Store(_store.StoreCore):
    """An embedded key-value store: concurrent C hash table, bounded memory.

    Keys and values are bytes (str and int are encoded). ``max_memory`` bounds the
    bytes the table allocates (0 = unbounded); a write past it raises
    OutOfMemoryError and nothing is evicted. A Store can be served over RESP with
    ``kvstore.server.Server(store, ...)``; Python reads and writes keep working
    while it serves.

    ``mget(keys)`` and ``mset(mapping)`` read or write a batch with one call into C
    (see their docstrings).
    """

    def __init__(self, max_memory=0):
        if not isinstance(max_memory, int) or max_memory < 0:
            raise errors.ConfigError(f"max_memory must be a non-negative integer of bytes, got {max_memory!r}")
        out = ffi.new("struct kv_table **")
        errors.raise_for(lib.kvt_create(out, max_memory), "cannot create the table")
        self._t = ffi.gc(out[0], lib.kvt_destroy)  # owns the table; StoreCore borrows it
        self._bind(int(ffi.cast("uintptr_t", self._t)))

    def _op(self, fn, k, *args):
        """fn(table, key, klen, *args); with a data file behind the table, a key
        that left memory is loaded back, and a write that found memory full waits
        for the flusher (both blocking), then the call is repeated."""
        while True:
            rc = fn(self._t, k, len(k), *args)
            if rc == -errno.ENODATA:
                errors.raise_for(lib.kvt_load_sync(self._t, k, len(k)))
            elif rc != -errno.ENOMEM or lib.kvt_wait_memory(self._t) < 0:
                return rc

    # -- reads (get, mget and __contains__ are StoreCore's)
    def __getitem__(self, key):
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v

    def __len__(self):
        return lib.kvt_count(self._t)

    def strlen(self, key):
        k = _b(key)
        return errors.raise_for(self._op(lib.kvt_strlen, k))

    # -- writes (set, mset, delete and incr are StoreCore's)
    def __setitem__(self, key, value):
        self.set(key, value)

    def __delitem__(self, key):
        if not self.delete(key):
            raise KeyError(key)

    def decr(self, key, amount=1):
        return self.incr(key, -amount)

    def append(self, key, value):
        k, v = _b(key), _b(value, "value")
        return errors.raise_for(self._op(lib.kvt_append, k, v, len(v)))

    def flush(self):
        errors.raise_for(lib.kvt_flush(self._t))

    # -- memory and statistics
    @property
    def max_memory(self):
        return lib.kvt_max_memory(self._t)

    @max_memory.setter
    def max_memory(self, value):
        if not isinstance(value, int) or value < 0:
            raise errors.ConfigError(f"max_memory must be a non-negative integer of bytes, got {value!r}")
        lib.kvt_set_max_memory(self._t, value)

    @property
    def used_memory(self):
        return lib.kvt_used_memory(self._t)

    def stats(self):
        st = ffi.new("struct kvt_stats *")
        lib.kvt_get_stats(self._t, st)
        return as_dict(st)

    def housekeep(self, budget=1024):
        """Run rehash/expiry housekeeping over every shard (a served store does this itself)."""
        return lib.kvt_housekeep(self._t, 0, lib.KVT_SHARDS, budget)
