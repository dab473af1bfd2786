/* loadgen_reply.c - the load generator's reply side: RESP2 and memcache text
 * replies parsed from a connection's read buffer (possibly split anywhere),
 * matched in order to the requests in flight, counted (hit, miss, error) and,
 * with check=1, GET values compared byte for byte with what SET wrote. Runs on
 * the connection's worker thread. Server bytes are untrusted: every line and
 * length is bounded (MAX_LINE, MAX_VALUE) and a violation fails the run. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/loadgen_int.h"

static int complete(struct worker *w, struct conn *c, uint64_t now, int res)
{
    const struct slot *s = &c->ring[c->rhead];
    uint64_t lat = now > s->t ? now - s->t : 0;
    if (++c->rhead == w->r->depth) c->rhead = 0;
    c->rcount--, w->inflight--, w->requests++;
    *(s->kind == K_SET ? &w->sets : &w->gets) += 1;
    w->hits += res == RES_HIT, w->misses += res == RES_MISS, w->errors += res == RES_ERR || c->bad;
    c->bad = 0, w->lat_sum += lat, w->hist[hist_index(lat)]++, w->last_reply = now;
    if (lat > w->lat_max) w->lat_max = lat;
    return 0;
}

__attribute__((format(printf, 3, 4)))
static void mismatch(struct worker *w, struct conn *c, const char *fmt, ...)
{
    char buf[112]; va_list ap;
    const struct slot *s = &c->ring[c->rhead];
    va_start(ap, fmt), vsnprintf(buf, sizeof buf, fmt, ap), va_end(ap);
    c->bad = 1;
    lg_note_error(w, "%s key:%012llu: %s", s->kind == K_SET ? "SET" : "GET", (unsigned long long)s->key, buf);
}

static int odd(struct worker *w, struct conn *c, const char *p, size_t len, uint64_t now)
{
    if (w->r->check) mismatch(w, c, "unexpected reply '%.*s'", SHOW(p, len));
    return complete(w, c, now, RES_ODD);
}

/* Strict decimal: optional '-' (if allowed), 1..18 digits, nothing else. */
static int parse_num(const char *p, size_t len, int neg_ok, int64_t *out)
{
    int64_t v = 0, neg = 0;
    if (len && p[0] == '-' && neg_ok) neg = 1, p++, len--;
    if (!len || len > 18) return -1;
    for (size_t i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        v = v * 10 + (p[i] - '0');
    }
    *out = neg ? -v : v;
    return 0;
}

static void bulk_begin(struct worker *w, struct conn *c, uint64_t n, int res)
{
    c->bres = res, c->bleft = n, c->boff = 0, c->cmp = 0;
    if (res == RES_OK)
        ; /* XADD's new ID: a bulk is all there is to check */
    else if (w->r->check && res == RES_ODD)
        mismatch(w, c, "unexpected value reply of %llu bytes", (unsigned long long)n);
    else if (w->r->check && n != w->r->vsize)
        mismatch(w, c, "value length %llu, expected %llu", (unsigned long long)n,
                 (unsigned long long)w->r->vsize);
    else if (w->r->check) { fmt12(c->dig, c->ring[c->rhead].key); c->cmp = 1; }
    c->pst = n ? PS_BULK : PS_CRLF;
}

/* Offset of the first byte of p[0..len) that differs from value(key)[off..], or -1. */
static int64_t value_diff(const struct run *r, const char *dig, uint64_t off, const char *p, size_t len)
{
    uint64_t n = r->vsize, k = n < 12 ? n : 12, tail = n >= 24 ? n - 12 : n;
    while (len) {
        const char *e; uint64_t m;
        if (off < k) e = dig + 12 - k + off, m = k - off;
        else if (off < tail) e = r->filler + off, m = tail - off;
        else e = dig + (off - tail), m = n - off;
        if (m > len) m = len;
        if (memcmp(p, e, m))
            for (uint64_t i = 0;; i++)
                if (p[i] != e[i]) return (int64_t)(off + i);
        off += m, p += m, len -= m;
    }
    return -1;
}

static int resp_line(struct worker *w, struct conn *c, const char *p, size_t len, uint64_t now)
{
    int64_t n;
    if (c->auth_pending) {
        if (len == 3 && !memcmp(p, "+OK", 3)) { c->auth_pending = 0; return 0; }
        return lg_fail(w->r, -EACCES, "AUTH on %s:%d failed: %.*s", w->r->cfg->host, w->r->cfg->port,
                    SHOW(p + (len && p[0] == '-'), len - (len && p[0] == '-')));
    }
    if (!c->rcount) return lg_proto_err(w, "reply '%.*s' with no request outstanding", SHOW(p, len));
    int kind = c->ring[c->rhead].kind;
    switch (p[0]) {
    case '+':
        if (kind == K_SET && len == 3 && !memcmp(p, "+OK", 3)) return complete(w, c, now, RES_OK);
        return odd(w, c, p, len, now);
    case '-':
        lg_note_error(w, "%.*s", SHOW(p + 1, len - 1));
        return complete(w, c, now, RES_ERR);
    case ':':
        if (parse_num(p + 1, len - 1, 1, &n)) break;
        return odd(w, c, p, len, now);
    case '$':
        if (parse_num(p + 1, len - 1, 1, &n) || n < -1) break;
        if (n > (int64_t)MAX_VALUE) return lg_proto_err(w, "bulk length %lld over 512 MiB", (long long)n);
        if (n == -1) return kind == K_GET ? complete(w, c, now, RES_MISS) : odd(w, c, p, len, now);
        bulk_begin(w, c, (uint64_t)n, kind == K_GET ? RES_HIT : w->r->cfg->xadd ? RES_OK : RES_ODD);
        return 0;
    }
    return lg_proto_err(w, "bad reply line '%.*s'", SHOW(p, len));
}

