/* resp.c - RESP2 parser (untrusted input, bounded) and reply encoders.
 * Error texts match Redis 7.0 networking.c so clients see the same messages. */
#define _GNU_SOURCE
#include "proto/resp.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bytes.h"

void resp_parser_init(struct resp_parser *p)
{
    memset(p, 0, sizeof *p);
    p->pending = -1;
    p->bulk = -1;
}

void resp_parser_free(struct resp_parser *p)
{
    free(p->argv);
    p->argv = NULL;
    p->argcap = 0;
}

void resp_reset(struct resp_parser *p)
{
    p->scan = 0;
    p->pending = -1;
    p->bulk = -1;
    p->argc = 0;
    p->err = NULL;
    if (p->argcap > RESP_ARGS_KEEP) /* one huge request's array is not kept for the next */
        resp_parser_free(p);
}

static int push_arg(struct resp_parser *p, size_t off, size_t len)
{
    if (off > UINT32_MAX - len)
        return -E2BIG;
    if (p->argc == p->argcap) {
        int cap = p->argcap ? p->argcap * 2 : 8;
        struct resp_arg *a = realloc(p->argv, (size_t)cap * sizeof *a);
        if (!a)
            return -ENOMEM;
        p->argv = a;
        p->argcap = cap;
    }
    p->argv[p->argc].off = (uint32_t)off;
    p->argv[p->argc].len = (uint32_t)len;
    p->argc++;
    return 0;
}

/* Parse a decimal from [s, e); Redis's string2ll rules. Returns 0 or -EINVAL. */
static int parse_len(const char *s, const char *e, long long *out)
{
    size_t n = (size_t)(e - s);
    if (n == 0 || n > 20)
        return -EINVAL;
    int neg = 0;
    if (*s == '-') {
        neg = 1;
        s++;
        if (s == e)
            return -EINVAL;
    }
    if (n == 1 + (size_t)neg && *s == '0') {
        *out = 0;
        return neg ? -1 : 0;
    }
    if (*s < '1' || *s > '9')
        return -EINVAL;
    unsigned long long v = 0;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9')
            return -EINVAL;
        if (v > (unsigned long long)(9223372036854775807LL) / 10)
            return -EINVAL;
        v = v * 10 + (unsigned)(*s - '0');
    }
    if (v > 9223372036854775807ULL)
        return -EINVAL;
    *out = neg ? -(long long)v : (long long)v;
    return 0;
}

static int fail(struct resp_parser *p, const char *msg)
{
    p->err = msg;
    return RESP_ERROR;
}

static inline int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -EINVAL;
}

/* Inline request: words split on spaces, "double" quotes with \n \r \t \b \a
 * \\ \" \xHH escapes and 'single' quotes with \' , as Redis's sdssplitargs.
 * Unescaped in place: the result is never longer than its source. */
static int parse_inline(struct resp_parser *p, char *buf, size_t len)
{
    char *nl = memchr(buf, '\n', len);
    if (!nl) {
        if (len > RESP_MAX_INLINE)
            return fail(p, "Protocol error: too big inline request");
        return RESP_AGAIN;
    }
    char *end = nl;
    if (end > buf && end[-1] == '\r')
        end--;
    char *s = buf;
    p->argc = 0;
    while (1) {
        while (s < end && is_space(*s))
            s++;
        if (s == end)
            break;
        char *w = s; /* write position, trails s */
        char *start = w;
        int inq = 0, insq = 0, done = 0;
        while (!done) {
            if (inq) {
                if (s == end)
                    return fail(p, "Protocol error: unbalanced quotes in request");
                if (*s == '\\' && s + 3 < end && s[1] == 'x' && hexval(s[2]) >= 0 && hexval(s[3]) >= 0) {
                    *w++ = (char)(hexval(s[2]) * 16 + hexval(s[3]));
                    s += 4;
                } else if (*s == '\\' && s + 1 < end) {
                    char c;
                    s++;
                    switch (*s) {
                    case 'n': c = '\n'; break;
                    case 'r': c = '\r'; break;
                    case 't': c = '\t'; break;
                    case 'b': c = '\b'; break;
                    case 'a': c = '\a'; break;
                    default: c = *s; break;
                    }
                    *w++ = c;
                    s++;
                } else if (*s == '"') {
                    s++;
                    /* closing quote must be followed by a space or the end */
                    if (s < end && !is_space(*s))
                        return fail(p, "Protocol error: unbalanced quotes in request");
                    done = 1;
                } else {
                    *w++ = *s++;
                }
            } else if (insq) {
                if (s == end)
                    return fail(p, "Protocol error: unbalanced quotes in request");
                if (*s == '\\' && s + 1 < end && s[1] == '\'') {
                    *w++ = '\'';
                    s += 2;
                } else if (*s == '\'') {
                    s++;
                    if (s < end && !is_space(*s))
                        return fail(p, "Protocol error: unbalanced quotes in request");
                    done = 1;
                } else {
                    *w++ = *s++;
                }
            } else {
                if (s == end || is_space(*s)) {
                    done = 1;
                } else if (*s == '"') {
                    inq = 1;
                    s++;
                } else if (*s == '\'') {
                    insq = 1;
                    s++;
                } else {
                    *w++ = *s++;
                }
            }
        }
        if (push_arg(p, (size_t)(start - buf), (size_t)(w - start)))
            return fail(p, "out of memory");
    }
    p->scan = (size_t)(nl - buf) + 1;
    return RESP_DONE;
}

