/* bosc_keys_test.c - the data file's typed records, expiry of records in blocks no
 * write touches, and its key listing (bosc_keys_*), on a real table and data file,
 * under ThreadSanitizer or AddressSanitizer+UBSan (built and run by
 * test_c_sanitizers.py). No log is attached: whatever a sweep wrote is clean and
 * can be evicted at once. The table's clock is moved (kvt_set_clock_offset) to
 * make records expire.
 *
 * usage: bosc_keys_test DIR
 *   1. types: strings and hashes survive a sweep, eviction, a load and a restart
 *      with their type and value; a file with no expire time is never read by the
 *      expiry pass;
 *   2. listing: every key in the file exactly once across all buckets (in chunks,
 *      through an eventfd and through bosc_keys_wait), with its type, while a
 *      writer churns other keys of the same buckets;
 *   3. expiry: records whose time passed, in blocks nothing writes, become
 *      deletions within a bounded time; the key count exact before and after,
 *      the listing leaves them out, and a restart agrees;
 *   4. tickets: requests never taken fill the slots (-EBUSY), are dropped after
 *      KEYS_KEEP_MS when a slot is wanted (-ESTALE to their taker), cancel frees
 *      at once, nothing leaks (ASan);
 *   5. damage: a corrupt block makes the listing fail with -EILSEQ naming it;
 *   6. streams: sealed batches go to the batch store once (a write-back after a
 *      few more entries writes those only), whole through eviction, loads (while
 *      another thread loads them too) and a restart; a trim frees segments.
 * Prints "FAIL: ..." and exits 1 on the first mismatch; ends with "ok". */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/kvbuf.h"
#include "core/stream.h"
#include "core/table.h"
#include "durability/bosc.h"
#include "stress.h"

#define BUCKETS 64                /* few buckets: chains with overflow blocks */
#define MAX_MEMORY (512 * 1024)
#define INTERVAL_MS 20
#define NSTR 1500
#define NHASH 500
#define NEXP 800
#define VLEN 100

static char path[4200];
/* The table's bound: MAX_MEMORY, or (6.) room for every stream, so that the
 * flusher never evicts while the test's own sync_evict does (kvt_evict has one
 * caller in a server: the flusher). */
static uint64_t max_memory = MAX_MEMORY;

struct db {
    struct kv_table *t;
    struct bosc *b;
};

static struct bosc_open_info db_open(struct db *d)
{
    char err[512] = "";
    struct bosc_open_info info;
    struct bosc_config cfg = {.path = path, .buckets = BUCKETS, .flush_interval_ms = INTERVAL_MS};
    CHECK(kvt_create(&d->t, max_memory) == 0);
    int rc = bosc_open(&d->b, d->t, &cfg, &info, err, sizeof err);
    CHECK(rc == 0, "bosc_open: %d %s", rc, err);
    CHECK(bosc_start(d->b) == 0);
    return info;
}

static void db_close(struct db *d)
{
    bosc_close(d->b);
    kvt_destroy(d->t);
}

static struct bosc_stats stats(struct db *d)
{
    struct bosc_stats st;
    bosc_get_stats(d->b, &st);
    return st;
}

/* Everything swept, then every clean entry evicted: the keys live in the file only. */
static void sync_evict(struct db *d)
{
    CHECK(bosc_sync(d->b) == 0, "%s", stats(d).error);
    uint64_t n = 0;
    kvt_evict(d->t, 0, &n);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- keys and values of the model */

static size_t key_of(char *buf, const char *kind, int i) { return (size_t)sprintf(buf, "%s:%05d", kind, i); }

static size_t val_of(char *buf, const char *kind, int i)
{
    int n = sprintf(buf, "%s-value-%d-", kind, i);
    memset(buf + n, 'a' + i % 26, VLEN - (size_t)n);
    return VLEN;
}

static void put(struct db *d, const char *kind, int i, int type, int64_t expire)
{
    char k[32], v[VLEN];
    size_t kl = key_of(k, kind, i), vl = val_of(v, kind, i);
    for (int tries = 0;; tries++) {
        int rc = kvt_set(d->t, k, kl, v, vl, type == KVT_HASH ? KVT_TYPE_HASH : 0, expire, NULL, NULL);
        if (rc == 1)
            return;
        CHECK(rc == -ENOMEM && tries < 1000, "SET %s: %d", k, rc);
        CHECK(kvt_wait_memory(d->t) == 0);
    }
}

struct state_arg {
    struct kvt_state st;
    char val[VLEN + 1];
};

static int64_t read_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    struct state_arg *a = arg;
    a->st = *cur;
    if (cur->exists && cur->vlen <= VLEN)
        memcpy(a->val, cur->val, cur->vlen);
    return 0;
}

