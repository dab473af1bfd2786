/* wal_recover.c - reading the log back: recovery into the table (replay, units
 * applied whole at their COMMIT, truncation of a torn tail or of a unit the log
 * ends inside when asked to repair), truncation of old segments, and
 * wal_read_range for a log peer's catch-up. Runs before the log is opened
 * (recovery) or on files the log thread no longer writes; no shared state.
 * Segment files are untrusted: every record's header and CRC is checked. */
#define _GNU_SOURCE
#include "durability/wal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/bytes.h"
#include "core/crc32c.h"
#include "core/kvbuf.h"
#include "core/log.h"
#include "core/table.h"

/* ---- recovery */

struct seg {
    uint64_t first;
    char name[64];
};

static int seg_cmp(const void *a, const void *b)
{
    uint64_t x = ((const struct seg *)a)->first, y = ((const struct seg *)b)->first;
    return x < y ? -1 : x > y;
}

static int list_segments(const char *dir, struct seg **out, int *n)
{
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) {
            *out = NULL;
            *n = 0;
            return 0;
        }
        return -errno;
    }
    struct seg *v = NULL;
    int cnt = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        uint64_t first;
        char tail[8];
        if (strlen(de->d_name) != 24 || sscanf(de->d_name, "wal-%16" SCNx64 ".%3s", &first, tail) != 2 ||
            strcmp(tail, "log"))
            continue;
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            struct seg *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) {
                free(v);
                closedir(d);
                return -ENOMEM;
            }
            v = nv;
        }
        v[cnt].first = first;
        snprintf(v[cnt].name, sizeof v[cnt].name, "%s", de->d_name);
        cnt++;
    }
    closedir(d);
    qsort(v, (size_t)cnt, sizeof *v, seg_cmp);
    *out = v;
    *n = cnt;
    return 0;
}

static int read_file(const char *path, unsigned char **data, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st)) {
        int e = errno;
        close(fd);
        return -e;
    }
    unsigned char *p = malloc(st.st_size ? (size_t)st.st_size : 1);
    if (!p) {
        close(fd);
        return -ENOMEM;
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, p + got, (size_t)st.st_size - got);
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            free(p);
            close(fd);
            return -e;
        }
        got += (size_t)r;
    }
    close(fd);
    *data = p;
    *len = got;
    return 0;
}

/* The end of the non-zero bytes of d[from, len): from if they are all zeros. */
static size_t nonzero_end(const unsigned char *d, size_t from, size_t len)
{
    while (len > from && (len - from) % 8)
        if (d[--len])
            return len + 1;
    for (uint64_t x; len > from; len -= 8) {
        memcpy(&x, d + len - 8, 8);
        if (x)
            break;
    }
    while (len > from && !d[len - 1])
        len--;
    return len;
}

static int apply(struct kv_table *t, const unsigned char *p, uint64_t lsn)
{
    uint32_t klen = get32(p + WAL_OFF_KLEN), vlen = get32(p + WAL_OFF_VLEN);
    const unsigned char *key = p + WAL_HDR;
    switch (p[WAL_OFF_OP]) {
    case WAL_SET: {
        /* Without the bound: what was accepted live (MSET checks its bound once for
         * the whole command) must replay; the bound applies to new writes. */
        int flags = KVT_NOBOUND | (p[WAL_OFF_TYPE] == WAL_T_HASH     ? KVT_TYPE_HASH
                                   : p[WAL_OFF_TYPE] == WAL_T_STREAM ? KVT_TYPE_STREAM
                                                                     : 0);
        int rc = kvt_set(t, key, klen, key + klen, vlen, flags, (int64_t)get64(p + WAL_OFF_EXPIRE), NULL, NULL);
        return rc < 0 ? rc : 0;
    }
    case WAL_DEL: {
        /* blind: with a data file the key may be only in its block */
        int rc = kvt_del_blind(t, key, klen);
        return rc < 0 ? rc : 0;
    }
    case WAL_FLUSH: {
        int rc = kvt_flush(t);
        return rc < 0 ? rc : 0;
    }
    case WAL_XOP: {
        int rc = kvt_xreplay(t, key, klen, key + klen, vlen, (int64_t)get64(p + WAL_OFF_EXPIRE), lsn);
        return rc < 0 ? rc : 0;
    }
    }
    return 0; /* WAL_COMMIT: nothing of its own */
}

