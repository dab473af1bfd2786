/* hashenc.c - the encoding of a hash as one byte string (see hashenc.h for the
 * format, its cost and what is checked). Decodes untrusted bytes: every length
 * is checked against the bytes left before use. Pure functions, any thread. */
#include "core/hashenc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/kvbuf.h"
#include "core/siphash.h"

/* ---- reading */

/* A varint length at *pp, whose bytes must also follow it in [*pp, end).
 * Advances *pp past the varint. Returns 0 or -EBADMSG. */
static int get_len(const unsigned char **pp, const unsigned char *end, size_t *out)
{
    const unsigned char *p = *pp;
    uint64_t v = 0;
    for (int shift = 0; shift < 35; shift += 7) {
        if (p == end)
            return -EBADMSG;
        unsigned b = *p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (b & 0x80)
            continue;
        if (b == 0 && shift) /* a zero last group: not the shortest form */
            return -EBADMSG;
        if (v > HASHENC_MAX_LEN || v > (uint64_t)(end - p))
            return -EBADMSG;
        *pp = p;
        *out = (size_t)v;
        return 0;
    }
    return -EBADMSG; /* more than 5 bytes */
}

int64_t hashenc_len(const void *val, size_t vlen)
{
    if (!val)
        return 0;
    if (vlen < HASHENC_HDR)
        return -EBADMSG;
    uint32_t n = get32(val);
    if (n > (vlen - HASHENC_HDR) / 2) /* an entry takes at least two length bytes */
        return -EBADMSG;
    return n;
}

int hashenc_iter_init(struct hashenc_iter *it, const void *val, size_t vlen)
{
    int64_t n = hashenc_len(val, vlen);
    if (n < 0)
        return (int)n;
    it->p = val ? (const unsigned char *)val + HASHENC_HDR : NULL;
    it->end = val ? (const unsigned char *)val + vlen : NULL;
    it->left = (uint32_t)n;
    return 0;
}

int hashenc_next(struct hashenc_iter *it, struct hashenc_entry *e)
{
    if (!it->left)
        return it->p == it->end ? 0 : -EBADMSG; /* bytes after the last entry */
    const unsigned char *p = it->p;
    size_t fl, vl;
    if (get_len(&p, it->end, &fl))
        return -EBADMSG;
    e->f = (const char *)p;
    e->flen = fl;
    p += fl;
    if (get_len(&p, it->end, &vl))
        return -EBADMSG;
    e->v = (const char *)p;
    e->vlen = vl;
    p += vl;
    e->raw = (const char *)it->p;
    e->rawlen = (size_t)(p - it->p);
    it->p = p;
    it->left--;
    return 1;
}

int hashenc_entry_at(const void *val, size_t vlen, size_t off, struct hashenc_entry *e)
{
    if (!val || off < HASHENC_HDR || off >= vlen)
        return -EBADMSG;
    struct hashenc_iter it = {(const unsigned char *)val + off, (const unsigned char *)val + vlen, 1};
    return hashenc_next(&it, e) == 1 ? 1 : -EBADMSG;
}

int hashenc_validate(const void *val, size_t vlen)
{
    struct hashenc_iter it;
    struct hashenc_entry e;
    int rc = hashenc_iter_init(&it, val, vlen);
    if (rc)
        return rc;
    while ((rc = hashenc_next(&it, &e)) == 1)
        ;
    return rc;
}

int hashenc_find(const void *val, size_t vlen, const void *f, size_t flen, struct hashenc_entry *e)
{
    struct hashenc_iter it;
    int rc = hashenc_iter_init(&it, val, vlen);
    if (rc)
        return rc;
    while ((rc = hashenc_next(&it, e)) == 1)
        if (e->flen == flen && !memcmp(e->f, f, flen))
            return 1;
    return rc;
}

/* ---- the fields a command names */

/* Which named field (its first naming) an entry's field is: few fields are
 * compared in turn, more are put in an open-addressing table. */
struct named {
    const struct hashenc_fields *fs;
    uint32_t *first;   /* first[i]: the first named field equal to field i */
    uint32_t *last;    /* last[i] for a first naming i: the last naming of that field */
    unsigned char *seen; /* seen[i] for a first naming: the hash has it */
    uint32_t *slot;    /* field index + 1, 0 = empty; NULL while n <= HASHENC_SMALL */
    size_t mask;
    void *mem;
    uint32_t s_first[HASHENC_SMALL], s_last[HASHENC_SMALL];
    unsigned char s_seen[HASHENC_SMALL];
};

