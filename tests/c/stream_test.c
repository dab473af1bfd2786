/* stream_test.c - a stream value (ext/core/stream.c, stream_group.c) against a
 * plain model; built with AddressSanitizer+UBSan by tests/c/test_c_sanitizers.py.
 *
 * usage: stream_test SEED ROUNDS
 *
 * 1. IDs: parsing ("ms", "ms-seq", "ms-*", refusals), formatting, next/prev at
 *    the edges, XADD's ID rules (auto with the clock behind, ms-*, 0-0, equal
 *    or smaller, the last possible ID).
 * 2. Entries: random XADD (auto, explicit and ms-* IDs, 1-3 fields, values of
 *    0-3000 bytes: some larger than a batch), XDEL (present, deleted, absent),
 *    exact and approximate MAXLEN/MINID trims with and without LIMIT, sealing by
 *    age; after each, checked against a sorted list of entries: the length,
 *    every entry and field byte for byte by random forward and backward ranges,
 *    first/last/lookup, the batches' invariants (IDs ascending, sealed batches
 *    within XS_BATCH_BYTES unless one entry alone is larger, numbers ascending
 *    and found by xs_batch_by_no) and the memory count (every allocation's
 *    usable size). An approximate trim must remove whole batches only, never
 *    past the threshold or the LIMIT.
 *    With batches leaving memory (xs_evict, as the data file's batch store has
 *    them): every read marks the gone batches it needs, which come back
 *    (xs_wanted, xs_restore) before the read is run again; ASan sees any read
 *    of a gone batch's bytes; the memory count holds with batches gone; a
 *    stream through its batch-store form (xs_encode_refs) comes back with its
 *    batches gone (XS_FETCH_LATER) or read (a fetch function).
 * 3. Groups: random deliveries, acknowledgements, ownership changes and consumer
 *    deletions against a sorted model of the PEL; xs_pel_ceil from random IDs;
 *    pending counts per consumer; the memory count again; everything freed
 *    (LeakSanitizer).
 * 4. Damaged bytes: mutated streams (both forms: whole, and the batch store's
 *    references, decoded with batches gone or read) and deltas are refused or
 *    make a stream whose invariants hold.
 * Prints "... ok" and exits 0 on success. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/kvbuf.h"
#include "core/stream.h"
#include "stress.h"

static size_t us(const void *p) { return p ? malloc_usable_size((void *)p) : 0; }

/* ---- 1. IDs */

static struct xs_id id(uint64_t ms, uint64_t seq) { return (struct xs_id){ms, seq}; }

static int parse(const char *text, uint64_t missing, struct xs_id *out, int *star)
{
    return xs_id_parse(text, strlen(text), 1, missing, out, star);
}

static void test_ids(void)
{
    struct xs_id x;
    int star, ok;
    CHECK(!parse("12", 0, &x, NULL) && x.ms == 12 && x.seq == 0);
    CHECK(!parse("12", UINT64_MAX, &x, NULL) && x.seq == UINT64_MAX);
    CHECK(!parse("12-7", 0, &x, NULL) && x.ms == 12 && x.seq == 7);
    CHECK(!parse("18446744073709551615-18446744073709551615", 0, &x, NULL) && x.ms == UINT64_MAX &&
          x.seq == UINT64_MAX);
    CHECK(!parse("5-*", 0, &x, &star) && star && x.ms == 5);
    CHECK(parse("5-*", 0, &x, NULL) == -EINVAL); /* not where ms-* is meaningless */
    CHECK(!parse("+7- 007", 0, &x, NULL) && x.ms == 7 && x.seq == 7); /* string2ull's leniency */
    CHECK(!xs_id_parse("+", 1, 0, 0, &x, NULL) && !xs_cmp(x, XS_ID_MAX));
    CHECK(!xs_id_parse("-", 1, 0, 0, &x, NULL) && !xs_cmp(x, XS_ID_MIN));
    char longid[XS_ID_ARG_MAX + 2];
    memset(longid, '1', sizeof longid - 1);
    longid[sizeof longid - 1] = 0;
    const char *bad[] = {"", "-", "+", "1-", "-1", "a", "1-a", "1-2-3", "+", " ", "1+", "18446744073709551616",
                         "1-18446744073709551616", "1-*1", "*", longid};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(parse(bad[i], 0, &x, &star) == -EINVAL, " %s", bad[i]);
    char buf[XS_ID_STR];
    CHECK(xs_id_format(XS_ID_MAX, buf) == 41 && !strcmp(buf, "18446744073709551615-18446744073709551615"));
    CHECK(xs_cmp(xs_id_next(id(1, UINT64_MAX), &ok), id(2, 0)) == 0 && ok);
    xs_id_next(XS_ID_MAX, &ok);
    CHECK(!ok);
    CHECK(xs_cmp(xs_id_prev(id(2, 0), &ok), id(1, UINT64_MAX)) == 0 && ok);
    xs_id_prev(XS_ID_MIN, &ok);
    CHECK(!ok);

    struct xstream *s = xs_new();
    CHECK(s);
    CHECK(xs_next_id(s, 0, 0, id(0, 0), 5, &x) == XS_E_ZERO);
    CHECK(!xs_next_id(s, 0, 1, id(0, 0), 5, &x) && !xs_cmp(x, id(0, 1))); /* 0-* on a new stream: 0-1 */
    CHECK(!xs_next_id(s, 1, 0, XS_ID_MIN, 100, &x) && !xs_cmp(x, id(100, 0)));
    struct xs_field f = {"f", "v", 1, 1};
    CHECK(!xs_add(s, id(100, 5), &f, 1, 0, 0));
    CHECK(!xs_next_id(s, 1, 0, XS_ID_MIN, 50, &x) && !xs_cmp(x, id(100, 6))); /* the clock went back */
    CHECK(!xs_next_id(s, 0, 1, id(100, 0), 0, &x) && !xs_cmp(x, id(100, 6)));
    CHECK(!xs_next_id(s, 0, 1, id(101, 0), 0, &x) && !xs_cmp(x, id(101, 0)));
    CHECK(xs_next_id(s, 0, 1, id(99, 0), 0, &x) == XS_E_SMALL);
    CHECK(xs_next_id(s, 0, 0, id(100, 5), 0, &x) == XS_E_SMALL);
    CHECK(!xs_next_id(s, 0, 0, id(100, 6), 0, &x));
    CHECK(!xs_add(s, id(100, UINT64_MAX), &f, 1, 0, 0));
    CHECK(xs_next_id(s, 0, 1, id(100, 0), 0, &x) == XS_E_SMALL); /* no seq left in 100 */
    CHECK(!xs_next_id(s, 1, 0, XS_ID_MIN, 0, &x) && !xs_cmp(x, id(101, 0)));
    CHECK(!xs_add(s, XS_ID_MAX, &f, 1, 0, 0));
    CHECK(xs_next_id(s, 1, 0, XS_ID_MIN, 0, &x) == XS_E_EXHAUSTED);
    CHECK(s->length == 3 && s->entries_added == 3);
    xs_free(s);
}

