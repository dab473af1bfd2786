/* ldu_bench.h - what the LDU microbenchmark's two files share: ldu_bench.c (the
 * workers, the LDU variants, the self-check, main) and ldu_bench_lists.c (the
 * baselines: the locked list, and Harris-Michael lists with epoch-based
 * reclamation). Structures, the run's globals (set by main before the workers
 * start) and the baseline operations. A standalone program, not part of kvstore. */
#ifndef KV_LDU_BENCH_H
#define KV_LDU_BENCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "core/ldu.h"

#define MAX_THREADS 1024
#define MAX_SLOTS 64
#define CACHELINE 64
#define container_of(p, type, member) ((type *)((char *)(p) - offsetof(type, member)))

/* ------------------------------------------------------------------ structures */

struct list_head {
    struct list_head *next, *prev;
};

struct hnode { /* Harris list node; next's low bit = logically deleted */
    _Atomic uintptr_t next;
    uint32_t key;
    uint64_t retire_epoch;
    struct hnode *retire_next;
};

struct root {
    pthread_mutex_t mutex;        /* mutex, ldu-*: the list and every object's `linked` */
    pthread_rwlock_t rwlock;      /* rwlock: the same */
    struct list_head head;
    _Atomic uintptr_t hhead;      /* harris*: first node (never marked) */
    struct ldu_queue q;           /* ldu-global: this root's log queue */
    _Atomic uint64_t last_flush_ns; /* ldu-*: written under mutex, read by writers for the age bound */
    int index;
} __attribute__((aligned(CACHELINE)));

/* Two cache lines: the first is what the owner writes on every update (its LDU
 * marks and used bits, its own state), the second what the list holder and
 * traversals touch, so the owner's writes do not make traversals miss. */
struct object {
    struct ldu_obj ldu;
    int present;                  /* owner thread only: state after its last update */
    struct root *root;            /* fixed */
    struct list_head link __attribute__((aligned(CACHELINE))); /* in root->head while linked */
    uint32_t key;                 /* fixed */
    int linked;                   /* under root's lock: in root->head */
} __attribute__((aligned(CACHELINE)));

struct thread {
    int id;
    pthread_t tid;
    uint64_t rng;
    struct object *objs;
    /* counters, owner only, read after join */
    uint64_t ops, reads, updates, idle_ns;
    uint64_t logs, pushes, applies, flush_read, flush_bound, flush_age, flush_collision, taken;
    uint64_t since_flush;         /* pushes since this thread last flushed */
    uint64_t errors;
    uint64_t sink;                /* traversal results, so they are not optimised away */
    /* EBR (harris*) */
    _Atomic uint64_t epoch __attribute__((aligned(CACHELINE))); /* 0 = outside any list operation */
    struct hnode *retired_head, *retired_tail;
    uint64_t retired, freed;
    /* ldu-percore: this thread's slots, indexed by hash(root); only this thread pushes */
    struct ldu_queue slots[MAX_SLOTS];
} __attribute__((aligned(CACHELINE)));

/* set by main before the workers start; global_epoch is the EBR epoch (ldu_bench_lists.c) */
extern int nthreads;
extern struct thread *threads;
extern _Atomic uint64_t global_epoch;

/* ---- ldu_bench_lists.c: the baselines (comments at the definitions) */

#define MARKED(p) ((p) & 1u)
#define UNMARK(p) ((p) & ~(uintptr_t)1)

void do_list_insert(struct object *o); /* caller holds o->root's lock */
void do_list_remove(struct object *o); /* caller holds o->root's lock */
void do_list_traverse(struct thread *t, struct root *r); /* caller holds r's lock (shared is enough) */
void ebr_enter(struct thread *t);
void ebr_exit(struct thread *t);
void ebr_collect(struct thread *t); /* outside any list operation */
void h_insert(struct thread *t, struct root *r, uint32_t key, int ordered);
void h_remove(struct thread *t, struct root *r, uint32_t key, int ordered);
void h_traverse(struct thread *t, struct root *r);

#endif
