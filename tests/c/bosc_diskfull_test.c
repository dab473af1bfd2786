/* bosc_diskfull_test.c - the data file on a disk that refuses it, for TSan and
 * ASan/UBSan. RLIMIT_FSIZE stands in for a full disk (no root, no filesystem of
 * its own): set to the file's size, a block past the end cannot be written
 * (EFBIG; SIGXFSZ ignored) while blocks inside it can, so a sweep fails part
 * way, after some chains were rewritten and before others. No log is attached:
 * whatever a sweep wrote is clean and can be evicted at once.
 *
 * usage: bosc_diskfull_test DIR
 * Round after round: keys are rewritten with values of new lengths (chains grow
 * and shrink: blocks are allocated and freed), swept and evicted (they live in
 * the file only); then the limit drops to the file's size and more keys are
 * rewritten, larger. The sweep fails: bosc_write_error says EFBIG, the data
 * file is not failed (bosc_failed 0), and every key reads back as last written,
 * from memory or loaded from its block (a failed sweep must leave the chains it
 * did not finish intact, and give back the blocks it took). The limit is
 * raised: the next sweep writes everything, the error clears, every key reads
 * back after eviction. At the end the file is opened again on a new table and
 * every key is there. With $KVSTORE_C_SWEEP_CHUNK (keys) a sweep settles its keys
 * that many at a time (bosc_sweep.c's chunks): a refused write or sync then fails a
 * later chunk after earlier ones were synced, recorded and settled (its keys and the
 * later chunks' are queued again). Prints "FAIL: ..." and exits 1 on a mismatch; ends "ok". */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/table.h"
#include "durability/bosc.h"
#include "stress.h"

#define BUCKETS 32      /* few buckets: long chains of overflow blocks */
#define NKEYS 400
#define ROUNDS 8
#define MAXV 6000

static char path[4200];
static int version[NKEYS], length[NKEYS];
static struct kv_table *t;
static struct bosc *b;

static size_t key_of(char *k, int i) { return (size_t)sprintf(k, "k:%04d", i); }

static void val_of(char *v, int i)
{
    int n = sprintf(v, "k:%04d-v%d-", i, version[i]);
    memset(v + n, 'a' + (version[i] + i) % 26, (size_t)(length[i] - n));
}

static void db_open(void)
{
    char err[512] = "";
    struct bosc_open_info info;
    struct bosc_config cfg = {.path = path, .buckets = BUCKETS, .flush_interval_ms = 20};
    const char *chunk = getenv("KVSTORE_C_SWEEP_CHUNK"); /* keys a sweep settles at a time (0: all) */
    cfg.sweep_chunk_items = chunk ? (uint32_t)strtoul(chunk, NULL, 10) : 0;
    CHECK(kvt_create(&t, 0) == 0);
    CHECK(bosc_open(&b, t, &cfg, &info, err, sizeof err) == 0, "bosc_open: %s", err);
    CHECK(bosc_start(b) == 0);
}

static void db_close(void)
{
    bosc_close(b);
    kvt_destroy(t);
}

/* Rewrite n random keys with new versions and lengths in [minlen, MAXV). */
static void rewrite(struct rng *r, int n, int minlen)
{
    char k[32], v[MAXV];
    for (int j = 0; j < n; j++) {
        int i = (int)rng_below(r, NKEYS);
        version[i]++;
        length[i] = minlen + (int)rng_below(r, (uint64_t)(MAXV - minlen));
        val_of(v, i);
        CHECK(kvt_set(t, k, key_of(k, i), v, (size_t)length[i], 0, 0, NULL, NULL) == 1);
    }
}

static void check_all(const char *when)
{
    char k[32], want[MAXV], got[MAXV];
    for (int i = 0; i < NKEYS; i++) {
        size_t kl = key_of(k, i);
        int64_t n;
        while ((n = kvt_get_copy(t, k, kl, got, sizeof got)) == -ENODATA)
            CHECK(kvt_load_sync(t, k, kl) == 0, "%s: load %s", when, k);
        val_of(want, i);
        CHECK(n == length[i] && memcmp(got, want, (size_t)n) == 0, "%s: %s has %lld bytes, want %d (v%d)", when, k,
              (long long)n, length[i], version[i]);
    }
}

static void evict_all(void)
{
    uint64_t n = 0;
    kvt_evict(t, 0, &n);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    signal(SIGXFSZ, SIG_IGN);
    mkdir(argv[1], 0755);
    snprintf(path, sizeof path, "%s/data.kvd", argv[1]);
    struct rng r;
    rng_seed(&r, 1, 0);
    db_open();
    for (int i = 0; i < NKEYS; i++)
        length[i] = 64;
    {
        char k[32], v[MAXV];
        for (int i = 0; i < NKEYS; i++) {
            val_of(v, i);
            CHECK(kvt_set(t, k, key_of(k, i), v, (size_t)length[i], 0, 0, NULL, NULL) == 1);
        }
    }
    uint64_t refused_sweeps = 0;
    for (int round = 0; round < ROUNDS; round++) {
        rewrite(&r, NKEYS / 2, 64);
        CHECK(bosc_sync(b) == 0 && bosc_write_error(b, NULL, 0, NULL) == 0, "round %d: sweep", round);
        evict_all();
        check_all("after a good sweep");

        /* Even rounds: the file's size (blocks past the end refused, the free
         * list's inside it taken: a sweep may fail part way, or, with enough
         * free blocks, not at all); odd rounds: the end of the home blocks (every
         * overflow block refused: the sweep surely fails). */
        struct stat st;
        CHECK(stat(path, &st) == 0);
        fsize_limit(round % 2 ? (rlim_t)(2 + BUCKETS) * BOSC_BLOCK : (rlim_t)st.st_size);
        rewrite(&r, NKEYS / 2, MAXV / 2); /* larger: more blocks than the free list holds */
        CHECK(bosc_sync(b) == 0, "round %d: the data file failed for good", round);
        char msg[256];
        int e = bosc_write_error(b, msg, sizeof msg, NULL);
        CHECK(e == EFBIG ? strstr(msg, "File too large") != NULL : e == 0 && round % 2 == 0, "round %d: %d %s",
              round, e, msg);
        CHECK(!bosc_failed(b));
        evict_all(); /* (nothing: the failed sweep's keys stay dirty) */
        check_all("while the disk refuses");

        fsize_limit(RLIM_INFINITY);
        for (int tries = 0; bosc_write_error(b, NULL, 0, NULL) && tries < 100; tries++)
            CHECK(bosc_sync(b) == 0);
        CHECK(bosc_write_error(b, NULL, 0, &refused_sweeps) == 0, "round %d: still refused", round);
        evict_all();
        check_all("after the disk came back");
    }
    struct bosc_stats bs;
    bosc_get_stats(b, &bs);
    db_close();
    db_open();
    check_all("reopened");
    db_close();
    printf("%d rounds, %llu refused sweeps, %llu chunks settled before their sweep's end, every key as last "
           "written\nok\n", ROUNDS, (unsigned long long)refused_sweeps, (unsigned long long)bs.sweep_chunks);
    return 0;
}
