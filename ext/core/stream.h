/* stream.h - a stream value (Redis 7 streams, paper 004's message queue): entries
 * appended into batches, consumer groups with their pending entries.
 *
 * Entries: an ID (ms-seq, strictly increasing) and one or more field-value
 * pairs, appended into the stream's open batch. A batch is a compact run of
 * consecutive entries in one allocation; it is sealed (never appended to again)
 * when it holds XS_BATCH_BYTES of entries or XS_BATCH_ENTRIES of them, or when
 * it is older than the seal age the caller passes: then a sealed batch is at
 * most one datagram of entries (paper 004's batch transfer) unless one entry is
 * larger than that alone. A stream is its batches in ID order, numbered from 0 as
 * they are created (a batch keeps its number until it is trimmed away), found by
 * binary search on their first IDs for XRANGE. XDEL marks an entry deleted in
 * its batch (its bytes go when the batch does) and bumps the batch's version,
 * so a copy of the batch made before (a pull cache slot) is known stale.
 * Trimming removes whole batches from the front; an exact trim also marks the
 * first entries of the batch it stops in deleted.
 *
 * Batch entry encoding (bytes in b->data, one after another):
 *     u8 flags                        XS_F_DELETED
 *     varint ms - b->first.ms          (IDs only grow, so never negative)
 *     varint seq
 *     varint nfields                   >= 1
 *     nfields times: varint flen, field bytes, varint vlen, value bytes
 * A varint is unsigned LEB128 (core/varint.h). The same bytes are what a pull
 * of the batch carries and what xs_encode writes, so a snapshot is a copy of
 * the batches.
 *
 * Consumer groups (xs_group): the last delivered ID, the count of entries read
 * (for XINFO's lag), the pending entries list (PEL: delivered and not yet
 * acknowledged, ordered by ID, with owner, delivery time and count) and the
 * consumers. See stream_group.c.
 *
 * Memory: every allocation is counted in s->mem (malloc_usable_size), which the
 * table charges against its bound. Threads: none; a stream belongs to its key and
 * is used under the key's shard lock.
 */
#ifndef KV_STREAM_H
#define KV_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "core/list.h"

#define XS_WANT_RUNS 4
#define XS_READ_AHEAD 16 /* gone batches an iteration that missed one wants besides, at most */
#define XS_BATCH_BYTES 1400 /* a sealed batch fits a 1500-byte datagram with its headers */
#define XS_BATCH_ENTRIES 128
#define XS_F_DELETED 1u
#define XS_MAX_FIELDS (1u << 20) /* field-value pairs of one entry */

struct xs_id {
    uint64_t ms, seq;
};

static inline int xs_cmp(struct xs_id a, struct xs_id b)
{
    if (a.ms != b.ms)
        return a.ms < b.ms ? -1 : 1;
    return a.seq < b.seq ? -1 : a.seq > b.seq;
}

static inline int xs_is_zero(struct xs_id a) { return !a.ms && !a.seq; }

#define XS_ID_MIN ((struct xs_id){0, 0})
#define XS_ID_MAX ((struct xs_id){UINT64_MAX, UINT64_MAX})

/* The ID right after / before a (saturating: *ok = 0 at the end of the range). */
struct xs_id xs_id_next(struct xs_id a, int *ok);
struct xs_id xs_id_prev(struct xs_id a, int *ok);

/* "ms-seq" into buf (at least XS_ID_STR bytes); returns the length. */
#define XS_ID_STR 42
int xs_id_format(struct xs_id id, char *buf);
/* Parse an ID argument as Redis 7.0 does (streamGenericParseIDOrReply): "ms" or
 * "ms-seq", each part 64 bits at most (string2ull: leading blanks, a '+' and
 * leading zeros pass), at most XS_ID_ARG_MAX bytes; "-" and "+" are 0-0 and the
 * largest ID unless strict. missing_seq: the seq of a bare "ms". seq_star (XADD
 * only, else NULL): "ms-*" is accepted and sets *seq_star = 1. 0 or -EINVAL. */
#define XS_ID_ARG_MAX 127
int xs_id_parse(const char *p, size_t n, int strict, uint64_t missing_seq, struct xs_id *out, int *seq_star);

/* Where a sealed batch's bytes are in the data file's batch store
 * (durability/bstore.h): segment (0: not there), length, offset, CRC-32C. */
struct xs_ref {
    uint32_t seg, len;
    uint64_t off;
    uint32_t crc;
};

