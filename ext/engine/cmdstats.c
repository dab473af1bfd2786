/* cmdstats.c - per-thread command statistics and the slow log (see cmdstats.h).
 * Lock order: st->lock (block list, error kinds) and st->slow_lock are never
 * held together. Request path: cst_block's inline check, cst_count, and on an
 * error reply cst_error; nothing else. */
#define _GNU_SOURCE
#include "engine/cmdstats.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__thread struct cst_block *cst_tls_block __attribute__((tls_model("initial-exec")));
__thread uint64_t cst_tls_gen __attribute__((tls_model("initial-exec")));

static _Atomic uint64_t next_gen = 1;

struct slow_node {
    struct slow_node *prev, *next;
    struct cst_slow e;
};

struct cst {
    struct cst_hot hot;           /* first: cmdstats.h reads it inline */
    pthread_mutex_t lock;         /* guards the list's head and adding error kinds */
    struct cst_block *_Atomic blocks;
    _Atomic int nkinds;           /* error kinds published (names below are immutable once counted) */
    char kinds[CST_ERRKINDS][CST_ERRNAME + 1];
    /* the slow log */
    _Atomic long long slower_than, max_len;
    pthread_mutex_t slow_lock;    /* guards the fields below */
    struct slow_node *head, *tail; /* newest first */
    long long len;
    uint64_t next_id;
};

int cst_create(struct cst **out, long long slower_than, long long max_len)
{
    struct cst *st = calloc(1, sizeof *st);
    if (!st)
        return -ENOMEM;
    st->hot.gen = atomic_fetch_add(&next_gen, 1);
    pthread_mutex_init(&st->lock, NULL);
    pthread_mutex_init(&st->slow_lock, NULL);
    atomic_init(&st->slower_than, slower_than);
    atomic_init(&st->max_len, max_len);
    *out = st;
    return 0;
}

static void slow_free_node(struct slow_node *n)
{
    for (int i = 0; i < n->e.argc; i++)
        free(n->e.argv[i]);
    free(n);
}

void cst_destroy(struct cst *st)
{
    if (!st)
        return;
    for (struct cst_block *b = st->blocks, *nx; b; b = nx) {
        nx = b->next;
        for (int i = 0; i < CST_SLOTS; i++)
            free(b->hist[i]);
        free(b);
    }
    for (struct slow_node *n = st->head, *nx; n; n = nx) {
        nx = n->next;
        slow_free_node(n);
    }
    pthread_mutex_destroy(&st->lock);
    pthread_mutex_destroy(&st->slow_lock);
    free(st);
}

/* The owner zeroes its block for the new epoch, then publishes the epoch
 * (release): a reader that sees the new epoch (acquire) sees zeros or later
 * counts, never the old ones. The blocked gauge is not a statistic: it stays. */
static void zero_block(struct cst_block *b, uint64_t epoch)
{
    for (int i = 0; i < CST_SLOTS; i++) {
        struct cst_slot *s = &b->slot[i];
        atomic_store_explicit(&s->calls, 0, memory_order_relaxed);
        atomic_store_explicit(&s->ns, 0, memory_order_relaxed);
        atomic_store_explicit(&s->rejected, 0, memory_order_relaxed);
        atomic_store_explicit(&s->failed, 0, memory_order_relaxed);
        struct cst_hist *h = atomic_load_explicit(&b->hist[i], memory_order_relaxed);
        if (h)
            for (int j = 0; j < CST_HLEN; j++)
                atomic_store_explicit(&h->n[j], 0, memory_order_relaxed);
    }
    for (int k = 0; k < CST_ERRKINDS; k++)
        atomic_store_explicit(&b->errkind[k], 0, memory_order_relaxed);
    atomic_store_explicit(&b->errors, 0, memory_order_relaxed);
    atomic_store_explicit(&b->epoch, epoch, memory_order_release);
}

