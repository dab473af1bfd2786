/* nbd_int.h - the NBD server's internals, shared by its files:
 *   nbd.c        lifecycle (config checked, listeners, threads), stats, INFO, fe_nbd
 *   nbd_conn.c   a worker thread's loop, accept hand-off, connection I/O
 *   nbd_hs.c     the handshake (options until transmission)
 *   nbd_req.c    requests -> block operations, replies
 *   nbd_lock.c   the block-lock table
 * A worker thread owns its epoll, its connections, their requests and its backend
 * context; other threads reach it only through its fd queue and its grant list
 * (both under a mutex, each push followed by a write to its eventfd).
 * Memory a connection can pin: its input buffer (NBD_IN_CAP) plus what its
 * requests not yet answered and sent hold, each counted whole (struct, data
 * buffer, operations: a request without payload counts too): reading stops
 * before NBD_CONN_MAX_INFLIGHT would be passed (one request of up to
 * NBD_MAX_PAYLOAD is always taken when nothing else is in flight) and resumes
 * below half of it. In the handshake: unsent option replies (NBD_HS_MAX in
 * nbd_conn.c, plus one option's) stop the reading of options.
 */
#ifndef KV_NBD_INT_H
#define KV_NBD_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/counter.h"
#include "core/fdq.h"
#include "core/kvbuf.h"
#include "core/list.h"
#include "frontend/nbd.h"
#include "frontend/nbd_backend.h"
#include "proto/nbd.h"

#define NBD_IN_CAP (128u << 10)             /* a connection's input buffer */
#define NBD_CONN_MAX_INFLIGHT (64u << 20)   /* bytes held by a connection's unanswered requests */
#define NBD_MAX_SKIP (4ull * NBD_MAX_PAYLOAD) /* an oversized write's payload is read and dropped up to this */
#define NBD_POOL_DATA (128u << 10)          /* requests up to this size come from the thread's pool */
#define NBD_POOL_MAX 128                    /* pooled requests kept per thread */
#define NBD_LOCK_STRIPES 256
#define NBD_HS_MAX (64u << 10)             /* unsent handshake bytes past which options are not read */
#define NBD_TLS_OUT (64u << 10)            /* reply bytes gathered for one TLS write */
#define NBD_DRAIN_MS 2000                  /* at stop: how long in-flight operations may take to finish */
#define NBD_WINDOW 1024u                   /* block operations of one request in flight at once */
#define NBD_HS_LIMIT_MS 10000u             /* a connection still negotiating after this is closed */

/* epoll watch kinds of the server's own descriptors (backends': NBD_WATCH_BACKEND) */
enum { NBD_WATCH_LISTEN = 2, NBD_WATCH_WAKE = 3, NBD_WATCH_CONN = 4 };

/* Per-thread counters: struct nbd_stats's fields by index (all uint64_t), one writer. */
#define NBD_NSTATS (sizeof(struct nbd_stats) / sizeof(uint64_t))
#define NBD_ST(t, field, d) st_inc(&(t)->st[offsetof(struct nbd_stats, field) / sizeof(uint64_t)], (d))

struct nbd_thread;
struct nbd_conn;
struct nbd_req;

enum { BOP_READ, BOP_WRITE, BOP_RMW_GET, BOP_RMW_PUT, BOP_SYNC };

/* One block operation of a request (or its FUA/FLUSH sync). */
struct nbd_bop {
    struct nbd_kvop op;       /* op.owner = this bop's request */
    struct nbd_req *r;
    uint32_t boff, blen;      /* the part of the block the request covers */
    uint64_t doff;            /* where that part is in r->data */
    uint8_t stage;            /* BOP_* */
    uint8_t excl;             /* holds (or waits for) the block's lock exclusively (RMW) */
    uint8_t locked;           /* holds the block's lock */
    uint8_t zero;             /* write zeros (TRIM, WRITE_ZEROES) rather than r->data */
    char *scratch;            /* RMW / partial read: one block from the thread's pool */
    struct nbd_bop *lnext;    /* lock wait list, then the owner thread's grant list */
};

