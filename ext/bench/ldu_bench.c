/* ldu_bench.c - paper 003 (LDU) microbenchmark: an update-heavy shared structure,
 * the analogue of an anon_vma's list. Each thread owns OBJS objects and toggles a
 * random one of them in or out of the shared list (insert when absent, remove when
 * present: the paper's insert/remove alternation); READ_PCT % of operations instead
 * traverse a whole list (the reverse-map walk). ROOTS lists (default 1, the hot
 * anon_vma root); an object always belongs to the same root. Threads, the structure
 * and all objects live for the whole run; only the Harris nodes are allocated.
 *
 *   mutex             intrusive doubly-linked list under a pthread mutex (stock Linux)
 *   rwlock            the same list under a pthread rwlock (readers share)
 *   harris            Harris-Michael lock-free list ordered by key: insert and remove
 *                     search from the head
 *   harris-unordered  the paper's variant: insert at the head, remove searches for the
 *                     object's node, marks it and unlinks it
 *   ldu-global        updates are ldu_log()ed into the root's one LDU queue; the list
 *                     (same as mutex's) is updated only by whoever holds the root's
 *                     mutex: a reader before it reads (flush before read), or a
 *                     writer whose pushes since its last flush reach BATCH or whose
 *                     root was last flushed AGE_US ago (trylock: never waits for it)
 *   ldu-percore       as ldu-global but each thread logs into its own slot array
 *                     indexed by hash(root) (paper fig 2.5); a slot holding another
 *                     root's logs (hash collision) is flushed first under that root's
 *                     lock; a reader flushes every thread's slot of its root
 *
 * Harris memory: removed nodes are retired to the remover's list and freed by
 * epoch-based reclamation (3 epochs; a node retired in epoch e is freed once the
 * global epoch reaches e+2, which needs every thread inside a list operation to
 * have seen e+1). Nothing is leaked or freed early.
 *
 * idle_frac = time blocked in lock acquisition (measured only when a trylock
 * failed, so uncontended acquisitions cost no clock reads) / (threads x wall time):
 * the analogue of the paper's idle time (Table 2.1). Lock-free variants never block.
 * After the run the structure is checked against every object's expected state
 * (LDU variants drain their logs first); a mismatch prints why and exits 1.
 *
 * The baselines (locked list, Harris lists, EBR) are in ldu_bench_lists.c.
 *
 * Usage: ldu_bench VARIANT THREADS READ_PCT DURATION_MS OBJS_PER_THREAD SEED
 *                  [roots=1] [slots=4] [batch=64] [age_us=1000]
 * stdout: variant,threads,read_pct,ops,ops_per_s,idle_frac
 * stderr: one "stats:" line of counters (logs, pushes, absorbed, flushes, ...). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/ldu_bench.h"
#include "core/ldu.h"

enum variant { V_MUTEX, V_RWLOCK, V_HARRIS, V_HARRIS_UNORDERED, V_LDU_GLOBAL, V_LDU_PERCORE };
static const char *const variant_names[] = {"mutex", "rwlock", "harris", "harris-unordered", "ldu-global",
                                            "ldu-percore"};

static enum variant variant;
int nthreads;
static int read_pct, objs_per_thread, nroots = 1, nslots = 4;
static uint64_t batch = 64, age_ns = 1000000;
static struct root *roots;
struct thread *threads;
static _Atomic int stop;
static pthread_barrier_t start_barrier;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t rnd(struct thread *t)
{
    uint64_t x = t->rng; /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    t->rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* ------------------------------------------------------------------ timed locks */

static void mutex_lock(struct thread *t, pthread_mutex_t *m)
{
    if (pthread_mutex_trylock(m) == 0)
        return;
    uint64_t t0 = now_ns();
    pthread_mutex_lock(m);
    t->idle_ns += now_ns() - t0;
}