struct xs_batch {
    struct xs_id first, last;   /* IDs of its first and last entry (deleted ones included) */
    struct xs_ref file;         /* its bytes in the batch store (the data file's business:
                                   cleared when the bytes change) */
    uint64_t no;                /* its number in the stream */
    uint32_t len, cap;          /* entry bytes used, allocated */
    uint32_t count, deleted;    /* entries, of which deleted */
    uint32_t version;           /* bumped by every change after the batch was sealed */
    uint8_t sealed;
    uint8_t gone;               /* its bytes left memory (sealed, with a durable file copy):
                                   len and the counts stay, data[] is not there */
    uint8_t used;               /* read since the evictor last passed (its second chance) */
    uint8_t wanted;             /* a reader needed it while gone: the loader brings it back */
    int64_t born_ms;            /* when its first entry was added */
    unsigned char data[];
};

struct xs_group;
struct xstream {
    struct xs_batch **b;        /* batches b[head .. head + n) in ID order */
    size_t head, n, cap;
    uint64_t next_no;           /* the number the next batch gets */
    uint64_t length;            /* live entries */
    uint64_t entries_added;     /* every entry ever added (XINFO, lag) */
    struct xs_id last_id;       /* the largest ID ever added or set (XSETID) */
    struct xs_id max_deleted;   /* the largest ID ever deleted by XDEL (lag) */
    struct list groups;         /* struct xs_group, in creation order */
    size_t ngroups;
    size_t mem;                 /* bytes allocated for this stream, the struct included */
    /* the table's (core/table_stream.c): */
    size_t charged;             /* the bytes of mem its memory count holds */
    uint64_t lsn;               /* the log record of its last change (kept in its bytes, so that
                                   replay after a data-file load skips what the load holds) */
    /* batches out of memory (below): how many; the runs of batch numbers readers
     * wanted back (a read wants consecutive batches: a few runs say it all;
     * want_all when they could not: the loader then looks for the marks); where
     * the evictor goes on */
    size_t ngone;
    struct { uint64_t lo, hi; } want[XS_WANT_RUNS];
    unsigned nwant, want_all;
    uint64_t evict_no;
};

/* One field-value pair, pointing into the caller's or the batch's memory. */
struct xs_field {
    const char *f, *v;
    size_t flen, vlen;
};

/* An entry read from a batch (valid until the stream changes). */
struct xs_entry {
    struct xs_id id;
    int deleted;
    uint32_t nfields;
    const unsigned char *fields, *end; /* the encoded pairs: xs_field_next */
    const struct xs_batch *batch;
    size_t off;                 /* the entry's offset in its batch */
};

/* Next pair of e, advancing *p (start: *p = e->fields). 1, or 0 at the end. */
int xs_field_next(const struct xs_entry *e, const unsigned char **p, struct xs_field *out);

struct xstream *xs_new(void);
void xs_free(struct xstream *s);

/* The ID XADD gives: explicit (seq_star 0) must be above last_id and above 0-0;
 * "ms-*" (seq_star 1) takes the next seq of ms; "*" (auto 1) the current time,
 * or last_id's ms when the clock is behind. Returns 0, or XS_E_* below. */
enum {
    XS_E_ZERO = -1001,       /* explicit 0-0 */
    XS_E_SMALL = -1002,      /* not above the top item */
    XS_E_EXHAUSTED = -1003,  /* "*" and last_id is the largest ID */
};
int xs_next_id(const struct xstream *s, int autoid, int seq_star, struct xs_id given, uint64_t now_ms,
               struct xs_id *out);
/* Append an entry with id (> last_id: the caller got it from xs_next_id) and
 * nf >= 1 pairs. The open batch is sealed first if it is full or born before
 * now_ms - seal_ms (seal_ms 0: no age bound). Returns 0, -ENOMEM or -E2BIG (an
 * entry over 512 MiB). */
int xs_add(struct xstream *s, struct xs_id id, const struct xs_field *f, size_t nf, int64_t now_ms,
           int64_t seal_ms);
/* Seal the open batch if it is born at or before older_than_ms. 1 sealed, 0 not. */
int xs_seal_aged(struct xstream *s, int64_t older_than_ms);

/* Mark the live entry id deleted: 1 done, 0 no such live entry. */
int xs_del(struct xstream *s, struct xs_id id);

