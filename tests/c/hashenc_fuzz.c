/* hashenc_fuzz.c - the hash encoding (ext/core/hashenc.c) against a plain model,
 * then its decoder fed damaged bytes; built with AddressSanitizer+UBSan by
 * tests/c/test_c_sanitizers.py.
 *
 * usage: hashenc_fuzz SEED ITERATIONS
 *
 * 1. Exact bytes of a small hash (the format hashenc.h documents), and values
 *    the decoder must refuse (overlong varints, a count too large, trailing bytes).
 * 2. Model: random HSET/HDEL batches (few fields: the compared-in-turn path; many:
 *    the hashed path; fields named twice; a small alphabet so fields recur) on a
 *    list of pairs kept in Redis's listpack order; after each, the encoding
 *    iterates to exactly the model, hashenc_len/find/lookup agree, and the
 *    return values (fields added, removed) are the model's.
 * 3. Decoder: valid encodings mutated (bit flips, bytes set, truncation, bytes
 *    appended or inserted, lengths rewritten to large values) and random bytes,
 *    each copied into a malloc of exactly its size (ASan sees any read past it).
 *    Every reader and writer runs on it (hashenc_entry_at at the entries' and at
 *    random offsets too); checked: every entry they return lies
 *    inside the value; they agree on whether it is valid; a valid value survives
 *    a rewrite with no change byte for byte (one encoding per hash), and an
 *    invalid one makes every writer fail with -EBADMSG and leave out unchanged.
 * Prints "... ok" and exits 0 on success. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hashenc.h"
#include "core/kvbuf.h"
#include "stress.h"

/* ---- the model: pairs in insertion order */

#define MAXF 40 /* field/value lengths up to this (some past 127: two-byte varints) */

struct pair {
    char f[200], v[200];
    size_t fl, vl;
};

struct model {
    struct pair *p;
    size_t n, cap;
};

static long model_find(const struct model *m, const char *f, size_t fl)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->p[i].fl == fl && !memcmp(m->p[i].f, f, fl))
            return (long)i;
    return -1;
}

static void model_set(struct model *m, const char *f, size_t fl, const char *v, size_t vl)
{
    long i = model_find(m, f, fl);
    if (i < 0) {
        if (m->n == m->cap) {
            m->cap = m->cap ? 2 * m->cap : 16;
            m->p = realloc(m->p, m->cap * sizeof *m->p);
            CHECK(m->p);
        }
        i = (long)m->n++;
        memcpy(m->p[i].f, f, fl);
        m->p[i].fl = fl;
    }
    memcpy(m->p[i].v, v, vl);
    m->p[i].vl = vl;
}

static int model_del(struct model *m, const char *f, size_t fl)
{
    long i = model_find(m, f, fl);
    if (i < 0)
        return 0;
    memmove(&m->p[i], &m->p[i + 1], (m->n - (size_t)i - 1) * sizeof *m->p);
    m->n--;
    return 1;
}

/* A field from a small alphabet (so that fields recur), sometimes long. */
static size_t rand_str(struct rng *r, char *dst, int alphabet)
{
    size_t n = rng_below(r, 8) == 0 ? 120 + rng_below(r, 60) : rng_below(r, 4);
    for (size_t i = 0; i < n; i++)
        dst[i] = (char)('a' + rng_below(r, (uint64_t)alphabet));
    return n;
}

static void check_against(const struct model *m, const char *val, size_t vlen)
{
    CHECK(hashenc_validate(val, vlen) == 0);
    CHECK(hashenc_len(val, vlen) == (int64_t)m->n, "len %" PRId64 " model %zu", hashenc_len(val, vlen), m->n);
    struct hashenc_iter it;
    struct hashenc_entry e;
    CHECK(hashenc_iter_init(&it, val, vlen) == 0);
    for (size_t i = 0; i < m->n; i++) {
        CHECK(hashenc_next(&it, &e) == 1);
        CHECK(e.flen == m->p[i].fl && !memcmp(e.f, m->p[i].f, e.flen), "field %zu out of order", i);
        CHECK(e.vlen == m->p[i].vl && !memcmp(e.v, m->p[i].v, e.vlen), "value %zu", i);
        struct hashenc_entry g; /* find: for a few fields (each is a walk) */
        if (i < 4 || i + 4 >= m->n || i % 97 == 0)
            CHECK(hashenc_find(val, vlen, m->p[i].f, m->p[i].fl, &g) == 1 && g.v == e.v);
    }
    CHECK(hashenc_next(&it, &e) == 0);
    CHECK(hashenc_find(val, vlen, "absent!", 7, &e) == 0);
}

