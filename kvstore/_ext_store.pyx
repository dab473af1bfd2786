# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The fast path of kvstore.Store: get, set, delete, in, incr and the batches mget/mset,
typed calls into the C table (ext/core/table.h) instead of cffi wrappers.

Store (kvstore/store.py) creates, owns and frees the table through cffi (ffi.gc on
Store._t, which the server and durability code use); StoreCore only borrows its
address, and both live on the same object, so the pointer is valid whenever a method
can run (a method running without the GIL holds a reference to self). Any Python
thread may call any method. Keys and values are opaque bytes; nothing is parsed.

The GIL: single calls keep it. An uncontended call (hash, shard lock, copy) costs about
100-200 ns, about what dropping and retaking the GIL costs; and with another Python
thread runnable, retaking it can wait a whole switch interval (5 ms), which would make
a 200 ns get a 5 ms one. Keeping it never blocks a C thread: table calls only take a
shard lock, which C threads hold briefly and never while waiting for Python. Batches
(mget, mset) and every wait that may do disk I/O (loading a key back, waiting for room)
release it: there the release is paid once for many keys, or is small next to the wait.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_Check, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.errno cimport E2BIG, EINVAL, ENODATA, ENOENT, ENOMEM, ERANGE
from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memset

from kvstore._table cimport *

import time

from kvstore import errors

# The table functions called here; kvstore.store binds them from the cffi lib.
FUNCTIONS = ("kvt_get_copy", "kvt_set", "kvt_del", "kvt_exists", "kvt_incrby", "kvt_load_sync",
             "kvt_wait_memory", "kvt_used_memory", "kvt_max_memory")

cdef struct kvs_fns:
    kvs_get_copy_fn get_copy
    kvs_set_fn set
    kvs_del_fn del_
    kvs_exists_fn exists
    kvs_incrby_fn incrby
    kvs_load_sync_fn load_sync
    kvs_wait_memory_fn wait_memory
    kvs_used_memory_fn used_memory
    kvs_max_memory_fn max_memory

cdef kvs_fns fn
cdef bint fn_bound = False


def bind_functions(addresses):
    """Set the table functions: addresses maps every name of FUNCTIONS to the function's
    address as an int (int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))). Called once,
    at import of kvstore.store, before any StoreCore is bound."""
    global fn_bound
    fn.get_copy = <kvs_get_copy_fn><uintptr_t>addresses["kvt_get_copy"]
    fn.set = <kvs_set_fn><uintptr_t>addresses["kvt_set"]
    fn.del_ = <kvs_del_fn><uintptr_t>addresses["kvt_del"]
    fn.exists = <kvs_exists_fn><uintptr_t>addresses["kvt_exists"]
    fn.incrby = <kvs_incrby_fn><uintptr_t>addresses["kvt_incrby"]
    fn.load_sync = <kvs_load_sync_fn><uintptr_t>addresses["kvt_load_sync"]
    fn.wait_memory = <kvs_wait_memory_fn><uintptr_t>addresses["kvt_wait_memory"]
    fn.used_memory = <kvs_used_memory_fn><uintptr_t>addresses["kvt_used_memory"]
    fn.max_memory = <kvs_max_memory_fn><uintptr_t>addresses["kvt_max_memory"]
    fn_bound = True


cpdef bytes as_bytes(object x, str what="key"):
    """The bytes a key or value stands for: bytes as is, str as UTF-8, bytearray and
    memoryview copied, int as its decimal digits; anything else is a TypeError. The
    one statement of these rules (Store's cffi calls use it too)."""
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode()
    if isinstance(x, (bytearray, memoryview)):
        return bytes(x)
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x).encode()
    raise TypeError(f"{what} must be bytes, str or int, not {type(x).__name__}")


cdef inline object _view(object x, const char **p, Py_ssize_t *n, str what):
    """Point *p, *n at the bytes x stands for (as_bytes) and return the object holding
    them, which the caller keeps alive while it uses *p. bytes and exact str cost no copy
    (a str's UTF-8 form is cached in it; for ASCII it is the str's own data)."""
    if PyBytes_Check(x):
        p[0] = PyBytes_AS_STRING(x)
        n[0] = PyBytes_GET_SIZE(x)
        return x
    if type(x) is str:
        p[0] = PyUnicode_AsUTF8AndSize(x, n)
        return x
    x = as_bytes(x, what)
    p[0] = PyBytes_AS_STRING(x)
    n[0] = PyBytes_GET_SIZE(x)
    return x


