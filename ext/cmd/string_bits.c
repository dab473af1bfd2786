/* string_bits.c - Redis 7.0's bit commands on strings (SETBIT, GETBIT, BITCOUNT,
 * BITPOS) and LCS. Bit 0 is the most significant bit of byte 0. SETBIT is one
 * kvt_apply (one logged write); the readers work on the value under its shard
 * lock, except LCS, which copies both values out and computes unlocked with
 * Redis's bound on its table. Runs on front-end threads; arguments are untrusted. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/table.h"

#define ERR_BITOFF "ERR bit offset is not an integer or out of range"

/* Redis's getBitOffsetFromArgument: a bit offset within a 512 MB string. */
static int bit_offset_arg(const struct cmd_args *a, int i, uint64_t *off)
{
    long long v;
    if (cmd_arg_ll(a, i, &v) || v < 0 || (unsigned long long)v >> 3 >= KVT_MAX_VALUE)
        return -EINVAL;
    *off = (uint64_t)v;
    return 0;
}

static inline int bit_at(const unsigned char *p, uint64_t off) { return (p[off >> 3] >> (7 - (off & 7))) & 1; }

/* ---- SETBIT, GETBIT */

struct setbit_op {
    struct cmd_op op;
    uint64_t off;
    int on;
    struct kvbuf buf; /* the new value, alive until kvt_apply returns */
};

static int64_t setbit_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct setbit_op *s = arg;
    if (cur->exists && cur->type != KVT_STRING)
        return KVT_WRONGTYPE;
    size_t olen = cur->exists ? cur->vlen : 0, byte = s->off >> 3;
    int old = byte < olen ? bit_at((const unsigned char *)cur->val, s->off) : 0;
    if (byte < olen && old == s->on)
        return old; /* nothing changes */
    /* the byte with the bit changed; a string grows, zero-padded, to hold it */
    unsigned char mask = (unsigned char)(1u << (7 - (s->off & 7)));
    unsigned char b = byte < olen ? (unsigned char)cur->val[byte] : 0;
    b = s->on ? b | mask : b & ~mask;
    int64_t n = cmd_put_patched(&s->op, &s->buf, cur, byte, &b, 1, ch);
    return n < 0 ? n : old;
}

int c_setbit(struct cmd_client *c, const struct cmd_args *a)
{
    struct setbit_op s = {{c, NULL}, 0, 0, {0}};
    long long on;
    if (bit_offset_arg(a, 2, &s.off))
        return cmd_reply_err(c, ERR_BITOFF);
    if (cmd_arg_ll(a, 3, &on) || (on & ~1))
        return cmd_reply_err(c, "ERR bit is not an integer or out of range");
    s.on = (int)on;
    int64_t old;
    int ok = cmd_apply_key(c, a, setbit_fn, &s.op, a->argl[1] + (s.off >> 3) + 1, &old);
    kvbuf_free(&s.buf);
    return ok ? resp_add_int(c->out, old) : 0;
}

struct bitread_arg {
    uint64_t from, to; /* the bits [from, to] looked at (GETBIT: from alone) */
    long long start, end; /* BITCOUNT/BITPOS: the range as given */
    int isbit, bit, end_given;
    int err; /* the arguments are in error (or the range is known empty): no counting */
    long long result;
};

static void getbit_cb(void *arg, const char *v, size_t n)
{
    struct bitread_arg *r = arg;
    r->result = (r->from >> 3) < n ? bit_at((const unsigned char *)v, r->from) : 0;
}

int c_getbit(struct cmd_client *c, const struct cmd_args *a)
{
    struct bitread_arg r = {0};
    if (bit_offset_arg(a, 2, &r.from))
        return cmd_reply_err(c, ERR_BITOFF);
    int rc = cmd_read_key(c, a, getbit_cb, &r);
    return rc < 0 ? 0 : resp_add_int(c->out, rc ? r.result : 0);
}

/* ---- BITCOUNT, BITPOS */

/* The range given, in a string of n bytes (n * 8 bits with BIT), as the bits
 * [from, to]; 0 when it is empty. */
static int bit_range(struct bitread_arg *r, size_t n)
{
    long long start = r->start, end = r->end;
    if (!cmd_range(&start, &end, (long long)n * (r->isbit ? 8 : 1)))
        return 0;
    r->from = r->isbit ? (uint64_t)start : (uint64_t)start * 8;
    r->to = r->isbit ? (uint64_t)end : (uint64_t)end * 8 + 7;
    return 1;
}