struct cst_block *cst_block_slow(struct cst *st)
{
    uint64_t epoch = atomic_load_explicit(&st->hot.epoch, memory_order_acquire);
    if (cst_tls_gen == st->hot.gen && cst_tls_block) { /* a reset since it last counted */
        zero_block(cst_tls_block, epoch);
        return cst_tls_block;
    }
    struct cst_block *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    atomic_init(&b->epoch, epoch);
    pthread_mutex_lock(&st->lock);
    b->next = atomic_load_explicit(&st->blocks, memory_order_relaxed);
    atomic_store_explicit(&st->blocks, b, memory_order_release); /* readers walk from here */
    pthread_mutex_unlock(&st->lock);
    cst_tls_block = b;
    cst_tls_gen = st->hot.gen;
    return b;
}

/* Log-linear bucket of a duration in ns: exact below 2^CST_HSUB, then 2^CST_HSUB
 * sub-buckets per power of two. */
static unsigned hist_index(uint64_t v)
{
    if (v < (1u << CST_HSUB))
        return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    unsigned i = ((msb - CST_HSUB + 1) << CST_HSUB) + (unsigned)(v >> (msb - CST_HSUB)) - (1u << CST_HSUB);
    return i < CST_HLEN ? i : CST_HLEN - 1;
}

/* The largest ns that falls in bucket i. */
static uint64_t hist_top(unsigned i)
{
    if (i < (1u << CST_HSUB))
        return i;
    unsigned shift = (i >> CST_HSUB) - 1;
    uint64_t base = (uint64_t)((i & ((1u << CST_HSUB) - 1)) + (1u << CST_HSUB)) << shift;
    return base + ((1ull << shift) - 1);
}

void cst_count(struct cst_block *b, int slot, uint64_t ns, int failed, int rejected)
{
    struct cst_slot *s = &b->slot[slot];
    if (rejected) { /* as Redis: a rejected call is not a call and has no duration */
        cst_inc(&s->rejected, 1);
        return;
    }
    cst_inc(&s->calls, 1);
    cst_inc(&s->ns, ns);
    if (failed)
        cst_inc(&s->failed, 1);
    struct cst_hist *h = atomic_load_explicit(&b->hist[slot], memory_order_relaxed);
    if (__builtin_expect(!h, 0)) { /* once per (thread, command) */
        if (!(h = calloc(1, sizeof *h)))
            return;
        atomic_store_explicit(&b->hist[slot], h, memory_order_release);
    }
    cst_inc(&h->n[hist_index(ns)], 1);
}

/* Index of error kind name[0..n), added if new and there is room; -1 if not. */
static int errkind(struct cst *st, const char *name, size_t n)
{
    int k = atomic_load_explicit(&st->nkinds, memory_order_acquire);
    for (int i = 0; i < k; i++)
        if (!strncmp(st->kinds[i], name, n) && st->kinds[i][n] == 0)
            return i;
    pthread_mutex_lock(&st->lock);
    k = atomic_load_explicit(&st->nkinds, memory_order_relaxed);
    int found = -1;
    for (int i = 0; i < k && found < 0; i++)
        if (!strncmp(st->kinds[i], name, n) && st->kinds[i][n] == 0)
            found = i;
    if (found < 0 && k < CST_ERRKINDS) {
        memcpy(st->kinds[k], name, n);
        st->kinds[k][n] = 0;
        atomic_store_explicit(&st->nkinds, k + 1, memory_order_release); /* name before count */
        found = k;
    }
    pthread_mutex_unlock(&st->lock);
    return found;
}

void cst_error(struct cst *st, struct cst_block *b, const char *e, size_t n)
{
    cst_inc(&b->errors, 1);
    const char *sp = memchr(e, ' ', n < CST_ERRNAME ? n : CST_ERRNAME);
    int k = sp && sp > e ? errkind(st, e, (size_t)(sp - e)) : errkind(st, "ERR", 3);
    /* past CST_ERRKINDS kinds a new one is counted in total_error_replies only */
    if (k >= 0)
        cst_inc(&b->errkind[k], 1);
}

/* Each block of the current epoch, for readers. */
#define FOR_BLOCKS(st, b, epoch)                                                                  \
    for (struct cst_block *b = atomic_load_explicit(&(st)->blocks, memory_order_acquire); b;       \
         b = b->next)                                                                              \
        if (atomic_load_explicit(&b->epoch, memory_order_acquire) == (epoch))

