/* wal_ship.c - the chunks the log's records live in (see wal.c), and the log
 * sender's view of them (wal_ship_peek / wal_ship_consume, wal.h): the records in
 * place, one copy serving the disk write and the sender. */
#define _GNU_SOURCE
#include "durability/wal_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/bytes.h"

struct wal_chunk *wal_chunk_new(struct wal *w, size_t cap)
{
    struct wal_chunk *c;
    if (cap == CHUNK_BYTES && w->spare) {
        c = w->spare;
        w->spare = c->next;
        w->nspare--;
    } else if (!(c = malloc(sizeof *c + cap))) {
        return NULL;
    }
    c->next = NULL;
    c->cap = cap;
    c->len = 0;
    return c;
}

/* Spares kept: in sync mode (disk mode, or remote mode without its peer) a group
 * is what was appended during one sync, a chunk or two: a few spares; in async
 * mode a batch's worth (w->max_spare). Caller holds w->lock. */
static int spare_limit(const struct wal *w)
{
    int few = w->max_spare < SYNC_SPARES ? w->max_spare : SYNC_SPARES;
    return atomic_load_explicit(&w->sync, memory_order_relaxed) ? few : w->max_spare;
}

static void chunk_drop(struct wal *w, struct wal_chunk *c)
{
    if (c->cap == CHUNK_BYTES && w->nspare < spare_limit(w)) {
        c->next = w->spare;
        w->spare = c;
        w->nspare++;
    } else {
        free(c);
    }
}


/* A cursor at the end of a chunk that has a successor moves to the successor's
 * start (so that the chunk behind it can go). Caller holds w->lock. */
void wal_pos_norm(struct wal_pos *p)
{
    while (p->off == p->c->len && p->c->next) {
        p->c = p->c->next;
        p->off = 0;
    }
}

/* Recycle the chunks both cursors passed; with nothing left to read, start the
 * tail over (an oversized one is replaced). Caller holds w->lock. */
void wal_recycle(struct wal *w)
{
    wal_pos_norm(&w->disk);
    if (w->ship)
        wal_pos_norm(&w->shipc);
    else
        w->shipc = w->disk;
    while (w->head != w->disk.c && w->head != w->shipc.c) {
        struct wal_chunk *c = w->head;
        w->head = c->next;
        chunk_drop(w, c);
    }
    for (int keep = spare_limit(w); w->nspare > keep; w->nspare--) { /* kept from an async burst */
        struct wal_chunk *c = w->spare;
        w->spare = c->next;
        free(c);
    }
    if (w->disk.bytes == w->total && w->shipc.bytes == w->total && w->disk_taken == w->total &&
        !w->unit_open && w->head == w->tail) {
        if (w->tail->cap != CHUNK_BYTES) {
            struct wal_chunk *c = wal_chunk_new(w, CHUNK_BYTES);
            if (!c)
                return;
            free(w->tail);
            w->head = w->tail = c;
        }
        w->tail->len = 0;
        w->disk.c = w->shipc.c = w->tail;
        w->disk.off = w->shipc.off = 0;
    }
}



/* The records in [from, to) as iovecs into *iov (grown as needed; *cap its
 * size). Without w->lock: every chunk before to.c is final and none is recycled
 * while the caller's cursor stands at from. Returns the count, or -ENOMEM. */
static int wal_pos_iov(struct wal_pos from, struct wal_pos to, struct iovec **iov, int *cap)
{
    int n = 0;
    for (struct wal_chunk *c = from.c;; c = c->next) {
        size_t off = c == from.c ? from.off : 0, end = c == to.c ? to.off : c->len;
        if (end > off) {
            if (n == *cap) {
                int ncap = *cap ? *cap * 2 : 16;
                struct iovec *v = realloc(*iov, (size_t)ncap * sizeof *v);
                if (!v)
                    return -ENOMEM;
                *iov = v;
                *cap = ncap;
            }
            (*iov)[n++] = (struct iovec){c->data + off, end - off};
        }
        if (c == to.c)
            return n;
    }
}