/* ---- 2. entries against a model */

#define MAXV 3000

struct ment {
    struct xs_id id;
    int nf;
    size_t len[3];
    unsigned char seedb[3]; /* value i of the entry is len[i] bytes of seedb[i] + k */
};

struct model {
    struct ment *e; /* live entries, ascending */
    size_t n, cap;
};

static void fill(unsigned char *p, size_t n, unsigned char seed)
{
    for (size_t k = 0; k < n; k++)
        p[k] = (unsigned char)(seed + k * 7);
}

static unsigned char vbuf[3][MAXV];

/* A dry run of check_model: the reads are made (marking the gone batches they
 * need), their results not checked. */
static int dry;
#define MCHECK(cond, ...)                                                 \
    do {                                                                  \
        if (!(cond) && !dry) /* (cond evaluated either way: it reads) */ \
            fail_at(__FILE__, __LINE__, #cond, " " __VA_ARGS__);          \
    } while (0)

static void check_entry(const struct xs_entry *e, const struct ment *m)
{
    MCHECK(!xs_cmp(e->id, m->id), " %" PRIu64 "-%" PRIu64 " vs %" PRIu64 "-%" PRIu64, e->id.ms, e->id.seq,
          m->id.ms, m->id.seq);
    MCHECK(!e->deleted && e->nfields == (uint32_t)m->nf);
    const unsigned char *p = e->fields;
    struct xs_field f;
    unsigned char want[MAXV];
    for (int i = 0; i < m->nf; i++) {
        MCHECK(xs_field_next(e, &p, &f));
        MCHECK(f.flen == 2 && f.f[0] == 'f' && f.f[1] == '0' + i);
        fill(want, m->len[i], m->seedb[i]);
        MCHECK(f.vlen == m->len[i] && !memcmp(f.v, want, f.vlen));
    }
    MCHECK(!xs_field_next(e, &p, &f));
}

static size_t stream_mem(const struct xstream *s)
{
    size_t m = us(s) + us(s->b);
    for (size_t i = 0; i < s->n; i++)
        m += us(s->b[s->head + i]);
    for (struct list *n = s->groups.next; n != &s->groups; n = n->next) {
        struct xs_group *g = list_entry(n, struct xs_group, node);
        m += us(g) + us(g->name);
        for (struct list *c = g->consumers.next; c != &g->consumers; c = c->next) {
            struct xs_consumer *k = list_entry(c, struct xs_consumer, node);
            m += us(k) + us(k->name);
        }
        for (struct xs_nack *x = xs_pel_ceil(g, XS_ID_MIN, 0); x; x = xs_pel_ceil(g, x->id, 1))
            m += us(x);
    }
    return m;
}

/* layout: also the bounds stream.c keeps when it builds batches (a decoded
 * stream need not: the bounds may change between versions). */
static void check_batches(const struct xstream *s, int layout)
{
    uint64_t live = 0;
    for (size_t i = 0; i < s->n; i++) {
        const struct xs_batch *b = s->b[s->head + i];
        CHECK(b->count >= 1 && b->deleted <= b->count && (b->gone ? !b->cap && b->sealed : b->len <= b->cap));
        CHECK(xs_cmp(b->first, b->last) <= 0);
        if (i) {
            const struct xs_batch *a = s->b[s->head + i - 1];
            CHECK(xs_cmp(a->last, b->first) < 0 && a->no < b->no && a->sealed);
        }
        CHECK(xs_batch_by_no(s, b->no) == b);
        if (layout && b->sealed && b->count > 1)
            CHECK(b->len <= XS_BATCH_BYTES, " sealed batch of %u bytes", b->len);
        CHECK(!layout || b->count <= XS_BATCH_ENTRIES);
        if (b->gone) { /* its header alone is in memory */
            live += b->count - b->deleted;
            continue;
        }
        struct xs_entry e;
        uint32_t n = 0, d = 0;
        struct xs_id prev = XS_ID_MIN;
        for (size_t off = 0; off < b->len; n++) {
            off = xs_entry_at(b, off, &e);
            CHECK(n == 0 ? !xs_cmp(e.id, b->first) : xs_cmp(e.id, prev) > 0);
            prev = e.id;
            d += e.deleted;
        }
        CHECK(n == b->count && d == b->deleted && !xs_cmp(prev, b->last));
        live += n - d;
    }
    CHECK(live == s->length, " %" PRIu64 " live, length %" PRIu64, live, s->length);
    CHECK(s->mem == stream_mem(s), " mem %zu, counted %zu", s->mem, stream_mem(s));
}

/* ---- batches out of memory: a batch store in memory (reference offset = index) */

static struct kvbuf *store;
static size_t nstore, capstore;

static int fake_stage(void *arg, struct xs_batch *b)
{
    (void)arg;
    if (b->file.seg)
        return 0;
    if (nstore == capstore) {
        capstore = capstore ? 2 * capstore : 64;
        store = realloc(store, capstore * sizeof *store);
        CHECK(store);
    }
    store[nstore] = (struct kvbuf){0};
    CHECK(!kvbuf_append(&store[nstore], b->data, b->len));
    b->file = (struct xs_ref){1, b->len, nstore++, 7};
    return 0;
}

static int fake_fetch(void *arg, const struct xs_ref *ref, void *buf)
{
    (void)arg;
    if (ref->seg != 1 || ref->off >= nstore || store[ref->off].len != ref->len)
        return -ENOENT;
    memcpy(buf, store[ref->off].p, ref->len);
    return 0;
}

static int fake_durable(void *arg, const struct xs_ref *ref)
{
    (void)arg;
    return ref->seg == 1 && ref->off < nstore;
}

/* Every sealed batch into the store, then up to max of them out of memory. */
static size_t evict_some(struct xstream *s, struct rng *r)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->b[s->head + i]->sealed && !s->b[s->head + i]->gone)
            fake_stage(NULL, s->b[s->head + i]);
    for (size_t i = 0; i < s->n; i++) /* (a reader's mark stands for a pass) */
        s->b[s->head + i]->used = 0;
    size_t n = 0;
    xs_evict(s, rng_below(r, 40), rng_below(r, 5), fake_durable, NULL, &n);
    return n;
}

