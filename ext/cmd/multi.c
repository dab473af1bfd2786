/* multi.c - transactions: MULTI, EXEC, DISCARD, WATCH, UNWATCH, with Redis's
 * semantics. After MULTI, cmd_dispatch queues every command (a copy of its
 * arguments) and replies +QUEUED; an unknown command or a wrong argument
 * count is answered at once and makes EXEC fail with EXECABORT. EXEC runs the
 * queue as one isolated, atomic unit:
 *   1. every key the queued commands name (the command table's key positions)
 *      and every watched key must be in memory: one that left it for the data
 *      file stalls EXEC until loaded (no lock is held while waiting);
 *   2. kvt_tx_begin locks every shard, so no other client reads or writes
 *      anything until the unit is over; residency is checked again (an
 *      eviction may have raced step 1: unlock and stall again);
 *   3. a watched key whose version changed since WATCH (written, deleted,
 *      expired) aborts: a null reply;
 *   4. the commands run in order, their replies gathered in one array (a
 *      command that fails replies its error there; the others still run, as
 *      in Redis: no rollback);
 *   5. kvt_tx_end closes the unit in the log: recovery applies all of its
 *      records or none, and the reply waits until the closing record is
 *      durable (its LSN is touched like any write's).
 * Runs on the connection's front-end thread; a UDP "connection" is one
 * datagram, so transactions need a stream front end. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/table.h"
#include "engine/engine.h"

#define MAX_QUEUED (1 << 20)            /* commands in one transaction */
#define MAX_QUEUED_BYTES (1ull << 30)   /* their arguments, copied */
#define MAX_WATCHED (1 << 16)

struct queued {
    int argc;
    const char **argv;
    size_t *argl;
    const struct cmd_def *def;
};

struct watched {
    char *key;
    size_t klen;
    int exists;
    uint64_t ver;
};

struct cmd_tx {
    int active;              /* between MULTI and EXEC/DISCARD */
    int dirty;               /* a command was refused while queueing: EXEC aborts */
    struct queued *q;
    int nq, capq;
    uint64_t qbytes;
    struct watched *w;
    int nw, capw;
};

static struct cmd_tx *tx_of(struct cmd_client *c)
{
    if (!c->tx)
        c->tx = calloc(1, sizeof *c->tx);
    return c->tx;
}

int cmd_in_multi(const struct cmd_client *c) { return c->tx && c->tx->active; }

void cmd_multi_flag(struct cmd_client *c)
{
    if (cmd_in_multi(c))
        c->tx->dirty = 1;
}

static void unwatch(struct cmd_tx *t)
{
    for (int i = 0; i < t->nw; i++)
        free(t->w[i].key);
    t->nw = 0;
}

static void discard(struct cmd_tx *t)
{
    for (int i = 0; i < t->nq; i++)
        free(t->q[i].argv); /* one allocation: pointers, lengths, bytes */
    t->nq = 0;
    t->qbytes = 0;
    t->active = 0;
    t->dirty = 0;
    unwatch(t);
}

void cmd_multi_discard(struct cmd_client *c)
{
    if (c->tx)
        discard(c->tx);
}

void cmd_tx_free(struct cmd_client *c)
{
    if (!c->tx)
        return;
    discard(c->tx);
    free(c->tx->q);
    free(c->tx->w);
    free(c->tx);
    c->tx = NULL;
}

