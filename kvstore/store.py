"""kvstore.Store: the in-process store, the same C table a server runs on."""
import errno
import time

from kvstore import errors
from kvstore._native import ffi, lib

NX, XX, KEEPTTL = 1, 2, 4


def _b(x, what="key"):
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode()
    if isinstance(x, (bytearray, memoryview)):
        return bytes(x)
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x).encode()
    raise TypeError(f"{what} must be bytes, str or int, not {type(x).__name__}")


class Store:
    """An embedded key-value store: concurrent C hash table, bounded memory.

    Keys and values are bytes (str and int are encoded). ``max_memory`` bounds the
    bytes the table allocates (0 = unbounded); a write past it raises
    OutOfMemoryError and nothing is evicted. A Store can be served over RESP with
    ``kvstore.server.Server(store, ...)``; Python reads and writes keep working
    while it serves.
    """

    def __init__(self, max_memory=0):
        if not isinstance(max_memory, int) or max_memory < 0:
            raise errors.ConfigError(f"max_memory must be a non-negative integer of bytes, got {max_memory!r}")
        out = ffi.new("struct kv_table **")
        errors.raise_for(lib.kvt_create(out, max_memory), "cannot create the table")
        self._t = ffi.gc(out[0], lib.kvt_destroy)

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

    # -- reads
    def get(self, key, default=None):
        k = _b(key)
        cap = 256
        while True:
            buf = ffi.new("char[]", cap)
            n = self._op(lib.kvt_get_copy, k, buf, cap)
            if n == -errno.ENOENT:
                return default
            if n <= cap:
                return ffi.buffer(buf, n)[:]
            cap = n  # value larger than the buffer: retry with its size

    def __getitem__(self, key):
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v

    def __contains__(self, key):
        k = _b(key)
        return bool(errors.raise_for(self._op(lib.kvt_exists, k)))

    def __len__(self):
        return lib.kvt_count(self._t)

    def strlen(self, key):
        k = _b(key)
        return errors.raise_for(self._op(lib.kvt_strlen, k))

    # -- writes
    def set(self, key, value, *, nx=False, xx=False, ex=None, px=None, keepttl=False):
        """Set key to value. Returns True if set, False if NX/XX prevented it."""
        if nx and xx:
            raise errors.ConfigError("nx and xx are mutually exclusive")
        if (ex is not None) + (px is not None) + bool(keepttl) > 1:
            raise errors.ConfigError("use at most one of ex, px and keepttl")
        k, v = _b(key), _b(value, "value")
        expire = 0
        if ex is not None or px is not None:
            ms = int(ex * 1000) if ex is not None else int(px)
            if ms <= 0:
                raise errors.ConfigError(f"expire time must be positive, got {ex if ex is not None else px!r}")
            expire = int(time.time() * 1000) + ms
        flags = (NX if nx else 0) | (XX if xx else 0) | (KEEPTTL if keepttl else 0)
        rc = self._op(lib.kvt_set, k, v, len(v), flags, expire, ffi.NULL, ffi.NULL)
        errors.raise_for(rc)
        return rc == 1

    def __setitem__(self, key, value):
        self.set(key, value)

    def delete(self, *keys):
        n = 0
        for key in keys:
            k = _b(key)
            n += errors.raise_for(self._op(lib.kvt_del, k))
        return n

    def __delitem__(self, key):
        if not self.delete(key):
            raise KeyError(key)

    def incr(self, key, amount=1):
        k = _b(key)
        out = ffi.new("int64_t *")
        rc = self._op(lib.kvt_incrby, k, int(amount), out)
        if rc == -errno.EINVAL:
            raise errors.NotAnIntegerError(f"value of {key!r} is not an integer or out of range")
        if rc == -errno.ERANGE:
            raise errors.IntegerOverflowError("increment or decrement would overflow")
        errors.raise_for(rc)
        return out[0]

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
        return self.stats()["max_memory"]

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
        return {f: getattr(st, f) for f in ("keys", "expires", "used_memory", "max_memory", "buckets",
                                            "rehashing", "expired_keys", "oom_rejections", "hits", "misses")}

    def housekeep(self, budget=1024):
        """Run rehash/expiry housekeeping over every shard (a served store does this itself)."""
        return lib.kvt_housekeep(self._t, 0, 256, budget)
