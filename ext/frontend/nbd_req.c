/* nbd_req.c - NBD requests turned into block operations (in windows of
 * NBD_WINDOW), their replies built from the completions; an unaligned edge is
 * a read-modify-write under the block-lock table (nbd_lock.c). See nbd_int.h.
 * Threads: a request and its operations belong to its connection's thread; a
 * lock grant made by another thread arrives through this thread's grant list.
 * Reads untrusted request headers (proto/nbd.c parses, this file checks ranges
 * and flags before anything is allocated). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "frontend/nbd_int.h"

/* ---- the thread's pools: requests with NBD_POOL_DATA bytes of data, scratch blocks */

static char *block_get(struct nbd_thread *t)
{
    if (t->nblocks)
        return t->blocks[--t->nblocks];
    return aligned_alloc(64, t->s->block_size);
}

static void block_put(struct nbd_thread *t, char *b)
{
    if (t->nblocks < t->blocks_cap)
        t->blocks[t->nblocks++] = b;
    else
        free(b);
}

static uint32_t pool_ops(const struct nbd_server *s) { return (NBD_POOL_DATA >> s->bs_shift) + 2; }

/* The memory a request pins while it is in flight or its reply queued: what is
 * allocated for it, counted in its connection's in-flight total (a request
 * without payload costs its struct and operations too: a client that never
 * reads its replies is paused by them, not by payload alone). */
static uint64_t req_bytes(const struct nbd_req *r)
{
    return sizeof *r + r->cap + (uint64_t)r->ops_cap * sizeof *r->ops;
}

/* What req_get would allocate for a new request (the pool may hand out more):
 * the bound checked before a header is taken. */
static uint64_t req_bytes_new(const struct nbd_server *s, uint64_t data, uint64_t nops)
{
    if (data)
        data = data <= NBD_POOL_DATA ? NBD_POOL_DATA : data;
    if (nops)
        nops = nops <= pool_ops(s) ? pool_ops(s) : nops < NBD_WINDOW ? nops : NBD_WINDOW;
    return sizeof(struct nbd_req) + data + nops * sizeof(struct nbd_bop);
}

/* A request with room for data bytes and nops operations; NULL when out of memory. */
static struct nbd_req *req_get(struct nbd_thread *t, uint64_t data, uint32_t nops)
{
    struct nbd_server *s = t->s;
    struct nbd_req *r = NULL;
    if (data <= NBD_POOL_DATA && nops <= pool_ops(s) && t->pool) {
        r = t->pool;
        t->pool = r->next;
        t->npool--;
    } else {
        r = calloc(1, sizeof *r);
        if (!r)
            return NULL;
    }
    if (data > r->cap) {
        size_t cap = data <= NBD_POOL_DATA ? NBD_POOL_DATA : data;
        void *p = aligned_alloc(64, (cap + 63) & ~(size_t)63);
        if (!p)
            goto fail;
        free(r->data);
        r->data = p;
        r->cap = cap;
    }
    if (nops > r->ops_cap) {
        uint32_t cap = nops <= pool_ops(s) ? pool_ops(s) : nops;
        void *p = malloc(sizeof *r->ops * cap);
        if (!p)
            goto fail;
        free(r->ops);
        r->ops = p;
        r->ops_cap = cap;
    }
    r->next = NULL;
    r->rc = 0;
    r->msg = NULL;
    r->pending = 0;
    r->fua_done = 0;
    r->nops = 0;
    r->next_blk = 1; /* none: FLUSH and requests without blocks */
    r->last_blk = 0;
    r->hdr_len = 0;
    r->data_len = 0;
    r->sent = 0;
    r->charge = 0;
    return r;
fail: /* never counted in flight: straight back */
    free(r->data);
    free(r->ops);
    free(r);
    return NULL;
}

