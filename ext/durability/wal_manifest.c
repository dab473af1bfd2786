/* wal_manifest.c - the log's files: segments created (wal_seg_create, with
 * wal_write_all; the log thread and the peer's receiver) or adopted from a
 * prepared file (wal_seg_adopt; the log thread, wal_prep.c) and the log's
 * manifest, <dir>/wal.manifest: the first LSN of the
 * newest segment the log thread created, written (and synced, file and
 * directory) each time it creates one. Recovery checks that a segment at least
 * that new is present, so a deleted last segment is reported as lost records
 * instead of the log silently ending early (a deleted middle or first segment
 * shows as a gap, or as a log starting after what the data file holds). The log
 * thread writes it; recovery reads it before the log is opened. The file is
 * untrusted: its magic and CRC are checked. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/bytes.h"
#include "core/crc32c.h"
#include "durability/wal.h"

int wal_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void seg_name(char *dst, size_t n, const char *dir, uint64_t first)
{
    snprintf(dst, n, "%s/wal-%016" PRIx64 ".log", dir, first);
}

int wal_seg_create(const char *dir, int dirfd, uint64_t first, char *err, size_t errlen)
{
    char path[4096];
    seg_name(path, sizeof path, dir, first);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) {
        /* Recovery (which always runs first) ended before LSN first, so this file
         * holds no valid record: a segment created just before a crash. Replace it. */
        unlink(path);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot create log segment %s: %s", path, strerror(e));
        return -e;
    }
    unsigned char hdr[WAL_SEG_HDR];
    memcpy(hdr, WAL_SEG_MAGIC, 8);
    put64(hdr + 8, first);
    int rc = wal_write_all(fd, (const char *)hdr, sizeof hdr);
    if (!rc && fdatasync(fd))
        rc = -errno;
    if (!rc && fsync(dirfd))
        rc = -errno;
    if (rc) {
        snprintf(err, errlen, "cannot write log segment %s: %s", path, strerror(-rc));
        close(fd);
        unlink(path); /* (a disk full: a segment without its header would read as damage) */
        return rc;
    }
    return fd;
}

int wal_seg_adopt(const char *dir, int dirfd, int fd, const char *tmp, uint64_t first, char *err, size_t errlen)
{
    char path[4096];
    seg_name(path, sizeof path, dir, first);
    unsigned char hdr[WAL_SEG_HDR];
    memcpy(hdr, WAL_SEG_MAGIC_ZEROED, 8);
    put64(hdr + 8, first);
    ssize_t n = pwrite(fd, hdr, sizeof hdr, 0);
    int rc = n == (ssize_t)sizeof hdr ? 0 : n < 0 ? -errno : -EIO;
    /* the header before the name: a segment by that name always has its header
     * (rename replaces a file of the name: one created just before a crash, as above) */
    if (!rc && fdatasync(fd))
        rc = -errno;
    if (!rc && rename(tmp, path))
        rc = -errno;
    if (!rc && fsync(dirfd))
        rc = -errno;
    if (rc)
        snprintf(err, errlen, "cannot start log segment %s from %s: %s", path, tmp, strerror(-rc));
    return rc;
}

#define MANIFEST "wal.manifest"
#define MAGIC "KVSWALM1"
#define LEN 20                   /* magic | u64 newest segment's first LSN | u32 crc32c of bytes 0..15 */

int wal_manifest_write(const char *dir, int dirfd, uint64_t newest, char *err, size_t errlen)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/" MANIFEST, dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    unsigned char b[LEN];
    memcpy(b, MAGIC, 8);
    put64(b + 8, newest);
    put32(b + 16, crc32c(0, b, 16));
    int rc = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        rc = -errno;
    if (!rc)
        rc = wal_write_all(fd, b, sizeof b);
    if (!rc && fdatasync(fd))
        rc = -errno;
    if (fd >= 0)
        close(fd);
    /* rename: a crash leaves the old manifest or the new one, never half of one */
    if (!rc && rename(tmp, path))
        rc = -errno;
    if (!rc && fsync(dirfd))
        rc = -errno;
    if (rc)
        snprintf(err, errlen, "cannot write the log's manifest %s: %s", path, strerror(-rc));
    return rc;
}

int wal_manifest_read(const char *dir, uint64_t *newest, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/" MANIFEST, dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return 0;
    if (fd < 0) {
        snprintf(err, errlen, "cannot open the log's manifest %s: %s", path, strerror(errno));
        return -errno;
    }
    unsigned char b[LEN + 1];
    ssize_t n = read(fd, b, sizeof b);
    int e = errno;
    close(fd);
    if (n < 0) {
        snprintf(err, errlen, "cannot read the log's manifest %s: %s", path, strerror(e));
        return -e;
    }
    if (n != LEN || memcmp(b, MAGIC, 8) || get32(b + 16) != crc32c(0, b, 16)) {
        snprintf(err, errlen, "the log's manifest %s is damaged: it cannot say whether segments are missing "
                 "(check the segments, then remove it: the next start writes a new one)", path);
        return -EILSEQ;
    }
    *newest = get64(b + 8);
    return 1;
}

int wal_manifest_check(const char *dir, uint64_t newest_present, int nseg, char *err, size_t errlen)
{
    uint64_t named = 0;
    int rc = wal_manifest_read(dir, &named, err, errlen);
    if (rc <= 0)
        return rc; /* none (a log from before manifests, or a peer's copy), or unreadable */
    if (nseg && newest_present >= named)
        return 0;
    char present[64] = "no segment is left";
    if (nseg)
        snprintf(present, sizeof present, "the newest present is wal-%016" PRIx64 ".log", newest_present);
    snprintf(err, errlen, "log %s is missing segment wal-%016" PRIx64 ".log, the newest the log wrote (its "
             "manifest %s/" MANIFEST " names it; %s): the records from LSN %" PRIu64 " on are lost unless a "
             "backup or the peer holds them", dir, named, dir, present, named);
    return -EILSEQ;
}
