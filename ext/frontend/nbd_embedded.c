/* nbd_embedded.c - the block device's "embedded" backend: the engine of this
 * process, no network. Each NBD thread has one session (engine/session.h; not a
 * listed client, authenticated) and runs its block operations through ses_run
 * as GET / SET / DEL with argv pointing at the op's key and buffer, so the
 * table, the log and the data file see exactly what a RESP client's requests do.
 * (A GET the table answers from memory skips the session: see run().)
 *   DONE / HOLD  the op completes now (the write is in memory, visible to every
 *                connection; HOLD's LSN is what a later SYNC waits for)
 *   STALL        the op (and those queued behind it) runs again when the
 *                thread's eventfd fires (the data file loaded the key, or freed memory)
 *   SYNC         waits until the log's durable LSN reaches eng_log_appended()
 *                read at submit: every write completed before is then durable
 * A SYNC keeps its target LSN in op->block (a SYNC has no block). One context per
 * NBD thread; every callback on that thread except open/close (control thread). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/log.h"
#include "core/table.h"
#include "durability/wal.h"
#include "engine/engine.h"
#include "engine/session.h"
#include "frontend/nbd_backend.h"

#define EMB_KEY_MAX 512

struct emb {
    struct kv_engine *eng;
    struct session ses;
    struct kvbuf out;          /* ses_run's reply of the op being run */
    int evfd, epfd, slot;      /* slot: wal_want's cache */
    struct nbd_watch w;
    char key[EMB_KEY_MAX];
    const char *prefix;
    uint32_t bs;
    struct nbd_kvop *qhead, *qtail;   /* submitted, not yet run, in order */
    struct nbd_kvop *syncs;           /* SYNCs waiting for the durable LSN */
    uint64_t want;                    /* the LSN wal_want was last given */
    uint64_t pending;
    int stalled;                      /* the head op stalled: wait for evfd */
    int running;                      /* inside run(): completions may submit more */
    struct nbd_backend_stats st;
};

/* Run one request to its end on the control thread (open: the thread is not
 * running), waiting out a stall (the key in the data file): the reply in e->out. */
static int run_blocking(struct emb *e, int argc, const char **argv, const size_t *argl)
{
    for (;;) {
        e->out.len = 0;
        int r = ses_run(&e->ses, argc, argv, argl);
        if (r != SES_STALL)
            return r < 0 ? r : 0;
        if ((r = ses_wait(&e->ses)) < 0)
            return r;
    }
}

/* Thread 0's open: the device's record (nbd_backend.h) read, and stored for a new
 * or grown device. A node still waiting for its state (remote mode, from its peer)
 * cannot say: not checked then, with a warning. */
static int check_meta(struct emb *e, const struct nbd_backend_cfg *cfg, char *err, size_t errlen)
{
    if (atomic_load_explicit(&e->eng->loading, memory_order_acquire)) {
        kvlog(KVLOG_WARNING, "blockdev: the node is loading its state: the device's size and block size are not "
                             "checked against the record in the store");
        return 0;
    }
    char key[EMB_KEY_MAX], rec[NBD_META_MAX + 1];
    int kl = snprintf(key, sizeof key, "%s" NBD_META_SUFFIX, e->prefix);
    const char *argv[3] = {"GET", key, rec};
    size_t argl[3] = {3, (size_t)kl, 0};
    int rc = run_blocking(e, 2, argv, argl);
    if (rc < 0) {
        snprintf(err, errlen, "reading the device's record (key \"%s\"): %s", key, strerror(-rc));
        return rc;
    }
    const char *p = e->out.p, *have = NULL;
    size_t n = e->out.len, len = 0;
    if (n >= 4 && p[0] == '$' && p[1] != '-') {
        size_t i = 1;
        while (i < n && p[i] >= '0' && p[i] <= '9')
            len = len * 10 + (size_t)(p[i++] - '0');
        have = i + 2 + len <= n ? p + i + 2 : NULL;
    }
    if (!have && !(n >= 3 && !memcmp(p, "$-1", 3))) {
        snprintf(err, errlen, "reading the device's record (key \"%s\"): %.*s", key,
                 n > 2 ? (int)(n > 200 ? 200 : n - 2) : 0, p);
        return -EIO;
    }
    if ((rc = nbd_meta_check(have, len, cfg, rec, sizeof rec, err, errlen)) <= 0)
        return rc;
    argv[0] = "SET";
    argl[2] = strlen(rec);
    if ((rc = run_blocking(e, 3, argv, argl)) < 0)
        snprintf(err, errlen, "storing the device's record (key \"%s\"): %s", key, strerror(-rc));
    else if (e->out.len && e->out.p[0] == '-') {
        snprintf(err, errlen, "storing the device's record (key \"%s\"): %.*s", key,
                 (int)(e->out.len > 200 ? 200 : e->out.len - 2), e->out.p);
        rc = -EIO;
    }
    e->out.len = 0;
    return rc;
}

