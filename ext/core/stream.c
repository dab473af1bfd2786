/* stream.c - a stream's entries: IDs, batches, append, delete, trim, iterate
 * (format and rules in stream.h; consumer groups in stream_group.c). The bytes
 * of a batch are trusted here: this file wrote them, or xs_decode checked them. */
#include "core/stream.h"

#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"
#include "core/stream_int.h"
#include "core/varint.h"

#define XS_MAX_ENTRY (512u * 1024 * 1024)
#define XS_MIN_CAP 64

size_t xs_usable(const void *p) { return p ? malloc_usable_size((void *)p) : 0; }

/* ---- IDs */

struct xs_id xs_id_next(struct xs_id a, int *ok)
{
    *ok = 1;
    if (a.seq != UINT64_MAX)
        return (struct xs_id){a.ms, a.seq + 1};
    if (a.ms != UINT64_MAX)
        return (struct xs_id){a.ms + 1, 0};
    *ok = 0;
    return a;
}

struct xs_id xs_id_prev(struct xs_id a, int *ok)
{
    *ok = 1;
    if (a.seq)
        return (struct xs_id){a.ms, a.seq - 1};
    if (a.ms)
        return (struct xs_id){a.ms - 1, UINT64_MAX};
    *ok = 0;
    return a;
}

/* By hand, not snprintf: every XADD's reply formats one (vfprintf was a tenth
 * of the server's user time under pipelined XADD). */
int xs_id_format(struct xs_id id, char *buf)
{
    int n = put_decimal(buf, id.ms);
    buf[n++] = '-';
    n += put_decimal(buf + n, id.seq);
    buf[n] = 0;
    return n;
}

/* One part of an ID as Redis's string2ull reads it: its strtoull fallback also
 * takes leading blanks, a '+' and leading zeros; at most 64 bits. */
