/* scan.c - iterating the keyspace: SCAN, KEYS, RANDOMKEY, over the keys in memory
 * (kvt_scan, kvt_random_key) and, with a data file, over the keys that live only
 * in their blocks (bosc_keys_request: the loader thread lists the keys of a range
 * of home buckets; the request stalls with CMD_STALL_KEYS until the listing is
 * ready and then runs again). Patterns are matched outside the table's locks (a
 * pattern from a client may be slow to match). Runs on front-end threads;
 * arguments are untrusted.
 *
 * SCAN's cursor: a memory phase, then a data-file phase.
 *   bits 62, 63 clear   kvt_scan's cursor (shard, reversed-bit bucket cursor);
 *   bit 62 set          the data file's home buckets from the low bits on.
 * Why a key present for the whole scan is returned at least once, even if it
 * leaves memory or comes back meanwhile: either it was in memory for the whole
 * memory phase, and kvt_scan's own guarantee returns it (whatever rehashing);
 * or at some moment of that phase it was not in memory. A live key leaves memory
 * only by eviction, and only a clean entry is evicted: one whose state the
 * flusher has written to its block. From then on the block holds the key, until
 * a deletion of it is flushed (it is live, so none is) - later writes only
 * replace its record. The data-file phase comes after the memory phase and lists
 * every home bucket's whole chain once (the number of buckets is fixed for the
 * file), so it lists the key; the listing leaves out only expired records. The
 * memory filter keeps it: memory either holds it live (loaded back) or does not
 * hold it (-ENODATA); only a deletion or expiry (the key not live) makes memory
 * answer "absent". The order matters: keys move from memory to the file, not
 * back (a load copies, the block keeps its record), so the file is scanned last.
 * The price: a key both in memory and in its block (clean, or loaded back) is
 * returned by both phases. SCAN allows repeats; telling which keys the memory
 * phase returned would need state the cursor cannot carry. KEYS, one request,
 * keeps that state (a set of the keys returned so far) and returns each key once.
 */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/glob.h"
#include "core/slot.h"
#include "core/table.h"
#include "durability/bosc.h"
#include "engine/engine.h"

#define SCAN_FILE (1ull << 62)
#define SCAN_PHASES (3ull << 62)
#define FILE_STEP_MAX 1024u   /* home buckets per listing (4 MiB of blocks at most) */
#define RANDOM_STEP 64u       /* home buckets per listing when RANDOMKEY searches the file */
#define KEYS_STEP 1024u       /* kvt_scan's count per call while KEYS walks memory */

/* Keys as records u32 klen | u8 type | key: the data file's listing format
 * (bosc_keys_take), used for every list of keys here. */
struct rec {
    const char *key;
    uint32_t klen;
    int type;
};

static int rec_add(struct kvbuf *b, const char *key, size_t klen, int type)
{
    uint32_t n = (uint32_t)klen;
    unsigned char t = (unsigned char)type;
    if (kvbuf_reserve(b, 5 + klen))
        return -ENOMEM;
    memcpy(b->p + b->len, &n, 4);
    memcpy(b->p + b->len + 4, &t, 1);
    memcpy(b->p + b->len + 5, key, klen);
    b->len += 5 + klen;
    return 0;
}

/* The record at *off: 1 (and *off moves past it), or 0 at the end (or at a record
 * cut short, which a listing never holds). */
static int rec_next(const struct kvbuf *b, size_t *off, struct rec *r)
{
    if (b->len - *off < 5)
        return 0;
    uint32_t n;
    memcpy(&n, b->p + *off, 4);
    if (b->len - *off - 5 < n)
        return 0;
    r->klen = n;
    r->type = (unsigned char)b->p[*off + 4];
    r->key = b->p + *off + 5;
    *off += 5 + (size_t)n;
    return 1;
}

/* kvt_key_fn: copy the key out (under its shard lock); matching happens later. */
struct collect {
    struct kvbuf buf;
    int oom;
};

static void collect_cb(void *arg, const char *key, size_t klen, int type)
{
    struct collect *k = arg;
    if (rec_add(&k->buf, key, klen, type))
        k->oom = 1;
}

