/* table_stress.c - concurrent stress of ext/core/table*.c under ThreadSanitizer or
 * AddressSanitizer+UBSan (built and run by tests/c/test_c_sanitizers.py).
 *
 * usage: table_stress SEED [MODE] [OPS]
 *   MODE chaos  threads do random set/get/del/incr/append/... on overlapping keys
 *               with a small max_memory (so the refusal paths run), while another
 *               thread runs kvt_housekeep and reads the statistics;
 *        flush  the same with a tighter bound (128 KB), plus a kvt_flush every few
 *               hundred operations from the worker threads;
 *        exact  each thread owns disjoint keys and keeps a model of them: every
 *               return value is checked, and the final contents exactly;
 *        all    chaos, flush and exact in turn (default).
 *   OPS operations per worker thread and phase (default 40000).
 *
 * White box: the table's internal header is included so that, whenever no thread is
 * running, audit() can walk every shard and check the structure and the memory
 * accounting exactly (used_memory == sum of malloc_usable_size of every entry and
 * bucket array). Exits 0 on success; prints "FAIL: ..." and exits 1 otherwise. */
#define _GNU_SOURCE
#include "core/table_int.h"

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>

#include "stress.h"
#include <stdarg.h>
#include <stdbool.h>

#define NTHREADS 4

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("FAIL: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    exit(1);
}

/* ---- white-box audit (no other thread may use the table meanwhile) */

static size_t usable(const void *p) { return p ? malloc_usable_size((void *)p) : 0; }

struct audit_result {
    uint64_t keys, expires, memory, buckets;
};

static struct audit_result audit(struct kv_table *t, const char *when)
{
    struct audit_result r = {0, 0, 0, 0};
    for (int si = 0; si < KVT_SHARDS; si++) {
        struct shard *s = &t->shards[si];
        pthread_mutex_lock(&s->lock);
        if (!s->ht[0] || !s->size[0] || (s->size[0] & (s->size[0] - 1)))
            die("%s: shard %d: bad main table (size %" PRIu64 ")", when, si, s->size[0]);
        if (s->rehashidx >= 0) {
            if (!s->ht[1] || !s->size[1] || (s->size[1] & (s->size[1] - 1)))
                die("%s: shard %d: rehashing without a target table", when, si);
            if ((uint64_t)s->rehashidx > s->size[0])
                die("%s: shard %d: rehashidx %" PRId64 " past %" PRIu64, when, si, s->rehashidx, s->size[0]);
        } else if (s->ht[1] || s->size[1]) {
            die("%s: shard %d: second table while not rehashing", when, si);
        }
        uint64_t n = 0, nexp = 0;
        for (int i = 0; i < 2; i++) {
            if (!s->ht[i])
                continue;
            r.memory += usable(s->ht[i]);
            r.buckets += s->size[i];
            if (usable(s->ht[i]) < s->size[i] * sizeof(struct kvt_entry *))
                die("%s: shard %d: bucket array %d smaller than its size", when, si, i);
            for (uint64_t j = 0; j < s->size[i]; j++) {
                for (struct kvt_entry *e = s->ht[i][j]; e; e = e->next) {
                    if (i == 0 && s->rehashidx >= 0 && j < (uint64_t)s->rehashidx)
                        die("%s: shard %d: entry in an already migrated bucket %" PRIu64, when, si, j);
                    if ((e->hash & (s->size[i] - 1)) != j)
                        die("%s: shard %d: entry in the wrong bucket", when, si);
                    if (shard_of(t, e->hash) != s)
                        die("%s: shard %d: entry of another shard", when, si);
                    if (e->hash != kvt_hash(e->data, e->klen))
                        die("%s: shard %d: stale hash", when, si);
                    if ((uint64_t)e->klen + e->vlen > e->cap)
                        die("%s: shard %d: key+value %u+%u over capacity %u", when, si, e->klen, e->vlen, e->cap);
                    if (e->cap > usable(e) - sizeof *e)
                        die("%s: shard %d: capacity %u over the block", when, si, e->cap);
                    r.memory += usable(e);
                    n++;
                    nexp += e->expire_ms != 0;
                    /* no duplicate key in the shard */
                    for (int i2 = 0; i2 < 2; i2++) {
                        if (!s->ht[i2])
                            continue;
                        for (struct kvt_entry *f = s->ht[i2][e->hash & (s->size[i2] - 1)]; f; f = f->next)
                            if (f != e && f->klen == e->klen && memcmp(f->data, e->data, e->klen) == 0)
                                die("%s: shard %d: duplicate key", when, si);
                    }
                }
            }
        }
        if (n != atomic_load(&s->used))
            die("%s: shard %d: %" PRIu64 " entries but used=%" PRIu64, when, si, n, (uint64_t)atomic_load(&s->used));
        if (nexp != atomic_load(&s->expires))
            die("%s: shard %d: %" PRIu64 " entries with a TTL but expires=%" PRIu64, when, si, nexp,
                (uint64_t)atomic_load(&s->expires));
        r.keys += n;
        r.expires += nexp;
        pthread_mutex_unlock(&s->lock);
    }
    uint64_t used = kvt_used_memory(t);
    if (used != r.memory)
        die("%s: used_memory %" PRIu64 " but the table holds %" PRIu64 " bytes (difference %" PRId64 ")",
            when, used, r.memory, (int64_t)(used - r.memory));
    if (kvt_count(t) != r.keys)
        die("%s: kvt_count %" PRIu64 " but %" PRIu64 " entries", when, kvt_count(t), r.keys);
    return r;
}

