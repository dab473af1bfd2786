/* wal_stress.c - the write-ahead log under concurrency, for TSan and ASan/UBSan.
 * APPENDERS threads append records (through the table's logger, so shard locks and
 * the log lock nest as in the server, with a FLUSHALL now and then) while a
 * transaction thread runs units (kvt_tx_begin .. kvt_tx_end: the same counter into
 * three keys and a hash-typed key), a shipper thread reads the log's ship view (as
 * the log sender does: the records in place) and checks that what it gets is whole
 * records in whole parts with consecutive LSNs that never ends inside a unit, and
 * consumes it (now and then only a prefix), a sampler records every durable LSN it sees,
 * and a toggler switches the log between per-group sync and batched mode.
 * Afterwards: no durable LSN fell inside a unit, recovery finds every record, in
 * order, and rebuilds the same table (types included), a unit left open at
 * wal_close is dropped whole, and (in DIR-join) a FLUSH from another thread
 * joins an open unit. Usage: wal_stress SEED RECORDS_PER_THREAD DIR; under TSan
 * with TSAN_OPTIONS=detect_deadlocks=0 (a transaction holds all 256 shard locks,
 * past the 64 its lock-order checker tracks). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/bytes.h"
#include "core/kvbuf.h"
#include <sys/uio.h>
#include "core/table.h"
#include "durability/wal.h"
#include "stress.h"

#define APPENDERS 3
#define MAX_SAMPLES (1u << 20)

static struct wal *w;
static struct kv_table *t;
static uint64_t per_thread;
static unsigned seed;
static _Atomic int appenders_done;
static _Atomic uint64_t shipped_records;
static _Atomic int tx_done;
static uint64_t *samples; /* durable LSNs seen by the sampler */
static size_t nsamples;

struct worker {
    int id;
    unsigned rng;
};

static void *appender(void *arg)
{
    struct worker *wk = arg;
    char key[32], val[96];
    for (uint64_t i = 0; i < per_thread; i++) {
        int k = snprintf(key, sizeof key, "w%d:k%u", wk->id, (unsigned)(rand_r(&wk->rng) % 500));
        int v = snprintf(val, sizeof val, "value-%d-%llu", wk->id, (unsigned long long)i);
        int r = rand_r(&wk->rng) % 100;
        int rc;
        if (r < 70)
            rc = kvt_set(t, key, (size_t)k, val, (size_t)v, 0, 0, NULL, NULL);
        else if (r < 85)
            rc = kvt_del(t, key, (size_t)k);
        else if (r < 99) {
            int64_t out;
            rc = kvt_incrby(t, "counter", 7, 1, &out);
        } else if (wk->id == 0 && i % 5000 == 0)
            rc = kvt_flush(t);
        else
            rc = (int)kvt_append(t, key, (size_t)k, "+", 1);
        CHECK(rc >= 0 || rc == -EAGAIN, "operation failed: %d", rc);
        if (rc == -EAGAIN)
            usleep(100);
        /* a reply would wait for this; make sure the log does get there */
        (void)kvt_lsn_touched();
    }
    atomic_fetch_add(&appenders_done, 1);
    return NULL;
}

/* Units: the same number into tx:a, tx:b, tx:c and a hash-typed tx:h, with every
 * shard held; some units write nothing (kvt_tx_end then logs nothing). */
