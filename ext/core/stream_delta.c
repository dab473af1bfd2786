/* stream_delta.c - a stream's changes as bytes (format in stream.h): builders
 * for the commands, and xs_apply, which both a command and the log's replay run,
 * so that what recovery rebuilds is what ran. A delta is untrusted when it is
 * replayed: its whole form is checked before anything is applied. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/stream.h"
#include "core/stream_int.h"

/* ---- builders */

static int op(struct wr *w, int code)
{
    unsigned char c = (unsigned char)code;
    w_bytes(w, &c, 1);
    return w->err;
}

static void ids(struct wr *w, const struct xs_id *v, size_t n)
{
    w_u(w, n);
    for (size_t i = 0; i < n; i++)
        w_id(w, v[i]);
}

int xd_create(struct kvbuf *d)
{
    struct wr w = {d, 0};
    return op(&w, XOP_CREATE);
}

int xd_add(struct kvbuf *d, struct xs_id id, const struct xs_field *f, size_t nf)
{
    struct wr w = {d, 0};
    op(&w, XOP_ADD);
    w_id(&w, id);
    w_u(&w, nf);
    for (size_t i = 0; i < nf; i++) {
        w_name(&w, f[i].f, f[i].flen);
        w_name(&w, f[i].v, f[i].vlen);
    }
    return w.err;
}

int xd_del(struct kvbuf *d, const struct xs_id *v, size_t n)
{
    struct wr w = {d, 0};
    op(&w, XOP_DEL);
    ids(&w, v, n);
    return w.err;
}

int xd_cut(struct kvbuf *d, const struct xs_cut *cut)
{
    struct wr w = {d, 0};
    op(&w, XOP_CUT);
    w_u(&w, cut->all ? 1 : 0);
    w_id(&w, cut->below);
    return w.err;
}

int xd_setid(struct kvbuf *d, struct xs_id last, uint64_t entries_added, struct xs_id max_deleted)
{
    struct wr w = {d, 0};
    op(&w, XOP_SETID);
    w_id(&w, last);
    w_u(&w, entries_added);
    w_id(&w, max_deleted);
    return w.err;
}

int xd_group(struct kvbuf *d, int code, const char *g, size_t gl, struct xs_id last, int64_t entries_read)
{
    struct wr w = {d, 0};
    op(&w, code);
    w_name(&w, g, gl);
    w_id(&w, last);
    w_u(&w, (uint64_t)(entries_read + 1));
    return w.err;
}

int xd_gdestroy(struct kvbuf *d, const char *g, size_t gl)
{
    struct wr w = {d, 0};
    op(&w, XOP_GDESTROY);
    w_name(&w, g, gl);
    return w.err;
}

int xd_consumer(struct kvbuf *d, int code, const char *g, size_t gl, const char *c, size_t cl, int64_t seen_ms)
{
    struct wr w = {d, 0};
    op(&w, code);
    w_name(&w, g, gl);
    w_name(&w, c, cl);
    if (code == XOP_CCREATE)
        w_u(&w, (uint64_t)seen_ms);
    return w.err;
}

int xd_deliver(struct kvbuf *d, const char *g, size_t gl, const char *c, size_t cl, int64_t now_ms, unsigned flags,
               const struct xs_id *v, size_t n)
{
    struct wr w = {d, 0};
    op(&w, XOP_DELIVER);
    w_name(&w, g, gl);
    w_name(&w, c, cl);
    w_u(&w, (uint64_t)now_ms);
    w_u(&w, flags);
    ids(&w, v, n);
    return w.err;
}

int xd_ack(struct kvbuf *d, const char *g, size_t gl, const struct xs_id *v, size_t n)
{
    struct wr w = {d, 0};
    op(&w, XOP_ACK);
    w_name(&w, g, gl);
    ids(&w, v, n);
    return w.err;
}

int xd_claim(struct kvbuf *d, const char *g, size_t gl, const char *c, size_t cl, int64_t seen_ms,
             const struct xd_claim *items, size_t n)
{
    struct wr w = {d, 0};
    op(&w, XOP_CLAIM);
    w_name(&w, g, gl);
    w_name(&w, c, cl);
    w_u(&w, (uint64_t)seen_ms);
    w_u(&w, n);
    for (size_t i = 0; i < n; i++) {
        w_id(&w, items[i].id);
        w_u(&w, (uint64_t)items[i].delivery_ms);
        w_u(&w, items[i].delivery_count);
        w_u(&w, items[i].force ? 1 : 0);
    }
    return w.err;
}