static inline const char *nf(const struct named *nm, size_t i) { return nm->fs->f[i * nm->fs->stride]; }
static inline size_t nl(const struct named *nm, size_t i) { return nm->fs->l[i * nm->fs->stride]; }

static inline int same(const struct named *nm, size_t i, const char *f, size_t flen)
{
    return nl(nm, i) == flen && !memcmp(nf(nm, i), f, flen);
}

/* The first naming of field f, or -1. */
static int64_t named_match(const struct named *nm, const char *f, size_t flen)
{
    if (!nm->slot) {
        for (size_t i = 0; i < nm->fs->n; i++)
            if (nm->first[i] == i && same(nm, i, f, flen))
                return (int64_t)i;
        return -1;
    }
    for (size_t s = kvt_hash(f, flen) & nm->mask;; s = (s + 1) & nm->mask) {
        uint32_t x = nm->slot[s];
        if (!x)
            return -1;
        if (same(nm, x - 1, f, flen))
            return x - 1;
    }
}

static void named_free(struct named *nm) { free(nm->mem); }

static int named_init(struct named *nm, const struct hashenc_fields *fs)
{
    size_t n = fs->n;
    nm->fs = fs;
    nm->slot = NULL;
    nm->mem = NULL;
    if (n <= HASHENC_SMALL) {
        nm->first = nm->s_first;
        nm->last = nm->s_last;
        nm->seen = nm->s_seen;
    } else {
        if (n > UINT32_MAX / 4) /* slots hold index + 1 in a u32; 2n slots must not overflow */
            return -E2BIG;
        size_t cap = 16;
        while (cap < 2 * n)
            cap *= 2;
        nm->mem = calloc(1, (2 * n + cap) * sizeof(uint32_t) + n);
        if (!nm->mem)
            return -ENOMEM;
        nm->first = nm->mem;
        nm->last = nm->first + n;
        nm->slot = nm->last + n;
        nm->seen = (unsigned char *)(nm->slot + cap);
        nm->mask = cap - 1;
    }
    memset(nm->seen, 0, n);
    for (size_t i = 0; i < n; i++) {
        int64_t j = -1;
        if (!nm->slot) {
            for (size_t k = 0; k < i && j < 0; k++)
                if (nm->first[k] == k && same(nm, k, nf(nm, i), nl(nm, i)))
                    j = (int64_t)k;
        } else {
            size_t s = kvt_hash(nf(nm, i), nl(nm, i)) & nm->mask;
            for (; nm->slot[s] && j < 0; s = (s + 1) & nm->mask)
                if (same(nm, nm->slot[s] - 1, nf(nm, i), nl(nm, i)))
                    j = nm->slot[s] - 1;
            if (j < 0)
                nm->slot[s] = (uint32_t)i + 1;
        }
        nm->first[i] = j < 0 ? (uint32_t)i : (uint32_t)j;
        nm->last[nm->first[i]] = (uint32_t)i;
    }
    return 0;
}

int hashenc_lookup(const void *val, size_t vlen, const struct hashenc_fields *fs, struct hashenc_entry *found)
{
    struct named nm;
    int rc = named_init(&nm, fs);
    if (rc)
        return rc;
    for (size_t i = 0; i < fs->n; i++)
        found[i].f = NULL;
    struct hashenc_iter it;
    struct hashenc_entry e;
    rc = hashenc_iter_init(&it, val, vlen);
    while (!rc && (rc = hashenc_next(&it, &e)) == 1) {
        int64_t j = named_match(&nm, e.f, e.flen);
        if (j >= 0)
            found[j] = e;
        rc = 0; /* on to the next entry */
    }
    for (size_t i = 0; !rc && i < fs->n; i++)
        if (nm.first[i] != i)
            found[i] = found[nm.first[i]];
    named_free(&nm);
    return rc;
}

/* ---- writing */

static void put_len(struct kvbuf *b, size_t n) /* room reserved by the caller */
{
    unsigned char *p = (unsigned char *)b->p + b->len;
    while (n >= 0x80) {
        *p++ = (unsigned char)(n | 0x80);
        n >>= 7;
    }
    *p++ = (unsigned char)n;
    b->len = (size_t)(p - (unsigned char *)b->p);
}