# One key (and, for mset, value) of a batch.
cdef struct kvs_item:
    const char *k
    Py_ssize_t kl
    const char *v
    Py_ssize_t vl
    int64_t off    # mget: where the value starts in the buffer
    int64_t vlen   # mget: its length, -1 when the key is missing


cdef int64_t _mget_nogil(kv_table *t, kvs_item *it, Py_ssize_t n, char **bufp, size_t *capp) noexcept nogil:
    """Copy the values of it[0..n) one after another into *bufp (*capp bytes, grown with
    realloc when a value does not fit; *bufp and *capp are updated) and set it[i].off and
    .vlen. A key that left memory is loaded back (blocking) and read again. Returns 0, 1
    when the buffer could not grow, or a negative code of the table."""
    cdef char *buf = bufp[0]
    cdef char *nb
    cdef size_t cap = capp[0], used = 0, want
    cdef int64_t r
    cdef int lr
    cdef Py_ssize_t i = 0
    while i < n:
        r = fn.get_copy(t, it[i].k, it[i].kl, buf + used, cap - used)
        if r == -ENOENT:
            it[i].vlen = -1
        elif r == -ENODATA:
            lr = fn.load_sync(t, it[i].k, it[i].kl)
            if lr < 0:
                return lr
            continue
        elif r < 0:
            return r
        elif <size_t>r > cap - used:
            want = cap * 2 if cap * 2 >= used + <size_t>r else used + <size_t>r
            nb = <char *>realloc(buf, want)
            if nb == NULL:
                return 1
            buf, cap = nb, want
            bufp[0], capp[0] = buf, cap
            continue  # read it again: the value may have changed meanwhile
        else:
            it[i].off = used
            it[i].vlen = r
            used += <size_t>r
        i += 1
    return 0


cdef int _mset_room(kv_table *t, uint64_t need) noexcept nogil:
    """As the server's MSET: the memory bound is checked once for the whole batch, so
    that a batch is never half applied because memory ran out halfway. With a data file
    attached, waits for the flusher to make room (unless the batch is over a quarter of
    the bound: waiting could not make room for it). Returns 0 or -ENOMEM."""
    cdef uint64_t bound
    while True:
        bound = fn.max_memory(t)  # two loads, where kvt_get_stats would lock every shard
        if bound == 0 or fn.used_memory(t) + need <= bound:
            return 0
        if need > bound // 4 or fn.wait_memory(t) < 0:
            return -ENOMEM


cdef int _mset_nogil(kv_table *t, kvs_item *it, Py_ssize_t n) noexcept nogil:
    """Set it[i].k to it[i].v for every item, past the memory bound (checked by
    _mset_room). Returns 0 or the first negative code (the items before it are set: only
    the durability log can refuse a write here)."""
    cdef int rc
    cdef Py_ssize_t i = 0
    while i < n:
        rc = fn.set(t, it[i].k, it[i].kl, it[i].v, it[i].vl, KVT_NOBOUND, 0, NULL, NULL)
        if rc == -ENODATA:  # a plain set writes blind; kept as Store._op's rule in case that changes
            rc = fn.load_sync(t, it[i].k, it[i].kl)
            if rc < 0:
                return rc
            continue
        if rc < 0:
            return rc
        i += 1
    return 0


cdef enum:
    SMALL = 512              # single get: values up to this size are read into StoreCore.small
    BATCH_BUF = 64 * 1024    # mget: the buffer's first size ...
    BATCH_KEEP = 4 << 20     # ... and the most a Store keeps between calls