void nbd_req_free(struct nbd_thread *t, struct nbd_req *r)
{
    if (r->c) {
        r->c->inflight -= r->charge;
        r->c = NULL;
    }
    NBD_ST(t, inflight, (uint64_t)-1);
    if (r->cap <= NBD_POOL_DATA && r->ops_cap <= pool_ops(t->s) && t->npool < NBD_POOL_MAX) {
        r->next = t->pool;
        t->pool = r;
        t->npool++;
        return;
    }
    free(r->data);
    free(r->ops);
    free(r);
}

void nbd_req_free_live(struct nbd_thread *t)
{
    while (!list_empty(&t->live)) {
        struct nbd_req *r = (struct nbd_req *)((char *)t->live.next - offsetof(struct nbd_req, live));
        list_del(&r->live);
        for (uint32_t i = 0; i < r->nops; i++)
            free(r->ops[i].scratch); /* (the pool of blocks is freed next) */
        if (r->c)
            r->c->active--;
        free(r->data);
        free(r->ops);
        free(r);
    }
}

void nbd_req_pool_free(struct nbd_thread *t)
{
    while (t->pool) {
        struct nbd_req *r = t->pool;
        t->pool = r->next;
        free(r->data);
        free(r->ops);
        free(r);
    }
    t->npool = 0;
    while (t->nblocks)
        free(t->blocks[--t->nblocks]);
    free(t->blocks);
    t->blocks = NULL;
}

/* ---- block operations */

static int all_zero(const uint8_t *p, size_t n)
{
    /* block sizes are multiples of 512 and buffers 64-byte aligned or block-offset */
    uint64_t acc = 0;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        acc |= v;
        if ((i & 511) == 504 && acc)
            return 0;
    }
    return acc == 0;
}

static void bop_done(struct nbd_kvop *op);
static void req_ops_done(struct nbd_req *r);
static void req_window(struct nbd_req *r);

static void submit(struct nbd_thread *t, struct nbd_bop *b, int kind)
{
    b->op.kind = kind;
    b->op.rc = 0;
    b->op.done = bop_done;
    b->op.owner = b->r;
    b->op.next = NULL;
    switch (kind) {
    case NBD_KV_GET: NBD_ST(t, kv_gets, 1); break;
    case NBD_KV_PUT: NBD_ST(t, kv_puts, 1); break;
    case NBD_KV_DEL: NBD_ST(t, kv_dels, 1); break;
    default: NBD_ST(t, kv_syncs, 1); break;
    }
    t->dirty = 1;
    int rc = t->s->be->submit(t->be, &b->op);
    if (rc < 0) { /* not taken: complete it here, as the backend would have */
        b->op.rc = rc;
        bop_done(&b->op);
    }
}

/* Write stage of a block whose lock is held. */
static void bop_locked(struct nbd_thread *t, struct nbd_bop *b)
{
    if (b->stage == BOP_RMW_GET) {
        if (!(b->scratch = block_get(t))) {
            b->op.rc = -ENOMEM;
            bop_done(&b->op);
            return;
        }
        b->op.buf = b->scratch;
        submit(t, b, NBD_KV_GET);
        return;
    }
    uint8_t *p = b->r->data + b->doff;
    b->op.buf = (char *)p;
    submit(t, b, b->zero || all_zero(p, t->s->block_size) ? NBD_KV_DEL : NBD_KV_PUT);
}

void nbd_req_run_grants(struct nbd_thread *t)
{
    if (__atomic_load_n(&t->granted, __ATOMIC_RELAXED)) { /* a stale NULL only delays to the eventfd's round */
        pthread_mutex_lock(&t->glock);
        struct nbd_bop *g = t->granted;
        __atomic_store_n(&t->granted, NULL, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&t->glock);
        while (g) {
            struct nbd_bop *b = g;
            g = b->lnext;
            bop_locked(t, b);
        }
    }
    while (t->ready) {
        struct nbd_bop *b = t->ready;
        t->ready = b->lnext;
        bop_locked(t, b);
    }
}