static int parse_u64(const char *p, size_t n, uint64_t *out)
{
    size_t i = 0;
    while (i < n && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r')))
        i++;
    if (i < n && p[i] == '+')
        i++;
    if (i == n)
        return -EINVAL;
    uint64_t v = 0;
    for (; i < n; i++) {
        unsigned d = (unsigned char)p[i] - '0';
        if (d > 9 || v > (UINT64_MAX - d) / 10)
            return -EINVAL;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

int xs_id_parse(const char *p, size_t n, int strict, uint64_t missing_seq, struct xs_id *out, int *seq_star)
{
    if (seq_star)
        *seq_star = 0;
    if (n > XS_ID_ARG_MAX)
        return -EINVAL;
    if (n == 1 && (p[0] == '-' || p[0] == '+')) {
        if (strict)
            return -EINVAL;
        *out = p[0] == '-' ? XS_ID_MIN : XS_ID_MAX;
        return 0;
    }
    const char *dash = memchr(p, '-', n);
    if (!dash) {
        out->seq = missing_seq;
        return parse_u64(p, n, &out->ms);
    }
    if (parse_u64(p, (size_t)(dash - p), &out->ms))
        return -EINVAL;
    size_t rest = n - (size_t)(dash - p) - 1;
    if (seq_star && rest == 1 && dash[1] == '*') {
        *seq_star = 1;
        out->seq = 0;
        return 0;
    }
    return parse_u64(dash + 1, rest, &out->seq);
}

/* ---- the batch array */


__thread const struct xs_watch *xs_watch;

/* A read of b: its second chance against the evictor. */
static inline void touch(const struct xs_batch *b)
{
    if (!b->used)
        ((struct xs_batch *)b)->used = 1;
}

static inline void watch(const struct xs_batch *b, int ev)
{
    if (xs_watch)
        xs_watch->fn(xs_watch->arg, b, ev);
}

static void mem_move(struct xstream *s, size_t was, size_t now)
{
    s->mem = s->mem - was + now;
}

static int arr_push(struct xstream *s, struct xs_batch *b)
{
    if (s->head + s->n == s->cap) {
        if (s->head && s->head >= s->n) { /* half or more empty at the front: slide down */
            memmove(s->b, s->b + s->head, s->n * sizeof *s->b);
            s->head = 0;
        } else {
            size_t cap = s->cap ? s->cap * 2 : 4, was = xs_usable(s->b);
            struct xs_batch **nb = realloc(s->b, cap * sizeof *nb);
            if (!nb)
                return -ENOMEM;
            s->b = nb;
            s->cap = cap;
            mem_move(s, was, xs_usable(nb));
        }
    }
    s->b[s->head + s->n++] = b;
    return 0;
}

static void batch_free(struct xstream *s, struct xs_batch *b)
{
    s->mem -= xs_usable(b);
    free(b);
}

/* Remove batch i (relative): its live entries leave the length. */
static void arr_remove(struct xstream *s, size_t i)
{
    struct xs_batch *b = bat(s, i);
    s->length -= b->count - b->deleted;
    s->ngone -= b->gone;
    if (b->sealed)
        watch(b, XS_EV_GONE);
    batch_free(s, b);
    if (i == 0) {
        s->head++;
    } else {
        memmove(s->b + s->head + i, s->b + s->head + i + 1, (s->n - i - 1) * sizeof *s->b);
    }
    if (!--s->n)
        s->head = 0;
}

static struct xs_batch *open_batch(const struct xstream *s)
{
    return s->n && !bat(s, s->n - 1)->sealed ? bat(s, s->n - 1) : NULL;
}

static void seal(struct xstream *s, struct xs_batch *b)
{
    b->sealed = 1;
    if (b->cap > b->len) { /* give back the room it will never use */
        size_t was = xs_usable(b);
        struct xs_batch *nb = realloc(b, sizeof *b + b->len);
        if (nb) { /* shrinking in place or moving: the array's pointer follows */
            for (size_t i = s->n; i-- > 0;)
                if (bat(s, i) == b) {
                    s->b[s->head + i] = nb;
                    break;
                }
            nb->cap = nb->len;
            mem_move(s, was, xs_usable(nb));
            b = nb;
        }
    }
    watch(b, XS_EV_SEALED);
}

/* The index of the last batch whose first ID is <= id (0 when none is). */
static size_t find_batch(const struct xstream *s, struct xs_id id)
{
    size_t lo = 0, hi = s->n; /* answer in [lo, hi) */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (xs_cmp(bat(s, mid)->first, id) <= 0)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* ---- entries */

size_t xs_entry_at(const struct xs_batch *b, size_t off, struct xs_entry *e)
{
    const unsigned char *p = b->data + off, *end = b->data + b->len;
    uint64_t dms = 0, seq = 0, nf = 0, l;
    e->deleted = (*p++ & XS_F_DELETED) != 0;
    if (get_varint(&p, end, &dms) || get_varint(&p, end, &seq) || get_varint(&p, end, &nf))
        return b->len; /* not reached with checked bytes: end the batch */
    e->id = (struct xs_id){b->first.ms + dms, seq};
    e->nfields = (uint32_t)nf;
    e->fields = p;
    for (uint64_t i = 0; i < 2 * nf; i++) {
        if (get_varlen(&p, end, &l))
            return b->len;
        p += l;
    }
    e->end = p;
    e->batch = b;
    e->off = off;
    return (size_t)(p - b->data);
}

int xs_field_next(const struct xs_entry *e, const unsigned char **pp, struct xs_field *out)
{
    const unsigned char *p = *pp;
    uint64_t fl, vl;
    if (p >= e->end || get_varlen(&p, e->end, &fl))
        return 0;
    out->f = (const char *)p;
    out->flen = fl;
    p += fl;
    if (get_varlen(&p, e->end, &vl))
        return 0;
    out->v = (const char *)p;
    out->vlen = vl;
    *pp = p + vl;
    return 1;
}

struct xstream *xs_new(void)
{
    struct xstream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    list_init(&s->groups);
    s->mem = xs_usable(s);
    return s;
}

void xs_free(struct xstream *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        free(bat(s, i));
    free(s->b);
    xs_groups_free(s);
    free(s);
}

int xs_next_id(const struct xstream *s, int autoid, int seq_star, struct xs_id given, uint64_t now_ms,
               struct xs_id *out)
{
    struct xs_id last = s->last_id;
    int ok;
    if (autoid) {
        if (now_ms > last.ms) {
            *out = (struct xs_id){now_ms, 0};
            return 0;
        }
        *out = xs_id_next(last, &ok);
        return ok ? 0 : XS_E_EXHAUSTED;
    }
    if (seq_star) {
        if (given.ms > last.ms) {
            *out = (struct xs_id){given.ms, 0};
            return 0;
        }
        if (given.ms < last.ms || last.seq == UINT64_MAX)
            return XS_E_SMALL;
        *out = (struct xs_id){given.ms, last.seq + 1};
        return 0;
    }
    if (xs_is_zero(given))
        return XS_E_ZERO;
    if (xs_cmp(given, last) <= 0)
        return XS_E_SMALL;
    *out = given;
    return 0;
}

/* The open batch b cannot take an entry of need bytes: sealed first. */
static int batch_full(const struct xs_batch *b, size_t need, int64_t now_ms, int64_t seal_ms)
{
    return b->count >= XS_BATCH_ENTRIES || b->len + need > XS_BATCH_BYTES ||
           (seal_ms > 0 && b->born_ms <= now_ms - seal_ms);
}

int xs_add(struct xstream *s, struct xs_id id, const struct xs_field *f, size_t nf, int64_t now_ms,
           int64_t seal_ms)
{
    if (!nf || nf > XS_MAX_FIELDS)
        return -EINVAL;
    size_t body = varint_size(nf);
    for (size_t i = 0; i < nf; i++) {
        body += varint_size(f[i].flen) + varint_size(f[i].vlen) + f[i].flen + f[i].vlen;
        if (body > XS_MAX_ENTRY)
            return -E2BIG;
    }
    struct xs_batch *b = open_batch(s);
    size_t need = 0, least = XS_MIN_CAP;
    if (b) {
        need = 1 + varint_size(id.ms - b->first.ms) + varint_size(id.seq) + body;
        if (batch_full(b, need, now_ms, seal_ms)) {
            /* a stream that fills batches gets its next one whole at once, not by
             * doubling from XS_MIN_CAP (five reallocs per batch); a slow one's
             * batches, sealed by age, start small */
            if (b->len + need > XS_BATCH_BYTES || b->count >= XS_BATCH_ENTRIES)
                least = XS_BATCH_BYTES;
            seal(s, b);
            b = NULL;
        }
    }
    if (!b) {
        need = 2 + varint_size(id.seq) + body; /* the first entry: ms delta 0, one byte */
        size_t cap = need > least ? need : least;
        b = malloc(sizeof *b + cap);
        if (!b)
            return -ENOMEM;
        memset(b, 0, sizeof *b);
        b->cap = (uint32_t)cap;
        b->first = b->last = id;
        b->no = s->next_no;
        b->born_ms = now_ms;
        if (arr_push(s, b)) {
            free(b);
            return -ENOMEM;
        }
        s->next_no++;
        s->mem += xs_usable(b);
    } else if (b->cap - b->len < need) {
        size_t cap = (size_t)b->cap * 2;
        if (cap < b->len + need)
            cap = b->len + need;
        if (cap > XS_BATCH_BYTES && b->len + need <= XS_BATCH_BYTES)
            cap = XS_BATCH_BYTES;
        size_t was = xs_usable(b);
        struct xs_batch *nb = realloc(b, sizeof *nb + cap);
        if (!nb)
            return -ENOMEM;
        nb->cap = (uint32_t)cap;
        s->b[s->head + s->n - 1] = b = nb;
        mem_move(s, was, xs_usable(nb));
    }
    unsigned char *p = b->data + b->len;
    *p++ = 0;
    p += put_varint(p, id.ms - b->first.ms);
    p += put_varint(p, id.seq);
    p += put_varint(p, nf);
    for (size_t i = 0; i < nf; i++) {
        p += put_varint(p, f[i].flen);
        memcpy(p, f[i].f, f[i].flen);
        p += f[i].flen;
        p += put_varint(p, f[i].vlen);
        memcpy(p, f[i].v, f[i].vlen);
        p += f[i].vlen;
    }
    b->len = (uint32_t)(p - b->data);
    b->last = id;
    b->count++;
    s->length++;
    s->entries_added++;
    s->last_id = id;
    return 0;
}

int xs_seal_aged(struct xstream *s, int64_t older_than_ms)
{
    struct xs_batch *b = open_batch(s);
    if (!b || !b->count || b->born_ms > older_than_ms)
        return 0;
    seal(s, b);
    return 1;
}

/* ---- finding */

void xs_iter_init(struct xs_iter *it, const struct xstream *s, struct xs_id lo, struct xs_id hi, int rev,
                  int with_deleted)
{
    memset(it, 0, sizeof *it);
    it->s = s;
    it->lo = lo;
    it->hi = hi;
    it->rev = rev;
    it->with_deleted = with_deleted;
    it->done = !s->n || xs_cmp(lo, hi) > 0;
}

/* The iteration needs batch bi, gone: it ends here (its result is thrown away:
 * going on would only want every gone batch after it), wanting bi and, as
 * read-ahead, the gone batches that follow in its direction within its range:
 * up to XS_READ_AHEAD, or, when the caller said how many entries it takes
 * (it->want), the batches after bi that hold the rest of them (bi itself is
 * not counted: the range may start late in it). A random read of COUNT 10
 * then brings back 2 batches, not 17; a consumer reading on brings back what
 * its COUNT covers. */
static void miss(struct xs_iter *it, size_t bi)
{
    const struct xstream *s = it->s;
    xs_missing(s, bat(s, bi));
    uint64_t need = it->want ? it->want - it->given : UINT64_MAX, have = 0;
    for (size_t k = 1; k <= XS_READ_AHEAD && have < need; k++) {
        size_t j = it->rev ? bi - k : bi + k;
        if (it->rev ? k > bi : j >= s->n)
            break;
        const struct xs_batch *b = bat(s, j);
        if (it->rev ? xs_cmp(b->last, it->lo) < 0 : xs_cmp(b->first, it->hi) > 0)
            break;
        if (b->gone)
            xs_missing(s, b);
        have += b->count - b->deleted;
    }
    it->done = 1;
}

/* Backward: the entry offsets of batch bi, last one read first. */
static int collect(struct xs_iter *it)
{
    const struct xs_batch *b = bat(it->s, it->bi);
    it->noffs = it->oi = 0;
    if (b->gone) {
        miss(it, it->bi);
        return 0;
    }
    touch(b);
    if (it->capoffs < b->count) {
        size_t *no = realloc(it->offs, b->count * sizeof *no);
        if (!no)
            return -ENOMEM;
        it->offs = no;
        it->capoffs = b->count;
    }
    struct xs_entry e;
    it->noffs = 0;
    for (size_t off = 0; off < b->len && it->noffs < it->capoffs;) {
        it->offs[it->noffs++] = off;
        off = xs_entry_at(b, off, &e);
    }
    it->oi = it->noffs;
    return 0;
}

int xs_iter_next(struct xs_iter *it, struct xs_entry *e)
{
    const struct xstream *s = it->s;
    if (it->done)
        return 0;
    if (!it->rev) {
        if (!it->started) {
            it->started = 1;
            it->bi = find_batch(s, it->lo);
            it->off = 0;
        }
        while (it->bi < s->n) {
            const struct xs_batch *b = bat(s, it->bi);
            if (it->off >= b->len || xs_cmp(b->last, it->lo) < 0) {
                it->bi++;
                it->off = 0;
                continue;
            }
            if (xs_cmp(b->first, it->hi) > 0)
                break;
            if (!it->off && b->gone) {
                miss(it, it->bi);
                return 0;
            }
            if (!it->off)
                touch(b);
            it->off = xs_entry_at(b, it->off, e);
            if (xs_cmp(e->id, it->lo) < 0)
                continue;
            if (xs_cmp(e->id, it->hi) > 0)
                break;
            if (e->deleted && !it->with_deleted)
                continue;
            it->given++;
            return 1;
        }
        it->done = 1;
        return 0;
    }
    if (!it->started) {
        it->started = 1;
        it->bi = find_batch(s, it->hi);
        if (collect(it))
            return -ENOMEM;
    }
    for (;;) {
        if (it->done)
            return 0; /* a gone batch ended it */
        if (!it->oi) {
            if (!it->bi)
                break;
            it->bi--;
            if (xs_cmp(bat(s, it->bi)->last, it->lo) < 0)
                break;
            if (collect(it))
                return -ENOMEM;
            continue;
        }
        xs_entry_at(bat(s, it->bi), it->offs[--it->oi], e);
        if (xs_cmp(e->id, it->hi) > 0)
            continue;
        if (xs_cmp(e->id, it->lo) < 0)
            break;
        if (e->deleted && !it->with_deleted)
            continue;
        it->given++;
        return 1;
    }
    it->done = 1;
    return 0;
}

void xs_iter_done(struct xs_iter *it)
{
    free(it->offs);
    it->offs = NULL;
    it->capoffs = it->noffs = 0;
}

int xs_first(const struct xstream *s, struct xs_entry *e)
{
    struct xs_iter it;
    xs_iter_init(&it, s, XS_ID_MIN, XS_ID_MAX, 0, 0);
    int rc = xs_iter_next(&it, e);
    xs_iter_done(&it);
    return rc;
}

int xs_last(const struct xstream *s, struct xs_entry *e)
{
    /* backward through the last batches; the array is short-lived (one batch's offsets) */
    struct xs_iter it;
    xs_iter_init(&it, s, XS_ID_MIN, XS_ID_MAX, 1, 0);
    int rc = xs_iter_next(&it, e);
    xs_iter_done(&it);
    return rc;
}

int xs_lookup(const struct xstream *s, struct xs_id id, struct xs_entry *e)
{
    struct xs_iter it;
    xs_iter_init(&it, s, id, id, 0, 0);
    int rc = xs_iter_next(&it, e);
    xs_iter_done(&it);
    return rc;
}

size_t xs_batch_index(const struct xstream *s, uint64_t no)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (bat(s, mid)->no < no)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

const struct xs_batch *xs_batch_by_no(const struct xstream *s, uint64_t no)
{
    size_t i = xs_batch_index(s, no);
    return i < s->n && bat(s, i)->no == no ? bat(s, i) : NULL;
}

size_t xs_pull_encode(const struct xs_batch *b, unsigned char *out, size_t room)
{
    int fits = b->len <= room - XS_PULL_HDR;
    out[0] = !fits ? XS_PULL_TOO_LARGE : b->sealed ? XS_PULL_SEALED : XS_PULL_OPEN;
    out[1] = 0;
    put_be16(out + 2, (uint16_t)b->count);
    put_be32(out + 4, b->version);
    put_be64(out + 8, b->no);
    put_be64(out + 16, b->first.ms);
    if (!fits)
        return XS_PULL_HDR;
    memcpy(out + XS_PULL_HDR, b->data, b->len);
    return XS_PULL_HDR + b->len;
}

/* ---- deleting and trimming */

/* Mark the entry at off of batch i deleted (it is live). */
static void mark_deleted(struct xstream *s, struct xs_batch *b, size_t off)
{
    b->data[off] |= XS_F_DELETED;
    b->file.seg = 0; /* its copy in the batch store is not what it holds now */
    b->deleted++;
    b->version++;
    s->length--;
    if (b->sealed)
        watch(b, XS_EV_CHANGED);
}

int xs_del(struct xstream *s, struct xs_id id)
{
    if (!s->n)
        return 0;
    size_t i = find_batch(s, id);
    struct xs_batch *b = bat(s, i);
    if (xs_cmp(id, b->first) < 0 || xs_cmp(id, b->last) > 0 || xs_missing(s, b))
        return 0;
    struct xs_entry e;
    for (size_t off = 0; off < b->len;) {
        size_t next = xs_entry_at(b, off, &e);
        int c = xs_cmp(e.id, id);
        if (c > 0)
            return 0;
        if (!c) {
            if (e.deleted)
                return 0;
            mark_deleted(s, b, off);
            if (xs_cmp(id, s->max_deleted) > 0)
                s->max_deleted = id;
            if (b->deleted == b->count && b->sealed)
                arr_remove(s, i); /* nothing left in it: as Redis frees an empty node */
            return 1;
        }
        off = next;
    }
    return 0;
}

uint64_t xs_trim_plan(const struct xstream *s, int by_minid, uint64_t maxlen, struct xs_id minid, int approx,
                      uint64_t limit, struct xs_cut *cut)
{
    uint64_t removed = 0, excess = !by_minid && s->length > maxlen ? s->length - maxlen : 0;
    *cut = (struct xs_cut){0, XS_ID_MIN};
    if (!by_minid && !excess)
        return 0;
    size_t i = 0;
    for (; i < s->n; i++) { /* whole batches */
        const struct xs_batch *b = bat(s, i);
        uint64_t live = b->count - b->deleted;
        if (by_minid ? xs_cmp(b->last, minid) >= 0 : removed + live > excess)
            break;
        if (approx && limit && removed + live > limit)
            break;
        removed += live;
    }
    if (i == s->n) {
        cut->all = 1;
        return removed;
    }
    const struct xs_batch *b = bat(s, i);
    cut->below = b->first;
    if (approx || xs_missing(s, b))
        return removed;
    struct xs_entry e;
    for (size_t off = 0; off < b->len;) { /* exact: the first entries of the batch it stops in */
        off = xs_entry_at(b, off, &e);
        if (e.deleted)
            continue;
        if (by_minid ? xs_cmp(e.id, minid) >= 0 : removed == excess) {
            cut->below = e.id;
            return removed;
        }
        removed++;
    }
    if (i + 1 < s->n)
        cut->below = bat(s, i + 1)->first; /* only deleted entries were left in it */
    else
        cut->all = 1;
    return removed;
}

void xs_cut(struct xstream *s, const struct xs_cut *cut)
{
    while (s->n && (cut->all || xs_cmp(bat(s, 0)->last, cut->below) < 0))
        arr_remove(s, 0);
    if (!s->n)
        return;
    struct xs_batch *b = bat(s, 0);
    struct xs_entry e;
    if (xs_cmp(b->first, cut->below) >= 0 || xs_missing(s, b))
        return;
    for (size_t off = 0; off < b->len;) {
        size_t next = xs_entry_at(b, off, &e);
        if (xs_cmp(e.id, cut->below) >= 0)
            break;
        if (!e.deleted)
            mark_deleted(s, b, off);
        off = next;
    }
}

uint64_t xs_trim_maxlen(struct xstream *s, uint64_t threshold, int approx, uint64_t limit)
{
    struct xs_cut cut;
    uint64_t n = xs_trim_plan(s, 0, threshold, XS_ID_MIN, approx, limit, &cut);
    if (n)
        xs_cut(s, &cut);
    return n;
}

uint64_t xs_trim_minid(struct xstream *s, struct xs_id minid, int approx, uint64_t limit)
{
    struct xs_cut cut;
    uint64_t n = xs_trim_plan(s, 1, 0, minid, approx, limit, &cut);
    if (n)
        xs_cut(s, &cut);
    return n;
}
