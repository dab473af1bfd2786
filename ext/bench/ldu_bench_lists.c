/* ldu_bench_lists.c - the baselines LDU is measured against in ldu_bench.c: an
 * intrusive doubly-linked list (under the root's mutex or rwlock: callers hold
 * it), and Harris-Michael lock-free lists, ordered or not, whose removed nodes
 * are freed by epoch-based reclamation (3 epochs, one retire list per thread).
 * Worker threads; no untrusted input. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench/ldu_bench.h"

_Atomic uint64_t global_epoch = 2;

/* ------------------------------------------------------------------ the locked list */

void do_list_insert(struct object *o) /* caller holds o->root's lock */
{
    struct list_head *h = &o->root->head;
    o->link.next = h->next;
    o->link.prev = h;
    h->next->prev = &o->link;
    h->next = &o->link;
    o->linked = 1;
}

void do_list_remove(struct object *o) /* caller holds o->root's lock */
{
    o->link.prev->next = o->link.next;
    o->link.next->prev = o->link.prev;
    o->linked = 0;
}

void do_list_traverse(struct thread *t, struct root *r) /* caller holds r's lock (shared is enough) */
{
    uint64_t n = 0, sum = 0;
    for (struct list_head *p = r->head.next; p != &r->head; p = p->next) {
        n++;
        sum += container_of(p, struct object, link)->key;
    }
    *(volatile uint64_t *)&t->sink += n + sum;
}

/* ------------------------------------------------------------------ EBR for Harris */

void ebr_enter(struct thread *t)
{
    /* Announce the epoch, then a full fence so the announcement is visible before
     * any list pointer is read: an advancer that misses it cannot move the global
     * epoch more than one step past it (the next step needs us at the new epoch). */
    atomic_store_explicit(&t->epoch, atomic_load_explicit(&global_epoch, memory_order_relaxed),
                          memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
}

void ebr_exit(struct thread *t)
{
    atomic_store_explicit(&t->epoch, 0, memory_order_release); /* our reads are done before this */
}

static void ebr_retire(struct thread *t, struct hnode *n)
{
    /* seq_cst load after the unlinking CAS: a reader that can still reach n
     * announced an epoch <= the one read here. */
    n->retire_epoch = atomic_load_explicit(&global_epoch, memory_order_seq_cst);
    n->retire_next = NULL;
    if (t->retired_tail)
        t->retired_tail->retire_next = n;
    else
        t->retired_head = n;
    t->retired_tail = n;
    t->retired++;
}

void ebr_collect(struct thread *t) /* outside any list operation */
{
    uint64_t g = atomic_load_explicit(&global_epoch, memory_order_seq_cst);
    int all = 1;
    for (int i = 0; i < nthreads && all; i++) {
        uint64_t e = atomic_load_explicit(&threads[i].epoch, memory_order_seq_cst);
        all = e == 0 || e == g;
    }
    if (all)
        atomic_compare_exchange_strong(&global_epoch, &g, g + 1);
    g = atomic_load_explicit(&global_epoch, memory_order_acquire);
    while (t->retired_head && t->retired_head->retire_epoch + 2 <= g) {
        struct hnode *n = t->retired_head;
        t->retired_head = n->retire_next;
        free(n);
        t->freed++;
    }
    if (!t->retired_head)
        t->retired_tail = NULL;
}

/* ------------------------------------------------------------------ Harris lists */

/* Michael's search: finds the first unmarked node with key (unordered) or the first
 * node with key >= key (ordered), unlinking (and retiring) every marked node it
 * passes. *pprev is the link that points to *pcurr. Returns 1 if *pcurr has key. */
static int h_find(struct thread *t, struct root *r, uint32_t key, int ordered, _Atomic uintptr_t **pprev,
                  struct hnode **pcurr)
{
retry:;
    _Atomic uintptr_t *prev = &r->hhead;
    uintptr_t curr = atomic_load_explicit(prev, memory_order_acquire);
    for (;;) {
        struct hnode *c = (struct hnode *)curr;
        if (!c) {
            *pprev = prev;
            *pcurr = NULL;
            return 0;
        }
        uintptr_t next = atomic_load_explicit(&c->next, memory_order_acquire);
        if (MARKED(next)) {
            uintptr_t expect = curr;
            if (!atomic_compare_exchange_strong(prev, &expect, UNMARK(next)))
                goto retry; /* prev changed or was marked itself */
            ebr_retire(t, c); /* our CAS unlinked it: only we retire it */
            curr = UNMARK(next);
            continue;
        }
        if (atomic_load_explicit(prev, memory_order_acquire) != curr)
            goto retry; /* prev was marked or relinked after we read curr */
        if (ordered ? c->key >= key : c->key == key) {
            *pprev = prev;
            *pcurr = c;
            return c->key == key;
        }
        prev = &c->next;
        curr = next;
    }
}

void h_insert(struct thread *t, struct root *r, uint32_t key, int ordered)
{
    struct hnode *n = malloc(sizeof *n);
    if (!n) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    n->key = key;
    for (;;) {
        _Atomic uintptr_t *prev;
        struct hnode *curr;
        uintptr_t expect;
        if (ordered) {
            if (h_find(t, r, key, 1, &prev, &curr)) {
                t->errors++; /* the owner inserts only absent keys */
                free(n);
                return;
            }
            expect = (uintptr_t)curr;
        } else { /* the paper's unordered list: no search, link at the head */
            prev = &r->hhead;
            expect = atomic_load_explicit(prev, memory_order_relaxed);
        }
        atomic_store_explicit(&n->next, expect, memory_order_relaxed);
        /* release: n's key and next are visible to whoever reaches n */
        if (atomic_compare_exchange_strong_explicit(prev, &expect, (uintptr_t)n, memory_order_release,
                                                    memory_order_relaxed))
            return;
    }
}

void h_remove(struct thread *t, struct root *r, uint32_t key, int ordered)
{
    for (;;) {
        _Atomic uintptr_t *prev;
        struct hnode *curr;
        if (!h_find(t, r, key, ordered, &prev, &curr)) {
            t->errors++; /* the owner removes only present keys */
            return;
        }
        uintptr_t next = atomic_load_explicit(&curr->next, memory_order_acquire);
        if (MARKED(next))
            continue;
        /* logical delete: mark curr's next so no insert can link after curr */
        if (!atomic_compare_exchange_strong(&curr->next, &next, next | 1))
            continue;
        uintptr_t expect = (uintptr_t)curr;
        if (atomic_compare_exchange_strong(prev, &expect, next))
            ebr_retire(t, curr);
        else
            h_find(t, r, key, ordered, &prev, &curr); /* let the search unlink it */
        return;
    }
}

void h_traverse(struct thread *t, struct root *r)
{
    uint64_t n = 0, sum = 0;
    for (uintptr_t p = atomic_load_explicit(&r->hhead, memory_order_acquire); p;) {
        struct hnode *c = (struct hnode *)p;
        uintptr_t next = atomic_load_explicit(&c->next, memory_order_acquire);
        if (!MARKED(next)) {
            n++;
            sum += c->key;
        }
        p = UNMARK(next);
    }
    *(volatile uint64_t *)&t->sink += n + sum;
}