/* The key's type and value must be as put() wrote them (present = 1), or it is absent. */
static void check_key(struct db *d, const char *kind, int i, int type, int present, const char *when)
{
    char k[32], v[VLEN];
    size_t kl = key_of(k, kind, i), vl = val_of(v, kind, i);
    struct state_arg a;
    int64_t rc;
    for (int tries = 0; (rc = kvt_apply(d->t, k, kl, read_fn, &a)) == -ENODATA; tries++) {
        CHECK(tries < 1000, "%s: %s never loads", when, k);
        CHECK(kvt_load_sync(d->t, k, kl) == 0, "%s: load %s: %s", when, k, stats(d).error);
    }
    CHECK(rc == 0, "%s: read %s: %" PRId64, when, k, rc);
    CHECK(a.st.exists == present, "%s: %s exists %d, expected %d", when, k, a.st.exists, present);
    if (present) {
        CHECK(a.st.type == type, "%s: %s has type %d, expected %d", when, k, a.st.type, type);
        CHECK(a.st.vlen == vl && memcmp(a.val, v, vl) == 0, "%s: %s has another value", when, k);
    }
}

/* ---- listing */

/* The file's whole listing, chunk buckets a request; by eventfd (evfd >= 0) or by
 * bosc_keys_wait. Returns the records (u32 klen | u8 type | key ...). */
static struct kvbuf list_all(struct db *d, uint32_t chunk, int evfd)
{
    struct kvbuf out = {0};
    uint32_t nb = bosc_buckets(d->b);
    CHECK(nb == BUCKETS);
    for (uint32_t first = 0; first < nb; first += chunk) {
        int64_t t = bosc_keys_request(d->b, first, chunk, evfd);
        CHECK(t > 0, "bosc_keys_request(%u, %u): %" PRId64, first, chunk, t);
        int rc;
        while ((rc = bosc_keys_take(d->b, t, &out)) == 0) {
            if (evfd < 0) {
                bosc_keys_wait(d->b, t);
                continue;
            }
            struct pollfd p = {evfd, POLLIN, 0};
            CHECK(poll(&p, 1, 30000) == 1, "no wake-up on the eventfd within 30 s");
            uint64_t x;
            CHECK(read(evfd, &x, sizeof x) == sizeof x);
        }
        CHECK(rc == 1, "bosc_keys_take: %d (%s)", rc, stats(d).error);
        CHECK(bosc_keys_take(d->b, t, &out) == -ESTALE, "a taken ticket must be released");
    }
    return out;
}

/* How often key kind:i is listed (and with which type) in a listing. */
struct seen {
    int count[4][NSTR + NEXP];     /* kinds: s, h, e, c */
    int type[4][NSTR + NEXP];
    int other;
};

static const char *kinds[4] = {"s", "h", "e", "c"};

static void tally(const struct kvbuf *l, struct seen *s)
{
    memset(s, 0, sizeof *s);
    for (size_t off = 0; off < l->len;) {
        CHECK(l->len - off >= 5, "a listing record cut short");
        uint32_t kl;
        memcpy(&kl, l->p + off, 4);
        int type = (unsigned char)l->p[off + 4];
        CHECK(kl < 32 && l->len - off - 5 >= kl, "a listing record with key length %u", kl);
        char k[32];
        memcpy(k, l->p + off + 5, kl);
        k[kl] = 0;
        off += 5 + kl;
        int kind = -1, i = -1;
        for (int j = 0; j < 4; j++)
            if (k[0] == kinds[j][0] && k[1] == ':')
                kind = j;
        if (kind < 0 || sscanf(k + 2, "%d", &i) != 1 || i < 0 || i >= NSTR + NEXP) {
            s->other++;
            continue;
        }
        s->count[kind][i]++;
        s->type[kind][i] = type;
    }
}

