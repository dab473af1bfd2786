/* nbd_memcache.c - the memcached:// block device backend (the paper's): memcached's
 * meta text protocol over the network client of nbd_netkv.c. GET is "mg KEY v"
 * (VA n / EN: an absent block reads as zeros), PUT "ms KEY n" + the block (HD),
 * DEL "md KEY" (HD / NF). Replies come in request order (no quiet mode, so every
 * request has one). memcached may evict a block under memory pressure (it is a
 * cache: run it with -M) and cannot make writes durable. Runs on the context's NBD
 * thread; replies are untrusted (bounded by nbd_netkv.c's line and payload rules).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "frontend/nbd_netkv.h"

#define MC_KEY_MAX 250          /* memcached's KEY_MAX_LENGTH */
#define MC_MAX_VALUE (1L << 30)


static void mc_encode(struct nk_conn *c, struct nbd_kvop *op, const char *key, int klen)
{
    char h[MC_KEY_MAX + NBD_META_MAX + 64];
    char *p = h;
    switch (op->kind) {
    case NBD_KV_GET:
    case NK_OP_META_GET: /* the device's record: its key is given as a block's */
        p = nk_put_str(p, "mg ", 3);
        p = nk_put_str(p, key, (size_t)klen);
        p = nk_put_str(p, " v\r\n", 4);
        break;
    case NBD_KV_DEL:
        p = nk_put_str(p, "md ", 3);
        p = nk_put_str(p, key, (size_t)klen);
        p = nk_put_str(p, "\r\n", 2);
        break;
    case NBD_KV_PUT: /* the header, then the block itself (not copied), then CRLF */
        p = nk_put_str(p, "ms ", 3);
        p = nk_put_str(p, key, (size_t)klen);
        *p++ = ' ';
        p = nk_put_num(p, nk_conn_block_size(c));
        p = nk_put_str(p, "\r\n", 2);
        nk_out_block(c, h, (size_t)(p - h), op->buf);
        return;
    case NK_OP_VERSION:
        p = nk_put_str(p, "version\r\n", 9);
        break;
    case NK_OP_META_SET: {
        size_t n = strlen(op->buf); /* at most NBD_META_MAX bytes */
        p = nk_put_str(p, "ms ", 3);
        p = nk_put_str(p, key, (size_t)klen);
        *p++ = ' ';
        p = nk_put_num(p, n);
        p = nk_put_str(p, "\r\n", 2);
        p = nk_put_str(p, op->buf, n);
        p = nk_put_str(p, "\r\n", 2);
        break;
    }
    }
    nk_out_copy(c, h, (size_t)(p - h));
}

static void mc_greet(struct nk_conn *c)
{
    (void)c; /* no authentication, no database */
}

