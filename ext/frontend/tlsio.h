/* tlsio.h - TLS on the RESP port for the pollers: the context made from the
 * tls-* settings, the TLS listeners, and per-connection reads and writes with
 * the same contract as read(2)/send(2) (so the poller's one path serves both
 * kinds of connection). A connection's handshake runs inside its first reads:
 * until it is done no request is parsed. Counters for INFO.
 * Threads: tlsio_create/listen/free on the control thread; the connection calls
 * on the poller that owns the connection; counters relaxed atomics. */
#ifndef KV_TLSIO_H
#define KV_TLSIO_H

#include <stddef.h>
#include <sys/types.h>

struct kv_engine;
struct tls_conn;
struct tlsio;

/* One TLS connection of a poller. */
struct tlsio_conn {
    struct tlsio *io;
    struct tls_conn *t;
    int more;          /* the last recv stopped for lack of room: the socket may hold more */
    int want_write;    /* the handshake waits for the socket to take its bytes */
    int established;   /* handshake done (counted) */
};

/* The front end's TLS, or *out = NULL when tls-port is off (-1). Loads the
 * certificate, key and CA now and registers INFO lines. 0 or -errno with a
 * message (naming the setting and file) in err. */
int tlsio_create(struct tlsio **out, struct kv_engine *eng, char *err, size_t errlen);
void tlsio_free(struct tlsio *io);
/* A listening socket on bind:tls-port (0: the first call picks a free port, kept
 * in eng->tls_port for later calls, INFO and the control plane). fd or -errno. */
int tlsio_listen(struct tlsio *io, int reuseport, char *err, size_t errlen);

/* A TLS connection over the accepted socket fd (not owned), or NULL (out of memory). */
struct tlsio_conn *tlsio_conn_new(struct tlsio *io, int fd);
void tlsio_conn_free(struct tlsio_conn *c);

/* read(2)'s contract: bytes read into buf (at most room, room >= TLS_RECORD_MAX:
 * whole records only, so no plaintext stays inside OpenSSL where epoll cannot see
 * it), 0 at the end of the stream, or -1 with errno (EAGAIN: wait for an event;
 * tlsio_want_write then says which). c NULL: a plain read(2) of fd. A failed
 * handshake is counted and logged (rate-limited). */
ssize_t tlsio_recv(struct tlsio_conn *c, int fd, void *buf, size_t room);
/* send(2)'s contract (MSG_NOSIGNAL); c NULL: a plain send. After EAGAIN, call
 * again with the same bytes (more may follow them). */
ssize_t tlsio_send(struct tlsio_conn *c, int fd, const void *buf, size_t n);

/* 1 if the last recv stopped with room left too small for another record (the
 * socket may still hold bytes an edge-triggered epoll will not report again). */
static inline int tlsio_more(const struct tlsio_conn *c) { return c && c->more; }
/* 1 if the handshake waits for EPOLLOUT (then recv again). */
static inline int tlsio_want_write(const struct tlsio_conn *c) { return c && c->want_write; }

#endif