/* ---- options: MATCH pattern, TYPE name */

struct filter {
    const char *pat;  /* NULL: every key */
    size_t plen;
    int type;         /* -1: any; KVT_STRING, KVT_HASH, KVT_STREAM; -2: a type kvstore has no keys of */
    int slot;         /* -1: any; else the cluster slot (core/slot.h) the key must hash to */
};

static int filter_type(const char *name, size_t n)
{
    n = strnlen(name, n); /* Redis compares with strcasecmp */
    if (n == 6 && !strncasecmp(name, "string", 6))
        return KVT_STRING;
    if (n == 4 && !strncasecmp(name, "hash", 4))
        return KVT_HASH;
    if (n == 6 && !strncasecmp(name, "stream", 6))
        return KVT_STREAM;
    return -2; /* list, set, zset or a name no type has: nothing matches */
}

static int filter_pass(const struct filter *f, const char *key, size_t klen, int type)
{
    if (f->type != -1 && f->type != type)
        return 0;
    if (f->slot >= 0 && kv_key_slot(key, klen) != f->slot)
        return 0;
    return !f->pat || glob_match(f->pat, f->plen, key, klen, 0);
}

static void filter_pattern(struct filter *f, const char *pat, size_t n)
{
    /* exactly "*" matches everything: no pattern, as Redis */
    f->pat = n == 1 && pat[0] == '*' ? NULL : pat;
    f->plen = n;
}

/* ---- what a request keeps between its runs over the data file (c->keys) */

enum { KS_SCAN = 1, KS_KEYS, KS_RANDOM };

struct cmd_keys {
    int kind;             /* KS_*: the request this belongs to */
    uint64_t id;          /* SCAN: the cursor */
    uint32_t next;        /* next home bucket to list */
    uint32_t n;           /* home buckets of the pending listing */
    uint32_t visited;     /* RANDOMKEY: buckets listed so far */
    int file;             /* KEYS: memory done, listing the file */
    struct kvbuf out;     /* KEYS: the keys so far (records) */
    uint64_t nout;
    uint64_t *set;        /* KEYS: open addressing, offset + 1 of a record in out; 0 empty */
    size_t set_cap, set_n;
};

/* Drop the listing a request asked for and will not take (never blocks: the
 * loader stops the work at its next step and frees it). */
static void drop_ticket(struct cmd_client *c)
{
    if (c->keys_ticket && c->eng->bosc)
        bosc_keys_cancel(c->eng->bosc, c->keys_ticket);
    c->keys_ticket = 0;
}

static void free_state(struct cmd_client *c)
{
    if (c->keys) {
        kvbuf_free(&c->keys->out);
        free(c->keys->set);
        free(c->keys);
        c->keys = NULL;
    }
}

void cmd_client_release(struct cmd_client *c)
{
    cmd_stats_unblock(c);
    drop_ticket(c);
    free_state(c);
}

/* The request's state: the one kept from its previous run, or a new one. A state
 * of another request (one that stalled and was never run again, e.g. inside an
 * EXEC that gave up) is dropped. NULL: out of memory. */
static struct cmd_keys *state(struct cmd_client *c, int kind, uint64_t id)
{
    if (c->keys && (c->keys->kind != kind || c->keys->id != id)) {
        drop_ticket(c);
        free_state(c);
    }
    if (!c->keys) {
        c->keys = calloc(1, sizeof *c->keys);
        if (c->keys) {
            c->keys->kind = kind;
            c->keys->id = id;
        }
    }
    return c->keys;
}

/* One listing of home buckets [first, first + n): 1 with the keys in *out; 0 when
 * the request stalls for it (c->stall set, nothing replied); -1 with the error
 * replied (the ticket is released either way). */