/* Trimming (XTRIM and XADD's MAXLEN/MINID) is planned, then cut, so that the
 * cut (which does not depend on how the entries fall into batches) is what a
 * log record carries. xs_trim_plan: by_minid 0: keep at most maxlen live
 * entries; 1: remove the entries below minid. approx: only whole batches, and
 * (limit > 0) no more than limit entries; an exact trim takes no limit.
 * Returns the live entries the cut removes and fills cut. xs_cut removes every
 * live entry below cut->below (all of them if cut->all): whole batches, and
 * marks in the batch it stops in. */
struct xs_cut {
    int all;
    struct xs_id below;
};
uint64_t xs_trim_plan(const struct xstream *s, int by_minid, uint64_t maxlen, struct xs_id minid, int approx,
                      uint64_t limit, struct xs_cut *cut);
void xs_cut(struct xstream *s, const struct xs_cut *cut);
/* Plan and cut at once. Returns the live entries removed. */
uint64_t xs_trim_maxlen(struct xstream *s, uint64_t threshold, int approx, uint64_t limit);
uint64_t xs_trim_minid(struct xstream *s, struct xs_id minid, int approx, uint64_t limit);

/* Iteration over [lo, hi], forward or backward (rev), live entries only unless
 * with_deleted. */
struct xs_iter {
    const struct xstream *s;
    struct xs_id lo, hi;
    int rev, with_deleted;
    size_t bi;                  /* batch index (relative to head) */
    size_t off;                 /* next entry's offset (forward) */
    /* backward: the batch's entry offsets, collected when the batch is entered */
    size_t *offs, noffs, capoffs, oi;
    int started, done;
    uint64_t want;              /* entries the caller takes at most (0: no bound): set after
                                   xs_iter_init, it bounds the read-ahead of a gone batch */
    uint64_t given;             /* entries returned so far */
};
void xs_iter_init(struct xs_iter *it, const struct xstream *s, struct xs_id lo, struct xs_id hi, int rev,
                  int with_deleted);
/* 1 with *e set, 0 at the end, -ENOMEM (backward only). */
int xs_iter_next(struct xs_iter *it, struct xs_entry *e);
void xs_iter_done(struct xs_iter *it);

/* The first / last live entry: 1 found, 0 empty. */
int xs_first(const struct xstream *s, struct xs_entry *e);
int xs_last(const struct xstream *s, struct xs_entry *e);
/* The live entry id: 1 found, 0 not. */
int xs_lookup(const struct xstream *s, struct xs_id id, struct xs_entry *e);

/* The batch with number no, or NULL (trimmed, not yet made). */
const struct xs_batch *xs_batch_by_no(const struct xstream *s, uint64_t no);

/* ---- batches out of memory (the data file's batch store, table_spill.c;
 * stream_gone.c)
 *
 * A sealed batch whose bytes are durable in the batch store may leave memory
 * (xs_evict, which adds the batches it freed to *count): its header stays (IDs,
 * counts, file reference), its bytes go. A reader that needs a gone batch (an
 * iterator, a lookup, a trim's plan, an inline encode) marks it wanted, counts
 * it in xs_missed and goes on as if it were empty (an iteration ends there,
 * wanting the gone batches on its way too: up to XS_READ_AHEAD, or as many as
 * hold the entries the caller still takes, when it said (xs_iter.want)): the caller
 * (kvt_xapply, kvt_apply) throws the result away and has the loader bring the
 * wanted batches back (xs_wanted, xs_restore), then runs the command again.
 * Changes are only applied after a read of the same batches found them in
 * memory under the same lock, so xs_apply never meets a gone batch in a
 * command; log replay runs before any batch can leave. */
extern __thread unsigned xs_missed;
/* Free the bytes of up to max sealed batches whose file copy is durable
 * (durable(arg, ref)) and that were not read since the last pass (those lose
 * their used mark instead), oldest first; never the first batch holding live
 * entries (xs_first needs it) nor the keep_tail last ones. Returns bytes freed
 * (s->mem is lower by as much). */
size_t xs_evict(struct xstream *s, size_t max, size_t keep_tail, int (*durable)(void *arg, const struct xs_ref *ref),
                void *arg, size_t *count);
/* The gone batches readers wanted, up to max: their numbers and references
 * (their marks taken off). Returns how many. */
size_t xs_wanted(struct xstream *s, uint64_t *no, struct xs_ref *refs, size_t max);
/* Put bytes back into gone batch no if it still is the one ref names: 1 done,
 * 0 not (trimmed, changed, back already), -ENOMEM. The bytes are checked
 * (entries whole and as its header says: -EBADMSG otherwise). */