static void write_lock(struct thread *t, pthread_rwlock_t *l)
{
    if (pthread_rwlock_trywrlock(l) == 0)
        return;
    uint64_t t0 = now_ns();
    pthread_rwlock_wrlock(l);
    t->idle_ns += now_ns() - t0;
}

static void read_lock(struct thread *t, pthread_rwlock_t *l)
{
    if (pthread_rwlock_tryrdlock(l) == 0)
        return;
    uint64_t t0 = now_ns();
    pthread_rwlock_rdlock(l);
    t->idle_ns += now_ns() - t0;
}

/* ------------------------------------------------------------------ LDU */

static struct object *obj_of_node(struct ldu_node *n)
{
    return container_of(ldu_obj_of(n), struct object, ldu);
}

static void do_physical(struct thread *t, struct object *o, int op) /* under o->root->mutex */
{
    if (op == LDU_INSERT) {
        if (o->linked)
            t->errors++; /* absorbing must keep applied ops alternating */
        else
            do_list_insert(o);
    } else {
        if (!o->linked)
            t->errors++;
        else
            do_list_remove(o);
    }
    t->applies++;
}

/* synchronize_ldu (paper fig 2.4): apply a taken list. The caller holds the mutex of
 * the root all these nodes belong to, which makes it the single consumer. No
 * reversal: absorbing leaves at most one of an object's marks set, and a mark is set
 * only after the other was claimed or absorbed, so claims follow log order whatever
 * order the nodes are visited in. */
static void do_ldu_apply(struct thread *t, struct ldu_node *n)
{
    while (n) {
        struct ldu_node *next = n->next; /* before release: the node may be re-pushed then */
        struct object *o = obj_of_node(n);
        int op = n->op;
        if (ldu_claim(n))
            do_physical(t, o, op);
        if (ldu_release(&o->ldu, n))
            do_physical(t, o, op);
        t->taken++;
        n = next;
    }
}

static unsigned slot_of(struct root *r)
{
    /* hash_ptr analogue: multiplicative hash of the root, top bits */
    uint64_t h = ((uint64_t)(uintptr_t)r >> 6) * 0x61C8864680B583EBULL;
    return (unsigned)(h >> 58) & (unsigned)(nslots - 1);
}

/* Under r->mutex: apply r's pending logs (ldu-global: r's queue; ldu-percore: the
 * slot for r of every thread, if that slot holds r's logs - a slot holds one root's
 * logs at a time, and only holders of that root's mutex take it). */
static void do_ldu_flush(struct thread *t, struct root *r)
{
    if (variant == V_LDU_GLOBAL) {
        do_ldu_apply(t, ldu_take(&r->q));
    } else {
        unsigned s = slot_of(r);
        for (int i = 0; i < nthreads; i++) {
            struct ldu_queue *q = &threads[i].slots[s];
            struct ldu_node *first = atomic_load_explicit(&q->head, memory_order_acquire);
            if (first && obj_of_node(first)->root == r)
                do_ldu_apply(t, ldu_take(q));
        }
    }
    atomic_store_explicit(&r->last_flush_ns, now_ns(), memory_order_relaxed);
    t->since_flush = 0;
}