/* ---- reading and applying */

struct name {
    const char *p;
    size_t n;
};

static struct name r_name(struct rd *r)
{
    uint64_t n = r_u(r);
    const unsigned char *p = r_bytes(r, n);
    return (struct name){(const char *)p, r->err ? 0 : (size_t)n};
}

static int64_t r_time(struct rd *r)
{
    uint64_t v = r_u(r);
    if (v > (uint64_t)INT64_MAX)
        r->err = -EBADMSG;
    return r->err ? 0 : (int64_t)v;
}

static uint64_t r_flag(struct rd *r, uint64_t max)
{
    uint64_t v = r_u(r);
    if (v > max)
        r->err = -EBADMSG;
    return r->err ? 0 : v;
}

/* The group named at r (-EINVAL in *rc when s has none by that name). */
static struct xs_group *r_group(struct rd *r, struct xstream *s, int *rc)
{
    struct name g = r_name(r);
    struct xs_group *grp = r->err || !s ? NULL : xs_group_find(s, g.p, g.n);
    if (!grp && !r->err)
        *rc = -EINVAL;
    return grp;
}

/* One op at r: checked only (s NULL and apply 0) or applied to *ps. */
static int one(struct rd *r, struct xstream **ps, int apply, int64_t now_ms, int64_t seal_ms)
{
    struct xstream *s = apply ? *ps : NULL;
    int code = r_byte(r), rc = 0;
    if (r->err)
        return r->err;
    if (apply && code != XOP_CREATE && !s)
        return -EINVAL;
    switch (code) {
    case XOP_CREATE:
        if (apply) {
            if (s)
                return -EINVAL;
            if (!(*ps = xs_new()))
                return -ENOMEM;
        }
        return 0;
    case XOP_ADD: {
        struct xs_id id = r_id(r);
        uint64_t nf = r_count(r, 2);
        if (!r->err && (!nf || nf > XS_MAX_FIELDS))
            return -EBADMSG;
        struct xs_field stack[8], *f = nf <= 8 ? stack : apply ? malloc(nf * sizeof *f) : NULL;
        if (apply && !f)
            return -ENOMEM;
        for (uint64_t i = 0; i < nf && !r->err; i++) {
            struct name a = r_name(r), b = r_name(r);
            if (f)
                f[i] = (struct xs_field){a.p, b.p, a.n, b.n};
        }
        if (!r->err && apply)
            rc = xs_is_zero(id) || xs_cmp(id, s->last_id) <= 0 ? -EINVAL : xs_add(s, id, f, nf, now_ms, seal_ms);
        if (f != stack)
            free(f);
        return r->err ? r->err : rc;
    }
    case XOP_DEL:
    case XOP_ACK: {
        struct xs_group *g = code == XOP_ACK ? r_group(r, s, &rc) : NULL;
        uint64_t n = r_count(r, 2);
        for (uint64_t i = 0; i < n && !r->err; i++) {
            struct xs_id id = r_id(r);
            if (!r->err && apply && !rc) {
                if (code == XOP_DEL)
                    xs_del(s, id);
                else
                    xs_pel_remove(s, g, id);
            }
        }
        return r->err ? r->err : apply ? rc : 0;
    }
    case XOP_CUT: {
        struct xs_cut cut;
        cut.all = (int)r_flag(r, 1);
        cut.below = r_id(r);
        if (!r->err && apply)
            xs_cut(s, &cut);
        return r->err;
    }
    case XOP_SETID: {
        struct xs_id last = r_id(r);
        uint64_t added = r_u(r);
        struct xs_id maxdel = r_id(r);
        if (r->err || !apply)
            return r->err;
        struct xs_entry e;
        if (added < s->length || (xs_last(s, &e) == 1 && xs_cmp(last, e.id) < 0))
            return -EINVAL;
        s->last_id = last;
        s->entries_added = added;
        s->max_deleted = maxdel;
        return 0;
    }
    case XOP_GCREATE:
    case XOP_GSETID: {
        struct name g = r_name(r);
        struct xs_id last = r_id(r);
        uint64_t er = r_u(r);
        if (!r->err && er > (uint64_t)INT64_MAX)
            return -EBADMSG;
        if (r->err || !apply)
            return r->err;
        struct xs_group *grp = xs_group_find(s, g.p, g.n);
        if (code == XOP_GCREATE) {
            if (grp)
                return -EINVAL;
            return xs_group_create(s, g.p, g.n, last, (int64_t)er - 1) ? 0 : -ENOMEM;
        }
        if (!grp)
            return -EINVAL;
        grp->last_id = last;
        grp->entries_read = (int64_t)er - 1;
        return 0;
    }
    case XOP_GDESTROY: {
        struct xs_group *g = r_group(r, s, &rc);
        if (r->err || !apply || rc)
            return r->err ? r->err : apply ? rc : 0;
        xs_group_destroy(s, g);
        return 0;
    }
    case XOP_CCREATE:
    case XOP_CDELETE: {
        struct xs_group *g = r_group(r, s, &rc);
        struct name c = r_name(r);
        int64_t seen = code == XOP_CCREATE ? r_time(r) : 0;
        if (r->err || !apply || rc)
            return r->err ? r->err : apply ? rc : 0;
        struct xs_consumer *k = xs_consumer_find(g, c.p, c.n);
        if (code == XOP_CCREATE)
            return k ? -EINVAL : xs_consumer_create(s, g, c.p, c.n, seen) ? 0 : -ENOMEM;
        if (!k)
            return -EINVAL;
        xs_consumer_delete(s, g, k);
        return 0;
    }
    case XOP_DELIVER:
    case XOP_CLAIM: {
        struct xs_group *g = r_group(r, s, &rc);
        struct name c = r_name(r);
        int64_t now = r_time(r);
        unsigned flags = code == XOP_DELIVER ? (unsigned)r_flag(r, XD_NEW | XD_NOACK) : 0;
        uint64_t n = r_count(r, code == XOP_DELIVER ? 2 : 5);
        struct xs_consumer *k = NULL;
        if (!r->err && apply && !rc && !(k = xs_consumer_find(g, c.p, c.n)))
            rc = -EINVAL;
        if (k)
            k->seen_ms = now;
        for (uint64_t i = 0; i < n && !r->err; i++) {
            struct xs_id id = r_id(r);
            struct xd_claim it = {id, now, 0, 0};
            if (code == XOP_CLAIM) {
                it.delivery_ms = r_time(r);
                it.delivery_count = r_u(r);
                it.force = (int)r_flag(r, 1);
            }
            if (r->err || !apply || rc)
                continue;
            struct xs_nack *nk = xs_pel_find(g, id);
            if (code == XOP_DELIVER && (flags & XD_NEW)) {
                xs_group_advance(s, g, id);
                if (flags & XD_NOACK)
                    continue;
                if (!(nk = xs_pel_deliver(s, g, id, k, now)))
                    rc = -ENOMEM;
                else
                    nk->delivery_count = 1; /* delivered anew, even if it was pending (SETID back) */
            } else if (code == XOP_DELIVER) {
                if (!nk) {
                    rc = -EINVAL;
                } else {
                    xs_pel_chown(nk, k);
                    nk->delivery_count++;
                    nk->delivery_ms = now;
                }
            } else {
                if (!nk && !it.force)
                    rc = -EINVAL;
                else if (!nk && !(nk = xs_pel_deliver(s, g, id, k, it.delivery_ms)))
                    rc = -ENOMEM;
                if (nk) {
                    xs_pel_chown(nk, k);
                    nk->delivery_ms = it.delivery_ms;
                    nk->delivery_count = it.delivery_count;
                }
            }
        }
        return r->err ? r->err : apply ? rc : 0;
    }
    default:
        return -EBADMSG;
    }
}

int xs_delta_check(const void *p, size_t n)
{
    struct rd r = {p, (const unsigned char *)p + n, 0};
    if (!n)
        return -EBADMSG;
    while (r.p < r.end) {
        int rc = one(&r, NULL, 0, 0, 0);
        if (rc)
            return rc;
    }
    return 0;
}

int xs_apply(struct xstream **s, const void *p, size_t n, int64_t now_ms, int64_t seal_ms)
{
    int rc = xs_delta_check(p, n);
    if (rc)
        return rc;
    struct rd r = {p, (const unsigned char *)p + n, 0};
    while (r.p < r.end)
        if ((rc = one(&r, s, 1, now_ms, seal_ms)))
            return rc;
    return 0;
}
