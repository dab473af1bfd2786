/* wal_recover.c - reading the log back: recovery into the table (replay, with
 * truncation of a torn tail when asked to repair), truncation of old segments,
 * and wal_read_range for a log peer's catch-up. Runs before the log is opened
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
#include <unistd.h>

#include "core/bytes.h"
#include "core/crc32c.h"
#include "core/kvbuf.h"
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

static int apply(struct kv_table *t, int op, const unsigned char *key, uint32_t klen,
                 const unsigned char *val, uint32_t vlen, int64_t expire)
{
    if (op == WAL_SET) {
        /* Without the bound: what was accepted live (MSET checks its bound once for
         * the whole command) must replay; the bound applies to new writes. */
        int rc = kvt_set(t, key, klen, val, vlen, KVT_NOBOUND, expire, NULL, NULL);
        return rc < 0 ? rc : 0;
    }
    if (op == WAL_DEL) {
        /* blind: with a data file the key may be only in its block */
        int rc = kvt_del_blind(t, key, klen);
        return rc < 0 ? rc : 0;
    }
    kvt_flush(t);
    return 0;
}

size_t wal_rec_len(const unsigned char *p, size_t n)
{
    if (n < WAL_HDR || crc32c(0, p + WAL_OFF_KLEN, WAL_HDR - WAL_OFF_KLEN) != get32(p + WAL_OFF_HCRC))
        return 0;
    uint32_t klen = get32(p + WAL_OFF_KLEN), vlen = get32(p + WAL_OFF_VLEN);
    if (klen > WAL_MAX_LEN || vlen > WAL_MAX_LEN || p[WAL_OFF_OP] < WAL_SET || p[WAL_OFF_OP] > WAL_FLUSH)
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
    uint64_t prev = 0;
    rc = 0;
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
        if (len < WAL_SEG_HDR || memcmp(d, WAL_SEG_MAGIC, 8) || get64(d + 8) != segs[si].first) {
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
            uint32_t klen = 0, vlen = 0;
            size_t recl = wal_rec_len(p, left);
            if (left < WAL_HDR) {
                why = "record header cut short";
                torn = last;
            } else if (!recl) {
                why = "damaged record header";
                size_t nz = len; /* a header written in part, zeros after it */
                while (nz > off && d[nz - 1] == 0)
                    nz--;
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
                size_t z = off + recl;
                while (z < len && d[z] == 0)
                    z++;
                torn = last && z == len;
            } else {
                klen = get32(p + WAL_OFF_KLEN);
                vlen = get32(p + WAL_OFF_VLEN);
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
            prev = lsn;
            if (lsn > after_lsn) {
                int arc = t ? apply(t, p[WAL_OFF_OP], p + WAL_HDR, klen, p + WAL_HDR + klen, vlen,
                                    (int64_t)get64(p + WAL_OFF_EXPIRE))
                            : 0;
                if (arc) {
                    snprintf(err, errlen, "cannot apply LSN %" PRIu64 " from %s: %s (raise --max-memory?)",
                             lsn, path, strerror(-arc));
                    rc = arc;
                    break;
                }
                if (!rec->first_lsn)
                    rec->first_lsn = lsn;
                rec->last_lsn = lsn;
                rec->records++;
            }
            rec->bytes += recl;
            off += recl;
        }
        /* What is replayed counts as durable from now on, but a crash between a
         * group's write() and its fdatasync() leaves records that were never
         * acknowledged and maybe never synced: make them durable before use. */
        if (!rc && repair)
            rc = sync_path(path, dir, err, errlen);
        free(d);
    }
    if (!rec->last_lsn)
        rec->last_lsn = prev > after_lsn ? prev : after_lsn;
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