#define LINE_IS(s)  (len == sizeof(s) - 1 && !memcmp(p, s, sizeof(s) - 1))
#define LINE_HAS(s) (len >= sizeof(s) - 1 && !memcmp(p, s, sizeof(s) - 1))

static int mc_value(struct worker *w, struct conn *c, const char *p, size_t len, int kind)
{
    /* "VALUE <key> <flags> <bytes>[ <cas>]" */
    const char *e = p + len, *k = p + 6, *ke = memchr(k, ' ', (size_t)(e - k)), *f, *fe = NULL, *b, *be;
    int64_t flags, n;
    if (ke) f = ke + 1, fe = memchr(f, ' ', (size_t)(e - f));
    if (!fe) return lg_proto_err(w, "bad VALUE line '%.*s'", SHOW(p, len));
    b = fe + 1;
    if (!(be = memchr(b, ' ', (size_t)(e - b)))) be = e;
    if (parse_num(f, (size_t)(fe - f), 0, &flags) || parse_num(b, (size_t)(be - b), 0, &n) ||
        n > (int64_t)MAX_VALUE)
        return lg_proto_err(w, "bad VALUE line '%.*s'", SHOW(p, len));
    char d[12]; int wrong = 0;
    if (kind == K_GET && w->r->check) {
        fmt12(d, c->ring[c->rhead].key);
        if ((wrong = ke - k != 16 || memcmp(k, "key:", 4) || memcmp(k + 4, d, 12)))
            mismatch(w, c, "VALUE for key '%.*s'", SHOW(k, (size_t)(ke - k)));
    }
    bulk_begin(w, c, (uint64_t)n, kind == K_GET ? RES_HIT : RES_ODD);
    c->cmp &= !wrong;
    return 0;
}

static int mc_line(struct worker *w, struct conn *c, const char *p, size_t len, uint64_t now)
{
    if (c->pst == PS_END) {
        if (!LINE_IS("END")) return lg_proto_err(w, "expected END after VALUE data, got '%.*s'", SHOW(p, len));
        c->pst = PS_LINE;
        return complete(w, c, now, c->bres);
    }
    if (!c->rcount) return lg_proto_err(w, "reply '%.*s' with no request outstanding", SHOW(p, len));
    int kind = c->ring[c->rhead].kind;
    if (LINE_IS("STORED")) return kind == K_SET ? complete(w, c, now, RES_OK) : odd(w, c, p, len, now);
    if (LINE_IS("END")) return kind == K_GET ? complete(w, c, now, RES_MISS) : odd(w, c, p, len, now);
    if (LINE_HAS("VALUE ")) return mc_value(w, c, p, len, kind);
    if (LINE_IS("ERROR") || LINE_HAS("CLIENT_ERROR") || LINE_HAS("SERVER_ERROR") ||
        LINE_IS("NOT_STORED") || LINE_IS("EXISTS") || LINE_IS("NOT_FOUND")) {
        lg_note_error(w, "%.*s", SHOW(p, len));
        return complete(w, c, now, RES_ERR);
    }
    return lg_proto_err(w, "unexpected reply line '%.*s'", SHOW(p, len));
}

int lg_parse(struct worker *w, struct conn *c, uint64_t now)
{
    struct run *r = w->r;
    while (c->rpos < c->rlen) {
        char *p = c->rbuf + c->rpos;
        size_t avail = c->rlen - c->rpos;
        if (c->pst == PS_BULK) {
            size_t m = avail < c->bleft ? avail : (size_t)c->bleft;
            int64_t at;
            if (c->cmp && (at = value_diff(r, c->dig, c->boff, p, m)) >= 0) {
                mismatch(w, c, "value differs at byte %lld", (long long)at);
                c->cmp = 0;
            }
            c->boff += m, c->bleft -= m, c->rpos += m;
            if (!c->bleft) c->pst = PS_CRLF;
            continue;
        }
        if (c->pst == PS_CRLF) {
            if (avail < 2) break;
            if (p[0] != '\r' || p[1] != '\n') return lg_proto_err(w, "value not followed by CRLF");
            c->rpos += 2;
            if (r->mc) { c->pst = PS_END; continue; }
            c->pst = PS_LINE, complete(w, c, now, c->bres);
            continue;
        }
        char *nl = memchr(p, '\n', avail);
        if (!nl) {
            if (avail >= MAX_LINE) return lg_proto_err(w, "reply line longer than %d bytes", MAX_LINE);
            break;
        }
        if (nl == p || nl[-1] != '\r')
            return lg_proto_err(w, "line not terminated by CRLF: '%.*s'", SHOW(p, (size_t)(nl - p)));
        size_t len = (size_t)(nl - p) - 1;
        c->rpos += len + 2;
        int rc = r->mc ? mc_line(w, c, p, len, now) : resp_line(w, c, p, len, now);
        if (rc < 0) return rc;
    }
    return 0;
}
