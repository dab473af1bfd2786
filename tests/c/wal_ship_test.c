/* wal_ship_test.c - the log's chunks in ship mode at their edges, for TSan and
 * ASan/UBSan (built with 4 KiB chunks). Two appenders write records of 20-320 B and
 * now and then 4-16 KB (larger than a chunk: each gets a chunk of its own size) and
 * FLUSH records; a unit thread writes units of 1-5 records (some of 3-9 KB); the
 * log's max_pending is small (256 KiB), so appends meet -EAGAIN while the slow
 * consumer lags. The consumer reads the sender's view (the records in place), holds
 * it 0-3 ms while appends go on and chunks behind the log thread are recycled, checks
 * every record (CRC and consecutive LSN) before and after the wait, and consumes it
 * (now and then only a prefix). Meanwhile RLIMIT_FSIZE (a full disk's stand-in)
 * refuses the log's writes round after round (-EIO while the log retries), and the
 * log switches between per-group sync and batched mode. Afterwards the consumer got
 * every record, all is synced, and recovery finds exactly the records appended.
 * A chunk recycled before both cursors passed it shows as a damaged record in a held
 * view (or a use after free under ASan). At the end, in sync mode, the log keeps only
 * a few spare chunks (white box: wal_int.h), not an async batch's worth.
 * Usage: wal_ship_test SEED DIR */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include "durability/wal.h"
#include "durability/wal_int.h"
#include "stress.h"

#define APPENDERS 2
#define ROUNDS 6 /* of disk full then writable again: ~0.5 s each */

static struct wal *w;
static unsigned seed;
static _Atomic int stop, consumer_stop;
static _Atomic uint64_t appended, eagain, eio, max_lsn, units_ok, views_held;
static uint64_t shipped; /* consumer thread, read after it is joined */

static void note_lsn(int64_t lsn)
{
    uint64_t m = atomic_load(&max_lsn);
    while ((uint64_t)lsn > m && !atomic_compare_exchange_weak(&max_lsn, &m, (uint64_t)lsn))
        ;
}

static void *appender(void *arg)
{
    int id = (int)(intptr_t)arg;
    struct rng r;
    rng_seed(&r, seed, id);
    static char val[16000];
    char key[32];
    for (uint64_t i = 0; !atomic_load(&stop); i++) {
        int k = snprintf(key, sizeof key, "a%d:%llu", id, (unsigned long long)i);
        uint32_t n = rng_below(&r, 50) == 0 ? 4000 + (uint32_t)rng_below(&r, 12000) : 20 + (uint32_t)rng_below(&r, 300);
        int type = rng_below(&r, 200) == 0 ? WAL_FLUSH : WAL_SET;
        int64_t lsn = wal_append(w, type, key, (uint32_t)k, val, n, NULL, 0, 0);
        if (lsn > 0) {
            atomic_fetch_add(&appended, 1);
            note_lsn(lsn);
        } else {
            CHECK(lsn == -EIO || lsn == -EAGAIN, "append: %lld", (long long)lsn);
            atomic_fetch_add(lsn == -EIO ? &eio : &eagain, 1);
            usleep(200);
        }
        usleep(50);
    }
    return NULL;
}

static void *unit_thread(void *arg)
{
    (void)arg;
    struct rng r;
    rng_seed(&r, seed, 99);
    static char val[9000];
    for (uint64_t i = 0; !atomic_load(&stop); i++) {
        if (wal_unit_begin(w)) {
            usleep(500);
            continue;
        }
        int nrec = 1 + (int)rng_below(&r, 5), got = 0;
        for (int j = 0; j < nrec; j++) {
            char key[32];
            int k = snprintf(key, sizeof key, "u%llu:%d", (unsigned long long)i, j);
            uint32_t n = rng_below(&r, 4) == 0 ? 3000 + (uint32_t)rng_below(&r, 6000) : 10 + (uint32_t)rng_below(&r, 100);
            int64_t lsn = wal_append(w, WAL_SET, key, (uint32_t)k, val, n, NULL, 0, 0);
            if (lsn > 0) {
                got++;
                atomic_fetch_add(&appended, 1);
                note_lsn(lsn);
            } else {
                CHECK(lsn == -EAGAIN || lsn == -EIO, "unit append %lld", (long long)lsn);
            }
            usleep(rng_below(&r, 300));
        }
        int64_t c = wal_unit_end(w);
        if (got) {
            CHECK(c > 0, "unit_end %lld", (long long)c);
            atomic_fetch_add(&appended, 1);
            note_lsn(c);
            atomic_fetch_add(&units_ok, 1);
        }
        usleep(300);
    }
    return NULL;
}

/* Every record of view v whole, CRC right, LSNs first.. consecutive; returns the last. */
static uint64_t check_view(const struct wal_ship *v, uint64_t first, int pass)
{
    uint64_t e = first;
    for (int i = 0; i < v->n; i++) {
        const unsigned char *p = v->iov[i].iov_base;
        size_t n = v->iov[i].iov_len, off = 0;
        while (off < n) {
            size_t l = wal_rec_len(p + off, n - off);
            CHECK(l && l <= n - off && wal_rec_ok(p + off, l), "pass %d: damaged record at %zu of part %d (LSN %llu)",
                  pass, off, i, (unsigned long long)e);
            CHECK(wal_rec_lsn(p + off, l) == e, "pass %d: LSN %llu, expected %llu", pass,
                  (unsigned long long)wal_rec_lsn(p + off, l), (unsigned long long)e);
            e++;
            off += l;
        }
    }
    return e - 1;
}