/* Housekeep until no shard is rehashing and none wants to shrink. */
static void compact(struct kv_table *t)
{
    for (int round = 0; round < 10000; round++) {
        struct kvt_stats a, b;
        kvt_get_stats(t, &a);
        kvt_housekeep(t, 0, KVT_SHARDS, 1u << 20);
        kvt_get_stats(t, &b);
        if (a.rehashing == 0 && b.rehashing == 0 && a.buckets == b.buckets)
            return;
    }
    die("housekeeping does not converge");
}

/* ---- values: only these bytes are ever written, so any other byte read back
 * means a torn, stale or foreign read. */

static bool valid_value(const char *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = v[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
            return false;
    }
    return true;
}

static void check_value_cb(void *arg, const char *val, size_t vlen)
{
    size_t *seen = arg;
    if (!valid_value(val, vlen))
        die("read a value with foreign bytes (len %zu)", vlen);
    *seen = vlen;
}

static size_t random_value(struct rng *r, char *buf, size_t max)
{
    size_t n;
    uint64_t k = rng_below(r, 100);
    if (k < 60)
        n = rng_below(r, 24);
    else if (k < 90)
        n = rng_below(r, 300);
    else if (k < 99)
        n = rng_below(r, 6000);
    else
        n = rng_below(r, max);
    char c = (char)('a' + rng_below(r, 26));
    memset(buf, c, n);
    return n;
}

/* ---- chaos phase */

#define CHAOS_KEYS 2000
#define MAX_VALUE_LEN 40000

struct chaos_arg {
    struct kv_table *t;
    int id;
    uint64_t seed, ops;
    int flush;
    uint64_t max_memory;
    uint64_t n_oom, n_set, n_flush;
};

