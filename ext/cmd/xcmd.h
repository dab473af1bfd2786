/* xcmd.h - what the stream command files share (xentry.c: entries; xgroup.c:
 * consumer groups; xread.c: XREAD and XREADGROUP; xinfo.c): ID arguments as
 * Redis 7.0 parses them, replies of IDs and entries, and running a command's
 * function on its key through kvt_xapply. Not a public interface. */
#ifndef KV_XCMD_H
#define KV_XCMD_H

#include "cmd/cmd_int.h"
#include "core/stream.h"
#include "core/table.h"

#define ERR_XID "ERR Invalid stream ID specified as stream command argument"
#define ERR_XSMALL "ERR The ID specified in XADD is equal or smaller than the target stream top item"
#define ERR_XDAMAGED "ERR the stream stored at this key is damaged"

/* What an absent key's ID rules see (xentry.c): an empty stream. */
extern const struct xstream x_empty_stream;

/* One stream command's state across its kvt_xapply (or kvt_apply, for reads). */
struct xop {
    struct cmd_op op;         /* the client; the error a function fails with (xfail) */
    const struct cmd_args *a;
    int reply_oom;            /* a reply could not be queued under the lock */
};

static inline int64_t xfail(struct xop *x, const char *err)
{
    x->op.err = err;
    return CMD_OP_ERR;
}

/* The key is not a stream (absent is fine): WRONGTYPE. */
#define NEED_STREAM(cur)                                     \
    do {                                                     \
        if ((cur)->exists && (cur)->type != KVT_STREAM)      \
            return KVT_WRONGTYPE;                            \
    } while (0)

/* Argument i as a stream ID. strict: "-" and "+" refused; missing_seq: the seq of
 * a bare "ms". 0, or -1 with the error replied. */
int x_arg_id(struct cmd_client *c, const struct cmd_args *a, int i, int strict, uint64_t missing_seq,
             struct xs_id *id);
/* An interval bound (XRANGE, XPENDING, XAUTOCLAIM): "(" makes it exclusive, which
 * moves it one ID inward (end: outward from the caller's view); 0 or -1 replied. */
int x_arg_bound(struct cmd_client *c, const struct cmd_args *a, int i, int is_end, struct xs_id *id);

/* Replies (return 0 or -ENOMEM). */
int x_add_id(struct kvbuf *out, struct xs_id id);
/* [id, [field, value, ...]] */
int x_add_entry(struct kvbuf *out, const struct xs_entry *e);
/* A null array: *-1 (RESP2) or _ (RESP3). */
int x_add_null_array(struct cmd_client *c);
/* An aggregate whose length is known at its end: x_hdr_begin holds room for
 * its header at *at, x_hdr_end writes "<type><n>\r\n" there and closes the gap. */
#define X_HDR_ROOM 24
int x_hdr_begin(struct kvbuf *out, size_t *at);
void x_hdr_end(struct kvbuf *out, size_t at, char type, long long n);
/* [lo, hi] of s (rev: highest first), at most count entries (< 0: all): the
 * array. Returns the entries replied, or -ENOMEM. */
int64_t x_add_range(struct kvbuf *out, const struct xstream *s, struct xs_id lo, struct xs_id hi, int rev,
                    long long count);

/* kvt_xapply(fn, x) on key: 1 with fn's result in *res, 0 when answered or
 * stalled (as cmd_apply_key: what fn queued on c->out is dropped, the error
 * replied, or the request waits for a load or for need bytes of memory). */
int x_apply(struct xop *x, const char *key, size_t klen, kvt_xapply_fn fn, size_t need, int64_t *res);
/* A read through kvt_apply (fn changes nothing): as x_apply. */
int x_read(struct xop *x, const char *key, size_t klen, kvt_apply_fn fn, int64_t *res);

#endif
