/* nbd.h - the NBD protocol's bytes (newstyle fixed handshake, transmission):
 * constants, parsers of what a client sends and encoders of what a server
 * sends. Parsers take untrusted input: every length and count is bounded here,
 * a parser never reads past the n bytes it is given, and returns how much it
 * consumed, 0 when more bytes are needed, or -errno when the input is wrong.
 * No state, no allocation, no I/O: any thread.
 * Byte order on the wire: big-endian everywhere.
 */
#ifndef KV_PROTO_NBD_H
#define KV_PROTO_NBD_H

#include <stddef.h>
#include <stdint.h>

/* ---- handshake */
#define NBD_MAGIC 0x4e42444d41474943ULL          /* "NBDMAGIC" */
#define NBD_IHAVEOPT 0x49484156454f5054ULL       /* "IHAVEOPT" */
#define NBD_REP_MAGIC 0x0003e889045565a9ULL      /* option replies */
#define NBD_FLAG_FIXED_NEWSTYLE (1u << 0)        /* handshake flags (server) */
#define NBD_FLAG_NO_ZEROES (1u << 1)
#define NBD_FLAG_C_FIXED_NEWSTYLE (1u << 0)      /* client flags */
#define NBD_FLAG_C_NO_ZEROES (1u << 1)

enum {
    NBD_OPT_EXPORT_NAME = 1, NBD_OPT_ABORT = 2, NBD_OPT_LIST = 3, NBD_OPT_PEEK_EXPORT = 4,
    NBD_OPT_STARTTLS = 5, NBD_OPT_INFO = 6, NBD_OPT_GO = 7, NBD_OPT_STRUCTURED_REPLY = 8,
};
#define NBD_REP_ACK 1u
#define NBD_REP_SERVER 2u
#define NBD_REP_INFO 3u
#define NBD_REP_ERR(n) (0x80000000u | (n))
#define NBD_REP_ERR_UNSUP NBD_REP_ERR(1)
#define NBD_REP_ERR_POLICY NBD_REP_ERR(2)
#define NBD_REP_ERR_INVALID NBD_REP_ERR(3)
#define NBD_REP_ERR_TLS_REQD NBD_REP_ERR(5)        /* TLS is required before this option */
#define NBD_REP_ERR_UNKNOWN NBD_REP_ERR(6)
#define NBD_REP_ERR_TOO_BIG NBD_REP_ERR(9)
enum { NBD_INFO_EXPORT = 0, NBD_INFO_NAME = 1, NBD_INFO_DESCRIPTION = 2, NBD_INFO_BLOCK_SIZE = 3 };

/* transmission flags */
#define NBD_FLAG_HAS_FLAGS (1u << 0)
#define NBD_FLAG_READ_ONLY (1u << 1)
#define NBD_FLAG_SEND_FLUSH (1u << 2)
#define NBD_FLAG_SEND_FUA (1u << 3)
#define NBD_FLAG_SEND_TRIM (1u << 5)
#define NBD_FLAG_SEND_WRITE_ZEROES (1u << 6)
#define NBD_FLAG_SEND_DF (1u << 7)
#define NBD_FLAG_CAN_MULTI_CONN (1u << 8)
#define NBD_FLAG_SEND_FAST_ZERO (1u << 11)

/* ---- transmission */
#define NBD_REQUEST_MAGIC 0x25609513u
#define NBD_SIMPLE_REPLY_MAGIC 0x67446698u
#define NBD_STRUCTURED_REPLY_MAGIC 0x668e33efu
enum {
    NBD_CMD_READ = 0, NBD_CMD_WRITE = 1, NBD_CMD_DISC = 2, NBD_CMD_FLUSH = 3, NBD_CMD_TRIM = 4,
    NBD_CMD_CACHE = 5, NBD_CMD_WRITE_ZEROES = 6, NBD_CMD_BLOCK_STATUS = 7,
};
#define NBD_CMD_FLAG_FUA (1u << 0)
#define NBD_CMD_FLAG_NO_HOLE (1u << 1)
#define NBD_CMD_FLAG_DF (1u << 2)
#define NBD_CMD_FLAG_REQ_ONE (1u << 3)
#define NBD_CMD_FLAG_FAST_ZERO (1u << 4)
#define NBD_REPLY_FLAG_DONE (1u << 0)
#define NBD_REPLY_TYPE_NONE 0u
#define NBD_REPLY_TYPE_OFFSET_DATA 1u
#define NBD_REPLY_TYPE_OFFSET_HOLE 2u
#define NBD_REPLY_TYPE_ERROR 0x8001u

/* NBD error values (errno numbers as the protocol fixes them) */
enum {
    NBD_EPERM = 1, NBD_EIO = 5, NBD_ENOMEM = 12, NBD_EINVAL = 22, NBD_ENOSPC = 28, NBD_EOVERFLOW = 75,
    NBD_ENOTSUP = 95, NBD_ESHUTDOWN = 108,
};