size_t wal_rec_len(const unsigned char *p, size_t n)
{
    if (n < WAL_HDR || crc32c(0, p + WAL_OFF_KLEN, WAL_HDR - WAL_OFF_KLEN) != get32(p + WAL_OFF_HCRC))
        return 0;
    uint32_t klen = get32(p + WAL_OFF_KLEN), vlen = get32(p + WAL_OFF_VLEN);
    uint32_t count = get32(p + WAL_OFF_COUNT);
    int op = p[WAL_OFF_OP], type = p[WAL_OFF_TYPE], flags = p[WAL_OFF_FLAGS];
    if (klen > WAL_MAX_LEN || vlen > WAL_MAX_LEN || op < WAL_SET || op > WAL_XOP || p[19] ||
        (flags & ~WAL_F_UNIT) || type > WAL_T_STREAM || (type && op != WAL_SET))
        return 0;
    if (op == WAL_COMMIT ? (klen || vlen || flags || get64(p + WAL_OFF_EXPIRE) || !count) : count != 0)
        return 0;
    return WAL_HDR + (size_t)klen + vlen + WAL_TRAILER;
}

int wal_rec_ok(const unsigned char *p, size_t l) { return crc32c(0, p + 4, l - 4) == get32(p); }

uint64_t wal_rec_lsn(const unsigned char *p, size_t l) { return get64(p + l - WAL_TRAILER); }

static int sync_path(const char *path, const char *dir, char *err, size_t errlen)
{
    int rc = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fdatasync(fd))
        rc = -errno;
    if (fd >= 0)
        close(fd);
    int dfd = rc ? -1 : open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (!rc && (dfd < 0 || fsync(dfd)))
        rc = -errno;
    if (dfd >= 0)
        close(dfd);
    if (rc)
        snprintf(err, errlen, "cannot sync %s: %s", path, strerror(-rc));
    return rc;
}

int wal_truncate(const char *dir, uint64_t upto)
{
    struct seg *segs = NULL;
    int nseg = 0, rc = list_segments(dir, &segs, &nseg), removed = 0;
    if (rc)
        return rc;
    /* Segment i holds LSNs [first(i), first(i+1)); the newest is the one the
     * log thread appends to and always stays. Oldest first, so a crash midway
     * leaves a suffix of the log, never a hole. */
    for (int i = 0; i + 1 < nseg && segs[i + 1].first <= upto + 1; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, segs[i].name);
        if (unlink(path) && errno != ENOENT) {
            rc = -errno;
            break;
        }
        removed++;
    }
    free(segs);
    if (removed) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    return rc ? rc : removed;
}

/* Replay state: the unit being read (buffered until its COMMIT) and the counts. */
struct replay {
    struct kv_table *t;
    uint64_t after;             /* records up to this LSN are in the data file already */
    struct wal_recovery *rec;
    uint64_t bound;             /* LSN of the last record outside any unit, or the last COMMIT */
    int uopen, ufrom_start;     /* a unit is open; it began at the log's first record */
    uint64_t ufirst;
    uint32_t un;
    int usi;                    /* where the unit begins: segment index and offset */
    size_t uoff;
    struct kvbuf ubuf;          /* its records, verbatim */
};

static void counted(struct wal_recovery *rec, uint64_t lsn)
{
    if (!rec->first_lsn)
        rec->first_lsn = lsn;
    rec->last_lsn = lsn;
    rec->records++;
}

/* Apply one record (lsn > after) or count it (t == NULL). */
static int replay_one(struct replay *r, const unsigned char *p, uint64_t lsn, const char *path, char *err,
                      size_t errlen)
{
    int rc = r->t ? apply(r->t, p, lsn) : 0;
    if (rc) {
        snprintf(err, errlen, "cannot apply LSN %" PRIu64 " from %s: %s (raise --max-memory?)", lsn, path,
                 strerror(-rc));
        return rc;
    }
    counted(r->rec, lsn);
    return 0;
}

/* Take the valid record p (LSN lsn, at path:off, segment si): buffer it if it
 * belongs to a unit, apply a unit at its COMMIT, apply a plain record. */