struct nbd_req {
    struct nbd_req *next;     /* the connection's reply queue, or the pool's free list */
    struct list live;         /* on its thread's list while it owns block operations */
    struct nbd_conn *c;
    struct nbd_request h;
    int rc;                   /* first error (-errno), 0 */
    const char *msg;          /* structured error message (static), or NULL */
    uint32_t pending;         /* block operations not done */
    uint8_t fua_done;         /* the FUA sync was submitted */
    uint8_t *data;            /* WRITE payload / READ reply data */
    size_t cap;               /* bytes at data */
    struct nbd_bop *ops;
    uint32_t nops, ops_cap;   /* operations of the current window, room for */
    uint64_t next_blk, last_blk; /* the next block to submit, the request's last */
    struct nbd_bop sync;      /* FLUSH, FUA */
    uint8_t hdr[NBD_CHUNK_HDR_LEN + 8 + 6 + 96]; /* reply header (and error chunk payload) */
    uint32_t hdr_len;
    uint64_t data_len;        /* reply data bytes after hdr */
    uint64_t sent;            /* bytes of hdr + data written */
    uint64_t charge;          /* bytes counted in the connection's in-flight total */
};

enum { PH_FLAGS, PH_OPTS, PH_TX, PH_CLOSING };

struct nbd_conn {
    struct nbd_watch w;       /* kind NBD_WATCH_CONN, ctx = this */
    struct nbd_thread *t;
    struct list node;         /* t->conns */
    int fd;
    int phase;
    int no_zeroes, structured;
    int closed;               /* fd closed; freed once no request owns operations */
    int out_listed;           /* on t's list of connections with replies to write */
    int paused;               /* input not read: the in-flight or handshake bound is reached */
    int in_hs;                /* counted in t->hs_conns: not yet in transmission */
    uint64_t born_ms;         /* accepted at (CLOCK_MONOTONIC): NBD_HS_LIMIT_MS counts from it */
    uint32_t events;          /* registered epoll events */
    struct nbd_conn *next_out;
    uint8_t *in;              /* NBD_IN_CAP bytes */
    size_t in_off, in_len;    /* unparsed bytes are in[in_off, in_len) */
    uint64_t skip;            /* bytes of input still to drop (oversized option / bad write) */
    struct nbd_req *filling;  /* a WRITE whose payload is still arriving */
    uint64_t fill_off;
    struct kvbuf hs;          /* handshake bytes to send (before transmission) */
    size_t hs_off;
    struct nbd_req *out_head, *out_tail; /* replies ready to send, in completion order */
    uint64_t inflight;        /* bytes held by requests not yet answered (and sent): their charges */
    uint32_t active;          /* requests that own block operations */
    char addr[64];
    /* TLS: tls is made when STARTTLS is accepted; its ACK still goes out in plain
     * (tls_on 0: no input read meanwhile), then every byte goes through it. */
    struct tls_conn *tls;
    int tls_on;
    int tls_rd_wants_out;     /* a read (the handshake) waits for the socket to be writable */
    int tls_wr_wants_in;      /* a write waits for the socket to be readable */
};

struct nbd_lock_entry;
struct tls_ctx;
struct tls_conn;

struct nbd_thread {
    struct nbd_server *s;
    int idx;
    pthread_t tid;
    int running;
    int epfd, evfd;
    struct nbd_watch wake;    /* evfd: handed fds, lock grants, stop */
    struct fdq q;
    void *be;                 /* backend context */
    struct list conns;
    struct list live;         /* requests that own block operations (freed at destroy if the
                                 backend still held them when the threads stopped) */
    int draining;             /* stopping: no input read, in-flight operations finish */
    int dirty;                /* operations submitted since the last backend flush */
    struct nbd_conn *out_list;
    struct nbd_conn *dead;    /* closed connections to free at the round's end */
    int hs_conns;             /* connections still negotiating: epoll_wait wakes to time them out */
    uint64_t next_hs_sweep;   /* when they are next checked (ms, CLOCK_MONOTONIC) */
    unsigned spin_misses;     /* busy-poll windows in a row that found nothing */
    unsigned spin_rounds;     /* rounds since spinning stopped paying (one in SPIN_RETRY tries again) */
    struct nbd_req *pool;     /* free requests with NBD_POOL_DATA bytes of data */
    int npool;
    char **blocks;            /* free scratch blocks */
    int nblocks, blocks_cap;
    pthread_mutex_t glock;    /* guards granted (other threads push lock grants) */
    struct nbd_bop *granted;
    struct nbd_bop *ready;    /* this thread's own grants, run at the round's end */
    uint8_t *tls_out;         /* TLS connections' replies gathered into records (NBD_TLS_OUT bytes) */
    _Atomic uint64_t st[NBD_NSTATS];
};