/* Bounds on what a client may send. */
#define NBD_MAX_PAYLOAD (32u << 20)   /* a request's data (WRITE) and a READ's length */
#define NBD_MAX_OPT_LEN 8192u         /* an option's data; longer ones get ERR_TOO_BIG (data skipped) */
#define NBD_MAX_NAME 4096u            /* an export name (the protocol's own bound) */
#define NBD_MAX_INFO_REQS 64u         /* information requests in one GO/INFO (more: ERR_INVALID) */

#define NBD_GREETING_LEN 18           /* NBDMAGIC, IHAVEOPT, handshake flags */
#define NBD_OPT_HDR_LEN 16            /* IHAVEOPT, option, length */
#define NBD_OPT_REPLY_LEN 20          /* reply magic, option, type, length */
#define NBD_REQ_LEN 28
#define NBD_SIMPLE_REPLY_LEN 16
#define NBD_CHUNK_HDR_LEN 20

struct nbd_opt_hdr {
    uint32_t option;
    uint32_t length;                  /* bytes of data that follow */
};

/* NBD_OPT_GO / NBD_OPT_INFO's data, parsed in place (name points into it). */
struct nbd_opt_go {
    const char *name;
    uint32_t name_len;
    uint16_t ninfo;
    uint16_t info[NBD_MAX_INFO_REQS];
};

struct nbd_request {
    uint16_t flags, type;
    uint64_t cookie, offset;
    uint32_t length;
};

/* ---- big-endian fields */
static inline uint16_t nbd_get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static inline uint32_t nbd_get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint64_t nbd_get64(const uint8_t *p) { return (uint64_t)nbd_get32(p) << 32 | nbd_get32(p + 4); }
static inline void nbd_put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static inline void nbd_put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static inline void nbd_put64(uint8_t *p, uint64_t v) { nbd_put32(p, (uint32_t)(v >> 32)); nbd_put32(p + 4, (uint32_t)v); }

/* The server's greeting (NBD_GREETING_LEN bytes into dst). */
void nbd_enc_greeting(uint8_t *dst);
/* The client's flags (4 bytes): consumed 4 with *flags set, 0 (need more), or
 * -EPROTO when a flag this server does not know is set (the protocol says to
 * close then). */
int nbd_parse_client_flags(const uint8_t *p, size_t n, uint32_t *flags);
/* An option's header: NBD_OPT_HDR_LEN consumed, 0 (need more), -EBADMSG (not
 * IHAVEOPT: close). The length is not checked here (an oversized option is
 * skipped and answered by the caller). */
int nbd_parse_opt_hdr(const uint8_t *p, size_t n, struct nbd_opt_hdr *h);
/* GO / INFO data (all n bytes of it): 0, or -EINVAL when the lengths inside
 * disagree with n or pass the bounds (reply NBD_REP_ERR_INVALID). */
int nbd_parse_opt_go(const uint8_t *p, size_t n, struct nbd_opt_go *go);
/* An option reply's header into dst (NBD_OPT_REPLY_LEN bytes); len bytes of data follow. */
void nbd_enc_opt_reply(uint8_t *dst, uint32_t option, uint32_t type, uint32_t len);
/* NBD_OPT_EXPORT_NAME's answer: size, flags and, unless no_zeroes, 124 zeros.
 * Returns the bytes written into dst (which holds 134). */
size_t nbd_enc_export_name_reply(uint8_t *dst, uint64_t size, uint16_t flags, int no_zeroes);

/* A request header: NBD_REQ_LEN consumed, 0 (need more), -EBADMSG (bad magic:
 * the stream cannot be resynchronized, close). */
int nbd_parse_request(const uint8_t *p, size_t n, struct nbd_request *r);
/* A simple reply (NBD_SIMPLE_REPLY_LEN bytes); error is an NBD error value. */
void nbd_enc_simple_reply(uint8_t *dst, uint32_t error, uint64_t cookie);
/* A structured reply chunk's header (NBD_CHUNK_HDR_LEN bytes). */
void nbd_enc_chunk(uint8_t *dst, uint16_t flags, uint16_t type, uint64_t cookie, uint32_t length);
/* NBD_REPLY_TYPE_ERROR with DONE: header and payload (error, message) into
 * dst, which holds NBD_CHUNK_HDR_LEN + 6 + msg_len bytes; returns the bytes. */
size_t nbd_enc_error_chunk(uint8_t *dst, uint64_t cookie, uint32_t error, const char *msg, uint16_t msg_len);
/* -errno -> the NBD error value that names it (anything unlisted: EINVAL, as the protocol says). */
uint32_t nbd_error_of(int neg_errno);
/* Name of a command for log lines ("read", ..., "unknown"). */
const char *nbd_cmd_name(uint16_t type);

#endif
