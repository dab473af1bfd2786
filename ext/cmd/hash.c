/* hash.c - hash commands: HSET, HMSET, HSETNX, HGET, HMGET, HGETALL, HKEYS, HVALS,
 * HDEL, HEXISTS, HLEN, HSTRLEN, HINCRBY, HINCRBYFLOAT, HRANDFIELD, HSCAN.
 * A hash is one table value of type KVT_HASH, encoded by core/hashenc.h; every
 * command is one kvt_apply on its key: the function sees the key's state under
 * its shard lock and reads it (replying from it there) or builds the whole new
 * encoding, which the table logs and stores as one write (the key's TTL kept).
 * Replies and errors are Redis 7.0's, byte for byte, as for a small (listpack)
 * hash. Runs on front-end threads; arguments and stored values are untrusted. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "core/glob.h"
#include "core/hashenc.h"
#include "core/table.h"

#define ERR_DAMAGED "ERR the hash stored at this key is damaged (invalid encoding)"
/* HRANDFIELD with a negative count repeats fields without end: a reply that
 * could pass this many bytes is refused (Redis would build it). */
#define RAND_MAX_REPLY (512ull * 1024 * 1024)

/* One command's state across its kvt_apply. */
struct hop {
    struct cmd_op op;     /* the client; the error a function fails with (fail()) */
    const struct cmd_args *a;
    kvt_apply_fn fn;      /* the command's function, run by hop_fn */
    struct kvbuf buf;     /* writes: the new encoding */
    int reply_oom;        /* a read's reply could not be queued */
    int what;             /* HGETALL/HKEYS/HVALS: bit 1 fields, bit 2 values */
    long long ll;         /* HINCRBY: the increment, then the result; HRANDFIELD: the count */
    int has_count, withvalues;
    long double ld;       /* HINCRBYFLOAT: the increment */
    const char *pat;      /* HSCAN MATCH, NULL = all */
    size_t patlen;
    const char *opt_err;  /* HSCAN: its options' error, replied once the key is known a hash */
    size_t numlen;
    char num[CMD_LD_CHARS]; /* HINCRBY(FLOAT): the new value as text */
};

#define HOP(c, a) {.op = {(c), NULL}, .a = (a)}

static int64_t fail(struct hop *h, const char *err)
{
    h->op.err = err;
    return CMD_OP_ERR;
}

/* Runs the command's function under the shard lock; the errors only hashes
 * have become cmd_apply_key's: a damaged encoding, a reply that found no memory. */
static int64_t hop_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct hop *h = arg;
    int64_t rc = h->fn(h, cur, ch);
    if (rc == -EBADMSG)
        return fail(h, ERR_DAMAGED);
    return h->reply_oom ? fail(h, ERR_NOMEM) : rc;
}

/* Run fn on the key (argument 1) through cmd_apply_key: 1 when fn succeeded (its
 * result in *res: the caller replies, unless fn did), else 0 (the error replied, or
 * the request stalled for a load or for memory). */
static int happly(struct hop *h, kvt_apply_fn fn, int64_t *res)
{
    size_t need = 64;  /* a write grows the hash by about its arguments */
    for (int i = 1; i < h->a->argc; i++)
        need += h->a->argl[i];
    h->fn = fn;
    int ok = cmd_apply_key(h->op.c, h->a, hop_fn, &h->op, need, res);
    kvbuf_free(&h->buf);
    return ok;
}

/* Run fn and reply its result as an integer (HSETNX, HDEL, HLEN, HEXISTS, HSTRLEN). */
static int run_int(struct hop *h, kvt_apply_fn fn)
{
    int64_t n;
    return happly(h, fn, &n) ? resp_add_int(h->op.c->out, n) : 0;
}

/* Run fn, which replies itself (the reads). */
static int run_read(struct hop *h, kvt_apply_fn fn)
{
    int64_t n;
    happly(h, fn, &n);
    return 0;
}

/* A string key is the wrong type for every hash command; absent is an empty hash. */
#define NEED_HASH(cur)                                       \
    do {                                                     \
        if ((cur)->exists && (cur)->type != KVT_HASH)        \
            return KVT_WRONGTYPE;                            \
    } while (0)

