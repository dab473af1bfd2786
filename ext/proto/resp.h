/* resp.h - RESP2 request parser and reply encoder.
 *
 * The parser reads untrusted bytes from the network. It is incremental: state
 * survives between calls, so a request split at any byte boundary parses the
 * same, and bytes already scanned are not scanned again. It is zero-copy:
 * arguments are (offset, length) pairs into the caller's buffer, relative to the
 * start of the current request, so the caller may move or grow the buffer
 * between calls. Every length and count is bounded (RESP_MAX_* below); memory
 * grows only with bytes actually received. One parser per connection; not
 * thread-safe.
 */
#ifndef KV_RESP_H
#define KV_RESP_H

#include <stddef.h>
#include <stdint.h>

#include "core/kvbuf.h"

#define RESP_MAX_INLINE (64 * 1024)          /* Redis PROTO_INLINE_MAX_SIZE */
#define RESP_MAX_MULTIBULK 2147483647LL     /* arguments per request: Redis 7 (INT_MAX); memory
                                              * still grows only with arguments received */
#define RESP_MAX_BULK (512LL * 1024 * 1024)  /* Redis proto-max-bulk-len default */
#define RESP_MAX_UNAUTH_MULTIBULK 10         /* before AUTH, as Redis 7 */
#define RESP_MAX_UNAUTH_BULK 16384

enum { RESP_ERROR = -1, RESP_AGAIN = 0, RESP_DONE = 1 };

/* 8 bytes an argument: the smallest argument ("$0\r\n\r\n") takes 6 bytes of input,
 * so the array never costs much more than the bytes received for it. A request
 * longer than 4 GiB is refused (a front end's query-buffer limit is lower). */
struct resp_arg {
    uint32_t off; /* from the start of the request */
    uint32_t len;
};
#define RESP_ARGS_KEEP 1024 /* argument arrays larger than this are freed (or shrunk) after use */

struct resp_parser {
    size_t scan;        /* bytes of the request consumed so far */
    long long pending;  /* multibulk: arguments still to read; -1 = header not read */
    long long bulk;     /* length of the bulk being read, -1 = its header not read */
    int argc, argcap;
    struct resp_arg *argv;
    int unauth;         /* apply the tighter limits for unauthenticated clients */
    const char *err;    /* after RESP_ERROR: the message, without "-ERR " */
};

void resp_parser_init(struct resp_parser *p);
void resp_parser_free(struct resp_parser *p);
/* Bytes the parser holds for the request being parsed (its argument array): a
 * front end counts them with its input buffer against the query-buffer limit. */
static inline size_t resp_parser_mem(const struct resp_parser *p) { return (size_t)p->argcap * sizeof *p->argv; }

/* Parse one request starting at buf (len bytes available from the request's
 * start). Returns RESP_DONE (p->argc/argv hold it, p->scan is its length; an
 * empty request has argc 0), RESP_AGAIN (need more bytes), or RESP_ERROR (p->err
 * says why; the connection must be closed after replying). Call resp_reset after
 * RESP_DONE before parsing the next request. Inline requests are unescaped in
 * place, hence the non-const buffer. */
int resp_parse(struct resp_parser *p, char *buf, size_t len);
void resp_reset(struct resp_parser *p);

/* Argument arrays a front end copies parsed requests into (argv[i] points into its
 * input buffer, argl[i] is the length), grown on demand; owned by one thread. */
struct resp_args {
    const char **argv;
    size_t *argl;
    int cap;
};
/* Room for n arguments: 0, or -ENOMEM (also past 2^29, which no buffer within the
 * query-buffer limit can hold: every argument takes at least 6 bytes). An array
 * grown past RESP_ARGS_KEEP by one huge request is shrunk again by the next
 * smaller one, so it does not keep that memory for ever. Inline: a front end asks
 * once per request, and almost always there is room. */
int resp_args_grow(struct resp_args *a, int n);
static inline int resp_args_reserve(struct resp_args *a, int n)
{
    return n <= a->cap && a->cap <= RESP_ARGS_KEEP ? 0 : resp_args_grow(a, n);
}
void resp_args_free(struct resp_args *a);

/* Reply encoders. Each returns 0 or -ENOMEM. */
int resp_add_status(struct kvbuf *b, const char *s);          /* +s\r\n */
int resp_add_error(struct kvbuf *b, const char *s);           /* -s\r\n (s includes the code) */
int resp_add_errorf(struct kvbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int resp_add_int(struct kvbuf *b, long long v);               /* :v\r\n */
int resp_add_bulk(struct kvbuf *b, const void *p, size_t n);  /* $n\r\n...\r\n */
int resp_add_bulk_str(struct kvbuf *b, const char *s);
int resp_add_nil(struct kvbuf *b);                            /* $-1\r\n */
int resp_add_array(struct kvbuf *b, long long n);             /* *n\r\n */
/* RESP3-aware forms: proto 3 uses null "_" and maps "%n"; proto 2 "$-1" and "*2n". */
int resp_add_null(struct kvbuf *b, int proto);
int resp_add_map(struct kvbuf *b, int proto, long long pairs);
int resp_add_set(struct kvbuf *b, int proto, long long n);              /* "~n" / "*n" */
/* RESP3 verbatim string "=len\r\ntxt:..." (proto 3) or a bulk string (proto 2). */
int resp_add_verbatim(struct kvbuf *b, int proto, const char *p, size_t n);

/* Decimal formatting without printf, for hot paths; returns chars written. */
int resp_ll2str(char *dst, long long v);

#endif