static int file_listing(struct cmd_client *c, uint32_t first, uint32_t n, struct kvbuf *out)
{
    struct bosc *b = c->eng->bosc;
    if (kvt_tx_held) {
        /* Inside EXEC, every shard held: the loader may need one of them, so
         * nothing is requested and nothing kept; EXEC answers the stall with an
         * error. */
        drop_ticket(c);
        free_state(c);
        c->stall = CMD_STALL_KEYS;
        return 0;
    }
    int rc;
    do {
        if (!c->keys_ticket) {
            int64_t t = bosc_keys_request(b, first, n, c->evfd);
            if (t == -EBUSY) { /* every listing slot is taken: ask again when woken */
                c->stall = CMD_STALL_KEYS;
                return 0;
            }
            if (t < 0) {
                if (bosc_failed(b))
                    resp_add_errorf(c->out, "ERR %s", bosc_error(b));
                else
                    cmd_reply_write_err(c, t);
                return -1;
            }
            c->keys_ticket = t;
        }
        rc = bosc_keys_take(b, c->keys_ticket, out);
        if (rc == 0) {
            c->stall = CMD_STALL_KEYS;
            return 0;
        }
        c->keys_ticket = 0;
    } while (rc == -ESTALE); /* the answer was dropped untaken (we were slow): ask again */
    if (rc < 0) {
        if (rc == -EILSEQ || bosc_failed(b))
            resp_add_errorf(c->out, "ERR %s", bosc_error(b));
        else
            cmd_reply_write_err(c, rc);
        return -1;
    }
    return 1;
}

/* Is a key listed from its block live, and where: 0 deleted or expired (memory
 * says so: a tombstone, a newer state), 1 only in its block, 2 live in memory
 * (*type then memory's, which may be newer than the block's). */
static int file_key_live(struct kv_table *t, const struct rec *r, int *type)
{
    struct cmd_peek p = {0, 0};
    int64_t rc = kvt_apply(t, r->key, r->klen, cmd_peek_fn, &p);
    *type = r->type;
    if (rc == -ENODATA)
        return 1;
    if (rc < 0 || !p.exists)
        return 0;
    *type = p.type;
    return 2;
}

/* ---- SCAN cursor [MATCH pattern] [COUNT count] [TYPE type] */

/* Redis's parseScanCursorOrReply: strtoul in base 10 on the C string (so up to a
 * NUL byte), no leading space, a sign allowed ("-1" wraps), the whole string a
 * number ("" is 0), no overflow. 0 or -1. */
static int parse_cursor(const char *s, size_t n, uint64_t *out)
{
    n = strnlen(s, n);
    if (n == 0) {
        *out = 0;
        return 0;
    }
    if (isspace((unsigned char)s[0]))
        return -1;
    size_t i = 0;
    int neg = s[0] == '-';
    if (s[0] == '+' || s[0] == '-')
        i++;
    if (i == n)
        return -1;
    uint64_t v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = neg ? (uint64_t)0 - v : v;
    return 0;
}

/* SCAN's reply: the next cursor, then the keys of got that pass f. */
static int reply_scan(struct cmd_client *c, uint64_t next, const struct kvbuf *got, const struct filter *f)
{
    size_t off = 0;
    struct rec r;
    long long n = 0;
    while (rec_next(got, &off, &r))
        n += filter_pass(f, r.key, r.klen, r.type);
    char cur[24];
    int cl = snprintf(cur, sizeof cur, "%llu", (unsigned long long)next);
    int rc = resp_add_array(c->out, 2);
    rc = rc ? rc : resp_add_bulk(c->out, cur, (size_t)cl);
    rc = rc ? rc : resp_add_array(c->out, n);
    for (off = 0; !rc && rec_next(got, &off, &r);)
        if (filter_pass(f, r.key, r.klen, r.type))
            rc = resp_add_bulk(c->out, r.key, r.klen);
    return rc;
}

/* The data-file phase: buckets from the cursor's low bits, about count keys'
 * worth of them (from the average keys per bucket), at most FILE_STEP_MAX. */