static void *chaos_worker(void *p)
{
    struct chaos_arg *a = p;
    struct kv_table *t = a->t;
    struct rng r;
    rng_seed(&r, a->seed, (uint64_t)a->id);
    char *val = malloc(MAX_VALUE_LEN);
    char *copy = malloc(MAX_VALUE_LEN + 64);
    char key[32];
    for (uint64_t op = 0; op < a->ops; op++) {
        int klen = snprintf(key, sizeof key, "key:%u", (unsigned)rng_below(&r, CHAOS_KEYS));
        uint64_t which = rng_below(&r, 1000);
        /* the server's batched prefetch runs concurrently with rehashes and flushes */
        uint64_t h = kvt_hash(key, (size_t)klen);
        for (int stage = 1; stage <= 3; stage++)
            kvt_prefetch(t, h, stage);
        if (which < 300) {
            size_t n = random_value(&r, val, MAX_VALUE_LEN);
            int flags = 0;
            int64_t exp = 0;
            uint64_t f = rng_below(&r, 20);
            if (f == 0) flags = KVT_NX;
            else if (f == 1) flags = KVT_XX;
            else if (f == 2) flags = KVT_KEEPTTL;
            else if (f == 3) exp = now_ms() + 1 + (int64_t)rng_below(&r, 30);
            size_t old = (size_t)-1;
            int rc = kvt_set(t, key, (size_t)klen, val, n, flags, exp,
                             rng_below(&r, 4) == 0 ? check_value_cb : NULL, &old);
            CHECK(rc == 1 || rc == 0 || rc == -ENOMEM, "kvt_set returned %d", rc);
            CHECK(rc != 0 || (flags & (KVT_NX | KVT_XX)), "kvt_set refused without NX/XX");
            a->n_set += rc == 1;
            a->n_oom += rc == -ENOMEM;
        } else if (which < 500) {
            size_t seen = (size_t)-1;
            int rc = kvt_get(t, key, (size_t)klen, check_value_cb, &seen);
            CHECK(rc == 0 || rc == 1, "kvt_get returned %d", rc);
            CHECK(rc == 0 || seen != (size_t)-1, "kvt_get found but did not call back");
        } else if (which < 550) {
            size_t cap = rng_below(&r, 2) ? MAX_VALUE_LEN + 64 : rng_below(&r, 32);
            int64_t n = kvt_get_copy(t, key, (size_t)klen, copy, cap);
            CHECK(n == -ENOENT || n >= 0, "kvt_get_copy returned %" PRId64, n);
            if (n >= 0 && (size_t)n <= cap)
                CHECK(valid_value(copy, (size_t)n), "kvt_get_copy: foreign bytes");
        } else if (which < 680) {
            int rc = kvt_del(t, key, (size_t)klen);
            CHECK(rc == 0 || rc == 1, "kvt_del returned %d", rc);
        } else if (which < 720) {
            int rc = kvt_exists(t, key, (size_t)klen);
            CHECK(rc == 0 || rc == 1, "kvt_exists returned %d", rc);
        } else if (which < 820) {
            int64_t res = 0;
            int64_t delta = (int64_t)rng_below(&r, 2001) - 1000;
            int rc = kvt_incrby(t, key, (size_t)klen, delta, &res);
            CHECK(rc == 0 || rc == -EINVAL || rc == -ENOMEM || rc == -ERANGE, "kvt_incrby returned %d", rc);
            a->n_oom += rc == -ENOMEM;
        } else if (which < 940) {
            size_t n = rng_below(&r, 10) ? rng_below(&r, 64) : random_value(&r, val, MAX_VALUE_LEN);
            memset(val, (char)('a' + rng_below(&r, 26)), n);
            int64_t rc = kvt_append(t, key, (size_t)klen, val, n);
            CHECK(rc >= (int64_t)n || rc == -ENOMEM, "kvt_append returned %" PRId64, rc);
            a->n_oom += rc == -ENOMEM;
        } else if (which < 990) {
            int64_t n = kvt_strlen(t, key, (size_t)klen);
            CHECK(n >= 0, "kvt_strlen returned %" PRId64, n);
        } else if (a->flush && rng_below(&r, 20) == 0) {
            kvt_flush(t);
            a->n_flush++;
        } else {
            struct kvt_stats st;
            kvt_get_stats(t, &st);
            CHECK(st.max_memory == a->max_memory, "max_memory changed");
        }
    }
    free(val);
    free(copy);
    return NULL;
}

struct hk_arg {
    struct kv_table *t;
    atomic_int stop;
    uint64_t seed, rounds;
    int expect_no_reclaim;
};

static void *housekeeper(void *p)
{
    struct hk_arg *a = p;
    struct rng r;
    rng_seed(&r, a->seed, 1000);
    while (!atomic_load(&a->stop)) {
        unsigned first = (unsigned)rng_below(&r, KVT_SHARDS);
        unsigned n = 1 + (unsigned)rng_below(&r, 64);
        int rc = kvt_housekeep(a->t, first, n, 1 + (unsigned)rng_below(&r, 512));
        CHECK(rc >= 0, "kvt_housekeep returned %d", rc);
        CHECK(!a->expect_no_reclaim || rc == 0, "kvt_housekeep reclaimed %d keys without TTLs", rc);
        if (rng_below(&r, 8) == 0) {
            struct kvt_stats st;
            kvt_get_stats(a->t, &st);
            (void)kvt_count(a->t);
            (void)kvt_used_memory(a->t);
        }
        a->rounds++;
    }
    return NULL;
}