/* The batches a read wanted, back from the store. Returns how many. */
static size_t restore_wanted(struct xstream *s)
{
    uint64_t no[16];
    struct xs_ref ref[16];
    size_t n, back = 0;
    while ((n = xs_wanted(s, no, ref, 16))) {
        for (size_t i = 0; i < n; i++) {
            CHECK(ref[i].off < nstore);
            CHECK(xs_restore(s, no[i], &ref[i], store[ref[i].off].p) == 1, " batch %" PRIu64 " not restored", no[i]);
        }
        back += n;
    }
    xs_missed = 0;
    return back;
}

/* Every gone batch back (wanted first). */
static void restore_all(struct xstream *s)
{
    size_t gone = 0;
    for (size_t i = 0; i < s->n; i++)
        gone += s->b[s->head + i]->gone;
    CHECK(s->ngone == gone, " ngone %zu, %zu gone", s->ngone, gone);
    xs_want_gone(s, SIZE_MAX);
    restore_wanted(s);
    CHECK(!s->ngone);
}

/* s's bytes (xs_encode) into b (emptied first). */
static void enc(const struct xstream *s, struct kvbuf *b)
{
    b->len = 0;
    CHECK(!xs_encode(s, b));
}

/* The twin built from deltas holds exactly what s holds (same bytes), and s
 * survives a trip through its bytes. */
static void check_twin(struct xstream *s, const struct xstream *t)
{
    static struct kvbuf a, b;
    restore_all(s); /* (inline bytes need every batch) */
    enc(s, &a);
    enc(t, &b);
    CHECK(a.len == b.len && !memcmp(a.p, b.p, a.len), " the delta twin differs (%zu vs %zu bytes)", a.len, b.len);
    struct xstream *d;
    CHECK(!xs_decode(a.p, a.len, &d));
    enc(d, &b);
    CHECK(a.len == b.len && !memcmp(a.p, b.p, a.len), " decode + encode changed the bytes");
    CHECK(d->length == s->length && d->mem == stream_mem(d));
    xs_free(d);
    /* the batch store's form: references, then the batches gone (read on demand) or read at once */
    b.len = 0;
    CHECK(!xs_encode_refs(s, &b, fake_stage, NULL));
    for (int later = 0; later < 2; later++) {
        CHECK(!xs_decode_from(b.p, b.len, later ? XS_FETCH_LATER : fake_fetch, NULL, &d));
        check_batches(d, 0);
        CHECK(d->length == s->length && d->mem == stream_mem(d));
        restore_all(d);
        static struct kvbuf c;
        enc(d, &c);
        CHECK(a.len == c.len && !memcmp(a.p, c.p, a.len), " the batch store's form differs (fetch %d)", later);
        xs_free(d);
    }
}

