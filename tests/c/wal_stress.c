/* wal_stress.c - the write-ahead log under concurrency, for TSan and ASan/UBSan.
 * APPENDERS threads append records (through the table's logger, so shard locks and
 * the log lock nest as in the server, with a FLUSHALL now and then) while a shipper
 * thread takes the ship buffer (as the log sender does) and checks that what it gets
 * is whole records with consecutive LSNs, and a toggler switches the log between
 * per-group sync and batched mode. Afterwards recovery must find every record, in
 * order, and rebuild the same table. Usage: wal_stress SEED RECORDS_PER_THREAD DIR */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/kvbuf.h"
#include "core/table.h"
#include "durability/wal.h"
#include "stress.h"

#define APPENDERS 3

static struct wal *w;
static struct kv_table *t;
static uint64_t per_thread;
static unsigned seed;
static _Atomic int appenders_done;
static _Atomic uint64_t shipped_records;

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

static void *shipper(void *arg)
{
    (void)arg;
    struct kvbuf b = {0};
    uint64_t expect = 1;
    for (;;) {
        int done = atomic_load(&appenders_done) == APPENDERS;
        uint64_t first, last = wal_take_ship(w, &b, &first);
        if (last) {
            CHECK(first == expect, "ship batch starts at LSN %llu, expected %llu", (unsigned long long)first,
                  (unsigned long long)expect);
            size_t off = 0;
            while (off < b.len) {
                size_t l = wal_rec_len((unsigned char *)b.p + off, b.len - off);
                CHECK(l && l <= b.len - off && wal_rec_ok((unsigned char *)b.p + off, l), "bad record at %zu", off);
                uint64_t lsn = wal_rec_lsn((unsigned char *)b.p + off, l);
                CHECK(lsn == expect, "shipped LSN %llu, expected %llu", (unsigned long long)lsn,
                      (unsigned long long)expect);
                expect++;
                off += l;
            }
            CHECK(expect - 1 == last, "batch ends at %llu, records end at %llu", (unsigned long long)last,
                  (unsigned long long)(expect - 1));
            atomic_fetch_add(&shipped_records, (uint64_t)(last - first + 1));
            wal_publish_durable(w, last); /* as a peer's ack would */
        } else if (done) {
            break;
        }
        usleep(50);
    }
    kvbuf_free(&b);
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

int main(int argc, char **argv)
{
    CHECK(argc == 4, "usage: wal_stress SEED RECORDS_PER_THREAD DIR");
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

    pthread_t th[APPENDERS + 2];
    struct worker wk[APPENDERS];
    for (int i = 0; i < APPENDERS; i++) {
        wk[i] = (struct worker){i, seed * 7919u + (unsigned)i};
        CHECK(pthread_create(&th[i], NULL, appender, &wk[i]) == 0, "thread");
    }
    CHECK(pthread_create(&th[APPENDERS], NULL, shipper, NULL) == 0, "thread");
    CHECK(pthread_create(&th[APPENDERS + 1], NULL, toggler, NULL) == 0, "thread");
    for (int i = 0; i < APPENDERS + 2; i++)
        pthread_join(th[i], NULL);
    struct wal_stats st;
    wal_get_stats(w, &st);
    uint64_t appended = st.appended_lsn;
    CHECK(atomic_load(&shipped_records) == appended, "shipped %llu of %llu records",
          (unsigned long long)atomic_load(&shipped_records), (unsigned long long)appended);
    kvt_set_log(t, NULL, NULL);
    wal_close(w); /* writes and syncs what is left */

    struct kv_table *t2;
    CHECK(kvt_create(&t2, 0) == 0, "table 2");
    struct wal_recovery rec;
    CHECK(wal_recover(t2, dir, 0, 0, &rec, err, sizeof err) == 0, "recovery: %s", err);
    CHECK(rec.records == appended && rec.last_lsn == appended && !rec.problem[0],
          "recovered %llu records up to %llu (%s), appended %llu", (unsigned long long)rec.records,
          (unsigned long long)rec.last_lsn, rec.problem, (unsigned long long)appended);
    CHECK(kvt_count(t2) == kvt_count(t), "recovered table has %llu keys, the original %llu",
          (unsigned long long)kvt_count(t2), (unsigned long long)kvt_count(t));
    CHECK(same_value(t, t2, "counter"), "counter differs");
    char key[32];
    for (int i = 0; i < APPENDERS; i++)
        for (int k = 0; k < 500; k++) {
            snprintf(key, sizeof key, "w%d:k%d", i, k);
            CHECK(same_value(t, t2, key), "key %s differs after recovery", key);
        }
    printf("%llu records in %llu segments, %llu groups; recovered the same table\nok\n",
           (unsigned long long)appended, (unsigned long long)rec.segments, (unsigned long long)st.groups);
    kvt_destroy(t);
    kvt_destroy(t2);
    return 0;
}
