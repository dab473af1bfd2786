/* table_ops_stress.c - the table's whole-key and whole-table operations under
 * concurrency (built with TSan and with ASan/UBSan by test_c_sanitizers.py):
 *   scan   kvt_scan's guarantee: while two threads insert and delete waves of
 *          churn keys (so shards grow, rehash and shrink between and during
 *          calls), every full scan returns every stable key at least once;
 *   apply  kvt_apply read-modify-writes from several threads: increments of
 *          shared counters lose nothing;
 *   tx     kvt_tx_begin/kvt_tx_end: a writer's transactions set two keys to the
 *          same value, a reader's transactions never see them differ; a
 *          kvt_scan inside a transaction does not deadlock.
 * usage: table_ops_stress SEED [scan|apply|tx|all] [ROUNDS] */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/table.h"
#include "stress.h"

#define STABLE 3000
#define CHURN 40000

static struct kv_table *T;
static atomic_int stop;
static uint64_t seed;

/* ---- scan */

struct seen {
    unsigned char hit[STABLE];
};

static void on_key(void *arg, const char *key, size_t klen, int type)
{
    struct seen *s = arg;
    CHECK(type == KVT_STRING);
    if (klen > 1 && key[0] == 's') {
        char tmp[16];
        CHECK(klen < sizeof tmp);
        memcpy(tmp, key + 1, klen - 1);
        tmp[klen - 1] = 0;
        int i = atoi(tmp);
        CHECK(i >= 0 && i < STABLE);
        s->hit[i] = 1;
    }
}

static void *churn(void *arg)
{
    int id = (int)(intptr_t)arg;
    char k[32];
    while (!atomic_load(&stop)) {
        for (int i = 0; i < CHURN && !atomic_load(&stop); i++) { /* a wave in: shards grow */
            int n = snprintf(k, sizeof k, "c%d:%d", id, i);
            CHECK(kvt_set(T, k, (size_t)n, "v", 1, 0, 0, NULL, NULL) == 1);
        }
        for (int i = 0; i < CHURN && !atomic_load(&stop); i++) { /* and out: they shrink */
            int n = snprintf(k, sizeof k, "c%d:%d", id, i);
            CHECK(kvt_del(T, k, (size_t)n) >= 0);
            if (i % 512 == 0)
                kvt_housekeep(T, (unsigned)(id * 128), 128, 64);
        }
    }
    return NULL;
}

static void run_scan(int rounds)
{
    char k[32];
    for (int i = 0; i < STABLE; i++) {
        int n = snprintf(k, sizeof k, "s%d", i);
        CHECK(kvt_set(T, k, (size_t)n, "x", 1, 0, 0, NULL, NULL) == 1);
    }
    pthread_t th[2];
    atomic_store(&stop, 0);
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&th[i], NULL, churn, (void *)(intptr_t)i) == 0);
    struct rng r;
    rng_seed(&r, seed, 7);
    for (int round = 0; round < rounds; round++) {
        struct seen s;
        memset(&s, 0, sizeof s);
        uint64_t cur = 0;
        int calls = 0;
        do {
            cur = kvt_scan(T, cur, 1 + (unsigned)rng_below(&r, 50), on_key, &s);
            CHECK(!(cur >> 62), "cursor %" PRIx64 " uses the caller's bits", cur);
            calls++;
        } while (cur);
        for (int i = 0; i < STABLE; i++)
            CHECK(s.hit[i], "round %d: stable key s%d missed by a full scan of %d calls", round, i, calls);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
}

/* ---- apply */

static int64_t add_one(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    char *buf = arg, tmp[32];
    long long v = 0;
    if (cur->exists) { /* a short decimal, not NUL-terminated */
        CHECK(cur->vlen < sizeof tmp);
        memcpy(tmp, cur->val, cur->vlen);
        tmp[cur->vlen] = 0;
        v = atoll(tmp);
    }
    int n = snprintf(buf, 32, "%lld", v + 1);
    ch->action = KVT_PUT;
    ch->val = buf;
    ch->n1 = (size_t)n;
    return v + 1;
}

