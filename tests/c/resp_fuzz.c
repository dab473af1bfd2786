/* resp_fuzz.c - bounded mutational fuzzer of the RESP request parser (ext/resp.c),
 * built with AddressSanitizer+UBSan by tests/c/test_c_sanitizers.py.
 *
 * usage: resp_fuzz SEED [ITERATIONS]   (default 200000)
 *
 * Each iteration builds a stream from a corpus of valid requests, applies random
 * byte flips, inserts, deletes and splices, then feeds it to the parser the way
 * ext/server.c does: the parser is called with the bytes from the start of the
 * current request; on RESP_DONE the request start advances by p->scan and the
 * parser is reset; on RESP_AGAIN more bytes arrive. Every call gets a buffer of
 * exactly the bytes available (a fresh malloc, so ASan reports any read past them).
 *
 * Checked on every call: scan <= bytes available; on RESP_DONE scan > 0 and every
 * argument lies inside the request; on RESP_ERROR err is set to a known message;
 * argv memory grows only with arguments received. Checked per stream (all well
 * under the 64 KiB line limits, where the outcome must not depend on how the bytes
 * were split): feeding it in one read, in random reads and one byte per read gives
 * the same requests and the same final state. Every few thousand iterations a long
 * stream (past the line limits) is fed too, with the safety checks only.
 * The reply encoders are checked first (exact bytes; encoded requests parse back).
 * Exits 0 on success; prints "FAIL: ..." and the stream and exits 1 otherwise. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/resp.h"
#include "rng.h"

static struct rng rng;

static uint64_t rnd(void) { return rng_next(&rng); }

static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

/* The stream being tested, for failure reports. */
static const unsigned char *cur_stream;
static size_t cur_len;
static uint64_t cur_iter;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL (iteration %" PRIu64 "): ", cur_iter);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nstream (%zu bytes): \"", cur_len);
    for (size_t i = 0; i < cur_len && i < 4096; i++) {
        unsigned c = cur_stream[i];
        if (c == '\\' || c == '"')
            fprintf(stderr, "\\%c", c);
        else if (c >= 0x20 && c < 0x7f)
            fputc((int)c, stderr);
        else
            fprintf(stderr, "\\x%02x", c);
    }
    fprintf(stderr, "\"\n");
    fflush(stderr);
    exit(1);
}

/* ---- growable byte string */

struct bytes {
    unsigned char *p;
    size_t len, cap;
};

