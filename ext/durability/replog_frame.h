/* replog_frame.h - what both sides of log replication share (replog_send.c,
 * replog_recv.c, replog_fetch.c): the link (a socket, its handshake state and
 * session key), the frame format (ext/durability/REPLICATION.md), the
 * authentication handshake (replog_auth.c), blocking-with-deadline socket
 * helpers and the record helpers. Internal: the public interface is replog.h.
 * Frames come from the network (untrusted): rl_recv_frame checks magic, type,
 * length, CRC32C and, once the link is authenticated, the frame's MAC and
 * sequence number before a payload is used. */
#ifndef KV_REPLOG_FRAME_H
#define KV_REPLOG_FRAME_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "core/kvbuf.h"
#include "core/tls.h"
#include "durability/wal.h"

#define RL_MAGIC 0x5052564bu /* "KVRP" */
#define RL_VERSION 2 /* 2: authenticated (v1 had no handshake: refused) */
#define HDR 32
#define MAX_FRAME (1u << 30)
#define SEG_LIMIT (64u << 20)
#define MAX_PEERS 16
#define MAX_BATCH_BYTES (16u << 20) /* a BATCH frame stops gathering records past this */

enum { F_HELLO = 1, F_HELLO_ACK, F_BATCH, F_ACK, F_FETCH, F_FILE, F_END, F_ERROR,
       F_AUTH_HELLO, F_AUTH_CHALLENGE, F_AUTH_PROOF, F_LAST = F_AUTH_PROOF };
enum { RL_ROLE_SENDER = 1, RL_ROLE_FETCH = 2 }; /* what a connection may do, fixed by its handshake */

#define RL_KEY 32   /* the pair's key (SHA-256 of the secret file) and a session key */
#define RL_NONCE 32
#define RL_MAC 32   /* HMAC-SHA256 after every frame of an authenticated link */

struct frame {
    uint32_t type, len;
    uint64_t a, b;
};

/* One end of a replication connection. Until the handshake is done (authed = 0)
 * frames carry no MAC and only the handshake's frames are accepted; after it,
 * every frame is followed by HMAC-SHA256(session key, direction, sequence number,
 * header, payload), the sequence counting the frames of each direction from 0:
 * a frame forged, altered, replayed, reordered, dropped or reflected fails. */
struct rl_link {
    int fd;
    int server;                  /* the receiver's end: names the direction of its frames */
    int authed;
    uint64_t send_seq, recv_seq;
    unsigned char session[RL_KEY];
    void *mac;                   /* EVP_MAC_CTX keyed with session (replog_frame.c) */
    /* --repl-tls: the socket's bytes are a TLS stream (NULL: plain TCP). A TLS read
     * takes a whole record: what the caller did not ask for waits in rbuf, so a
     * poll on fd alone would miss it (rl_link_pending, rl_link_wait). */
    struct tls_conn *tls;
    unsigned char *rbuf;         /* TLS_RECORD_MAX bytes, allocated at the first small read */
    size_t roff, rlen;           /* rbuf[roff..rlen): plaintext read but not yet taken */
    short want;                  /* after -EAGAIN: the event that lets the call go on (POLLIN/POLLOUT) */
};

static inline void rl_link_init(struct rl_link *l, int fd, int server)
{
    *l = (struct rl_link){.fd = fd, .server = server};
}
/* Close the socket (and its TLS session) and forget the session key. */
void rl_link_close(struct rl_link *l);
/* Run the link inside TLS (ctx: a client or server context of tls.h): every byte
 * after this goes through OpenSSL. The handshake runs inside the first I/O, or
 * rl_link_tls_client. 0 or -ENOMEM. */
int rl_link_use_tls(struct rl_link *l, struct tls_ctx *ctx);
/* Connecting side: the TLS handshake within timeout_ms (the peer's certificate
 * verified against the context's CA, ours presented). 0 or -errno, why in err. */
int rl_link_tls_client(struct rl_link *l, struct tls_ctx *ctx, int timeout_ms, char *err, size_t errlen);
/* A TLS context for the link from --repl-tls's files (server: the receiver,
 * which requires the peer's certificate). *out NULL when f names no certificate
 * (plain TCP). 0 or -errno with why in err. */
struct rl_tls_files;
int rl_tls_ctx(struct tls_ctx **out, const struct rl_tls_files *f, int server, char *err, size_t errlen);
/* Plaintext bytes already read from the socket and not yet taken (TLS). */
static inline size_t rl_link_pending(const struct rl_link *l) { return l->rlen - l->roff; }
/* Wait until the link can go on with ev (POLLIN: bytes to read, buffered ones
 * included; POLLOUT) or the timeout; after -EAGAIN, the event TLS asked for.
 * 1 ready, 0 timeout, -errno. */