int xs_restore(struct xstream *s, uint64_t no, const struct xs_ref *ref, const void *bytes);
/* Mark every gone batch wanted, unless more than max are gone: returns how
 * many are gone (MULTI/EXEC has them all back before it runs). */
size_t xs_want_gone(struct xstream *s, size_t max);
/* 1 if b's bytes are out of memory: marked wanted and counted in xs_missed
 * (a reader's check before it uses b->data itself). */
int xs_need(struct xstream *s, const struct xs_batch *b);

/* ---- batch transfer (paper 004): pulls and the pull cache */

/* A pull's answer for one batch (its framing is the UDP front end's, frontend/udpfront.h),
 * all big-endian: u8 status (XS_PULL_SEALED, or XS_PULL_OPEN for the batch still being
 * filled), u8 0, u16 entries (deleted ones included), u32 version, u64 batch number,
 * u64 the first entry's ms, then the batch's entry bytes as encoded above. A sealed
 * batch's answer changes only with its version, so it may be cached (the pull cache's
 * slots hold exactly these bytes). A batch whose bytes do not fit room (one entry
 * larger than a datagram) gets the header alone with status XS_PULL_TOO_LARGE.
 * Returns the answer's length; room must be XS_PULL_HDR at least. */
enum { XS_PULL_SEALED = 0, XS_PULL_OPEN = 1, XS_PULL_NO_BATCH = 2, XS_PULL_NO_STREAM = 3, XS_PULL_TOO_LARGE = 4 };
#define XS_PULL_HDR 24
size_t xs_pull_encode(const struct xs_batch *b, unsigned char *out, size_t room);

/* Batch events, for a cache of sealed batches: while xs_watch is set (by the
 * caller, around a change it makes on this thread), the stream calls
 * xs_watch->fn with XS_EV_SEALED once a batch is sealed, XS_EV_CHANGED when a
 * sealed batch's version moves (an entry deleted in it) and XS_EV_GONE just
 * before a batch is freed by a trim or an XDEL (b->no still valid). */
enum { XS_EV_SEALED, XS_EV_CHANGED, XS_EV_GONE };
struct xs_watch {
    void (*fn)(void *arg, const struct xs_batch *b, int ev);
    void *arg;
};
extern __thread const struct xs_watch *xs_watch;

/* ---- consumer groups (stream_group.c) */

struct xs_consumer {
    struct list node;           /* in its group's consumers, in creation order */
    char *name;
    size_t nlen;
    int64_t seen_ms;            /* its last read or claim (XINFO's idle) */
    uint64_t pending;           /* its entries in the group's PEL */
};

/* A pending entry: delivered to owner, not yet acknowledged. */
struct xs_nack {
    struct xs_id id;
    struct xs_consumer *owner;
    int64_t delivery_ms;        /* last delivery */
    uint64_t delivery_count;
    struct xs_nack *l, *r;      /* the PEL's AVL tree, by id */
    int h;
};

#define XS_ENTRIES_READ_UNKNOWN (-1)

struct xs_group {
    struct list node;           /* in the stream's groups, in creation order */
    char *name;
    size_t nlen;
    struct xs_id last_id;       /* the last entry delivered */
    int64_t entries_read;       /* entries the group has read, or XS_ENTRIES_READ_UNKNOWN */
    struct xs_nack *pel;
    uint64_t npel;
    struct list consumers;
    size_t nconsumers;
};

struct xs_group *xs_group_find(const struct xstream *s, const char *name, size_t nlen);
/* A new group (the caller checked that name is free). NULL: out of memory. */
struct xs_group *xs_group_create(struct xstream *s, const char *name, size_t nlen, struct xs_id last_id,
                                 int64_t entries_read);
void xs_group_destroy(struct xstream *s, struct xs_group *g);
struct xs_consumer *xs_consumer_find(const struct xs_group *g, const char *name, size_t nlen);
/* A new consumer (the caller checked that name is free). NULL: out of memory. */
struct xs_consumer *xs_consumer_create(struct xstream *s, struct xs_group *g, const char *name, size_t nlen,
                                       int64_t now_ms);
/* Delete c and its pending entries; returns how many it had. */
uint64_t xs_consumer_delete(struct xstream *s, struct xs_group *g, struct xs_consumer *c);