/* Each key of kind [0, n) listed exactly once with its type (want = 1), or never (0). */
static void check_listed(const struct seen *s, int kind, int n, int type, int want, const char *when)
{
    for (int i = 0; i < n; i++) {
        CHECK(s->count[kind][i] == want, "%s: %s:%05d listed %d times, expected %d", when, kinds[kind], i,
              s->count[kind][i], want);
        CHECK(!want || s->type[kind][i] == type, "%s: %s:%05d listed with type %d", when, kinds[kind], i,
              s->type[kind][i]);
    }
}

/* ---- 2. a writer churning keys while the file is listed */

struct churn {
    struct db *d;
    atomic_int stop;
    uint64_t ops;
};

static void *churn_main(void *arg)
{
    struct churn *c = arg;
    struct rng r;
    rng_seed(&r, 7, 1);
    while (!atomic_load(&c->stop)) {
        int i = (int)rng_below(&r, NEXP);
        if (rng_below(&r, 3)) {
            put(c->d, "c", i, rng_below(&r, 2) ? KVT_HASH : KVT_STRING, 0);
        } else {
            char k[32];
            size_t kl = key_of(k, "c", i);
            CHECK(kvt_del_blind(c->d->t, k, kl) >= 0);
        }
        c->ops++;
    }
    return NULL;
}

static void listing_under_writes(struct db *d)
{
    struct churn c = {d, 0, 0};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, churn_main, &c) == 0);
    int evfd = eventfd(0, EFD_CLOEXEC);
    CHECK(evfd >= 0);
    struct seen *s = malloc(sizeof *s);
    CHECK(s);
    double t0 = now_s();
    int rounds = 0;
    while (rounds < 3 || now_s() - t0 < 1.0) {
        struct kvbuf l = list_all(d, rounds % 2 ? 7 : BUCKETS, rounds % 2 ? evfd : -1);
        tally(&l, s);
        free(l.p);
        check_listed(s, 0, NSTR, KVT_STRING, 1, "listing under writes");
        check_listed(s, 1, NHASH, KVT_HASH, 1, "listing under writes");
        for (int i = 0; i < NEXP; i++)
            CHECK(s->count[3][i] <= 1, "c:%05d listed %d times", i, s->count[3][i]);
        CHECK(!s->other, "%d keys listed that were never written", s->other);
        rounds++;
    }
    atomic_store(&c.stop, 1);
    pthread_join(th, NULL);
    close(evfd);
    free(s);
    fprintf(stderr, "listing under writes: %d full listings, %" PRIu64 " writes meanwhile\n", rounds, c.ops);
}

/* ---- 4. tickets nobody takes */