void cst_sum_slot(struct cst *st, int slot, struct cst_slot *out)
{
    uint64_t epoch = atomic_load(&st->hot.epoch), calls = 0, ns = 0, rej = 0, fail = 0;
    FOR_BLOCKS(st, b, epoch)
    {
        struct cst_slot *s = &b->slot[slot];
        calls += atomic_load_explicit(&s->calls, memory_order_relaxed);
        ns += atomic_load_explicit(&s->ns, memory_order_relaxed);
        rej += atomic_load_explicit(&s->rejected, memory_order_relaxed);
        fail += atomic_load_explicit(&s->failed, memory_order_relaxed);
    }
    atomic_init(&out->calls, calls);
    atomic_init(&out->ns, ns);
    atomic_init(&out->rejected, rej);
    atomic_init(&out->failed, fail);
}

uint64_t cst_sum_hist(struct cst *st, int slot, uint64_t *h)
{
    uint64_t epoch = atomic_load(&st->hot.epoch), total = 0;
    memset(h, 0, CST_HLEN * sizeof *h);
    FOR_BLOCKS(st, b, epoch)
    {
        struct cst_hist *x = atomic_load_explicit(&b->hist[slot], memory_order_acquire);
        if (!x)
            continue;
        for (int i = 0; i < CST_HLEN; i++) {
            uint64_t v = atomic_load_explicit(&x->n[i], memory_order_relaxed);
            h[i] += v;
            total += v;
        }
    }
    return total;
}

uint64_t cst_hist_quantile(const uint64_t *h, uint64_t total, double q)
{
    double want = q * (double)total;
    uint64_t need = (uint64_t)want, cum = 0;
    if ((double)need < want || !need)
        need++;
    unsigned i = 0;
    while (i < CST_HLEN - 1 && (cum += h[i]) < need)
        i++;
    return hist_top(i);
}

uint64_t cst_total_errors(struct cst *st)
{
    uint64_t epoch = atomic_load(&st->hot.epoch), n = 0;
    FOR_BLOCKS(st, b, epoch)
    n += atomic_load_explicit(&b->errors, memory_order_relaxed);
    return n;
}

int64_t cst_blocked(struct cst *st)
{
    int64_t n = 0;
    for (struct cst_block *b = atomic_load_explicit(&st->blocks, memory_order_acquire); b; b = b->next)
        n += atomic_load_explicit(&b->blocked, memory_order_relaxed);
    return n > 0 ? n : 0; /* a moment's skew between threads' gauges is never shown as negative */
}

const char *cst_errkind(struct cst *st, int i, uint64_t *count)
{
    if (i < 0 || i >= atomic_load_explicit(&st->nkinds, memory_order_acquire))
        return NULL;
    uint64_t epoch = atomic_load(&st->hot.epoch), n = 0;
    FOR_BLOCKS(st, b, epoch)
    n += atomic_load_explicit(&b->errkind[i], memory_order_relaxed);
    *count = n;
    return st->kinds[i];
}

void cst_reset(struct cst *st) { atomic_fetch_add(&st->hot.epoch, 1); }

/* ---- the slow log */

long long cst_slowlog_slower_than(const struct cst *st)
{
    return atomic_load_explicit(&((struct cst *)st)->slower_than, memory_order_relaxed);
}

void cst_slowlog_set_slower_than(struct cst *st, long long us) { atomic_store(&st->slower_than, us); }

long long cst_slowlog_max_len(const struct cst *st) { return atomic_load(&((struct cst *)st)->max_len); }

/* Drop the oldest entries past max (slow_lock held). */
static void slow_trim(struct cst *st, long long max)
{
    while (st->len > max) {
        struct slow_node *n = st->tail;
        st->tail = n->prev;
        if (st->tail)
            st->tail->next = NULL;
        else
            st->head = NULL;
        slow_free_node(n);
        st->len--;
    }
}

void cst_slowlog_set_max_len(struct cst *st, long long n)
{
    atomic_store(&st->max_len, n);
    pthread_mutex_lock(&st->slow_lock);
    slow_trim(st, n);
    pthread_mutex_unlock(&st->slow_lock);
}

/* Redis's slowlogCreateEntry: at most 32 arguments, the last then saying how many
 * more there were; a string past 128 bytes keeps 128 and says how many more. */