static void run_chaos(uint64_t seed, uint64_t ops, int flush)
{
    /* flush mode: a tighter bound and frequent flushes, so that flushes run while
     * the table is at its bound and writers are being refused */
    const uint64_t max_memory = flush ? 128 * 1024 : 512 * 1024;
    struct kv_table *t;
    CHECK(kvt_create(&t, max_memory) == 0);
    struct audit_result empty = audit(t, "fresh table");
    uint64_t baseline = kvt_used_memory(t);
    CHECK(empty.keys == 0 && baseline == empty.memory);

    pthread_t th[NTHREADS], hk;
    struct chaos_arg args[NTHREADS];
    struct hk_arg hka = {.t = t, .seed = seed};
    atomic_init(&hka.stop, 0);
    CHECK(pthread_create(&hk, NULL, housekeeper, &hka) == 0);
    for (int i = 0; i < NTHREADS; i++) {
        args[i] = (struct chaos_arg){.t = t, .id = i, .seed = seed, .ops = ops, .flush = flush,
                                     .max_memory = max_memory};
        CHECK(pthread_create(&th[i], NULL, chaos_worker, &args[i]) == 0);
    }
    uint64_t oom = 0, sets = 0, flushes = 0;
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(th[i], NULL);
        oom += args[i].n_oom;
        sets += args[i].n_set;
        flushes += args[i].n_flush;
    }
    atomic_store(&hka.stop, 1);
    pthread_join(hk, NULL);

    struct audit_result after = audit(t, flush ? "after flush chaos" : "after chaos");
    CHECK(kvt_used_memory(t) <= max_memory, "used_memory %" PRIu64 " over max_memory", kvt_used_memory(t));
    struct kvt_stats st;
    kvt_get_stats(t, &st);
    fprintf(stderr, "%s: %" PRIu64 " sets, %" PRIu64 " refused (stats %" PRIu64 "), %" PRIu64
            " flushes, %" PRIu64 " keys, used %" PRIu64 "/%" PRIu64 ", %" PRIu64 " housekeeping rounds\n",
            flush ? "flush" : "chaos", sets, oom, st.oom_rejections, flushes, after.keys,
            st.used_memory, max_memory, hka.rounds);
    CHECK(oom > 0, "the memory bound was never reached: the refusal paths did not run");
    CHECK(st.oom_rejections >= oom, "oom_rejections %" PRIu64 " < %" PRIu64 " refused writes",
          st.oom_rejections, oom);

    kvt_flush(t);
    struct audit_result flushed = audit(t, "after kvt_flush");
    CHECK(kvt_count(t) == 0 && flushed.keys == 0);
    CHECK(flushed.buckets == KVT_SHARDS * INITIAL_BUCKETS);
    CHECK(kvt_used_memory(t) == baseline, "used_memory %" PRIu64 " after flush, empty table %" PRIu64,
          kvt_used_memory(t), baseline);
    kvt_destroy(t);
}

/* ---- exact phase: disjoint keys, a model per thread */

#define EXACT_KEYS 300

struct model_key {
    char *val;
    size_t len, cap;
    bool present, ttl;
};

struct exact_arg {
    struct kv_table *t;
    int id;
    uint64_t seed, ops;
    struct model_key keys[EXACT_KEYS];
};

static void model_put(struct model_key *m, const char *v, size_t n)
{
    if (!m->val || n > m->cap) {
        m->cap = n * 2 + 16;
        m->val = realloc(m->val, m->cap);
        CHECK(m->val != NULL);
    }
    if (n)
        memcpy(m->val, v, n);
    m->len = n;
    m->present = true;
}