int rl_link_wait(struct rl_link *l, short ev, uint64_t timeout_us);
/* The events to poll the link's fd for, to read (a TLS handshake may want POLLOUT). */
static inline short rl_link_events(const struct rl_link *l) { return l->want ? l->want : POLLIN; }
/* Start MACing every frame with this session key (after the handshake). 0 or -ENOMEM. */
int rl_link_set_session(struct rl_link *l, const unsigned char key[RL_KEY]);

/* The link's only socket I/O: every byte of every replication connection goes
 * through these three (plain TCP, or TLS with --repl-tls). Non-blocking: the bytes
 * moved (> 0), 0 = the peer closed (recv only), -EAGAIN (l->want says for what:
 * TLS may need to write to read), or -errno. more: the rest of the frame follows
 * at once (MSG_MORE: one TCP segment, not three; TLS: ignored, rl_send_frame
 * gathers a small frame into one record). */
long rl_io_send(struct rl_link *l, const void *buf, size_t n, int more);
/* Plain TCP only: send iov[0..n) in one sendmsg (a frame's parts, gathered);
 * the bytes moved, -EAGAIN or -errno as rl_io_send. */
struct iovec;
long rl_io_sendv(struct rl_link *l, const struct iovec *iov, int n);
long rl_io_recv(struct rl_link *l, void *buf, size_t n);

static inline uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* Wait until fd is ready for ev or the timeout (microseconds: the ship interval
 * is 100 us). Returns 1 ready, 0 timeout, -errno. */
int rl_wait_fd_us(int fd, short ev, uint64_t timeout_us);
static inline int wait_fd(int fd, short ev, int timeout_ms) { return rl_wait_fd_us(fd, ev, (uint64_t)timeout_ms * 1000); }

/* Send one frame (header, payload and, once authenticated, its MAC) within
 * timeout_ms. Returns 0 or -errno. */
int rl_send_frame(struct rl_link *l, uint32_t type, uint64_t a, uint64_t b, const void *payload, size_t len,
                  int timeout_ms);
/* The same with the payload in parts pl[0..npl) (npl <= RL_FRAME_IOV, else
 * -E2BIG): on plain TCP the header, the parts and the MAC leave in one sendmsg. */
#define RL_FRAME_IOV 64
int rl_send_framev(struct rl_link *l, uint32_t type, uint64_t a, uint64_t b, const struct iovec *pl, int npl,
                   int timeout_ms);
/* Read one frame; the payload replaces pl's contents. Returns 0 or -errno
 * (-EPROTO: not a frame of ours or too long, or a data frame before the
 * handshake; -EBADMSG: CRC mismatch; -EACCES: MAC mismatch: forged, altered,
 * replayed or out of order). */
int rl_recv_frame(struct rl_link *l, struct frame *f, struct kvbuf *pl, int timeout_ms);
/* Fill f from a frame header: 0, or -EPROTO if its magic, type or length (at
 * most what its type may carry) is wrong. */
int rl_parse_header(const unsigned char *h, struct frame *f);
/* Send an ERROR frame carrying msg (best effort: the connection closes next). */
void rl_send_error(struct rl_link *l, const char *msg);

/* The handshake (replog_auth.c, REPLICATION.md): both ends prove they hold the
 * pair's key over nonces from both sides, binding role and node id; on success
 * the link has its session key. Client: the sender (RL_ROLE_SENDER) or a
 * recovering node (RL_ROLE_FETCH); 0, or -errno with why in err (-EACCES: the
 * peer refused us or failed its own proof). */
int rl_auth_client(struct rl_link *l, const unsigned char key[RL_KEY], int role, const uint8_t node_id[16],
                   int timeout_ms, char *err, size_t errlen);
/* Server (the receiver), one step per frame received: AUTH_HELLO (answered with
 * a challenge; *role and node_id set) and AUTH_PROOF (answered with the
 * receiver's proof; the link is then authenticated). st holds the state between
 * the two. 0 = step done, or -errno with why in err (an ERROR frame was sent). */
struct rl_auth_state {
    int step;                    /* 0: AUTH_HELLO expected, 1: AUTH_PROOF expected, 2: done */
    int role;
    uint8_t node_id[16];
    unsigned char nonce_c[RL_NONCE], nonce_s[RL_NONCE];
};
int rl_auth_server_step(struct rl_link *l, struct rl_auth_state *st, const unsigned char key[RL_KEY],
                        const struct frame *f, const struct kvbuf *pl, char *err, size_t errlen);
/* Connect to host:port (IPv4) within timeout_ms, TCP_NODELAY, non-blocking.
 * Returns the fd or -errno (why in err). */
int rl_connect_to(const char *host, int port, int timeout_ms, char *err, size_t errlen);

/* Length of the record at p if it is intact and fits in n bytes, else 0. */
static inline size_t rec_len(const unsigned char *p, size_t n)
{
    size_t l = wal_rec_len(p, n);
    return l <= n ? l : 0;
}

static inline uint64_t rec_lsn(const unsigned char *p, size_t l) { return wal_rec_lsn(p, l); }

#endif
