/* nbd_backend.h - the block device's KV backends: a table of small structs of
 * callbacks (like pollpolicy.h's policies[]) looked up by the backend URL's scheme.
 *
 * The NBD server (nbd.h) turns each request into block operations (struct
 * nbd_kvop) and hands them to its thread's backend context; the backend
 * completes each one later, on the same thread, by calling op->done. A backend
 * context belongs to one NBD worker thread: every callback below runs on that
 * thread (open on the control thread, before the thread starts), so a context
 * needs no locks of its own.
 *   embedded   the engine of this process (engine/session.h: ses_run of GET, SET,
 *              DEL; a stalled run resumes on the thread's eventfd; SYNC waits for the
 *              log's durable LSN)
 *   kvstore    a kvstore node over RESP, requests pipelined on conns_per_thread
 *   redis      Redis over RESP, the same client
 *   memcached  memcached's meta protocol (mg / ms / md), pipelined
 * Keys are cfg->key_prefix + the block number in decimal (nbd_key); a value is
 * exactly one block; a block that is absent reads as zeros.
 */
#ifndef KV_NBD_BACKEND_H
#define KV_NBD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

struct kv_engine;

enum nbd_kvop_kind {
    NBD_KV_GET,   /* read the block into buf (block_size bytes; zeros if absent) */
    NBD_KV_PUT,   /* store buf (block_size bytes) as the block's value */
    NBD_KV_DEL,   /* remove the block (trim, zeroes): absent reads as zeros */
    NBD_KV_SYNC,  /* complete once every PUT and DEL that completed before this SYNC
                     was submitted, on any thread of this server, is durable in the
                     backend (NBD FLUSH and FUA); a backend that cannot make writes
                     durable completes it at once (what that means is in README) */
};

/* One block operation. The server owns it; the backend owns it from submit
 * until it calls done (and may link it through `next` meanwhile). */
struct nbd_kvop {
    int kind;                 /* enum nbd_kvop_kind */
    int rc;                   /* set by the backend before done: 0, or -errno (-EIO: the backend
                                 failed or was lost, -ENOSPC: it is out of memory, ...) */
    uint64_t block;           /* block number */
    char *buf;                /* GET: filled; PUT: read; block_size bytes, valid until done */
    void (*done)(struct nbd_kvop *op); /* completion, called on the submitting thread, never
                                          from inside submit (no recursion into the server) */
    void *owner;              /* the server's: its request */
    struct nbd_kvop *next;    /* the backend's link while it owns the op */
};

/* What a backend context is opened with. */
struct nbd_backend_cfg {
    const char *url;          /* the whole backend URL ("embedded" or scheme://...) */
    const char *key_prefix;
    uint32_t block_size;
    uint64_t size;            /* the device's size in bytes (the record below) */
    int read_only;            /* the device is served read-only: no record is stored */
    int conns;                /* network backends: connections of this context */
    int thread;               /* index of the NBD thread that owns the context */
    struct kv_engine *eng;    /* embedded: the engine; NULL for network backends */
    int epfd;                 /* the thread's epoll: the context adds its descriptors with
                                 epoll_event.data.ptr pointing to a struct nbd_watch */
};

/* What a backend registers in the thread's epoll: the server calls
 * on_event(ctx, w, events) when w's descriptor is ready. */
struct nbd_watch {
    int kind;                 /* the server's own watches use other kinds; backends NBD_WATCH_BACKEND */
    void *ctx;
};
#define NBD_WATCH_BACKEND 1

struct nbd_backend_stats {
    uint64_t errors;          /* operations completed with rc < 0 */
    uint64_t reconnects;      /* connections re-established after a failure */
};

struct nbd_backend_ops {
    const char *scheme;       /* "embedded", "kvstore", "redis", "memcached" */
    /* Parse and check the URL (what is wrong and what is accepted in err), open
     * one thread's context: connect (and AUTH/SELECT, check the peer is what the
     * scheme says), register its descriptors in cfg->epfd. Control thread.
     * 0 or -errno with a message in err. */
    int (*open)(void **ctx, const struct nbd_backend_cfg *cfg, char *err, size_t errlen);
    void (*close)(void *ctx);
    /* Take op: queue it (a network backend sends its queue at flush, so that many
     * operations leave in one system call). 0, or -errno (op not taken). */
    int (*submit)(void *ctx, struct nbd_kvop *op);
    /* The server's thread has submitted all it had for now: send what is queued. */
    void (*flush)(void *ctx);
    /* One of the context's watches is ready: read replies, complete ops (done),
     * reconnect after a failure (ops in flight on a lost connection complete
     * with -EIO). */
    void (*on_event)(void *ctx, struct nbd_watch *w, uint32_t events);
    /* Operations submitted and not yet done (at stop the server lets them finish,
     * for a bounded time, while this is not 0). */
    uint64_t (*pending)(void *ctx);
    void (*add_stats)(void *ctx, struct nbd_backend_stats *st);
};

/* The backend for url's scheme ("embedded" has no "://"); NULL if unknown. */
const struct nbd_backend_ops *nbd_backend_find(const char *url);

/* The device's record, kept under key_prefix + NBD_META_SUFFIX (a block's key is
 * the prefix and digits only, so the two never meet): "kvstore-blockdev size=N
 * block_size=B". Thread 0's context reads it at open (embedded: through the
 * session; network: a request on its first connection). Served again with another
 * block size, a device's blocks would read garbled; served smaller, those past the
 * end would be out of reach while they keep their memory. So open refuses both,
 * and stores the record for a new device (none yet) or a grown one, unless read-only. */
#define NBD_META_SUFFIX "meta"
#define NBD_META_MAX 128
/* have (have_len bytes; NULL: no record) against cfg: 1 with the record to store
 * in rec (NUL-terminated), 0 nothing to store, or -EINVAL with what the store
 * holds and what to do in err. */
int nbd_meta_check(const char *have, size_t have_len, const struct nbd_backend_cfg *cfg, char *rec, size_t cap,
                   char *err, size_t errlen);

/* key_prefix + block in decimal into dst (cap bytes); returns its length, or
 * -ENAMETOOLONG. */
int nbd_key(char *dst, size_t cap, const char *prefix, uint64_t block);

extern const struct nbd_backend_ops nbd_be_embedded, nbd_be_kvstore, nbd_be_redis, nbd_be_memcached;

#endif