static void check_key(struct kv_table *t, const char *key, size_t klen, const struct model_key *m,
                      char *buf, size_t cap)
{
    int64_t n = kvt_get_copy(t, key, klen, buf, cap);
    if (!m->present) {
        CHECK(n == -ENOENT, "%.*s: expected absent, got length %" PRId64, (int)klen, key, n);
        CHECK(kvt_exists(t, key, klen) == 0);
        CHECK(kvt_strlen(t, key, klen) == 0);
        return;
    }
    CHECK(n == (int64_t)m->len, "%.*s: length %" PRId64 ", expected %zu", (int)klen, key, n, m->len);
    CHECK((size_t)n > cap || memcmp(buf, m->val, m->len) == 0, "%.*s: wrong value", (int)klen, key);
    CHECK(kvt_exists(t, key, klen) == 1);
    CHECK(kvt_strlen(t, key, klen) == (int64_t)m->len);
}

static void *exact_worker(void *p)
{
    struct exact_arg *a = p;
    struct kv_table *t = a->t;
    struct rng r;
    rng_seed(&r, a->seed, 100 + (uint64_t)a->id);
    size_t bufcap = 64 * 1024;
    char *val = malloc(bufcap), *buf = malloc(bufcap);
    char key[32];
    const int64_t far = now_ms() + 3600 * 1000; /* TTLs that never pass during the test */
    for (uint64_t op = 0; op < a->ops; op++) {
        int ki = (int)rng_below(&r, EXACT_KEYS);
        int klen = snprintf(key, sizeof key, "t%d:%d", a->id, ki);
        struct model_key *m = &a->keys[ki];
        uint64_t which = rng_below(&r, 100);
        if (which < 30) {
            size_t n = rng_below(&r, 10) ? rng_below(&r, 40) : rng_below(&r, 4000);
            if (rng_below(&r, 3) == 0)
            {
                int64_t v = (int64_t)(rng_next(&r) >> rng_below(&r, 64));
                if (rng_below(&r, 2) && v != INT64_MIN)
                    v = -v;
                n = (size_t)snprintf(val, 32, "%" PRId64, v);
            }
            else
                memset(val, (char)('a' + rng_below(&r, 26)), n);
            int flags = 0;
            int64_t exp = 0;
            uint64_t f = rng_below(&r, 10);
            if (f == 0) flags = KVT_NX;
            else if (f == 1) flags = KVT_XX;
            else if (f == 2) flags = KVT_KEEPTTL;
            else if (f == 3) exp = far;
            int want = !((flags & KVT_NX) && m->present) && !((flags & KVT_XX) && !m->present);
            int rc = kvt_set(t, key, (size_t)klen, val, n, flags, exp, NULL, NULL);
            CHECK(rc == want, "%s: kvt_set flags %d returned %d, expected %d", key, flags, rc, want);
            if (want) {
                bool ttl = (flags & KVT_KEEPTTL) && m->present ? m->ttl : exp != 0;
                model_put(m, val, n);
                m->ttl = ttl;
            }
        } else if (which < 45) {
            int rc = kvt_del(t, key, (size_t)klen);
            CHECK(rc == (int)m->present, "%s: kvt_del returned %d", key, rc);
            m->present = m->ttl = false;
        } else if (which < 65) {
            long long cur = 0;
            bool isint = !m->present || model_int(m->val, m->len, &cur);
            int64_t delta = rng_below(&r, 50) ? (int64_t)rng_below(&r, 21) - 10
                                             : (int64_t)rng_next(&r);
            int64_t res = 0;
            int rc = kvt_incrby(t, key, (size_t)klen, delta, &res);
            if (!isint) {
                CHECK(rc == -EINVAL, "%s: incr on a non-integer returned %d", key, rc);
            } else if ((delta > 0 && cur > INT64_MAX - delta) || (delta < 0 && cur < INT64_MIN - delta)) {
                CHECK(rc == -ERANGE, "%s: overflowing incr returned %d", key, rc);
            } else {
                CHECK(rc == 0 && res == cur + delta, "%s: incr returned %d/%" PRId64, key, rc, res);
                char num[32];
                int n = snprintf(num, sizeof num, "%" PRId64, res);
                bool had = m->present;
                model_put(m, num, (size_t)n);
                if (!had)
                    m->ttl = false;
            }
        } else if (which < 80) {
            size_t n = rng_below(&r, 5) ? rng_below(&r, 20) : rng_below(&r, 3000);
            if (m->len + n > 60000)
                n = 0;
            for (size_t i = 0; i < n; i++)
                val[i] = (char)('0' + rng_below(&r, 10));
            int64_t rc = kvt_append(t, key, (size_t)klen, val, n);
            bool had = m->present;
            char *joined = malloc(m->len + n + 1);
            memcpy(joined, m->present ? m->val : "", m->present ? m->len : 0);
            memcpy(joined + (m->present ? m->len : 0), val, n);
            size_t jl = (m->present ? m->len : 0) + n;
            CHECK(rc == (int64_t)jl, "%s: append returned %" PRId64 ", expected %zu", key, rc, jl);
            model_put(m, joined, jl);
            if (!had)
                m->ttl = false;
            free(joined);
        } else {
            check_key(t, key, (size_t)klen, m, buf, bufcap);
        }
    }
    /* final check of every key this thread owns */
    for (int ki = 0; ki < EXACT_KEYS; ki++) {
        int klen = snprintf(key, sizeof key, "t%d:%d", a->id, ki);
        check_key(t, key, (size_t)klen, &a->keys[ki], buf, bufcap);
    }
    free(val);
    free(buf);
    return NULL;
}