static int mc_line(struct nk_conn *c, struct nbd_kvop *op, char *line, size_t len)
{
    if (len >= 2 && (len == 2 || line[2] == ' ')) {
        if (!strncmp(line, "VA", 2)) {
            if (len < 4) /* before strtol: past a bare "VA" are the line's end and bytes not read */
                return NK_LINE_BAD;
            char *end;
            long n = strtol(line + 3, &end, 10);
            if (end == line + 3 || (*end && *end != ' ') || n < 0 || n > MC_MAX_VALUE)
                return NK_LINE_BAD;
            op->rc = op->kind == NBD_KV_GET || op->kind == NK_OP_META_GET ? 0 : -EIO;
            if (op->kind == NK_OP_META_GET)
                op->block = 1; /* there is a record */
            return (int)n; /* nbd_netkv.c checks a block's against the block size */
        }
        if (!strncmp(line, "EN", 2)) { /* miss: an absent block reads as zeros */
            if (op->kind == NBD_KV_GET)
                memset(op->buf, 0, nk_conn_block_size(c));
            op->rc = op->kind == NBD_KV_GET || op->kind == NK_OP_META_GET ? 0 : -EIO;
            return NK_LINE_DONE;
        }
        if (!strncmp(line, "HD", 2)) {
            op->rc = op->kind == NBD_KV_PUT || op->kind == NBD_KV_DEL || op->kind == NK_OP_META_SET ? 0 : -EIO;
            return NK_LINE_DONE;
        }
        if (!strncmp(line, "NF", 2)) { /* md of an absent key: absent is what was asked */
            op->rc = op->kind == NBD_KV_DEL ? 0 : -EIO;
            return NK_LINE_DONE;
        }
        if (!strncmp(line, "NS", 2)) {
            op->rc = -EIO;
            nk_conn_note(c, "ms: not stored");
            return NK_LINE_DONE;
        }
    }
    if (!strncmp(line, "SERVER_ERROR", 12)) { /* memcached skipped the request's data itself */
        op->rc = strstr(line, "out of memory") ? -ENOSPC : -EIO;
        nk_conn_note(c, "%.200s", line);
        return NK_LINE_DONE;
    }
    if (op->kind == NK_OP_VERSION && !strncmp(line, "VERSION ", 8)) {
        int major = 0, minor = 0;
        if (sscanf(line + 8, "%d.%d", &major, &minor) != 2 || major < 1 || (major == 1 && minor < 6)) {
            op->rc = -EPROTONOSUPPORT;
            nk_conn_note(c, "memcached %.32s has no meta commands (mg/ms/md): 1.6 or later is needed", line + 8);
        }
        return NK_LINE_DONE;
    }
    /* CLIENT_ERROR, ERROR, anything else: the stream may be out of step with our requests */
    nk_conn_note(c, "unexpected reply \"%.100s\"", line);
    return NK_LINE_BAD;
}

static int mc_check(const struct nk_url *u, const char *prefix, char *err, size_t errlen)
{
    if (u->has_password) {
        snprintf(err, errlen, "memcached://%s:%d: no password accepted (memcached authenticates with SASL over its "
                 "binary protocol, which this backend does not speak)", u->host, u->port);
        return -EINVAL;
    }
    if (u->db >= 0) {
        snprintf(err, errlen, "memcached://%s:%d/%d: memcached has no databases: expected memcached://HOST:PORT",
                 u->host, u->port, u->db);
        return -EINVAL;
    }
    size_t n = strlen(prefix);
    if (n + 20 > MC_KEY_MAX) {
        snprintf(err, errlen, "key prefix is %zu bytes: memcached keys are at most %d bytes (prefix + 20 digits)", n,
                 MC_KEY_MAX);
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)prefix[i] <= ' ' || prefix[i] == 0x7f) {
            snprintf(err, errlen, "key prefix \"%s\": memcached keys take no spaces or control characters", prefix);
            return -EINVAL;
        }
    return 0;
}

static int memcached_open(void **ctx, const struct nbd_backend_cfg *cfg, char *err, size_t errlen)
{
    int rc = nk_open(ctx, cfg, &nk_proto_memcache, err, errlen);
    if (rc < 0)
        return rc;
    const char *payload;
    rc = nk_call(*ctx, NK_OP_VERSION, &payload, err, errlen);
    if (rc == 0 && cfg->thread == 0)
        rc = nk_check_meta(*ctx, cfg, err, errlen);
    if (rc < 0) {
        nk_close(*ctx);
        *ctx = NULL;
        return rc;
    }
    nk_open_done(*ctx);
    if (cfg->thread == 0)
        kvlog(KVLOG_NOTICE, "blockdev: backend %s: memcached, %d connection(s) per thread (FLUSH completes at once: "
              "memcached keeps blocks in memory only and may evict them: run it with -M)", nk_name(*ctx), cfg->conns);
    return 0;
}

const struct nk_proto nk_proto_memcache = {"memcached", mc_check, mc_encode, mc_greet, mc_line};

const struct nbd_backend_ops nbd_be_memcached = {"memcached", memcached_open, nk_close, nk_submit, nk_flush,
                                                 nk_on_event, nk_pending, nk_add_stats};