static inline const char *hval(const struct kvt_state *cur) { return cur->exists ? cur->val : NULL; }

/* Store h->buf, or delete the key when it holds no field (as Redis deletes an
 * empty hash). Returns res. */
static int64_t put(struct hop *h, struct kvt_change *ch, int64_t res)
{
    if (hashenc_len(h->buf.p, h->buf.len) == 0) {
        ch->action = KVT_DELETE;
        return res;
    }
    ch->action = KVT_PUT;
    ch->type = KVT_HASH;
    ch->val = h->buf.p;
    ch->n1 = h->buf.len;
    ch->v2 = NULL;
    ch->n2 = 0;
    return res; /* ch->expire_ms stays the key's own: a hash write keeps its TTL */
}

/* Track reply-buffer failures of a read (the table's lock is held: no reply
 * of an error from here). */
static inline void out_rc(struct hop *h, int rc)
{
    if (rc)
        h->reply_oom = 1;
}

static void add_bulk(struct hop *h, const char *p, size_t n) { out_rc(h, resp_add_bulk(h->op.c->out, p, n)); }

/* ---- HSET, HMSET, HSETNX, HDEL */

static int64_t hset_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct hop *h = arg;
    NEED_HASH(cur);
    const struct cmd_args *a = h->a;
    int64_t n = hashenc_set(&h->buf, hval(cur), cur->vlen, a->argv + 2, a->argl + 2, (size_t)(a->argc - 2) / 2);
    return n < 0 ? n : put(h, ch, n);
}

static int hset_generic(struct cmd_client *c, const struct cmd_args *a, const char *name)
{
    if (a->argc % 2)
        return resp_add_errorf(c->out, "ERR wrong number of arguments for '%s' command", name);
    struct hop h = HOP(c, a);
    int64_t n;
    if (!happly(&h, hset_fn, &n))
        return 0;
    return name[1] == 's' ? resp_add_int(c->out, n) : cmd_reply_ok(c);
}

int c_hset(struct cmd_client *c, const struct cmd_args *a) { return hset_generic(c, a, "hset"); }

int c_hmset(struct cmd_client *c, const struct cmd_args *a) { return hset_generic(c, a, "hmset"); }

static int64_t hsetnx_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct hop *h = arg;
    NEED_HASH(cur);
    struct hashenc_entry e;
    int rc = hashenc_find(hval(cur), cur->vlen, h->a->argv[2], h->a->argl[2], &e);
    if (rc)
        return rc < 0 ? rc : 0; /* there: nothing changes */
    return hset_fn(arg, cur, ch);
}

int c_hsetnx(struct cmd_client *c, const struct cmd_args *a)
{
    struct hop h = HOP(c, a);
    return run_int(&h, hsetnx_fn);
}

static int64_t hdel_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct hop *h = arg;
    NEED_HASH(cur);
    if (!cur->exists)
        return 0;
    const struct cmd_args *a = h->a;
    struct hashenc_fields fs = {a->argv + 2, a->argl + 2, (size_t)a->argc - 2, 1};
    int64_t n = hashenc_del(&h->buf, cur->val, cur->vlen, &fs);
    if (n <= 0)
        return n; /* none removed: no write */
    return put(h, ch, n);
}

int c_hdel(struct cmd_client *c, const struct cmd_args *a)
{
    struct hop h = HOP(c, a);
    return run_int(&h, hdel_fn);
}

/* ---- reads of single fields: HGET, HEXISTS, HSTRLEN, and HLEN */

enum { GET_VALUE, GET_EXISTS, GET_STRLEN };

static int64_t hfield_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct hop *h = arg;
    NEED_HASH(cur);
    struct hashenc_entry e;
    int rc = hashenc_find(hval(cur), cur->vlen, h->a->argv[2], h->a->argl[2], &e);
    if (rc < 0)
        return rc;
    if (h->what == GET_VALUE) {
        if (rc)
            add_bulk(h, e.v, e.vlen);
        else
            out_rc(h, resp_add_null(h->op.c->out, h->op.c->resp));
        return 0;
    }
    return h->what == GET_EXISTS ? rc : (rc ? (int64_t)e.vlen : 0);
}