/* Set bits among [from, to] of p. */
static long long popcount_range(const unsigned char *p, uint64_t from, uint64_t to)
{
    uint64_t b = from >> 3, e = to >> 3;
    long long n = 0;
    if (b == e) /* keep the bits from..to of the one byte */
        return __builtin_popcount((unsigned)(p[b] & (0xffu >> (from & 7)) & (0xffu << (7 - (to & 7)))));
    n += __builtin_popcount(p[b] & (0xffu >> (from & 7)));
    n += __builtin_popcount(p[e] & (0xffu << (7 - (to & 7))) & 0xffu);
    for (b++; b + 8 <= e; b += 8) {
        uint64_t w;
        memcpy(&w, p + b, 8);
        n += __builtin_popcountll(w);
    }
    for (; b < e; b++)
        n += __builtin_popcount(p[b]);
    return n;
}

/* The first bit equal to bit among [from, to] of p, or -1. */
static long long bitpos_range(const unsigned char *p, uint64_t from, uint64_t to, int bit)
{
    const unsigned char skip = bit ? 0x00 : 0xff; /* a byte without the bit sought */
    uint64_t b = from >> 3, e = to >> 3;
    for (; b <= e; b++) {
        unsigned x = bit ? p[b] : (unsigned char)~p[b]; /* the sought bits as ones */
        if (b == from >> 3)
            x &= 0xffu >> (from & 7);
        if (b == e)
            x &= 0xffu << (7 - (to & 7));
        x &= 0xff;
        if (x)
            return (long long)b * 8 + __builtin_clz(x) - 24;
        /* whole words at a time through the middle of a long range */
        while (b + 9 <= e) {
            uint64_t w, s;
            memset(&s, skip, 8);
            memcpy(&w, p + b + 1, 8);
            if (w != s)
                break;
            b += 8;
        }
    }
    return -1;
}

/* BITCOUNT key [start end [BYTE|BIT]] as Redis 7.0: the key is looked up before
 * the arguments are checked (a missing key counts 0 whatever they are). */
static void bitcount_cb(void *arg, const char *v, size_t n)
{
    struct bitread_arg *r = arg;
    r->result = 0;
    if (!r->err && bit_range(r, n))
        r->result = popcount_range((const unsigned char *)v, r->from, r->to);
}

int c_bitcount(struct cmd_client *c, const struct cmd_args *a)
{
    struct bitread_arg r = {0};
    const char *err = NULL;
    r.end = -1;
    if (a->argc == 4 || a->argc == 5) {
        if (cmd_arg_ll(a, 2, &r.start) || cmd_arg_ll(a, 3, &r.end))
            err = ERR_INT;
        else if (r.start < 0 && r.end < 0 && r.start > r.end)
            r.err = 1; /* empty: Redis answers 0 before it looks at BYTE|BIT */
        else if (a->argc == 5 && !(r.isbit = ARGIS(a, 4, "BIT")) && !ARGIS(a, 4, "BYTE"))
            err = ERR_SYNTAX;
    } else if (a->argc != 2) {
        err = ERR_SYNTAX;
    }
    r.err |= err != NULL;
    int rc = cmd_read_key(c, a, bitcount_cb, &r);
    if (rc < 0)
        return 0;
    if (rc && err)
        return cmd_reply_err(c, err);
    return resp_add_int(c->out, rc ? r.result : 0);
}

static void bitpos_cb(void *arg, const char *v, size_t n)
{
    struct bitread_arg *r = arg;
    r->result = -1; /* an empty range holds neither a 0 nor a 1 */
    if (r->err || !bit_range(r, n))
        return;
    r->result = bitpos_range((const unsigned char *)v, r->from, r->to, r->bit);
    /* No clear bit in the range: without an explicit end the string counts as
     * zero-padded on the right, so the bit after the range is the answer. */
    if (r->result < 0 && r->bit == 0 && !r->end_given)
        r->result = (long long)r->to + 1;
}

/* BITPOS key bit [start [end [BYTE|BIT]]] as Redis 7.0: bit is checked first,
 * a missing key answers before the range is looked at. */
