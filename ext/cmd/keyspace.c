/* keyspace.c - commands over keys of any type and the whole keyspace: DEL, EXISTS,
 * DBSIZE, FLUSHALL/FLUSHDB. Runs on front-end threads; arguments are untrusted. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <errno.h>

#include "core/table.h"
#include "durability/bosc.h"
#include "engine/engine.h"


/* DEL (del = 1) and EXISTS: count over the keys, resumable (see resume_i). */
static int count_keys(struct cmd_client *c, const struct cmd_args *a, int del)
{
    int i = c->resume_i ? c->resume_i : 1;
    long long n = c->resume_i ? c->resume_n : 0;
    c->resume_i = 0;
    for (; i < a->argc; i++) {
        int rc = del ? kvt_del(c->table, a->argv[i], a->argl[i]) : kvt_exists(c->table, a->argv[i], a->argl[i]);
        if (rc == -ENODATA) { /* the keys before stay deleted; carry on with this one once loaded */
            int r = cmd_need_load(c, a->argv[i], a->argl[i]);
            if (c->stall) {
                c->resume_i = i;
                c->resume_n = n;
            }
            return r;
        }
        if (rc < 0)
            return cmd_reply_write_err(c, rc);
        n += rc;
    }
    return resp_add_int(c->out, n);
}

int c_del(struct cmd_client *c, const struct cmd_args *a) { return count_keys(c, a, 1); }

int c_exists(struct cmd_client *c, const struct cmd_args *a) { return count_keys(c, a, 0); }

int c_dbsize(struct cmd_client *c, const struct cmd_args *a)
{
    (void)a;
    /* With a data file, a key written blind (without reading its block) counts
     * once its block has been swept: flush before counting (LDU's flush before
     * a read that needs the applied state). */
    struct bosc *b = c->eng->bosc;
    /* Inside EXEC every shard is held and the sweep could not run: count as is. */
    if (b && !kvt_tx_held && (c->sync_ticket || bosc_dirty(b))) {
        if (!c->sync_ticket)
            c->sync_ticket = bosc_sync_request(b);
        if (!bosc_sync_done(b, c->sync_ticket)) {
            c->stall = CMD_STALL_SYNC;
            return 0;
        }
        c->sync_ticket = 0;
    }
    kvt_lsn_touch(eng_log_appended(c->eng)); /* the count includes writes not yet durable */
    return resp_add_int(c->out, (long long)kvt_count(c->table));
}

int c_flushall(struct cmd_client *c, const struct cmd_args *a)
{
    if (a->argc > 2 || (a->argc == 2 && !ARGIS(a, 1, "ASYNC") && !ARGIS(a, 1, "SYNC")))
        return cmd_reply_err(c, ERR_SYNTAX);
    int rc = kvt_flush(c->table);
    return rc < 0 ? cmd_reply_write_err(c, rc) : cmd_reply_ok(c);
}