static void phase_model(uint64_t seed, long iters)
{
    struct rng r;
    rng_seed(&r, seed, 1);
    struct model m = {0};
    struct kvbuf cur = {0}, next = {0};
    const char *argv[64];
    size_t argl[64];
    char store[64][200];
    for (long it = 0; it < iters; it++) {
        int alphabet = 2 + (int)rng_below(&r, 5);
        size_t k = rng_below(&r, 4) == 0 ? 9 + rng_below(&r, 23) : 1 + rng_below(&r, 8); /* both paths */
        int set = m.n == 0 || rng_below(&r, 3) != 0;
        const char *cv = cur.len ? cur.p : NULL;
        next.len = 0;
        if (set) {
            for (size_t i = 0; i < k; i++) {
                argl[2 * i] = rand_str(&r, store[2 * i], alphabet);
                argl[2 * i + 1] = rand_str(&r, store[2 * i + 1], 26);
                argv[2 * i] = store[2 * i];
                argv[2 * i + 1] = store[2 * i + 1];
            }
            size_t before = m.n;
            for (size_t i = 0; i < k; i++)
                model_set(&m, argv[2 * i], argl[2 * i], argv[2 * i + 1], argl[2 * i + 1]);
            int64_t added = hashenc_set(&next, cv, cur.len, argv, argl, k);
            CHECK(added == (int64_t)(m.n - before), "added %" PRId64 ", model %zu", added, m.n - before);
        } else {
            for (size_t i = 0; i < k; i++) {
                argl[i] = rand_str(&r, store[i], alphabet);
                argv[i] = store[i];
            }
            struct hashenc_fields fs = {argv, argl, k, 1};
            int64_t removed = 0;
            for (size_t i = 0; i < k; i++)
                removed += model_del(&m, argv[i], argl[i]);
            CHECK(hashenc_del(&next, cv, cur.len, &fs) == removed);
        }
        check_against(&m, next.p, next.len);
        /* HMGET's lookup on the new value, with names repeated */
        struct hashenc_entry found[64];
        struct hashenc_fields fs = {argv, argl, k, set ? 2 : 1};
        CHECK(hashenc_lookup(next.p, next.len, &fs, found) == 0);
        for (size_t i = 0; i < k; i++) {
            long mi = model_find(&m, argv[i * fs.stride], argl[i * fs.stride]);
            CHECK((mi < 0) == (found[i].f == NULL), "lookup of field %zu", i);
            if (mi >= 0)
                CHECK(found[i].vlen == m.p[mi].vl && !memcmp(found[i].v, m.p[mi].v, found[i].vlen));
        }
        struct kvbuf t = cur;
        cur = next;
        next = t;
        if (m.n == 0) /* as the server does: the empty hash is deleted */
            cur.len = 0;
        if (rng_below(&r, 500) == 0) { /* start over now and then: many short histories */
            m.n = 0;
            cur.len = 0;
        }
    }
    kvbuf_free(&cur);
    kvbuf_free(&next);
    free(m.p);
}

/* ---- fixed cases */