static int replay_rec(struct replay *r, const unsigned char *p, size_t recl, uint64_t lsn, const char *path,
                      int si, size_t off, int first_of_log, char *err, size_t errlen)
{
    int op = p[WAL_OFF_OP];
    if (op == WAL_COMMIT) {
        uint32_t count = get32(p + WAL_OFF_COUNT);
        if (!r->uopen) {
            snprintf(err, errlen, "log corrupt in %s at offset %zu: LSN %" PRIu64 " closes a unit of %u "
                     "records but no unit is open", path, off, lsn, count);
            return -EILSEQ;
        }
        /* A unit the log begins inside has lost its first records (to truncation
         * below the data file's LSN): fewer than the count, never more. */
        if (count != r->un && !(r->ufrom_start && count > r->un)) {
            snprintf(err, errlen, "log corrupt in %s at offset %zu: LSN %" PRIu64 " closes a unit of %u "
                     "records but the unit from LSN %" PRIu64 " has %u", path, off, lsn, count, r->ufirst, r->un);
            return -EILSEQ;
        }
        const unsigned char *q = (unsigned char *)r->ubuf.p, *qe = q + r->ubuf.len;
        while (q < qe) { /* every record was checked when it was buffered */
            size_t l = wal_rec_len(q, (size_t)(qe - q));
            uint64_t ql = wal_rec_lsn(q, l);
            int rc = ql > r->after ? replay_one(r, q, ql, path, err, errlen) : 0;
            if (rc)
                return rc;
            q += l;
        }
        if (lsn > r->after) {
            counted(r->rec, lsn);
            r->rec->units++;
        }
        r->uopen = 0;
        r->ubuf.len = 0;
        r->bound = lsn;
        return 0;
    }
    if (p[WAL_OFF_FLAGS] & WAL_F_UNIT) {
        if (!r->uopen) {
            r->uopen = 1;
            r->ufrom_start = first_of_log;
            r->ufirst = lsn;
            r->un = 0;
            r->usi = si;
            r->uoff = off;
        }
        r->un++;
        if (kvbuf_append(&r->ubuf, p, recl)) {
            snprintf(err, errlen, "out of memory buffering the unit from LSN %" PRIu64, r->ufirst);
            return -ENOMEM;
        }
        return 0;
    }
    if (r->uopen) {
        snprintf(err, errlen, "log corrupt in %s at offset %zu: LSN %" PRIu64 " is not part of the unit "
                 "open since LSN %" PRIu64 ", which has no COMMIT before it", path, off, lsn, r->ufirst);
        return -EILSEQ;
    }
    r->bound = lsn;
    return lsn > r->after ? replay_one(r, p, lsn, path, err, errlen) : 0;
}

/* The log ended inside a unit: its COMMIT was never written (a crash before the
 * group that holds it reached the disk), so none of it was acknowledged. Drop it;
 * with repair cut it away (from its first record on, later segments too), so
 * that new records continue the log after the last whole unit. */
static int drop_unit(struct replay *r, const char *dir, const struct seg *segs, int nseg, int repair,
                     char *err, size_t errlen)
{
    struct wal_recovery *rec = r->rec;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, segs[r->usi].name);
    size_t n = strlen(rec->problem);
    snprintf(rec->problem + n, sizeof rec->problem - n,
             "%sunit of %u records from LSN %" PRIu64 " (%s at offset %zu) has no COMMIT: the log ends inside "
             "it; dropped%s", n ? "; " : "", r->un, r->ufirst, path, r->uoff, repair ? " and truncated" : "");
    rec->dropped_units++;
    rec->truncated_bytes += r->ubuf.len;
    if (!repair)
        return 0;
    if (truncate(path, (off_t)r->uoff)) {
        snprintf(err, errlen, "cannot truncate %s: %s", path, strerror(errno));
        return -errno;
    }
    for (int i = r->usi + 1; i < nseg; i++) { /* only the unit's records are in them */
        char later[4096];
        snprintf(later, sizeof later, "%s/%s", dir, segs[i].name);
        if (unlink(later) && errno != ENOENT) {
            snprintf(err, errlen, "cannot remove %s: %s", later, strerror(errno));
            return -errno;
        }
    }
    int rc = sync_path(path, dir, err, errlen);
    uint64_t named;
    if (!rc && r->usi + 1 < nseg && wal_manifest_read(dir, &named, err, errlen) == 1) {
        /* the manifest must name a segment still there */
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        rc = dfd < 0 ? -errno : wal_manifest_write(dir, dfd, segs[r->usi].first, err, errlen);
        if (dfd >= 0)
            close(dfd);
    }
    return rc;
}