static void *transactor(void *arg)
{
    (void)arg;
    unsigned r = seed * 31u + 5;
    uint64_t n = 0;
    while (atomic_load(&appenders_done) < APPENDERS) {
        int rc = kvt_tx_begin(t);
        CHECK(rc == 0, "kvt_tx_begin: %d", rc);
        int empty = rand_r(&r) % 8 == 0;
        /* some units last long enough for the log thread to come by mid-unit */
        int slow = rand_r(&r) % 4 == 0;
        char val[32];
        int v = snprintf(val, sizeof val, "%llu", (unsigned long long)++n);
        for (int k = 0; k < 3 && !empty; k++) {
            char key[8] = {'t', 'x', ':', (char)('a' + k)};
            rc = kvt_set(t, key, 4, val, (size_t)v, 0, 0, NULL, NULL);
            /* -EAGAIN: the backlog is full, and stays so until the unit ends (the
             * log thread waits for it): the write is refused, not retried */
            CHECK(rc >= 0 || rc == -EAGAIN, "set in a unit: %d", rc);
            if (slow)
                usleep(200);
        }
        if (!empty) {
            rc = kvt_set(t, "tx:h", 4, val, (size_t)v, KVT_TYPE_HASH, 0, NULL, NULL);
            CHECK(rc >= 0 || rc == -EAGAIN, "hash set: %d", rc);
        }
        int64_t lsn = kvt_tx_end(t);
        CHECK(empty ? lsn == 0 : lsn > 0, "kvt_tx_end: %lld", (long long)lsn);
        if (rand_r(&r) % 4 == 0)
            usleep(rand_r(&r) % 100);
    }
    atomic_store(&tx_done, 1);
    return NULL;
}

static void *sampler(void *arg)
{
    (void)arg;
    uint64_t last = 0;
    while (!atomic_load(&tx_done)) {
        uint64_t d = wal_durable_lsn(w);
        if (d != last && nsamples < MAX_SAMPLES)
            samples[nsamples++] = d;
        last = d;
    }
    return NULL;
}

/* in_unit: whether the records walked so far end inside a unit. */
static void walk_units(const unsigned char *p, size_t l, int *in_unit)
{
    int op = p[WAL_OFF_OP], unit = p[WAL_OFF_FLAGS] & WAL_F_UNIT;
    CHECK(op == WAL_COMMIT ? *in_unit : !(*in_unit && !unit), "unit rules broken at LSN %llu",
          (unsigned long long)wal_rec_lsn(p, l));
    *in_unit = unit;
}

static void *shipper(void *arg)
{
    (void)arg;
    struct wal_ship v = {0};
    uint64_t expect = 1;
    unsigned r = seed;
    int carry = 0; /* whether the records consumed so far end inside a unit */
    for (;;) {
        int done = atomic_load(&appenders_done) == APPENDERS && atomic_load(&tx_done);
        uint64_t last = wal_ship_peek(w, &v);
        if (last) {
            int in_unit = carry, at_upto = 0;
            uint64_t first = expect;
            /* Now and then consume a prefix only (the sender passing over what
             * the peer holds, which may end inside a unit): the next view starts
             * right after it. */
            uint64_t upto = last;
            if (last > first && rand_r(&r) % 4 == 0)
                upto = first + rand_r(&r) % (last - first);
            CHECK(v.first == expect, "ship view starts at LSN %llu, expected %llu", (unsigned long long)v.first,
                  (unsigned long long)expect);
            size_t total = 0;
            for (int i = 0; i < v.n; i++) {
                const unsigned char *p = v.iov[i].iov_base;
                size_t n = v.iov[i].iov_len, off = 0;
                CHECK(n > 0, "an empty part in a ship view");
                total += n;
                while (off < n) { /* whole records, never split between parts */
                    size_t l = wal_rec_len(p + off, n - off);
                    CHECK(l && l <= n - off && wal_rec_ok(p + off, l), "bad record at %zu of part %d", off, i);
                    uint64_t lsn = wal_rec_lsn(p + off, l);
                    CHECK(lsn == expect, "shipped LSN %llu, expected %llu", (unsigned long long)lsn,
                          (unsigned long long)expect);
                    expect++;
                    walk_units(p + off, l, &in_unit);
                    if (lsn == upto)
                        at_upto = in_unit;
                    off += l;
                }
            }
            CHECK(total == v.bytes, "view holds %zu bytes, says %zu", total, v.bytes);
            CHECK(!in_unit, "a ship view ends inside a unit (at LSN %llu)", (unsigned long long)last);
            CHECK(expect - 1 == last, "view ends at %llu, records end at %llu", (unsigned long long)last,
                  (unsigned long long)(expect - 1));
            wal_ship_consume(w, &v, upto);
            carry = at_upto;
            expect = upto + 1;
            atomic_fetch_add(&shipped_records, (uint64_t)(upto - first + 1));
            if (upto == last) /* as a peer's ack would (it acknowledges whole units only) */
                wal_publish_durable(w, upto);
        } else if (done) {
            break;
        }
        usleep(50);
    }
    wal_ship_free(&v);
    return NULL;
}