static int scan_file(struct cmd_client *c, uint64_t cursor, unsigned long long count, const struct filter *f)
{
    struct bosc *b = c->eng->bosc;
    uint32_t nb = b ? bosc_buckets(b) : 0;
    uint64_t first = cursor & ~SCAN_PHASES;
    struct kvbuf got = {0};
    if (!b || (cursor & SCAN_PHASES) != SCAN_FILE || first >= nb) /* done, or not a cursor of ours */
        return reply_scan(c, 0, &got, f);
    struct cmd_keys *k = state(c, KS_SCAN, cursor);
    if (!k)
        return -ENOMEM;
    if (!c->keys_ticket) {
        uint64_t keys = kvt_count(c->table), want = count < FILE_STEP_MAX ? count : FILE_STEP_MAX;
        uint64_t n = keys ? (want * nb + keys - 1) / keys : nb;
        n = n < 1 ? 1 : n > FILE_STEP_MAX ? FILE_STEP_MAX : n;
        k->n = (uint32_t)(n > nb - first ? nb - first : n);
    }
    uint32_t n = k->n;
    struct kvbuf listed = {0};
    int rc = file_listing(c, (uint32_t)first, n, &listed);
    if (rc <= 0) {
        kvbuf_free(&listed);
        if (rc < 0)
            cmd_client_release(c);
        return 0;
    }
    cmd_client_release(c);
    size_t off = 0;
    struct rec r;
    while (rec_next(&listed, &off, &r)) {
        int type;
        /* MATCH first (no lock); TYPE once memory said which type is current */
        if ((!f->pat || glob_match(f->pat, f->plen, r.key, r.klen, 0)) && file_key_live(c->table, &r, &type) &&
            rec_add(&got, r.key, r.klen, type)) {
            kvbuf_free(&listed);
            kvbuf_free(&got);
            return -ENOMEM;
        }
    }
    kvbuf_free(&listed);
    uint64_t next = first + n < nb ? SCAN_FILE | (first + n) : 0;
    rc = reply_scan(c, next, &got, f);
    kvbuf_free(&got);
    return rc;
}

int c_scan(struct cmd_client *c, const struct cmd_args *a)
{
    uint64_t cursor;
    if (parse_cursor(a->argv[1], a->argl[1], &cursor))
        return cmd_reply_err(c, "ERR invalid cursor");
    struct filter f = {NULL, 0, -1, -1};
    long long count = 10;
    for (int i = 2; i < a->argc; i += 2) {
        int has_arg = i + 1 < a->argc;
        if (ARGIS(a, i, "COUNT") && has_arg) {
            if (cmd_arg_ll(a, i + 1, &count))
                return cmd_reply_err(c, ERR_INT);
            if (count < 1)
                return cmd_reply_err(c, ERR_SYNTAX);
        } else if (ARGIS(a, i, "MATCH") && has_arg) {
            filter_pattern(&f, a->argv[i + 1], a->argl[i + 1]);
        } else if (ARGIS(a, i, "TYPE") && has_arg) {
            f.type = filter_type(a->argv[i + 1], a->argl[i + 1]);
        } else {
            return cmd_reply_err(c, ERR_SYNTAX);
        }
    }
    if (cursor & SCAN_PHASES)
        return scan_file(c, cursor, (unsigned long long)count, &f);
    struct collect k = {{0}, 0};
    uint64_t next = kvt_scan(c->table, cursor, count > (1 << 30) ? 1u << 30 : (unsigned)count, collect_cb, &k);
    if (next == 0 && c->eng->bosc)
        next = SCAN_FILE; /* memory done: the data file's buckets from 0 */
    int rc = k.oom ? -ENOMEM : reply_scan(c, next, &k.buf, &f);
    kvbuf_free(&k.buf);
    return rc;
}

/* ---- KEYS pattern */

/* KEYS's set of keys returned (each key once: kvt_scan may return a key twice
 * across a rehash, and a key in memory is in its block too). */
static int set_find_or_add(struct cmd_keys *k, const char *key, size_t klen, size_t rec_off, int add)
{
    if (add && (k->set_n + 1) * 2 > k->set_cap) { /* grow: at most half full */
        size_t cap = k->set_cap ? k->set_cap * 2 : 1024;
        uint64_t *s = calloc(cap, sizeof *s);
        if (!s)
            return -ENOMEM;
        for (size_t i = 0; i < k->set_cap; i++) {
            if (!k->set[i])
                continue;
            struct rec r;
            size_t off = k->set[i] - 1;
            rec_next(&k->out, &off, &r);
            size_t j = kvt_hash(r.key, r.klen) & (cap - 1);
            while (s[j])
                j = (j + 1) & (cap - 1);
            s[j] = k->set[i];
        }
        free(k->set);
        k->set = s;
        k->set_cap = cap;
    }
    if (!k->set_cap)
        return 0;
    size_t j = kvt_hash(key, klen) & (k->set_cap - 1);
    for (; k->set[j]; j = (j + 1) & (k->set_cap - 1)) {
        struct rec r;
        size_t off = k->set[j] - 1;
        rec_next(&k->out, &off, &r);
        if (r.klen == klen && !memcmp(r.key, key, klen))
            return 1;
    }
    if (add) {
        k->set[j] = rec_off + 1;
        k->set_n++;
    }
    return 0;
}