int wal_recover(struct kv_table *t, const char *dir, uint64_t after_lsn, int repair,
                struct wal_recovery *rec, char *err, size_t errlen)
{
    memset(rec, 0, sizeof *rec);
    struct seg *segs = NULL;
    int nseg = 0, rc = list_segments(dir, &segs, &nseg);
    if (rc) {
        snprintf(err, errlen, "cannot list log directory %s: %s", dir, strerror(-rc));
        return rc;
    }
    rc = wal_manifest_check(dir, nseg ? segs[nseg - 1].first : 0, nseg, err, errlen);
    if (rc) {
        free(segs);
        return rc;
    }
    struct replay r = {.t = t, .after = after_lsn, .rec = rec};
    uint64_t prev = 0;
    if (t && nseg) /* a replay (not a scan): a long one reports its progress, below */
        kvlog(KVLOG_NOTICE, "replaying the log in %s: %d segment(s), after LSN %" PRIu64, dir, nseg, after_lsn);
    time_t noted = time(NULL);
    for (int si = 0; si < nseg && !rc; si++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, segs[si].name);
        unsigned char *d = NULL;
        size_t len = 0;
        rc = read_file(path, &d, &len);
        if (rc) {
            snprintf(err, errlen, "cannot read %s: %s", path, strerror(-rc));
            break;
        }
        rec->segments++;
        int last = si == nseg - 1;
        int zeroed = len >= WAL_SEG_HDR && !memcmp(d, WAL_SEG_MAGIC_ZEROED, 8); /* written over zeros */
        if (len < WAL_SEG_HDR || (memcmp(d, WAL_SEG_MAGIC, 8) && !zeroed) || get64(d + 8) != segs[si].first) {
            if (last && len < WAL_SEG_HDR) { /* created, crashed before its header was written */
                snprintf(rec->problem, sizeof rec->problem, "%s: empty segment (header cut short), ignored", path);
                free(d);
                break;
            }
            snprintf(err, errlen, "%s: bad segment header: not a kvstore log segment or corrupt", path);
            free(d);
            rc = -EILSEQ;
            break;
        }
        if (t && si == 0 && segs[0].first > after_lsn + 1) {
            snprintf(err, errlen,
                     "%s: the log starts at LSN %" PRIu64 " but the data file holds only up to LSN %" PRIu64
                     ": segments are missing", path, segs[0].first, after_lsn);
            free(d);
            rc = -EILSEQ;
            break;
        }
        size_t off = WAL_SEG_HDR;
        while (off < len) {
            size_t left = len - off;
            const unsigned char *p = d + off;
            /* What a crash can leave at the end of the last segment: a record
             * cut short, or zeros where a write did not reach. The header CRC makes
             * the lengths trustworthy, so these are told apart from damage with
             * data after it without guessing. */
            const char *why = NULL;
            int torn = 0;
            size_t recl = wal_rec_len(p, left);
            if (left < WAL_HDR) {
                why = "record header cut short";
                torn = last;
            } else if (!recl) {
                why = "damaged record header";
                size_t nz = nonzero_end(d, off, len); /* a header written in part, zeros after it */
                /* ... or the damage is in the final record: the file ends with the
                 * trailer (LSN) that record would carry, so nothing follows it. */
                torn = last && (nz < off + WAL_HDR ||
                                (left >= WAL_HDR + WAL_TRAILER && get64(d + len - WAL_TRAILER) == prev + 1));
            } else if (recl > left) {
                why = "record cut short";
                torn = last;
            } else if (!wal_rec_ok(p, recl)) {
                why = "CRC mismatch";
                /* the final record, partly written: nothing but zeros after it */
                torn = last && nonzero_end(d, off + recl, len) == off + recl;
            }
            if (why && zeroed) {
                /* A segment written over zeros: its records end where the zeros
                 * begin. Anything else non-zero is a torn tail only in the last
                 * segment and only within the piece the log thread was writing
                 * (at most WAL_PIECE, or the one record's length: wal_write.c). */
                size_t nz = nonzero_end(d, off, len);
                if (nz == off) {
                    if (last && repair && len > off) /* give the zeros back (kept, they end it the same) */
                        (void)!truncate(path, (off_t)off);
                    break;
                }
                left = nz - off;
                torn = last && left <= (recl > WAL_PIECE ? recl : WAL_PIECE);
            }
            if (why) {
                if (torn) {
                    rec->truncated_bytes = left;
                    snprintf(rec->problem, sizeof rec->problem,
                             "torn tail in %s at offset %zu (%s): %zu bytes after LSN %" PRIu64 " %s",
                             path, off, why, left, prev, repair ? "truncated" : "ignored");
                    if (repair && truncate(path, (off_t)off)) {
                        snprintf(err, errlen, "cannot truncate %s: %s", path, strerror(errno));
                        rc = -errno;
                    }
                    if (repair && !rc)
                        rc = sync_path(path, dir, err, errlen);
                } else {
                    snprintf(err, errlen,
                             "log corrupt in %s at offset %zu (%s) after LSN %" PRIu64
                             ": %zu bytes follow that cannot be trusted; nothing after it was applied",
                             path, off, why, prev, left);
                    rc = -EILSEQ;
                }
                break;
            }
            uint64_t lsn = wal_rec_lsn(p, recl);
            /* LSNs are consecutive across segments, and a segment's first record is
             * the LSN its header names: a missing segment or record is a gap. */
            uint64_t want = off == WAL_SEG_HDR ? segs[si].first : prev + 1;
            if (lsn != want || (prev && lsn != prev + 1)) {
                snprintf(err, errlen,
                         "log corrupt in %s at offset %zu: LSN %" PRIu64 " where %" PRIu64
                         " was expected (a segment or records are missing)", path, off, lsn,
                         prev ? prev + 1 : want);
                rc = -EILSEQ;
                break;
            }
            rc = replay_rec(&r, p, recl, lsn, path, si, off, !prev, err, errlen);
            if (rc)
                break;
            prev = lsn;
            rec->bytes += recl;
            off += recl;
        }
        /* What is replayed counts as durable from now on, but a crash between a
         * group's write() and its fdatasync() leaves records that were never
         * acknowledged and maybe never synced: make them durable before use. */
        if (!rc && repair)
            rc = sync_path(path, dir, err, errlen);
        free(d);
        int due = t && time(NULL) - noted >= 5; /* progress every 5 s at notice, every segment at verbose */
        if (t && !rc)
            kvlog(due ? KVLOG_NOTICE : KVLOG_VERBOSE, "replaying the log: %" PRIu64 " records so far, segment %d of "
                  "%d done (LSN %" PRIu64 ")", rec->records, si + 1, nseg, rec->last_lsn);
        noted = due ? time(NULL) : noted;
    }
    if (!rc && r.uopen)
        rc = drop_unit(&r, dir, segs, nseg, repair, err, errlen);
    /* Where the log continues: after the last whole unit or plain record. */
    if (!rec->last_lsn)
        rec->last_lsn = r.bound > after_lsn ? r.bound : after_lsn;
    kvbuf_free(&r.ubuf);
    free(segs);
    return rc;
}