static void abandoned_tickets(struct db *d)
{
    int64_t t[BOSC_KEYS_SLOTS];
    for (int i = 0; i < BOSC_KEYS_SLOTS; i++) {
        t[i] = bosc_keys_request(d->b, (uint32_t)i % BUCKETS, 1, -1);
        CHECK(t[i] > 0, "request %d: %" PRId64, i, t[i]);
    }
    for (int i = 0; i < BOSC_KEYS_SLOTS; i++)
        bosc_keys_wait(d->b, t[i]); /* ready, never taken */
    int64_t busy = bosc_keys_request(d->b, 0, 1, -1);
    CHECK(busy == -EBUSY, "with every slot held a request got %" PRId64, busy);
    CHECK(bosc_keys_request(d->b, BUCKETS, 1, -1) == -EINVAL);
    CHECK(bosc_keys_request(d->b, 0, 0, -1) == -EINVAL);
    CHECK(bosc_keys_request(d->b, 0, BOSC_KEYS_MAX_BUCKETS + 1, -1) == -EINVAL);
    usleep(2200 * 1000); /* past KEYS_KEEP_MS: the untaken answers may go */
    int64_t fresh = bosc_keys_request(d->b, 0, BUCKETS, -1);
    CHECK(fresh > 0, "an abandoned slot was not reclaimed: %" PRId64, fresh);
    int stale = 0;
    struct kvbuf out = {0};
    for (int i = 0; i < BOSC_KEYS_SLOTS; i++) {
        int rc = bosc_keys_take(d->b, t[i], &out);
        CHECK(rc == 1 || rc == -ESTALE, "take of an old ticket: %d", rc);
        stale += rc == -ESTALE;
    }
    CHECK(stale == 1, "%d tickets dropped for one request", stale);
    CHECK(stats(d).key_listings_dropped == 1);
    /* cancelled while queued, running or ready: freed now or by the loader, and a
     * waiter on it returns (repeated: the loader is caught at every stage) */
    for (int i = 0; i < 200; i++) {
        int64_t c = i ? bosc_keys_request(d->b, 0, BUCKETS, -1) : fresh;
        CHECK(c > 0, "%" PRId64, c);
        if (i % 3 == 1)
            usleep(50);
        bosc_keys_cancel(d->b, c);
        bosc_keys_wait(d->b, c);
        CHECK(bosc_keys_take(d->b, c, &out) == -ESTALE, "a cancelled ticket is gone");
    }
    /* every slot is free again: a full set of requests is accepted; all but
     * three cancelled, those abandoned, for bosc_close to free (ASan's leak check) */
    for (int i = 0; i < BOSC_KEYS_SLOTS; i++) {
        t[i] = bosc_keys_request(d->b, 0, BUCKETS, -1);
        CHECK(t[i] > 0, "slot %d still held: %" PRId64, i, t[i]);
    }
    for (int i = 0; i < BOSC_KEYS_SLOTS; i++) {
        bosc_keys_wait(d->b, t[i]);
        if (i >= 3)
            bosc_keys_cancel(d->b, t[i]);
    }
    free(out.p);
}

/* ---- 5. a damaged block */

static void damaged_block(struct db *d)
{
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    unsigned char two[2 * BOSC_BLOCK], *blk = NULL;
    uint32_t victim = 0;
    /* Home copies follow the superblocks (2) and the bucket table (one page for
     * 64 buckets, two copies): bucket k at 4 + 2k and 5 + 2k (bosc.h). The
     * newest copy holds the chain; the other one is not read. */
    for (uint32_t no = 4; no < 4 + 2 * BUCKETS && !victim; no += 2) {
        CHECK(pread(fd, two, sizeof two, (off_t)no * BOSC_BLOCK) == (ssize_t)sizeof two);
        int c0 = memcmp(two, "KVB1", 4) == 0, c1 = memcmp(two + BOSC_BLOCK, "KVB1", 4) == 0;
        if (!c0 && !c1)
            continue;
        uint64_t s0, s1; /* the sweep that wrote each copy (little-endian hosts) */
        memcpy(&s0, two + 32, 8);
        memcpy(&s1, two + BOSC_BLOCK + 32, 8);
        int c = !c0 ? 1 : !c1 ? 0 : s1 > s0;
        blk = two + c * BOSC_BLOCK;
        if (blk[24] | blk[25])
            victim = no + (uint32_t)c; /* a home block with records */
    }
    CHECK(victim, "no home block with records");
    blk[48] ^= 0x01; /* a payload bit: the checksum no longer matches */
    CHECK(pwrite(fd, blk, BOSC_BLOCK, (off_t)victim * BOSC_BLOCK) == BOSC_BLOCK);
    close(fd);
    int64_t t = bosc_keys_request(d->b, 0, BUCKETS, -1);
    CHECK(t > 0, "%" PRId64, t);
    bosc_keys_wait(d->b, t);
    struct kvbuf out = {0};
    int rc = bosc_keys_take(d->b, t, &out);
    CHECK(rc == -EILSEQ, "listing over a damaged block: %d", rc);
    CHECK(out.len == 0, "a failed listing appended %zu bytes", out.len);
    char want[64];
    snprintf(want, sizeof want, "block %u ", victim);
    struct bosc_stats st = stats(d);
    CHECK(st.failed && strstr(st.error, want) && strstr(st.error, "checksum"), "error: %s", st.error);
    CHECK(bosc_keys_request(d->b, 0, 1, -1) == -EIO, "a failed data file still lists");
    free(out.p);
}