static void bop_done(struct nbd_kvop *op)
{
    struct nbd_bop *b = (struct nbd_bop *)op; /* op is the first member */
    struct nbd_req *r = b->r;
    struct nbd_thread *t = r->c->t;
    int rc = op->rc;
    switch (b->stage) {
    case BOP_READ:
        if (b->scratch) {
            if (!rc)
                memcpy(r->data + b->doff, b->scratch + b->boff, b->blen);
            block_put(t, b->scratch);
            b->scratch = NULL;
        }
        break;
    case BOP_RMW_GET:
        if (!rc) {
            if (b->zero)
                memset(b->scratch + b->boff, 0, b->blen);
            else
                memcpy(b->scratch + b->boff, r->data + b->doff, b->blen);
            b->stage = BOP_RMW_PUT;
            NBD_ST(t, rmw, 1);
            submit(t, b, all_zero((uint8_t *)b->scratch, t->s->block_size) ? NBD_KV_DEL : NBD_KV_PUT);
            return;
        }
        /* fall through: the lock and the scratch block go back */
    case BOP_RMW_PUT:
        if (b->scratch) {
            block_put(t, b->scratch);
            b->scratch = NULL;
        }
        /* fall through */
    case BOP_WRITE:
        nbd_lock_put(t, b);
        break;
    }
    if (rc && !r->rc) {
        r->rc = rc;
        NBD_ST(t, backend_errors, 1);
    }
    if (--r->pending == 0) {
        if (r->next_blk <= r->last_blk && !r->rc)
            req_window(r); /* the next window of a long request */
        else
            req_ops_done(r);
    }
}

/* ---- replies */

static void reply_queue(struct nbd_req *r)
{
    struct nbd_conn *c = r->c;
    struct nbd_thread *t = c->t;
    if (r->rc)
        NBD_ST(t, errors, 1);
    if (c->closed) { /* nobody to answer */
        nbd_req_free(t, r);
        return;
    }
    if (c->out_tail)
        c->out_tail->next = r;
    else
        c->out_head = r;
    c->out_tail = r;
    r->next = NULL;
    nbd_conn_want_write(c);
}

/* Encode r's reply header (r->rc, r->msg) and queue it. */
static void reply(struct nbd_req *r)
{
    struct nbd_conn *c = r->c;
    uint32_t err = nbd_error_of(r->rc);
    r->data_len = 0;
    if (r->h.type == NBD_CMD_READ && c->structured) {
        if (err) {
            const char *m = r->msg ? r->msg : "";
            size_t ml = strlen(m);
            if (ml > 96)
                ml = 96;
            r->hdr_len = (uint32_t)nbd_enc_error_chunk(r->hdr, r->h.cookie, err, m, (uint16_t)ml);
        } else if (r->h.length == 0) {
            nbd_enc_chunk(r->hdr, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, r->h.cookie, 0);
            r->hdr_len = NBD_CHUNK_HDR_LEN;
        } else {
            nbd_enc_chunk(r->hdr, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_OFFSET_DATA, r->h.cookie, 8 + r->h.length);
            nbd_put64(r->hdr + NBD_CHUNK_HDR_LEN, r->h.offset);
            r->hdr_len = NBD_CHUNK_HDR_LEN + 8;
            r->data_len = r->h.length;
        }
    } else {
        nbd_enc_simple_reply(r->hdr, err, r->h.cookie);
        r->hdr_len = NBD_SIMPLE_REPLY_LEN;
        if (r->h.type == NBD_CMD_READ && !err)
            r->data_len = r->h.length;
    }
    reply_queue(r);
}

static void req_ops_done(struct nbd_req *r)
{
    struct nbd_conn *c = r->c;
    struct nbd_thread *t = c->t;
    int type = r->h.type;
    if ((r->h.flags & NBD_CMD_FLAG_FUA) && !r->fua_done && !r->rc &&
        (type == NBD_CMD_WRITE || type == NBD_CMD_TRIM || type == NBD_CMD_WRITE_ZEROES)) {
        /* every write of the request is done: the sync covers them */
        r->fua_done = 1;
        r->pending = 1;
        r->sync.r = r;
        r->sync.stage = BOP_SYNC;
        r->sync.scratch = NULL;
        r->sync.locked = 0;
        NBD_ST(t, fua, 1);
        submit(t, &r->sync, NBD_KV_SYNC);
        return;
    }
    c->active--;
    list_del(&r->live);
    if (!r->rc) {
        if (type == NBD_CMD_READ)
            NBD_ST(t, bytes_read, r->h.length);
        else if (type == NBD_CMD_WRITE)
            NBD_ST(t, bytes_written, r->h.length);
    } else if (!r->msg) {
        r->msg = "backend failed";
    }
    reply(r);
    if (c->closed && !c->active)
        nbd_conn_want_write(c); /* the round's end frees it */
}