/* Add a key to KEYS's reply unless it is there already. */
static int keys_add(struct cmd_keys *k, const char *key, size_t klen, int type)
{
    size_t off = k->out.len;
    if (rec_add(&k->out, key, klen, type))
        return -ENOMEM;
    int rc = set_find_or_add(k, key, klen, off, 1);
    if (rc != 0)
        k->out.len = off; /* already there, or no memory for the set */
    else
        k->nout++;
    return rc < 0 ? rc : 0;
}

/* Memory, in one run: every live key (kvt_scan to the end) that matches. */
static int keys_memory(struct cmd_client *c, struct cmd_keys *k, const struct filter *f)
{
    uint64_t cursor = 0;
    do {
        struct collect got = {{0}, 0};
        cursor = kvt_scan(c->table, cursor, KEYS_STEP, collect_cb, &got);
        size_t off = 0;
        struct rec r;
        int rc = got.oom ? -ENOMEM : 0;
        while (!rc && rec_next(&got.buf, &off, &r))
            if (filter_pass(f, r.key, r.klen, r.type))
                rc = keys_add(k, r.key, r.klen, r.type);
        kvbuf_free(&got.buf);
        if (rc)
            return rc;
    } while (cursor);
    return 0;
}

/* The data file, a listing per run: the keys that live only in their blocks, and
 * those memory holds but the memory phase did not see (loaded back since). 1 done,
 * 0 stalled, -1 error replied, -ENOMEM. */
static int keys_file(struct cmd_client *c, struct cmd_keys *k, const struct filter *f)
{
    uint32_t nb = bosc_buckets(c->eng->bosc);
    while (k->next < nb) {
        if (!c->keys_ticket)
            k->n = nb - k->next < FILE_STEP_MAX ? nb - k->next : FILE_STEP_MAX;
        struct kvbuf listed = {0};
        int rc = file_listing(c, k->next, k->n, &listed);
        if (rc <= 0) {
            kvbuf_free(&listed);
            return rc;
        }
        size_t off = 0;
        struct rec r;
        rc = 0;
        while (!rc && rec_next(&listed, &off, &r)) {
            int type;
            if (filter_pass(f, r.key, r.klen, -1) && file_key_live(c->table, &r, &type))
                rc = keys_add(k, r.key, r.klen, type);
        }
        kvbuf_free(&listed);
        if (rc < 0)
            return rc;
        k->next += k->n;
    }
    return 1;
}

/* KEYS's run (and CLUSTER COUNTKEYSINSLOT / GETKEYSINSLOT's): every key that passes f,
 * in memory and in the data file (stalling for its listings). Replies the keys, at
 * most max of them, or with max < 0 their number. */
static int keys_run(struct cmd_client *c, const struct filter *f, uint64_t id, long long max)
{
    struct cmd_keys *k = state(c, KS_KEYS, id);
    if (!k)
        return -ENOMEM;
    int rc = 0;
    /* The keys are gathered under the reply's bound (session.c): they take about what
     * their reply will, and a refusal closes the client as one in out would. */
    k->out.limit = kvbuf_room_limit(c->out);
    if (!k->file) {
        rc = keys_memory(c, k, f);
        k->file = 1;
    }
    if (!rc && c->eng->bosc) {
        rc = keys_file(c, k, f);
        if (rc == 0)
            return 0; /* stalled: carry on from k->next when run again */
        rc = rc == 1 ? 0 : rc;
        if (rc == -1) {
            cmd_client_release(c);
            return 0;
        }
    }
    c->out->over |= k->out.over;
    long long n = max < 0 || (long long)k->nout < max ? (long long)k->nout : max;
    if (!rc)
        rc = max < 0 ? resp_add_int(c->out, n) : resp_add_array(c->out, n);
    size_t off = 0;
    struct rec r;
    for (long long i = 0; !rc && max >= 0 && i < n && rec_next(&k->out, &off, &r); i++)
        rc = resp_add_bulk(c->out, r.key, r.klen);
    cmd_client_release(c);
    return rc;
}