/* ---- 6. streams in the batch store */

#define NSTREAM 24
#define SENT 300                  /* entries per stream at first: ~20 sealed batches */

struct xadd_arg {
    int s, from, to;              /* entries [from, to) of stream s */
    int trim;                     /* > 0: XTRIM MAXLEN = trim instead */
};

static size_t sval_of(char *buf, int s, int i) { return (size_t)sprintf(buf, "stream %d entry %d %0*d", s, i, 60, i); }

static int64_t xadd_fn(void *arg, const struct kvt_state *cur, struct kvbuf *delta)
{
    struct xadd_arg *a = arg;
    if (cur->exists && cur->type != KVT_STREAM)
        return KVT_WRONGTYPE;
    if (a->trim) {
        struct xs_cut cut;
        if (xs_trim_plan(cur->stream, 0, (uint64_t)a->trim, XS_ID_MIN, 0, 0, &cut))
            return xd_cut(delta, &cut);
        return 0;
    }
    int rc = cur->exists ? 0 : xd_create(delta);
    for (int i = a->from; i < a->to && !rc; i++) {
        char v[96];
        struct xs_field f = {"v", v, 1, sval_of(v, a->s, i)};
        rc = xd_add(delta, (struct xs_id){(uint64_t)i + 1, 0}, &f, 1);
    }
    return rc;
}

static void xadd(struct db *d, struct xadd_arg a)
{
    char k[32];
    size_t kl = key_of(k, "x", a.s);
    for (int tries = 0;; tries++) {
        int64_t rc = kvt_xapply(d->t, k, kl, xadd_fn, &a);
        if (rc >= 0)
            return;
        CHECK((rc == -ENOMEM || rc == -ENODATA) && tries < 1000, "XADD %s: %" PRId64, k, rc);
        CHECK((rc == -ENOMEM ? kvt_wait_memory(d->t) : kvt_load_sync(d->t, k, kl)) == 0, "%s", stats(d).error);
    }
}

struct xcheck_arg {
    int s, first, last, bad;      /* the entries [first, last] expected, in order */
};

static int64_t xcheck_fn(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    (void)ch;
    struct xcheck_arg *a = arg;
    a->bad = 0; /* (a run that read a gone batch is thrown away, then run again) */
    if (!cur->exists || cur->type != KVT_STREAM) {
        a->bad = 1;
        return 0;
    }
    struct xs_iter it;
    struct xs_entry e;
    xs_iter_init(&it, cur->stream, XS_ID_MIN, XS_ID_MAX, 0, 0);
    int i = a->first, r;
    while ((r = xs_iter_next(&it, &e)) == 1) {
        char v[96];
        size_t vl = sval_of(v, a->s, i);
        const unsigned char *p = e.fields;
        struct xs_field f;
        if (i > a->last || e.id.ms != (uint64_t)i + 1 || !xs_field_next(&e, &p, &f) || f.vlen != vl ||
            memcmp(f.v, v, vl)) {
            a->bad = 1;
            break;
        }
        i++;
    }
    xs_iter_done(&it);
    if (i != a->last + 1)
        a->bad = 1;
    return 0;
}

static void xcheck(struct db *d, int s, int first, int last, const char *when)
{
    char k[32];
    size_t kl = key_of(k, "x", s);
    struct xcheck_arg a = {s, first, last, 0};
    int64_t rc;
    for (int tries = 0; (rc = kvt_apply(d->t, k, kl, xcheck_fn, &a)) == -ENODATA; tries++) {
        CHECK(tries < 1000, "%s: %s never loads", when, k);
        CHECK(kvt_load_sync(d->t, k, kl) == 0, "%s: load %s: %s", when, k, stats(d).error);
    }
    CHECK(rc == 0 && !a.bad, "%s: stream %s is not entries %d..%d (rc %" PRId64 ", %s)", when, k, first, last, rc,
          stats(d).error);
}