int c_bitpos(struct cmd_client *c, const struct cmd_args *a)
{
    struct bitread_arg r = {0};
    long long bit;
    const char *err = NULL;
    if (cmd_arg_ll(a, 2, &bit))
        return cmd_reply_err(c, ERR_INT);
    if (bit != 0 && bit != 1)
        return cmd_reply_err(c, "ERR The bit argument must be 1 or 0.");
    r.bit = (int)bit;
    r.end = -1;
    if (a->argc > 6)
        err = ERR_SYNTAX;
    else if (a->argc >= 4 && cmd_arg_ll(a, 3, &r.start))
        err = ERR_INT;
    else if (a->argc == 6 && !(r.isbit = ARGIS(a, 5, "BIT")) && !ARGIS(a, 5, "BYTE"))
        err = ERR_SYNTAX;
    else if (a->argc >= 5 && cmd_arg_ll(a, 4, &r.end))
        err = ERR_INT;
    r.end_given = a->argc >= 5;
    r.err = err != NULL;
    int rc = cmd_read_key(c, a, bitpos_cb, &r);
    if (rc < 0)
        return 0;
    if (rc == 0) /* a missing key is an endless run of 0 bits */
        return resp_add_int(c->out, bit ? -1 : 0);
    return err ? cmd_reply_err(c, err) : resp_add_int(c->out, r.result);
}

/* ---- LCS */

/* Redis's bound on LCS's table of (alen+1) x (blen+1) 32-bit lengths: at most
 * proto-max-bulk-len (512 MB) bytes, refused beyond with Redis's own error. A
 * value longer than this many bytes cannot fit whatever the other is, so it is
 * not even copied out. */
#define LCS_MAX_TABLE ((unsigned long long)KVT_MAX_VALUE)
#define LCS_MAX_LEN (LCS_MAX_TABLE / sizeof(uint32_t) - 1)

struct lcs_val {
    struct kvbuf v;
    size_t len;
    int nomem;
};

static void lcs_copy_cb(void *arg, const char *v, size_t n)
{
    struct lcs_val *x = arg;
    x->len = n;
    if (n && n <= LCS_MAX_LEN && kvbuf_append(&x->v, v, n))
        x->nomem = 1;
}

/* Read key i into x: 1, or 0 when the request was answered or stalled. */
static int lcs_read(struct cmd_client *c, const struct cmd_args *a, int i, struct lcs_val *x)
{
    int rc = kvt_get(c->table, a->argv[i], a->argl[i], lcs_copy_cb, x);
    if (rc == -ENODATA)
        cmd_need_load(c, a->argv[i], a->argl[i]);
    else if (rc == KVT_WRONGTYPE)
        cmd_reply_err(c, "ERR The specified keys must contain string values");
    else if (x->nomem)
        cmd_reply_err(c, ERR_NOMEM);
    return rc >= 0 && !x->nomem;
}

struct lcs_opts {
    int getlen, getidx, withmatchlen;
    long long minmatchlen;
};

/* The table's backtrack, as Redis walks it (from the ends of both strings):
 * the LCS string into s (idx bytes) and, for IDX, the matched ranges into m. */
static uint32_t lcs_walk(const uint32_t *t, const char *a, uint32_t alen, const char *b, uint32_t blen,
                         const struct lcs_opts *o, char *s, struct kvbuf *m)
{
#define T(i, j) t[(size_t)(j) + (size_t)(i) * (blen + 1)]
    uint32_t i = alen, j = blen, idx = T(alen, blen), nranges = 0;
    uint32_t as = alen, ae = 0, bs = 0, be = 0; /* the range being grown; as == alen: none */
    while (i > 0 && j > 0) {
        int emit = 0;
        if (a[i - 1] == b[j - 1]) {
            s[idx - 1] = a[i - 1];
            if (as == alen) {
                as = ae = i - 1;
                bs = be = j - 1;
            } else if (as == i && bs == j) { /* contiguous: extend backwards */
                as--;
                bs--;
            } else {
                emit = 1;
            }
            if (as == 0 || bs == 0)
                emit = 1;
            idx--;
            i--;
            j--;
        } else {
            if (T(i - 1, j) > T(i, j - 1))
                i--;
            else
                j--;
            if (as != alen)
                emit = 1;
        }
        uint32_t mlen = ae - as + 1;
        if (emit) {
            if (o->getidx && (o->minmatchlen == 0 || mlen >= o->minmatchlen)) {
                resp_add_array(m, 2 + o->withmatchlen);
                resp_add_array(m, 2);
                resp_add_int(m, as);
                resp_add_int(m, ae);
                resp_add_array(m, 2);
                resp_add_int(m, bs);
                resp_add_int(m, be);
                if (o->withmatchlen)
                    resp_add_int(m, mlen);
                nranges++;
            }
            as = alen;
        }
    }
    return nranges;
#undef T
}

