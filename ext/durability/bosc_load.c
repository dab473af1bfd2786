/* bosc_load.c - the table's hooks into the data file (struct kvt_spill) and
 * loading keys that left memory: bosc_load (blocking) and the loader thread
 * serving bosc_request_load for pollers, which wait on their eventfd, and
 * between loads the key listings of bosc_keys.c. A bucket's
 * version (seqlock) and the generation tell a load that what it read is stale.
 * Parses untrusted bytes (the file) through bosc_block.c's checks. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/bytes.h"
#include "core/crc32c.h"
#include "core/kvbuf.h"
#include "core/ldu.h"
#include "core/table.h"
#include "durability/bosc_int.h"
#include "durability/wal.h"

/* ---- the table's hooks */

int bosc_hook_maybe_on_disk(void *arg, const void *key, size_t klen)
{
    struct bosc *b = arg;
    if (atomic_load_explicit(&b->failed, memory_order_relaxed))
        return 1; /* let the load report the damage rather than answer "absent" */
    return atomic_load_explicit(&b->nkeys[bucket_of(b, key, klen)], memory_order_relaxed) != 0;
}

void bosc_hook_flushall(void *arg, int phase, uint64_t lsn)
{
    struct bosc *b = arg;
    if (phase == KVT_FLUSH_BEGIN) {
        pthread_mutex_lock(&b->flush_lock);
        return;
    }
    if (phase == KVT_FLUSH_COMMIT) {
        /* Under gen_lock no block write is in progress: every block written from
         * now on carries the new generation, every older block reads as empty.
         * The FLUSH record is only appended yet: no superblock records the new
         * generation before the log holds it (settle_chunk, bosc_sweep.c). */
        pthread_mutex_lock(&b->gen_lock);
        atomic_store_explicit(&b->flush_lsn, lsn, memory_order_relaxed);
        atomic_fetch_add_explicit(&b->gen, 1, memory_order_release);
        for (uint32_t i = 0; i < b->nbuckets; i++)
            atomic_store_explicit(&b->nkeys[i], 0, memory_order_relaxed);
        kvt_disk_keys_set(b->t, 0);
        pthread_mutex_unlock(&b->gen_lock);
    }
    pthread_mutex_unlock(&b->flush_lock);
}

int bosc_hook_load_sync(void *arg, const void *key, size_t klen) { return bosc_load(arg, key, klen); }

/* The flusher's snapshot of a stream (kvt_snapshot, the key's shard locked):
 * the batch gets a reference that a record may hold -- its own if its bytes
 * are durable in the store, else a new one (staged, committed before any chain
 * that holds it is written) -- and the reference counts towards its segment's
 * live bytes from now on (the record's; a record never written leaves its
 * segment counted until the next open recounts). */
int bosc_hook_stage_batch(void *arg, struct xs_batch *xb)
{
    struct bosc *b = arg;
    if (!xb->file.seg || xb->file.len != xb->len || !bstore_durable(b->bs, &xb->file)) {
        if (xb->gone) /* (its copy is what its bytes are: gone batches are durable ones) */
            return -ESTALE;
        struct xs_ref r;
        int rc = bstore_stage(b->bs, xb->data, xb->len, &r);
        if (rc)
            return rc;
        xb->file = r;
    }
    bstore_count(b->bs, &xb->file, 1);
    return 0;
}

int bosc_hook_batch_durable(void *arg, const struct xs_ref *ref)
{
    struct bosc *b = arg;
    return bstore_durable(b->bs, ref);
}

int bosc_hook_fetch_batch(void *arg, const struct xs_ref *ref, void *buf)
{
    struct bosc *b = arg;
    return bstore_read(b->bs, ref, buf);
}

void bosc_count_refs(void *arg, const struct xs_ref *ref)
{
    struct bosc *b = arg;
    bstore_count(b->bs, ref, 1);
}

/* ---- loading a key */

struct find_arg {
    const unsigned char *key;
    uint32_t klen;
    const unsigned char *val;
    uint32_t vlen;
    int64_t expire;
    int found, type;
};

static void find_rec(void *arg, const unsigned char *rec, size_t reclen, const unsigned char *key, uint32_t klen,
              const unsigned char *val, uint32_t vlen, int64_t expire, int type)
{
    (void)rec;
    (void)reclen;
    struct find_arg *f = arg;
    if (klen == f->klen && memcmp(key, f->key, klen) == 0) {
        f->found = 1;
        f->val = val;
        f->vlen = vlen;
        f->expire = expire;
        f->type = type;
    }
}

struct valid_arg {
    struct bosc *b;
    uint32_t bucket, ver;
    uint64_t gen;
};

static int still_valid(void *arg)
{
    struct valid_arg *v = arg;
    return atomic_load_explicit(&v->b->ver[v->bucket], memory_order_acquire) == v->ver &&
           atomic_load_explicit(&v->b->gen, memory_order_acquire) == v->gen;
}