int64_t wal_read_range(const char *dir, uint64_t from, uint64_t upto, size_t max_bytes, struct kvbuf *out)
{
    struct seg *segs = NULL;
    int nseg = 0, rc = list_segments(dir, &segs, &nseg);
    if (rc)
        return rc;
    int si = nseg - 1;
    while (si > 0 && segs[si].first > from)
        si--;
    uint64_t last = 0;
    size_t taken = 0;
    for (; si >= 0 && si < nseg && last < upto && taken < max_bytes; si++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, segs[si].name);
        unsigned char *d = NULL;
        size_t len = 0;
        if ((rc = read_file(path, &d, &len)))
            break;
        size_t off = WAL_SEG_HDR;
        while (off + WAL_HDR + WAL_TRAILER <= len && taken < max_bytes) {
            const unsigned char *p = d + off;
            size_t recl = wal_rec_len(p, len - off);
            if (!recl || recl > len - off || !wal_rec_ok(p, recl))
                break; /* the end of what is written (or a torn tail) */
            uint64_t lsn = wal_rec_lsn(p, recl);
            if (lsn > upto || (last && lsn != last + 1))
                break; /* never hand out a gap */
            if (lsn >= from) {
                if (kvbuf_append(out, p, recl)) {
                    rc = -ENOMEM;
                    break;
                }
                taken += recl;
                last = lsn;
            }
            off += recl;
        }
        free(d);
        if (rc)
            break;
    }
    free(segs);
    return rc ? rc : (int64_t)last;
}