static void emb_close(void *ctx);

static int emb_open(void **out, const struct nbd_backend_cfg *cfg, char *err, size_t errlen)
{
    if (!cfg->eng) {
        snprintf(err, errlen, "backend embedded needs the engine of this process (use kvstore.BlockDevice "
                              "or `kvstore blockdev serve --backend embedded`)");
        return -EINVAL;
    }
    if (strlen(cfg->key_prefix) > EMB_KEY_MAX - 24) {
        snprintf(err, errlen, "key prefix too long: at most %d bytes", EMB_KEY_MAX - 24);
        return -EINVAL;
    }
    struct emb *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    e->eng = cfg->eng;
    e->prefix = cfg->key_prefix; /* the server's copy outlives the context */
    e->bs = cfg->block_size;
    e->epfd = cfg->epfd;
    e->slot = -1;
    e->want = 0; /* a new subscriber wants every move, until the thread says otherwise */
    e->w.kind = NBD_WATCH_BACKEND;
    e->w.ctx = e;
    e->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    int rc = e->evfd < 0 ? -errno : 0;
    if (rc < 0)
        snprintf(err, errlen, "eventfd: %s", strerror(-rc));
    else if ((rc = ses_subscribe(e->eng, e->evfd, err, errlen)) == 0) {
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &e->w};
        if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->evfd, &ev) < 0) {
            rc = -errno;
            snprintf(err, errlen, "epoll_ctl: %s", strerror(-rc));
        }
    }
    if (rc < 0) {
        if (e->evfd >= 0)
            close(e->evfd);
        free(e);
        return rc;
    }
    char addr[32];
    snprintf(addr, sizeof addr, "nbd:%d", cfg->thread);
    ses_init(&e->ses, e->eng, &e->out, addr, cfg->thread, e->evfd);
    e->ses.cl.authenticated = 1; /* the server's own session: no AUTH */
    if (cfg->thread == 0 && (rc = check_meta(e, cfg, err, errlen)) < 0) {
        emb_close(e);
        return rc;
    }
    *out = e;
    return 0;
}

static void emb_close(void *ctx)
{
    struct emb *e = ctx;
    if (!e)
        return;
    /* The log and the data file keep the eventfd in their wake-up lists (they
     * have no removal): it stays open, and unused, until the process ends, so
     * that a wake-up never writes into a reused descriptor. */
    epoll_ctl(e->epfd, EPOLL_CTL_DEL, e->evfd, NULL);
    ses_free(&e->ses);
    kvbuf_free(&e->out);
    free(e);
}

static int emb_submit(void *ctx, struct nbd_kvop *op)
{
    struct emb *e = ctx;
    /* covers every write completed before now: the log's own appended LSN, not
     * eng_log_appended (while the disk refuses the log, that one says the durable
     * LSN, for counters: a FLUSH would cover nothing and succeed at once) */
    if (op->kind == NBD_KV_SYNC)
        op->block = e->eng->wal ? wal_appended_lsn(e->eng->wal) : 0;
    op->next = NULL;
    if (e->qtail)
        e->qtail->next = op;
    else
        e->qhead = op;
    e->qtail = op;
    e->pending++;
    return 0;
}

static void complete(struct emb *e, struct nbd_kvop *op, int rc)
{
    op->rc = rc;
    if (rc < 0) /* one writer; add_stats reads it from any thread */
        __atomic_store_n(&e->st.errors, e->st.errors + 1, __ATOMIC_RELAXED);
    e->pending--;
    op->done(op);
}

/* The reply of a GET into op->buf: "$N\r\n<N bytes>\r\n" or "$-1\r\n" (absent:
 * zeros); an error reply is -EIO. A value that is not one block (written by
 * hand over RESP) is cut or padded with zeros. */
