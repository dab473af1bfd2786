# Declarations from ext/core/table.h for kvstore/_ext_store.pyx (the Cython fast path of Store).
#
# The table's code is linked once, into the cffi module kvstore._ext, with hidden
# visibility: this module cannot link against kvt_* symbols. It calls them through
# function pointers that kvstore/store.py takes from the cffi lib at import (one copy
# of the table code, one per-process SipHash key). The pointer types are derived in C
# from the header's own prototypes (__typeof__, never evaluated, so no symbol is
# referenced): a prototype changed in table.h changes them too, and a call made
# here with arguments that no longer fit fails to compile.
from libc.stdint cimport int64_t, uint64_t

cdef extern from "core/table.h" nogil:
    struct kv_table
    enum:
        KVT_NX
        KVT_XX
        KVT_KEEPTTL
        KVT_NOBOUND
        KVT_MAX_VALUE
    ctypedef void (*kvt_read_fn)(void *arg, const char *val, size_t vlen)

cdef extern from *:
    """
    #include "core/table.h"
    typedef __typeof__(&kvt_get_copy) kvs_get_copy_fn;
    typedef __typeof__(&kvt_set) kvs_set_fn;
    typedef __typeof__(&kvt_del) kvs_del_fn;
    typedef __typeof__(&kvt_exists) kvs_exists_fn;
    typedef __typeof__(&kvt_incrby) kvs_incrby_fn;
    typedef __typeof__(&kvt_load_sync) kvs_load_sync_fn;
    typedef __typeof__(&kvt_wait_memory) kvs_wait_memory_fn;
    typedef __typeof__(&kvt_used_memory) kvs_used_memory_fn;
    typedef __typeof__(&kvt_max_memory) kvs_max_memory_fn;
    """
    # Cython's view of the same types (what it checks the .pyx's calls against)
    ctypedef int64_t (*kvs_get_copy_fn)(kv_table *t, const void *key, size_t klen, void *buf,
                                        size_t cap) noexcept nogil
    ctypedef int (*kvs_set_fn)(kv_table *t, const void *key, size_t klen, const void *val, size_t vlen,
                               int flags, int64_t expire_ms, kvt_read_fn old_fn, void *old_arg) noexcept nogil
    ctypedef int (*kvs_del_fn)(kv_table *t, const void *key, size_t klen) noexcept nogil
    ctypedef int (*kvs_exists_fn)(kv_table *t, const void *key, size_t klen) noexcept nogil
    ctypedef int (*kvs_incrby_fn)(kv_table *t, const void *key, size_t klen, int64_t delta,
                                  int64_t *result) noexcept nogil
    ctypedef int (*kvs_load_sync_fn)(kv_table *t, const void *key, size_t klen) noexcept nogil
    ctypedef int (*kvs_wait_memory_fn)(kv_table *t) noexcept nogil
    ctypedef uint64_t (*kvs_used_memory_fn)(kv_table *t) noexcept nogil
    ctypedef uint64_t (*kvs_max_memory_fn)(kv_table *t) noexcept nogil