int cmd_multi_queue(struct cmd_client *c, const struct cmd_def *d, int argc, const char **argv, const size_t *argl)
{
    struct cmd_tx *t = c->tx;
    size_t bytes = 0;
    for (int i = 0; i < argc; i++)
        bytes += argl[i];
    if (t->nq >= MAX_QUEUED || t->qbytes + bytes > MAX_QUEUED_BYTES) {
        t->dirty = 1;
        return cmd_reply_err(c, "ERR transaction too large (at most 1048576 commands and 1 GB of arguments)");
    }
    if (t->nq == t->capq) {
        int cap = t->capq ? t->capq * 2 : 8;
        struct queued *nq = realloc(t->q, (size_t)cap * sizeof *nq);
        if (!nq)
            return -ENOMEM;
        t->q = nq;
        t->capq = cap;
    }
    size_t head = (size_t)argc * (sizeof(char *) + sizeof(size_t));
    char *mem = malloc(head + bytes + (size_t)argc);
    if (!mem)
        return -ENOMEM;
    const char **v = (const char **)mem;
    size_t *l = (size_t *)(mem + (size_t)argc * sizeof(char *));
    char *p = mem + head;
    for (int i = 0; i < argc; i++) {
        memcpy(p, argv[i], argl[i]);
        p[argl[i]] = 0;
        v[i] = p;
        l[i] = argl[i];
        p += argl[i] + 1;
    }
    t->q[t->nq++] = (struct queued){argc, v, l, d};
    t->qbytes += bytes;
    return resp_add_status(c->out, "QUEUED");
}

int c_multi(struct cmd_client *c, const struct cmd_args *a)
{
    (void)a;
    if (c->datagram)
        return cmd_reply_err(c, "ERR MULTI needs a connection: not available over UDP");
    if (cmd_in_multi(c))
        return cmd_reply_err(c, "ERR MULTI calls can not be nested");
    struct cmd_tx *t = tx_of(c);
    if (!t)
        return -ENOMEM;
    t->active = 1;
    t->dirty = 0;
    return cmd_reply_ok(c);
}

int c_discard(struct cmd_client *c, const struct cmd_args *a)
{
    (void)a;
    if (!cmd_in_multi(c))
        return cmd_reply_err(c, "ERR DISCARD without MULTI");
    discard(c->tx);
    return cmd_reply_ok(c);
}

int c_unwatch(struct cmd_client *c, const struct cmd_args *a)
{
    (void)a;
    if (c->tx)
        unwatch(c->tx);
    return cmd_reply_ok(c);
}

/* WATCH key [key ...]: remember each key's version. Resumable: a key that left
 * memory stalls the command, which carries on from it when run again. */
int c_watch(struct cmd_client *c, const struct cmd_args *a)
{
    if (c->datagram)
        return cmd_reply_err(c, "ERR WATCH needs a connection: not available over UDP");
    if (cmd_in_multi(c))
        return cmd_reply_err(c, "ERR WATCH inside MULTI is not allowed");
    struct cmd_tx *t = tx_of(c);
    if (!t)
        return -ENOMEM;
    int i = c->resume_i ? c->resume_i : 1;
    c->resume_i = 0;
    for (; i < a->argc; i++) {
        if (t->nw >= MAX_WATCHED)
            return cmd_reply_err(c, "ERR too many watched keys (at most 65536)");
        uint64_t ver;
        int rc = kvt_version(c->table, a->argv[i], a->argl[i], &ver);
        if (rc == -ENODATA) {
            int r = cmd_need_load(c, a->argv[i], a->argl[i]);
            if (c->stall)
                c->resume_i = i;
            return r;
        }
        if (t->nw == t->capw) {
            int cap = t->capw ? t->capw * 2 : 8;
            struct watched *nw = realloc(t->w, (size_t)cap * sizeof *nw);
            if (!nw)
                return -ENOMEM;
            t->w = nw;
            t->capw = cap;
        }
        char *k = malloc(a->argl[i] ? a->argl[i] : 1);
        if (!k)
            return -ENOMEM;
        memcpy(k, a->argv[i], a->argl[i]);
        t->w[t->nw++] = (struct watched){k, a->argl[i], rc == 1, ver};
    }
    return cmd_reply_ok(c);
}

/* A transaction's stream batches out of memory come back before it runs, up to
 * this many per key (a command that reads more gets EXEC's error below). */
#define TX_BATCHES 1024

/* Stall for key if it left memory, or if it is a stream with batches out of
 * memory (returns 1); when it cannot be loaded (no data file, or a damaged one)
 * the error is EXEC's reply and the transaction ends. */
