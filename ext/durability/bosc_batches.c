/* bosc_batches.c - the sweep's side of the batch store (bstore.h): a stream
 * record's batches are written and synced before the chain that holds it; the
 * references of the records a sweep replaces leave their segments' live bytes
 * once the new chains are synced and recorded (segments nothing refers to then
 * go); a FLUSHALL retires every segment until its generation is recorded.
 * Flusher only. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/stream.h"
#include "durability/bosc_int.h"
#include "durability/bstore.h"

void bosc_batches_begin(struct bosc *b, struct sweep_ctx *c, uint64_t gen)
{
    c->ndec = 0;
    if (gen != b->bs_gen) { /* a FLUSHALL: no record of this generation refers to a batch before it */
        bstore_retire(b->bs);
        b->bs_gen = gen;
        b->bs_retired = 1;
    }
}

struct replaced {
    struct sweep_ctx *c;
    int oom;
};

static void old_ref(void *arg, const struct xs_ref *ref)
{
    struct replaced *r = arg;
    struct sweep_ctx *c = r->c;
    if (c->ndec == c->capdec) {
        size_t cap = c->capdec ? 2 * c->capdec : 64;
        struct bs_dec *nd = realloc(c->dec, cap * sizeof *nd);
        if (!nd) {
            r->oom = 1;
            return;
        }
        c->dec = nd;
        c->capdec = cap;
    }
    c->dec[c->ndec++] = (struct bs_dec){*ref, 0};
}

int bosc_batches_replaced(struct sweep_ctx *c, const void *val, uint32_t vlen)
{
    struct replaced r = {c, 0};
    (void)xs_refs(val, vlen, old_ref, &r); /* (a malformed record: what could be read) */
    return r.oom ? -ENOMEM : 0;
}

void bosc_batches_written(struct sweep_ctx *c, size_t lo, size_t hi)
{
    for (size_t i = lo; i < hi; i++)
        c->dec[i].ok = 1;
}

int bosc_batches_commit(struct bosc *b, struct sweep_ctx *c, char *err, size_t errlen)
{
    if (!bstore_pending(b->bs))
        return 0;
    uint64_t t0 = now_ns();
    int rc = bstore_commit(b->bs);
    add(&b->st.io_ns, now_ns() - t0);
    if (rc) {
        snprintf(err, errlen, "cannot write the batch store of %s: %s", b->path, strerror(-rc));
        c->write_failed = 1;
    }
    return rc;
}

void bosc_batches_settled(struct bosc *b, struct sweep_ctx *c)
{
    for (size_t k = 0; k < c->ndec; k++)
        if (c->dec[k].ok)
            bstore_count(b->bs, &c->dec[k].ref, 0);
    c->ndec = 0;
    bstore_collect(b->bs);
}

void bosc_batches_recorded(struct bosc *b)
{
    if (b->bs_retired && b->sb_gen == b->bs_gen) { /* FLUSHALL's generation is recorded */
        bstore_drop_retired(b->bs);
        b->bs_retired = 0;
    }
}
