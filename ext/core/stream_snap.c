/* stream_snap.c - a whole stream as bytes and back (format in stream.h). The
 * decoder reads untrusted bytes: every count is bounded by the bytes left
 * before anything is allocated for it, and every rule the rest of stream.c
 * relies on (IDs ascending, entries well formed, one open batch at most, unique
 * names, existing owners) is checked, so a stream that decodes is one that
 * stream.c could have built. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/stream.h"
#include "core/stream_int.h"

#define XS_SNAP_SEALED 1
#define XS_SNAP_REF 2 /* sealed, its bytes in the batch store */

static int encode(struct xstream *s, struct kvbuf *out, xs_stage_fn stage, void *arg)
{
    if (!stage && s->ngone) { /* whole bytes wanted: every gone batch must be read back first */
        xs_want_gone(s, SIZE_MAX);
        xs_missed++;
        return -ENODATA;
    }
    struct wr w = {out, 0};
    unsigned char v = XS_SNAP_VERSION;
    w_bytes(&w, &v, 1);
    w_u(&w, s->lsn);
    w_u(&w, s->next_no);
    w_u(&w, s->entries_added);
    w_id(&w, s->last_id);
    w_id(&w, s->max_deleted);
    w_u(&w, s->n);
    for (size_t i = 0; i < s->n; i++) {
        struct xs_batch *b = s->b[s->head + i];
        int ref = stage && b->sealed;
        if (ref && !w.err && (w.err = stage(arg, b)))
            break;
        unsigned char flags = b->sealed ? XS_SNAP_SEALED | (ref ? XS_SNAP_REF : 0) : 0;
        w_u(&w, b->no);
        w_id(&w, b->first);
        w_bytes(&w, &flags, 1);
        w_u(&w, b->len);
        if (ref) {
            w_u(&w, b->file.seg);
            w_u(&w, b->file.off);
            w_u(&w, b->file.crc);
            w_u(&w, b->count);
            w_u(&w, b->deleted);
            w_id(&w, b->last);
        } else if (!w.err) {
            w_bytes(&w, b->data, b->len);
        }
    }
    w_u(&w, s->ngroups);
    for (struct list *gn = s->groups.next; gn != &s->groups; gn = gn->next) {
        const struct xs_group *g = list_entry(gn, struct xs_group, node);
        w_name(&w, g->name, g->nlen);
        w_id(&w, g->last_id);
        w_u(&w, (uint64_t)(g->entries_read + 1));
        w_u(&w, g->nconsumers);
        for (struct list *cn = g->consumers.next; cn != &g->consumers; cn = cn->next) {
            const struct xs_consumer *c = list_entry(cn, struct xs_consumer, node);
            w_name(&w, c->name, c->nlen);
            w_u(&w, (uint64_t)c->seen_ms);
        }
        w_u(&w, g->npel);
        for (const struct xs_nack *n = xs_pel_ceil(g, XS_ID_MIN, 0); n; n = xs_pel_ceil(g, n->id, 1)) {
            size_t idx = 0; /* the owner's index: consumers are few next to pending entries */
            for (struct list *cn = g->consumers.next; list_entry(cn, struct xs_consumer, node) != n->owner;
                 cn = cn->next)
                idx++;
            w_id(&w, n->id);
            w_u(&w, idx);
            w_u(&w, (uint64_t)n->delivery_ms);
            w_u(&w, n->delivery_count);
        }
    }
    return w.err;
}

int xs_encode(const struct xstream *s, struct kvbuf *out)
{
    return encode((struct xstream *)s, out, NULL, NULL); /* (no stage: nothing changes) */
}

int xs_encode_refs(struct xstream *s, struct kvbuf *out, xs_stage_fn stage, void *arg)
{
    return encode(s, out, stage, arg);
}

/* Check a batch's entry bytes: entries whole, IDs ascending from first (and
 * above *prev), flags known, at least one pair each. Sets count, deleted, last. */