struct xs_nack *xs_pel_find(const struct xs_group *g, struct xs_id id);
/* The first pending entry with id >= from (> from if exclusive), or NULL. */
struct xs_nack *xs_pel_ceil(const struct xs_group *g, struct xs_id from, int exclusive);
/* The last pending entry, or NULL. */
struct xs_nack *xs_pel_last(const struct xs_group *g);
/* Deliver id to owner: a new pending entry (count 1) or, if pending already, it
 * changes owner and gets count + 1. Returns the entry, NULL out of memory. */
struct xs_nack *xs_pel_deliver(struct xstream *s, struct xs_group *g, struct xs_id id, struct xs_consumer *owner,
                               int64_t now_ms);
/* Give a pending entry to another consumer. */
void xs_pel_chown(struct xs_nack *n, struct xs_consumer *owner);
/* Remove id from the PEL: 1 removed, 0 not pending. */
int xs_pel_remove(struct xstream *s, struct xs_group *g, struct xs_id id);

/* Delivering id to the group moves its last delivered ID and keeps its read
 * counter (Redis 7's rules: counted on while nothing ahead was deleted, else
 * estimated). */
void xs_group_advance(const struct xstream *s, struct xs_group *g, struct xs_id id);
/* The group's lag (entries added and not yet read): 1 with *lag, 0 unknown. */
int xs_group_lag(const struct xstream *s, const struct xs_group *g, int64_t *lag);
/* The read counter of id: the number of entries added up to it, or
 * XS_ENTRIES_READ_UNKNOWN where deletions make it unknowable. */
int64_t xs_entries_read_at(const struct xstream *s, struct xs_id id);
/* The first live ID (0-0 when empty), as Redis's first_id. */
struct xs_id xs_first_id(const struct xstream *s);

/* ---- a whole stream as bytes (stream_snap.c): what the data file holds, what
 * COPY and RESTORE-like paths copy, what a log record carries for a state set
 * whole. Format (varints unless said):
 *     u8 XS_SNAP_VERSION
 *     lsn, next_no, entries_added, last_id (ms, seq), max_deleted (ms, seq)
 *     nbatches, then each: no, first (ms, seq), u8 flags, then
 *         flags 0 (open) or 1 (sealed): len, len bytes of entries;
 *         flags 3 (sealed, in the batch store: the data file's form): len, seg, off, crc,
 *             count, deleted, last (ms, seq) -- a batch made from this is gone until read
 *     ngroups, then each: name (len, bytes), last_id (ms, seq), entries_read + 1,
 *         nconsumers, each: name (len, bytes), seen_ms;
 *         npel, each: id (ms, seq), owner (consumer index), delivery_ms, delivery_count
 * xs_decode reads untrusted bytes (a damaged file or log): every length and
 * count is bounded by the bytes left, entries are parsed whole, IDs must
 * ascend, batch numbers ascend, names are unique, owners exist, and only the
 * last batch may be open; anything else is -EBADMSG and nothing is allocated. */
#define XS_SNAP_VERSION 1
struct kvbuf;
/* Append s's bytes to out. 0 or -ENOMEM. */
int xs_encode(const struct xstream *s, struct kvbuf *out);
/* A new stream from bytes: 0 with *out, -EBADMSG, -ENOMEM. */
int xs_decode(const void *p, size_t n, struct xstream **out);
/* The data file's form: every sealed batch as its reference into the batch
 * store. stage(arg, b) gives b->file a reference a record may hold (the batch
 * staged if it has none that is good): 0, or -errno (nothing appended then). */
typedef int (*xs_stage_fn)(void *arg, struct xs_batch *b);
int xs_encode_refs(struct xstream *s, struct kvbuf *out, xs_stage_fn stage, void *arg);
/* Decode either form: fetch(arg, ref, buf) reads a referenced batch's bytes
 * (ref->len of them): 0, or -errno (the decode fails with it). fetch NULL: a
 * reference is -EBADMSG (bytes that must be whole: a log record, COPY); fetch
 * XS_FETCH_LATER: a referenced batch is made gone (read on demand). */
#define XS_FETCH_LATER ((xs_fetch_fn)1)
typedef int (*xs_fetch_fn)(void *arg, const struct xs_ref *ref, void *buf);
int xs_decode_from(const void *p, size_t n, xs_fetch_fn fetch, void *arg, struct xstream **out);
/* Each reference the bytes of a stream hold (its batches, up to the first
 * malformed one): fn(arg, ref). Returns how many, or -EBADMSG. */