static void ldu_update(struct thread *t, struct object *o)
{
    struct root *r = o->root;
    struct ldu_queue *q = &r->q;
    int op = o->present ? LDU_REMOVE : LDU_INSERT;
    if (variant == V_LDU_PERCORE) {
        q = &t->slots[slot_of(r)];
        struct ldu_node *first = atomic_load_explicit(&q->head, memory_order_acquire);
        struct root *other = first ? obj_of_node(first)->root : NULL;
        if (other && other != r) {
            /* hash collision: flush the slot as a direct-mapped cache, under the
             * lock of the root whose logs it holds (paper fig 2.5) */
            mutex_lock(t, &other->mutex);
            do_ldu_apply(t, ldu_take(q));
            pthread_mutex_unlock(&other->mutex);
            t->flush_collision++;
        }
    }
    int pushed = ldu_log(q, &o->ldu, op, 1);
    o->present = !o->present;
    t->logs++;
    t->pushes += (uint64_t)pushed;
    t->since_flush += (uint64_t)pushed;
    int why = 0;
    if (t->since_flush >= batch)
        why = 1;
    else if ((t->updates & 255) == 0 &&
             now_ns() - atomic_load_explicit(&r->last_flush_ns, memory_order_relaxed) > age_ns)
        why = 2;
    if (why && pthread_mutex_trylock(&r->mutex) == 0) { /* a busy lock means a flush is under way */
        do_ldu_flush(t, r);
        pthread_mutex_unlock(&r->mutex);
        if (why == 1)
            t->flush_bound++;
        else
            t->flush_age++;
    }
}

/* ------------------------------------------------------------------ workers */

static void update(struct thread *t)
{
    struct object *o = &t->objs[rnd(t) % (uint64_t)objs_per_thread];
    struct root *r = o->root;
    t->updates++;
    switch (variant) {
    case V_MUTEX:
        mutex_lock(t, &r->mutex);
        if (o->present)
            do_list_remove(o);
        else
            do_list_insert(o);
        pthread_mutex_unlock(&r->mutex);
        o->present = !o->present;
        break;
    case V_RWLOCK:
        write_lock(t, &r->rwlock);
        if (o->present)
            do_list_remove(o);
        else
            do_list_insert(o);
        pthread_rwlock_unlock(&r->rwlock);
        o->present = !o->present;
        break;
    case V_HARRIS:
    case V_HARRIS_UNORDERED:
        ebr_enter(t);
        if (o->present)
            h_remove(t, r, o->key, variant == V_HARRIS);
        else
            h_insert(t, r, o->key, variant == V_HARRIS);
        ebr_exit(t);
        o->present = !o->present;
        if ((t->updates & 63) == 0)
            ebr_collect(t);
        break;
    case V_LDU_GLOBAL:
    case V_LDU_PERCORE:
        ldu_update(t, o);
        break;
    }
}

static void read_op(struct thread *t)
{
    struct root *r = &roots[rnd(t) % (uint64_t)nroots];
    t->reads++;
    switch (variant) {
    case V_MUTEX:
        mutex_lock(t, &r->mutex);
        do_list_traverse(t, r);
        pthread_mutex_unlock(&r->mutex);
        break;
    case V_RWLOCK:
        read_lock(t, &r->rwlock);
        do_list_traverse(t, r);
        pthread_rwlock_unlock(&r->rwlock);
        break;
    case V_HARRIS:
    case V_HARRIS_UNORDERED:
        ebr_enter(t);
        h_traverse(t, r);
        ebr_exit(t);
        break;
    case V_LDU_GLOBAL:
    case V_LDU_PERCORE:
        mutex_lock(t, &r->mutex);
        do_ldu_flush(t, r); /* flush before read */
        t->flush_read++;
        do_list_traverse(t, r);
        pthread_mutex_unlock(&r->mutex);
        break;
    }
}

static void *worker(void *arg)
{
    struct thread *t = arg;
    pthread_barrier_wait(&start_barrier);
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        if (rnd(t) % 100 < (uint64_t)read_pct)
            read_op(t);
        else
            update(t);
        t->ops++;
    }
    return NULL;
}

/* ------------------------------------------------------------------ self-check */

