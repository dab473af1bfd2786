/* slot.h - Redis Cluster's key slots (16,384 of them; the hash-tag rule: a key
 * holding "{tag}" with a non-empty tag hashes only the tag, so keys that share it
 * share a slot). Pure functions, any thread. */
#ifndef KV_CORE_SLOT_H
#define KV_CORE_SLOT_H

#include <stddef.h>
#include <stdint.h>

#define KV_SLOTS 16384

/* CRC-16/XMODEM of n bytes. */
uint16_t kv_crc16(const void *p, size_t n);
/* The slot of a key: 0..KV_SLOTS-1. */
int kv_key_slot(const void *key, size_t n);

#endif