static int hfield_generic(struct cmd_client *c, const struct cmd_args *a, int what)
{
    struct hop h = HOP(c, a);
    h.what = what;
    return what == GET_VALUE ? run_read(&h, hfield_fn) : run_int(&h, hfield_fn);
}

int c_hget(struct cmd_client *c, const struct cmd_args *a) { return hfield_generic(c, a, GET_VALUE); }

int c_hexists(struct cmd_client *c, const struct cmd_args *a) { return hfield_generic(c, a, GET_EXISTS); }

int c_hstrlen(struct cmd_client *c, const struct cmd_args *a) { return hfield_generic(c, a, GET_STRLEN); }

static int64_t hlen_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    NEED_HASH(cur);
    return hashenc_len(hval(cur), cur->vlen);
}

int c_hlen(struct cmd_client *c, const struct cmd_args *a)
{
    struct hop h = HOP(c, a);
    return run_int(&h, hlen_fn);
}

/* ---- HMGET */

static int64_t hmget_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct hop *h = arg;
    NEED_HASH(cur);
    const struct cmd_args *a = h->a;
    struct hashenc_fields fs = {a->argv + 2, a->argl + 2, (size_t)a->argc - 2, 1};
    struct hashenc_entry few[HASHENC_SMALL], *found = few;
    if (fs.n > HASHENC_SMALL && !(found = malloc(fs.n * sizeof *found)))
        return -ENOMEM;
    int rc = hashenc_lookup(hval(cur), cur->vlen, &fs, found);
    if (!rc) {
        out_rc(h, resp_add_array(h->op.c->out, (long long)fs.n));
        for (size_t i = 0; i < fs.n; i++) {
            if (found[i].f)
                add_bulk(h, found[i].v, found[i].vlen);
            else
                out_rc(h, resp_add_null(h->op.c->out, h->op.c->resp));
        }
    }
    if (found != few)
        free(found);
    return rc;
}

int c_hmget(struct cmd_client *c, const struct cmd_args *a)
{
    struct hop h = HOP(c, a);
    return run_read(&h, hmget_fn);
}

/* ---- HGETALL, HKEYS, HVALS */

enum { ALL_FIELDS = 1, ALL_VALUES = 2 };

static int64_t hall_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct hop *h = arg;
    NEED_HASH(cur);
    struct cmd_client *c = h->op.c;
    struct hashenc_iter it;
    struct hashenc_entry e;
    int rc = hashenc_iter_init(&it, hval(cur), cur->vlen);
    if (rc)
        return rc;
    long long n = hashenc_len(hval(cur), cur->vlen);
    if (h->what == (ALL_FIELDS | ALL_VALUES))
        out_rc(h, resp_add_map(c->out, c->resp, n));
    else
        out_rc(h, resp_add_array(c->out, n));
    while ((rc = hashenc_next(&it, &e)) == 1) {
        if (h->what & ALL_FIELDS)
            add_bulk(h, e.f, e.flen);
        if (h->what & ALL_VALUES)
            add_bulk(h, e.v, e.vlen);
    }
    return rc;
}

static int hall_generic(struct cmd_client *c, const struct cmd_args *a, int what)
{
    struct hop h = HOP(c, a);
    h.what = what;
    return run_read(&h, hall_fn);
}

int c_hgetall(struct cmd_client *c, const struct cmd_args *a) { return hall_generic(c, a, ALL_FIELDS | ALL_VALUES); }

int c_hkeys(struct cmd_client *c, const struct cmd_args *a) { return hall_generic(c, a, ALL_FIELDS); }

int c_hvals(struct cmd_client *c, const struct cmd_args *a) { return hall_generic(c, a, ALL_VALUES); }

/* ---- HINCRBY, HINCRBYFLOAT */