uint64_t wal_ship_peek(struct wal *w, struct wal_ship *v)
{
    /* The sender's records are the log's: v points into the chunks, which stay
     * until the sender consumed them (and the log thread wrote them). An open
     * unit's records stay behind: the peer acknowledges only whole units, and
     * what is shipped ends where the durable LSN may. */
    pthread_mutex_lock(&w->lock);
    /* Everything the sender may take is in v now: a later append raises it again
     * (an open unit left out raises it with its COMMIT). */
    atomic_store_explicit(&w->ship_pending, 0, memory_order_relaxed);
    wal_pos_norm(&w->shipc);
    struct wal_pos from = w->shipc, to = w->unit_open ? w->unit_pos : wal_end_pos(w);
    pthread_mutex_unlock(&w->lock);
    v->n = 0;
    v->bytes = (size_t)(to.bytes - from.bytes);
    v->end_c = to.c;
    v->end_off = to.off;
    v->end_lsn = to.lsn;
    v->end_bytes = to.bytes;
    if (!v->bytes) {
        v->first = v->last = 0;
        return 0;
    }
    int n = wal_pos_iov(from, to, &v->iov, &v->cap);
    if (n < 0) { /* no memory for the iovecs: nothing now, the sender comes back */
        atomic_store_explicit(&w->ship_pending, 1, memory_order_relaxed);
        v->bytes = 0;
        v->first = v->last = 0;
        return 0;
    }
    v->n = n;
    v->first = from.lsn;
    v->last = to.lsn - 1;
    return v->last;
}

void wal_ship_consume(struct wal *w, struct wal_ship *v, uint64_t upto)
{
    if (v->bytes && upto >= v->first) {
        struct wal_pos p = {v->end_c, v->end_off, v->end_lsn, v->end_bytes};
        if (upto < v->last) {
            /* A prefix: walk its records (whole records, never across chunks)
             * without the appenders' lock (after a catch-up the view may hold
             * megabytes). The sender's cursor stands at the view's start until
             * it is stored below: none of the view's chunks is recycled, and
             * every chunk before end_c is final. */
            pthread_mutex_lock(&w->lock);
            p = w->shipc;
            pthread_mutex_unlock(&w->lock);
            while (p.lsn <= upto && p.bytes < v->end_bytes) {
                while (p.c != v->end_c && p.off == p.c->len) {
                    p.c = p.c->next;
                    p.off = 0;
                }
                const unsigned char *r = p.c->data + p.off;
                size_t l = WAL_HDR + (size_t)get32(r + WAL_OFF_KLEN) + get32(r + WAL_OFF_VLEN) + WAL_TRAILER;
                p.off += l;
                p.bytes += l;
                p.lsn++;
            }
        }
        pthread_mutex_lock(&w->lock);
        w->shipc = p;
        wal_recycle(w);
        pthread_mutex_unlock(&w->lock);
    }
    v->bytes = 0;
    v->n = 0;
    v->first = v->last = 0;
}

void wal_ship_free(struct wal_ship *v)
{
    free(v->iov);
    *v = (struct wal_ship){0};
}

int wal_ship_fd(struct wal *w) { return w->ship_evfd; }

int wal_ship_sleep(struct wal *w, int sleep)
{
    if (!sleep) {
        atomic_store_explicit(&w->ship_idle, 0, memory_order_relaxed);
        uint64_t v;
        ssize_t r = read(w->ship_evfd, &v, sizeof v);
        (void)r; /* EAGAIN: nobody wrote it */
        return 0;
    }
    atomic_store_explicit(&w->ship_idle, 1, memory_order_seq_cst); /* then look for records */
    if (!atomic_load_explicit(&w->ship_pending, memory_order_seq_cst))
        return 1;
    atomic_store_explicit(&w->ship_idle, 0, memory_order_relaxed);
    return 0;
}