static int put_entry(struct kvbuf *b, const char *f, size_t fl, const char *v, size_t vl)
{
    if (kvbuf_reserve(b, fl + vl + 10))
        return -ENOMEM;
    put_len(b, fl);
    memcpy(b->p + b->len, f, fl);
    b->len += fl;
    put_len(b, vl);
    memcpy(b->p + b->len, v, vl);
    b->len += vl;
    return 0;
}

/* What set and del share while they rewrite cur into out: the named fields,
 * room reserved once, the count written last (when it is known), and out left
 * as it was on any error. */
struct rewrite {
    struct named nm;
    struct kvbuf *out;
    size_t start;      /* out->len before the header */
    int64_t old;       /* cur's count */
};

static int rewrite_begin(struct rewrite *w, struct kvbuf *out, const void *cur, size_t curlen,
                         const struct hashenc_fields *fs, size_t extra)
{
    w->out = out;
    w->start = out->len;
    w->old = hashenc_len(cur, curlen);
    if (w->old < 0)
        return (int)w->old;
    if (extra > SIZE_MAX - curlen - HASHENC_HDR || kvbuf_reserve(out, curlen + HASHENC_HDR + extra))
        return -ENOMEM;
    out->len += HASHENC_HDR; /* the count, written at the end */
    return named_init(&w->nm, fs);
}

static int rewrite_end(struct rewrite *w, int rc, int64_t count)
{
    named_free(&w->nm);
    if (!rc && (count > UINT32_MAX || w->out->len - w->start > HASHENC_MAX_LEN))
        rc = -E2BIG;
    if (rc) {
        w->out->len = w->start;
        return rc;
    }
    put32((unsigned char *)w->out->p + w->start, (uint32_t)count);
    return 0;
}

int64_t hashenc_set(struct kvbuf *out, const void *cur, size_t curlen, const char *const *fv,
                    const size_t *fvl, size_t npairs)
{
    struct hashenc_fields fs = {fv, fvl, npairs, 2};
    size_t extra = 0;
    for (size_t i = 0; i < 2 * npairs; i++) {
        if (fvl[i] > HASHENC_MAX_LEN)
            return -E2BIG;
        extra += fvl[i] + 5; /* each at most 512 MB: no overflow below 2^40 arguments */
    }
    struct rewrite w;
    int rc = rewrite_begin(&w, out, cur, curlen, &fs, extra);
    if (rc) {
        out->len = w.start;
        return rc;
    }
    struct named *nm = &w.nm;
    struct hashenc_iter it;
    struct hashenc_entry e;
    rc = hashenc_iter_init(&it, cur, curlen);
    /* each pass sets rc: 0 goes on, an error stops; the walk ends with 0 or -EBADMSG */
    while (!rc && (rc = hashenc_next(&it, &e)) == 1) {
        int64_t j = named_match(nm, e.f, e.flen);
        if (j < 0) {
            rc = kvbuf_append(out, e.raw, e.rawlen);
        } else {
            size_t v = 2 * (size_t)nm->last[j] + 1;
            nm->seen[j] = 1;
            rc = put_entry(out, e.f, e.flen, fv[v], fvl[v]);
        }
    }
    int64_t added = 0;
    for (size_t i = 0; !rc && i < npairs; i++) {
        if (nm->first[i] != i || nm->seen[i])
            continue;
        size_t v = 2 * (size_t)nm->last[i] + 1;
        rc = put_entry(out, fv[2 * i], fvl[2 * i], fv[v], fvl[v]);
        added++;
    }
    rc = rewrite_end(&w, rc, w.old + added);
    return rc ? rc : added;
}

int64_t hashenc_del(struct kvbuf *out, const void *cur, size_t curlen, const struct hashenc_fields *fs)
{
    struct rewrite w;
    int rc = rewrite_begin(&w, out, cur, curlen, fs, 0);
    if (rc) {
        out->len = w.start;
        return rc;
    }
    struct hashenc_iter it;
    struct hashenc_entry e;
    int64_t removed = 0;
    rc = hashenc_iter_init(&it, cur, curlen);
    while (!rc && (rc = hashenc_next(&it, &e)) == 1) {
        if (named_match(&w.nm, e.f, e.flen) >= 0) {
            removed++;
            rc = 0;
        } else
            rc = kvbuf_append(out, e.raw, e.rawlen);
    }
    rc = rewrite_end(&w, rc, w.old - removed);
    return rc ? rc : removed;
}