static struct kvbuf delta;

/* Apply one op's delta (built into `delta` by the caller) to the twin. */
static void twin_apply(struct xstream **t, int64_t now, int64_t seal)
{
    int rc = xs_apply(t, delta.p, delta.len, now, seal);
    CHECK(!rc, " xs_apply: %d", rc);
    delta.len = 0;
}

static void check_model(const struct xstream *s, const struct model *m, struct rng *r)
{
    MCHECK(s->length == m->n, " length %" PRIu64 ", model %zu", s->length, m->n);
    check_batches(s, 1); /* (headers only for gone batches: fine when dry) */
    struct xs_entry e;
    int found = xs_first(s, &e); /* (a dry run checks nothing it found: what it read may be partial) */
    MCHECK(found == (m->n > 0));
    if (m->n && found == 1)
        check_entry(&e, &m->e[0]);
    found = xs_last(s, &e);
    MCHECK(found == (m->n > 0));
    if (m->n && found == 1)
        check_entry(&e, &m->e[m->n - 1]);
    for (int k = 0; k < 4; k++) {
        /* random bounds: on entries, between them, beyond them */
        struct xs_id lo = XS_ID_MIN, hi = XS_ID_MAX;
        if (m->n && rng_below(r, 4)) {
            lo = m->e[rng_below(r, m->n)].id;
            if (rng_below(r, 2))
                lo.seq += rng_below(r, 3);
        }
        if (m->n && rng_below(r, 4)) {
            hi = m->e[rng_below(r, m->n)].id;
            if (rng_below(r, 2) && hi.seq)
                hi.seq -= 1;
        }
        int rev = (int)rng_below(r, 2);
        size_t a = 0, z = m->n; /* model's range [a, z) */
        while (a < m->n && xs_cmp(m->e[a].id, lo) < 0)
            a++;
        while (z > a && xs_cmp(m->e[z - 1].id, hi) > 0)
            z--;
        if (xs_cmp(lo, hi) > 0)
            z = a;
        struct xs_iter it;
        xs_iter_init(&it, s, lo, hi, rev, 0);
        size_t got = 0;
        while (xs_iter_next(&it, &e) == 1) {
            MCHECK(a + got < z, " range returned more than the model's %zu", z - a);
            check_entry(&e, &m->e[rev ? z - 1 - got : a + got]);
            got++;
        }
        xs_iter_done(&it);
        MCHECK(got == z - a, " range gave %zu, model %zu", got, z - a);
    }
    if (m->n) {
        const struct ment *x = &m->e[rng_below(r, m->n)];
        found = xs_lookup(s, x->id, &e);
        MCHECK(found == 1);
        if (found == 1)
            check_entry(&e, x);
    }
}

/* check_model's reads, dry, until none misses a gone batch (each round bringing
 * back what they wanted); then the real check, which must not miss. */
static void check_model_evicted(struct xstream *s, const struct model *m, struct rng *r)
{
    for (int k = 0;; k++) {
        CHECK(k < 100, " reads still miss batches after 100 loads");
        struct rng copy = *r;
        xs_missed = 0;
        dry = 1;
        check_model(s, m, &copy);
        dry = 0;
        if (!xs_missed)
            break;
        CHECK(restore_wanted(s) > 0, " a read missed a batch it did not mark wanted");
    }
    check_model(s, m, r);
    CHECK(!xs_missed, " the checked run read a gone batch");
}

/* A change that reads first (as a command does under its lock): the batches it
 * needs come back, then it runs on them. */
static int del_loaded(struct xstream *s, struct xs_id d)
{
    int rc;
    for (xs_missed = 0; !(rc = xs_del(s, d)) && xs_missed;)
        restore_wanted(s);
    return rc;
}

static uint64_t plan_loaded(struct xstream *s, int by_minid, uint64_t maxlen, struct xs_id minid, int approx,
                            uint64_t limit, struct xs_cut *cut)
{
    uint64_t n;
    for (xs_missed = 0;; restore_wanted(s))
        if (n = xs_trim_plan(s, by_minid, maxlen, minid, approx, limit, cut), !xs_missed)
            return n;
}

static void model_drop_front(struct model *m, size_t k)
{
    memmove(m->e, m->e + k, (m->n - k) * sizeof *m->e);
    m->n -= k;
}

/* After an approximate trim: the stream's live entries are a suffix of the model's. */
static size_t model_sync_front(struct model *m, const struct xstream *s)
{
    size_t k = m->n - s->length;
    model_drop_front(m, k);
    return k;
}