static int check_structure(void)
{
    struct thread *t0 = &threads[0];
    uint64_t errors = 0, expected = 0, found = 0;
    for (int i = 0; i < nthreads; i++)
        errors += threads[i].errors;
    if (errors) {
        fprintf(stderr, "self-check: %llu operations found the structure in the wrong state\n",
                (unsigned long long)errors);
        return 1;
    }
    if (variant == V_LDU_GLOBAL || variant == V_LDU_PERCORE) {
        for (int i = 0; i < nroots; i++) /* drain what is still logged */
            do_ldu_flush(t0, &roots[i]);
        if (t0->errors) {
            fprintf(stderr, "self-check: the final drain applied an op twice or out of order\n");
            return 1;
        }
        for (int i = 0; i < nthreads; i++)
            for (int s = 0; s < nslots; s++)
                if (atomic_load(&threads[i].slots[s].head)) {
                    fprintf(stderr, "self-check: thread %d slot %d not drained\n", i, s);
                    return 1;
                }
    }
    for (int i = 0; i < nthreads; i++)
        for (int j = 0; j < objs_per_thread; j++) {
            struct object *o = &threads[i].objs[j];
            expected += (uint64_t)o->present;
            if (variant == V_LDU_GLOBAL || variant == V_LDU_PERCORE) {
                if (o->ldu.used || o->ldu.node[0].mark || o->ldu.node[1].mark) {
                    fprintf(stderr, "self-check: object %u still has a pending log after the drain\n", o->key);
                    return 1;
                }
            }
            if (variant != V_HARRIS && variant != V_HARRIS_UNORDERED && o->linked != o->present) {
                fprintf(stderr, "self-check: object %u is %s the list but its last update %s it\n", o->key,
                        o->linked ? "in" : "not in", o->present ? "inserted" : "removed");
                return 1;
            }
        }
    for (int i = 0; i < nroots; i++) {
        struct root *r = &roots[i];
        if (variant == V_HARRIS || variant == V_HARRIS_UNORDERED) {
            /* every unmarked node is a present object of this root, each at most once */
            for (uintptr_t p = atomic_load(&r->hhead); p; p = UNMARK(atomic_load(&((struct hnode *)p)->next))) {
                struct hnode *c = (struct hnode *)p;
                if (MARKED(atomic_load(&c->next)))
                    continue;
                int hit = 0;
                for (int ti = 0; ti < nthreads && !hit; ti++)
                    for (int j = 0; j < objs_per_thread; j++) {
                        struct object *o = &threads[ti].objs[j];
                        if (o->key == c->key) {
                            if (!o->present || o->root != r || o->linked) {
                                fprintf(stderr, "self-check: key %u in root %d's list: present %d, listed "
                                        "before %d\n", c->key, i, o->present, o->linked);
                                return 1;
                            }
                            o->linked = 1; /* reused as "seen" */
                            hit = 1;
                            break;
                        }
                    }
                if (!hit) {
                    fprintf(stderr, "self-check: unknown key %u in root %d's list\n", c->key, i);
                    return 1;
                }
                found++;
            }
        } else {
            for (struct list_head *p = r->head.next; p != &r->head; p = p->next) {
                struct object *o = container_of(p, struct object, link);
                if (o->root != r || !o->present) {
                    fprintf(stderr, "self-check: object %u in root %d's list is absent or not its\n", o->key, i);
                    return 1;
                }
                found++;
            }
        }
    }
    if (found != expected) {
        fprintf(stderr, "self-check: %llu objects in the lists, %llu expected\n", (unsigned long long)found,
                (unsigned long long)expected);
        return 1;
    }
    return 0;
}

static void free_harris(void)
{
    for (int i = 0; i < nroots; i++) {
        uintptr_t p = atomic_load(&roots[i].hhead);
        while (p) {
            struct hnode *c = (struct hnode *)p;
            p = UNMARK(atomic_load(&c->next));
            free(c);
        }
    }
    for (int i = 0; i < nthreads; i++)
        for (struct hnode *n = threads[i].retired_head, *next; n; n = next) {
            next = n->retire_next;
            free(n);
        }
}

/* ------------------------------------------------------------------ main */