int c_keys(struct cmd_client *c, const struct cmd_args *a)
{
    struct filter f = {NULL, 0, -1, -1};
    filter_pattern(&f, a->argv[1], a->argl[1]);
    return keys_run(c, &f, kvt_hash(a->argv[1], a->argl[1]), LLONG_MAX);
}

int cmd_keys_in_slot(struct cmd_client *c, int slot, long long max)
{
    struct filter f = {NULL, 0, -1, slot};
    return keys_run(c, &f, 0x510700000000ull + (uint64_t)slot, max);
}

/* ---- RANDOMKEY */

/* A random record of a list of keys (reservoir sampling), NULL if it is empty. */
static int pick_random(const struct kvbuf *b, struct rec *out)
{
    size_t off = 0;
    struct rec r;
    long seen = 0;
    while (rec_next(b, &off, &r))
        if (random() % ++seen == 0)
            *out = r;
    return seen > 0;
}

/* The data file from a random home bucket on, RANDOM_STEP buckets a listing,
 * wrapping around once: a random live key of the first listing that has one. */
static int random_file(struct cmd_client *c, struct cmd_keys *k)
{
    uint32_t nb = bosc_buckets(c->eng->bosc);
    while (k->visited < nb) {
        if (!c->keys_ticket) {
            uint32_t n = nb - k->next < RANDOM_STEP ? nb - k->next : RANDOM_STEP;
            k->n = n < nb - k->visited ? n : nb - k->visited;
        }
        struct kvbuf listed = {0}, live = {0};
        int rc = file_listing(c, k->next, k->n, &listed);
        if (rc <= 0) {
            kvbuf_free(&listed);
            if (rc < 0)
                cmd_client_release(c);
            return 0;
        }
        size_t off = 0;
        struct rec r;
        rc = 0;
        while (!rc && rec_next(&listed, &off, &r)) {
            int type;
            if (file_key_live(c->table, &r, &type))
                rc = rec_add(&live, r.key, r.klen, type);
        }
        kvbuf_free(&listed);
        k->visited += k->n;
        k->next = (k->next + k->n) % nb;
        if (!rc && pick_random(&live, &r))
            rc = resp_add_bulk(c->out, r.key, r.klen);
        size_t found = live.len;
        kvbuf_free(&live);
        if (rc || found) {
            cmd_client_release(c);
            return rc;
        }
    }
    cmd_client_release(c);
    return resp_add_null(c->out, c->resp);
}

/* A random key: kvt_random_key's pick in memory (which finds one if memory holds
 * any); if memory has none (after a restart with a data file, memory may hold
 * none of the keys), the data file's. */
int c_randomkey(struct cmd_client *c, const struct cmd_args *a)
{
    if (c->keys && c->keys->kind == KS_RANDOM) /* run again after a listing */
        return random_file(c, c->keys);
    struct collect k = {{0}, 0};
    kvt_random_key(c->table, collect_cb, &k);
    struct rec r;
    if (k.oom) {
        kvbuf_free(&k.buf);
        return -ENOMEM;
    }
    if (pick_random(&k.buf, &r)) {
        int rc = resp_add_bulk(c->out, r.key, r.klen);
        kvbuf_free(&k.buf);
        return rc;
    }
    kvbuf_free(&k.buf);
    struct bosc *b = c->eng->bosc;
    if (!b || !kvt_count(c->table) || !bosc_buckets(b))
        return resp_add_null(c->out, c->resp);
    struct cmd_keys *st = state(c, KS_RANDOM, 0);
    if (!st)
        return -ENOMEM;
    st->next = (uint32_t)((unsigned long)random() % bosc_buckets(b));
    return random_file(c, st);
}