int resp_parse(struct resp_parser *p, char *buf, size_t len)
{
    if (p->pending < 0 && p->scan == 0) {
        if (len == 0)
            return RESP_AGAIN;
        if (buf[0] != '*')
            return parse_inline(p, buf, len);
        /* multibulk header: *<count>\r\n */
        char *cr = memchr(buf, '\r', len);
        if (!cr || cr + 1 >= buf + len) {
            if (len > RESP_MAX_INLINE)
                return fail(p, "Protocol error: too big mbulk count string");
            return RESP_AGAIN;
        }
        /* Like Redis, the byte after '\r' is skipped unchecked. */
        long long n;
        if (parse_len(buf + 1, cr, &n) || n > RESP_MAX_MULTIBULK)
            return fail(p, "Protocol error: invalid multibulk length");
        if (p->unauth && n > RESP_MAX_UNAUTH_MULTIBULK)
            return fail(p, "Protocol error: unauthenticated multibulk length");
        p->scan = (size_t)(cr - buf) + 2;
        p->argc = 0;
        if (n <= 0) /* "*0" and "*-1": an empty request, skipped silently */
            return RESP_DONE;
        p->pending = n;
    }
    while (p->pending > 0) {
        if (p->bulk < 0) {
            char *s = buf + p->scan;
            size_t avail = len - p->scan;
            if (avail == 0)
                return RESP_AGAIN;
            char *cr = memchr(s, '\r', avail);
            if (!cr || cr + 1 >= buf + len) {
                if (avail > RESP_MAX_INLINE)
                    return fail(p, "Protocol error: too big bulk count string");
                return RESP_AGAIN;
            }
            if (*s != '$') {
                static __thread char msg[64];
                snprintf(msg, sizeof msg, "Protocol error: expected '$', got '%c'", *s);
                return fail(p, msg);
            }
            long long n;
            if (parse_len(s + 1, cr, &n) || n < 0 || n > RESP_MAX_BULK)
                return fail(p, "Protocol error: invalid bulk length");
            if (p->unauth && n > RESP_MAX_UNAUTH_BULK)
                return fail(p, "Protocol error: unauthenticated bulk length");
            p->bulk = n;
            p->scan = (size_t)(cr - buf) + 2;
        }
        /* bulk payload plus its \r\n */
        if (len - p->scan < (size_t)p->bulk + 2)
            return RESP_AGAIN;
        int rc = push_arg(p, p->scan, (size_t)p->bulk);
        if (rc)
            return fail(p, rc == -E2BIG ? "Protocol error: too big request" : "out of memory");
        /* Redis does not check the two trailing bytes; neither do we. */
        p->scan += (size_t)p->bulk + 2;
        p->bulk = -1;
        p->pending--;
    }
    return RESP_DONE;
}

/* ---- encoders */

int resp_ll2str(char *dst, long long v)
{
    if (v >= 0)
        return put_decimal(dst, (uint64_t)v);
    *dst = '-';
    return 1 + put_decimal(dst + 1, 0ULL - (unsigned long long)v);
}