static void *consumer(void *arg)
{
    (void)arg;
    struct wal_ship v = {0};
    struct rng r;
    rng_seed(&r, seed, 1000);
    uint64_t expect = 1;
    for (;;) {
        int done = atomic_load(&consumer_stop);
        uint64_t last = wal_ship_peek(w, &v);
        if (last) {
            CHECK(v.first == expect, "view starts at %llu, expected %llu", (unsigned long long)v.first,
                  (unsigned long long)expect);
            CHECK(check_view(&v, expect, 0) == last);
            usleep(rng_below(&r, 3000)); /* a slow peer: appends and the log thread go on */
            CHECK(check_view(&v, expect, 1) == last);
            atomic_fetch_add(&views_held, 1);
            uint64_t upto = last;
            if (last > expect && rng_below(&r, 3) == 0)
                upto = expect + rng_below(&r, last - expect);
            wal_ship_consume(w, &v, upto);
            shipped += upto - expect + 1;
            expect = upto + 1;
        } else if (done) {
            break;
        }
        usleep(rng_below(&r, 500));
    }
    wal_ship_free(&v);
    return NULL;
}

int main(int argc, char **argv)
{
    CHECK(argc == 3, "usage: wal_ship_test SEED DIR");
    seed = (unsigned)strtoul(argv[1], NULL, 10);
    signal(SIGXFSZ, SIG_IGN);
    char err[256];
    struct wal_config cfg = {.dir = argv[2], .sync = 1, .first_lsn = 1, .segment_bytes = 64 * 1024,
                             .ship = 1, .max_pending = 256 * 1024};
    CHECK(wal_open(&w, &cfg, err, sizeof err) == 0 && wal_start(w) == 0, "open: %s", err);
    pthread_t a[APPENDERS + 1], c;
    for (int i = 0; i < APPENDERS; i++)
        pthread_create(&a[i], NULL, appender, (void *)(intptr_t)i);
    pthread_create(&a[APPENDERS], NULL, unit_thread, NULL);
    pthread_create(&c, NULL, consumer, NULL);
    for (int round = 0; round < ROUNDS; round++) {
        usleep(250 * 1000);
        fsize_limit(round % 2 ? 8 : 40 * 1024); /* nothing fits, or the segment fills up soon */
        usleep(250 * 1000);
        wal_set_sync(w, round % 3 == 0);
        fsize_limit(RLIM_INFINITY);
    }
    wal_set_sync(w, 1);
    atomic_store(&stop, 1);
    for (int i = 0; i <= APPENDERS; i++)
        pthread_join(a[i], NULL);
    uint64_t last = atomic_load(&max_lsn);
    for (int i = 0; i < 20000 && wal_synced_lsn(w) < last; i++)
        usleep(1000);
    CHECK(wal_synced_lsn(w) == last, "synced %llu, last appended %llu", (unsigned long long)wal_synced_lsn(w),
          (unsigned long long)last);
    atomic_store(&consumer_stop, 1);
    pthread_join(c, NULL);
    CHECK(shipped == last, "shipped %llu, last appended %llu", (unsigned long long)shipped, (unsigned long long)last);
    pthread_mutex_lock(&w->lock);
    int nspare = w->nspare;
    pthread_mutex_unlock(&w->lock);
    CHECK(nspare <= SYNC_SPARES, "%d spare chunks kept in sync mode", nspare);
    struct wal_stats st;
    wal_get_stats(w, &st);
    wal_close(w);
    struct wal_recovery rec;
    CHECK(wal_recover(NULL, argv[2], 0, 0, &rec, err, sizeof err) == 0, "recover: %s", err);
    CHECK(rec.records == atomic_load(&appended) && rec.last_lsn == last && !rec.problem[0],
          "recovered %llu of %llu records, last %llu of %llu, problem '%s'", (unsigned long long)rec.records,
          (unsigned long long)atomic_load(&appended), (unsigned long long)rec.last_lsn, (unsigned long long)last,
          rec.problem);
    CHECK(atomic_load(&eagain) > 0, "max_pending never refused an append");
    CHECK(st.write_errors > 0, "the disk never refused a write");
    CHECK(atomic_load(&units_ok) > 0 && atomic_load(&views_held) > 0);
    printf("%llu records (%llu units), %llu views held, %llu appends refused (EAGAIN %llu, EIO %llu), "
           "%llu failed writes retried\nok\n",
           (unsigned long long)rec.records, (unsigned long long)atomic_load(&units_ok),
           (unsigned long long)atomic_load(&views_held),
           (unsigned long long)(atomic_load(&eagain) + atomic_load(&eio)), (unsigned long long)atomic_load(&eagain),
           (unsigned long long)atomic_load(&eio), (unsigned long long)st.write_errors);
    return 0;
}
