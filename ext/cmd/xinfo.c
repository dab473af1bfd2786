/* xinfo.c - XINFO STREAM (and FULL), GROUPS, CONSUMERS, HELP: Redis 7.0's field
 * names and order, as maps under RESP3 and flat arrays under RESP2. A read under
 * the key's shard lock. radix-tree-keys is the number of batches and
 * radix-tree-nodes the same (kvstore keeps no radix tree: the field is there for
 * clients that read it). Runs on front-end threads; arguments are untrusted. */
#define _GNU_SOURCE
#include "cmd/xcmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/kvbuf.h"

enum { I_STREAM, I_GROUPS, I_CONSUMERS };

struct xinfo {
    struct xop x;
    int sub, full;
    long long count;          /* FULL: entries and pending entries shown (0: all) */
    char err[600];
};

static int field(struct xinfo *t, const char *name) { return resp_add_bulk_str(t->x.op.c->out, name); }

static int add_id(struct xinfo *t, struct xs_id id) { return x_add_id(t->x.op.c->out, id); }

static int add_int(struct xinfo *t, long long v) { return resp_add_int(t->x.op.c->out, v); }

/* An entry, or a nil for none. */
static int add_edge(struct xinfo *t, int found, const struct xs_entry *e)
{
    return found == 1 ? x_add_entry(t->x.op.c->out, e) : resp_add_null(t->x.op.c->out, t->x.op.c->resp);
}

static int add_entries_read(struct xinfo *t, const struct xstream *s, const struct xs_group *g)
{
    struct cmd_client *c = t->x.op.c;
    int rc = field(t, "entries-read");
    rc |= g->entries_read == XS_ENTRIES_READ_UNKNOWN ? resp_add_null(c->out, c->resp) : add_int(t, g->entries_read);
    int64_t lag;
    rc |= field(t, "lag");
    rc |= xs_group_lag(s, g, &lag) ? add_int(t, lag) : resp_add_null(c->out, c->resp);
    return rc;
}

static int group_order(const void *a, const void *b)
{
    const struct xs_group *x = *(struct xs_group *const *)a, *y = *(struct xs_group *const *)b;
    int c = memcmp(x->name, y->name, x->nlen < y->nlen ? x->nlen : y->nlen);
    return c ? c : (x->nlen > y->nlen) - (x->nlen < y->nlen);
}

/* The groups of s in name order (Redis keeps them in a radix tree). NULL: none or no memory. */
static struct xs_group **sorted_groups(const struct xstream *s)
{
    struct xs_group **v = s->ngroups ? malloc(s->ngroups * sizeof *v) : NULL;
    if (!v)
        return NULL;
    size_t n = 0;
    for (struct list *l = s->groups.next; l != &s->groups; l = l->next)
        v[n++] = list_entry(l, struct xs_group, node);
    qsort(v, n, sizeof *v, group_order);
    return v;
}

static int stream_common(struct xinfo *t, const struct xstream *s)
{
    int rc = field(t, "length") | add_int(t, (long long)s->length);
    rc |= field(t, "radix-tree-keys") | add_int(t, (long long)s->n);
    rc |= field(t, "radix-tree-nodes") | add_int(t, (long long)s->n);
    rc |= field(t, "last-generated-id") | add_id(t, s->last_id);
    rc |= field(t, "max-deleted-entry-id") | add_id(t, s->max_deleted);
    rc |= field(t, "entries-added") | add_int(t, (long long)s->entries_added);
    rc |= field(t, "recorded-first-entry-id") | add_id(t, xs_first_id(s));
    return rc;
}

