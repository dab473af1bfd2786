/* kvbuf.h - growable byte buffer used for connection input/output and replies.
 * Header-only; a buffer belongs to one thread at a time (no locking).
 * Growth is geometric and capped by the caller's limits, never by declared sizes
 * from untrusted input. */
#ifndef KV_KVBUF_H
#define KV_KVBUF_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvbuf {
    char *p;
    size_t len;   /* bytes in use */
    size_t cap;   /* bytes allocated */
    size_t limit; /* 0, or len may not grow past this: a reply being built stops at
                     its client's output bound instead of after it (session.c) */
    int over;     /* a reserve was refused for limit (the owner closes the client) */
};

/* The limit for a side buffer whose bytes will be appended to b: what b's limit
 * leaves (1 when nothing is left: a limit of 0 would mean none), or 0 if b has none. */
static inline size_t kvbuf_room_limit(const struct kvbuf *b)
{
    return !b->limit ? 0 : b->limit > b->len ? b->limit - b->len : 1;
}

/* Make room for at least `more` bytes after len. Returns 0 or -ENOMEM (also past
 * limit, with over set). */
static inline int kvbuf_reserve(struct kvbuf *b, size_t more)
{
    if (b->cap - b->len >= more && !b->limit)
        return 0;
    size_t need = b->len + more;
    if (need < b->len)
        return -ENOMEM;
    if (b->limit && need > b->limit) {
        b->over = 1;
        return -ENOMEM;
    }
    if (b->cap >= need)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap = cap * 2 > cap ? cap * 2 : need;
    char *p = realloc(b->p, cap);
    if (!p)
        return -ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int kvbuf_append(struct kvbuf *b, const void *data, size_t n)
{
    if (!n)
        return 0; /* an empty buffer's p may be NULL: no memcpy from or to it */
    int rc = kvbuf_reserve(b, n);
    if (rc)
        return rc;
    memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

/* Append printf-formatted text, growing the buffer as needed (never truncated).
 * Returns 0, -ENOMEM, or -EINVAL for a bad format. */
static inline int kvbuf_printf(struct kvbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int kvbuf_printf(struct kvbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -EINVAL;
    if (b->limit && b->len + (size_t)n > b->limit) { /* formatted into spare room, not kept */
        b->over = 1;
        return -ENOMEM;
    }
    if ((size_t)n >= b->cap - b->len) { /* did not fit (with its NUL): grow, format again */
        if (kvbuf_reserve(b, (size_t)n + 1))
            return -ENOMEM;
        va_start(ap, fmt);
        vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
    return 0;
}

/* Drop the first n bytes (already consumed), keeping the rest at the front. */
static inline void kvbuf_consume(struct kvbuf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

/* Release memory of a buffer that grew large and is now empty or nearly so. */
static inline void kvbuf_shrink(struct kvbuf *b, size_t keep_cap)
{
    if (b->cap > keep_cap && b->len <= keep_cap) {
        char *p = realloc(b->p, keep_cap);
        if (p) {
            b->p = p;
            b->cap = keep_cap;
        }
    }
}

static inline void kvbuf_free(struct kvbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

#endif