static void test_entries(uint64_t seed, long rounds)
{
    struct rng r;
    rng_seed(&r, seed, 1);
    struct xstream *s = xs_new(), *t = NULL;
    struct model m = {0};
    int64_t now = 1000;
    CHECK(!xd_create(&delta));
    twin_apply(&t, now, 0);
    uint64_t adds = 0, dels = 0, trims = 0, approx_removed = 0, evicted = 0;
    for (long i = 0; i < rounds; i++) {
        unsigned op = (unsigned)rng_below(&r, 100);
        now += (int64_t)rng_below(&r, 3);
        if (op < 60) {
            struct ment x = {.nf = 1 + (int)rng_below(&r, 3)};
            struct xs_field f[3];
            char names[3][2];
            for (int k = 0; k < x.nf; k++) {
                unsigned sz = (unsigned)rng_below(&r, 100);
                x.len[k] = sz < 70 ? rng_below(&r, 90) : sz < 97 ? rng_below(&r, 400) : rng_below(&r, MAXV);
                x.seedb[k] = (unsigned char)rng_next(&r);
                fill(vbuf[k], x.len[k], x.seedb[k]);
                names[k][0] = 'f';
                names[k][1] = (char)('0' + k);
                f[k] = (struct xs_field){names[k], (const char *)vbuf[k], 2, x.len[k]};
            }
            unsigned how = (unsigned)rng_below(&r, 3);
            struct xs_id given = {s->last_id.ms + rng_below(&r, 3), rng_below(&r, 4)};
            int rc = xs_next_id(s, how == 0, how == 1, given, (uint64_t)now, &x.id);
            if (rc) {
                CHECK((rc == XS_E_SMALL || rc == XS_E_ZERO) && how == 2, " rc %d how %u", rc, how);
                continue;
            }
            CHECK(xs_cmp(x.id, s->last_id) > 0);
            int64_t seal = rng_below(&r, 2) ? 5 : 0;
            CHECK(!xs_add(s, x.id, f, (size_t)x.nf, now, seal));
            CHECK(!xd_add(&delta, x.id, f, (size_t)x.nf));
            twin_apply(&t, now, seal);
            if (m.n == m.cap) {
                m.cap = m.cap ? m.cap * 2 : 64;
                m.e = realloc(m.e, m.cap * sizeof *m.e);
                CHECK(m.e);
            }
            m.e[m.n++] = x;
            adds++;
        } else if (op < 75) {
            struct xs_id d;
            if (m.n && rng_below(&r, 4)) {
                size_t k = rng_below(&r, m.n);
                d = m.e[k].id;
                CHECK(del_loaded(s, d) == 1);
                CHECK(!xd_del(&delta, &d, 1));
                twin_apply(&t, now, 0);
                CHECK(xs_del(s, d) == 0);
                memmove(m.e + k, m.e + k + 1, (m.n - k - 1) * sizeof *m.e);
                m.n--;
                if (xs_cmp(d, s->max_deleted) > 0)
                    CHECK(0, " max_deleted not kept");
                dels++;
            } else {
                d = (struct xs_id){rng_below(&r, (uint64_t)now + 10), rng_below(&r, 5)};
                size_t k = 0;
                while (k < m.n && xs_cmp(m.e[k].id, d) != 0)
                    k++;
                CHECK(del_loaded(s, d) == (k < m.n));
                if (k < m.n) {
                    CHECK(!xd_del(&delta, &d, 1));
                    twin_apply(&t, now, 0);
                    memmove(m.e + k, m.e + k + 1, (m.n - k - 1) * sizeof *m.e);
                    m.n--;
                }
            }
        } else if (op < 85) {
            int approx = (int)rng_below(&r, 2);
            uint64_t limit = approx && rng_below(&r, 2) ? rng_below(&r, 300) : 0;
            size_t before = m.n;
            uint64_t removed;
            struct xs_cut cut;
            if (rng_below(&r, 2)) {
                uint64_t thr = m.n ? rng_below(&r, m.n + 5) : 0;
                if (rng_below(&r, 3))
                    thr = m.n > 20 ? m.n - rng_below(&r, 20) : thr; /* small trims: the common case */
                if (plan_loaded(s, 0, thr, XS_ID_MIN, approx, limit, &cut)) {
                    CHECK(!xd_cut(&delta, &cut));
                    twin_apply(&t, now, 0);
                }
                removed = xs_trim_maxlen(s, thr, approx, limit);
                if (!approx) {
                    CHECK(removed == (before > thr ? before - thr : 0));
                    model_drop_front(&m, (size_t)removed);
                } else {
                    CHECK(s->length >= thr || before <= thr);
                    CHECK(removed == model_sync_front(&m, s));
                }
            } else {
                struct xs_id minid = m.n ? m.e[rng_below(&r, m.n)].id : id((uint64_t)now, 0);
                size_t below = 0;
                while (below < m.n && xs_cmp(m.e[below].id, minid) < 0)
                    below++;
                if (plan_loaded(s, 1, 0, minid, approx, limit, &cut)) {
                    CHECK(!xd_cut(&delta, &cut));
                    twin_apply(&t, now, 0);
                }
                removed = xs_trim_minid(s, minid, approx, limit);
                if (!approx) {
                    CHECK(removed == below);
                    model_drop_front(&m, below);
                } else {
                    CHECK(removed <= below);
                    CHECK(removed == model_sync_front(&m, s));
                }
            }
            if (approx) {
                CHECK(!limit || removed <= limit, " removed %" PRIu64 " past LIMIT %" PRIu64, removed, limit);
                approx_removed += removed;
            }
            trims++;
        } else if (op < 88) {
            int64_t older = now - (int64_t)rng_below(&r, 10);
            CHECK(xs_seal_aged(s, older) == xs_seal_aged(t, older)); /* not a change: not logged */
        } else if (op < 89 && rng_below(&r, 8) == 0) {
            /* start over now and then: empty streams, first batches */
            CHECK(!xd_cut(&delta, &(struct xs_cut){1, XS_ID_MIN}));
            twin_apply(&t, now, 0);
            xs_cut(s, &(struct xs_cut){1, XS_ID_MIN});
            m.n = 0;
        } else if (op < 90) {
            /* XSETID forward: a larger last ID and count, a deletion recorded */
            struct xs_id last = {s->last_id.ms + rng_below(&r, 3), s->last_id.seq + 1};
            uint64_t added = s->entries_added + rng_below(&r, 3);
            CHECK(!xd_setid(&delta, last, added, s->max_deleted));
            struct xstream *tmp = s;
            CHECK(!xs_apply(&tmp, delta.p, delta.len, now, 0) && tmp == s); /* the same delta on both */
            twin_apply(&t, now, 0);
        }
        if (!rng_below(&r, 3))
            evicted += evict_some(s, &r);
        check_model_evicted(s, &m, &r);
        check_twin(s, t);
        evicted += evict_some(s, &r); /* for the next round's change */
    }
    printf("entries: %" PRIu64 " added, %" PRIu64 " deleted, %" PRIu64 " trims (%" PRIu64
           " removed approximately), %zu batches, %zu live, %" PRIu64 " batches evicted\n", adds, dels, trims,
           approx_removed, s->n, m.n, evicted);
    for (size_t k = 0; k < nstore; k++)
        kvbuf_free(&store[k]);
    nstore = 0;
    free(m.e);
    xs_free(s);
    xs_free(t);
}