/* Redis's string2ll on bytes (cmd_arg_ll's rules). */
static int str2ll(const char *s, size_t n, long long *v)
{
    struct cmd_args one = {1, &s, &n};
    return cmd_arg_ll(&one, 0, v);
}

/* Set field (argument 2) to h->num. */
static int64_t set_num(struct hop *h, const struct kvt_state *cur, struct kvt_change *ch)
{
    const char *pair[2] = {h->a->argv[2], h->num};
    size_t lens[2] = {h->a->argl[2], h->numlen};
    int64_t n = hashenc_set(&h->buf, hval(cur), cur->vlen, pair, lens, 1);
    return n < 0 ? n : put(h, ch, 0);
}

static int64_t hincrby_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct hop *h = arg;
    NEED_HASH(cur);
    struct hashenc_entry e;
    int rc = hashenc_find(hval(cur), cur->vlen, h->a->argv[2], h->a->argl[2], &e);
    long long old = 0, incr = h->ll;
    if (rc < 0)
        return rc;
    if (rc && str2ll(e.v, e.vlen, &old))
        return fail(h, "ERR hash value is not an integer");
    if ((incr < 0 && old < 0 && incr < LLONG_MIN - old) || (incr > 0 && old > 0 && incr > LLONG_MAX - old))
        return fail(h, "ERR increment or decrement would overflow");
    h->ll = old + incr;
    h->numlen = (size_t)resp_ll2str(h->num, h->ll);
    return set_num(h, cur, ch);
}

int c_hincrby(struct cmd_client *c, const struct cmd_args *a)
{
    struct hop h = HOP(c, a);
    if (cmd_arg_ll(a, 3, &h.ll))
        return cmd_reply_err(c, ERR_INT);
    int64_t n;
    return happly(&h, hincrby_fn, &n) ? resp_add_int(c->out, h.ll) : 0;
}

static int64_t hincrbyfloat_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct hop *h = arg;
    NEED_HASH(cur);
    struct hashenc_entry e;
    int rc = hashenc_find(hval(cur), cur->vlen, h->a->argv[2], h->a->argl[2], &e);
    long double v = 0;
    if (rc < 0)
        return rc;
    if (rc && !cmd_str2ld(e.v, e.vlen, &v))
        return fail(h, "ERR hash value is not a float");
    v += h->ld;
    if (isnan(v) || isinf(v))
        return fail(h, "ERR increment would produce NaN or Infinity");
    h->numlen = cmd_ld2str(h->num, sizeof h->num, v);
    return set_num(h, cur, ch);
}

int c_hincrbyfloat(struct cmd_client *c, const struct cmd_args *a)
{
    struct hop h = HOP(c, a);
    if (!cmd_str2ld(a->argv[3], a->argl[3], &h.ld))
        return cmd_reply_err(c, "ERR value is not a valid float");
    if (isnan(h.ld) || isinf(h.ld))
        return cmd_reply_err(c, "ERR value is NaN or Infinity");
    int64_t n;
    return happly(&h, hincrbyfloat_fn, &n) ? resp_add_bulk(c->out, h.num, h.numlen) : 0;
}

/* ---- HRANDFIELD */

/* xorshift64*, one per thread, seeded from getrandom: picks need not be
 * unpredictable, only spread. */
static __thread uint64_t rng_s;

static uint64_t rnd_below(uint64_t n)
{
    if (!rng_s) {
        if (getrandom(&rng_s, sizeof rng_s, 0) != sizeof rng_s)
            rng_s = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)&rng_s;
        rng_s |= 1;
    }
    rng_s ^= rng_s >> 12;
    rng_s ^= rng_s << 25;
    rng_s ^= rng_s >> 27;
    return (rng_s * 0x2545F4914F6CDD1DULL) % n;
}

/* One element of HRANDFIELD's reply: the field, or [field, value]
 * (RESP3 WITHVALUES), or field, value (RESP2 WITHVALUES, a flat array). */