static int get_reply(struct emb *e, struct nbd_kvop *op)
{
    const char *p = e->out.p;
    size_t n = e->out.len;
    if (n >= 5 && p[0] == '$' && p[1] == '-') {
        memset(op->buf, 0, e->bs);
        return 0;
    }
    if (n < 4 || p[0] != '$')
        return -EIO;
    size_t len = 0, i = 1;
    while (i < n && p[i] >= '0' && p[i] <= '9')
        len = len * 10 + (size_t)(p[i++] - '0');
    if (i + 2 + len > n)
        return -EIO;
    size_t take = len < e->bs ? len : e->bs;
    memcpy(op->buf, p + i + 2, take);
    memset(op->buf + take, 0, e->bs - take);
    return 0;
}

/* An error reply's errno: out of memory (-OOM) is ENOSPC, the rest EIO. */
static int error_reply(struct emb *e)
{
    static struct kvlog_rate rate = KVLOG_RATE_INIT(5);
    int len = (int)(e->out.len > 200 ? 200 : e->out.len);
    kvlog_rated(&rate, KVLOG_WARNING, "NBD embedded backend: %.*s", len > 2 ? len - 2 : len, e->out.p);
    return e->out.len >= 4 && !memcmp(e->out.p, "-OOM", 4) ? -ENOSPC : -EIO;
}

/* Run op through the session: SES_DONE / SES_HOLD (rc set) or SES_STALL. */
static int run(struct emb *e, struct nbd_kvop *op, int *rc)
{
    const char *argv[3];
    size_t argl[3];
    int kl = nbd_key(e->key, sizeof e->key, e->prefix, op->block);
    if (kl < 0) {
        *rc = kl;
        return SES_DONE;
    }
    argv[1] = e->key;
    argl[1] = (size_t)kl;
    int argc = 2;
    if (op->kind == NBD_KV_GET && !atomic_load_explicit(&e->eng->loading, memory_order_acquire)) {
        /* The hot path of reads: the block straight from the table into op->buf,
         * one copy instead of two (the RESP reply, then out of it), no command
         * dispatch. What the table cannot answer from memory (a key that left it
         * for the data file, a value that is not a block, another type) goes
         * through the session's GET below, which loads, stalls and errs as GET does. */
        int64_t n = kvt_get_copy(e->eng->table, e->key, (size_t)kl, op->buf, e->bs);
        if (n == -ENOENT || (n >= 0 && n <= e->bs)) {
            size_t got = n < 0 ? 0 : (size_t)n;
            memset(op->buf + got, 0, e->bs - got);
            *rc = 0;
            return SES_DONE;
        }
    }
    switch (op->kind) {
    case NBD_KV_GET: argv[0] = "GET"; argl[0] = 3; break;
    case NBD_KV_PUT:
        argv[0] = "SET";
        argl[0] = 3;
        argv[2] = op->buf;
        argl[2] = e->bs;
        argc = 3;
        break;
    case NBD_KV_DEL: argv[0] = "DEL"; argl[0] = 3; break;
    default: *rc = -EINVAL; return SES_DONE;
    }
    e->out.len = 0;
    int r = ses_run(&e->ses, argc, argv, argl);
    if (r < 0) {
        *rc = -EIO;
        return SES_DONE;
    }
    if (r == SES_STALL)
        return SES_STALL;
    if (e->out.len && e->out.p[0] == '-')
        *rc = error_reply(e);
    else
        *rc = op->kind == NBD_KV_GET ? get_reply(e, op) : 0;
    e->out.len = 0;
    return r;
}

/* SYNCs whose target the log reached complete; the others complete with -EIO
 * once the log has failed, or while the disk refuses it (wal_write_error: the
 * covered writes are not durable now, and may not be for long; the client sees
 * the error and may FLUSH again, as after a disk's failed cache flush). Then tell
 * the log when to wake this thread next. */