static void b_reserve(struct bytes *b, size_t more)
{
    if (b->len + more <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more)
        cap *= 2;
    b->p = realloc(b->p, cap);
    if (!b->p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    b->cap = cap;
}

static void b_add(struct bytes *b, const void *s, size_t n)
{
    b_reserve(b, n);
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void b_addf(struct bytes *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void b_addf(struct bytes *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    b_add(b, tmp, (size_t)n);
}

static void b_u64(struct bytes *b, uint64_t v) { b_add(b, &v, sizeof v); }

/* ---- corpus */

#define S(x) {x, sizeof(x) - 1}
static const struct {
    const char *p;
    size_t n;
} corpus[] = {
    S("*1\r\n$4\r\nPING\r\n"),
    S("*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n"),
    S("*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n"),
    S("*3\r\n$3\r\nSET\r\n$0\r\n\r\n$4\r\n\r\n\r\n\r\n"),
    S("*0\r\n"),
    S("*-1\r\n"),
    S("*2\r\n$4\r\nAUTH\r\n$6\r\nsecret\r\n"),
    S("*5\r\n$4\r\nMSET\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\nb\r\n$1\r\n2\r\n"),
    S("*2\r\n$4\r\nINCR\r\n$7\r\ncounter\r\n"),
    S("*3\r\n$6\r\nAPPEND\r\n$1\r\nk\r\n$10\r\n\x00\x01\x02\r\n$-1\xff\r\n\r\n"),
    S("PING\r\n"),
    S("SET key value\r\n"),
    S("GET key\n"),
    S("  set   a\tb  \r\n"),
    S("\r\n"),
    S("\n"),
    S("SET k \"a\\x41\\n\\r\\t\\\"q\\\\\" 'it\\'s'\r\n"),
    S("ECHO \"\" ''\r\n"),
    S("SET \"unterminated\r\n"),
    S("*2\r\n$3\r\nGET\r\n$5\r\nab"),
    S("*1\r\n$536870912\r\n"),
    S("*1048576\r\n"),
    S("*1\r\n$-1\r\n"),
    S("*abc\r\n"),
    S("*1\r\n:1\r\n"),
    S("*11\r\n"),
    S("*1\r\n$16385\r\n"),
};
#define NCORPUS (sizeof corpus / sizeof corpus[0])

static const char *const specials[] = {"\r", "\n", "\r\n", "*", "$", "-", "0", "1", "9", "\"", "'",
                                       "\\", " ", "\t", "\\x", "-1", "*-1", "$-1", "*0\r\n",
                                       "99999999999999999999", "1048577", "536870913", "\x00", "\xff"};
#define NSPECIALS (sizeof specials / sizeof specials[0])

static void add_random_multibulk(struct bytes *b)
{
    int argc = (int)below(6);
    b_addf(b, "*%d\r\n", argc);
    for (int i = 0; i < argc; i++) {
        size_t n = below(4) ? below(12) : below(300);
        b_addf(b, "$%zu\r\n", n);
        b_reserve(b, n + 2);
        for (size_t j = 0; j < n; j++)
            b->p[b->len++] = below(4) ? (unsigned char)rnd() : (unsigned char)"\r\n$*"[below(4)];
        b_add(b, "\r\n", 2);
    }
}

static void build_stream(struct bytes *b)
{
    b->len = 0;
    int n = 1 + (int)below(5);
    for (int i = 0; i < n; i++) {
        if (below(4) == 0) {
            add_random_multibulk(b);
        } else {
            size_t k = below(NCORPUS);
            b_add(b, corpus[k].p, corpus[k].n);
        }
    }
}

static void mutate(struct bytes *b)
{
    int n = (int)below(6); /* 0: the stream as built */
    for (int i = 0; i < n; i++) {
        size_t pos = below(b->len + 1);
        switch (below(7)) {
        case 0: /* flip a bit */
            if (b->len)
                b->p[below(b->len)] ^= (unsigned char)(1u << below(8));
            break;
        case 1: /* set a random byte */
            if (b->len)
                b->p[below(b->len)] = (unsigned char)rnd();
            break;
        case 2: /* insert random bytes */
        case 3: { /* insert a special token */
            unsigned char tmp[16];
            const void *src;
            size_t k;
            if (below(2)) {
                k = 1 + below(sizeof tmp);
                for (size_t j = 0; j < k; j++)
                    tmp[j] = (unsigned char)rnd();
                src = tmp;
            } else {
                const char *s = specials[below(NSPECIALS)];
                k = strlen(s) ? strlen(s) : 1; /* "\x00" is one NUL byte */
                src = s;
            }
            b_reserve(b, k);
            memmove(b->p + pos + k, b->p + pos, b->len - pos);
            memcpy(b->p + pos, src, k);
            b->len += k;
            break;
        }
        case 4: { /* delete a range */
            size_t k = 1 + below(8);
            if (pos + k > b->len)
                k = b->len - pos;
            memmove(b->p + pos, b->p + pos + k, b->len - pos - k);
            b->len -= k;
            break;
        }
        case 5: { /* splice in part of a corpus entry */
            size_t c = below(NCORPUS);
            size_t from = below(corpus[c].n), k = 1 + below(corpus[c].n - from);
            b_reserve(b, k);
            memmove(b->p + pos + k, b->p + pos, b->len - pos);
            memcpy(b->p + pos, corpus[c].p + from, k);
            b->len += k;
            break;
        }
        case 6: { /* duplicate a range of the stream itself */
            if (!b->len)
                break;
            size_t from = below(b->len), k = 1 + below(b->len - from < 32 ? b->len - from : 32);
            b_reserve(b, k);
            unsigned char tmp[32];
            memcpy(tmp, b->p + from, k);
            memmove(b->p + pos + k, b->p + pos, b->len - pos);
            memcpy(b->p + pos, tmp, k);
            b->len += k;
            break;
        }
        }
    }
}

static const char *const known_errors[] = {
    "Protocol error: invalid multibulk length",
    "Protocol error: invalid bulk length",
    "Protocol error: too big mbulk count string",
    "Protocol error: too big bulk count string",
    "Protocol error: too big inline request",
    "Protocol error: unbalanced quotes in request",
    "Protocol error: unauthenticated multibulk length",
    "Protocol error: unauthenticated bulk length",
};

static void check_error(const char *err)
{
    if (!err)
        fail("RESP_ERROR without an error message");
    for (size_t i = 0; i < sizeof known_errors / sizeof known_errors[0]; i++)
        if (strcmp(err, known_errors[i]) == 0)
            return;
    if (strncmp(err, "Protocol error: expected '$', got '", 35) == 0)
        return;
    fail("unknown error message \"%s\"", err);
}

/* Feed `data` split at the sorted positions cuts[0..ncuts) (each in 1..len-1) and
 * record the outcome in `out`: each request's arguments, then the final state. */
static void feed(const unsigned char *data, size_t len, const size_t *cuts, size_t ncuts, int unauth,
                 struct bytes *out)
{
    struct resp_parser p;
    resp_parser_init(&p);
    p.unauth = unauth;
    out->len = 0;
    size_t start = 0, have = 0;
    int maxargc = 0;
    for (size_t ci = 0; ci <= ncuts; ci++) {
        have = ci < ncuts ? cuts[ci] : len;
        for (;;) {
            size_t avail = have - start;
            /* exactly the bytes available: ASan reports any read past them (for
             * avail == 0, malloc(0) gives a pointer to nothing readable) */
            char *arg = malloc(avail);
            if (!arg && avail) {
                fprintf(stderr, "out of memory\n");
                exit(2);
            }
            if (avail)
                memcpy(arg, data + start, avail);
            int rc = resp_parse(&p, arg, avail);
            if (p.scan > avail)
                fail("scan %zu past the %zu bytes available (rc %d)", p.scan, avail, rc);
            if (p.argc < 0 || (p.argc > p.argcap && p.argc > 0))
                fail("argc %d, argcap %d", p.argc, p.argcap);
            if (p.argc > maxargc)
                maxargc = p.argc;
            /* argv grows with arguments received: never more than twice the most seen */
            if (p.argcap > 8 && p.argcap > 2 * maxargc)
                fail("argcap %d with at most %d arguments received", p.argcap, maxargc);
            if (rc == RESP_DONE) {
                if (p.scan == 0)
                    fail("RESP_DONE with scan 0");
                b_u64(out, 0xD0E);
                b_u64(out, (uint64_t)p.argc);
                for (int i = 0; i < p.argc; i++) {
                    size_t off = p.argv[i].off, n = p.argv[i].len;
                    if (off > p.scan || n > p.scan - off)
                        fail("argument %d (%zu+%zu) outside the request of %zu bytes", i, off, n, p.scan);
                    b_u64(out, n);
                    b_add(out, arg + off, n);
                }
                start += p.scan;
                resp_reset(&p);
                free(arg);
                continue;
            }
            free(arg);
            if (rc == RESP_ERROR) {
                check_error(p.err);
                b_u64(out, 0xE44);
                b_add(out, p.err, strlen(p.err));
                resp_parser_free(&p);
                return;
            }
            if (rc != RESP_AGAIN)
                fail("resp_parse returned %d", rc);
            break;
        }
    }
    b_u64(out, 0xA6A);
    b_u64(out, len - start);
    resp_parser_free(&p);
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static size_t random_cuts(size_t len, size_t *cuts, size_t max)
{
    if (len < 2)
        return 0;
    size_t n = below(max + 1);
    for (size_t i = 0; i < n; i++)
        cuts[i] = 1 + below(len - 1);
    qsort(cuts, n, sizeof *cuts, cmp_size);
    size_t m = 0; /* dedupe */
    for (size_t i = 0; i < n; i++)
        if (m == 0 || cuts[m - 1] != cuts[i])
            cuts[m++] = cuts[i];
    return m;
}

static void same(const struct bytes *a, const struct bytes *b, const char *how)
{
    if (a->len != b->len || memcmp(a->p, b->p, a->len) != 0)
        fail("fed %s, the outcome differs from one read", how);
}

/* A long stream, beyond the 64 KiB limits: only safety is checked. */
static void long_stream(struct bytes *b, struct bytes *out, size_t *cuts)
{
    b->len = 0;
    size_t target = 60000 + below(20000);
    switch (below(4)) {
    case 0: /* inline line without or with a late newline */
        while (b->len < target)
            b_add(b, "word ", 5);
        if (below(2))
            b_add(b, "\r\n", 2);
        break;
    case 1: /* endless multibulk count */
        b_add(b, "*", 1);
        while (b->len < target)
            b_add(b, "1111111111", 10);
        break;
    case 2: /* endless bulk count */
        b_add(b, "*2\r\n$1\r\na\r\n$", 12);
        while (b->len < target)
            b_add(b, "2222222222", 10);
        break;
    default: /* many arguments, big bulks */
        while (b->len < target)
            add_random_multibulk(b);
        break;
    }
    mutate(b);
    cur_stream = b->p;
    cur_len = b->len;
    size_t n = random_cuts(b->len, cuts, 32);
    feed(b->p, b->len, cuts, n, (int)below(2), out);
    feed(b->p, b->len, NULL, 0, (int)below(2), out);
}

/* ---- reply encoders: exact bytes, and a round trip through the parser */

static void expect_buf(struct kvbuf *b, const char *want, size_t n, const char *what)
{
    if (b->len != n || memcmp(b->p, want, n) != 0)
        fail("%s: encoded %zu bytes \"%.*s\", expected \"%.*s\"", what, b->len, (int)b->len, b->p, (int)n, want);
    b->len = 0;
}
#define EXPECT(b, lit, what) expect_buf(b, lit, sizeof(lit) - 1, what)

static void check_encoders(void)
{
    cur_stream = (const unsigned char *)"";
    cur_len = 0;
    struct kvbuf b = {0};
    char num[32];
    struct {
        long long v;
        const char *s;
    } nums[] = {{0, "0"}, {-1, "-1"}, {9, "9"}, {10, "10"}, {-10, "-10"},
                {9223372036854775807LL, "9223372036854775807"},
                {-9223372036854775807LL - 1, "-9223372036854775808"}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        int n = resp_ll2str(num, nums[i].v);
        if (n != (int)strlen(nums[i].s) || memcmp(num, nums[i].s, (size_t)n) != 0)
            fail("resp_ll2str(%lld) gave \"%.*s\"", nums[i].v, n, num);
    }
    if (resp_add_int(&b, -9223372036854775807LL - 1)) fail("resp_add_int");
    EXPECT(&b, ":-9223372036854775808\r\n", "int");
    if (resp_add_array(&b, -1)) fail("resp_add_array");
    EXPECT(&b, "*-1\r\n", "array");
    if (resp_add_nil(&b)) fail("resp_add_nil");
    EXPECT(&b, "$-1\r\n", "nil");
    if (resp_add_status(&b, "OK")) fail("resp_add_status");
    EXPECT(&b, "+OK\r\n", "status");
    if (resp_add_error(&b, "ERR bad\r\nthing\n")) fail("resp_add_error");
    EXPECT(&b, "-ERR bad  thing \r\n", "error with newlines");
    if (resp_add_errorf(&b, "ERR %s %d", "x", 42)) fail("resp_add_errorf");
    EXPECT(&b, "-ERR x 42\r\n", "errorf");
    if (resp_add_bulk(&b, "a\0\r\n", 4)) fail("resp_add_bulk");
    EXPECT(&b, "$4\r\na\0\r\n\r\n", "bulk");
    if (resp_add_bulk(&b, "", 0)) fail("resp_add_bulk");
    EXPECT(&b, "$0\r\n\r\n", "empty bulk");
    if (resp_add_bulk_str(&b, "hi")) fail("resp_add_bulk_str");
    EXPECT(&b, "$2\r\nhi\r\n", "bulk_str");
    char longmsg[2000];
    memset(longmsg, 'e', sizeof longmsg - 1);
    longmsg[sizeof longmsg - 1] = 0;
    if (resp_add_errorf(&b, "ERR %s", longmsg)) fail("resp_add_errorf long");
    if (b.len < 5 || b.p[0] != '-' || memcmp(b.p + b.len - 2, "\r\n", 2) != 0 || memchr(b.p, '\n', b.len - 1))
        fail("long errorf is not one error line");
    b.len = 0;

    /* random argument lists encoded with the encoders parse back identically */
    for (int it = 0; it < 2000; it++) {
        int argc = (int)below(8);
        unsigned char args[8][64];
        size_t lens[8];
        if (resp_add_array(&b, argc)) fail("resp_add_array");
        for (int i = 0; i < argc; i++) {
            lens[i] = below(64);
            for (size_t j = 0; j < lens[i]; j++)
                args[i][j] = (unsigned char)rnd();
            if (resp_add_bulk(&b, args[i], lens[i])) fail("resp_add_bulk");
        }
        struct resp_parser p;
        resp_parser_init(&p);
        cur_stream = (const unsigned char *)b.p;
        cur_len = b.len;
        if (resp_parse(&p, b.p, b.len) != RESP_DONE || p.scan != b.len || p.argc != argc)
            fail("encoded request does not parse back");
        for (int i = 0; i < argc; i++)
            if (p.argv[i].len != lens[i] || memcmp(b.p + p.argv[i].off, args[i], lens[i]) != 0)
                fail("argument %d does not round-trip", i);
        resp_parser_free(&p);
        b.len = 0;
    }
    kvbuf_free(&b);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s SEED [ITERATIONS]\n", argv[0]);
        return 2;
    }
    uint64_t seed = strtoull(argv[1], NULL, 0);
    uint64_t iters = argc > 2 ? strtoull(argv[2], NULL, 0) : 200000;
    rng_seed(&rng, seed, 0);
    check_encoders();
    struct bytes s = {0}, whole = {0}, split = {0};
    size_t cuts[64];
    size_t *bytewise = NULL;
    size_t bytewise_cap = 0;
    uint64_t outcomes[3] = {0, 0, 0};
    for (cur_iter = 0; cur_iter < iters; cur_iter++) {
        if (cur_iter % 5000 == 4999) {
            long_stream(&s, &whole, cuts);
            continue;
        }
        build_stream(&s);
        mutate(&s);
        cur_stream = s.p;
        cur_len = s.len;
        int unauth = below(4) == 0;
        feed(s.p, s.len, NULL, 0, unauth, &whole);
        size_t n = random_cuts(s.len, cuts, 12);
        feed(s.p, s.len, cuts, n, unauth, &split);
        same(&whole, &split, "in random reads");
        if (below(32) == 0 && s.len > 1) {
            if (bytewise_cap < s.len) {
                bytewise_cap = s.len * 2;
                bytewise = realloc(bytewise, bytewise_cap * sizeof *bytewise);
            }
            for (size_t i = 0; i + 1 < s.len; i++)
                bytewise[i] = i + 1;
            feed(s.p, s.len, bytewise, s.len - 1, unauth, &split);
            same(&whole, &split, "one byte per read");
        }
        /* classify: the outcome record ends with an error or the leftover count */
        bool error = false;
        for (size_t i = 0; i + 8 <= whole.len;) {
            uint64_t tag;
            memcpy(&tag, whole.p + i, 8);
            i += 8;
            if (tag == 0xD0E) {
                uint64_t ac;
                memcpy(&ac, whole.p + i, 8);
                i += 8;
                for (uint64_t a = 0; a < ac; a++) {
                    uint64_t len;
                    memcpy(&len, whole.p + i, 8);
                    i += 8 + len;
                }
                outcomes[0]++;
            } else {
                error = tag == 0xE44;
                break;
            }
        }
        outcomes[error ? 1 : 2]++;
    }
    fprintf(stderr, "resp_fuzz seed %" PRIu64 ": %" PRIu64 " streams, %" PRIu64 " requests parsed, %" PRIu64
            " streams ended in a protocol error, %" PRIu64 " waiting for more: ok\n",
            seed, iters, outcomes[0], outcomes[1], outcomes[2]);
    free(s.p);
    free(whole.p);
    free(split.p);
    free(bytewise);
    return 0;
}
