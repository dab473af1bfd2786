/* nbd_resp.c - the kvstore:// and redis:// block device backends: RESP2 over the
 * network client of nbd_netkv.c. A block is a string key; GET fills the block
 * ($-1, an absent key, reads as zeros), SET stores it, DEL removes it; AUTH and
 * SELECT from the URL open every connection. kvstore:// checks at open that the
 * peer's INFO has kvstore_version and reads its durability mode (a node in disk or
 * remote mode answers a write once it is durable, so SYNC has nothing to wait for);
 * redis:// checks for redis_version. Runs on the context's NBD thread; replies are
 * untrusted (bounded by nbd_netkv.c's line and payload rules).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "frontend/nbd_netkv.h"

/* "$<len>\r\n<s>\r\n" */
static char *put_bulk(char *p, const char *s, size_t n)
{
    *p++ = '$';
    p = nk_put_num(p, n);
    p = nk_put_str(p, "\r\n", 2);
    p = nk_put_str(p, s, n);
    return nk_put_str(p, "\r\n", 2);
}

static void resp_encode(struct nk_conn *c, struct nbd_kvop *op, const char *key, int klen)
{
    char h[2 * NK_CRED_MAX + 600]; /* the key is at most 512 + 20 bytes */
    char *p = h;
    const struct nk_url *u = nk_conn_url(c);
    switch (op->kind) {
    case NBD_KV_GET:
    case NK_OP_META_GET: /* the device's record: its key is given as a block's */
        p = nk_put_str(p, "*2\r\n$3\r\nGET\r\n", 13);
        p = put_bulk(p, key, (size_t)klen);
        break;
    case NBD_KV_DEL:
        p = nk_put_str(p, "*2\r\n$3\r\nDEL\r\n", 13);
        p = put_bulk(p, key, (size_t)klen);
        break;
    case NBD_KV_PUT: /* the header, then the block itself (not copied), then CRLF */
        p = nk_put_str(p, "*3\r\n$3\r\nSET\r\n", 13);
        p = put_bulk(p, key, (size_t)klen);
        *p++ = '$';
        p = nk_put_num(p, nk_conn_block_size(c));
        p = nk_put_str(p, "\r\n", 2);
        nk_out_block(c, h, (size_t)(p - h), op->buf);
        return;
    case NK_OP_AUTH:
        p = nk_put_str(p, u->user[0] ? "*3\r\n$4\r\nAUTH\r\n" : "*2\r\n$4\r\nAUTH\r\n", 14);
        if (u->user[0])
            p = put_bulk(p, u->user, strlen(u->user));
        p = put_bulk(p, u->password, strlen(u->password));
        break;
    case NK_OP_SELECT: {
        char db[16];
        char *e = nk_put_num(db, (uint64_t)u->db);
        p = nk_put_str(p, "*2\r\n$6\r\nSELECT\r\n", 16);
        p = put_bulk(p, db, (size_t)(e - db));
        break;
    }
    case NK_OP_INFO: /* all default sections: Redis before 7 takes one section at most */
        p = nk_put_str(p, "*1\r\n$4\r\nINFO\r\n", 14);
        break;
    case NK_OP_META_SET:
        p = nk_put_str(p, "*3\r\n$3\r\nSET\r\n", 13);
        p = put_bulk(p, key, (size_t)klen);
        p = put_bulk(p, op->buf, strlen(op->buf)); /* at most NBD_META_MAX bytes */
        break;
    }
    nk_out_copy(c, h, (size_t)(p - h));
}

static void resp_greet(struct nk_conn *c)
{
    const struct nk_url *u = nk_conn_url(c);
    if (u->has_password)
        nk_queue_internal(c, NK_OP_AUTH);
    if (u->db >= 0)
        nk_queue_internal(c, NK_OP_SELECT);
}

static const char *kind_name(int kind)
{
    static const char *const names[] = {"GET", "SET", "DEL", "SYNC"};
    switch (kind) {
    case NK_OP_AUTH:
        return "AUTH";
    case NK_OP_SELECT:
        return "SELECT";
    case NK_OP_INFO:
        return "INFO";
    case NK_OP_META_GET:
        return "GET of the device's record";
    case NK_OP_META_SET:
        return "SET of the device's record";
    }
    return kind >= 0 && kind < 4 ? names[kind] : "?";
}

static int resp_line(struct nk_conn *c, struct nbd_kvop *op, char *line, size_t len)
{
    int expect_ok = op->kind == NBD_KV_PUT || op->kind == NK_OP_AUTH || op->kind == NK_OP_SELECT ||
                    op->kind == NK_OP_META_SET;
    switch (line[0]) {
    case '+':
        op->rc = expect_ok ? 0 : -EIO;
        return NK_LINE_DONE;
    case '-':
        if (op->kind == NK_OP_META_GET && !strncmp(line, "-LOADING", 8)) {
            op->block = 2; /* the node is loading its state: it cannot say yet */
            return NK_LINE_DONE;
        }
        op->rc = !strncmp(line, "-OOM", 4) ? -ENOSPC : -EIO;
        nk_conn_note(c, "%s refused: %.200s", kind_name(op->kind), line + 1);
        return NK_LINE_DONE;
    case ':':
        op->rc = op->kind == NBD_KV_DEL ? 0 : -EIO;
        return NK_LINE_DONE;
    case '$': {
        if (!strcmp(line, "$-1")) { /* nil: an absent block reads as zeros */
            if (op->kind == NBD_KV_GET)
                memset(op->buf, 0, nk_conn_block_size(c));
            op->rc = op->kind == NBD_KV_GET || op->kind == NK_OP_META_GET ? 0 : -EIO;
            return NK_LINE_DONE;
        }
        char *end;
        long n = strtol(line + 1, &end, 10);
        if (end == line + 1 || *end || n < 0 || n > RESP_MAX_BULK)
            return NK_LINE_BAD;
        op->rc = op->kind == NBD_KV_GET || op->kind == NK_OP_INFO || op->kind == NK_OP_META_GET ? 0 : -EIO;
        if (op->kind == NK_OP_META_GET)
            op->block = 1; /* there is a record */
        return (int)n; /* nbd_netkv.c checks a GET's length against the block size */
    }
    }
    (void)len;
    return NK_LINE_BAD; /* arrays, maps, RESP3 types: not replies to what we send */
}

