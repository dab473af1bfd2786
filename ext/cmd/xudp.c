/* xudp.c - the UDP front end's framed stream operations (paper 004's batch transfer;
 * framing in frontend/udpfront.h), internal commands a RESP client cannot name:
 *   xadd-batch KEY FIELD V1 .. Vk   k entries, each FIELD Vi, with consecutive IDs
 *                                   from "*" (as k XADDs in one go): one change, one
 *                                   log record, one reply [first ID, k];
 *   xpull KEY NO                    the pull answer of batch NO (8 bytes, big-endian):
 *                                   core/stream.h xs_pull_encode's bytes, or a
 *                                   status without entries; a sealed batch pulled
 *                                   goes to the table's batch hook (the pull cache). */
#include <errno.h>
#include <string.h>

#include "cmd/xcmd.h"
#include "core/bytes.h"

#define XPULL_ROOM 1440 /* the payload a UDP reply has room for after its header (frontend/pullcache_slot.h) */

struct xbatch {
    struct xop x;
    struct xs_id first;
};

static int64_t xadd_batch_fn(void *arg, const struct kvt_state *cur, struct kvbuf *d)
{
    struct xbatch *t = arg;
    const struct cmd_args *a = t->x.a;
    NEED_STREAM(cur);
    const struct xstream *s = cur->exists ? cur->stream : &x_empty_stream;
    struct xs_id id;
    if (xs_next_id(s, 1, 0, XS_ID_MIN, (uint64_t)cmd_unix_ms(), &id))
        return xfail(&t->x, "ERR The stream has exhausted the last possible ID, unable to add more items");
    if (!cur->exists && xd_create(d))
        return -ENOMEM;
    t->first = id;
    for (int i = 3; i < a->argc; i++) {
        struct xs_field f = {a->argv[2], a->argv[i], a->argl[2], a->argl[i]};
        if (xd_add(d, id, &f, 1))
            return -ENOMEM;
        int ok = 1;
        if (i + 1 < a->argc && (id = xs_id_next(id, &ok), !ok))
            return xfail(&t->x, "ERR The stream has exhausted the last possible ID, unable to add more items");
    }
    return 1;
}

int c_xadd_batch(struct cmd_client *c, const struct cmd_args *a)
{
    struct xbatch t = {.x = {{c, NULL}, a, 0}};
    size_t need = 128;
    for (int i = 2; i < a->argc; i++)
        need += a->argl[i] + 16;
    int64_t added;
    if (!x_apply(&t.x, a->argv[1], a->argl[1], xadd_batch_fn, need, &added))
        return 0;
    cmd_stream_signal(c, a->argv[1], a->argl[1]); /* blocked reads of the key may go on */
    int rc = resp_add_array(c->out, 2);
    return rc ? rc : x_add_id(c->out, t.first) ? -ENOMEM : resp_add_int(c->out, a->argc - 3);
}

/* A status without entries: u8 status, u8 0, u16 0, u32 0, u64 no, then for
 * XS_PULL_NO_BATCH the oldest batch's number and the next batch's. */
static int64_t pull_status(struct kvbuf *out, int status, uint64_t no, const struct xstream *s)
{
    unsigned char b[32] = {(unsigned char)status};
    put_be64(b + 8, no);
    size_t n = 16;
    if (s) {
        put_be64(b + 16, s->n ? s->b[s->head]->no : s->next_no);
        put_be64(b + 24, s->next_no);
        n = 32;
    }
    return kvbuf_append(out, b, n) ? -ENOMEM : 0;
}

static int64_t xpull_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct xop *x = arg;
    const struct cmd_args *a = x->a;
    struct kvbuf *out = x->op.c->out;
    uint64_t no = get_be64((const unsigned char *)a->argv[2]);
    NEED_STREAM(cur);
    if (!cur->exists)
        return pull_status(out, XS_PULL_NO_STREAM, no, NULL);
    const struct xs_batch *b = xs_batch_by_no(cur->stream, no);
    if (!b)
        return pull_status(out, XS_PULL_NO_BATCH, no, cur->stream);
    if (xs_need(cur->stream, b))
        return 0; /* out of memory: the pull waits for it to be read back (a stall, as a key's load) */
    if (kvbuf_reserve(out, XPULL_ROOM))
        return -ENOMEM;
    out->len += xs_pull_encode(b, (unsigned char *)out->p + out->len, XPULL_ROOM);
    kvt_batch_seen(x->op.c->table, a->argv[1], a->argl[1], b); /* a sealed one fills its slot */
    return 0;
}

int c_xpull(struct cmd_client *c, const struct cmd_args *a)
{
    if (a->argl[2] != 8)
        return cmd_reply_err(c, "ERR invalid pull: the batch number is 8 bytes");
    struct xop x = {{c, NULL}, a, 0};
    int64_t r;
    x_read(&x, a->argv[1], a->argl[1], xpull_fn, &r);
    return 0;
}
