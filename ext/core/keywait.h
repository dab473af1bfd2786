/* keywait.h - who waits for a key to change: the registry behind blocking reads
 * (XREAD/XREADGROUP BLOCK). A waiting request registers one kw_entry per key it
 * waits on, with the flag to raise and the eventfd of the thread that runs it;
 * a write that may satisfy it (XADD, a stream deleted or its group destroyed)
 * calls kw_signal, which raises the flag of every entry on that key and writes
 * the eventfd once per raise. The waiting thread clears the flag before it looks
 * again, so a signal that comes while it looks is never lost. While nobody waits
 * kw_signal is one relaxed load.
 * Threads: any. Each bucket has its own mutex; kw_signal takes only that one
 * (and the kernel's eventfd write), so it may be called with table shard locks
 * held (nothing here takes a shard lock). */
#ifndef KV_KEYWAIT_H
#define KV_KEYWAIT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/list.h"

struct kw_reg;

struct kw_entry {
    struct list node;          /* in its bucket, while registered */
    uint64_t h;
    const char *key;           /* the caller's copy, alive while registered */
    size_t klen;
    _Atomic int *ready;        /* raised by kw_signal */
    int evfd;                  /* written (1) when ready goes from 0 to 1; -1: none */
};

int kw_create(struct kw_reg **out);
void kw_destroy(struct kw_reg *r);
/* Register e (its key, ready and evfd filled by the caller). */
void kw_add(struct kw_reg *r, struct kw_entry *e);
/* Unregister e (a no-op if it is not registered). */
void kw_del(struct kw_reg *r, struct kw_entry *e);
/* key may satisfy its waiters: raise their flags. Returns how many were raised. */
int kw_signal(struct kw_reg *r, const void *key, size_t klen);
/* A tap: every kw_signal of a key that begins with prefix (plen bytes, kept by the
 * caller) also calls fn(arg, key, klen) first, on the signalling thread (which may
 * hold a table shard lock: fn takes no shard lock). One tap per registry, set
 * before the threads that signal run (the MQTT broker's: a stream under its topic
 * prefix was written). */
typedef void (*kw_tap_fn)(void *arg, const void *key, size_t klen);
void kw_set_tap(struct kw_reg *r, const char *prefix, size_t plen, kw_tap_fn fn, void *arg);
/* Entries registered now (INFO blocked_clients counts clients, not this). */
uint64_t kw_count(struct kw_reg *r);

#endif