int xs_check_entries(struct xs_batch *b, struct xs_id *prev, int have_prev)
{
    const unsigned char *p = b->data, *end = b->data + b->len;
    uint32_t count = 0, deleted = 0;
    while (p < end) {
        unsigned flags = *p++;
        uint64_t dms, seq, nf, l;
        if (flags & ~XS_F_DELETED)
            return -EBADMSG;
        if (get_varint(&p, end, &dms) || get_varint(&p, end, &seq) || get_varint(&p, end, &nf))
            return -EBADMSG;
        if (dms > UINT64_MAX - b->first.ms || !nf || nf > XS_MAX_FIELDS)
            return -EBADMSG;
        struct xs_id id = {b->first.ms + dms, seq};
        if (count == 0 ? xs_cmp(id, b->first) != 0 : xs_cmp(id, *prev) <= 0)
            return -EBADMSG;
        if (count == 0 && have_prev && xs_cmp(id, *prev) <= 0)
            return -EBADMSG;
        for (uint64_t i = 0; i < 2 * nf; i++) {
            if (get_varlen(&p, end, &l))
                return -EBADMSG;
            p += l;
        }
        *prev = id;
        count++;
        deleted += flags & XS_F_DELETED;
    }
    if (!count)
        return -EBADMSG;
    b->count = count;
    b->deleted = deleted;
    b->last = *prev;
    return 0;
}

/* One batch's header: its bytes in place (data) or its reference (ref.seg != 0). */
struct batch_hdr {
    uint64_t no, len;
    struct xs_id first;
    int flags;
    const unsigned char *data;
    struct xs_ref ref;
    uint64_t count, deleted;    /* a reference's */
    struct xs_id last;
};

static void read_batch(struct rd *r, struct batch_hdr *h)
{
    h->no = r_u(r);
    h->first = r_id(r);
    h->flags = r_byte(r);
    h->len = r_u(r);
    h->data = NULL;
    h->ref = (struct xs_ref){0, 0, 0, 0};
    if (h->flags == (XS_SNAP_SEALED | XS_SNAP_REF)) {
        uint64_t seg = r_u(r), off = r_u(r), crc = r_u(r);
        h->count = r_u(r);
        h->deleted = r_u(r);
        h->last = r_id(r);
        if (!seg || seg > UINT32_MAX || crc > UINT32_MAX || h->len > UINT32_MAX - 64 || !h->len ||
            !h->count || h->count > h->len || h->deleted > h->count || xs_cmp(h->last, h->first) < 0)
            r->err = -EBADMSG;
        else
            h->ref = (struct xs_ref){(uint32_t)seg, (uint32_t)h->len, off, (uint32_t)crc};
    } else {
        h->data = r_bytes(r, h->len);
    }
    if (h->flags > XS_SNAP_SEALED && h->flags != (XS_SNAP_SEALED | XS_SNAP_REF))
        r->err = -EBADMSG;
}

static int decode_batches(struct rd *r, struct xstream *s, xs_fetch_fn fetch, void *arg)
{
    uint64_t nb = r_count(r, 5);
    struct xs_id prev = XS_ID_MIN;
    uint64_t prev_no = 0;
    for (uint64_t i = 0; i < nb && !r->err; i++) {
        struct batch_hdr h;
        read_batch(r, &h);
        if (r->err || (i && h.no <= prev_no) || h.len > UINT32_MAX - 64 || (h.ref.seg && !fetch))
            return -EBADMSG;
        if (i && !s->b[s->head + s->n - 1]->sealed)
            return -EBADMSG; /* an open batch before another */
        int later = h.ref.seg && fetch == XS_FETCH_LATER;
        struct xs_batch *b = malloc(sizeof *b + (later ? 0 : h.len));
        if (!b)
            return -ENOMEM;
        memset(b, 0, sizeof *b);
        int rc = 0;
        if (later) {
            b->gone = 1;
            s->ngone++;
        }
        else if (h.ref.seg)
            rc = fetch(arg, &h.ref, b->data);
        else
            memcpy(b->data, h.data, h.len);
        b->file = h.ref;
        b->len = (uint32_t)h.len;
        b->cap = later ? 0 : b->len;
        b->first = h.first;
        b->no = h.no;
        b->sealed = (uint8_t)(h.flags & XS_SNAP_SEALED);
        if (later) { /* its header says what its bytes will: checked when they are read */
            if (i && xs_cmp(h.first, prev) <= 0)
                rc = -EBADMSG;
            b->count = (uint32_t)h.count;
            b->deleted = (uint32_t)h.deleted;
            b->last = prev = h.last;
        } else if (!rc) {
            rc = xs_check_entries(b, &prev, i > 0);
            if (!rc && h.ref.seg && (b->count != h.count || b->deleted != h.deleted || xs_cmp(b->last, h.last)))
                rc = -EBADMSG; /* the reference and the bytes disagree */
        }
        if (!rc && s->head + s->n == s->cap) {
            size_t cap = s->cap ? s->cap * 2 : 4;
            size_t was = xs_usable(s->b);
            struct xs_batch **na = realloc(s->b, cap * sizeof *na);
            if (!na)
                rc = -ENOMEM;
            else
                s->b = na, s->cap = cap, s->mem = s->mem - was + xs_usable(na);
        }
        if (rc) {
            free(b);
            return rc;
        }
        s->b[s->n++] = b;
        s->mem += xs_usable(b);
        s->length += b->count - b->deleted;
        prev_no = h.no;
    }
    return r->err;
}