static void *toggler(void *arg)
{
    (void)arg;
    unsigned r = seed;
    while (atomic_load(&appenders_done) < APPENDERS) {
        wal_set_sync(w, rand_r(&r) % 2);
        usleep(2000);
    }
    return NULL;
}

struct snapshot_arg {
    char buf[256];
};

static int same_value(struct kv_table *a, struct kv_table *b, const char *key)
{
    char va[256], vb[256];
    int64_t la = kvt_get_copy(a, key, strlen(key), va, sizeof va);
    int64_t lb = kvt_get_copy(b, key, strlen(key), vb, sizeof vb);
    return la == lb && (la < 0 || memcmp(va, vb, (size_t)la) == 0);
}

static void *flush_from_another_thread(void *arg)
{
    /* no key: NULL, as the table's FLUSHALL logs it (nothing may be copied from it) */
    CHECK(wal_append(arg, WAL_FLUSH, NULL, 0, NULL, 0, NULL, 0, 0) > 0, "FLUSH append");
    return NULL;
}

/* A record appended by another thread while a unit is open (only a FLUSHALL
 * can be: it logs without shard locks) joins the unit, in LSN order. */
static void check_flush_joins_a_unit(const char *base)
{
    char dir[4200], err[512];
    snprintf(dir, sizeof dir, "%s-join", base);
    struct wal *j;
    struct wal_config cfg = {.dir = dir, .sync = 1, .first_lsn = 1};
    CHECK(wal_open(&j, &cfg, err, sizeof err) == 0 && wal_start(j) == 0, "join log: %s", err);
    CHECK(wal_append(j, WAL_SET, "j:0", 3, "0", 1, NULL, 0, 0) == 1, "plain record");
    CHECK(wal_unit_begin(j) == 0 && wal_unit_begin(j) == -EBUSY, "units do not nest");
    CHECK(wal_append(j, WAL_SET, "j:a", 3, "1", 1, NULL, 0, 0) == 2, "unit record");
    pthread_t th;
    CHECK(pthread_create(&th, NULL, flush_from_another_thread, j) == 0, "thread");
    pthread_join(th, NULL);
    CHECK(wal_append(j, WAL_SET | WAL_HASH, "j:b", 3, "2", 1, NULL, 0, 0) == 4, "unit record");
    CHECK(wal_unit_end(j) == 5 && wal_unit_end(j) == -EINVAL, "COMMIT");
    CHECK(wal_unit_begin(j) == 0 && wal_unit_end(j) == 0, "an empty unit writes nothing");
    wal_close(j);
    struct kvbuf all = {0};
    CHECK(wal_read_range(dir, 1, UINT64_MAX, SIZE_MAX, &all) == 5, "read back");
    const unsigned char *p = (unsigned char *)all.p;
    size_t off = 0;
    for (int i = 0; i < 5; i++) {
        size_t l = wal_rec_len(p + off, all.len - off);
        static const int op[5] = {WAL_SET, WAL_SET, WAL_FLUSH, WAL_SET, WAL_COMMIT};
        CHECK(p[off + WAL_OFF_OP] == op[i] && (p[off + WAL_OFF_FLAGS] == WAL_F_UNIT) == (i >= 1 && i <= 3) &&
              p[off + WAL_OFF_TYPE] == (i == 3 ? WAL_T_HASH : WAL_T_STRING), "record %d of the join log", i + 1);
        off += l;
    }
    CHECK(get32(p + off - WAL_COMMIT_LEN + WAL_OFF_COUNT) == 3, "the COMMIT counts the FLUSH");
    struct kv_table *tj;
    struct wal_recovery rec;
    CHECK(kvt_create(&tj, 0) == 0 && wal_recover(tj, dir, 0, 0, &rec, err, sizeof err) == 0, "recover: %s", err);
    char buf[8];
    CHECK(rec.units == 1 && kvt_get_copy(tj, "j:0", 3, buf, sizeof buf) == -ENOENT &&
          kvt_get_copy(tj, "j:a", 3, buf, sizeof buf) == -ENOENT &&
          kvt_get_copy(tj, "j:b", 3, buf, sizeof buf) == KVT_WRONGTYPE, "replayed in LSN order, j:b a hash");
    kvt_destroy(tj);
    kvbuf_free(&all);
}

