/* nbd_netkv.h - the network backends' shared client (nbd_netkv.c): a backend
 * context's connections to one KV server, non-blocking connect, pipelining,
 * in-flight FIFOs, reconnect with backoff; the wire protocol (RESP in
 * nbd_resp.c, memcached's meta protocol in nbd_memcache.c) is a struct nk_proto
 * of small callbacks. Everything runs on the context's NBD thread (open and
 * close on the control thread, before it starts / after it stopped). Replies are
 * untrusted input: every line and payload length is bounded.
 */
#ifndef KV_NBD_NETKV_H
#define KV_NBD_NETKV_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "frontend/nbd_backend.h"
#include "proto/resp.h"

/* A backend URL taken apart: scheme://[[USER]:PASSWORD@]HOST:PORT[/DB]. */
#define NK_HOST_MAX 256
#define NK_CRED_MAX 256
struct nk_url {
    char scheme[16];
    char host[NK_HOST_MAX];   /* a name or an address; [v6] without its brackets */
    int port;                 /* 1..65535 */
    char user[NK_CRED_MAX];   /* "" = none (AUTH PASSWORD: the default user) */
    char password[NK_CRED_MAX]; /* "" with has_password 0 = none */
    int has_password;
    int db;                   /* redis: SELECT db; -1 = none given */
};

/* Parse url (scheme "kvstore", "redis" or "memcached": what each accepts is in
 * nbd.h's nbd_config.backend). 0, or -EINVAL with what is wrong and what is
 * accepted in err. No name lookup here (open resolves the host). */
int nk_parse_url(const char *url, struct nk_url *u, char *err, size_t errlen);

/* Internal request kinds (beside enum nbd_kvop_kind): the connection's own
 * requests at (re)connect and the open-time checks. */
enum {
    NK_OP_AUTH = 100,         /* RESP AUTH [user] password: +OK */
    NK_OP_SELECT,             /* RESP SELECT db: +OK */
    NK_OP_INFO,               /* RESP INFO (the default sections): a bulk string */
    NK_OP_VERSION,            /* memcached "version": VERSION x.y.z */
    NK_OP_META_GET,           /* the device's record (nbd_backend.h): its value, or none
                                 (the protocol's line sets op->block to 1 when there is one,
                                 2 when the server is loading and cannot say) */
    NK_OP_META_SET,           /* store the record, op->buf (NUL-terminated) */
};

struct nk_conn;

/* The reply header's verdict, from proto->line. */
enum {
    NK_LINE_DONE = -1,        /* the reply is complete (op->rc set) */
    NK_LINE_BAD = -2,         /* not a reply we can follow: the connection is reset */
    /* >= 0: a payload of that many bytes follows, then "\r\n" (op->rc set for
       what the payload means: a GET whose length is not block_size gets -EIO
       and its payload is skipped) */
};

struct nk_proto {
    const char *scheme;
    /* Check u for this scheme (password allowed? db?), key_prefix for its key rules.
       0 or -EINVAL with a message. */
    int (*check)(const struct nk_url *u, const char *key_prefix, char *err, size_t errlen);
    /* Append op's request to c's output: nk_out_copy / nk_out_ref. key is the block's key. */
    void (*encode)(struct nk_conn *c, struct nbd_kvop *op, const char *key, int klen);
    /* The connection's first requests after it is connected (AUTH, SELECT):
       nk_queue_internal for each. */
    void (*greet)(struct nk_conn *c);
    /* One reply line (without "\r\n", NUL-terminated in place) for op, the oldest
       request in flight: set op->rc, return NK_LINE_DONE, NK_LINE_BAD, or a payload length. */
    int (*line)(struct nk_conn *c, struct nbd_kvop *op, char *line, size_t len);
};

extern const struct nk_proto nk_proto_resp_kvstore, nk_proto_resp_redis, nk_proto_memcache;

/* For the protocol files: the request's bytes. nk_out_copy copies (into the
 * connection's output buffer, which grows amortized: no allocation per
 * request once warm); nk_out_ref points at memory that stays valid until the
 * request completes (a PUT's block). */
void nk_out_copy(struct nk_conn *c, const void *p, size_t n);
void nk_out_ref(struct nk_conn *c, const void *p, size_t n);
/* A PUT's bytes: its header (copied), the block (referenced), CRLF. */
void nk_out_block(struct nk_conn *c, const char *hdr, size_t n, const char *block);
/* Request encoding helpers: n in decimal at p / n bytes of s at p; return the end. */
static inline char *nk_put_num(char *p, uint64_t n)
{
    return p + resp_ll2str(p, (long long)n); /* lengths and block sizes: far below 2^63 */
}

static inline char *nk_put_str(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

/* Queue an internal request of kind (NK_OP_*) at the end of c's send queue. */
void nk_queue_internal(struct nk_conn *c, int kind);
/* The URL this connection was opened with; the block size. */
const struct nk_url *nk_conn_url(const struct nk_conn *c);
uint32_t nk_conn_block_size(const struct nk_conn *c);
/* Record why a reply was refused (the open's error message, a log line). */
void nk_conn_note(struct nk_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The backend callbacks (nbd_backend.h), shared by the three schemes; open takes
   the protocol. */
int nk_open(void **ctx, const struct nbd_backend_cfg *cfg, const struct nk_proto *proto, char *err, size_t errlen);
void nk_close(void *ctx);
int nk_submit(void *ctx, struct nbd_kvop *op);
void nk_flush(void *ctx);
void nk_on_event(void *ctx, struct nbd_watch *w, uint32_t events);
uint64_t nk_pending(void *ctx);
void nk_add_stats(void *ctx, struct nbd_backend_stats *st);

/* For the protocol files' open (control thread, before the thread runs): run one
 * internal request (NK_OP_INFO, NK_OP_VERSION) on the first connection and wait
 * for its reply (open's timeout); *payload = its payload, NUL-terminated (valid
 * until nk_open_done). 0, or -errno with the reason in err. */
int nk_call(void *ctx, int kind, const char **payload, char *err, size_t errlen);
/* Thread 0's open: the device's record checked and stored (nbd_meta_check). 0, or
 * -errno with the reason in err. */
int nk_check_meta(void *ctx, const struct nbd_backend_cfg *cfg, char *err, size_t errlen);
/* The open-time checks are over: free what they needed. */
void nk_open_done(void *ctx);
/* "scheme://host:port", for messages. */
const char *nk_name(void *ctx);

/* The client's own counters (tests, benchmarks). */
struct nk_counters {
    uint64_t writev_calls;    /* writev system calls that sent requests */
    uint64_t requests_sent;   /* requests whose bytes writev began to send */
    uint64_t max_requests_per_writev; /* the most requests one writev call carried */
    uint64_t reads;           /* read system calls */
    uint64_t replies;         /* replies parsed */
    uint64_t zero_copy_bytes; /* payload bytes read straight into a GET's block */
};
void nk_get_counters(void *ctx, struct nk_counters *out);

#endif