static int stream_full(struct xinfo *t, const struct xstream *s)
{
    struct cmd_client *c = t->x.op.c;
    struct kvbuf *out = c->out;
    long long max = t->count ? t->count : -1;
    int rc = resp_add_map(out, c->resp, 9) | stream_common(t, s);
    rc |= field(t, "entries");
    if (!rc && x_add_range(out, s, XS_ID_MIN, XS_ID_MAX, 0, max) < 0)
        rc = -ENOMEM;
    struct xs_group **gs = sorted_groups(s);
    if (s->ngroups && !gs)
        return -ENOMEM;
    rc |= field(t, "groups") | resp_add_array(out, (long long)s->ngroups);
    for (size_t i = 0; i < s->ngroups && !rc; i++) {
        const struct xs_group *g = gs[i];
        rc = resp_add_map(out, c->resp, 7) | field(t, "name") | resp_add_bulk(out, g->name, g->nlen);
        rc |= field(t, "last-delivered-id") | add_id(t, g->last_id) | add_entries_read(t, s, g);
        rc |= field(t, "pel-count") | add_int(t, (long long)g->npel) | field(t, "pending");
        size_t at;
        long long n = 0;
        rc |= x_hdr_begin(out, &at);
        for (struct xs_nack *k = xs_pel_ceil(g, XS_ID_MIN, 0); k && !rc && (max < 0 || n < max);
             k = xs_pel_ceil(g, k->id, 1), n++)
            rc = resp_add_array(out, 4) | add_id(t, k->id) | resp_add_bulk(out, k->owner->name, k->owner->nlen) |
                 add_int(t, k->delivery_ms) | add_int(t, (long long)k->delivery_count);
        if (!rc)
            x_hdr_end(out, at, '*', n);
        rc |= field(t, "consumers") | resp_add_array(out, (long long)g->nconsumers);
        for (struct list *l = g->consumers.next; l != &g->consumers && !rc; l = l->next) {
            const struct xs_consumer *k = list_entry(l, struct xs_consumer, node);
            rc = resp_add_map(out, c->resp, 4) | field(t, "name") | resp_add_bulk(out, k->name, k->nlen);
            rc |= field(t, "seen-time") | add_int(t, k->seen_ms) | field(t, "pel-count") |
                  add_int(t, (long long)k->pending) | field(t, "pending") | x_hdr_begin(out, &at);
            n = 0;
            for (struct xs_nack *p = xs_pel_ceil(g, XS_ID_MIN, 0); p && !rc && (max < 0 || n < max);
                 p = xs_pel_ceil(g, p->id, 1)) {
                if (p->owner != k)
                    continue;
                rc = resp_add_array(out, 3) | add_id(t, p->id) | add_int(t, p->delivery_ms) |
                     add_int(t, (long long)p->delivery_count);
                n++;
            }
            if (!rc)
                x_hdr_end(out, at, '*', n);
        }
    }
    free(gs);
    return rc;
}

static int64_t xinfo_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct xinfo *t = arg;
    const struct cmd_args *a = t->x.a;
    struct cmd_client *c = t->x.op.c;
    struct kvbuf *out = c->out;
    if (!cur->exists)
        return xfail(&t->x, "ERR no such key");
    NEED_STREAM(cur);
    const struct xstream *s = cur->stream;
    int rc = 0;
    if (t->sub == I_STREAM) {
        if (t->full) {
            rc = stream_full(t, s);
        } else {
            struct xs_entry first, last;
            int f = xs_first(s, &first), l = xs_last(s, &last);
            rc = resp_add_map(out, c->resp, 10) | stream_common(t, s) | field(t, "groups") |
                 add_int(t, (long long)s->ngroups) | field(t, "first-entry") | add_edge(t, f, &first) |
                 field(t, "last-entry") | add_edge(t, l, &last);
        }
    } else if (t->sub == I_GROUPS) {
        struct xs_group **gs = sorted_groups(s);
        if (s->ngroups && !gs)
            return -ENOMEM;
        rc = resp_add_array(out, (long long)s->ngroups);
        for (size_t i = 0; i < s->ngroups && !rc; i++) {
            const struct xs_group *g = gs[i];
            rc = resp_add_map(out, c->resp, 6) | field(t, "name") | resp_add_bulk(out, g->name, g->nlen) |
                 field(t, "consumers") | add_int(t, (long long)g->nconsumers) | field(t, "pending") |
                 add_int(t, (long long)g->npel) | field(t, "last-delivered-id") | add_id(t, g->last_id) |
                 add_entries_read(t, s, g);
        }
        free(gs);
    } else {
        const struct xs_group *g = xs_group_find(s, a->argv[3], a->argl[3]);
        if (!g) {
            snprintf(t->err, sizeof t->err, "NOGROUP No such consumer group '%.*s' for key name '%.*s'",
                     (int)a->argl[3], a->argv[3], (int)a->argl[2], a->argv[2]);
            return xfail(&t->x, t->err);
        }
        int64_t now = cmd_unix_ms();
        rc = resp_add_array(out, (long long)g->nconsumers);
        for (struct list *l = g->consumers.next; l != &g->consumers && !rc; l = l->next) {
            const struct xs_consumer *k = list_entry(l, struct xs_consumer, node);
            int64_t idle = now - k->seen_ms;
            rc = resp_add_map(out, c->resp, 3) | field(t, "name") | resp_add_bulk(out, k->name, k->nlen) |
                 field(t, "pending") | add_int(t, (long long)k->pending) | field(t, "idle") |
                 add_int(t, idle < 0 ? 0 : idle);
        }
    }
    if (rc)
        t->x.reply_oom = 1;
    return 0;
}

