/* wal_diskfull_test.c - the log on a disk that refuses it, for TSan and ASan/UBSan.
 * RLIMIT_FSIZE stands in for a full disk with no root and no filesystem of its
 * own: a write past the limit is cut short, the next fails with EFBIG (SIGXFSZ
 * ignored). Two appenders write while, round after round, the limit drops
 * into the current segment (a write cut short) or to 8 bytes (no write of any
 * segment, new or old, can succeed) and is raised again. Each round checks: the log says why it cannot write
 * (wal_write_error: EFBIG), appends are refused with -EIO, the durable LSN stays
 * below the appended one (the refused group is kept, not dropped); once the
 * limit is raised the log writes again by itself and everything appended
 * becomes durable. At the end recovery reads exactly the records whose appends
 * succeeded, in order, with no torn tail and no damage: every partial write was
 * cut away before the next. Usage: wal_diskfull_test DIR */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "durability/wal.h"
#include "stress.h"

#define APPENDERS 2
#define ROUNDS 6
#define WAIT_S 20 /* for the log to notice or to recover: generous on a loaded machine */

static struct wal *w;
static _Atomic int stop;
static _Atomic uint64_t appended, refused, max_lsn;

static void *appender(void *arg)
{
    int id = (int)(intptr_t)arg;
    char key[32], val[200];
    memset(val, 'v', sizeof val);
    for (uint64_t i = 0; !atomic_load(&stop); i++) {
        int k = snprintf(key, sizeof key, "a%d:%llu", id, (unsigned long long)i);
        int64_t lsn = wal_append(w, WAL_SET, key, (uint32_t)k, val, (uint32_t)(50 + i % 150), NULL, 0, 0);
        if (lsn > 0) {
            atomic_fetch_add(&appended, 1);
            uint64_t m = atomic_load(&max_lsn);
            while ((uint64_t)lsn > m && !atomic_compare_exchange_weak(&max_lsn, &m, (uint64_t)lsn))
                ;
        } else {
            CHECK(lsn == -EIO || lsn == -EAGAIN, "append: %lld", (long long)lsn);
            atomic_fetch_add(&refused, lsn == -EIO);
            usleep(1000);
        }
        usleep(100); /* a bounded rate: groups of a few records, a few MB in all */
    }
    return NULL;
}

/* Wait until pred() holds, at most WAIT_S seconds. */
static int wait_until(int (*pred)(void))
{
    for (int i = 0; i < WAIT_S * 1000; i++) {
        if (pred())
            return 1;
        usleep(1000);
    }
    return 0;
}

static int refusing(void) { return wal_write_error(w, NULL, 0) != 0; }
static int caught_up(void)
{
    return !wal_write_error(w, NULL, 0) && wal_durable_lsn(w) >= atomic_load(&max_lsn);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    signal(SIGXFSZ, SIG_IGN);
    char err[256];
    struct wal_config cfg = {.dir = argv[1], .sync = 1, .first_lsn = 1, .segment_bytes = 16 * 1024};
    CHECK(wal_open(&w, &cfg, err, sizeof err) == 0 && wal_start(w) == 0, "wal_open: %s", err);
    pthread_t th[APPENDERS];
    for (int i = 0; i < APPENDERS; i++)
        CHECK(pthread_create(&th[i], NULL, appender, (void *)(intptr_t)i) == 0);

    uint64_t errors_before = 0;
    for (int round = 0; round < ROUNDS; round++) {
        uint64_t d0 = wal_durable_lsn(w);
        for (int i = 0; i < WAIT_S * 1000 && wal_durable_lsn(w) < d0 + 300; i++)
            usleep(1000);
        CHECK(wal_durable_lsn(w) >= d0 + 300, "round %d: the log does not move", round);
        /* even rounds: within a segment (16 KiB each); odd ones: below any segment's header */
        fsize_limit(round % 2 ? 8 : 10 * 1024);
        CHECK(wait_until(refusing), "round %d: the log never noticed the limit", round);
        char msg[256];
        CHECK(wal_write_error(w, msg, sizeof msg) == EFBIG && strstr(msg, "File too large"), "round %d: %s",
              round, msg);
        uint64_t r0 = atomic_load(&refused);
        for (int i = 0; i < WAIT_S * 1000 && atomic_load(&refused) == r0; i++)
            usleep(1000);
        CHECK(atomic_load(&refused) > r0, "round %d: appends not refused", round);
        uint64_t d1 = wal_durable_lsn(w);
        usleep(50 * 1000);
        CHECK(wal_durable_lsn(w) == d1 && d1 < atomic_load(&max_lsn), "round %d: durable %llu, appended %llu",
              round, (unsigned long long)wal_durable_lsn(w), (unsigned long long)atomic_load(&max_lsn));
        fsize_limit(RLIM_INFINITY);
        CHECK(wait_until(caught_up), "round %d: the log did not recover (durable %llu, appended %llu)", round,
              (unsigned long long)wal_durable_lsn(w), (unsigned long long)atomic_load(&max_lsn));
        struct wal_stats st;
        wal_get_stats(w, &st);
        CHECK(st.write_errors > errors_before && !st.failed && !st.write_error);
        errors_before = st.write_errors;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < APPENDERS; i++)
        pthread_join(th[i], NULL);
    uint64_t last = atomic_load(&max_lsn);
    wal_close(w);

    struct wal_recovery rec;
    CHECK(wal_recover(NULL, argv[1], 0, 0, &rec, err, sizeof err) == 0, "recovery: %s", err);
    CHECK(rec.records == atomic_load(&appended) && rec.last_lsn == last && rec.first_lsn == 1,
          "recovered %llu records up to LSN %llu; appended %llu up to %llu", (unsigned long long)rec.records,
          (unsigned long long)rec.last_lsn, (unsigned long long)atomic_load(&appended), (unsigned long long)last);
    CHECK(rec.truncated_bytes == 0 && rec.problem[0] == 0, "torn: %llu bytes, %s",
          (unsigned long long)rec.truncated_bytes, rec.problem);
    printf("%d rounds: %llu records in %llu segments, %llu appends refused, %llu failed writes retried\nok\n",
           ROUNDS, (unsigned long long)rec.records, (unsigned long long)rec.segments,
           (unsigned long long)atomic_load(&refused), (unsigned long long)errors_before);
    return 0;
}