/* Fail r at once (no operations): the reply carries err and msg. */
static void req_fail(struct nbd_req *r, int err, const char *msg)
{
    struct nbd_thread *t = r->c->t;
    r->rc = err;
    r->msg = msg;
    static struct kvlog_rate rate = KVLOG_RATE_INIT(20);
    kvlog_rated(&rate, KVLOG_WARNING, "NBD client %s: invalid request: %s: %s", r->c->addr, nbd_cmd_name(r->h.type),
                msg);
    NBD_ST(t, protocol_errors, 1);
    reply(r);
}

/* Submit the next window of r's blocks (at most NBD_WINDOW operations in
 * flight per request: a TRIM of a whole device does not allocate an operation
 * per block). One extra count in r->pending while submitting keeps r from
 * being answered, and its operations reused, inside the loop (an operation
 * failed at once completes synchronously). */
static void req_window(struct nbd_req *r)
{
    struct nbd_thread *t = r->c->t;
    struct nbd_server *s = t->s;
    uint64_t off = r->h.offset, end = off + r->h.length, mask = s->block_size - 1;
    uint64_t first = off >> s->bs_shift, last = r->last_blk;
    int write = r->h.type != NBD_CMD_READ, zero = r->h.type == NBD_CMD_TRIM || r->h.type == NBD_CMD_WRITE_ZEROES;
    for (;;) {
        uint64_t blk0 = r->next_blk, left = last - blk0 + 1;
        uint32_t n = left < NBD_WINDOW ? (uint32_t)left : NBD_WINDOW;
        r->next_blk += n;
        r->nops = n;
        r->pending = n + 1;
        for (uint32_t i = 0; i < n; i++) {
            struct nbd_bop *b = &r->ops[i];
            uint64_t blk = blk0 + i;
            b->r = r;
            b->op.block = blk;
            b->boff = blk == first ? (uint32_t)(off & mask) : 0;
            b->blen = (uint32_t)((blk == last ? ((end - 1) & mask) + 1 : s->block_size) - b->boff);
            b->doff = (blk << s->bs_shift) + b->boff - off;
            b->scratch = NULL;
            b->locked = 0;
            b->zero = (uint8_t)zero;
            b->excl = b->blen != s->block_size;
        }
        for (uint32_t i = 0; i < n; i++) {
            struct nbd_bop *b = &r->ops[i];
            if (!write) {
                b->stage = BOP_READ;
                if (b->excl) {
                    if (!(b->scratch = block_get(t))) {
                        b->op.rc = -ENOMEM;
                        bop_done(&b->op);
                        continue;
                    }
                    b->op.buf = b->scratch;
                } else {
                    b->op.buf = (char *)r->data + b->doff;
                }
                submit(t, b, NBD_KV_GET);
                continue;
            }
            b->stage = b->excl ? BOP_RMW_GET : BOP_WRITE;
            int rc = nbd_lock_get(s, b);
            if (rc == 1) {
                bop_locked(t, b);
            } else if (rc < 0) {
                b->op.rc = rc;
                b->stage = BOP_WRITE; /* nothing held, nothing to undo */
                bop_done(&b->op);
            }
        }
        if (--r->pending) /* operations out: the last one's bop_done goes on */
            return;
        if (r->next_blk > last || r->rc)
            break;
    }
    req_ops_done(r);
}