static void phase_exact(void)
{
    const char *argv[] = {"f", "v1", "g", "", "f", "v2"};
    size_t argl[] = {1, 2, 1, 0, 1, 2};
    struct kvbuf b = {0}, c = {0};
    CHECK(hashenc_set(&b, NULL, 0, argv, argl, 3) == 2);
    static const char want[] = "\x02\x00\x00\x00" "\x01" "f" "\x02" "v2" "\x01" "g" "\x00";
    CHECK(b.len == sizeof want - 1 && !memcmp(b.p, want, b.len), "encoding of {f: v2, g: ''}");
    /* a 200-byte value: a two-byte varint (200 = 0xc8 0x01) */
    char big[200];
    memset(big, 'x', sizeof big);
    const char *a2[] = {"g", big};
    size_t l2[] = {1, sizeof big};
    CHECK(hashenc_set(&c, b.p, b.len, a2, l2, 1) == 0);
    CHECK(c.len == 4 + 5 + 2 + 2 + 200 && (unsigned char)c.p[9 + 2] == 0xc8 && c.p[9 + 3] == 0x01);
    /* deleting everything leaves count 0 */
    const char *d[] = {"g", "f", "nope"};
    size_t dl[] = {1, 1, 4};
    struct hashenc_fields fs = {d, dl, 3, 1};
    b.len = 0;
    CHECK(hashenc_del(&b, c.p, c.len, &fs) == 2);
    CHECK(b.len == 4 && hashenc_len(b.p, b.len) == 0 && hashenc_validate(b.p, b.len) == 0);
    /* refused */
    static const struct { const char *bytes; size_t n; const char *why; } bad[] = {
        {"\x01\x00\x00", 3, "short header"},
        {"\x01\x00\x00\x00", 4, "count past the bytes"},
        {"\x01\x00\x00\x00\x01" "f\x00" "x", 8, "a byte after the last entry"},
        {"\x01\x00\x00\x00\x81\x00" "f\x00", 8, "overlong varint"},
        {"\x01\x00\x00\x00\x80\x80\x80\x80\x80\x01", 10, "varint over 5 bytes"},
        {"\x01\x00\x00\x00\x81\x80\x80\x80\x02" "f\x00", 11, "length over HASHENC_MAX_LEN"},
        {"\x01\x00\x00\x00\x05" "f\x00", 7, "field past the end"},
        {"\x02\x00\x00\x00\x01" "f\x00\x01", 8, "second entry cut"},
        {"\xff\xff\xff\xff\x00\x00", 6, "huge count"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *p = malloc(bad[i].n);
        memcpy(p, bad[i].bytes, bad[i].n);
        CHECK(hashenc_validate(p, bad[i].n) == -EBADMSG, "%s accepted", bad[i].why);
        free(p);
    }
    CHECK(hashenc_len(NULL, 0) == 0 && hashenc_validate(NULL, 0) == 0);
    kvbuf_free(&b);
    kvbuf_free(&c);
}

/* ---- damaged bytes */

static int inside(const char *p, size_t n, const char *v, size_t vlen)
{
    return p >= v && p <= v + vlen && n <= (size_t)(v + vlen - p);
}

static void run_decoders(const char *v, size_t n, struct rng *r)
{
    int valid = hashenc_validate(v, n);
    CHECK(valid == 0 || valid == -EBADMSG);
    int64_t len = hashenc_len(v, n);
    CHECK(len < 0 || (n >= 4 && (uint64_t)len <= (n - 4) / 2));
    CHECK(valid != 0 || len >= 0);
    struct hashenc_iter it;
    struct hashenc_entry e;
    int rc = hashenc_iter_init(&it, v, n);
    int64_t seen = 0;
    const char *firstf = NULL;
    size_t firstfl = 0;
    while (!rc && (rc = hashenc_next(&it, &e)) == 1) {
        CHECK(inside(e.f, e.flen, v, n) && inside(e.v, e.vlen, v, n) && inside(e.raw, e.rawlen, v, n));
        CHECK(e.raw + e.rawlen == e.v + e.vlen && e.f > e.raw && e.v > e.f);
        struct hashenc_entry g;
        CHECK(hashenc_entry_at(v, n, (size_t)(e.raw - v), &g) == 1 && g.f == e.f && g.v == e.v && g.vlen == e.vlen);
        if (!seen++) {
            firstf = e.f;
            firstfl = e.flen;
        }
        rc = 0;
    }
    CHECK((rc == 0) == (valid == 0), "walk %d, validate %d", rc, valid);
    for (int k = 0; k < 4; k++) { /* random access at any offset stays inside too */
        rc = hashenc_entry_at(v, n, rng_below(r, n + 3), &e);
        CHECK(rc == -EBADMSG || (rc == 1 && inside(e.raw, e.rawlen, v, n) && inside(e.v, e.vlen, v, n)));
    }
    CHECK(valid != 0 || seen == len);
    if (firstf) {
        CHECK(hashenc_find(v, n, firstf, firstfl, &e) == 1 && e.f == firstf);
    }
    rc = hashenc_find(v, n, "zz", 2, &e);
    CHECK(rc == 1 || rc == 0 || (rc == -EBADMSG && valid));
    const char *names[12] = {"a", "b", "zz", "", "a", "c", "d", "e", "f", "g", "h", "i"};
    size_t lens[12] = {1, 1, 2, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    struct hashenc_entry found[12];
    struct hashenc_fields fs = {names, lens, rng_below(r, 2) ? 12 : 3, 1};
    rc = hashenc_lookup(v, n, &fs, found);
    CHECK(rc == valid);
    for (size_t i = 0; !rc && i < fs.n; i++)
        CHECK(!found[i].f || (inside(found[i].f, found[i].flen, v, n) && inside(found[i].v, found[i].vlen, v, n)));
    /* writers: nothing named (the value rewritten as it is), a field set, fields removed */
    struct kvbuf out = {0};
    kvbuf_append(&out, "pre", 3);
    int64_t w = hashenc_set(&out, v, n, NULL, NULL, 0);
    if (valid) {
        CHECK(w == -EBADMSG && out.len == 3, "set on a damaged value gave %" PRId64, w);
    } else {
        CHECK(w == 0 && out.len == 3 + n && !memcmp(out.p + 3, v, n), "a valid value not rewritten as it was");
    }
    out.len = 0;
    const char *pv[] = {"a", "1"};
    size_t pl[] = {1, 1};
    w = hashenc_set(&out, v, n, pv, pl, 1);
    CHECK(valid ? w == -EBADMSG && out.len == 0 : (w == 0 || w == 1) && hashenc_validate(out.p, out.len) == 0);
    out.len = 0;
    w = hashenc_del(&out, v, n, &fs);
    CHECK(valid ? w == -EBADMSG && out.len == 0 : w >= 0 && w <= len && hashenc_validate(out.p, out.len) == 0);
    CHECK(valid || hashenc_len(out.p, out.len) == len - w);
    kvbuf_free(&out);
}

/* Mutate b (a copy of a valid encoding) in place. */
static void mutate(struct kvbuf *b, struct rng *r)
{
    int rounds = 1 + (int)rng_below(r, 4);
    for (int k = 0; k < rounds; k++) {
        size_t at = b->len ? rng_below(r, b->len) : 0;
        switch (rng_below(r, 7)) {
        case 0:
            if (b->len)
                b->p[at] ^= (char)(1 << rng_below(r, 8));
            break;
        case 1:
            if (b->len)
                b->p[at] = (char)(rng_below(r, 2) ? 0xff : rng_below(r, 256));
            break;
        case 2:
            b->len = at; /* truncate */
            break;
        case 3: { /* append or insert random bytes */
            size_t n = 1 + rng_below(r, 6);
            kvbuf_reserve(b, n);
            memmove(b->p + at + n, b->p + at, b->len - at);
            for (size_t i = 0; i < n; i++)
                b->p[at + i] = (char)rng_below(r, 256);
            b->len += n;
            break;
        }
        case 4: /* a length byte made large: a varint claiming far more than is there */
            if (b->len > 4) {
                at = 4 + rng_below(r, b->len - 4);
                b->p[at] = (char)(0x80 | rng_below(r, 128));
            }
            break;
        case 5: /* the count changed */
            if (b->len >= 4)
                b->p[rng_below(r, 4)] += (char)(1 + rng_below(r, 3));
            break;
        default: /* delete a byte */
            if (b->len) {
                memmove(b->p + at, b->p + at + 1, b->len - at - 1);
                b->len--;
            }
        }
    }
}

static void phase_damage(uint64_t seed, long iters)
{
    struct rng r;
    rng_seed(&r, seed, 2);
    struct kvbuf base = {0}, b = {0};
    const char *argv[16];
    size_t argl[16];
    char store[16][200];
    long valid = 0;
    for (long it = 0; it < iters; it++) {
        b.len = 0;
        if (rng_below(&r, 10) == 0) { /* plain random bytes */
            size_t n = rng_below(&r, 40);
            kvbuf_reserve(&b, n + 1);
            for (size_t i = 0; i < n; i++)
                b.p[i] = (char)(i < 4 ? rng_below(&r, 4) : rng_below(&r, 256));
            b.len = n;
        } else {
            size_t k = 1 + rng_below(&r, 8);
            for (size_t i = 0; i < 2 * k; i++) {
                argl[i] = rand_str(&r, store[i], 4);
                argv[i] = store[i];
            }
            base.len = 0;
            CHECK(hashenc_set(&base, NULL, 0, argv, argl, k) > 0);
            kvbuf_append(&b, base.p, base.len);
            if (rng_below(&r, 8))
                mutate(&b, &r);
        }
        char *exact = malloc(b.len ? b.len : 1); /* exactly the bytes: ASan catches a read past them */
        CHECK(exact);
        memcpy(exact, b.p, b.len);
        run_decoders(exact, b.len, &r);
        valid += hashenc_validate(exact, b.len) == 0;
        free(exact);
    }
    CHECK(valid > iters / 20 && valid < iters - iters / 20, "%ld of %ld valid: the mutations miss", valid, iters);
    printf("damage: %ld values, %ld of them valid\n", iters, valid);
    kvbuf_free(&base);
    kvbuf_free(&b);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s SEED ITERATIONS\n", argv[0]);
        return 2;
    }
    uint64_t seed = strtoull(argv[1], NULL, 10);
    long iters = strtol(argv[2], NULL, 10);
    phase_exact();
    phase_model(seed, iters / 4);
    phase_damage(seed, iters);
    printf("hashenc ok\n");
    return 0;
}