/* ---- 3. groups */

struct mpel {
    struct xs_id id;
    int owner;
    uint64_t count;
};

static void test_groups(uint64_t seed, long rounds)
{
    struct rng r;
    rng_seed(&r, seed, 2);
    struct xstream *s = xs_new(), *t = NULL;
    struct xs_group *g = xs_group_create(s, "g1", 2, XS_ID_MIN, XS_ENTRIES_READ_UNKNOWN);
    CHECK(g && xs_group_find(s, "g1", 2) == g && !xs_group_find(s, "g2", 2) && s->ngroups == 1);
    CHECK(xs_group_create(s, "g2", 2, XS_ID_MIN, 0) && s->ngroups == 2);
    CHECK(!xd_create(&delta) && !xd_group(&delta, XOP_GCREATE, "g1", 2, XS_ID_MIN, XS_ENTRIES_READ_UNKNOWN) &&
          !xd_group(&delta, XOP_GCREATE, "g2", 2, XS_ID_MIN, 0));
    twin_apply(&t, 0, 0);
    enum { NC = 5 };
    struct xs_consumer *c[NC] = {0};
    char name[NC][3];
    struct mpel *pel = calloc((size_t)rounds + 1, sizeof *pel);
    size_t npel = 0;
    CHECK(pel);
    uint64_t delivered = 0, acked = 0, deleted_consumers = 0;
    for (long i = 0; i < rounds; i++) {
        unsigned op = (unsigned)rng_below(&r, 100);
        int k = (int)rng_below(&r, NC);
        if (!c[k]) {
            snprintf(name[k], sizeof name[k], "c%d", k);
            CHECK(!xs_consumer_find(g, name[k], 2));
            c[k] = xs_consumer_create(s, g, name[k], 2, i);
            CHECK(c[k] && xs_consumer_find(g, name[k], 2) == c[k]);
            CHECK(!xd_consumer(&delta, XOP_CCREATE, "g1", 2, name[k], 2, i));
            twin_apply(&t, 0, 0);
        }
        struct xs_id x = {rng_below(&r, 200), rng_below(&r, 3)};
        size_t at = 0;
        while (at < npel && xs_cmp(pel[at].id, x) < 0)
            at++;
        int present = at < npel && !xs_cmp(pel[at].id, x);
        if (op < 50) {
            if (present) /* a history read's redelivery: one more, to this consumer */
                CHECK(!xd_deliver(&delta, "g1", 2, name[k], 2, i, 0, &x, 1));
            else /* a new pending entry as XCLAIM FORCE makes it */
                CHECK(!xd_claim(&delta, "g1", 2, name[k], 2, i, &(struct xd_claim){x, i, 1, 1}, 1));
            twin_apply(&t, 0, 0);
            struct xs_nack *n = xs_pel_deliver(s, g, x, c[k], i);
            c[k]->seen_ms = i; /* as the delta's read or claim does */
            CHECK(n && !xs_cmp(n->id, x) && n->owner == c[k] && n->delivery_ms == i);
            if (present) {
                pel[at].owner = k;
                pel[at].count++;
            } else {
                memmove(pel + at + 1, pel + at, (npel - at) * sizeof *pel);
                pel[at] = (struct mpel){x, k, 1};
                npel++;
            }
            CHECK(n->delivery_count == pel[at].count);
            delivered++;
        } else if (op < 85) {
            CHECK(!xd_ack(&delta, "g1", 2, &x, 1));
            twin_apply(&t, 0, 0);
            CHECK(xs_pel_remove(s, g, x) == present);
            if (present) {
                memmove(pel + at, pel + at + 1, (npel - at - 1) * sizeof *pel);
                npel--;
                acked++;
            }
        } else if (op < 95) {
            struct xs_nack *n = xs_pel_find(g, x);
            CHECK((n != NULL) == present);
            if (n) {
                CHECK(!xd_claim(&delta, "g1", 2, name[k], 2, i,
                                &(struct xd_claim){x, n->delivery_ms, n->delivery_count, 0}, 1));
                twin_apply(&t, 0, 0);
                xs_pel_chown(n, c[k]);
                c[k]->seen_ms = i;
                pel[at].owner = k;
            }
        } else {
            uint64_t had = 0;
            for (size_t j = 0; j < npel; j++)
                had += pel[j].owner == k;
            CHECK(!xd_consumer(&delta, XOP_CDELETE, "g1", 2, name[k], 2, 0));
            twin_apply(&t, 0, 0);
            CHECK(xs_consumer_delete(s, g, c[k]) == had);
            c[k] = NULL;
            size_t w = 0;
            for (size_t j = 0; j < npel; j++)
                if (pel[j].owner != k)
                    pel[w++] = pel[j];
            npel = w;
            deleted_consumers++;
        }
        /* the PEL in order, with owners and pending counts */
        CHECK(g->npel == npel);
        uint64_t per[NC] = {0};
        size_t j = 0;
        for (struct xs_nack *n = xs_pel_ceil(g, XS_ID_MIN, 0); n; n = xs_pel_ceil(g, n->id, 1), j++) {
            CHECK(j < npel && !xs_cmp(n->id, pel[j].id) && n->owner == c[pel[j].owner]);
            per[pel[j].owner]++;
        }
        CHECK(j == npel);
        for (int q = 0; q < NC; q++)
            CHECK(!c[q] || c[q]->pending == per[q]);
        struct xs_id from = {rng_below(&r, 210), rng_below(&r, 3)};
        int excl = (int)rng_below(&r, 2);
        size_t w = 0;
        while (w < npel && (xs_cmp(pel[w].id, from) < 0 || (excl && !xs_cmp(pel[w].id, from))))
            w++;
        struct xs_nack *n = xs_pel_ceil(g, from, excl);
        CHECK(w < npel ? n && !xs_cmp(n->id, pel[w].id) : !n);
        n = xs_pel_last(g);
        CHECK(npel ? n && !xs_cmp(n->id, pel[npel - 1].id) : !n);
        CHECK(s->mem == stream_mem(s), " mem %zu, counted %zu", s->mem, stream_mem(s));
        check_twin(s, t);
    }
    printf("groups: %" PRIu64 " deliveries, %" PRIu64 " acks, %" PRIu64 " consumers deleted, %zu pending\n",
           delivered, acked, deleted_consumers, npel);
    xs_group_destroy(s, xs_group_find(s, "g2", 2));
    CHECK(!xd_gdestroy(&delta, "g2", 2));
    twin_apply(&t, 0, 0);
    CHECK(s->ngroups == 1 && s->mem == stream_mem(s));
    check_twin(s, t);
    free(pel);
    xs_free(s);
    xs_free(t); /* the group with its PEL and consumers: LeakSanitizer checks */
}