/* Split r over its blocks and submit (the data is there for a write). */
static void req_start(struct nbd_req *r)
{
    struct nbd_conn *c = r->c;
    struct nbd_thread *t = c->t;
    struct nbd_server *s = t->s;
    int type = r->h.type;
    if (type == NBD_CMD_FLUSH) {
        c->active++;
        list_add(&t->live, &r->live);
        r->pending = 1;
        r->sync.r = r;
        r->sync.stage = BOP_SYNC;
        r->sync.scratch = NULL;
        r->sync.locked = 0;
        submit(t, &r->sync, NBD_KV_SYNC);
        return;
    }
    if (r->h.length == 0) {
        reply(r);
        return;
    }
    r->next_blk = r->h.offset >> s->bs_shift;
    r->last_blk = (r->h.offset + r->h.length - 1) >> s->bs_shift;
    c->active++;
    list_add(&t->live, &r->live);
    req_window(r);
}

/* ---- request headers */

/* The flags each command accepts (FUA is accepted by all, as the protocol asks
 * once NBD_FLAG_SEND_FUA is advertised). */
static uint16_t flags_ok(const struct nbd_conn *c, uint16_t type)
{
    switch (type) {
    case NBD_CMD_READ: return NBD_CMD_FLAG_FUA | (c->structured ? NBD_CMD_FLAG_DF : 0);
    case NBD_CMD_WRITE_ZEROES: return NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO;
    default: return NBD_CMD_FLAG_FUA;
    }
}

/* Answer a request now with err, dropping its write payload (skip). -1: the
 * payload is too large to drop safely: close. */
static int reject(struct nbd_conn *c, struct nbd_req *r, int err, const char *msg)
{
    if (r->h.type == NBD_CMD_WRITE) {
        if (r->h.length > NBD_MAX_SKIP) {
            static struct kvlog_rate rate = KVLOG_RATE_INIT(20);
            kvlog_rated(&rate, KVLOG_WARNING,
                        "NBD client %s: write of %u bytes is past every bound: closing the connection", c->addr,
                        r->h.length);
            nbd_req_free(c->t, r);
            return -1;
        }
        c->skip = r->h.length;
    }
    req_fail(r, err, msg);
    return 0;
}

/* The error a request gets before anything runs (*msg says why), or 0. Checked
 * before anything is allocated for it. */
static int check_request(const struct nbd_conn *c, const struct nbd_request *h, const char **msg)
{
    const struct nbd_server *s = c->t->s;
    int type = h->type;
    if (type != NBD_CMD_READ && type != NBD_CMD_WRITE && type != NBD_CMD_FLUSH && type != NBD_CMD_TRIM &&
        type != NBD_CMD_WRITE_ZEROES)
        return *msg = "unknown command", -EINVAL;
    if (h->flags & ~flags_ok(c, (uint16_t)type))
        return *msg = "unsupported flags", -EINVAL;
    if (type == NBD_CMD_FLUSH)
        return 0;
    if (type != NBD_CMD_READ && s->read_only)
        return *msg = "the export is read-only", -EPERM;
    if ((type == NBD_CMD_READ || type == NBD_CMD_WRITE) && h->length > NBD_MAX_PAYLOAD)
        return *msg = "request too large", type == NBD_CMD_READ && (h->flags & NBD_CMD_FLAG_DF) ? -EOVERFLOW : -EINVAL;
    if (h->offset > s->size || h->length > s->size - h->offset)
        return *msg = "offset beyond end", type == NBD_CMD_WRITE || type == NBD_CMD_WRITE_ZEROES ? -ENOSPC : -EINVAL;
    return 0;
}

/* One request header: check it, then start it, wait for its payload, or answer
 * its error at once (its payload, if any, dropped as it arrives). */