static int need_load(struct cmd_client *c, struct cmd_tx *t, const char *key, size_t klen)
{
    if (kvt_exists(c->table, key, klen) != -ENODATA) {
        size_t gone = kvt_want_batches(c->table, key, klen, TX_BATCHES);
        if (!gone || gone > TX_BATCHES)
            return 0;
    }
    cmd_need_load(c, key, klen);
    if (!c->stall)
        discard(t);
    return 1;
}

/* Every key of the queue and every watched key in memory? If not, stall for
 * the first one that is not (returns 1). */
static int need_loads(struct cmd_client *c, struct cmd_tx *t)
{
    for (int i = 0; i < t->nw; i++)
        if (need_load(c, t, t->w[i].key, t->w[i].klen))
            return 1;
    for (int i = 0; i < t->nq; i++) {
        int first, last;
        if (!cmd_key_range(t->q[i].def, t->q[i].argc, &first, &last))
            continue;
        for (int k = first; k <= last; k += t->q[i].def->step > 0 ? t->q[i].def->step : 1)
            if (need_load(c, t, t->q[i].argv[k], t->q[i].argl[k]))
                return 1;
    }
    return 0;
}

static int watch_broken(struct cmd_client *c, struct cmd_tx *t)
{
    for (int i = 0; i < t->nw; i++) {
        uint64_t ver;
        int rc = kvt_version(c->table, t->w[i].key, t->w[i].klen, &ver);
        if (rc != t->w[i].exists || ver != t->w[i].ver)
            return 1;
    }
    return 0;
}

int c_exec(struct cmd_client *c, const struct cmd_args *a)
{
    (void)a;
    if (!cmd_in_multi(c))
        return cmd_reply_err(c, "ERR EXEC without MULTI");
    struct cmd_tx *t = c->tx;
    if (t->dirty) {
        discard(t);
        return cmd_reply_err(c, "EXECABORT Transaction discarded because of previous errors.");
    }
    if (need_loads(c, t))
        return 0;
    int rc = kvt_tx_begin(c->table);
    if (rc < 0) {
        discard(t);
        return cmd_reply_write_err(c, rc);
    }
    if (need_loads(c, t)) { /* evicted between the check and the locks */
        kvt_tx_end(c->table);
        return 0;
    }
    if (watch_broken(c, t)) {
        kvt_tx_end(c->table);
        discard(t);
        return c->resp == 3 ? resp_add_null(c->out, 3) : resp_add_array(c->out, -1);
    }
    size_t start = c->out->len;
    t->active = 0; /* the queued commands run, not queue */
    resp_add_array(c->out, t->nq);
    for (int i = 0; i < t->nq && !rc; i++) {
        struct queued *q = &t->q[i];
        size_t at = c->out->len;
        rc = cmd_dispatch(c, q->argc, q->argv, q->argl);
        if (c->stall) {
            /* Waiting is impossible with every shard held: memory for a write,
             * or the data file for a listing. Its error is the reply -- but for
             * stream batches out of memory wanted before anything changed:
             * then EXEC runs again, whole, once they are back. */
            int mem = c->stall == CMD_STALL_MEM;
            int batches = c->stall == CMD_STALL_LOAD && kvt_exists(c->table, c->stall_key, c->stall_klen) == 1;
            if (batches && !kvt_tx_changes) {
                kvt_tx_end(c->table); /* (an empty unit) */
                c->out->len = start;
                c->resume_i = 0;
                t->active = 1;
                return 0;
            }
            c->stall = CMD_STALL_NONE;
            c->resume_i = 0;
            c->out->len = at;
            rc = cmd_reply_err(c, mem ? ERR_OOM
                               : batches ? "ERR this command reads stream batches out of memory after the "
                                           "transaction changed something (MULTI/EXEC brings back 1024 per stream "
                                           "first): run it on its own"
                                         : "ERR this command needs the data file and cannot run inside "
                                           "MULTI/EXEC: run it on its own");
        }
    }
    int64_t lsn = kvt_tx_end(c->table);
    discard(t);
    if (rc)
        return rc;
    if (lsn < 0) { /* the unit could not be closed: recovery will drop it, so it did not happen */
        c->out->len = start;
        return cmd_reply_write_err(c, lsn);
    }
    return 0;
}