cdef class StoreCore:
    """The C half of kvstore.Store (see kvstore/store.py for the public documentation)."""
    cdef kv_table *t            # borrowed: Store._t (cffi, ffi.gc) owns it
    cdef char small[SMALL]      # get's buffer; used only while the GIL is held
    cdef char *batch            # mget's buffer, reused between calls (malloc'ed)
    cdef size_t batch_cap
    cdef bint batch_busy        # an mget (GIL released) is using batch: others use their own

    def __dealloc__(self):
        free(self.batch)

    def _bind(self, uintptr_t table):
        """Borrow the table at this address (Store.__init__, once)."""
        if not fn_bound:
            raise RuntimeError("kvstore._ext_store.bind_functions was not called")
        self.t = <kv_table *>table

    cdef inline int _check(self) except -1:
        if self.t == NULL:
            raise RuntimeError("Store.__init__ was not called")
        return 0

    cdef int _again(self, int64_t rc, const char *k, Py_ssize_t kl) except -1:
        """Store._op's rule after a call returned rc: 1 = call again (a key that left memory
        was loaded back; a write refused by the bound waited for the flusher to make room),
        0 = rc is the answer. Both waits block on the disk: the GIL is released."""
        cdef int r
        if rc == -ENODATA:
            with nogil:
                r = fn.load_sync(self.t, k, kl)
            errors.raise_for(r)
            return 1
        if rc == -ENOMEM:
            with nogil:
                r = fn.wait_memory(self.t)
            return r >= 0
        return 0

    # -- reads
    def get(self, key, default=None):
        """The value of key as bytes, or default when it is absent."""
        cdef const char *k
        cdef Py_ssize_t kl
        cdef int64_t n, m
        self._check()
        own = _view(key, &k, &kl, "key")
        while True:
            n = fn.get_copy(self.t, k, kl, self.small, SMALL)
            if n == -ENOENT:
                return default
            if n < 0:
                if not self._again(n, k, kl):
                    errors.raise_for(n)
                continue
            if n <= SMALL:
                return PyBytes_FromStringAndSize(self.small, n)
            # larger: read it straight into a bytes object of its size (one copy)
            v = PyBytes_FromStringAndSize(NULL, n)
            m = fn.get_copy(self.t, k, kl, PyBytes_AS_STRING(v), n)
            if m == n:
                return v
            # it changed, went away or left memory between the two calls: start over

    def mget(self, keys):
        """The values of keys, in order, as a list: bytes, or None for a missing key (as
        redis-py's mget). keys: any iterable of keys; their types are checked before any
        is read. Crosses into C once for the whole batch, without the GIL; not a snapshot:
        writes from other threads may land between two keys."""
        cdef Py_ssize_t i, n
        cdef kvs_item *it
        cdef char *buf = NULL
        cdef size_t cap = 0
        cdef int64_t rc
        cdef bint mine = False
        self._check()
        ks = list(keys)  # holds every key (and converted ones) while the GIL is released
        n = len(ks)
        if n == 0:
            return []
        it = <kvs_item *>PyMem_Malloc(n * sizeof(kvs_item))
        if it == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                x = ks[i]
                own = _view(x, &it[i].k, &it[i].kl, "key")
                if own is not x:
                    ks[i] = own
            # Claim the Store's buffer; no Python code runs between the test and the claim,
            # so two threads cannot both take it.
            if not self.batch_busy:
                mine = self.batch_busy = True
                if self.batch == NULL:
                    self.batch = <char *>malloc(BATCH_BUF)
                    self.batch_cap = BATCH_BUF if self.batch != NULL else 0
                buf, cap = self.batch, self.batch_cap
            else:
                buf = <char *>malloc(BATCH_BUF)
                cap = BATCH_BUF if buf != NULL else 0
            if buf == NULL:
                raise MemoryError()
            with nogil:
                rc = _mget_nogil(self.t, it, n, &buf, &cap)
            if rc == 1:
                raise MemoryError()
            errors.raise_for(rc)
            out = [None] * n
            for i in range(n):
                if it[i].vlen >= 0:
                    out[i] = PyBytes_FromStringAndSize(buf + it[i].off, it[i].vlen)
            return out
        finally:
            PyMem_Free(it)
            if mine:
                if cap > BATCH_KEEP:  # a batch of big values: do not keep its buffer
                    free(buf)
                    buf, cap = NULL, 0
                self.batch, self.batch_cap = buf, cap
                self.batch_busy = False
            else:
                free(buf)

    def __contains__(self, key):
        cdef const char *k
        cdef Py_ssize_t kl
        cdef int rc
        self._check()
        own = _view(key, &k, &kl, "key")
        while True:
            rc = fn.exists(self.t, k, kl)
            if rc >= 0 or not self._again(rc, k, kl):
                break
        return bool(errors.raise_for(rc))

    # -- writes
    def set(self, key, value, *, nx=False, xx=False, ex=None, px=None, keepttl=False):
        """Set key to value. Returns True if set, False if NX/XX prevented it.

        nx: only if absent; xx: only if present; ex / px: expire after this many seconds /
        milliseconds; keepttl: keep the key's expire time. OutOfMemoryError past max_memory
        (nothing is evicted), TooLargeError for a key or value over 512 MiB."""
        cdef const char *k
        cdef const char *v
        cdef Py_ssize_t kl, vl
        cdef int64_t expire = 0
        cdef int flags, rc
        self._check()
        if nx and xx:
            raise errors.ConfigError("nx and xx are mutually exclusive")
        if (ex is not None) + (px is not None) + (1 if keepttl else 0) > 1:
            raise errors.ConfigError("use at most one of ex, px and keepttl")
        kown = _view(key, &k, &kl, "key")
        vown = _view(value, &v, &vl, "value")
        if ex is not None or px is not None:
            ms = int(ex * 1000) if ex is not None else int(px)
            if ms <= 0:
                raise errors.ConfigError(f"expire time must be positive, got {ex if ex is not None else px!r}")
            expire = int(time.time() * 1000) + ms
        flags = (KVT_NX if nx else 0) | (KVT_XX if xx else 0) | (KVT_KEEPTTL if keepttl else 0)
        while True:
            rc = fn.set(self.t, k, kl, v, vl, flags, expire, NULL, NULL)
            if rc >= 0 or not self._again(rc, k, kl):
                break
        errors.raise_for(rc)
        return rc == 1

    def mset(self, mapping):
        """Set every key of mapping (a dict or any object with .items(), or an iterable of
        (key, value) pairs) to its value, as Redis MSET: no NX/XX, any expire time
        removed, a key given twice gets its last value. Returns True (as redis-py).

        Every key and value is checked before anything is set (TypeError, TooLargeError),
        and the memory bound once for the whole batch: OutOfMemoryError then sets nothing.
        Crosses into C once, without the GIL; not atomic for readers in other threads."""
        cdef Py_ssize_t i, n
        cdef kvs_item *it
        cdef uint64_t need = 0
        cdef int rc
        self._check()
        items = list(mapping.items()) if hasattr(mapping, "items") else list(mapping)
        n = len(items)
        if n == 0:
            return True
        hold = []  # converted keys and values, alive while the GIL is released
        it = <kvs_item *>PyMem_Malloc(n * sizeof(kvs_item))
        if it == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                pair = items[i]
                if type(pair) is not tuple or len(<tuple>pair) != 2:
                    try:
                        k, v = pair
                    except (TypeError, ValueError):
                        raise TypeError(f"mset takes a mapping or (key, value) pairs, item {i} is {pair!r}") from None
                    pair = items[i] = (k, v)  # a tuple of our own holds them
                x = _view((<tuple>pair)[0], &it[i].k, &it[i].kl, "key")
                if x is not (<tuple>pair)[0]:
                    hold.append(x)
                x = _view((<tuple>pair)[1], &it[i].v, &it[i].vl, "value")
                if x is not (<tuple>pair)[1]:
                    hold.append(x)
                if <size_t>it[i].kl > KVT_MAX_VALUE or <size_t>it[i].vl > KVT_MAX_VALUE:
                    errors.raise_for(-E2BIG)
                need += <uint64_t>(it[i].kl + it[i].vl + 64)  # the server's estimate per pair
            with nogil:
                rc = _mset_room(self.t, need)
                if rc == 0:
                    rc = _mset_nogil(self.t, it, n)
            errors.raise_for(rc)
            return True
        finally:
            PyMem_Free(it)

    def delete(self, *keys):
        """Delete keys; returns how many existed."""
        cdef const char *k
        cdef Py_ssize_t kl
        cdef int rc
        cdef int64_t count = 0
        self._check()
        for key in keys:
            own = _view(key, &k, &kl, "key")
            while True:
                rc = fn.del_(self.t, k, kl)
                if rc >= 0 or not self._again(rc, k, kl):
                    break
            count += errors.raise_for(rc)
        return count

    def incr(self, key, amount=1):
        """Add amount to the decimal integer at key (absent = 0); returns the new value."""
        cdef const char *k
        cdef Py_ssize_t kl
        cdef int rc
        cdef int64_t delta, result = 0
        self._check()
        own = _view(key, &k, &kl, "key")
        delta = int(amount)
        while True:
            rc = fn.incrby(self.t, k, kl, delta, &result)
            if rc >= 0 or not self._again(rc, k, kl):
                break
        if rc == -EINVAL:
            raise errors.NotAnIntegerError(f"value of {key!r} is not an integer or out of range")
        if rc == -ERANGE:
            raise errors.IntegerOverflowError("increment or decrement would overflow")
        errors.raise_for(rc)
        return result
