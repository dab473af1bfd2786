/* nbd_lock.c - the NBD server's block-lock table (see nbd_int.h): serializes a
 * block's read-modify-write against every other write of that block, on any
 * connection and any thread. 256 stripes, each a mutex over a short list of the
 * blocks locked now (entries reused from a free list: no malloc in steady state).
 * Threads: any worker; a lock freed on one thread is granted to a waiter of
 * another through that thread's grant list and eventfd. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend/nbd_int.h"

/* A full-block write holds its block shared (two of them may overlap: the
 * block ends up one writer's or the other's), a read-modify-write holds it
 * exclusively from its read to its write's completion. Waiters are granted in
 * arrival order, so a stream of full writes never starves a read-modify-write.
 * Locks: one stripe's mutex at a time; grants are delivered (a thread's glock)
 * after it is released, so no two locks are ever held together. */

struct nbd_lock_entry {
    uint64_t block;
    uint32_t shared;
    uint8_t excl;
    struct nbd_bop *whead, *wtail;
    struct nbd_lock_entry *next;
};

static struct nbd_lock_stripe *stripe_of(struct nbd_server *s, uint64_t block)
{
    return &s->locks[(block * 0x9E3779B97F4A7C15ull) >> 56 & (NBD_LOCK_STRIPES - 1)];
}

static int lock_fits(const struct nbd_lock_entry *e, int excl) { return excl ? !e->shared && !e->excl : !e->excl; }

static void lock_take(struct nbd_lock_entry *e, int excl)
{
    if (excl)
        e->excl = 1;
    else
        e->shared++;
}

int nbd_lock_get(struct nbd_server *s, struct nbd_bop *b)
{
    struct nbd_lock_stripe *st = stripe_of(s, b->op.block);
    int rc = 1;
    pthread_mutex_lock(&st->m);
    struct nbd_lock_entry *e = st->list;
    while (e && e->block != b->op.block)
        e = e->next;
    if (!e) {
        if (st->free) {
            e = st->free;
            st->free = e->next;
        } else if (!(e = malloc(sizeof *e))) {
            pthread_mutex_unlock(&st->m);
            return -ENOMEM;
        }
        memset(e, 0, sizeof *e);
        e->block = b->op.block;
        e->next = st->list;
        st->list = e;
    }
    /* b->locked is written under the stripe's lock here and by a grant in
     * lock_put (another thread, the moment this one lets go): never after */
    b->locked = 0;
    if (!e->whead && lock_fits(e, b->excl)) {
        lock_take(e, b->excl);
        b->locked = 1;
    } else {
        b->lnext = NULL;
        if (e->wtail)
            e->wtail->lnext = b;
        else
            e->whead = b;
        e->wtail = b;
        rc = 0;
    }
    pthread_mutex_unlock(&st->m);
    return rc;
}

static void grant(struct nbd_thread *self, struct nbd_bop *b)
{
    struct nbd_thread *t = b->r->c->t;
    if (t == self) {
        b->lnext = self->ready;
        self->ready = b;
        return;
    }
    pthread_mutex_lock(&t->glock);
    b->lnext = t->granted;
    /* atomic: the owner peeks at the list without the lock (nbd_req_run_grants) */
    __atomic_store_n(&t->granted, b, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&t->glock);
    uint64_t one = 1;
    (void)!write(t->evfd, &one, sizeof one);
}

void nbd_lock_put(struct nbd_thread *self, struct nbd_bop *b)
{
    if (!b->locked)
        return;
    b->locked = 0;
    struct nbd_server *s = self->s;
    struct nbd_lock_stripe *st = stripe_of(s, b->op.block);
    struct nbd_bop *granted = NULL;
    pthread_mutex_lock(&st->m);
    struct nbd_lock_entry **pe = &st->list, *e;
    while ((e = *pe) && e->block != b->op.block)
        pe = &e->next;
    if (b->excl)
        e->excl = 0;
    else
        e->shared--;
    while (e->whead && lock_fits(e, e->whead->excl)) {
        struct nbd_bop *w = e->whead;
        e->whead = w->lnext;
        if (!e->whead)
            e->wtail = NULL;
        lock_take(e, w->excl);
        w->locked = 1;
        w->lnext = granted;
        granted = w;
    }
    if (!e->shared && !e->excl && !e->whead) {
        *pe = e->next;
        e->next = st->free;
        st->free = e;
    }
    pthread_mutex_unlock(&st->m);
    while (granted) {
        struct nbd_bop *w = granted;
        granted = w->lnext;
        grant(self, w);
    }
}

void nbd_locks_free(struct nbd_server *s)
{
    for (int i = 0; i < NBD_LOCK_STRIPES; i++) {
        struct nbd_lock_stripe *st = &s->locks[i];
        for (int k = 0; k < 2; k++) {
            struct nbd_lock_entry *e = k ? st->free : st->list;
            while (e) {
                struct nbd_lock_entry *n = e->next;
                free(e);
                e = n;
            }
        }
        st->list = st->free = NULL;
        pthread_mutex_destroy(&st->m);
    }
}
