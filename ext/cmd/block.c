/* block.c - a blocking read's wait (XREAD/XREADGROUP BLOCK). The request
 * registers its keys with the engine's keywait registry (core/keywait.h) and
 * stalls (CMD_STALL_BLOCK); the front end keeps its connection parked, reads
 * nothing more from it, and runs the request again when cmd_block_ready says a
 * key was written or the time is up. The first wait is woken at once, so a write
 * between the request's look and its registration is never missed; each run
 * lowers the flag before it looks (cmd_block_of). Runs on the front-end thread
 * that owns the client; kw_signal comes from any thread. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/keywait.h"
#include "core/stream.h"
#include "engine/engine.h"

struct cmd_block *cmd_block_of(struct cmd_client *c, const struct cmd_args *a)
{
    struct cmd_block *b = c->block;
    if (b)
        atomic_store_explicit(&b->ready, 0, memory_order_release);
    return b;
}

int cmd_can_block(struct cmd_client *c) { return !c->datagram && c->top != CMD_TOP_NESTED; }

int cmd_block_expired(const struct cmd_block *b) { return kv_mono_ms() >= b->deadline_ms; }

int cmd_block_ready(struct cmd_client *c)
{
    struct cmd_block *b = c->block;
    return !b || atomic_load_explicit(&b->ready, memory_order_acquire) || cmd_block_expired(b);
}

int64_t cmd_block_deadline(struct cmd_client *c) { return c->block ? c->block->deadline_ms : INT64_MAX; }

void cmd_block_done(struct cmd_client *c)
{
    struct cmd_block *b = c->block;
    if (!b)
        return;
    for (int i = 0; i < b->nkeys; i++)
        kw_del(c->eng->keywait, &b->entries[i]);
    if (b->own_fd >= 0)
        close(b->own_fd);
    free(b->entries);
    free(b->keys);
    free(b->ids);
    free(b);
    c->block = NULL;
}

int cmd_block_wait(struct cmd_client *c, const struct cmd_args *a, int first, int nkeys, const struct xs_id *ids,
                   long long block_ms)
{
    c->stall = CMD_STALL_BLOCK;
    if (c->block)
        return 0; /* registered since the first run */
    struct cmd_block *b = calloc(1, sizeof *b);
    size_t bytes = 0;
    for (int i = 0; i < nkeys; i++)
        bytes += a->argl[first + i];
    if (!b || !(b->entries = calloc((size_t)nkeys, sizeof *b->entries)) || !(b->keys = malloc(bytes + 1)) ||
        !(b->ids = malloc((size_t)nkeys * sizeof *b->ids))) {
        if (b) {
            free(b->entries);
            free(b->keys);
        }
        free(b);
        c->stall = CMD_STALL_NONE;
        return -ENOMEM;
    }
    b->nkeys = nkeys;
    b->own_fd = -1;
    memcpy(b->ids, ids, (size_t)nkeys * sizeof *ids);
    b->deadline_ms = block_ms ? kv_mono_ms() + block_ms : INT64_MAX;
    if (block_ms > INT64_MAX / 2)
        b->deadline_ms = INT64_MAX;
    int fd = c->evfd;
    if (fd < 0) /* a blocking front end: its thread sleeps on this one (cmd_block_sleep) */
        fd = b->own_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    c->block = b;
    size_t off = 0;
    for (int i = 0; i < nkeys; i++) {
        struct kw_entry *e = &b->entries[i];
        list_init(&e->node);
        memcpy(b->keys + off, a->argv[first + i], a->argl[first + i]);
        e->key = b->keys + off;
        e->klen = a->argl[first + i];
        off += e->klen;
        e->ready = &b->ready;
        e->evfd = fd;
        kw_add(c->eng->keywait, e);
    }
    /* look once more now that the keys are registered: a write since the first look is not lost */
    atomic_store_explicit(&b->ready, 1, memory_order_release);
    if (fd >= 0) {
        uint64_t one = 1;
        (void)!write(fd, &one, sizeof one);
    }
    return 0;
}

int cmd_block_sleep(struct cmd_client *c)
{
    struct cmd_block *b = c->block;
    while (b && !cmd_block_ready(c)) {
        int64_t left = b->deadline_ms == INT64_MAX ? 1000 : b->deadline_ms - kv_mono_ms();
        struct pollfd p = {b->own_fd, POLLIN, 0};
        poll(&p, b->own_fd >= 0, left < 0 ? 0 : left > 1000 ? 1000 : (int)left);
        uint64_t v;
        if (b->own_fd >= 0)
            (void)!read(b->own_fd, &v, sizeof v);
    }
    return 0;
}

void cmd_stream_signal(struct cmd_client *c, const char *key, size_t klen) { kw_signal(c->eng->keywait, key, klen); }
