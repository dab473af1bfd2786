/* cmdstats.h - command statistics and the slow log of one engine (INFO
 * commandstats/errorstats/latencystats, total_error_replies, blocked_clients,
 * SLOWLOG).
 *
 * Counting is on the request path, so nothing there is shared between threads:
 * each thread that runs commands for an engine gets its own block (registered on
 * the engine's list the first time, then found through a thread-local pointer),
 * which only that thread writes (relaxed load + store, counter.h); INFO sums the
 * blocks. CONFIG RESETSTAT does not touch another thread's block: it bumps the
 * engine's epoch, readers ignore a block of an older epoch, and its owner zeroes
 * it before counting again. Slots are the caller's (the command table's indexes).
 * Error kinds (errorstats) are names registered once in a bounded shared table.
 * The slow log is a ring under a mutex, taken only for a request slower than
 * slowlog-log-slower-than.
 * Threads: cst_create/cst_destroy on the control thread; the rest any thread. */
#ifndef KV_CMDSTATS_H
#define KV_CMDSTATS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define CST_SLOTS 256        /* commands and subcommands the caller numbers */
#define CST_ERRKINDS 128     /* error kinds errorstats tells apart (Redis's ERROR_STATS_NUMBER) */
#define CST_ERRNAME 32       /* an error kind is at most this long (Redis looks 32 bytes ahead) */
#define CST_HSUB 5           /* latency histogram: 2^5 sub-buckets per power of two (< 3.2 % error) */
#define CST_HLEN ((31 - CST_HSUB + 1) << CST_HSUB) /* ns up to 2^31 (2.1 s); longer counts in the last */

struct cst_slot {
    _Atomic uint64_t calls, ns, rejected, failed;
};

struct cst_hist {
    _Atomic uint64_t n[CST_HLEN];
};

/* One thread's counters. */
struct cst_block {
    struct cst_block *next;                /* the engine's list (immutable once linked) */
    _Atomic uint64_t epoch;                /* the reset epoch these counts belong to */
    _Atomic int64_t blocked;               /* requests this thread saw start waiting minus those
                                              it saw end: only the sum over blocks means anything */
    _Atomic uint64_t errors;               /* total_error_replies */
    _Atomic uint64_t errkind[CST_ERRKINDS];
    struct cst_slot slot[CST_SLOTS];
    _Atomic(struct cst_hist *) hist[CST_SLOTS]; /* allocated by the owner on a slot's first call */
};

/* A slow log entry as cst_slowlog_get copies it out. */
#define CST_SLOW_ARGS 32     /* Redis's SLOWLOG_ENTRY_MAX_ARGC */
#define CST_SLOW_STR 128     /* Redis's SLOWLOG_ENTRY_MAX_STRING */
struct cst_slow {
    uint64_t id;
    int64_t time;            /* unix seconds */
    uint64_t usec;
    int argc;
    char *argv[CST_SLOW_ARGS];   /* malloc'd, already truncated Redis's way */
    size_t argl[CST_SLOW_ARGS];
    char addr[64];
    char name[64];
};

/* The head of struct cst (cmdstats.c), here so the request path reads it inline. */
struct cst_hot {
    _Atomic uint64_t epoch;  /* bumped by cst_reset */
    uint64_t gen;            /* unique per cst ever created (a thread's block is for one) */
};
struct cst;

/* Statistics and a slow log keeping requests of at least slower_than us (-1 off)
 * up to max_len entries. 0 or -ENOMEM. */
int cst_create(struct cst **out, long long slower_than, long long max_len);
void cst_destroy(struct cst *st);

/* The calling thread's block for st, registered on first use; NULL only when
 * that allocation failed. Zeroed first if a reset happened since it last counted. */
struct cst_block *cst_block_slow(struct cst *st);
extern __thread struct cst_block *cst_tls_block __attribute__((tls_model("initial-exec")));
extern __thread uint64_t cst_tls_gen __attribute__((tls_model("initial-exec")));
static inline struct cst_block *cst_block(struct cst *st)
{
    const struct cst_hot *h = (const struct cst_hot *)st;
    struct cst_block *b = cst_tls_block;
    if (__builtin_expect(cst_tls_gen == h->gen && b != NULL &&
                         atomic_load_explicit(&b->epoch, memory_order_relaxed) ==
                             atomic_load_explicit(&h->epoch, memory_order_relaxed), 1))
        return b;
    return cst_block_slow(st);
}

/* Single-writer increment (the block's owner). */
static inline void cst_inc(_Atomic uint64_t *c, uint64_t d)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + d, memory_order_relaxed);
}

/* Count one request of slot that took ns: calls, time, its histogram; failed and
 * rejected say how it ended. Owner thread. */
void cst_count(struct cst_block *b, int slot, uint64_t ns, int failed, int rejected);
/* Count an error reply whose text (without '-') starts at e, n bytes: its kind is
 * the word before the first space within CST_ERRNAME bytes, else "ERR". Owner thread. */
void cst_error(struct cst *st, struct cst_block *b, const char *e, size_t n);

/* Readers (INFO): totals over the blocks of the current epoch. */
void cst_sum_slot(struct cst *st, int slot, struct cst_slot *out_plain);
/* The merged histogram of slot into h (CST_HLEN counters); returns the count. */
uint64_t cst_sum_hist(struct cst *st, int slot, uint64_t *h);
/* Value at quantile q (0..1) of a merged histogram of total samples, in ns: the
 * top of its bucket (as HdrHistogram's highest equivalent value). */
uint64_t cst_hist_quantile(const uint64_t *h, uint64_t total, double q);
uint64_t cst_total_errors(struct cst *st);
int64_t cst_blocked(struct cst *st);
/* Error kind i's name and count over the blocks; NULL past the last kind. */
const char *cst_errkind(struct cst *st, int i, uint64_t *count);
/* CONFIG RESETSTAT: every counter but the blocked gauge restarts from zero. */
void cst_reset(struct cst *st);

/* ---- the slow log */
/* The thresholds, as CONFIG GET/SET see them. */
long long cst_slowlog_slower_than(const struct cst *st);
void cst_slowlog_set_slower_than(struct cst *st, long long us);
long long cst_slowlog_max_len(const struct cst *st);
void cst_slowlog_set_max_len(struct cst *st, long long n);
/* Add a request (argc arguments) that took us (caller checked the threshold):
 * arguments and strings are copied and truncated as Redis does. */
void cst_slowlog_push(struct cst *st, int argc, const char **argv, const size_t *argl, uint64_t us,
                      const char *addr, const char *name);
/* Copy up to max (-1: all) newest-first entries into out (malloc'd array the
 * caller frees with cst_slowlog_free); returns the number, or -ENOMEM. */
int cst_slowlog_get(struct cst *st, long long max, struct cst_slow **out);
void cst_slowlog_free(struct cst_slow *e, int n);
long long cst_slowlog_len(struct cst *st);
void cst_slowlog_reset(struct cst *st);

#endif
