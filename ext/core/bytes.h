/* bytes.h - unaligned loads and stores of the integers in the on-disk and wire
 * formats (log records, replication frames, data-file blocks). Host byte order,
 * which is little-endian on every supported host (x86-64, arm64), so the formats
 * are little-endian; the UDP front end's datagrams are big-endian, network order
 * (the _be forms); and an unsigned integer's decimal digits (RESP's numbers, stream
 * IDs). Pure functions, any thread. */
#ifndef KV_BYTES_H
#define KV_BYTES_H

#include <stdint.h>
#include <string.h>

static inline void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint32_t get32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t get64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void put_be16(unsigned char *p, uint16_t v) { p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v; }
static inline void put_be32(unsigned char *p, uint32_t v) { put32(p, __builtin_bswap32(v)); }
static inline void put_be64(unsigned char *p, uint64_t v) { put64(p, __builtin_bswap64(v)); }
static inline uint16_t get_be16(const unsigned char *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static inline uint32_t get_be32(const unsigned char *p) { return __builtin_bswap32(get32(p)); }
static inline uint64_t get_be64(const unsigned char *p) { return __builtin_bswap64(get64(p)); }

/* v's decimal digits at p, no terminator; returns their count (1..20). */
static inline int put_decimal(char *p, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do
        tmp[n++] = (char)('0' + v % 10);
    while ((v /= 10));
    for (int i = 0; i < n; i++)
        p[i] = tmp[n - 1 - i];
    return n;
}

#endif