static void check_syncs(struct emb *e)
{
    struct wal *w = e->eng->wal;
    for (;;) {
        uint64_t durable = w ? wal_durable_lsn(w) : UINT64_MAX;
        int failed = w && (wal_failed(w) || wal_write_error(w, NULL, 0));
        struct nbd_kvop **pp = &e->syncs, *done = NULL;
        uint64_t next = UINT64_MAX;
        while (*pp) {
            struct nbd_kvop *op = *pp;
            if (failed || op->block <= durable) {
                *pp = op->next;
                op->next = done;
                done = op;
            } else {
                next = op->block < next ? op->block : next;
                pp = &op->next;
            }
        }
        while (done) {
            struct nbd_kvop *op = done;
            done = op->next;
            complete(e, op, op->block <= durable ? 0 : -EIO);
        }
        if (!w || next == e->want)
            return;
        e->want = next;
        /* published before the durable LSN is read again: a move past next after
         * this read wakes the eventfd; one before it is seen here */
        if (wal_want(w, &e->slot, e->evfd, next) < next || next == UINT64_MAX)
            return;
    }
}

/* Batched lookups, as the poller's process_input does (kvt_prefetch): the table
 * lines of the queued ops (GET, SET and DEL all look their key up) are pulled in
 * batches of EMB_PREFETCH, kept 1.5x to 2.5x EMB_PREFETCH ahead of the op being run, so
 * their cache misses (the bucket slot, the entry's first line: a miss each per
 * block) overlap instead of being paid one after another inside the lookup.
 * Only ever prefetches. */
#define EMB_PREFETCH 16
/* Prefetch up to EMB_PREFETCH ops from op on; returns the last one prefetched. */
static struct nbd_kvop *prefetch_batch(struct emb *e, struct nbd_kvop *op, int *count)
{
    struct kv_table *t = e->eng->table;
    uint64_t h[EMB_PREFETCH];
    int n = 0;
    struct nbd_kvop *last = NULL;
    for (; op && n < EMB_PREFETCH; op = op->next) {
        last = op;
        (*count)++;
        int kl;
        if (op->kind == NBD_KV_SYNC || (kl = nbd_key(e->key, sizeof e->key, e->prefix, op->block)) < 0)
            continue;
        h[n] = kvt_hash(e->key, (size_t)kl);
        kvt_prefetch(t, h[n++], 1);
    }
    if (n < 2) /* a lone op: its lookup follows at once, nothing to overlap */
        return last;
    for (int stage = 2; stage <= 3; stage++)
        for (int i = 0; i < n; i++)
            kvt_prefetch(t, h[i], stage);
    return last;
}

static void run_queue(struct emb *e)
{
    if (e->running) /* a completion submitted more: the loop below takes it */
        return;
    e->running = 1;
    struct nbd_kvop *pf_last = NULL; /* the last op prefetched, still queued while ahead > 0 */
    int ahead = 0;                   /* queued ops prefetched and not yet run */
    while (e->qhead && !e->stalled) {
        while (ahead < EMB_PREFETCH + EMB_PREFETCH / 2) {
            struct nbd_kvop *from = ahead ? pf_last->next : e->qhead;
            if (!from)
                break;
            pf_last = prefetch_batch(e, from, &ahead);
        }
        struct nbd_kvop *op = e->qhead;
        int rc = 0;
        if (op->kind == NBD_KV_SYNC) {
            e->qhead = op->next;
            if (!e->qhead)
                e->qtail = NULL;
            op->next = e->syncs;
            e->syncs = op;
            ahead--;
            continue;
        }
        if (run(e, op, &rc) == SES_STALL) {
            e->stalled = 1; /* the eventfd says when to run it again */
            break;
        }
        e->qhead = op->next;
        if (!e->qhead)
            e->qtail = NULL;
        ahead--;
        complete(e, op, rc);
    }
    e->running = 0;
    check_syncs(e);
}

static void emb_flush(void *ctx) { run_queue(ctx); }

static void emb_on_event(void *ctx, struct nbd_watch *w, uint32_t events)
{
    struct emb *e = ctx;
    uint64_t v;
    (void)!read(e->evfd, &v, sizeof v);
    e->stalled = 0;
    run_queue(e);
}

static uint64_t emb_pending(void *ctx) { return ((struct emb *)ctx)->pending; }

static void emb_add_stats(void *ctx, struct nbd_backend_stats *st)
{
    struct emb *e = ctx;
    st->errors += __atomic_load_n(&e->st.errors, __ATOMIC_RELAXED);
}

const struct nbd_backend_ops nbd_be_embedded = {
    .scheme = "embedded",
    .open = emb_open,
    .close = emb_close,
    .submit = emb_submit,
    .flush = emb_flush,
    .on_event = emb_on_event,
    .pending = emb_pending,
    .add_stats = emb_add_stats,
};