/* Single-threaded API edges: limits are checked before any byte is read (the
 * value pointers below point to 8 bytes: ASan reports any read), short buffers. */
static void api_edges(struct kv_table *t)
{
    char small[8] = "1234567";
    CHECK(kvt_set(t, "big", 3, small, (size_t)KVT_MAX_VALUE + 1, 0, 0, NULL, NULL) == -E2BIG);
    CHECK(kvt_set(t, small, (size_t)KVT_MAX_VALUE + 1, small, 1, 0, 0, NULL, NULL) == -E2BIG);
    CHECK(kvt_exists(t, "big", 3) == 0);
    CHECK(kvt_set(t, "big", 3, small, 7, 0, 0, NULL, NULL) == 1);
    CHECK(kvt_append(t, "big", 3, small, (size_t)KVT_MAX_VALUE - 6) == -E2BIG);
    CHECK(kvt_append(t, "new", 3, small, (size_t)KVT_MAX_VALUE + 1) == -E2BIG);
    CHECK(kvt_exists(t, "new", 3) == 0);
    char out[4] = {'x', 'x', 'x', 'x'};
    CHECK(kvt_get_copy(t, "big", 3, out, sizeof out) == 7);
    CHECK(memcmp(out, "xxxx", 4) == 0, "kvt_get_copy wrote into a too short buffer");
    CHECK(kvt_get_copy(t, "big", 3, NULL, 0) == 7);
    CHECK(kvt_get_copy(t, "absent", 6, out, sizeof out) == -ENOENT);
    CHECK(kvt_strlen(t, "big", 3) == 7);
    int64_t res = 0;
    CHECK(kvt_incrby(t, "big", 3, 1, &res) == 0 && res == 1234568);
    CHECK(kvt_set(t, "big", 3, "9223372036854775807", 19, KVT_XX, 0, NULL, NULL) == 1);
    CHECK(kvt_incrby(t, "big", 3, 1, &res) == -ERANGE);
    CHECK(kvt_incrby(t, "big", 3, INT64_MIN, &res) == 0 && res == -1);
    CHECK(kvt_set(t, "", 0, "", 0, 0, 0, NULL, NULL) == 1); /* empty key and value */
    CHECK(kvt_get_copy(t, "", 0, out, sizeof out) == 0);
    CHECK(kvt_del(t, "", 0) == 1 && kvt_del(t, "big", 3) == 1);
    CHECK(kvt_count(t) == 0);
}