int main(int argc, char **argv)
{
    CHECK(argc == 4, "usage: wal_stress SEED RECORDS_PER_THREAD DIR");
    char key_buf[256];
    seed = (unsigned)atoi(argv[1]);
    per_thread = strtoull(argv[2], NULL, 10);
    const char *dir = argv[3];
    char err[512];
    CHECK(kvt_create(&t, 0) == 0, "table");
    struct wal_config cfg = {.dir = dir, .sync = 0, .ship = 1, .batch_ms = 5, .first_lsn = 1,
                             .segment_bytes = 256 * 1024}; /* small segments: rotation is exercised */
    CHECK(wal_open(&w, &cfg, err, sizeof err) == 0, "wal_open: %s", err);
    CHECK(wal_start(w) == 0, "wal_start");
    kvt_set_log(t, wal_log_fn, w);

    samples = calloc(MAX_SAMPLES, sizeof *samples);
    CHECK(samples, "memory");
    pthread_t th[APPENDERS + 4];
    struct worker wk[APPENDERS];
    for (int i = 0; i < APPENDERS; i++) {
        wk[i] = (struct worker){i, seed * 7919u + (unsigned)i};
        CHECK(pthread_create(&th[i], NULL, appender, &wk[i]) == 0, "thread");
    }
    CHECK(pthread_create(&th[APPENDERS], NULL, shipper, NULL) == 0, "thread");
    CHECK(pthread_create(&th[APPENDERS + 1], NULL, toggler, NULL) == 0, "thread");
    CHECK(pthread_create(&th[APPENDERS + 2], NULL, transactor, NULL) == 0, "thread");
    CHECK(pthread_create(&th[APPENDERS + 3], NULL, sampler, NULL) == 0, "thread");
    for (int i = 0; i < APPENDERS + 4; i++)
        pthread_join(th[i], NULL);
    struct wal_stats st;
    wal_get_stats(w, &st);
    uint64_t appended = st.appended_lsn;
    CHECK(atomic_load(&shipped_records) == appended, "shipped %llu of %llu records",
          (unsigned long long)atomic_load(&shipped_records), (unsigned long long)appended);
    kvt_set_log(t, NULL, NULL);
    /* A unit still open when the log closes (a crash before its COMMIT): its
     * records reach the file but never count as durable. */
    CHECK(wal_unit_begin(w) == 0, "wal_unit_begin");
    for (int i = 0; i < 3; i++)
        CHECK(wal_append(w, WAL_SET, "tx:a", 4, "lost", 4, NULL, 0, 0) > 0, "append in the open unit");
    wal_close(w); /* writes and syncs what is left */

    /* Every durable LSN seen lies between units: walk the log's units. */
    struct kvbuf all = {0};
    CHECK(wal_read_range(dir, 1, UINT64_MAX, SIZE_MAX, &all) == (int64_t)appended + 3, "read back the log");
    uint64_t *commit_of = calloc(appended + 4, sizeof *commit_of); /* unit record LSN -> its COMMIT's */
    CHECK(commit_of, "memory");
    uint64_t units = 0, joined = 0, ufirst = 0;
    int in_unit = 0;
    for (size_t off = 0; off < all.len;) {
        const unsigned char *p = (unsigned char *)all.p + off;
        size_t l = wal_rec_len(p, all.len - off);
        uint64_t lsn = wal_rec_lsn(p, l);
        if (!in_unit && (p[WAL_OFF_FLAGS] & WAL_F_UNIT))
            ufirst = lsn;
        joined += p[WAL_OFF_OP] == WAL_FLUSH && (p[WAL_OFF_FLAGS] & WAL_F_UNIT); /* a FLUSHALL in a unit */
        walk_units(p, l, &in_unit);
        if (p[WAL_OFF_OP] == WAL_COMMIT) {
            CHECK(get32(p + WAL_OFF_COUNT) == lsn - ufirst, "COMMIT %llu counts %u records",
                  (unsigned long long)lsn, get32(p + WAL_OFF_COUNT));
            for (uint64_t x = ufirst; x < lsn; x++)
                commit_of[x] = lsn;
            units++;
        }
        off += l;
    }
    CHECK(in_unit, "the log ends inside the unit left open");
    for (uint64_t x = ufirst; x <= appended + 3; x++)
        commit_of[x] = UINT64_MAX;
    for (size_t i = 0; i < nsamples; i++)
        CHECK(!commit_of[samples[i]], "durable LSN %llu lies inside the unit closed by LSN %llu",
              (unsigned long long)samples[i], (unsigned long long)commit_of[samples[i]]);
    CHECK(units > 0, "no unit was logged");

    struct kv_table *t2;
    CHECK(kvt_create(&t2, 0) == 0, "table 2");
    struct wal_recovery rec;
    CHECK(wal_recover(t2, dir, 0, 0, &rec, err, sizeof err) == 0, "recovery: %s", err);
    CHECK(rec.records == appended && rec.last_lsn == appended && rec.units == units && rec.dropped_units == 1 &&
          strstr(rec.problem, "has no COMMIT"), "recovered %llu records up to %llu, %llu units (%s), appended "
          "%llu, %llu units", (unsigned long long)rec.records, (unsigned long long)rec.last_lsn,
          (unsigned long long)rec.units, rec.problem, (unsigned long long)appended, (unsigned long long)units);
    CHECK(kvt_count(t2) == kvt_count(t), "recovered table has %llu keys, the original %llu",
          (unsigned long long)kvt_count(t2), (unsigned long long)kvt_count(t));
    CHECK(same_value(t, t2, "counter"), "counter differs");
    CHECK(same_value(t, t2, "tx:a") && same_value(t, t2, "tx:b") && same_value(t, t2, "tx:c"), "tx keys differ");
    CHECK(kvt_get_copy(t2, "tx:h", 4, key_buf, sizeof key_buf) == kvt_get_copy(t, "tx:h", 4, key_buf, sizeof key_buf),
          "tx:h recovered as another type");
    /* Repair cuts the open unit away: the next recovery ends cleanly there. */
    struct kv_table *t3;
    CHECK(kvt_create(&t3, 0) == 0, "table 3");
    CHECK(wal_recover(t3, dir, 0, 1, &rec, err, sizeof err) == 0 && rec.dropped_units == 1, "repair: %s", err);
    CHECK(wal_recover(t3, dir, 0, 1, &rec, err, sizeof err) == 0 && !rec.problem[0] && rec.last_lsn == appended,
          "after repair: %s %s", err, rec.problem);
    kvt_destroy(t3);
    check_flush_joins_a_unit(dir);
    char key[32];
    for (int i = 0; i < APPENDERS; i++)
        for (int k = 0; k < 500; k++) {
            snprintf(key, sizeof key, "w%d:k%d", i, k);
            CHECK(same_value(t, t2, key), "key %s differs after recovery", key);
        }
    printf("%llu records in %llu segments, %llu groups, %llu units (%llu FLUSHALLs joined one), %zu durable "
           "LSNs seen, none inside a unit; recovered the same table\nok\n", (unsigned long long)appended,
           (unsigned long long)rec.segments, (unsigned long long)st.groups, (unsigned long long)units,
           (unsigned long long)joined, nsamples);
    free(commit_of);
    free(samples);
    kvbuf_free(&all);
    kvt_destroy(t);
    kvt_destroy(t2);
    return 0;
}
