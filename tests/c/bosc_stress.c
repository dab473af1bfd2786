/* bosc_stress.c - the table with a BOSC data file behind it (spill mode), under
 * ThreadSanitizer or AddressSanitizer+UBSan (built and run by test_c_sanitizers.py).
 *
 * usage: bosc_stress [SEED [OPS_PER_THREAD [all|flushall]]]
 *   SEED defaults to $KVSTORE_C_SEED, else 1; "flushall" runs phase 4 alone on a
 *   fresh file (so that a failure in phases 1-3 cannot hide one in phase 4).
 *
 * No WAL is attached, so whatever the flusher writes is clean at once and can be
 * evicted; max_memory is small, so keys leave memory and come back all the time.
 *   1. NTHREADS workers, each owning KEYS keys "t<i>:k<j>" and a model of them, run
 *      random SET (plain, with a far TTL, NX, XX, with GET) / GET / DEL / DEL_BLIND /
 *      INCRBY / APPEND / EXISTS / STRLEN while the flusher and loader run. -ENODATA
 *      is answered by bosc_load and a retry, -ENOMEM by kvt_wait_memory and a retry;
 *      every result must match the model.
 *   2. bosc_sync, then every key is checked against the models and kvt_count must be
 *      exactly the number of live keys (DBSIZE is exact once everything is swept).
 *   3. Restart: close, destroy, reopen the same file into a new table (disk_keys
 *      must be the live count), verify everything by loading, run more random ops,
 *      sync and verify again.
 *   4. FLUSHALL, single-threaded: flushed keys stay gone across a sync and a
 *      restart, keys written after it survive; then a FLUSHALL with no write after it.
 * $KVSTORE_C_SWEEP_CHUNK (keys): sweeps settle their keys that many at a time, each
 * chunk synced, recorded and evicted before the next (bosc_sweep.c); unset: whole sweeps.
 * The data file lives in a mkdtemp directory under $TMPDIR (default /tmp), removed at
 * exit (but not when a sanitizer aborts the run).
 * Prints "FAIL: ..." and exits 1 on the first mismatch; ends with "ok" on success. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "durability/bosc.h"
#include "stress.h"
#include "core/table.h"

#define NTHREADS 4
#define KEYS 3000                 /* per thread */
#define MAX_MEMORY (1024 * 1024)  /* far below the live data: eviction runs constantly */
#define BUCKETS 512               /* few buckets: chains with overflow blocks */
#define FLUSH_INTERVAL_MS 20
#define MAX_APPENDED 5000         /* values grow by APPEND up to about this */
#define VALBUF 8192
#define MAX_RETRIES 10000         /* per operation: a load or a wait that never helps */
#define FLUSH_OLD 500             /* phase 4 */
#define FLUSH_NEW 50