static int lcs_reply(struct cmd_client *c, const struct lcs_val *x, const struct lcs_val *y, const struct lcs_opts *o)
{
    uint32_t alen = (uint32_t)x->len, blen = (uint32_t)y->len;
    const char *a = x->v.p, *b = y->v.p;
    unsigned long long cells = (unsigned long long)(alen + 1ull) * (blen + 1ull);
    if (cells * sizeof(uint32_t) > LCS_MAX_TABLE)
        return cmd_reply_err(c, "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len");
    uint32_t *t = malloc(cells * sizeof(uint32_t));
    if (!t)
        return cmd_reply_err(c, "ERR Insufficient memory, failed allocating transient memory for LCS");
#define T(i, j) t[(size_t)(j) + (size_t)(i) * (blen + 1)]
    for (uint32_t i = 0; i <= alen; i++)
        for (uint32_t j = 0; j <= blen; j++) {
            if (i == 0 || j == 0)
                T(i, j) = 0;
            else if (a[i - 1] == b[j - 1])
                T(i, j) = T(i - 1, j - 1) + 1;
            else
                T(i, j) = T(i - 1, j) > T(i, j - 1) ? T(i - 1, j) : T(i, j - 1);
        }
    uint32_t len = T(alen, blen);
#undef T
    int rc = 0;
    if (o->getlen) {
        rc = resp_add_int(c->out, len);
    } else {
        struct kvbuf m = {0};
        char *s = malloc(len ? len : 1);
        if (!s) {
            free(t);
            return cmd_reply_err(c, "ERR Insufficient memory, failed allocating transient memory for LCS");
        }
        uint32_t n = lcs_walk(t, a, alen, b, blen, o, s, &m);
        if (!o->getidx) {
            rc = resp_add_bulk(c->out, s, len);
        } else {
            resp_add_map(c->out, c->resp, 2);
            resp_add_bulk_str(c->out, "matches");
            resp_add_array(c->out, n);
            if (m.len) /* (no ranges: m.p is NULL) */
                kvbuf_append(c->out, m.p, m.len);
            resp_add_bulk_str(c->out, "len");
            rc = resp_add_int(c->out, len);
        }
        kvbuf_free(&m);
        free(s);
    }
    free(t);
    return rc;
}

/* LCS key1 key2 [LEN] [IDX] [MINMATCHLEN len] [WITHMATCHLEN]. As Redis: the
 * keys' types first, then the options; a missing key is the empty string.
 * The two values are read one after the other (each consistent, the pair not
 * isolated against a concurrent writer). */
int c_lcs(struct cmd_client *c, const struct cmd_args *a)
{
    struct lcs_val x = {{0}, 0, 0}, y = {{0}, 0, 0};
    struct lcs_opts o = {0, 0, 0, 0};
    int rc = 0;
    if (!lcs_read(c, a, 1, &x) || !lcs_read(c, a, 2, &y))
        goto out;
    for (int i = 3; i < a->argc; i++) {
        if (ARGIS(a, i, "IDX")) {
            o.getidx = 1;
        } else if (ARGIS(a, i, "LEN")) {
            o.getlen = 1;
        } else if (ARGIS(a, i, "WITHMATCHLEN")) {
            o.withmatchlen = 1;
        } else if (ARGIS(a, i, "MINMATCHLEN") && i + 1 < a->argc) {
            if (cmd_arg_ll(a, ++i, &o.minmatchlen)) {
                rc = cmd_reply_err(c, ERR_INT);
                goto out;
            }
            if (o.minmatchlen < 0)
                o.minmatchlen = 0;
        } else {
            rc = cmd_reply_err(c, ERR_SYNTAX);
            goto out;
        }
    }
    if (o.getlen && o.getidx)
        rc = cmd_reply_err(c, "ERR If you want both the length and indexes, please just use IDX.");
    else
        rc = lcs_reply(c, &x, &y, &o);
out:
    kvbuf_free(&x.v);
    kvbuf_free(&y.v);
    return rc;
}
