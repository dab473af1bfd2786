/* session.c - run a request, stall it for the data file, hold its reply for the
 * log (see session.h). The only copy of that logic: the poller, the thread pool
 * and the UDP front ends all call ses_run. */
#include "engine/session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/table.h"
#include "durability/bosc.h"
#include "durability/wal.h"
#include "engine/engine.h"
#include "engine/loading.h"

void ses_init(struct session *s, struct kv_engine *eng, struct kvbuf *out, const char *addr, int index, int evfd)
{
    memset(s, 0, sizeof *s);
    s->eng = eng;
    s->evfd = evfd;
    s->cl.id = eng_client_id(eng);
    s->cl.authenticated = !(eng->cfg.requirepass && *eng->cfg.requirepass);
    s->cl.resp = 2;
    s->cl.out = out;
    s->cl.eng = eng;
    s->cl.table = eng->table;
    s->cl.poller = index;
    s->cl.evfd = evfd;
    snprintf(s->cl.addr, sizeof s->cl.addr, "%s", addr);
    s->cl.fd = -1;
    list_init(&s->cl.reg);
    atomic_store_explicit(&s->cl.multi, -1, memory_order_relaxed);
}

void ses_connect(struct session *s, int fd, int64_t now_ms) { cmd_client_register(&s->cl, fd, now_ms); }

void ses_disconnect(struct session *s) { cmd_client_unregister(&s->cl); }

void ses_free(struct session *s)
{
    cmd_client_unregister(&s->cl);
    cmd_block_done(&s->cl);
    cmd_client_release(&s->cl);
    free(s->cl.name);
    s->cl.name = NULL;
    cmd_tx_free(&s->cl);
    free(s->holds);
    s->holds = NULL;
}

int ses_run(struct session *s, int argc, const char **argv, const size_t *argl)
{
    struct cmd_client *c = &s->cl;
    if (!s->again)
        s->need = 0;
    size_t reply_at = c->out->len;
    kvt_lsn_reset();
    c->top = CMD_TOP_NEXT; /* CLIENT LIST shows this request's command, not those EXEC runs */
    /* A reply is built under its client's bound (cmd_client_reply_limit): one that
     * would pass it stops there, and the client is closed, as it would be once sent. */
    c->out->limit = cmd_client_reply_limit(c);
    int rc = cmd_dispatch(c, argc, argv, argl);
    c->out->limit = 0;
    if (c->out->over) {
        c->out->over = 0;
        c->out->len = reply_at;
        cmd_client_reply_over(c);
        return -ENOMEM;
    }
    if (rc)
        return -ENOMEM;
    if (c->tx) /* it used MULTI or WATCH: CLIENT LIST's multi fields */
        cmd_client_after(c, reply_at, argc, argl);
    uint64_t touched = kvt_lsn_touched(); /* 0 without a log */
    if (touched > s->need)
        s->need = touched;
    if (c->stall) {
        s->stall = c->stall;
        s->again = 1;
        c->stall = CMD_STALL_NONE;
        if (!c->resume_i) /* no reply yet: the next run makes it; MGET's part so far stays */
            c->out->len = reply_at;
        if (s->evfd >= 0) { /* ask now; the data file wakes evfd when it is done */
            if (s->stall == CMD_STALL_LOAD)
                bosc_request_load(s->eng->bosc, c->stall_key, c->stall_klen, s->evfd); /* ENOMEM: timed retry */
            else if (s->stall == CMD_STALL_MEM)
                bosc_kick(s->eng->bosc);
            /* CMD_STALL_SYNC, CMD_STALL_KEYS: requested by the command, which gets woken */
        }
        return SES_STALL;
    }
    s->again = 0;
    struct wal *w = s->eng->wal;
    return s->need && w && s->need > wal_durable_lsn(w) ? SES_HOLD : SES_DONE;
}

int ses_hold(struct session *s, size_t off, uint64_t need)
{
    if (need <= s->hold_max || !s->eng->wal || need <= wal_durable_lsn(s->eng->wal))
        return 0; /* already behind an earlier hold, or already durable */
    if (s->hold_head + s->hold_n == s->hold_cap) {
        if (s->hold_head) { /* reuse the consumed front */
            memmove(s->holds, s->holds + s->hold_head, (size_t)s->hold_n * sizeof *s->holds);
            s->hold_head = 0;
        } else {
            int cap = s->hold_cap ? s->hold_cap * 2 : 16;
            struct ses_hold *h = realloc(s->holds, (size_t)cap * sizeof *h);
            if (!h)
                return -ENOMEM;
            s->holds = h;
            s->hold_cap = cap;
        }
    }
    s->holds[s->hold_head + s->hold_n++] = (struct ses_hold){off, need};
    s->hold_max = need;
    return 0;
}

size_t ses_sendable_held(struct session *s, size_t len)
{
    uint64_t durable = wal_durable_lsn(s->eng->wal);
    while (s->hold_n && s->holds[s->hold_head].lsn <= durable) {
        s->hold_head++;
        s->hold_n--;
    }
    if (!s->hold_n) { /* every hold released: a later need <= hold_max is durable too */
        s->hold_head = 0;
        s->hold_max = 0;
        return len;
    }
    return s->holds[s->hold_head].off;
}

void ses_consumed(struct session *s, size_t n)
{
    for (int i = 0; i < s->hold_n; i++)
        s->holds[s->hold_head + i].off -= n;
}

int ses_wait(struct session *s)
{
    struct kv_engine *e = s->eng;
    switch (s->stall) {
    case CMD_STALL_LOAD:
        return kvt_load_sync(e->table, s->cl.stall_key, s->cl.stall_klen);
    case CMD_STALL_MEM:
        return kvt_wait_memory(e->table);
    case CMD_STALL_SYNC:
        return e->bosc ? bosc_sync(e->bosc) : 0;
    case CMD_STALL_KEYS:
        if (e->bosc)
            bosc_keys_wait(e->bosc, s->cl.keys_ticket);
        return 0;
    case CMD_STALL_BLOCK:
        return cmd_block_sleep(&s->cl);
    }
    return 0;
}

int ses_subscribe(struct kv_engine *eng, int evfd, char *err, size_t errlen)
{
    int rc = 0;
    if ((rc = eng_note_evfd(eng, evfd)) < 0) { /* a log attached later (eng_attach) wakes it too */
        snprintf(err, errlen, "too many threads for the engine's wake-up list");
        return rc;
    }
    if (eng->bosc && (rc = bosc_subscribe(eng->bosc, evfd)) < 0) {
        snprintf(err, errlen, "too many threads for the data file's wake-up list");
        return rc;
    }
    if (eng->wal && (rc = wal_subscribe(eng->wal, evfd)) < 0) {
        snprintf(err, errlen, "too many threads for the log's wake-up list");
        return rc;
    }
    return 0;
}
