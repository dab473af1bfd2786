/* bosc_open.c - the BOSC data file (see bosc.h): open (create or scan), start,
 * close and statistics; the flusher is in bosc_sweep.c, the loader in bosc_load.c.
 * Threads: the flusher owns the free-block lists and writes blocks; the loader
 * reads them; pollers only read nkeys[] (relaxed) through maybe_on_disk and
 * queue load requests. A bucket's version (seqlock: odd while its blocks are
 * being written) and the generation tell the loader that what it read is stale.
 * Parses untrusted bytes (the file): every length and chain is bounded. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/bytes.h"
#include "core/crc32c.h"
#include "core/kvbuf.h"
#include "core/ldu.h"
#include "core/log.h"
#include "core/table.h"
#include "durability/bosc_int.h"
#include "durability/wal.h"

/* ---- open, scan, close */

static int create_file(struct bosc *b, uint32_t buckets, char *err, size_t errlen)
{
    uint64_t k[2];
    if (getrandom(k, sizeof k, 0) != sizeof k) {
        snprintf(err, errlen, "getrandom: %s", strerror(errno));
        return -errno;
    }
    b->k0 = k[0];
    b->k1 = k[1];
    b->nbuckets = buckets;
    int rc = bosc_layout(b, err, errlen);
    if (rc)
        return rc;
    atomic_store(&b->nblocks, b->first_over);
    b->sb_seq = 0;
    b->wseq = 1;
    if (ftruncate(b->fd, (off_t)(b->first_over * BLK))) { /* sparse: empty buckets cost no disk */
        snprintf(err, errlen, "cannot size %s: %s", b->path, strerror(errno));
        return -errno;
    }
    rc = bosc_sb_write(b, 0, 1);
    if (rc) {
        snprintf(err, errlen, "cannot write %s: %s", b->path, strerror(-rc));
        return rc;
    }
    /* the file's name must survive a crash too */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", b->path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

/* Allocate the bucket table's pages, both copies. A copy never written is a
 * hole in the sparse file: its first write, after a sweep's chains are written
 * and synced, could fail on a full disk (ENOSPC), and a table write that fails
 * fails the data file (the chains' keys neither settled nor queued again). Best
 * effort: where the file system cannot (or the disk is full now) it stays as
 * it was. */
static void prealloc_table(struct bosc *b)
{
    off_t off = (off_t)FIRST_TABLE * BLK, len = (off_t)(b->first_home - FIRST_TABLE) * BLK;
    if (len > 0 && fallocate(b->fd, 0, off, len) && errno != EOPNOTSUPP)
        kvlog(KVLOG_WARNING, "data file %s: cannot allocate its bucket table's %lld bytes (%s): a full disk may "
              "then fail the file at a table write", b->path, (long long)len, strerror(errno));
}

struct scan_arg {
    struct bosc *b;
    uint32_t bucket;
};

static void scan_rec(void *arg, const unsigned char *rec, size_t reclen, const unsigned char *key, uint32_t klen,
                     const unsigned char *val, uint32_t vlen, int64_t expire, int type)
{
    struct scan_arg *a = arg;
    if (expire)
        ttl_mark(a->b, a->bucket, expire); /* the expiry pass looks at this bucket then */
    if (type == KVT_STREAM) /* the batches it refers to are live (a malformed record is found when loaded) */
        (void)xs_refs(val, vlen, bosc_count_refs, a->b);
}

/* Open (scan): bucket bk's newest home copy, never recorded in the bucket table,
 * leads to a broken chain (pk, err: what was found). Use the other copy if it is
 * whole and as new as the table records (bosc_chain_read_other), log it, and
 * clear the broken copy; else report the damage found first. */
static int fall_back(struct bosc *b, uint32_t bk, uint64_t gen, struct chain_pick *pk, struct kvbuf *s, uint32_t **chain,
                     size_t *nchain, size_t *capchain, char *err, size_t errlen)
{
    char why[512];
    snprintf(why, sizeof why, "%s", err);
    struct chain_pick bad = *pk;
    uint64_t home = home_of(b, bk);
    int rc = bosc_chain_read_other(b, bk, gen, bad.slot, s, chain, nchain, capchain, pk, err, errlen);
    if (rc) { /* no whole older copy: what the newest chain says is the damage to report */
        snprintf(err, errlen, "%s", why);
        *pk = bad;
        return -EILSEQ;
    }
    kvlog(KVLOG_WARNING, "data file %s: bucket %" PRIu32 "'s newest home copy (block %" PRIu64 ", sweep %" PRIu64
          ", never recorded in the bucket table) leads to a broken chain (%s): its sweep was cut short before it "
          "was synced; using the older copy (block %" PRIu64 ", sweep %" PRIu64 "), which the table records (the "
          "log holds the changes since)", b->path, bk, home + (uint64_t)bad.slot, bad.seq, why,
          home + (uint64_t)pk->slot, pk->seq);
    /* Clear the newest copy (synced with what the scan found, before the flusher
     * writes): left, it would be picked again as the newer by every later read. */
    static const unsigned char zero[BLK];
    if ((rc = pwrite_all(b->fd, zero, BLK, (off_t)((home + (uint64_t)bad.slot) * BLK)))) {
        snprintf(err, errlen, "cannot clear block %" PRIu64 " of %s: %s", home + (uint64_t)bad.slot, b->path,
                 strerror(-rc));
        return rc;
    }
    return 0;
}

/* Read every chain (checked against the bucket table): per-bucket record
 * counts, the buckets holding records with an expire time, the free overflow
 * blocks, the home copy holding each bucket's chain and the next sweep's
 * sequence (above every one found: a sweep cut short by a crash may have
 * written blocks it never recorded). */
static int scan(struct bosc *b, uint64_t gen, struct bosc_open_info *info, char *err, size_t errlen)
{
    uint64_t nb = atomic_load(&b->nblocks);
    uint8_t *used = calloc((nb + 7) / 8, 1);
    struct kvbuf s = {0};
    uint32_t *chain = NULL;
    size_t nchain = 0, capchain = 0;
    int rc = used ? 0 : -ENOMEM;
    int64_t total = 0;
    uint64_t maxseq = b->done_seq;
    /* Buckets whose latest writes are lost: all of them are reported (the first
     * one's details, then the list), not just the first. */
    uint32_t nlost = 0;
    char first[512] = "", list[256] = "";
    size_t listed = 0;
    for (uint32_t bk = 0; bk < b->nbuckets && !rc; bk++) {
        /* Skip holes cheaply: a bucket never written is a hole in the sparse
         * file. Not one the table records as written: a hole there is a lost block. */
        uint64_t want = atomic_load_explicit(&b->tab[bk], memory_order_relaxed);
        if (!want) {
            off_t home = (off_t)(home_of(b, bk) * BLK);
            off_t data = lseek(b->fd, home, SEEK_DATA);
            uint64_t skip = 0, n = 0;
            if (data < 0 && errno == ENXIO)
                skip = b->nbuckets - bk; /* nothing but holes from here on */
            else if (data > home)
                skip = (uint64_t)(data - home) / (2 * BLK);
            while (n < skip && bk + n < b->nbuckets && !atomic_load_explicit(&b->tab[bk + n], memory_order_relaxed))
                n++;
            if (n) {
                bk += (uint32_t)(n - 1);
                continue;
            }
        }
        struct chain_pick pk;
        rc = bosc_chain_read(b, bk, gen, &s, &chain, &nchain, &capchain, &pk, err, errlen);
        if (rc == -EILSEQ && pk.seq > want) {
            /* The newest copy, never recorded, leads to a broken chain: its sweep
             * was cut short (power cut) after the home copy reached the disk but
             * not every overflow block. Nothing counts on it (the flushed LSN
             * moves only once every chain of a sweep is recorded: the log still
             * holds what it held): the recorded copy is used instead. */
            maxseq = pk.seq > maxseq ? pk.seq : maxseq;
            rc = fall_back(b, bk, gen, &pk, &s, &chain, &nchain, &capchain, err, errlen);
        }
        if (rc == -EILSEQ && pk.lost) {
            if (!nlost++)
                snprintf(first, sizeof first, "%s", err);
            if (listed < sizeof list - 16)
                listed += (size_t)snprintf(list + listed, sizeof list - listed, "%s%" PRIu32, listed ? ", " : "", bk);
            else if (!strstr(list, "..."))
                snprintf(list + listed, sizeof list - listed, ", ...");
            rc = 0;
            continue;
        }
        if (rc)
            break;
        b->slot[bk] = (uint8_t)pk.slot;
        maxseq = pk.seq > maxseq ? pk.seq : maxseq;
        maxseq = want > maxseq ? want : maxseq;
        struct scan_arg sa = {b, bk};
        int64_t cnt = bosc_stream_walk((unsigned char *)s.p, s.len, scan_rec, &sa);
        if (cnt < 0) {
            rc = bosc_stream_damaged(b, bk, err, errlen);
            break;
        }
        atomic_store_explicit(&b->nkeys[bk], (uint32_t)cnt, memory_order_relaxed);
        total += cnt;
        for (size_t i = 1; i < nchain; i++) {
            if (used[chain[i] / 8] & (1u << (chain[i] % 8))) {
                snprintf(err, errlen, "data file %s damaged: block %" PRIu32 " is in two chains", b->path,
                         chain[i]);
                rc = -EILSEQ;
                break;
            }
            used[chain[i] / 8] |= (uint8_t)(1u << (chain[i] % 8));
            info->overflow_blocks++;
        }
    }
    if (!rc && nlost) {
        snprintf(err, errlen, "%s (%" PRIu32 " bucket(s) of %" PRIu32 " lost writes so: %s)", first, nlost,
                 b->nbuckets, list);
        rc = -EILSEQ;
    }
    b->wseq = maxseq + 1;
    for (uint64_t no = b->first_over; no < nb && !rc; no++)
        if (!(used[no / 8] & (1u << (no % 8))) && bosc_push_u32(&b->free_blk, &b->nfree, &b->capfree, (uint32_t)no))
            rc = -ENOMEM;
    free(used);
    free(s.p);
    free(chain);
    info->disk_keys = (uint64_t)total;
    kvt_disk_keys_set(b->t, total);
    return rc;
}

int bosc_open(struct bosc **out, struct kv_table *t, const struct bosc_config *cfg,
              struct bosc_open_info *info, char *err, size_t errlen)
{
    uint64_t t0 = now_ns();
    memset(info, 0, sizeof *info);
    struct bosc *b = calloc(1, sizeof *b);
    if (!b)
        return -ENOMEM;
    b->t = t;
    b->fd = -1;
    b->io.dfd = -1;
    snprintf(b->path, sizeof b->path, "%s", cfg->path);
    snprintf(b->log_dir, sizeof b->log_dir, "%s", cfg->log_dir ? cfg->log_dir : "");
    b->interval_ms = cfg->flush_interval_ms ? cfg->flush_interval_ms : 1000;
    b->chunk_pct = cfg->sweep_chunk_pct > 100 ? 100 : cfg->sweep_chunk_pct;
    b->chunk_items = cfg->sweep_chunk_items;
    pthread_mutex_init(&b->lock, NULL);
    pthread_mutex_init(&b->gen_lock, NULL);
    pthread_mutex_init(&b->flush_lock, NULL);
    pthread_mutex_init(&b->qlock, NULL);
    b->locked_queue = cfg->locked_queue;
    const char *tear = getenv("KVSTORE_FAULT_TEAR_HOME_WRITE"); /* tests only (bosc_int.h) */
    b->tear_at = tear ? strtoull(tear, NULL, 10) : 0;
    pthread_cond_init(&b->cond, NULL);
    pthread_cond_init(&b->done, NULL);
    pthread_cond_init(&b->keys_cond, NULL);
    ldu_queue_init(&b->q);
    int rc = 0;
    uint64_t flushed = 0, gen = 1;
    b->fd = open(cfg->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    struct stat st;
    if (b->fd < 0 || fstat(b->fd, &st)) {
        rc = -errno;
        snprintf(err, errlen, "cannot open data file %s: %s", cfg->path, strerror(errno));
        goto fail;
    }
    if ((rc = bosc_io_open(b, cfg->io_mode, err, errlen)))
        goto fail;
    unsigned char first[2 * BLK];
    int fresh = st.st_size == 0;
    if (!fresh && st.st_size >= (off_t)sizeof first && !pread_all(b->fd, first, sizeof first, 0))
        fresh = bosc_all_zero(first, sizeof first); /* created, crashed before its superblock */
    if (fresh) {
        uint32_t buckets = cfg->buckets ? cfg->buckets : 65536;
        rc = create_file(b, buckets, err, errlen);
    } else {
        rc = bosc_sb_read(b, &flushed, &gen, err, errlen);
        if (!rc)
            rc = bosc_tab_read(b, err, errlen);
        /* Chains may use blocks past the count the superblock recorded (a sweep
         * that grew the file, then a crash before the next superblock): the file
         * size says how far blocks were written. */
        uint64_t on_disk = (uint64_t)st.st_size / BLK;
        if (!rc && on_disk > MAX_BLOCKS)
            on_disk = MAX_BLOCKS;
        /* never past the end of the file either: a damaged count must not make
         * the scan walk (or allocate for) blocks that do not exist */
        if (!rc && on_disk >= b->first_over)
            atomic_store(&b->nblocks, on_disk);
    }
    if (rc)
        goto fail;
    b->nkeys = calloc(b->nbuckets, sizeof *b->nkeys);
    b->ver = calloc(b->nbuckets, sizeof *b->ver);
    b->exp_min = calloc(b->nbuckets, sizeof *b->exp_min);
    /* The expiry pass reads at most this many blocks per flush interval: a whole
     * turn over the buckets in about 256 intervals, never more than 256 blocks
     * (1 MiB) an interval, so it stays small beside a sweep under write load. */
    b->pass_budget = b->nbuckets / 256 < 16 ? 16 : b->nbuckets / 256 > 256 ? 256 : b->nbuckets / 256;
    if (!b->nkeys || !b->ver || !b->exp_min) {
        rc = -ENOMEM;
        snprintf(err, errlen, "out of memory for %" PRIu32 " buckets", b->nbuckets);
        goto fail;
    }
    atomic_store(&b->gen, gen);
    atomic_store(&b->flushed_lsn, flushed);
    b->bs_gen = gen;
    char bsdir[sizeof b->path + 16];
    snprintf(bsdir, sizeof bsdir, "%s.batches", b->path);
    if ((rc = bstore_open(&b->bs, bsdir, err, errlen)))
        goto fail;
    prealloc_table(b);
    rc = scan(b, gen, info, err, errlen);
    /* What the scan found must be on disk before the flusher writes the other
     * home copies (after a killed process, the page cache may hold the newest). */
    if (!rc && fdatasync(b->fd)) {
        rc = -errno;
        snprintf(err, errlen, "cannot sync data file %s: %s", b->path, strerror(errno));
    }
    if (rc)
        goto fail;
    struct kvt_spill sp = {&b->q, b->locked_queue ? &b->qlock : NULL, bosc_hook_maybe_on_disk, bosc_hook_flushall,
                           bosc_hook_load_sync, bosc_make_room, b, bosc_hook_stage_batch, bosc_hook_fetch_batch,
                           bosc_hook_batch_durable};
    kvt_set_spill(t, &sp);
    info->flushed_lsn = flushed;
    info->generation = gen;
    info->buckets = b->nbuckets;
    info->blocks = atomic_load(&b->nblocks);
    info->seconds = (double)(now_ns() - t0) / 1e9;
    *out = b;
    return 0;
fail:
    bstore_close(b->bs);
    bosc_io_close(b);
    if (b->fd >= 0)
        close(b->fd);
    free(b->tab);
    free(b->slot);
    free(b->tslot);
    free(b->nkeys);
    free(b->ver);
    free(b->exp_min);
    free(b->free_blk);
    free(b);
    return rc;
}

void bosc_set_log(struct bosc *b, struct wal *w)
{
    b->wal = w;
}

int bosc_start(struct bosc *b)
{
    if (pthread_create(&b->flusher, NULL, bosc_flusher_main, b))
        return -EAGAIN;
    if (pthread_create(&b->loader, NULL, bosc_loader_main, b)) {
        pthread_mutex_lock(&b->lock);
        b->stop = 1;
        pthread_cond_broadcast(&b->cond);
        pthread_mutex_unlock(&b->lock);
        pthread_join(b->flusher, NULL);
        return -EAGAIN;
    }
    kvt_set_lazy_batches(b->t, 1); /* the loader serves batch loads from now on (replay is done) */
    /* named, so a profiler (perf record -t, top -H) finds them */
    pthread_setname_np(b->flusher, "kv-flusher");
    pthread_setname_np(b->loader, "kv-loader");
    b->started = 1;
    return 0;
}

int bosc_subscribe(struct bosc *b, int evfd)
{
    int n = atomic_load(&b->nsubs);
    if (n >= MAX_SUBS)
        return -ENOSPC;
    b->subs[n] = evfd;
    atomic_store_explicit(&b->nsubs, n + 1, memory_order_release);
    return 0;
}

void bosc_close(struct bosc *b)
{
    if (!b)
        return;
    if (b->started) {
        pthread_mutex_lock(&b->lock);
        b->stop = 1;
        pthread_cond_broadcast(&b->cond);
        pthread_cond_broadcast(&b->done);
        pthread_cond_broadcast(&b->keys_cond);
        pthread_mutex_unlock(&b->lock);
        pthread_join(b->flusher, NULL);
        pthread_join(b->loader, NULL);
    }
    bosc_keys_free_all(b);
    /* Hand every queued node back to its entry (still dirty: the log has it),
     * free the orphans, then detach: the table works on without a data file. */
    struct ldu_node *list = ldu_take(&b->q);
    for (struct ldu_node *n = list, *next; n; n = next) {
        next = n->next;
        struct kvt_snap none = {.kind = KVT_SNAP_NONE};
        kvt_flushed(b->t, kvt_dnode_of(n), &n, 1, &none, 0, 0, &b->q);
    }
    for (struct ldu_node *n = ldu_take(&b->q), *next; n; n = next) { /* what those re-queued */
        next = n->next;
        ldu_release(ldu_obj_of(n), n);
    }
    struct kvt_spill none = {0};
    kvt_set_spill(b->t, &none);
    kvt_disk_keys_set(b->t, 0);
    for (struct load_req *r = b->lhead, *next; r; r = next) {
        next = r->next;
        free(r);
    }
    bosc_io_close(b);
    close(b->fd);
    bstore_close(b->bs);
    free(b->tab);
    free(b->slot);
    free(b->tslot);
    free(b->touched);
    free(b->nkeys);
    free(b->ver);
    free(b->exp_min);
    free(b->free_blk);
    free(b->freed);
    pthread_mutex_destroy(&b->lock);
    pthread_mutex_destroy(&b->gen_lock);
    pthread_mutex_destroy(&b->flush_lock);
    pthread_mutex_destroy(&b->qlock);
    pthread_cond_destroy(&b->cond);
    pthread_cond_destroy(&b->done);
    pthread_cond_destroy(&b->keys_cond);
    free(b);
}

int bosc_failed(struct bosc *b) { return atomic_load(&b->failed); }
const char *bosc_error(struct bosc *b) { return b->error; }

void bosc_set_latmon(struct bosc *b, struct latmon *lm)
{
    atomic_store_explicit(&b->latmon, lm, memory_order_release);
}

void bosc_get_stats(struct bosc *b, struct bosc_stats *st)
{
    memset(st, 0, sizeof *st);
#define L(f) atomic_load_explicit(&b->st.f, memory_order_relaxed)
    st->sweeps = L(sweeps);
    st->records = L(records);
    st->blocks_read = L(blocks_read);
    st->blocks_written = L(blocks_written);
    st->bytes_written = L(bytes_written);
    st->syncs = L(syncs);
    st->sweep_ns = L(sweep_ns);
    st->io_ns = L(io_ns);
    st->deferred = L(deferred);
    st->loads = L(loads);
    st->load_reads = L(load_reads);
    st->evicted = L(evicted);
    st->evicted_bytes = L(evicted_bytes);
    st->truncated_segments = L(truncated);
    st->expired_found = L(expired_found);
    st->expired_reclaimed = L(expired_reclaimed);
    st->expire_pass_blocks = L(expire_pass_blocks);
    st->expire_passes = L(expire_passes);
    st->key_listings = L(key_listings);
    st->key_listing_blocks = L(key_listing_blocks);
    st->key_listings_dropped = L(key_listings_dropped);
    st->bytes_read = L(bytes_read);
    st->read_calls = L(read_calls);
    st->write_calls = L(write_calls);
    st->flusher_cpu_ns = L(flusher_cpu_ns);
    st->sweep_chunks = L(chunks);
    st->chunk_evicted = L(chunk_evicted);
    struct bstore_stats bss;
    bstore_stats(b->bs, &bss);
    st->batch_segments = bss.segments;
    st->batch_file_bytes = bss.file_bytes;
    st->batch_live_bytes = bss.live_bytes;
    st->batches_written = bss.batches;
    st->batch_reads = bss.reads;
#undef L
    st->flushed_lsn = atomic_load(&b->flushed_lsn);
    st->buckets = b->nbuckets;
    st->blocks = atomic_load_explicit(&b->nblocks, memory_order_relaxed);
    st->queued = atomic_load_explicit(&b->q.pushes, memory_order_relaxed);
    struct kvt_stats ts;
    kvt_get_stats(b->t, &ts);
    st->disk_keys = ts.disk_keys;
    pthread_mutex_lock(&b->lock);
    st->failed = atomic_load(&b->failed);
    snprintf(st->error, sizeof st->error, "%s", b->error);
    pthread_mutex_unlock(&b->lock);
}
