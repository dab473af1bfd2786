/* stress.h - what the C stress tests share: a failed check that says where and why,
 * and the deterministic PRNG of rng.h. Header-only,
 * included by the tests' .c files (never by ext/). */
#ifndef KV_TESTS_STRESS_H
#define KV_TESTS_STRESS_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "rng.h"

static void fail_at(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5), unused));
static void fail_at(const char *file, int line, const char *cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL: %s:%d: %s", file, line, cond);
    if (fmt[1]) { /* fmt is " " plus the caller's format (so that it is never empty) */
        fputc(':', stderr);
        vfprintf(stderr, fmt, ap);
    }
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    exit(1);
}

/* CHECK(cond) or CHECK(cond, "printf format", args...); the format is checked. */
#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (!(cond))                                                         \
            fail_at(__FILE__, __LINE__, #cond, " " __VA_ARGS__);             \
    } while (0)

/* The models' integer parse: Redis's string2ll, written independently of
 * ext/table.c's parse_ll. */
static inline bool model_int(const char *p, size_t n, long long *out)
{
    if (n == 0 || n > 20)
        return false;
    size_t i = p[0] == '-';
    if (i == n)
        return false;
    if (p[i] == '0')
        return n == 1 ? (*out = 0, true) : false;
    __int128 v = 0;
    for (; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return false;
        v = v * 10 + (p[i] - '0');
    }
    if (p[0] == '-')
        v = -v;
    if (v > INT64_MAX || v < INT64_MIN)
        return false;
    *out = (long long)v;
    return true;
}

/* A full disk's stand-in for the disk-full tests: writes past soft bytes of a
 * file fail with EFBIG (after a short write), SIGXFSZ being ignored (the
 * caller's job). RLIM_INFINITY lifts it; the hard limit must be unlimited. */
static inline void fsize_limit(rlim_t soft)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) || rl.rlim_max != RLIM_INFINITY)
        fail_at(__FILE__, __LINE__, "fsize_limit", " the hard RLIMIT_FSIZE must be unlimited");
    rl.rlim_cur = soft;
    if (setrlimit(RLIMIT_FSIZE, &rl))
        fail_at(__FILE__, __LINE__, "fsize_limit", " setrlimit: %s", strerror(errno));
}

#endif