static int add_prefixed_num(struct kvbuf *b, char prefix, long long v)
{
    if (kvbuf_reserve(b, 24))
        return -ENOMEM;
    char *w = b->p + b->len;
    *w++ = prefix;
    w += resp_ll2str(w, v);
    *w++ = '\r';
    *w++ = '\n';
    b->len = (size_t)(w - b->p);
    return 0;
}

static int add_line(struct kvbuf *b, char prefix, const char *s, size_t n)
{
    if (kvbuf_reserve(b, n + 3))
        return -ENOMEM;
    char *w = b->p + b->len;
    *w++ = prefix;
    memcpy(w, s, n);
    w += n;
    *w++ = '\r';
    *w++ = '\n';
    b->len = (size_t)(w - b->p);
    return 0;
}

int resp_add_status(struct kvbuf *b, const char *s) { return add_line(b, '+', s, strlen(s)); }

int resp_add_error(struct kvbuf *b, const char *s)
{
    /* An error line must not contain newlines or the client would desync:
     * map them to spaces, as Redis's rejectCommandFormat does. */
    size_t n = strlen(s);
    if (kvbuf_reserve(b, n + 3))
        return -ENOMEM;
    char *w = b->p + b->len;
    *w++ = '-';
    for (size_t i = 0; i < n; i++)
        *w++ = (s[i] == '\r' || s[i] == '\n') ? ' ' : s[i];
    *w++ = '\r';
    *w++ = '\n';
    b->len = (size_t)(w - b->p);
    return 0;
}

int resp_add_errorf(struct kvbuf *b, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return resp_add_error(b, msg);
}

int resp_add_int(struct kvbuf *b, long long v) { return add_prefixed_num(b, ':', v); }
int resp_add_array(struct kvbuf *b, long long n) { return add_prefixed_num(b, '*', n); }
int resp_add_nil(struct kvbuf *b) { return kvbuf_append(b, "$-1\r\n", 5); }

int resp_add_null(struct kvbuf *b, int proto)
{
    return proto == 3 ? kvbuf_append(b, "_\r\n", 3) : resp_add_nil(b);
}

int resp_add_map(struct kvbuf *b, int proto, long long pairs)
{
    return proto == 3 ? add_prefixed_num(b, '%', pairs) : add_prefixed_num(b, '*', pairs * 2);
}

int resp_add_set(struct kvbuf *b, int proto, long long n)
{
    return add_prefixed_num(b, proto == 3 ? '~' : '*', n);
}

int resp_add_verbatim(struct kvbuf *b, int proto, const char *p, size_t n)
{
    if (proto != 3)
        return resp_add_bulk(b, p, n);
    if (add_prefixed_num(b, '=', (long long)n + 4) || kvbuf_append(b, "txt:", 4) ||
        kvbuf_append(b, p, n))
        return -ENOMEM;
    return kvbuf_append(b, "\r\n", 2);
}

int resp_add_bulk(struct kvbuf *b, const void *p, size_t n)
{
    if (kvbuf_reserve(b, n + 32))
        return -ENOMEM;
    char *w = b->p + b->len;
    *w++ = '$';
    w += resp_ll2str(w, (long long)n);
    *w++ = '\r';
    *w++ = '\n';
    memcpy(w, p, n);
    w += n;
    *w++ = '\r';
    *w++ = '\n';
    b->len = (size_t)(w - b->p);
    return 0;
}

int resp_add_bulk_str(struct kvbuf *b, const char *s) { return resp_add_bulk(b, s, strlen(s)); }

int resp_args_grow(struct resp_args *a, int n)
{
    if (n > (1 << 29))
        return -ENOMEM;
    int cap = 64;
    while (cap < n)
        cap *= 2;
    if (cap == a->cap)
        return 0;
    const char **v = realloc(a->argv, (size_t)cap * sizeof *v);
    if (!v)
        return -ENOMEM;
    a->argv = v;
    size_t *l = realloc(a->argl, (size_t)cap * sizeof *l);
    if (!l)
        return -ENOMEM;
    a->argl = l;
    a->cap = cap;
    return 0;
}

void resp_args_free(struct resp_args *a)
{
    free(a->argv);
    free(a->argl);
    a->argv = NULL;
    a->argl = NULL;
    a->cap = 0;
}