static atomic_int readers_stop;

static void *stream_reader(void *arg)
{
    struct db *d = arg;
    for (int n = 0; !atomic_load(&readers_stop); n++)
        xcheck(d, n % NSTREAM, 0, SENT - 1, "read while written back");
    return NULL;
}

static void streams(struct db *d)
{
    for (int s = 0; s < NSTREAM; s++)
        xadd(d, (struct xadd_arg){s, 0, SENT, 0});
    sync_evict(d);
    struct bosc_stats st = stats(d);
    CHECK(st.batches_written >= NSTREAM * 15 && st.batch_segments >= 1 && st.batch_live_bytes > NSTREAM * SENT * 60,
          "after the first write-back: %" PRIu64 " batches, %" PRIu64 " segments, %" PRIu64 " live bytes",
          st.batches_written, st.batch_segments, st.batch_live_bytes);
    /* loads from another thread while the streams left in memory are written back and evicted again */
    pthread_t r;
    atomic_store(&readers_stop, 0);
    CHECK(pthread_create(&r, NULL, stream_reader, d) == 0);
    for (int round = 0; round < 3; round++) {
        for (int s = 0; s < NSTREAM; s++)
            xcheck(d, s, 0, SENT - 1, "loaded");
        sync_evict(d);
    }
    atomic_store(&readers_stop, 1);
    pthread_join(r, NULL);
    CHECK(stats(d).batch_reads > 0, "no batch was read back from the store");
    uint64_t before = stats(d).batches_written;
    for (int s = 0; s < NSTREAM; s++)
        xadd(d, (struct xadd_arg){s, SENT, SENT + 30, 0}); /* ~2 batches more each */
    sync_evict(d);
    uint64_t more = stats(d).batches_written - before;
    CHECK(more > 0 && more <= NSTREAM * 5, "a write-back of ~2 new batches per stream wrote %" PRIu64 " batches",
          more);
    db_close(d);
    db_open(d);
    for (int s = 0; s < NSTREAM; s++)
        xcheck(d, s, 0, SENT + 29, "reopened");
    for (int s = 0; s < NSTREAM; s++)
        xadd(d, (struct xadd_arg){s, 0, 0, 10});
    sync_evict(d);
    st = stats(d);
    CHECK(st.batch_live_bytes < NSTREAM * 2000, "trimmed to 10 entries each: %" PRIu64 " live bytes",
          st.batch_live_bytes);
    for (int s = 0; s < NSTREAM; s++)
        xcheck(d, s, SENT + 20, SENT + 29, "trimmed");
    fprintf(stderr, "streams: %d streams through the batch store (%" PRIu64 " batches written, %" PRIu64
            " read back, %" PRIu64 " segments left)\n", NSTREAM, st.batches_written, st.batch_reads,
            st.batch_segments);
}