/* ---- 4. damaged bytes */

static void mutate(struct rng *r, unsigned char *p, size_t *n, size_t cap)
{
    int k = 1 + (int)rng_below(r, 3);
    while (k--) {
        unsigned how = (unsigned)rng_below(r, 5);
        if (how == 0 && *n)
            p[rng_below(r, *n)] ^= (unsigned char)(1u << rng_below(r, 8));
        else if (how == 1 && *n)
            p[rng_below(r, *n)] = (unsigned char)rng_next(r);
        else if (how == 2 && *n)
            *n = rng_below(r, *n); /* truncated */
        else if (how == 3 && *n < cap)
            p[(*n)++] = (unsigned char)rng_next(r);
        else if (*n >= 10) { /* a varint made huge */
            size_t at = rng_below(r, *n - 9);
            memset(p + at, 0xff, 9);
            p[at + 9] = 0x01;
        }
    }
}

static void test_damaged(uint64_t seed, long rounds)
{
    struct rng r;
    rng_seed(&r, seed, 3);
    struct xstream *s = xs_new();
    struct xs_field f[2] = {{"temp", "21.5", 4, 4}, {"unit", "C", 4, 1}};
    for (uint64_t i = 1; i <= 300; i++)
        CHECK(!xs_add(s, (struct xs_id){i * 3, i % 2}, f, 1 + i % 2, (int64_t)i, 0));
    xs_del(s, (struct xs_id){30, 0});
    struct xs_group *g = xs_group_create(s, "grp", 3, (struct xs_id){99, 1}, 33);
    struct xs_consumer *c1 = xs_consumer_create(s, g, "alice", 5, 7), *c2 = xs_consumer_create(s, g, "bob", 3, 8);
    for (uint64_t i = 10; i < 40; i++)
        CHECK(xs_pel_deliver(s, g, (struct xs_id){i * 3, i % 2}, i % 3 ? c1 : c2, (int64_t)i));
    struct kvbuf good = {0}, d = {0}, refs = {0};
    enc(s, &good);
    CHECK(!xs_encode_refs(s, &refs, fake_stage, NULL)); /* the batch store's form too */
    /* a delta of every kind */
    struct xs_id ids[2] = {{60, 0}, {63, 1}};
    CHECK(!xd_add(&d, (struct xs_id){2000, 0}, f, 2) && !xd_del(&d, ids, 2) &&
          !xd_cut(&d, &(struct xs_cut){0, {50, 0}}) && !xd_setid(&d, (struct xs_id){3000, 0}, 400, ids[1]) &&
          !xd_group(&d, XOP_GCREATE, "g2", 2, XS_ID_MIN, -1) && !xd_group(&d, XOP_GSETID, "g2", 2, ids[0], 5) &&
          !xd_consumer(&d, XOP_CCREATE, "g2", 2, "carol", 5, 9) &&
          !xd_deliver(&d, "g2", 2, "carol", 5, 10, XD_NEW, ids, 2) && !xd_ack(&d, "grp", 3, ids, 1) &&
          !xd_claim(&d, "grp", 3, "bob", 3, 11, &(struct xd_claim){{99, 1}, 5, 2, 1}, 1) &&
          !xd_consumer(&d, XOP_CDELETE, "grp", 3, "alice", 5, 0) && !xd_gdestroy(&d, "g2", 2));
    struct xstream *x;
    CHECK(!xs_decode(good.p, good.len, &x));
    CHECK(!xs_apply(&x, d.p, d.len, 100, 0), " the delta of every kind applies");
    check_batches(x, 1);
    CHECK(x->length == 300 - 1 - 2 - 15 + 1 && x->ngroups == 1 && !xs_cmp(x->last_id, (struct xs_id){3000, 0}));
    xs_free(x);
    unsigned char *buf = malloc(good.len + 64), *dbuf = malloc(d.len + 64);
    CHECK(buf && dbuf);
    long decoded = 0, applied = 0;
    for (long i = 0; i < rounds * 4; i++) {
        size_t n = good.len;
        memcpy(buf, good.p, n);
        mutate(&r, buf, &n, good.len + 64);
        unsigned char *exact = malloc(n ? n : 1); /* ASan sees a read past the end */
        memcpy(exact, buf, n);
        if (!xs_decode(exact, n, &x)) {
            decoded++;
            check_batches(x, 0);
            struct kvbuf again = {0};
            enc(x, &again);
            struct xstream *y;
            CHECK(!xs_decode(again.p, again.len, &y), " a stream that decoded encodes to bytes that decode");
            xs_free(y);
            kvbuf_free(&again);
            xs_free(x);
        }
        free(exact);
        /* a damaged delta on a good stream */
        n = d.len;
        memcpy(dbuf, d.p, n);
        mutate(&r, dbuf, &n, d.len + 64);
        exact = malloc(n ? n : 1);
        memcpy(exact, dbuf, n);
        /* the batch store's form, damaged: its batches gone or read from the (good) store */
        size_t rn = refs.len;
        unsigned char *rbuf = malloc(rn + 64);
        CHECK(rbuf);
        memcpy(rbuf, refs.p, rn);
        mutate(&r, rbuf, &rn, refs.len + 64);
        for (int later = 0; later < 2; later++) {
            int rc = xs_decode_from(rbuf, rn, later ? XS_FETCH_LATER : fake_fetch, NULL, &x);
            CHECK(rc == 0 || rc == -EBADMSG || rc == -ENOENT, " xs_decode_from: %d", rc);
            if (rc)
                continue;
            check_batches(x, 0);
            for (size_t k = 0; k < x->n; k++) /* back from the store: what the header says, or refused */
                if (x->b[x->head + k]->gone && x->b[x->head + k]->file.off < nstore &&
                    store[x->b[x->head + k]->file.off].len == x->b[x->head + k]->len) {
                    const struct xs_batch *gb = x->b[x->head + k];
                    struct xs_ref ref = gb->file;
                    rc = xs_restore(x, gb->no, &ref, store[ref.off].p);
                    CHECK(rc == 1 || rc == -EBADMSG, " xs_restore: %d", rc);
                }
            check_batches(x, 0);
            xs_free(x);
        }
        free(rbuf);
        CHECK(!xs_decode(good.p, good.len, &x));
        int rc = xs_apply(&x, exact, n, 100, 0);
        CHECK(rc == 0 || rc == -EBADMSG || rc == -EINVAL, " xs_apply: %d", rc);
        applied += rc == 0;
        check_batches(x, 0);
        xs_free(x);
        free(exact);
    }
    printf("damaged: %ld of %ld mutated streams decoded, %ld mutated deltas applied\n", decoded, rounds * 4,
           applied);
    free(buf);
    free(dbuf);
    kvbuf_free(&good);
    kvbuf_free(&d);
    kvbuf_free(&refs);
    for (size_t k = 0; k < nstore; k++)
        kvbuf_free(&store[k]);
    nstore = 0;
    xs_free(s);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s SEED ROUNDS\n", argv[0]);
        return 2;
    }
    uint64_t seed = strtoull(argv[1], NULL, 10);
    long rounds = strtol(argv[2], NULL, 10);
    test_ids();
    test_entries(seed, rounds);
    test_groups(seed, rounds);
    test_damaged(seed, rounds);
    kvbuf_free(&delta);
    free(store);
    printf("stream ok\n");
    return 0;
}
