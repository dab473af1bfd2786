/* latmon.c - the latency monitor (see latmon.h): Redis's latency.c series, one
 * ring of 160 per-second maxima per event, under one mutex taken only for a
 * sample at or above the threshold and for reading. */
#include "core/latmon.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct series {
    struct latmon_sample s[LATMON_LEN];
    int idx;                 /* next slot to write */
    uint32_t max_ms;
};

struct latmon {
    _Atomic uint32_t threshold_ms; /* read on every latmon_add, written by CONFIG SET */
    pthread_mutex_t lock;          /* guards ev[] */
    struct series ev[LM_NEVENTS];
};

static const char *const names[LM_NEVENTS] = {"command", "fast-command", "log-sync", "flusher-sweep"};

int latmon_create(struct latmon **out, uint32_t threshold_ms)
{
    struct latmon *lm = calloc(1, sizeof *lm);
    if (!lm)
        return -ENOMEM;
    pthread_mutex_init(&lm->lock, NULL);
    atomic_init(&lm->threshold_ms, threshold_ms);
    *out = lm;
    return 0;
}

void latmon_destroy(struct latmon *lm)
{
    if (!lm)
        return;
    pthread_mutex_destroy(&lm->lock);
    free(lm);
}

void latmon_set_threshold(struct latmon *lm, uint32_t ms)
{
    atomic_store_explicit(&lm->threshold_ms, ms, memory_order_relaxed);
}

uint32_t latmon_threshold(const struct latmon *lm)
{
    return atomic_load_explicit(&((struct latmon *)lm)->threshold_ms, memory_order_relaxed);
}

void latmon_add(struct latmon *lm, int event, uint64_t ns)
{
    if (!lm || event < 0 || event >= LM_NEVENTS)
        return;
    uint32_t thr = atomic_load_explicit(&lm->threshold_ms, memory_order_relaxed);
    uint64_t ms = ns / 1000000u;
    if (!thr || ms < thr)
        return;
    if (ms > UINT32_MAX)
        ms = UINT32_MAX;
    int64_t now = (int64_t)time(NULL);
    pthread_mutex_lock(&lm->lock);
    struct series *s = &lm->ev[event];
    if (ms > s->max_ms)
        s->max_ms = (uint32_t)ms;
    /* as Redis: a second has one sample, the largest of that second */
    struct latmon_sample *prev = &s->s[(s->idx + LATMON_LEN - 1) % LATMON_LEN];
    if (prev->time == now) {
        if (ms > prev->ms)
            prev->ms = (uint32_t)ms;
    } else {
        s->s[s->idx] = (struct latmon_sample){now, (uint32_t)ms};
        s->idx = (s->idx + 1) % LATMON_LEN;
    }
    pthread_mutex_unlock(&lm->lock);
}

int latmon_get(struct latmon *lm, int event, struct latmon_series *out)
{
    if (event < 0 || event >= LM_NEVENTS)
        return -EINVAL;
    out->n = 0;
    pthread_mutex_lock(&lm->lock);
    struct series *s = &lm->ev[event];
    for (int j = 0; j < LATMON_LEN; j++) {
        const struct latmon_sample *x = &s->s[(s->idx + j) % LATMON_LEN];
        if (x->time)
            out->s[out->n++] = *x;
    }
    out->max_ms = s->max_ms;
    pthread_mutex_unlock(&lm->lock);
    return 0;
}

int latmon_reset(struct latmon *lm, int event)
{
    if (event < 0 || event >= LM_NEVENTS)
        return 0;
    pthread_mutex_lock(&lm->lock);
    struct series *s = &lm->ev[event];
    int had = s->s[(s->idx + LATMON_LEN - 1) % LATMON_LEN].time != 0;
    memset(s, 0, sizeof *s);
    pthread_mutex_unlock(&lm->lock);
    return had;
}

const char *latmon_event_name(int event) { return event >= 0 && event < LM_NEVENTS ? names[event] : NULL; }

int latmon_find(const char *name, size_t n)
{
    for (int i = 0; i < LM_NEVENTS; i++)
        if (strlen(names[i]) == n && !strncmp(names[i], name, n))
            return i;
    return -1;
}
