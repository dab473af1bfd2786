/* bytes.h - unaligned loads and stores of the integers in the on-disk and wire
 * formats (log records, replication frames, data-file blocks). Host byte order,
 * which is little-endian on every supported host (x86-64, arm64), so the formats
 * are little-endian. Pure functions, any thread. */
#ifndef KV_BYTES_H
#define KV_BYTES_H

#include <stdint.h>
#include <string.h>

static inline void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint32_t get32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t get64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

#endif