static int64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double seconds(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double t_start;

/* Where the time goes (a slow run is the first thing to look at on a shared machine). */
static void progress(const char *what)
{
    fprintf(stderr, "[%6.1f s] %s\n", seconds(CLOCK_MONOTONIC) - t_start, what);
}

/* ---- the data file and its table */

static char dir[4096], path[4200];

static void cleanup(void)
{
    if (path[0])
        unlink(path);
    if (dir[0])
        rmdir(dir);
}

struct db {
    struct kv_table *t;
    struct bosc *b;
};

/* The data file's error, read under its lock (bosc_error() alone would race with
 * the thread that sets it). */
static const char *db_error(struct bosc *b)
{
    static __thread struct bosc_stats st;
    bosc_get_stats(b, &st);
    return st.failed ? st.error : "not failed";
}

static struct bosc_open_info db_open(struct db *d)
{
    char err[512] = "";
    struct bosc_open_info info;
    struct bosc_config cfg = {.path = path, .buckets = BUCKETS, .flush_interval_ms = FLUSH_INTERVAL_MS};
    const char *chunk = getenv("KVSTORE_C_SWEEP_CHUNK"); /* keys a sweep settles at a time (0: all) */
    cfg.sweep_chunk_items = chunk ? (uint32_t)strtoul(chunk, NULL, 10) : 0;
    CHECK(kvt_create(&d->t, MAX_MEMORY) == 0);
    int rc = bosc_open(&d->b, d->t, &cfg, &info, err, sizeof err);
    CHECK(rc == 0, "bosc_open: %d %s", rc, err);
    bosc_set_log(d->b, NULL);
    CHECK(bosc_start(d->b) == 0);
    return info;
}

static uint64_t all_loads, all_evicted, all_sweeps, all_chunks; /* over every bosc_open */

static void db_close(struct db *d)
{
    CHECK(!bosc_failed(d->b), "the data file failed: %s", db_error(d->b));
    struct bosc_stats st;
    bosc_get_stats(d->b, &st);
    all_loads += st.loads;
    all_evicted += st.evicted;
    all_sweeps += st.sweeps;
    all_chunks += st.sweep_chunks;
    bosc_close(d->b);
    kvt_destroy(d->t);
    d->b = NULL;
    d->t = NULL;
}

static void db_sync(struct db *d)
{
    int rc = bosc_sync(d->b);
    CHECK(rc == 0, "bosc_sync: %d (%s)", rc, db_error(d->b));
}

/* ---- retrying an operation as the server's callers do */

struct ctx {
    struct db *d;
    int id;
    uint64_t ops, loads, waits;
};

/* After an operation returned rc: 1 if it must be retried (the key was loaded,
 * or memory was made), 0 if rc is its answer. */
static int again(struct ctx *c, int64_t rc, const char *key, size_t klen, int tries, const char *what)
{
    if (rc != -ENODATA && rc != -ENOMEM)
        return 0;
    CHECK(tries < MAX_RETRIES, "%s %.*s: still %" PRId64 " after %d retries", what, (int)klen, key, rc, tries);
    if (rc == -ENODATA) {
        int lr = bosc_load(c->d->b, key, klen);
        CHECK(lr == 0, "%s %.*s: bosc_load returned %d (%s)", what, (int)klen, key, lr, db_error(c->d->b));
        c->loads++;
    } else {
        int wr = kvt_wait_memory(c->d->t);
        CHECK(wr == 0, "%s %.*s: kvt_wait_memory returned %d (used %" PRIu64 " of %" PRIu64 ")", what, (int)klen,
              key, wr, kvt_used_memory(c->d->t), kvt_max_memory(c->d->t));
        c->waits++;
    }
    return 1;
}

#define RETRY(c, key, klen, what, rc, expr)                                  \
    for (int tries_ = 0;; tries_++) {                                        \
        rc = (expr);                                                         \
        if (!again(c, rc, key, klen, tries_, what))                          \
            break;                                                           \
    }

/* ---- models */

struct model_key {
    char *val;
    size_t len, cap;
    bool present;
};

static struct model_key models[NTHREADS][KEYS];

static void model_put(struct model_key *m, const char *v, size_t n)
{
    if (n > m->cap || !m->val) {
        m->cap = n * 2 + 16;
        m->val = realloc(m->val, m->cap);
        CHECK(m->val != NULL);
    }
    memcpy(m->val, v, n);
    m->len = n;
    m->present = true;
}

static void mismatch(const char *what, const char *key, const struct model_key *m, const char *got, int64_t glen)
    __attribute__((noreturn));
static void mismatch(const char *what, const char *key, const struct model_key *m, const char *got, int64_t glen)
{
    int show = glen < 0 ? 0 : glen > 80 ? 80 : (int)glen;
    int mshow = m->len > 80 ? 80 : (int)m->len;
    fail_at(__FILE__, __LINE__, what, " %s: got %" PRId64 " \"%.*s%s\", model %s %zu \"%.*s%s\"", key, glen, show,
            got ? got : "", glen > show ? "..." : "", m->present ? "present" : "absent", m->present ? m->len : 0,
            m->present ? mshow : 0, m->present ? m->val : "", m->present && (int)m->len > mshow ? "..." : "");
}

static void check_get(struct ctx *c, const char *key, size_t klen, const struct model_key *m, char *buf,
                      const char *what)
{
    int64_t n;
    RETRY(c, key, klen, what, n, kvt_get_copy(c->d->t, key, klen, buf, VALBUF));
    if (!m->present) {
        if (n != -ENOENT)
            mismatch(what, key, m, buf, n);
        return;
    }
    if (n != (int64_t)m->len || memcmp(buf, m->val, m->len) != 0)
        mismatch(what, key, m, n >= 0 ? buf : NULL, n);
}

/* A value no other write produces: a stale or foreign read cannot pass. */
static size_t make_value(struct rng *r, char *v, int id, uint64_t op)
{
    if (rng_below(r, 5) == 0)
        return (size_t)snprintf(v, 32, "%" PRId64, (int64_t)rng_below(r, 2000001) - 1000000);
    size_t n = 1 + rng_below(r, 200);
    char tag[48];
    int tl = snprintf(tag, sizeof tag, "v%d.%" PRIu64 ".", id, op);
    for (size_t i = 0; i < n; i++)
        v[i] = i < (size_t)tl ? tag[i] : (char)('a' + rng_below(r, 26));
    return n;
}

struct oldval {
    char *buf;
    int64_t len;
};

static void copy_old(void *arg, const char *val, size_t vlen)
{
    struct oldval *o = arg;
    o->len = (int64_t)vlen;
    if (vlen <= VALBUF)
        memcpy(o->buf, val, vlen);
}

/* One random operation on key ki of thread c->id, checked against the model. */
static void random_op(struct ctx *c, struct rng *r, char *val, char *buf, char *old, int64_t far)
{
    struct kv_table *t = c->d->t;
    int ki = (int)rng_below(r, KEYS);
    char key[32];
    size_t klen = (size_t)snprintf(key, sizeof key, "t%d:k%d", c->id, ki);
    struct model_key *m = &models[c->id][ki];
    uint64_t which = rng_below(r, 100);
    c->ops++;
    if (which < 30) { /* SET */
        size_t n = make_value(r, val, c->id, c->ops);
        int flags = 0;
        int64_t exp = 0;
        uint64_t f = rng_below(r, 20);
        if (f < 3)
            exp = far;
        else if (f == 3)
            flags = KVT_NX;
        else if (f == 4)
            flags = KVT_XX;
        struct oldval o = {old, -1};
        bool with_get = rng_below(r, 20) == 0;
        int want = !((flags & KVT_NX) && m->present) && !((flags & KVT_XX) && !m->present);
        int rc;
        RETRY(c, key, klen, "SET", rc, (o.len = -1, kvt_set(t, key, klen, val, n, flags, exp,
                                                             with_get ? copy_old : NULL, &o)));
        CHECK(rc == want, "SET %s flags %d returned %d, expected %d (model %s)", key, flags, rc, want,
              m->present ? "present" : "absent");
        if (with_get && (m->present ? o.len != (int64_t)m->len || memcmp(old, m->val, m->len) : o.len != -1))
            mismatch("SET ... GET (old value)", key, m, o.len >= 0 ? old : NULL, o.len);
        if (want)
            model_put(m, val, n);
    } else if (which < 50) { /* GET */
        check_get(c, key, klen, m, buf, "GET");
    } else if (which < 59) { /* DEL */
        int rc;
        RETRY(c, key, klen, "DEL", rc, kvt_del(t, key, klen));
        CHECK(rc == (int)m->present, "DEL %s returned %d, model %s", key, rc, m->present ? "present" : "absent");
        m->present = false;
    } else if (which < 60) { /* DEL without loading (a multi-key DEL racing an eviction) */
        int rc;
        RETRY(c, key, klen, "DEL_BLIND", rc, kvt_del_blind(t, key, klen));
        CHECK(rc == 0 || (rc == 1 && m->present), "DEL_BLIND %s returned %d, model %s", key, rc,
              m->present ? "present" : "absent");
        m->present = false;
    } else if (which < 70) { /* INCRBY */
        long long cur = 0;
        bool isint = !m->present || model_int(m->val, m->len, &cur);
        int64_t delta = (int64_t)rng_below(r, 2001) - 1000, res = 0;
        int rc;
        RETRY(c, key, klen, "INCRBY", rc, kvt_incrby(t, key, klen, delta, &res));
        if (!isint) {
            CHECK(rc == -EINVAL, "INCRBY %s on \"%.*s\" returned %d", key, (int)(m->len > 40 ? 40 : m->len), m->val,
                  rc);
        } else if ((delta > 0 && cur > INT64_MAX - delta) || (delta < 0 && cur < INT64_MIN - delta)) {
            CHECK(rc == -ERANGE, "INCRBY %s overflowing returned %d", key, rc);
        } else {
            CHECK(rc == 0 && res == cur + delta, "INCRBY %s %" PRId64 " returned %d/%" PRId64 ", model %lld%s", key,
                  delta, rc, res, cur, m->present ? "" : " (absent)");
            char num[32];
            model_put(m, num, (size_t)snprintf(num, sizeof num, "%" PRId64, res));
        }
    } else if (which < 80) { /* APPEND */
        size_t n = 1 + rng_below(r, rng_below(r, 8) ? 40 : 1500);
        size_t base = m->present ? m->len : 0;
        if (base + n > MAX_APPENDED)
            n = 1;
        for (size_t i = 0; i < n; i++)
            val[i] = (char)('0' + rng_below(r, 10));
        int64_t rc;
        RETRY(c, key, klen, "APPEND", rc, kvt_append(t, key, klen, val, n));
        CHECK(rc == (int64_t)(base + n), "APPEND %s of %zu returned %" PRId64 ", expected %zu", key, n, rc, base + n);
        memcpy(buf, m->present ? m->val : "", base);
        memcpy(buf + base, val, n);
        model_put(m, buf, base + n);
    } else if (which < 90) { /* EXISTS */
        int rc;
        RETRY(c, key, klen, "EXISTS", rc, kvt_exists(t, key, klen));
        CHECK(rc == (int)m->present, "EXISTS %s returned %d, model %s", key, rc, m->present ? "present" : "absent");
    } else { /* STRLEN */
        int64_t rc;
        RETRY(c, key, klen, "STRLEN", rc, kvt_strlen(t, key, klen));
        CHECK(rc == (int64_t)(m->present ? m->len : 0), "STRLEN %s returned %" PRId64 ", model %zu", key, rc,
              m->present ? m->len : 0);
    }
}

/* ---- phases run by NTHREADS threads */

struct worker {
    pthread_t th;
    struct ctx c;
    uint64_t seed, ops;
    int verify_only;
};

static void verify_range(struct ctx *c, char *buf, const char *what)
{
    char key[32];
    for (int ki = 0; ki < KEYS; ki++) {
        size_t klen = (size_t)snprintf(key, sizeof key, "t%d:k%d", c->id, ki);
        check_get(c, key, klen, &models[c->id][ki], buf, what);
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    char *val = malloc(VALBUF), *buf = malloc(VALBUF), *old = malloc(VALBUF);
    CHECK(val && buf && old);
    if (w->verify_only) {
        verify_range(&w->c, buf, "verify");
    } else {
        struct rng r;
        rng_seed(&r, w->seed, (uint64_t)w->c.id);
        const int64_t far = unix_ms() + 24 * 3600 * 1000; /* a TTL that never passes here */
        for (uint64_t i = 0; i < w->ops; i++)
            random_op(&w->c, &r, val, buf, old, far);
    }
    free(val);
    free(buf);
    free(old);
    return NULL;
}

struct totals {
    uint64_t ops, loads, waits;
};

static void run_threads(struct db *d, uint64_t seed, uint64_t ops, int verify_only, struct totals *tot)
{
    struct worker w[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        w[i] = (struct worker){.c = {.d = d, .id = i}, .seed = seed, .ops = ops, .verify_only = verify_only};
        CHECK(pthread_create(&w[i].th, NULL, worker_main, &w[i]) == 0);
    }
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(w[i].th, NULL);
        tot->ops += w[i].c.ops;
        tot->loads += w[i].c.loads;
        tot->waits += w[i].c.waits;
    }
    CHECK(!bosc_failed(d->b), "the data file failed: %s", db_error(d->b));
}

static uint64_t live_keys(void)
{
    uint64_t n = 0;
    for (int i = 0; i < NTHREADS; i++)
        for (int k = 0; k < KEYS; k++)
            n += models[i][k].present;
    return n;
}

/* After a sync with no writer running: nothing dirty, DBSIZE exact, the file
 * holds exactly the live keys (no WAL: everything swept is clean). */
static void check_settled(struct db *d, uint64_t live, const char *when)
{
    db_sync(d);
    CHECK(!bosc_dirty(d->b), "%s: keys still dirty after bosc_sync", when);
    struct bosc_stats st;
    bosc_get_stats(d->b, &st);
    CHECK(kvt_count(d->t) == live, "%s: kvt_count %" PRIu64 ", models hold %" PRIu64 " live keys", when,
          kvt_count(d->t), live);
    CHECK(st.disk_keys == live, "%s: %" PRIu64 " keys in the data file, models hold %" PRIu64, when, st.disk_keys,
          live);
}

/* ---- phase 4: FLUSHALL (single-threaded; the flusher and loader still run) */

static void flush_key(char *key, size_t cap, size_t *klen, const char *kind, int i)
{
    *klen = (size_t)snprintf(key, cap, "f:%s:%d", kind, i);
}

/* Check the f:<kind>:<i> keys: present with value "<kind><i>", or absent. */
static void check_flush_keys(struct ctx *c, const char *kind, int n, bool present, char *buf, const char *when)
{
    char key[32], want[32];
    for (int i = 0; i < n; i++) {
        size_t klen;
        flush_key(key, sizeof key, &klen, kind, i);
        struct model_key m = {want, 0, 0, present};
        m.len = (size_t)snprintf(want, sizeof want, "%s%d", kind, i);
        check_get(c, key, klen, &m, buf, when);
        int rc;
        RETRY(c, key, klen, "EXISTS", rc, kvt_exists(c->d->t, key, klen));
        CHECK(rc == (int)present, "%s: EXISTS %s returned %d", when, key, rc);
    }
}

static void set_flush_keys(struct ctx *c, const char *kind, int n)
{
    char key[32], v[32];
    for (int i = 0; i < n; i++) {
        size_t klen;
        flush_key(key, sizeof key, &klen, kind, i);
        size_t vl = (size_t)snprintf(v, sizeof v, "%s%d", kind, i);
        int rc;
        RETRY(c, key, klen, "SET", rc, kvt_set(c->d->t, key, klen, v, vl, 0, 0, NULL, NULL));
        CHECK(rc == 1, "SET %s returned %d", key, rc);
    }
}

static void verify_models_absent(struct ctx *c, char *buf, const char *when)
{
    struct model_key none = {NULL, 0, 0, false};
    char key[32];
    for (int i = 0; i < NTHREADS; i++)
        for (int ki = 0; ki < KEYS; ki++) {
            size_t klen = (size_t)snprintf(key, sizeof key, "t%d:k%d", i, ki);
            check_get(c, key, klen, &none, buf, when);
        }
}

static void run_flushall(struct db *d, struct totals *tot)
{
    char *buf = malloc(VALBUF);
    CHECK(buf);
    struct ctx c = {.d = d, .id = -1};
    set_flush_keys(&c, "old", FLUSH_OLD);
    db_sync(d);
    CHECK(kvt_count(d->t) == live_keys() + FLUSH_OLD, "kvt_count %" PRIu64 " before FLUSHALL, expected %" PRIu64,
          kvt_count(d->t), live_keys() + FLUSH_OLD);
    CHECK(kvt_flush(d->t) == 0);
    for (int i = 0; i < NTHREADS; i++)
        for (int k = 0; k < KEYS; k++)
            models[i][k].present = false;
    CHECK(kvt_count(d->t) == 0, "kvt_count %" PRIu64 " right after FLUSHALL", kvt_count(d->t));
    set_flush_keys(&c, "new", FLUSH_NEW);
    check_flush_keys(&c, "old", FLUSH_OLD, false, buf, "after FLUSHALL");
    check_flush_keys(&c, "new", FLUSH_NEW, true, buf, "after FLUSHALL");
    verify_models_absent(&c, buf, "after FLUSHALL");
    CHECK(kvt_count(d->t) == FLUSH_NEW, "kvt_count %" PRIu64 " after FLUSHALL + %d SETs", kvt_count(d->t),
          FLUSH_NEW);
    check_settled(d, FLUSH_NEW, "after FLUSHALL + sync");

    db_close(d);
    struct bosc_open_info info = db_open(d);
    CHECK(info.disk_keys == FLUSH_NEW, "reopened after FLUSHALL: %" PRIu64 " keys in the data file, expected %d",
          info.disk_keys, FLUSH_NEW);
    check_flush_keys(&c, "old", FLUSH_OLD, false, buf, "reopened after FLUSHALL");
    check_flush_keys(&c, "new", FLUSH_NEW, true, buf, "reopened after FLUSHALL");
    verify_models_absent(&c, buf, "reopened after FLUSHALL");
    CHECK(kvt_count(d->t) == FLUSH_NEW);

    /* A FLUSHALL that nothing is written after: the sync must still make it stick.
     * (One key written and swept before it, as a server would have.) */
    set_flush_keys(&c, "canary", 1);
    db_sync(d);
    CHECK(kvt_flush(d->t) == 0);
    CHECK(kvt_count(d->t) == 0);
    check_flush_keys(&c, "new", FLUSH_NEW, false, buf, "after the second FLUSHALL");
    check_flush_keys(&c, "canary", 1, false, buf, "after the second FLUSHALL");
    check_settled(d, 0, "after the second FLUSHALL + sync");
    db_close(d);
    info = db_open(d);
    CHECK(info.disk_keys == 0, "reopened after a FLUSHALL (no write after it) + sync: %" PRIu64
          " keys in the data file, expected 0 (the flushed keys came back)", info.disk_keys);
    check_flush_keys(&c, "new", FLUSH_NEW, false, buf, "reopened after the second FLUSHALL");
    check_flush_keys(&c, "canary", 1, false, buf, "reopened after the second FLUSHALL");
    check_flush_keys(&c, "old", FLUSH_OLD, false, buf, "reopened after the second FLUSHALL");
    CHECK(kvt_count(d->t) == 0);
    tot->loads += c.loads;
    tot->waits += c.waits;
    free(buf);
}

/* Phases 1-3: concurrent random operations, a settled check of everything, a
 * restart on the same file with more operations. */
static void run_concurrent(struct db *d, uint64_t seed, uint64_t ops, struct totals *tot)
{
    /* 1-2: concurrent random operations, then a settled check of everything */
    run_threads(d, seed, ops, 0, tot);
    progress("concurrent phase done");
    uint64_t live = live_keys();
    check_settled(d, live, "after the concurrent phase");
    progress("synced");
    run_threads(d, seed, 0, 1, tot);
    progress("verified");
    CHECK(kvt_count(d->t) == live, "kvt_count %" PRIu64 " after verifying, models hold %" PRIu64, kvt_count(d->t),
          live);
    struct bosc_stats st;
    bosc_get_stats(d->b, &st);
    fprintf(stderr, "phase 1: %" PRIu64 " ops, %" PRIu64 " live keys, %" PRIu64 " loads by workers (%" PRIu64
            " in all), %" PRIu64 " memory waits, %" PRIu64 " evicted, %" PRIu64 " sweeps, %" PRIu64
            " blocks written\n", tot->ops, live, tot->loads, st.loads, tot->waits, st.evicted, st.sweeps,
            st.blocks_written);
    CHECK(st.evicted > 0 && tot->loads > 0, "nothing was evicted or loaded: the spill paths did not run");

    /* 3: restart on the same file, verify, more operations, verify */
    db_close(d);
    struct bosc_open_info info = db_open(d);
    CHECK(info.disk_keys == live, "reopened: %" PRIu64 " keys in the data file, models hold %" PRIu64,
          info.disk_keys, live);
    CHECK(kvt_count(d->t) == live, "reopened: kvt_count %" PRIu64 ", models hold %" PRIu64, kvt_count(d->t), live);
    run_threads(d, seed, 0, 1, tot);
    progress("reopened and verified");
    run_threads(d, seed + 1000003, ops / 4, 0, tot);
    live = live_keys();
    check_settled(d, live, "after the restart phase");
    run_threads(d, seed, 0, 1, tot);
    progress("restart phase done");
}

int main(int argc, char **argv)
{
    const char *env = getenv("KVSTORE_C_SEED");
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : env ? strtoull(env, NULL, 0) : 1;
    uint64_t ops = argc > 2 ? strtoull(argv[2], NULL, 0) : 20000;
    const char *mode = argc > 3 ? argv[3] : "all";
    bool all = strcmp(mode, "all") == 0;
    if (argc > 4 || (!all && strcmp(mode, "flushall"))) {
        fprintf(stderr, "usage: %s [SEED [OPS_PER_THREAD [all|flushall]]]\n", argv[0]);
        return 2;
    }
    t_start = seconds(CLOCK_MONOTONIC);
    const char *tmp = getenv("TMPDIR"); /* the runner points it at its own temp dir */
    snprintf(dir, sizeof dir, "%s/bosc_stress.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    snprintf(path, sizeof path, "%s/data", dir);
    atexit(cleanup);

    struct db d;
    struct totals tot = {0, 0, 0};
    struct bosc_open_info info = db_open(&d);
    CHECK(info.disk_keys == 0 && info.buckets == BUCKETS);

    if (all)
        run_concurrent(&d, seed, ops, &tot);
    /* 4: FLUSHALL (on a fresh file in flushall mode) */
    run_flushall(&d, &tot);
    db_close(&d);
    progress("FLUSHALL phase done");
    for (int i = 0; i < NTHREADS; i++)
        for (int k = 0; k < KEYS; k++)
            free(models[i][k].val);
    /* stderr, like everything else: the runner reads stdout then stderr and wants "ok" last */
    fprintf(stderr, "bosc_stress %s seed %" PRIu64 ": %" PRIu64 " ops, %" PRIu64 " loads, %" PRIu64
            " evictions, %" PRIu64 " sweeps (%" PRIu64 " chunks settled before their end), %" PRIu64
            " memory waits: ok\n", mode, seed, tot.ops, all_loads, all_evicted, all_sweeps, all_chunks, tot.waits);
    return 0;
}
