/* ldu_stress.c - ext/ldu.c under concurrency, for TSan and ASan/UBSan.
 * PRODUCERS threads log insert/remove on a small set of shared objects while one
 * consumer thread applies the logs concurrently (take, reverse, claim, apply to a
 * per-object "applied" state, release + second claim), then drains at the end.
 * Checks: every applied insert finds the object absent and every remove finds it
 * present (absorb mode), every pushed node is taken exactly once, never twice in a
 * batch and always with its used bit set, and after the drain each object's
 * applied state is the one its last logged operation implies, with no mark or used
 * bit left. Counts logs vs pushes vs applies to show absorbing and reuse happen.
 *
 * Usage: ldu_stress SEED MODE OPS_PER_PRODUCER [PRODUCERS] [OBJECTS]
 *   MODE absorb     alternating insert/remove per object, ldu_log(..., absorb=1)
 *        supersede  random (possibly repeated) ops, absorb=0: a later op replaces
 *                   a pending one; only the final state is checked
 *
 * Per-object serialisation: objects are shared by all producers (any producer may
 * update any object, which mixes producers' logs in the queue as processes
 * migrating between cores do in the paper), so each object carries a spinlock held
 * across "choose the op + ldu_log"; that is the caller-side serialisation ldu.h
 * requires ("kvstore calls ldu_log under the key's shard lock"). The consumer never
 * takes these locks: it races with the producers exactly as ldu.h allows. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ldu.h"
#include "stress.h"

#define MAX_PRODUCERS 16

enum mode { MODE_ABSORB, MODE_SUPERSEDE };

struct object {
    struct ldu_obj ldu;         /* first member: ldu_obj_of() result casts back */
    atomic_flag lock;           /* serialises this object's producers */
    int want;                   /* under lock: 1 = inserted by the last logged op */
    int applied;                /* consumer only: the state the consumer has built */
    uint64_t batch_seen[2];     /* consumer only: last batch each node was taken in */
} __attribute__((aligned(64)));

static struct ldu_queue q;
static struct object *objs;
static int nobj, nproducers;
static uint64_t ops_per_producer;
static unsigned seed;
static enum mode mode;
static _Atomic int producers_done;
static _Atomic uint64_t total_logs, total_push_returns;

/* consumer-only counters */
static uint64_t taken, applies, second_claims, garbage, batches;

static void obj_lock(struct object *o)
{
    /* acquire: the previous holder's want/ldu_log effects are visible to us */
    for (int spins = 0; atomic_flag_test_and_set_explicit(&o->lock, memory_order_acquire); spins++)
        if (spins > 64)
            sched_yield(); /* 2 cores, more threads: let the holder run */
}

static void obj_unlock(struct object *o)
{
    atomic_flag_clear_explicit(&o->lock, memory_order_release);
}

static void *producer(void *arg)
{
    unsigned rng = seed * 7919u + (unsigned)(uintptr_t)arg;
    uint64_t logs = 0, pushes = 0;
    for (uint64_t k = 0; k < ops_per_producer; k++) {
        struct object *o = &objs[rand_r(&rng) % (unsigned)nobj];
        obj_lock(o);
        int op;
        if (mode == MODE_SUPERSEDE)
            op = rand_r(&rng) & 1; /* repeats allowed: absorb=0 makes them harmless */
        else
            op = o->want ? LDU_REMOVE : LDU_INSERT; /* the paper's alternation */
        o->want = op == LDU_INSERT;
        int r = ldu_log(&q, &o->ldu, op, mode != MODE_SUPERSEDE);
        obj_unlock(o);
        CHECK(r == 0 || r == 1, "ldu_log returned %d", r);
        logs++;
        pushes += (uint64_t)r;
        if ((rand_r(&rng) & 1023) == 0)
            sched_yield();
    }
    atomic_fetch_add(&total_logs, logs);
    atomic_fetch_add(&total_push_returns, pushes);
    return NULL;
}

static void apply(struct object *o, int op)
{
    int idx = (int)(o - objs);
    if (mode != MODE_SUPERSEDE) {
        /* Absorbing leaves at most one mark set per object and a mark is only set
         * once the opposite one is clear, so applied ops must alternate too. */
        CHECK(!(op == LDU_INSERT && o->applied), "object %d: insert applied while present "
              "(a node applied twice, or applied out of order)", idx);
        CHECK(!(op == LDU_REMOVE && !o->applied), "object %d: remove applied while absent "
              "(a node applied twice, or applied out of order)", idx);
    }
    o->applied = op == LDU_INSERT;
    applies++;
}

/* One consumer round: take everything, apply in push order. Returns the number of
 * nodes taken. */
static uint64_t consume_round(unsigned *rng)
{
    struct ldu_node *list = ldu_take(&q);
    if (!list)
        return 0;
    list = ldu_reverse(list);
    batches++;
    uint64_t n_taken = 0;
    for (struct ldu_node *n = list, *next; n; n = next) {
        /* Read next first: once released a node may be pushed again
         * at once, which rewrites n->next. */
        next = n->next;
        struct object *o = (struct object *)ldu_obj_of(n);
        int op = n->op;
        CHECK(o >= objs && o < objs + nobj && n == &o->ldu.node[op], "taken node %p is no object's", (void *)n);
        CHECK(atomic_load(&o->ldu.used) & (1u << op), "object %d node %d taken with its used bit clear",
              (int)(o - objs), op);
        CHECK(o->batch_seen[op] != batches, "object %d node %d twice in one batch (pushed twice?)",
              (int)(o - objs), op);
        o->batch_seen[op] = batches;
        n_taken++;
        CHECK(n_taken <= 2u * (uint64_t)nobj, "batch longer than 2 nodes per object: a cycle");
        if (ldu_claim(n)) {
            if ((rand_r(rng) & 255) == 0)
                sched_yield(); /* widen the claim..release window for producers */
            apply(o, op);
        } else {
            garbage++;
        }
        if (ldu_release(&o->ldu, n)) {
            second_claims++;
            apply(o, op);
        }
    }
    taken += n_taken;
    return n_taken;
}

