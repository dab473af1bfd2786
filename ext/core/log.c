/* log.c - the server's log (see log.h): Redis-like lines, one write() each.
 * Threads: any. open_lock serialises kvlog_open/kvlog_reopen (the path and the
 * descriptor's replacement); writers take no lock: they read the descriptor
 * atomically and dup2 keeps that descriptor valid across a reopen. rate_lock
 * guards every struct kvlog_rate (rate-limited events are rare by nature). */
#define _GNU_SOURCE
#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

_Atomic int kvlog_min_level = KVLOG_NOTICE;

static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER; /* guards path, own_fd's replacement */
static pthread_mutex_t rate_lock = PTHREAD_MUTEX_INITIALIZER; /* guards every struct kvlog_rate */
static char path[4096];          /* "" = stderr */
/* The descriptor lines go to: 2 (stderr) until a file is opened; from then on
 * our own descriptor, whose file dup2 replaces (never closed: a writer may hold
 * its number, and a closed number could be reused by a client socket). */
static _Atomic int line_fd = 2;
static int own_fd = -1;
static _Atomic uint64_t write_errors;
static _Atomic int write_failing;  /* a failure was reported on stderr; cleared by the next success */

static const char level_chars[] = ".-*#";

static int open_file(const char *p, char *err, size_t errlen)
{
    int fd = open(p, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        int rc = -errno;
        snprintf(err, errlen, "cannot open log file %s: %s", p, strerror(-rc));
        return rc;
    }
    return fd;
}

/* Make own_fd refer to fd's file (fd is consumed) and send lines there. open_lock held. */
static void install(int fd)
{
    if (own_fd < 0) {
        own_fd = fd;
    } else if (fd != own_fd) {
        dup2(fd, own_fd);
        close(fd);
    }
    atomic_store_explicit(&line_fd, own_fd, memory_order_release);
}

int kvlog_open(const char *p, int level, char *err, size_t errlen)
{
    if (level < KVLOG_DEBUG || level > KVLOG_WARNING) {
        snprintf(err, errlen, "log level %d: expected 0 (debug) to 3 (warning)", level);
        return -EINVAL;
    }
    pthread_mutex_lock(&open_lock);
    int rc = 0;
    if (p && *p) {
        if (strlen(p) >= sizeof path) {
            snprintf(err, errlen, "log file path too long (at most %zu bytes)", sizeof path - 1);
            rc = -ENAMETOOLONG;
        } else if ((rc = open_file(p, err, errlen)) >= 0) {
            install(rc);
            snprintf(path, sizeof path, "%s", p);
            rc = 0;
        }
    } else {
        path[0] = 0;
        atomic_store_explicit(&line_fd, 2, memory_order_release);
    }
    if (!rc)
        atomic_store_explicit(&kvlog_min_level, level, memory_order_relaxed);
    pthread_mutex_unlock(&open_lock);
    return rc;
}

int kvlog_reopen(void)
{
    char err[256];
    pthread_mutex_lock(&open_lock);
    int rc = 0;
    if (path[0]) {
        rc = open_file(path, err, sizeof err);
        if (rc >= 0) {
            install(rc);
            rc = 0;
        }
    }
    pthread_mutex_unlock(&open_lock);
    if (rc)
        kvlog_raw(KVLOG_WARNING, err); /* into the old file, which stays open */
    return rc;
}

/* "<pid>:M 24 Nov 2026 10:00:00.123 # " into buf; returns its length. */
static size_t prefix(char *buf, size_t n, int level)
{
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    localtime_r(&tv.tv_sec, &tm);
    int off = snprintf(buf, n, "%d:M ", (int)getpid());
    off += (int)strftime(buf + off, n - (size_t)off, "%d %b %Y %H:%M:%S", &tm);
    off += snprintf(buf + off, n - (size_t)off, ".%03d %c ", (int)(tv.tv_usec / 1000), level_chars[level]);
    return (size_t)off;
}

static void emit(const char *line, size_t len)
{
    int fd = atomic_load_explicit(&line_fd, memory_order_acquire);
    ssize_t w = write(fd, line, len);
    if (w == (ssize_t)len) {
        atomic_store_explicit(&write_failing, 0, memory_order_relaxed);
        return;
    }
    atomic_fetch_add_explicit(&write_errors, 1, memory_order_relaxed);
    /* Say so once per run of failures, on stderr (the only other place there is). */
    if (fd != 2 && !atomic_exchange_explicit(&write_failing, 1, memory_order_relaxed)) {
        char msg[160];
        int n = snprintf(msg, sizeof msg, "kvstore: cannot write the log file: %s; lines are being lost\n",
                         w < 0 ? strerror(errno) : "short write");
        ssize_t r = write(2, msg, (size_t)n);
        (void)r;
    }
}

void kvlog_raw(int level, const char *msg)
{
    if (level < KVLOG_DEBUG || level > KVLOG_WARNING || !kvlog_on(level))
        return;
    char line[KVLOG_MAX_LINE + 1];
    size_t n = prefix(line, sizeof line, level);
    /* room for the newline; a control character becomes \xNN (one line per call) */
    for (const unsigned char *p = (const unsigned char *)msg; *p && n < KVLOG_MAX_LINE - 4; p++) {
        if (*p < 0x20 || *p == 0x7f)
            n += (size_t)snprintf(line + n, 5, "\\x%02x", *p);
        else
            line[n++] = (char)*p;
    }
    line[n++] = '\n';
    emit(line, n);
}

void kvlog_write(int level, const char *fmt, ...)
{
    char msg[KVLOG_MAX_LINE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvlog_raw(level, msg);
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void kvlog_rated_write(struct kvlog_rate *r, int level, const char *fmt, ...)
{
    uint64_t now = mono_ms(), dropped = 0;
    int last = 0;
    pthread_mutex_lock(&rate_lock);
    if (!r->start_ms || now - r->start_ms >= r->window_ms) {
        r->start_ms = now;
        r->used = 0;
    }
    int ok = r->used < r->max;
    if (ok) {
        r->used++;
        last = r->used == r->max;
        dropped = r->suppressed;
        r->suppressed = 0;
    } else {
        r->suppressed++;
    }
    pthread_mutex_unlock(&rate_lock);
    if (!ok)
        return;
    char msg[KVLOG_MAX_LINE];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof msg && dropped)
        n += snprintf(msg + n, sizeof msg - (size_t)n, " (%llu similar lines suppressed)",
                      (unsigned long long)dropped);
    if ((size_t)n < sizeof msg && last)
        snprintf(msg + n, sizeof msg - (size_t)n, " (more like this within %u s are suppressed)",
                 r->window_ms / 1000);
    kvlog_raw(level, msg);
}

uint64_t kvlog_write_errors(void) { return atomic_load_explicit(&write_errors, memory_order_relaxed); }