int main(int argc, char **argv)
{
    CHECK(argc == 2, "usage: bosc_keys_test DIR");
    snprintf(path, sizeof path, "%s/data", argv[1]);
    unlink(path);
    struct db d;
    db_open(&d);

    /* 1. types through sweep, eviction, load and restart */
    for (int i = 0; i < NSTR; i++)
        put(&d, "s", i, KVT_STRING, 0);
    for (int i = 0; i < NHASH; i++)
        put(&d, "h", i, KVT_HASH, 0);
    sync_evict(&d);
    usleep(5 * INTERVAL_MS * 1000);
    CHECK(stats(&d).expire_pass_blocks == 0, "the expiry pass read a file without expire times");
    struct kvt_stats ts;
    kvt_get_stats(d.t, &ts);
    CHECK(ts.entries < NSTR + NHASH, "nothing was evicted");
    for (int i = 0; i < NHASH; i++)
        check_key(&d, "h", i, KVT_HASH, 1, "loaded");
    for (int i = 0; i < NSTR; i += 7)
        check_key(&d, "s", i, KVT_STRING, 1, "loaded");
    CHECK(stats(&d).loads > 0);
    db_close(&d);
    struct bosc_open_info info = db_open(&d);
    CHECK(info.disk_keys == NSTR + NHASH, "reopened: %" PRIu64 " keys", info.disk_keys);
    for (int i = 0; i < NHASH; i += 3)
        check_key(&d, "h", i, KVT_HASH, 1, "reopened");
    fprintf(stderr, "types: %d strings and %d hashes back from the file\n", NSTR, NHASH);

    /* 2. listing, alone and under writes */
    listing_under_writes(&d);
    CHECK(!bosc_failed(d.b), "%s", stats(&d).error);
    for (int i = 0; i < NEXP; i++) { /* the churned keys out of the way */
        char k[32];
        size_t kl = key_of(k, "c", i);
        CHECK(kvt_del_blind(d.t, k, kl) >= 0);
    }

    /* 3. expiry in blocks nothing writes */
    int64_t now = kvt_now_ms();
    for (int i = 0; i < NEXP; i++)
        put(&d, "e", i, KVT_STRING, now + 60000 + i);
    for (int i = 0; i < 10; i++) {
        sync_evict(&d);
        kvt_get_stats(d.t, &ts);
        if (!ts.entries)
            break;
    }
    CHECK(ts.entries == 0, "%" PRIu64 " entries still in memory after evicting", ts.entries);
    uint64_t all = NSTR + NHASH + NEXP;
    CHECK(kvt_count(d.t) == all, "count %" PRIu64 " before the expiry, expected %" PRIu64, kvt_count(d.t), all);
    usleep(5 * INTERVAL_MS * 1000);
    CHECK(stats(&d).expire_pass_blocks == 0, "the expiry pass read blocks whose records expire a minute ahead");
    kvt_set_clock_offset(120000); /* every e: key expired, none of them in memory */
    struct seen *s = malloc(sizeof *s);
    CHECK(s);
    struct kvbuf l = list_all(&d, 16, -1);
    tally(&l, s);
    free(l.p);
    check_listed(s, 2, NEXP, KVT_STRING, 0, "listing after the expiry");
    check_listed(s, 0, NSTR, KVT_STRING, 1, "listing after the expiry");
    double t0 = now_s();
    uint64_t live = NSTR + NHASH;
    while (stats(&d).disk_keys != live || kvt_count(d.t) != live || bosc_dirty(d.b)) {
        CHECK(now_s() - t0 < 60, "expired records not reclaimed in 60 s: %" PRIu64 " keys in the file, count %"
              PRIu64 ", want %" PRIu64, stats(&d).disk_keys, kvt_count(d.t), live);
        usleep(10000);
    }
    struct bosc_stats st = stats(&d);
    CHECK(st.expired_reclaimed >= NEXP && st.expire_pass_blocks > 0, "reclaimed %" PRIu64 ", pass read %"
          PRIu64 " blocks", st.expired_reclaimed, st.expire_pass_blocks);
    fprintf(stderr, "expiry: %d expired records reclaimed in %.2f s (pass read %" PRIu64 " blocks, %" PRIu64
            " turns)\n", NEXP, now_s() - t0, st.expire_pass_blocks, st.expire_passes);
    for (int i = 0; i < NEXP; i += 5)
        check_key(&d, "e", i, KVT_STRING, 0, "expired");
    db_close(&d);
    info = db_open(&d);
    CHECK(info.disk_keys == live && kvt_count(d.t) == live, "reopened after the expiry: %" PRIu64 " keys",
          info.disk_keys);
    l = list_all(&d, BUCKETS, -1);
    tally(&l, s);
    free(l.p);
    check_listed(s, 2, NEXP, KVT_STRING, 0, "reopened after the expiry");
    check_listed(s, 1, NHASH, KVT_HASH, 1, "reopened after the expiry");
    usleep(10 * INTERVAL_MS * 1000); /* the pass finds nothing left: its bits go */
    free(s);

    /* 4, 5 */
    abandoned_tickets(&d);
    damaged_block(&d);
    db_close(&d);
    unlink(path);

    /* 6 (a new file) */
    max_memory = 64 << 20;
    db_open(&d);
    streams(&d);
    db_close(&d);
    unlink(path);
    fprintf(stderr, "bosc_keys_test: ok\n");
    return 0;
}
