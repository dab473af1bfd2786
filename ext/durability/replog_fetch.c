/* replog_fetch.c - rl_fetch (see replog.h): a recovering node streams its log
 * segments back from a peer into a directory, over a link authenticated both
 * ways (rl_auth_client: the peer proves it holds the pair's secret before any
 * of its segments is written). Runs on the caller's thread, before the log is
 * opened. Frames from the peer are untrusted (rl_recv_frame checks their MACs).
 * With --repl-tls the link runs inside TLS, the peer's certificate verified. */
#define _GNU_SOURCE
#include "durability/replog.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "core/bytes.h"
#include "core/crc32c.h"
#include "core/kvbuf.h"
#include "durability/wal.h"
#include "durability/replog_frame.h"

/* ======================================================================= fetch */

int64_t rl_fetch(const char *host, int port, const uint8_t *key, uint8_t node_id[16], const char *dest_dir,
                 uint32_t timeout_ms, const struct rl_tls_files *tls, char *err, size_t errlen)
{
    struct tls_ctx *ctx = NULL;
    int64_t rc = rl_tls_ctx(&ctx, tls, 0, err, errlen);
    if (rc)
        return rc;
    int fd = rl_connect_to(host, port, (int)timeout_ms, err, errlen);
    if (fd < 0) {
        tls_ctx_free(ctx);
        return fd;
    }
    struct rl_link link;
    rl_link_init(&link, fd, 0);
    struct kvbuf pl = {0};
    char why[400];
    if (ctx)
        rc = rl_link_tls_client(&link, ctx, (int)timeout_ms, why, sizeof why);
    if (!rc)
        rc = rl_auth_client(&link, key, RL_ROLE_FETCH, node_id, (int)timeout_ms, why, sizeof why);
    if (rc) {
        tls_ctx_free(ctx);
        snprintf(err, errlen, "fetching the log from %s:%d: %s", host, port, why);
        rl_link_close(&link);
        return rc == -EACCES ? -EACCES : rc;
    }
    rc = rl_send_frame(&link, F_FETCH, 0, 0, node_id, 16, (int)timeout_ms);
    if (mkdir(dest_dir, 0755) && errno != EEXIST)
        rc = -errno;
    while (!rc) {
        struct frame f;
        rc = rl_recv_frame(&link, &f, &pl, (int)timeout_ms * 10);
        if (rc)
            break;
        if (f.type == F_END) {
            if (pl.len == 16)
                memcpy(node_id, pl.p, 16);
            rc = (int64_t)f.a;
            break;
        }
        if (f.type == F_ERROR) {
            snprintf(err, errlen, "the peer %s:%d refused: %.*s", host, port, (int)pl.len, pl.p);
            kvbuf_free(&pl);
            rl_link_close(&link);
            tls_ctx_free(ctx);
            return -EINVAL;
        }
        if (f.type != F_FILE) {
            rc = -EPROTO;
            break;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/wal-%016" PRIx64 ".log", dest_dir, f.a);
        int out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (out < 0) {
            rc = -errno;
            break;
        }
        rc = wal_write_all(out, pl.p, pl.len);
        if (!rc && fdatasync(out))
            rc = -errno;
        close(out);
    }
    if (rc < 0)
        snprintf(err, errlen, "fetching the log from %s:%d failed: %s", host, port,
                 rc == -EACCES ? "a frame failed its MAC check (altered or replayed)" : strerror((int)-rc));
    kvbuf_free(&pl);
    rl_link_close(&link);
    tls_ctx_free(ctx);
    return rc;
}