static void rand_elem(struct hop *h, const struct hashenc_entry *e)
{
    if (h->withvalues && h->op.c->resp == 3)
        out_rc(h, resp_add_array(h->op.c->out, 2));
    add_bulk(h, e->f, e->flen);
    if (h->withvalues)
        add_bulk(h, e->v, e->vlen);
}

static void rand_header(struct hop *h, long long n)
{
    out_rc(h, resp_add_array(h->op.c->out, h->withvalues && h->op.c->resp == 2 ? 2 * n : n));
}

/* A negative count: |count| picks with repeats, in the order drawn. One walk
 * notes where each entry starts; each pick decodes one (O(n + count)). */
static int64_t rand_repeats(struct hop *h, const char *val, size_t vlen, uint64_t n, uint64_t count)
{
    uint32_t *off = malloc(n * sizeof *off); /* n <= vlen / 2: bounded by the value */
    if (!off)
        return -ENOMEM;
    struct hashenc_iter it;
    struct hashenc_entry e;
    size_t i = 0, widest = 0;
    int rc = hashenc_iter_init(&it, val, vlen);
    while (!rc && (rc = hashenc_next(&it, &e)) == 1) {
        off[i++] = (uint32_t)(e.raw - val);
        widest = e.rawlen > widest ? e.rawlen : widest;
        rc = 0;
    }
    if (!rc && count > RAND_MAX_REPLY / (widest + 32))
        rc = (int)fail(h, "ERR value is out of range (the reply would pass 512 MB)");
    if (!rc) {
        rand_header(h, (long long)count);
        for (uint64_t k = 0; k < count && rc >= 0 && !h->reply_oom; k++)
            if ((rc = hashenc_entry_at(val, vlen, off[rnd_below(n)], &e)) == 1)
                rand_elem(h, &e);
    }
    free(off);
    return rc < 0 ? rc : 0;
}

static int64_t hrandfield_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct hop *h = arg;
    NEED_HASH(cur);
    struct cmd_client *c = h->op.c;
    int64_t n = hashenc_len(hval(cur), cur->vlen);
    if (n < 0)
        return n;
    if (!n || (h->has_count && h->ll == 0)) { /* absent: null, or with a count an empty array */
        out_rc(h, h->has_count ? resp_add_array(c->out, 0) : resp_add_null(c->out, c->resp));
        return 0;
    }
    uint64_t count = h->ll < 0 ? 0 - (uint64_t)h->ll : (uint64_t)h->ll;
    if (h->has_count && (h->ll < 0 || count == 1))
        return rand_repeats(h, cur->val, cur->vlen, (uint64_t)n, count);
    /* one field, or up to count distinct fields: selection sampling in one walk
     * (each entry taken with probability wanted / left), in the hash's order */
    uint64_t want = !h->has_count ? 1 : count < (uint64_t)n ? count : (uint64_t)n;
    if (h->has_count)
        rand_header(h, (long long)want);
    struct hashenc_iter it;
    struct hashenc_entry e;
    int rc = hashenc_iter_init(&it, cur->val, cur->vlen);
    for (uint64_t left = (uint64_t)n; !rc && want && (rc = hashenc_next(&it, &e)) == 1; left--) {
        rc = 0;
        if (rnd_below(left) >= want)
            continue;
        want--;
        if (h->has_count)
            rand_elem(h, &e);
        else
            add_bulk(h, e.f, e.flen);
    }
    return rc < 0 ? rc : 0;
}

/* HRANDFIELD key [count [WITHVALUES]] */
int c_hrandfield(struct cmd_client *c, const struct cmd_args *a)
{
    struct hop h = HOP(c, a);
    if (a->argc >= 3) {
        if (cmd_arg_ll(a, 2, &h.ll))
            return cmd_reply_err(c, ERR_INT);
        if (h.ll == LLONG_MIN)
            return cmd_reply_err(c, "ERR value is out of range, value must between -9223372036854775807 and "
                                    "9223372036854775807");
        if (a->argc > 4 || (a->argc == 4 && !ARGIS(a, 3, "WITHVALUES")))
            return cmd_reply_err(c, ERR_SYNTAX);
        if (a->argc == 4 && (h.ll < -LLONG_MAX / 2 || h.ll > LLONG_MAX / 2))
            return cmd_reply_err(c, "ERR value is out of range");
        h.has_count = 1;
        h.withvalues = a->argc == 4;
    }
    return run_read(&h, hrandfield_fn);
}

