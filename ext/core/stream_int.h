/* stream_int.h - what the stream files (stream.c, stream_group.c, stream_snap.c,
 * stream_delta.c, stream_gone.c) share; not a public interface. */
#ifndef KV_STREAM_INT_H
#define KV_STREAM_INT_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "core/kvbuf.h"
#include "core/stream.h"
#include "core/varint.h"

/* The bytes malloc gave p (0 for NULL): what s->mem counts. */
size_t xs_usable(const void *p);
/* Free every group of s (xs_free). */
void xs_groups_free(struct xstream *s);
/* Batch i of s (relative to the first). */
static inline struct xs_batch *bat(const struct xstream *s, size_t i) { return s->b[s->head + i]; }
/* The index of the first batch numbered no or more (s->n if none). */
size_t xs_batch_index(const struct xstream *s, uint64_t no);
/* A reader of s needs b: 0 if its bytes are in memory, else 1 with b marked
 * wanted and the miss counted (stream_gone.c). */
int xs_missing(const struct xstream *s, const struct xs_batch *b);
/* Check b's entry bytes (b->data, b->len) against b->first and *prev (have_prev):
 * sets count, deleted, last and *prev. 0 or -EBADMSG (stream_snap.c). */
int xs_check_entries(struct xs_batch *b, struct xs_id *prev, int have_prev);

/* ---- writing varints and names into a kvbuf, errors kept to the end */

struct wr {
    struct kvbuf *out;
    int err;
};

static inline void w_u(struct wr *w, uint64_t v)
{
    unsigned char tmp[VARINT_MAX];
    if (!w->err)
        w->err = kvbuf_append(w->out, tmp, put_varint(tmp, v));
}

static inline void w_bytes(struct wr *w, const void *p, size_t n)
{
    if (!w->err)
        w->err = kvbuf_append(w->out, p, n);
}

static inline void w_id(struct wr *w, struct xs_id id)
{
    w_u(w, id.ms);
    w_u(w, id.seq);
}

static inline void w_name(struct wr *w, const char *p, size_t n)
{
    w_u(w, n);
    w_bytes(w, p, n);
}

/* ---- reading untrusted bytes: the first error sticks, reads after it give 0 */

struct rd {
    const unsigned char *p, *end;
    int err;
};

static inline uint64_t r_u(struct rd *r)
{
    uint64_t v = 0;
    if (!r->err && get_varint(&r->p, r->end, &v))
        r->err = -EBADMSG;
    return r->err ? 0 : v;
}

static inline struct xs_id r_id(struct rd *r)
{
    struct xs_id id;
    id.ms = r_u(r);
    id.seq = r_u(r);
    return id;
}

static inline int r_byte(struct rd *r)
{
    if (r->err || r->p >= r->end) {
        r->err = -EBADMSG;
        return 0;
    }
    return *r->p++;
}

/* n bytes in place; NULL (and err) past the end. */
static inline const unsigned char *r_bytes(struct rd *r, uint64_t n)
{
    if (r->err || n > (uint64_t)(r->end - r->p)) {
        r->err = -EBADMSG;
        return NULL;
    }
    const unsigned char *p = r->p;
    r->p += n;
    return p;
}

/* A count of things that take at least min_size bytes each: bounded by what is left. */
static inline uint64_t r_count(struct rd *r, unsigned min_size)
{
    uint64_t n = r_u(r);
    if (!r->err && n > (uint64_t)(r->end - r->p) / min_size)
        r->err = -EBADMSG;
    return r->err ? 0 : n;
}

#endif