struct nbd_lock_stripe {
    pthread_mutex_t m;        /* guards list and free, and every entry on them */
    struct nbd_lock_entry *list, *free;
} __attribute__((aligned(64)));

struct nbd_server {
    /* settings (owned copies) */
    char *bind, *unix_path, *export_name, *description, *backend, *key_prefix;
    int port, threads, conns_per_thread, read_only, max_clients;
    uint64_t size;
    uint32_t block_size, bs_shift;
    uint64_t busy_poll_ns;    /* next_events' polling window after a round that did work (0: none) */
    const struct nbd_backend_ops *be;
    struct kv_engine *eng;
    int tcp_fd, unix_fd, tcp_port;
    struct nbd_watch listen_w[2];
    struct nbd_thread *th;
    _Atomic int stop;
    _Atomic int clients;
    unsigned rr;              /* next thread for an accepted connection (thread 0 only) */
    struct nbd_lock_stripe locks[NBD_LOCK_STRIPES];
    struct tls_ctx *tls;      /* NULL: --tls off */
    int tls_mode;             /* NBD_TLS_* */
};

/* nbd_conn.c */
void *nbd_thread_main(void *arg);
void nbd_conn_free_all(struct nbd_thread *t);
/* The connection has replies to write at the round's end. */
void nbd_conn_want_write(struct nbd_conn *c);
/* Close c's socket (its requests finish; freed at the round's end). */
void nbd_conn_close(struct nbd_conn *c);

/* nbd_hs.c */
/* One handshake step from c's input: 1 progress, 0 need more bytes (or closed). */
int nbd_handshake(struct nbd_conn *c);
/* Option replies the client has not read exceed NBD_HS_MAX: stop reading its
 * options until it reads them (so a client that never reads pins no more). */
int nbd_hs_full(const struct nbd_conn *c);
/* c leaves the handshake (in transmission, or closed). */
void nbd_hs_leave(struct nbd_conn *c);

/* nbd_req.c */
/* Requests in c's input (transmission phase): parse, check, submit. Returns
 * 0, or -1 when the connection must close (bad magic, oversized skip). */
int nbd_req_input(struct nbd_conn *c);
/* A reply's request leaves the connection: buffers back to the pool. */
void nbd_req_free(struct nbd_thread *t, struct nbd_req *r);
/* Run the lock grants other threads (and this one) made for this thread's ops. */
void nbd_req_run_grants(struct nbd_thread *t);
void nbd_req_pool_free(struct nbd_thread *t);
/* The requests still owning operations once the backend is closed (they will
 * never complete): freed with their scratch blocks. */
void nbd_req_free_live(struct nbd_thread *t);

/* nbd_lock.c: the block-lock table. A bop locks b->op.block, exclusively if
 * b->excl (a read-modify-write), else shared (a full-block write).
 * nbd_lock_get: 1 held now (b->locked), 0 queued: the grant arrives through
 * the owner thread's ready / granted lists (nbd_req_run_grants), -ENOMEM.
 * nbd_lock_put: release b's lock if held, granting waiters in arrival order.
 * nbd_locks_free: the entries, once the threads are stopped. */
int nbd_lock_get(struct nbd_server *s, struct nbd_bop *b);
void nbd_lock_put(struct nbd_thread *self, struct nbd_bop *b);
void nbd_locks_free(struct nbd_server *s);

#endif