static int resp_check(const struct nk_url *u, const char *prefix, char *err, size_t errlen)
{
    if (!strcmp(u->scheme, "kvstore") && u->db > 0) {
        snprintf(err, errlen, "kvstore://%s:%d/%d: a kvstore node has one database (0)", u->host, u->port, u->db);
        return -EINVAL;
    }
    (void)prefix; /* RESP keys are binary-safe */
    return 0;
}

/* "field:value\r\n" of an INFO text: the value into dst, or 0 if absent. */
static int info_field(const char *info, const char *field, char *dst, size_t cap)
{
    size_t fl = strlen(field);
    for (const char *p = info; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (!strncmp(p, field, fl) && p[fl] == ':') {
            size_t n = strcspn(p + fl + 1, "\r\n");
            snprintf(dst, cap, "%.*s", (int)n, p + fl + 1);
            return 1;
        }
    }
    return 0;
}

static int resp_open(void **ctx, const struct nbd_backend_cfg *cfg, const struct nk_proto *proto, char *err,
                     size_t errlen)
{
    int rc = nk_open(ctx, cfg, proto, err, errlen);
    if (rc < 0)
        return rc;
    const char *info;
    char version[64] = "", durability[16] = "";
    rc = nk_call(*ctx, NK_OP_INFO, &info, err, errlen);
    if (rc == 0) {
        int is_kvstore = info_field(info, "kvstore_version", version, sizeof version);
        if (proto == &nk_proto_resp_kvstore && !is_kvstore) {
            snprintf(err, errlen, "%s is not a kvstore node (its INFO has no kvstore_version): for Redis use redis://",
                     nk_name(*ctx));
            rc = -EPROTONOSUPPORT;
        } else if (proto == &nk_proto_resp_redis && !info_field(info, "redis_version", version, sizeof version)) {
            snprintf(err, errlen, "%s does not speak like Redis (its INFO has no redis_version)", nk_name(*ctx));
            rc = -EPROTONOSUPPORT;
        }
        info_field(info, "durability", durability, sizeof durability);
    }
    if (rc == 0 && cfg->thread == 0)
        rc = nk_check_meta(*ctx, cfg, err, errlen);
    if (rc < 0 && strstr(err, "NOAUTH")) {
        size_t n = strlen(err);
        snprintf(err + n, errlen - n, " (give the password in the URL: %s://:PASSWORD@HOST:PORT)",
                 proto == &nk_proto_resp_kvstore ? "kvstore" : "redis");
    }
    if (rc < 0) {
        nk_close(*ctx);
        *ctx = NULL;
        return rc;
    }
    nk_open_done(*ctx);
    if (cfg->thread == 0) {
        if (proto == &nk_proto_resp_kvstore)
            kvlog(KVLOG_NOTICE, "blockdev: backend %s: kvstore %s, durability %s (%s), %d connection(s) per thread",
                  nk_name(*ctx), version, durability[0] ? durability : "?",
                  !strcmp(durability, "disk") || !strcmp(durability, "remote")
                      ? "a write completes once durable there: FLUSH and FUA are durable"
                      : "memory only: FLUSH does not make writes durable",
                  cfg->conns);
        else
            kvlog(KVLOG_NOTICE, "blockdev: backend %s: Redis %s, %d connection(s) per thread (FLUSH completes at "
                  "once: Redis keeps writes in memory, durable only as its own persistence settings say)",
                  nk_name(*ctx), version, cfg->conns);
    }
    return 0;
}

static int kvstore_open(void **ctx, const struct nbd_backend_cfg *cfg, char *err, size_t errlen)
{
    return resp_open(ctx, cfg, &nk_proto_resp_kvstore, err, errlen);
}

static int redis_open(void **ctx, const struct nbd_backend_cfg *cfg, char *err, size_t errlen)
{
    return resp_open(ctx, cfg, &nk_proto_resp_redis, err, errlen);
}

const struct nk_proto nk_proto_resp_kvstore = {"kvstore", resp_check, resp_encode, resp_greet, resp_line};
const struct nk_proto nk_proto_resp_redis = {"redis", resp_check, resp_encode, resp_greet, resp_line};

const struct nbd_backend_ops nbd_be_kvstore = {"kvstore", kvstore_open, nk_close, nk_submit, nk_flush,
                                               nk_on_event, nk_pending, nk_add_stats};
const struct nbd_backend_ops nbd_be_redis = {"redis", redis_open, nk_close, nk_submit, nk_flush,
                                             nk_on_event, nk_pending, nk_add_stats};