static int parse_int(const char *s, const char *what, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "invalid %s '%s': expected an integer in %ld..%ld\n", what, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr, "usage: %s VARIANT THREADS READ_PCT DURATION_MS OBJS_PER_THREAD SEED "
                "[roots=N] [slots=N] [batch=N] [age_us=N]\nvariants:", argv[0]);
        for (size_t i = 0; i < sizeof variant_names / sizeof *variant_names; i++)
            fprintf(stderr, " %s", variant_names[i]);
        fprintf(stderr, "\n");
        return 2;
    }
    int found = -1;
    for (size_t i = 0; i < sizeof variant_names / sizeof *variant_names; i++)
        if (!strcmp(argv[1], variant_names[i]))
            found = (int)i;
    if (found < 0) {
        fprintf(stderr, "unknown variant '%s'\n", argv[1]);
        return 2;
    }
    variant = (enum variant)found;
    long v, duration_ms, seed;
    if (parse_int(argv[2], "threads", 1, MAX_THREADS, &v))
        return 2;
    nthreads = (int)v;
    if (parse_int(argv[3], "read percentage", 0, 100, &v))
        return 2;
    read_pct = (int)v;
    if (parse_int(argv[4], "duration (ms)", 1, 3600000, &duration_ms))
        return 2;
    if (parse_int(argv[5], "objects per thread", 1, 1 << 20, &v))
        return 2;
    objs_per_thread = (int)v;
    if (parse_int(argv[6], "seed", 0, 1L << 31, &seed))
        return 2;
    for (int i = 7; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) {
            fprintf(stderr, "invalid option '%s': expected roots=, slots=, batch= or age_us=\n", argv[i]);
            return 2;
        }
        *eq = '\0';
        if (!strcmp(argv[i], "roots") && !parse_int(eq + 1, "roots", 1, 1 << 16, &v))
            nroots = (int)v;
        else if (!strcmp(argv[i], "slots") && !parse_int(eq + 1, "slots", 1, MAX_SLOTS, &v) && !(v & (v - 1)))
            nslots = (int)v;
        else if (!strcmp(argv[i], "batch") && !parse_int(eq + 1, "batch", 1, 1L << 30, &v))
            batch = (uint64_t)v;
        else if (!strcmp(argv[i], "age_us") && !parse_int(eq + 1, "age_us", 1, 1L << 30, &v))
            age_ns = (uint64_t)v * 1000;
        else {
            fprintf(stderr, "invalid option '%s=%s' (slots must be a power of two <= %d)\n", argv[i], eq + 1,
                    MAX_SLOTS);
            return 2;
        }
    }

    roots = aligned_alloc(CACHELINE, sizeof *roots * (size_t)nroots);
    threads = aligned_alloc(CACHELINE, sizeof *threads * (size_t)nthreads);
    if (!roots || !threads) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    memset(roots, 0, sizeof *roots * (size_t)nroots);
    memset(threads, 0, sizeof *threads * (size_t)nthreads);
    uint64_t t_init = now_ns();
    for (int i = 0; i < nroots; i++) {
        struct root *r = &roots[i];
        pthread_mutex_init(&r->mutex, NULL);
        pthread_rwlock_init(&r->rwlock, NULL);
        r->head.next = r->head.prev = &r->head;
        atomic_init(&r->hhead, 0);
        ldu_queue_init(&r->q);
        atomic_init(&r->last_flush_ns, t_init);
        r->index = i;
    }
    for (int i = 0; i < nthreads; i++) {
        struct thread *t = &threads[i];
        t->id = i;
        t->rng = ((uint64_t)seed + 1) * 0x9E3779B97F4A7C15ULL ^ ((uint64_t)i + 1) * 0xBF58476D1CE4E5B9ULL;
        if (!t->rng)
            t->rng = 1;
        atomic_init(&t->epoch, 0);
        for (int s = 0; s < MAX_SLOTS; s++)
            ldu_queue_init(&t->slots[s]);
        t->objs = aligned_alloc(CACHELINE, sizeof *t->objs * (size_t)objs_per_thread);
        if (!t->objs) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        memset(t->objs, 0, sizeof *t->objs * (size_t)objs_per_thread);
        for (int j = 0; j < objs_per_thread; j++) {
            struct object *o = &t->objs[j];
            uint32_t id = (uint32_t)(i * objs_per_thread + j);
            o->key = id * 2654435761u; /* a bijection: keys of all threads interleave */
            o->root = &roots[id % (uint32_t)nroots];
            ldu_obj_init(&o->ldu);
        }
    }

    pthread_barrier_init(&start_barrier, NULL, (unsigned)nthreads + 1);
    for (int i = 0; i < nthreads; i++)
        if (pthread_create(&threads[i].tid, NULL, worker, &threads[i])) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    pthread_barrier_wait(&start_barrier);
    uint64_t t0 = now_ns();
    struct timespec ts = {duration_ms / 1000, (duration_ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts))
        ;
    atomic_store(&stop, 1);
    uint64_t t1 = now_ns();
    for (int i = 0; i < nthreads; i++)
        pthread_join(threads[i].tid, NULL);
    /* the ops finishing after `stop` are few and short; wall time is to the stop */
    double wall = (double)(t1 - t0) / 1e9;

    uint64_t ops = 0, idle = 0, reads = 0, logs = 0, pushes = 0, applies = 0, taken = 0, fr = 0, fb = 0, fa = 0,
             fc = 0, retired = 0, freed = 0;
    for (int i = 0; i < nthreads; i++) {
        struct thread *t = &threads[i];
        ops += t->ops;
        idle += t->idle_ns;
        reads += t->reads;
        logs += t->logs;
        pushes += t->pushes;
        fr += t->flush_read;
        fb += t->flush_bound;
        fa += t->flush_age;
        fc += t->flush_collision;
        retired += t->retired;
        freed += t->freed;
    }
    int bad = check_structure();
    for (int i = 0; i < nthreads; i++) { /* after the drain, which counts into threads[0] */
        applies += threads[i].applies;
        taken += threads[i].taken;
    }
    double idle_frac = (double)idle / 1e9 / (wall * nthreads);
    if (idle_frac > 1)
        idle_frac = 1; /* a blocked acquire can straddle the stop */
    printf("%s,%d,%d,%llu,%.0f,%.4f\n", variant_names[variant], nthreads, read_pct, (unsigned long long)ops,
           (double)ops / wall, idle_frac);
    fprintf(stderr, "stats: variant=%s wall_s=%.3f ops=%llu reads=%llu", variant_names[variant], wall,
            (unsigned long long)ops, (unsigned long long)reads);
    if (variant == V_LDU_GLOBAL || variant == V_LDU_PERCORE) {
        /* each absorbing log cancels itself and one pending log: applies = logs - 2 absorbed */
        uint64_t absorbed = logs > applies ? (logs - applies) / 2 : 0;
        fprintf(stderr, " logs=%llu pushes=%llu absorbed=%llu reused=%llu applies=%llu taken=%llu "
                "flush_read=%llu flush_bound=%llu flush_age=%llu flush_collision=%llu",
                (unsigned long long)logs, (unsigned long long)pushes, (unsigned long long)absorbed,
                (unsigned long long)(logs - absorbed - pushes), (unsigned long long)applies,
                (unsigned long long)taken, (unsigned long long)fr, (unsigned long long)fb, (unsigned long long)fa,
                (unsigned long long)fc);
    }
    if (variant == V_HARRIS || variant == V_HARRIS_UNORDERED)
        fprintf(stderr, " retired=%llu freed_during_run=%llu", (unsigned long long)retired, (unsigned long long)freed);
    fprintf(stderr, " self_check=%s\n", bad ? "FAILED" : "ok");
    free_harris();
    for (int i = 0; i < nthreads; i++)
        free(threads[i].objs);
    free(threads);
    free(roots);
    return bad;
}