int bosc_load(struct bosc *b, const void *key, size_t klen)
{
    if (atomic_load(&b->failed))
        return -EILSEQ;
    add(&b->st.loads, 1);
    struct valid_arg v = {b, bucket_of(b, key, klen), 0, 0};
    struct kvbuf s = {0};
    uint32_t *chain = NULL;
    size_t nchain = 0, capchain = 0;
    char err[256];
    int rc, stream = 0; /* a stream's record or batches were read */
    for (int tries = 0;; tries++) {
        /* Seqlock read: an odd version is a chain being written; wait it out. */
        v.ver = atomic_load_explicit(&b->ver[v.bucket], memory_order_acquire);
        v.gen = atomic_load_explicit(&b->gen, memory_order_acquire);
        if (v.ver & 1) {
            bosc_wait_written(b);
            continue;
        }
        if (kvt_exists(b->t, key, klen) != -ENODATA) {
            /* In memory (loaded already, or written meanwhile): a stream's readers
             * may want batches that left memory. */
            rc = kvt_load_batches(b->t, key, klen);
            stream = 1;
            break;
        }
        struct find_arg f = {key, (uint32_t)klen, NULL, 0, 0, 0, KVT_STRING};
        rc = 0;
        if (atomic_load_explicit(&b->nkeys[v.bucket], memory_order_relaxed)) {
            add(&b->st.load_reads, 1);
            rc = bosc_chain_read(b, v.bucket, v.gen, &s, &chain, &nchain, &capchain, NULL, err, sizeof err);
            if (!rc && bosc_stream_walk((unsigned char *)s.p, s.len, find_rec, &f) < 0)
                rc = bosc_stream_damaged(b, v.bucket, err, sizeof err);
        }
        if (rc < 0 && !still_valid(&v) && tries < 1000)
            continue; /* read while the flusher wrote it */
        if (rc < 0) {
            fail(b, err);
            break;
        }
        rc = kvt_load(b->t, key, klen, f.val, f.vlen, f.found, f.expire, f.type, still_valid, &v);
        stream = f.found && f.type == KVT_STREAM;
        if (rc == -EAGAIN)
            continue;
        break;
    }
    if (stream && rc < 0 && rc != -ENOMEM && !atomic_load(&b->failed)) { /* a stream's record or batch is damaged or missing */
        snprintf(err, sizeof err, "data file %s damaged: the stream %.*s%s cannot be read back (%s)", b->path,
                 (int)(klen > 64 ? 64 : klen), (const char *)key, klen > 64 ? "..." : "",
                 rc == -EBADMSG ? "its record is malformed" : rc == -ENOENT ? "a batch segment is missing"
                 : rc == -EILSEQ ? "a batch fails its checksum" : strerror(-rc));
        fail(b, err);
    }
    free(s.p);
    free(chain);
    return rc < 0 ? rc : 0;
}

int bosc_request_load(struct bosc *b, const void *key, size_t klen, int evfd)
{
    struct load_req *r = malloc(sizeof *r + klen);
    if (!r)
        return -ENOMEM;
    r->next = NULL;
    r->evfd = evfd;
    r->klen = (uint32_t)klen;
    memcpy(r->key, key, klen);
    pthread_mutex_lock(&b->lock);
    if (b->ltail)
        b->ltail->next = r;
    else
        b->lhead = r;
    b->ltail = r;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
    return 0;
}

static void wake(int fd)
{
    uint64_t one = 1;
    ssize_t w = write(fd, &one, sizeof one);
    (void)w;
}

void bosc_wake_all(struct bosc *b)
{
    int n = atomic_load_explicit(&b->nsubs, memory_order_acquire);
    for (int i = 0; i < n; i++)
        wake(b->subs[i]);
}

void *bosc_loader_main(void *arg)
{
    struct bosc *b = arg;
    pthread_mutex_lock(&b->lock);
    while (!b->stop) {
        struct load_req *r = b->lhead;
        if (!r) {
            /* No load waits: a step of a key listing, if one is asked for
             * (loads go first: a GET must not wait behind a SCAN's reads). */
            struct keys_slot *k = bosc_keys_next(b);
            if (!k) {
                pthread_cond_wait(&b->cond, &b->lock);
                continue;
            }
            pthread_mutex_unlock(&b->lock);
            bosc_keys_work(b, k);
            pthread_mutex_lock(&b->lock);
            continue;
        }
        b->lhead = r->next;
        if (!b->lhead)
            b->ltail = NULL;
        pthread_mutex_unlock(&b->lock);
        bosc_load(b, r->key, r->klen); /* a failure is kept in b->error; the request sees it */
        wake(r->evfd);
        free(r);
        pthread_mutex_lock(&b->lock);
    }
    pthread_mutex_unlock(&b->lock);
    return NULL;
}