static char *slow_arg(const char *p, size_t n, size_t *len)
{
    char *s;
    if (n > CST_SLOW_STR) {
        char tail[64];
        int t = snprintf(tail, sizeof tail, "... (%zu more bytes)", n - CST_SLOW_STR);
        if (!(s = malloc(CST_SLOW_STR + (size_t)t + 1)))
            return NULL;
        memcpy(s, p, CST_SLOW_STR);
        memcpy(s + CST_SLOW_STR, tail, (size_t)t + 1);
        *len = CST_SLOW_STR + (size_t)t;
        return s;
    }
    if (!(s = malloc(n + 1)))
        return NULL;
    memcpy(s, p, n);
    s[n] = 0;
    *len = n;
    return s;
}

void cst_slowlog_push(struct cst *st, int argc, const char **argv, const size_t *argl, uint64_t us,
                      const char *addr, const char *name)
{
    long long max = atomic_load(&st->max_len);
    if (max <= 0)
        return;
    struct slow_node *n = calloc(1, sizeof *n);
    if (!n)
        return; /* statistics never fail a request */
    int keep = argc > CST_SLOW_ARGS ? CST_SLOW_ARGS : argc;
    for (int i = 0; i < keep; i++) {
        char more[64];
        if (i == CST_SLOW_ARGS - 1 && argc > CST_SLOW_ARGS) {
            int t = snprintf(more, sizeof more, "... (%d more arguments)", argc - CST_SLOW_ARGS + 1);
            n->e.argv[i] = slow_arg(more, (size_t)t, &n->e.argl[i]);
        } else {
            n->e.argv[i] = slow_arg(argv[i], argl[i], &n->e.argl[i]);
        }
        if (!n->e.argv[i]) {
            slow_free_node(n);
            return;
        }
        n->e.argc = i + 1;
    }
    n->e.time = (int64_t)time(NULL);
    n->e.usec = us;
    snprintf(n->e.addr, sizeof n->e.addr, "%s", addr ? addr : "");
    snprintf(n->e.name, sizeof n->e.name, "%s", name ? name : "");
    pthread_mutex_lock(&st->slow_lock);
    n->e.id = st->next_id++;
    n->next = st->head;
    if (st->head)
        st->head->prev = n;
    else
        st->tail = n;
    st->head = n;
    st->len++;
    slow_trim(st, atomic_load(&st->max_len));
    pthread_mutex_unlock(&st->slow_lock);
}

int cst_slowlog_get(struct cst *st, long long max, struct cst_slow **out)
{
    pthread_mutex_lock(&st->slow_lock);
    long long n = max < 0 || max > st->len ? st->len : max;
    struct cst_slow *v = calloc(n ? (size_t)n : 1, sizeof *v);
    if (!v) {
        pthread_mutex_unlock(&st->slow_lock);
        return -ENOMEM;
    }
    int got = 0, rc = 0;
    for (struct slow_node *x = st->head; x && got < n && !rc; x = x->next) {
        v[got] = x->e;
        for (int i = 0; i < x->e.argc; i++) /* copies: the entry may be trimmed once unlocked */
            if (!(v[got].argv[i] = malloc(x->e.argl[i] + 1)))
                v[got].argc = i, rc = -ENOMEM;
            else
                memcpy(v[got].argv[i], x->e.argv[i], x->e.argl[i] + 1);
        got++;
    }
    pthread_mutex_unlock(&st->slow_lock);
    if (rc) {
        cst_slowlog_free(v, got);
        return rc;
    }
    *out = v;
    return got;
}

void cst_slowlog_free(struct cst_slow *e, int n)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < e[j].argc; i++)
            free(e[j].argv[i]);
    free(e);
}

long long cst_slowlog_len(struct cst *st)
{
    pthread_mutex_lock(&st->slow_lock);
    long long n = st->len;
    pthread_mutex_unlock(&st->slow_lock);
    return n;
}

void cst_slowlog_reset(struct cst *st)
{
    pthread_mutex_lock(&st->slow_lock);
    slow_trim(st, 0);
    pthread_mutex_unlock(&st->slow_lock);
}