int64_t xs_refs(const void *p, size_t n, void (*fn)(void *arg, const struct xs_ref *ref), void *arg);

/* ---- changes as bytes (stream_delta.c). A command changes a stream by
 * building a delta (what it decided, with IDs, times and trim cuts resolved)
 * and applying it; the table logs the same bytes, so recovery and a log peer
 * replay exactly what ran, whatever the clock or the batch layout says then.
 * A delta is a sequence of ops, each a byte XOP_* then varints:
 *     CREATE                                  a new empty stream (the key was absent)
 *     ADD      id, nf, nf x (flen, f, vlen, v)
 *     DEL      n, n x id                      ids that are live entries
 *     CUT      all (0/1), below id            xs_cut
 *     SETID    last id, entries_added, max_deleted id
 *     GCREATE  group, last id, entries_read + 1
 *     GSETID   group, last id, entries_read + 1
 *     GDESTROY group
 *     CCREATE  group, consumer, seen_ms
 *     CDELETE  group, consumer
 *     DELIVER  group, consumer, now_ms, flags, n, n x id   (XREADGROUP: new entries with
 *              XD_NEW move the group's last ID and read counter; XD_NOACK: no PEL entry)
 *     ACK      group, n, n x id
 *     CLAIM    group, consumer, seen_ms, n, n x (id, delivery_ms, delivery_count, force)
 * (group and consumer: a name, length then bytes). xs_apply first checks the
 * whole delta's form (untrusted when replayed), then applies it op by op; an op
 * the stream's state does not allow (an ADD not above last_id, a group that is
 * not there) stops it with -EINVAL: ops before it stay applied. */
enum { XOP_CREATE = 1, XOP_ADD, XOP_DEL, XOP_CUT, XOP_SETID, XOP_GCREATE, XOP_GSETID, XOP_GDESTROY, XOP_CCREATE,
       XOP_CDELETE, XOP_DELIVER, XOP_ACK, XOP_CLAIM, XOP_LAST = XOP_CLAIM };
#define XD_NEW 1u
#define XD_NOACK 2u
struct xd_claim {
    struct xs_id id;
    int64_t delivery_ms;
    uint64_t delivery_count;
    int force;                  /* create the pending entry if it is not there */
};
/* Builders: append one op to d. 0 or -ENOMEM. */
int xd_create(struct kvbuf *d);
int xd_add(struct kvbuf *d, struct xs_id id, const struct xs_field *f, size_t nf);
int xd_del(struct kvbuf *d, const struct xs_id *ids, size_t n);
int xd_cut(struct kvbuf *d, const struct xs_cut *cut);
int xd_setid(struct kvbuf *d, struct xs_id last, uint64_t entries_added, struct xs_id max_deleted);
/* op XOP_GCREATE or XOP_GSETID */
int xd_group(struct kvbuf *d, int op, const char *g, size_t gl, struct xs_id last, int64_t entries_read);
int xd_gdestroy(struct kvbuf *d, const char *g, size_t gl);
/* op XOP_CCREATE or XOP_CDELETE (seen_ms unused) */
int xd_consumer(struct kvbuf *d, int op, const char *g, size_t gl, const char *c, size_t cl, int64_t seen_ms);
int xd_deliver(struct kvbuf *d, const char *g, size_t gl, const char *c, size_t cl, int64_t now_ms, unsigned flags,
               const struct xs_id *ids, size_t n);
int xd_ack(struct kvbuf *d, const char *g, size_t gl, const struct xs_id *ids, size_t n);
int xd_claim(struct kvbuf *d, const char *g, size_t gl, const char *c, size_t cl, int64_t seen_ms,
             const struct xd_claim *items, size_t n);
/* Apply delta [p, p+n) to *s (NULL: absent; CREATE makes it); now_ms and
 * seal_ms as xs_add's (they only decide where batches end). Returns 0,
 * -EBADMSG (malformed: nothing applied), -EINVAL (see above), -ENOMEM. */
int xs_apply(struct xstream **s, const void *p, size_t n, int64_t now_ms, int64_t seal_ms);
/* The form check alone: 0 or -EBADMSG. */
int xs_delta_check(const void *p, size_t n);

/* Decode the entry at b->data + off (bytes of a batch of this stream, or of one
 * xs_decode accepted). Returns the offset after it. */
size_t xs_entry_at(const struct xs_batch *b, size_t off, struct xs_entry *e);

#endif