static int decode_groups(struct rd *r, struct xstream *s)
{
    uint64_t ng = r_count(r, 6);
    for (uint64_t i = 0; i < ng && !r->err; i++) {
        uint64_t nl = r_u(r);
        const unsigned char *name = r_bytes(r, nl);
        struct xs_id last = r_id(r);
        uint64_t er = r_u(r);
        if (r->err || er > (uint64_t)INT64_MAX || xs_group_find(s, (const char *)name, nl))
            return -EBADMSG;
        struct xs_group *g = xs_group_create(s, (const char *)name, nl, last, (int64_t)er - 1);
        if (!g)
            return -ENOMEM;
        uint64_t nc = r_count(r, 2);
        struct xs_consumer **byidx = nc ? calloc(nc, sizeof *byidx) : NULL;
        if (nc && !byidx)
            return -ENOMEM;
        int rc = 0;
        for (uint64_t k = 0; k < nc && !rc; k++) {
            uint64_t cl = r_u(r);
            const unsigned char *cname = r_bytes(r, cl);
            uint64_t seen = r_u(r);
            if (r->err || seen > (uint64_t)INT64_MAX || xs_consumer_find(g, (const char *)cname, cl))
                rc = -EBADMSG;
            else if (!(byidx[k] = xs_consumer_create(s, g, (const char *)cname, cl, (int64_t)seen)))
                rc = -ENOMEM;
        }
        uint64_t np = rc ? 0 : r_count(r, 5);
        struct xs_id prev = XS_ID_MIN;
        for (uint64_t k = 0; k < np && !rc; k++) {
            struct xs_id id = r_id(r);
            uint64_t owner = r_u(r), when = r_u(r), count = r_u(r);
            if (r->err || owner >= nc || when > (uint64_t)INT64_MAX || (k && xs_cmp(id, prev) <= 0)) {
                rc = -EBADMSG;
                break;
            }
            struct xs_nack *n = xs_pel_deliver(s, g, id, byidx[owner], (int64_t)when);
            if (!n)
                rc = -ENOMEM;
            else
                n->delivery_count = count;
            prev = id;
        }
        free(byidx);
        if (rc)
            return rc;
    }
    return r->err;
}

int64_t xs_refs(const void *p, size_t n, void (*fn)(void *arg, const struct xs_ref *ref), void *arg)
{
    struct rd r = {p, (const unsigned char *)p + n, 0};
    if (r_byte(&r) != XS_SNAP_VERSION)
        return -EBADMSG;
    for (int i = 0; i < 7; i++) /* lsn, next_no, entries_added, last_id, max_deleted */
        r_u(&r);
    uint64_t nb = r_count(&r, 5);
    int64_t found = 0;
    for (uint64_t i = 0; i < nb && !r.err; i++) {
        struct batch_hdr h;
        read_batch(&r, &h);
        if (!r.err && h.ref.seg) {
            fn(arg, &h.ref);
            found++;
        }
    }
    return r.err ? r.err : found;
}

int xs_decode(const void *p, size_t n, struct xstream **out)
{
    return xs_decode_from(p, n, NULL, NULL, out);
}

int xs_decode_from(const void *p, size_t n, xs_fetch_fn fetch, void *arg, struct xstream **out)
{
    struct rd r = {p, (const unsigned char *)p + n, 0};
    if (r_byte(&r) != XS_SNAP_VERSION)
        return -EBADMSG;
    struct xstream *s = xs_new();
    if (!s)
        return -ENOMEM;
    s->lsn = r_u(&r);
    s->next_no = r_u(&r);
    s->entries_added = r_u(&r);
    s->last_id = r_id(&r);
    s->max_deleted = r_id(&r);
    int rc = r.err ? r.err : decode_batches(&r, s, fetch, arg);
    if (!rc && s->n) {
        const struct xs_batch *b = s->b[s->n - 1];
        if (b->no >= s->next_no || xs_cmp(b->last, s->last_id) > 0)
            rc = -EBADMSG;
    }
    if (!rc && s->entries_added < s->length)
        rc = -EBADMSG;
    if (!rc)
        rc = decode_groups(&r, s);
    if (!rc && r.p != r.end)
        rc = -EBADMSG; /* bytes after the stream */
    if (rc) {
        xs_free(s);
        return rc;
    }
    *out = s;
    return 0;
}