#define APPLY_THREADS 4
#define APPLY_KEYS 8

static void *applier(void *arg)
{
    int rounds = (int)(intptr_t)arg;
    char buf[32], k[8];
    for (int i = 0; i < rounds; i++) {
        int n = snprintf(k, sizeof k, "n%d", i % APPLY_KEYS);
        CHECK(kvt_apply(T, k, (size_t)n, add_one, buf) > 0);
    }
    return NULL;
}

static void run_apply(int rounds)
{
    pthread_t th[APPLY_THREADS];
    for (int i = 0; i < APPLY_THREADS; i++)
        CHECK(pthread_create(&th[i], NULL, applier, (void *)(intptr_t)(rounds * APPLY_KEYS)) == 0);
    for (int i = 0; i < APPLY_THREADS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < APPLY_KEYS; i++) {
        char k[8], v[32];
        int n = snprintf(k, sizeof k, "n%d", i);
        int64_t len = kvt_get_copy(T, k, (size_t)n, v, sizeof v - 1);
        CHECK(len > 0);
        v[len] = 0;
        CHECK(atoll(v) == (long long)APPLY_THREADS * rounds, "n%d = %s, want %lld", i, v,
              (long long)APPLY_THREADS * rounds);
    }
}

/* ---- tx */

static void ignore_key(void *arg, const char *key, size_t klen, int type) { (void)arg, (void)key, (void)klen, (void)type; }

static void *tx_writer(void *arg)
{
    int rounds = (int)(intptr_t)arg;
    char v[24];
    for (int i = 1; i <= rounds; i++) {
        int n = snprintf(v, sizeof v, "%d", i);
        CHECK(kvt_tx_begin(T) == 0);
        CHECK(kvt_set(T, "ta", 2, v, (size_t)n, 0, 0, NULL, NULL) == 1);
        CHECK(kvt_set(T, "tb", 2, v, (size_t)n, 0, 0, NULL, NULL) == 1);
        CHECK(kvt_tx_end(T) >= 0);
    }
    atomic_store(&stop, 1);
    return NULL;
}

static void run_tx(int rounds)
{
    kvt_set(T, "ta", 2, "0", 1, 0, 0, NULL, NULL);
    kvt_set(T, "tb", 2, "0", 1, 0, 0, NULL, NULL);
    atomic_store(&stop, 0);
    pthread_t w;
    CHECK(pthread_create(&w, NULL, tx_writer, (void *)(intptr_t)rounds) == 0);
    long reads = 0;
    while (!atomic_load(&stop) || reads == 0) {
        char a[24], b[24];
        CHECK(kvt_tx_begin(T) == 0);
        int64_t la = kvt_get_copy(T, "ta", 2, a, sizeof a);
        int64_t lb = kvt_get_copy(T, "tb", 2, b, sizeof b);
        if (reads % 64 == 0) /* a whole-table walk with every shard held */
            kvt_scan(T, 0, 100, ignore_key, NULL);
        CHECK(kvt_tx_end(T) >= 0);
        CHECK(la == lb && la > 0 && !memcmp(a, b, (size_t)la), "a transaction saw half of another");
        reads++;
    }
    pthread_join(w, NULL);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s SEED [scan|apply|tx|all] [ROUNDS]\n", argv[0]);
        return 2;
    }
    seed = strtoull(argv[1], NULL, 0);
    const char *mode = argc > 2 ? argv[2] : "all";
    int rounds = argc > 3 ? atoi(argv[3]) : 20;
    int all = !strcmp(mode, "all");
    CHECK(kvt_create(&T, 0) == 0);
    if (all || !strcmp(mode, "scan"))
        run_scan(rounds);
    if (all || !strcmp(mode, "apply"))
        run_apply(rounds * 100);
    if (all || !strcmp(mode, "tx"))
        run_tx(rounds * 100);
    kvt_destroy(T);
    fprintf(stderr, "table_ops_stress %s seed %" PRIu64 ": ok\n", mode, seed);
    return 0;
}