/* ---- HSCAN */

/* Redis's parseScanCursorOrReply: strtoul on the argument up to its first NUL,
 * no leading space, nothing left over, no overflow ("-1" wraps, "" is 0). */
static int scan_cursor(const char *s, size_t n, unsigned long *out)
{
    size_t len = strnlen(s, n), i = 0;
    if (len && isspace((unsigned char)s[0]))
        return -EINVAL;
    int neg = len && (s[0] == '-' || s[0] == '+') ? (i++, s[0] == '-') : 0;
    size_t digits = i;
    unsigned long v = 0;
    int over = 0;
    for (; i < len && s[i] >= '0' && s[i] <= '9'; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        over |= v > (ULONG_MAX - d) / 10;
        v = v * 10 + d;
    }
    if (i == digits) { /* no digits: strtoul stops at the start */
        *out = 0;
        return len ? -EINVAL : 0;
    }
    if (i != len || over)
        return -EINVAL;
    *out = neg ? 0 - v : v;
    return 0;
}

static int64_t hscan_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct hop *h = arg;
    NEED_HASH(cur);
    struct kvbuf *out = h->op.c->out;
    if (!cur->exists) {
        out_rc(h, kvbuf_append(out, "*2\r\n$1\r\n0\r\n*0\r\n", 15));
        return 0;
    }
    if (h->opt_err) /* options are read after the key, as in Redis */
        return fail(h, h->opt_err);
    /* the elements go to a side buffer first: their number comes before them (under the
     * reply's bound, session.c: a refusal there closes the client as one in out would) */
    struct kvbuf els = {.limit = kvbuf_room_limit(out)};
    struct hashenc_iter it;
    struct hashenc_entry e;
    long long m = 0;
    int rc = hashenc_iter_init(&it, cur->val, cur->vlen);
    while (!rc && (rc = hashenc_next(&it, &e)) == 1) {
        rc = 0;
        if (h->pat && !glob_match(h->pat, h->patlen, e.f, e.flen, 0))
            continue;
        if (resp_add_bulk(&els, e.f, e.flen) || resp_add_bulk(&els, e.v, e.vlen))
            rc = -ENOMEM;
        m += 2;
    }
    if (!rc) {
        out_rc(h, kvbuf_append(out, "*2\r\n$1\r\n0\r\n", 11));
        out_rc(h, resp_add_array(out, m));
        out_rc(h, kvbuf_append(out, els.p, els.len));
    }
    out->over |= els.over;
    kvbuf_free(&els);
    return rc;
}

/* HSCAN key cursor [MATCH pattern] [COUNT count]. A hash is one value here, as
 * a small (listpack) hash is in Redis: the reply holds every matching field and
 * value, with cursor 0, whatever the cursor and COUNT. */
int c_hscan(struct cmd_client *c, const struct cmd_args *a)
{
    unsigned long cursor;
    if (scan_cursor(a->argv[2], a->argl[2], &cursor))
        return cmd_reply_err(c, "ERR invalid cursor");
    struct hop h = HOP(c, a);
    for (int i = 3; i < a->argc && !h.opt_err; i += 2) {
        long long count;
        if (ARGIS(a, i, "COUNT") && i + 1 < a->argc) {
            if (cmd_arg_ll(a, i + 1, &count))
                h.opt_err = ERR_INT;
            else if (count < 1)
                h.opt_err = ERR_SYNTAX;
        } else if (ARGIS(a, i, "MATCH") && i + 1 < a->argc) {
            int all = a->argl[i + 1] == 1 && a->argv[i + 1][0] == '*';
            h.pat = all ? NULL : a->argv[i + 1];
            h.patlen = a->argl[i + 1];
        } else {
            h.opt_err = ERR_SYNTAX;
        }
    }
    return run_read(&h, hscan_fn);
}