static const char *const xinfo_help[] = {
    "XINFO <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CONSUMERS <key> <groupname>",
    "    Show consumers of <groupname>.",
    "GROUPS <key>",
    "    Show the stream consumer groups.",
    "STREAM <key> [FULL [COUNT <count>]",
    "    Show information about the stream.",
    "HELP",
    "    Prints this help.",
};

int c_xinfo(struct cmd_client *c, const struct cmd_args *a)
{
    struct xinfo t = {.x = {{c, NULL}, a, 0}, .count = 10};
    if (ARGIS(a, 1, "help"))
        return cmd_sub_arity(c, a, 2, "xinfo|help") ? CMD_REPLY_HELP(c, xinfo_help) : 0;
    if (ARGIS(a, 1, "stream")) {
        if (!cmd_sub_arity(c, a, -3, "xinfo|stream"))
            return 0;
        t.sub = I_STREAM;
    } else if (ARGIS(a, 1, "groups")) {
        if (!cmd_sub_arity(c, a, 3, "xinfo|groups"))
            return 0;
        t.sub = I_GROUPS;
    } else if (ARGIS(a, 1, "consumers")) {
        if (!cmd_sub_arity(c, a, 4, "xinfo|consumers"))
            return 0;
        t.sub = I_CONSUMERS;
    } else {
        return cmd_unknown_sub(c, a, "XINFO");
    }
    int64_t n;
    /* the key first (no such key, WRONGTYPE), then STREAM's options: Redis's order */
    struct cmd_peek p = {0, 0};
    int64_t rc = kvt_apply(c->table, a->argv[2], a->argl[2], cmd_peek_fn, &p);
    if (rc < 0)
        return cmd_write_err_key(c, rc, a->argv[2], a->argl[2], 0);
    if (!p.exists)
        return cmd_reply_err(c, "ERR no such key");
    if (p.type != KVT_STREAM)
        return cmd_reply_err(c, ERR_WRONGTYPE);
    if (t.sub == I_STREAM && a->argc > 3) {
        if (!ARGIS(a, 3, "full") || (a->argc != 4 && (a->argc != 6 || !ARGIS(a, 4, "count"))))
            return resp_add_errorf(c->out, "ERR unknown subcommand or wrong number of arguments for '%.*s'. Try "
                                           "XINFO HELP.", (int)(a->argl[1] > 128 ? 128 : a->argl[1]), a->argv[1]);
        t.full = 1;
        if (a->argc == 6) {
            if (cmd_arg_ll(a, 5, &t.count))
                return cmd_reply_err(c, ERR_INT);
            if (t.count < 0)
                t.count = 10;
        }
    }
    x_read(&t.x, a->argv[2], a->argl[2], xinfo_fn, &n);
    return 0;
}
