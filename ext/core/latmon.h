/* latmon.h - the latency monitor (Redis's LATENCY LATEST/HISTORY): for each of a
 * fixed set of events, the samples that reached the threshold, at most one per
 * second (the largest that second), in a ring of the last LATMON_LEN, plus the
 * latest and the largest ever seen. Sources are background threads (the log's
 * sync, the flusher's sweep) and, for slow commands, front-end threads: below the
 * threshold latmon_add is one relaxed load and a compare; a sample above it takes
 * the monitor's mutex (rare by definition). Any thread; memory is fixed. */
#ifndef KV_LATMON_H
#define KV_LATMON_H

#include <stddef.h>
#include <stdint.h>

#define LATMON_LEN 160 /* Redis's LATENCY_TS_LEN */

/* The events, in LATENCY LATEST's order; latmon_event_name gives Redis-style names. */
enum { LM_COMMAND, LM_FAST_COMMAND, LM_LOG_SYNC, LM_FLUSHER_SWEEP, LM_NEVENTS };

struct latmon;

struct latmon_sample {
    int64_t time;            /* unix seconds, 0 = unused slot */
    uint32_t ms;             /* latency in milliseconds */
};

/* One event's series as latmon_get copies it: samples oldest first. */
struct latmon_series {
    int n;                   /* samples (0: the event has none, LATENCY LATEST omits it) */
    struct latmon_sample s[LATMON_LEN];
    uint32_t max_ms;         /* largest sample since the event's last reset */
};

/* A monitor with threshold_ms (0 = off, as Redis). 0 or -ENOMEM. Control thread. */
int latmon_create(struct latmon **out, uint32_t threshold_ms);
void latmon_destroy(struct latmon *lm);

void latmon_set_threshold(struct latmon *lm, uint32_t ms);
uint32_t latmon_threshold(const struct latmon *lm);

/* A duration of ns for event: kept when the monitor is on and it is at least the
 * threshold. lm may be NULL (nothing to do). Any thread. */
void latmon_add(struct latmon *lm, int event, uint64_t ns);

/* Copy event's series into *out. 0, or -EINVAL for an unknown event. */
int latmon_get(struct latmon *lm, int event, struct latmon_series *out);
/* Forget event's samples (LATENCY RESET): 1 if it had any, else 0. */
int latmon_reset(struct latmon *lm, int event);

/* The event's name ("log-sync", ...), NULL past the last; latmon_find: its index or -1. */
const char *latmon_event_name(int event);
int latmon_find(const char *name, size_t n);

#endif
