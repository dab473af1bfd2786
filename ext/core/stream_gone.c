/* stream_gone.c - a stream's sealed batches out of memory (stream.h: "batches
 * out of memory"): a reader's miss and the runs of batches it wanted, the
 * evictor's pass over a stream, the loader's batches put back. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/stream.h"
#include "core/stream_int.h"

__thread unsigned xs_missed;

/* A reader of s needs gone batch b: the loader is to bring it back (see
 * stream.h). (Under the key's shard lock, as every change: a reader's marks are
 * the stream's bookkeeping, not its value.) */
int xs_missing(const struct xstream *s, const struct xs_batch *b)
{
    if (!b->gone)
        return 0;
    xs_missed++;
    if (b->wanted)
        return 1;
    struct xstream *w = (struct xstream *)s;
    ((struct xs_batch *)b)->wanted = 1;
    unsigned k = 0;
    while (k < w->nwant && !(b->no + 1 >= w->want[k].lo && b->no <= w->want[k].hi + 1))
        k++;
    if (k < w->nwant) { /* next to a run: it grows */
        w->want[k].lo = b->no < w->want[k].lo ? b->no : w->want[k].lo;
        w->want[k].hi = b->no > w->want[k].hi ? b->no : w->want[k].hi;
    } else if (w->nwant < XS_WANT_RUNS) {
        w->want[w->nwant].lo = w->want[w->nwant].hi = b->no;
        w->nwant++;
    } else {
        w->want_all = 1;
    }
    return 1;
}

int xs_need(struct xstream *s, const struct xs_batch *b) { return xs_missing(s, b); }

size_t xs_want_gone(struct xstream *s, size_t max)
{
    for (size_t i = 0; i < s->n && s->ngone && s->ngone <= max; i++)
        (void)xs_missing(s, bat(s, i));
    xs_missed = 0; /* (not a read) */
    return s->ngone;
}

/* The index of the first batch with live entries (s->n if none). */
static size_t first_live(const struct xstream *s)
{
    size_t i = 0;
    while (i < s->n && bat(s, i)->count == bat(s, i)->deleted)
        i++;
    return i;
}

/* Replace batch i with nb (a realloc's result) in the array. */
static void put_back(struct xstream *s, size_t i, struct xs_batch *nb, size_t was)
{
    s->b[s->head + i] = nb;
    s->mem = s->mem - was + xs_usable(nb);
}

size_t xs_evict(struct xstream *s, size_t max, size_t keep_tail, int (*durable)(void *arg, const struct xs_ref *ref),
                void *arg, size_t *count)
{
    size_t freed = 0, done = 0, lo = first_live(s) + 1, end = s->n > keep_tail ? s->n - keep_tail : 0;
    if (lo >= end)
        return 0;
    /* a clock over the stream's batches, going on where the last pass stopped;
     * a pass looks at 4 x max batches at most (gone ones are passed cheaply) */
    size_t i = xs_batch_index(s, s->evict_no);
    if (i < lo || i >= end)
        i = lo;
    for (size_t seen = 0; seen < end - lo && seen < 4 * max && done < max; seen++, i = i + 1 < end ? i + 1 : lo) {
        struct xs_batch *b = bat(s, i);
        if (b->gone || !b->sealed || !b->file.seg || b->file.len != b->len)
            continue;
        if (b->used) {
            b->used = 0;
            continue;
        }
        if (!durable(arg, &b->file))
            continue;
        size_t was = xs_usable(b);
        struct xs_batch *nb = realloc(b, sizeof *nb); /* shrinking: the header stays */
        if (!nb)
            continue;
        nb->gone = 1;
        nb->wanted = 0;
        nb->cap = 0;
        put_back(s, i, nb, was);
        freed += was - xs_usable(nb);
        done++;
    }
    s->evict_no = i < s->n ? bat(s, i)->no : 0;
    s->ngone += done;
    *count += done;
    return freed;
}

/* Take the wanted gone batches among indexes [i, end) into no/refs (up to max): n so far. */
static size_t take_wanted(struct xstream *s, size_t i, size_t end, uint64_t *no, struct xs_ref *refs, size_t n,
                          size_t max)
{
    for (; i < end && n < max; i++) {
        struct xs_batch *b = bat(s, i);
        if (b->gone && b->wanted) {
            b->wanted = 0;
            no[n] = b->no;
            refs[n++] = b->file;
        }
    }
    return n;
}

size_t xs_wanted(struct xstream *s, uint64_t *no, struct xs_ref *refs, size_t max)
{
    size_t n = 0;
    if (s->want_all) { /* more runs than were kept: every mark is looked at */
        n = take_wanted(s, 0, s->n, no, refs, 0, max);
        if (n < max)
            s->want_all = s->nwant = 0;
        return n;
    }
    while (s->nwant && n < max) {
        unsigned k = s->nwant - 1;
        size_t i = xs_batch_index(s, s->want[k].lo), end = xs_batch_index(s, s->want[k].hi + 1);
        n = take_wanted(s, i, end, no, refs, n, max);
        if (n < max || (n && no[n - 1] >= s->want[k].hi))
            s->nwant--; /* the run is done */
        else
            s->want[k].lo = no[n - 1] + 1;
    }
    return n;
}

int xs_restore(struct xstream *s, uint64_t no, const struct xs_ref *ref, const void *bytes)
{
    size_t lo = xs_batch_index(s, no);
    if (lo == s->n || bat(s, lo)->no != no)
        return 0;
    struct xs_batch *b = bat(s, lo);
    if (!b->gone || b->file.seg != ref->seg || b->file.off != ref->off || b->file.len != ref->len ||
        b->file.crc != ref->crc)
        return 0;
    size_t was = xs_usable(b);
    struct xs_batch *nb = realloc(b, sizeof *nb + b->len);
    if (!nb)
        return -ENOMEM;
    put_back(s, lo, nb, was);
    memcpy(nb->data, bytes, nb->len);
    uint32_t count = nb->count, deleted = nb->deleted;
    struct xs_id last = nb->last, prev = XS_ID_MIN;
    int rc = xs_check_entries(nb, &prev, 0); /* the bytes must be what the header says */
    if (!rc && (nb->count != count || nb->deleted != deleted || xs_cmp(nb->last, last)))
        rc = -EBADMSG;
    if (rc) { /* it stays gone, as its header says */
        nb->count = count;
        nb->deleted = deleted;
        nb->last = last;
        return rc;
    }
    nb->cap = nb->len;
    nb->gone = 0;
    nb->wanted = 0;
    nb->used = 1;
    s->ngone--;
    return 1;
}
