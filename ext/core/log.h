/* log.h - the server's log: timestamped, levelled single lines in Redis's format
 *   <pid>:M 24 Nov 2026 10:00:00.123 * message
 * (level characters: '.' debug, '-' verbose, '*' notice, '#' warning), to
 * stderr or a file opened with O_APPEND. Each line is one write(), so lines of
 * concurrent threads never interleave. Process-wide (one log per process, as
 * Redis's); safe from any thread, never takes the GIL, and a line below the
 * level costs one relaxed atomic load (kvlog() checks before formatting). */
#ifndef KV_LOG_H
#define KV_LOG_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

enum { KVLOG_DEBUG, KVLOG_VERBOSE, KVLOG_NOTICE, KVLOG_WARNING };

/* The lowest level written (KVLOG_NOTICE until kvlog_open says otherwise). */
extern _Atomic int kvlog_min_level;

/* Lines longer than this (message and prefix) are cut short, as Redis's LOG_MAX_LEN. */
#define KVLOG_MAX_LINE 1024

/* Send the log to path (NULL or "" = stderr), writing level and above. A file
 * is opened with O_APPEND|O_CREAT (0644) and replaces the previous file in
 * place (dup2 onto the same descriptor), so threads writing meanwhile land in
 * one or the other, never in a closed descriptor. Returns 0, or -errno with
 * err saying which file could not be opened (the log then stays where it was). */
int kvlog_open(const char *path, int level, char *err, size_t errlen);

/* Open the log file's path again (after logrotate renamed it: SIGHUP). No-op
 * on stderr. Returns 0 or -errno (the log then stays on the old file, and a
 * warning saying why goes into it). */
int kvlog_reopen(void);

/* Write msg as one line at level (if level passes the filter); control
 * characters in msg are escaped (\n as \x0a), so one call is one line. */
void kvlog_raw(int level, const char *msg);

/* printf-style kvlog_raw; call through kvlog() so a filtered line is not formatted. */
void kvlog_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static inline int kvlog_on(int level)
{
    return level >= atomic_load_explicit(&kvlog_min_level, memory_order_relaxed);
}

#define kvlog(level, ...)                                                                                          \
    do {                                                                                                           \
        if (kvlog_on(level))                                                                                       \
            kvlog_write(level, __VA_ARGS__);                                                                       \
    } while (0)

/* Rate limit for one kind of event (a static at the call site): at most max
 * lines per window_ms. The window's last allowed line says that more are
 * being suppressed; the first line of a later window says how many were. */
struct kvlog_rate {
    unsigned max;
    unsigned window_ms;
    uint64_t start_ms;           /* the current window's start (CLOCK_MONOTONIC) */
    unsigned used;               /* lines written in it */
    uint64_t suppressed;         /* lines dropped since the last one written */
};

#define KVLOG_RATE_INIT(n) {.max = (n), .window_ms = 10000}

/* Like kvlog(), through rate r (the rate structs share one lock in log.c). */
void kvlog_rated_write(struct kvlog_rate *r, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define kvlog_rated(rate, level, ...)                                                                              \
    do {                                                                                                           \
        if (kvlog_on(level))                                                                                       \
            kvlog_rated_write(rate, level, __VA_ARGS__);                                                           \
    } while (0)

/* Lines that could not be written (the log file's write() failed). */
uint64_t kvlog_write_errors(void);

#endif
