/* siphash.h - SipHash-1-3, the 64-bit keyed hash of table keys. Thread safe.
 * The kvt_ names are the table's (table.h includes this header): every user of
 * the table hashes its keys through them. */
#ifndef KV_SIPHASH_H
#define KV_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

/* 64-bit keyed hash of a key (SipHash-1-3 with a per-process random key). */
uint64_t kvt_hash(const void *key, size_t klen);
/* The same with a given key (the data file's placement hash, fixed per file). */
uint64_t kvt_hash_keyed(const void *key, size_t klen, uint64_t k0, uint64_t k1);

#endif
