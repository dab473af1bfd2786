/* varint.h - unsigned LEB128 integers (7 bits a byte, low group first, the high
 * bit says more follow) of up to 64 bits, in their shortest form: the lengths
 * and IDs of stream batches (core/stream.h) and their log records. get_varint
 * reads untrusted bytes: bounded by end, at most 10 bytes, shortest form only.
 * Header-only, pure. */
#ifndef KV_VARINT_H
#define KV_VARINT_H

#include <errno.h>
#include <stdint.h>

#define VARINT_MAX 10

static inline unsigned varint_size(uint64_t v)
{
    unsigned n = 1;
    while (v >= 0x80)
        v >>= 7, n++;
    return n;
}

/* Write v at p (VARINT_MAX bytes of room); returns the bytes written. */
static inline unsigned put_varint(unsigned char *p, uint64_t v)
{
    unsigned n = 0;
    while (v >= 0x80) {
        p[n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (unsigned char)v;
    return n;
}

/* Read a varint at *pp (< end), advancing *pp. 0 or -EBADMSG (truncated, too
 * long, not the shortest form). */
static inline int get_varint(const unsigned char **pp, const unsigned char *end, uint64_t *out)
{
    const unsigned char *p = *pp;
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (p >= end)
            return -EBADMSG;
        unsigned b = *p++;
        if (shift == 63 && b > 1)
            return -EBADMSG; /* past 64 bits */
        v |= (uint64_t)(b & 0x7f) << shift;
        if (b & 0x80)
            continue;
        if (b == 0 && shift)
            return -EBADMSG; /* a zero last group: not the shortest form */
        *pp = p;
        *out = v;
        return 0;
    }
    return -EBADMSG;
}

/* A varint length whose bytes follow it within end: as get_varint, and the
 * length must fit in what is left. */
static inline int get_varlen(const unsigned char **pp, const unsigned char *end, uint64_t *out)
{
    int rc = get_varint(pp, end, out);
    if (rc)
        return rc;
    return *out > (uint64_t)(end - *pp) ? -EBADMSG : 0;
}

#endif