static void *consumer(void *arg)
{
    (void)arg;
    unsigned rng = seed ^ 0x5bd1e995u;
    for (;;) {
        int done = atomic_load(&producers_done);
        if (consume_round(&rng))
            continue;
        if (done)
            break; /* producers finished before an empty take: drained */
        sched_yield();
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s SEED absorb|supersede OPS_PER_PRODUCER [PRODUCERS] [OBJECTS]\n",
                argv[0]);
        return 2;
    }
    seed = (unsigned)strtoul(argv[1], NULL, 10);
    if (!strcmp(argv[2], "absorb"))
        mode = MODE_ABSORB;
    else if (!strcmp(argv[2], "supersede"))
        mode = MODE_SUPERSEDE;
    else {
        fprintf(stderr, "unknown mode %s (absorb or supersede)\n", argv[2]);
        return 2;
    }
    ops_per_producer = strtoull(argv[3], NULL, 10);
    nproducers = argc > 4 ? atoi(argv[4]) : 3;
    nobj = argc > 5 ? atoi(argv[5]) : 64;
    CHECK(nproducers >= 1 && nproducers <= MAX_PRODUCERS, "producers must be 1..%d", MAX_PRODUCERS);
    CHECK(nobj >= 1, "objects must be >= 1");

    ldu_queue_init(&q);
    objs = aligned_alloc(64, sizeof *objs * (size_t)nobj);
    CHECK(objs, "out of memory");
    memset(objs, 0, sizeof *objs * (size_t)nobj);
    for (int i = 0; i < nobj; i++) {
        ldu_obj_init(&objs[i].ldu);
        atomic_flag_clear(&objs[i].lock);
    }

    pthread_t prod[MAX_PRODUCERS], cons;
    CHECK(pthread_create(&cons, NULL, consumer, NULL) == 0, "pthread_create");
    for (int i = 0; i < nproducers; i++)
        CHECK(pthread_create(&prod[i], NULL, producer, (void *)(uintptr_t)i) == 0, "pthread_create");
    for (int i = 0; i < nproducers; i++)
        pthread_join(prod[i], NULL);
    atomic_store(&producers_done, 1);
    pthread_join(cons, NULL);
    unsigned rng = seed;
    while (consume_round(&rng)) /* final drain */
        ;

    uint64_t logs = atomic_load(&total_logs), push_returns = atomic_load(&total_push_returns);
    uint64_t pushes = atomic_load(&q.pushes);
    int bad = 0;
    for (int i = 0; i < nobj; i++) {
        struct object *o = &objs[i];
        unsigned m0 = atomic_load(&o->ldu.node[0].mark), m1 = atomic_load(&o->ldu.node[1].mark);
        unsigned used = atomic_load(&o->ldu.used);
        if (o->applied != o->want || m0 || m1 || used) {
            if (bad++ < 10)
                fprintf(stderr, "object %d: applied %d but its last op says %d (marks %u/%u, used %#x)\n", i,
                        o->applied, o->want, m0, m1, used);
        }
    }
    CHECK(!bad, "%d of %d objects differ from their last logged operation after the drain", bad, nobj);
    CHECK(atomic_load(&q.head) == NULL, "queue not empty after the drain");
    /* Every push is taken exactly once: none lost, none doubled. */
    CHECK(pushes == push_returns, "queue counted %llu pushes, ldu_log returned 1 %llu times",
          (unsigned long long)pushes, (unsigned long long)push_returns);
    CHECK(taken == pushes, "consumer took %llu nodes but %llu were pushed", (unsigned long long)taken,
          (unsigned long long)pushes);

    printf("mode %s: %d producers, %d objects, %llu logs, %llu pushes (%.1f%% of logs), %llu batches, "
           "%llu nodes taken, %llu applies (%llu by the second claim), %llu garbage nodes\n",
           argv[2], nproducers, nobj, (unsigned long long)logs, (unsigned long long)pushes,
           logs ? 100.0 * (double)push_returns / (double)logs : 0.0, (unsigned long long)batches,
           (unsigned long long)taken, (unsigned long long)applies, (unsigned long long)second_claims,
           (unsigned long long)garbage);
    if (mode == MODE_ABSORB) {
        /* Each op that is not absorbed is applied exactly once; an absorbed op
         * cancels itself and the pending op it found: applies = logs - 2*absorbed. */
        CHECK(logs >= applies && (logs - applies) % 2 == 0, "logs %llu, applies %llu: not logs - 2*absorbed",
              (unsigned long long)logs, (unsigned long long)applies);
        uint64_t absorbed = (logs - applies) / 2;
        CHECK(logs - absorbed >= push_returns, "more pushes than non-absorbed logs");
        uint64_t reused = logs - absorbed - push_returns;
        printf("absorbed %llu (%.1f%% of logs), reused queued nodes %llu (%.1f%%)\n", (unsigned long long)absorbed,
               100.0 * (double)absorbed / (double)logs, (unsigned long long)reused,
               100.0 * (double)reused / (double)logs);
        if (logs >= 10000) {
            CHECK(absorbed > 0, "no log was absorbed in %llu logs", (unsigned long long)logs);
            CHECK(reused > 0, "no queued node was reused in %llu logs", (unsigned long long)logs);
        }
    } else if (logs >= 10000) {
        CHECK(push_returns < logs, "every log pushed a node: no reuse");
    }
    free(objs);
    printf("ok\n");
    return 0;
}