static int request(struct nbd_conn *c, const struct nbd_request *h)
{
    struct nbd_thread *t = c->t;
    struct nbd_server *s = t->s;
    int type = h->type;
    if (type == NBD_CMD_DISC) {
        c->phase = PH_CLOSING; /* replies still due go out, then the connection closes */
        nbd_conn_want_write(c);
        return 0;
    }
    const char *msg = NULL;
    int err = check_request(c, h, &msg);
    uint64_t data = 0, nops = 0;
    if (!err && (type == NBD_CMD_READ || type == NBD_CMD_WRITE))
        data = h->length;
    if (!err && type != NBD_CMD_FLUSH && h->length)
        nops = ((h->offset + h->length - 1) >> s->bs_shift) - (h->offset >> s->bs_shift) + 1;
    struct nbd_req *r = req_get(t, data, (uint32_t)(nops < NBD_WINDOW ? nops : NBD_WINDOW));
    if (!r) {
        kvlog(KVLOG_WARNING, "NBD client %s: out of memory for a request: closing the connection", c->addr);
        return -1;
    }
    r->c = c;
    r->h = *h;
    r->charge = req_bytes(r);
    c->inflight += r->charge;
    NBD_ST(t, inflight, 1);
    NBD_ST(t, inflight_sum, st_get(&t->st[offsetof(struct nbd_stats, inflight) / sizeof(uint64_t)]));
    NBD_ST(t, inflight_samples, 1);
    switch (type) {
    case NBD_CMD_READ: NBD_ST(t, reads, 1); break;
    case NBD_CMD_WRITE: NBD_ST(t, writes, 1); break;
    case NBD_CMD_FLUSH: NBD_ST(t, flushes, 1); break;
    case NBD_CMD_TRIM: NBD_ST(t, trims, 1); break;
    case NBD_CMD_WRITE_ZEROES: NBD_ST(t, zeroes, 1); break;
    }
    if (err)
        return reject(c, r, err, msg);
    if (type == NBD_CMD_WRITE && h->length) {
        c->filling = r; /* started once its payload is in */
        c->fill_off = 0;
        return 0;
    }
    req_start(r);
    return 0;
}

/* What h will pin once taken (an estimate for a refused one: its struct). */
static uint64_t req_cost(const struct nbd_conn *c, const struct nbd_request *h)
{
    const struct nbd_server *s = c->t->s;
    const char *msg;
    if (check_request(c, h, &msg) || h->type == NBD_CMD_DISC)
        return req_bytes_new(s, 0, 0);
    uint64_t data = h->type == NBD_CMD_READ || h->type == NBD_CMD_WRITE ? h->length : 0, nops = 0;
    if (h->type != NBD_CMD_FLUSH && h->length)
        nops = ((h->offset + h->length - 1) >> s->bs_shift) - (h->offset >> s->bs_shift) + 1;
    return req_bytes_new(s, data, nops);
}

int nbd_req_input(struct nbd_conn *c)
{
    for (;;) {
        size_t avail = c->in_len - c->in_off;
        if (c->skip) {
            size_t n = avail < c->skip ? avail : (size_t)c->skip;
            c->in_off += n;
            c->skip -= n;
            if (c->skip)
                return 0;
            continue;
        }
        if (c->filling) {
            struct nbd_req *r = c->filling;
            uint64_t want = r->h.length - c->fill_off;
            size_t n = avail < want ? avail : (size_t)want;
            memcpy(r->data + c->fill_off, c->in + c->in_off, n);
            c->in_off += n;
            c->fill_off += n;
            if (c->fill_off < r->h.length)
                return 0;
            c->filling = NULL;
            req_start(r);
            continue;
        }
        if (c->phase != PH_TX || c->closed)
            return 0;
        struct nbd_request h;
        int n = nbd_parse_request(c->in + c->in_off, avail, &h);
        if (n == 0)
            return 0;
        if (n < 0) {
            static struct kvlog_rate rate = KVLOG_RATE_INIT(20); /* a client may send many: the log stays readable */
            kvlog_rated(&rate, KVLOG_WARNING, "NBD client %s: bad request magic: closing the connection", c->addr);
            NBD_ST(c->t, protocol_errors, 1);
            return -1;
        }
        if (c->inflight && c->inflight + req_cost(c, &h) > NBD_CONN_MAX_INFLIGHT) {
            c->paused = 1; /* the header stays unparsed until replies are sent */
            return 0;
        }
        c->in_off += (size_t)n;
        if (request(c, &h) < 0)
            return -1;
    }
}