static void run_exact(uint64_t seed, uint64_t ops)
{
    struct kv_table *t;
    CHECK(kvt_create(&t, 0) == 0);
    uint64_t baseline = kvt_used_memory(t);
    api_edges(t);
    audit(t, "after the API edge cases");
    CHECK(kvt_used_memory(t) == baseline);
    /* noise keys outside the threads' key spaces, to make shards grow and shrink */
    for (int i = 0; i < 3000; i++) {
        char k[32];
        int n = snprintf(k, sizeof k, "noise:%d", i);
        CHECK(kvt_set(t, k, (size_t)n, "x", 1, 0, 0, NULL, NULL) == 1);
    }
    pthread_t th[NTHREADS], hk;
    struct exact_arg *args = calloc(NTHREADS, sizeof *args);
    struct hk_arg hka = {.t = t, .seed = seed, .expect_no_reclaim = 1};
    atomic_init(&hka.stop, 0);
    CHECK(pthread_create(&hk, NULL, housekeeper, &hka) == 0);
    for (int i = 0; i < NTHREADS; i++) {
        args[i].t = t;
        args[i].id = i;
        args[i].seed = seed;
        args[i].ops = ops;
        CHECK(pthread_create(&th[i], NULL, exact_worker, &args[i]) == 0);
    }
    /* delete the noise while the workers run: shards shrink under them */
    for (int i = 0; i < 3000; i++) {
        char k[32];
        int n = snprintf(k, sizeof k, "noise:%d", i);
        CHECK(kvt_del(t, k, (size_t)n) == 1, "noise key %d lost", i);
    }
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    atomic_store(&hka.stop, 1);
    pthread_join(hk, NULL);

    uint64_t keys = 0, ttls = 0;
    for (int i = 0; i < NTHREADS; i++)
        for (int k = 0; k < EXACT_KEYS; k++) {
            keys += args[i].keys[k].present;
            ttls += args[i].keys[k].present && args[i].keys[k].ttl;
        }
    struct audit_result res = audit(t, "after exact phase");
    struct kvt_stats st;
    kvt_get_stats(t, &st);
    fprintf(stderr, "exact: %" PRIu64 " keys (%" PRIu64 " with TTL), used %" PRIu64 ", %" PRIu64
            " housekeeping rounds\n", keys, ttls, st.used_memory, hka.rounds);
    CHECK(res.keys == keys && kvt_count(t) == keys, "%" PRIu64 " keys in the table, model has %" PRIu64,
          res.keys, keys);
    CHECK(st.expires == ttls, "stats.expires %" PRIu64 ", model %" PRIu64, st.expires, ttls);
    CHECK(st.expired_keys == 0);

    /* delete everything one by one: after compaction the memory is the empty table's */
    char key[32];
    for (int i = 0; i < NTHREADS; i++)
        for (int k = 0; k < EXACT_KEYS; k++) {
            int klen = snprintf(key, sizeof key, "t%d:%d", i, k);
            CHECK(kvt_del(t, key, (size_t)klen) == (int)args[i].keys[k].present);
            free(args[i].keys[k].val);
        }
    compact(t);
    struct audit_result empty = audit(t, "after deleting everything");
    CHECK(empty.keys == 0 && empty.buckets == KVT_SHARDS * INITIAL_BUCKETS,
          "%" PRIu64 " keys, %" PRIu64 " buckets", empty.keys, empty.buckets);
    CHECK(kvt_used_memory(t) == baseline, "used_memory %" PRIu64 " after deleting all, empty table %" PRIu64,
          kvt_used_memory(t), baseline);
    kvt_flush(t);
    audit(t, "after flush of an empty table");
    CHECK(kvt_used_memory(t) == baseline);
    free(args);
    kvt_destroy(t);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s SEED [chaos|flush|exact|all] [OPS]\n", argv[0]);
        return 2;
    }
    uint64_t seed = strtoull(argv[1], NULL, 0);
    const char *mode = argc > 2 ? argv[2] : "all";
    uint64_t ops = argc > 3 ? strtoull(argv[3], NULL, 0) : 40000;
    bool all = strcmp(mode, "all") == 0;
    if (!all && strcmp(mode, "chaos") && strcmp(mode, "flush") && strcmp(mode, "exact")) {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    if (all || !strcmp(mode, "chaos"))
        run_chaos(seed, ops, 0);
    if (all || !strcmp(mode, "flush"))
        run_chaos(seed, ops, 1);
    if (all || !strcmp(mode, "exact"))
        run_exact(seed, ops);
    fprintf(stderr, "table_stress %s seed %" PRIu64 ": ok\n", mode, seed);
    return 0;
}
