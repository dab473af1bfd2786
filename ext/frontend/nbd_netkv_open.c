/* nbd_netkv_open.c - the network backends' client: the URL, open and close (see
 * nbd_netkv.c). Control thread, before the context's NBD thread starts or after it
 * stopped. The URL is user input: every part is checked, with what is accepted.
 */
#include "frontend/nbd_netkv_int.h"

#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "core/log.h"

/* ---------------------------------------------------------------- open / close */

/* Run c's queue to completion with poll() (open: before the thread's loop runs):
 * 0, or -errno with the reason in err. */
static int run_sync(struct nk_conn *c, char *err, size_t errlen)
{
    struct nk_ctx *x = c->ctx;
    uint64_t deadline = nk_now_ms() + NK_OPEN_TIMEOUT_MS;
    nk_flush_conn(c);
    while (!c->broken && (c->inflight.head || c->sendq.head)) {
        uint64_t now = nk_now_ms();
        if (now >= deadline) {
            snprintf(err, errlen, "%s: no reply within %d ms", x->name, NK_OPEN_TIMEOUT_MS);
            return -ETIMEDOUT;
        }
        struct pollfd pfd = {c->fd, (short)(POLLIN | (c->seg_pos < c->nseg ? POLLOUT : 0)), 0};
        int n = poll(&pfd, 1, (int)(deadline - now));
        if (n < 0 && errno != EINTR) {
            snprintf(err, errlen, "%s: poll: %s", x->name, strerror(errno));
            return -errno;
        }
        if (n <= 0)
            continue;
        if (pfd.revents & POLLOUT) {
            int rc = nk_write_out(c);
            if (rc < 0) {
                snprintf(err, errlen, "%s: write: %s", x->name, strerror(-rc));
                return rc;
            }
        }
        if (pfd.revents & (POLLIN | POLLERR | POLLHUP)) {
            int rc = nk_read_in(c);
            if (rc < 0 && !c->note[0])
                nk_conn_note(c, "%s", rc == -ECONNRESET ? "the server closed the connection" : strerror(-rc));
            if (rc < 0) {
                c->broken = 1;
                c->fail_rc = c->fail_rc ? c->fail_rc : rc;
            }
        }
    }
    if (c->broken) {
        snprintf(err, errlen, "%s: %s", x->name, c->note[0] ? c->note : "connection failed");
        return c->fail_rc ? c->fail_rc : -ECONNRESET;
    }
    return 0;
}

/* Connect c, blocking up to the open timeout, and greet. */
static int conn_open(struct nk_conn *c, char *err, size_t errlen)
{
    struct nk_ctx *x = c->ctx;
    int rc = nk_conn_start(c);
    if (rc == 0 && c->state == NK_CONNECTING) {
        struct pollfd pfd = {c->fd, POLLOUT, 0};
        int n = poll(&pfd, 1, NK_OPEN_TIMEOUT_MS);
        int e = 0;
        socklen_t len = sizeof e;
        if (n == 0)
            e = ETIMEDOUT;
        else if (n < 0 || getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0)
            e = errno;
        rc = -e;
    }
    if (rc < 0) {
        snprintf(err, errlen, "cannot connect to %s: %s", x->name, strerror(-rc));
        return rc;
    }
    nk_conn_up(c);
    return run_sync(c, err, errlen);
}

/* Resolve the URL's host (a numeric address or a name) once, at open. */
static int resolve(struct nk_ctx *x, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", x->url.port);
    int rc = getaddrinfo(x->url.host, port, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, errlen, "%s: cannot resolve host \"%s\": %s", x->name, x->url.host, gai_strerror(rc));
        return -EHOSTUNREACH;
    }
    memcpy(&x->addr, res->ai_addr, res->ai_addrlen);
    x->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int nk_call(void *ctx, int kind, const char **payload, char *err, size_t errlen)
{
    struct nk_ctx *x = ctx;
    struct nk_conn *c = &x->conns[0];
    if (kind >= 0) /* -1: what is queued already */
        nk_queue_internal(c, kind);
    int rc = run_sync(c, err, errlen);
    *payload = x->scratch ? x->scratch : "";
    return rc;
}

int nk_open(void **ctxp, const struct nbd_backend_cfg *cfg, const struct nk_proto *proto, char *err, size_t errlen)
{
    struct nk_ctx *x = calloc(1, sizeof *x);
    if (!x) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    x->evfd = x->tfd = x->epfd = -1;
    x->proto = proto;
    x->thread = cfg->thread;
    x->block_size = cfg->block_size;
    int rc = nk_parse_url(cfg->url, &x->url, err, errlen);
    if (rc < 0)
        goto fail;
    if (strcmp(x->url.scheme, proto->scheme)) {
        snprintf(err, errlen, "a %s:// URL given to the %s backend", x->url.scheme, proto->scheme);
        rc = -EINVAL;
        goto fail;
    }
    int v6 = strchr(x->url.host, ':') != NULL;
    snprintf(x->name, sizeof x->name, "%s://%s%s%s:%d", x->url.scheme, v6 ? "[" : "", x->url.host, v6 ? "]" : "",
             x->url.port);
    const char *prefix = cfg->key_prefix ? cfg->key_prefix : "";
    x->prefix_len = strlen(prefix);
    if (x->prefix_len > NK_KEY_MAX) {
        snprintf(err, errlen, "key prefix is %zu bytes long: at most %d", x->prefix_len, NK_KEY_MAX);
        rc = -EINVAL;
        goto fail;
    }
    if ((rc = proto->check(&x->url, prefix, err, errlen)) < 0)
        goto fail;
    if (cfg->conns < 1 || cfg->conns > 1024) {
        snprintf(err, errlen, "connections per thread: %d, expected 1 to 1024", cfg->conns);
        rc = -EINVAL;
        goto fail;
    }
    x->prefix = strdup(prefix);
    x->nconns = cfg->conns;
    x->conns = calloc((size_t)x->nconns, sizeof *x->conns);
    x->scratch = malloc(NK_SCRATCH);
    if (!x->prefix || !x->conns || !x->scratch) {
        snprintf(err, errlen, "out of memory");
        rc = -ENOMEM;
        goto fail;
    }
    for (int i = 0; i < x->nconns; i++) {
        struct nk_conn *c = &x->conns[i];
        c->w = (struct nbd_watch){NBD_WATCH_BACKEND, x};
        c->ctx = x;
        c->idx = i;
        c->fd = -1;
        c->backoff_ms = NK_BACKOFF_MIN_MS;
        if (!(c->in = malloc(NK_INBUF))) {
            snprintf(err, errlen, "out of memory");
            rc = -ENOMEM;
            goto fail;
        }
    }
    if ((rc = resolve(x, err, errlen)) < 0)
        goto fail;
    for (int i = 0; i < x->nconns; i++)
        if ((rc = conn_open(&x->conns[i], err, errlen)) < 0)
            goto fail;
    x->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    x->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (x->evfd < 0 || x->tfd < 0) {
        rc = -errno;
        snprintf(err, errlen, "eventfd/timerfd: %s", strerror(errno));
        goto fail;
    }
    x->evw = (struct nbd_watch){NBD_WATCH_BACKEND, x};
    x->tw = (struct nbd_watch){NBD_WATCH_BACKEND, x};
    struct epoll_event e1 = {.events = EPOLLIN, .data.ptr = &x->evw};
    struct epoll_event e2 = {.events = EPOLLIN, .data.ptr = &x->tw};
    if (epoll_ctl(cfg->epfd, EPOLL_CTL_ADD, x->evfd, &e1) < 0 || epoll_ctl(cfg->epfd, EPOLL_CTL_ADD, x->tfd, &e2) < 0) {
        rc = -errno;
        snprintf(err, errlen, "epoll_ctl: %s", strerror(errno));
        goto fail;
    }
    x->epfd = cfg->epfd;
    for (int i = 0; i < x->nconns; i++)
        nk_set_interest(&x->conns[i], EPOLLIN);
    *ctxp = x;
    return 0;
fail:
    nk_close(x);
    return rc;
}

int nk_check_meta(void *ctx, const struct nbd_backend_cfg *cfg, char *err, size_t errlen)
{
    struct nk_ctx *x = ctx;
    const char *have;
    struct nk_conn *c = &x->conns[0];
    x->scratch[0] = 0;
    int rc = nk_call(ctx, NK_OP_META_GET, &have, err, errlen);
    if (rc < 0)
        return rc;
    char rec[NBD_META_MAX + 1];
    uint64_t found = c->iops[NK_OP_META_GET - NK_OP_AUTH].block; /* the protocol's line said so */
    if (found == 2) { /* as the embedded backend does on a node still loading */
        kvlog(KVLOG_WARNING, "blockdev: backend %s is loading its data: the device's size and block size are not "
                             "checked against the record in the store", x->name);
        return 0;
    }
    rc = nbd_meta_check(found ? have : NULL, strlen(have), cfg, rec, sizeof rec, err, errlen);
    if (rc <= 0)
        return rc;
    nk_queue_internal(c, NK_OP_META_SET);
    c->iops[NK_OP_META_SET - NK_OP_AUTH].buf = rec;
    return nk_call(ctx, -1, &have, err, errlen);
}

/* The open-time checks are done: the scratch buffer is not needed any more. */
void nk_open_done(void *ctx)
{
    struct nk_ctx *x = ctx;
    free(x->scratch);
    x->scratch = NULL;
}

const char *nk_name(void *ctx)
{
    return ((struct nk_ctx *)ctx)->name;
}

void nk_close(void *ctx)
{
    struct nk_ctx *x = ctx;
    if (!x)
        return;
    for (int i = 0; x->conns && i < x->nconns; i++) {
        struct nk_conn *c = &x->conns[i];
        if (c->fd >= 0) {
            if (c->events && x->epfd >= 0)
                epoll_ctl(x->epfd, EPOLL_CTL_DEL, c->fd, NULL);
            close(c->fd);
        }
        free(c->in);
        free(c->out);
        free(c->segs);
    }
    if (x->evfd >= 0) {
        if (x->epfd >= 0)
            epoll_ctl(x->epfd, EPOLL_CTL_DEL, x->evfd, NULL);
        close(x->evfd);
    }
    if (x->tfd >= 0) {
        if (x->epfd >= 0)
            epoll_ctl(x->epfd, EPOLL_CTL_DEL, x->tfd, NULL);
        close(x->tfd);
    }
    free(x->conns);
    free(x->prefix);
    free(x->scratch);
    free(x);
}

/* ---------------------------------------------------------------- the URL */

static const struct {
    const char *scheme;
    int port;
} url_schemes[] = {{"kvstore", 6380}, {"redis", 6379}, {"memcached", 11211}};

/* Copy [s, e) into dst (cap bytes), %XX decoded; -1 if it does not fit or a %
 * escape is malformed. */
static int copy_part(char *dst, size_t cap, const char *s, const char *e)
{
    size_t n = 0;
    for (; s < e; s++) {
        char ch = *s;
        if (ch == '%') {
            unsigned v;
            if (e - s < 3 || sscanf(s + 1, "%2x", &v) != 1 || !isxdigit((unsigned char)s[1]) ||
                !isxdigit((unsigned char)s[2]) || v == 0)
                return -1;
            ch = (char)v;
            s += 2;
        }
        if (n + 1 >= cap)
            return -1;
        dst[n++] = ch;
    }
    dst[n] = 0;
    return 0;
}

/* A decimal number in [s, e) within [lo, hi]: 0, or -1. */
static int parse_num(const char *s, const char *e, long lo, long hi, int *out)
{
    if (s == e || e - s > 10)
        return -1;
    long v = 0;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (*s - '0');
    }
    if (v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

#define URL_FORMS "kvstore://[:PASSWORD@]HOST:PORT, redis://[[USER]:PASSWORD@]HOST:PORT[/DB] or memcached://HOST:PORT"

int nk_parse_url(const char *url, struct nk_url *u, char *err, size_t errlen)
{
    memset(u, 0, sizeof *u);
    u->db = -1;
    if (!url || !*url) {
        snprintf(err, errlen, "backend URL is empty: expected embedded, " URL_FORMS);
        return -EINVAL;
    }
    const char *sep = strstr(url, "://");
    size_t slen = sep ? (size_t)(sep - url) : 0;
    int known = -1;
    for (size_t i = 0; sep && i < sizeof url_schemes / sizeof url_schemes[0]; i++)
        if (strlen(url_schemes[i].scheme) == slen && !strncmp(url, url_schemes[i].scheme, slen))
            known = (int)i;
    if (known < 0) {
        size_t shown = sep ? slen : strcspn(url, ":@"); /* never the credentials */
        snprintf(err, errlen, "backend \"%.*s%s\": unknown scheme: expected embedded, " URL_FORMS,
                 (int)(shown > 64 ? 64 : shown), url, sep ? "://..." : "");
        return -EINVAL;
    }
    snprintf(u->scheme, sizeof u->scheme, "%s", url_schemes[known].scheme);
    /* messages show the URL without its credentials */
    char shown[NK_HOST_MAX + 64];
    const char *cred_end = strrchr(sep + 3, '@');
    snprintf(shown, sizeof shown, "%s://%s%.*s", u->scheme, cred_end ? "***@" : "", NK_HOST_MAX,
             cred_end ? cred_end + 1 : sep + 3);
    url = shown;
    u->port = url_schemes[known].port;
    const char *s = sep + 3, *end = s + strlen(s);
    const char *slash = memchr(s, '/', (size_t)(end - s));
    const char *auth_end = slash ? slash : end;
    const char *at = NULL;
    for (const char *p = s; p < auth_end; p++)
        if (*p == '@')
            at = p; /* the last '@': a password may hold one, percent-encoded or not */
    if (at) {
        const char *colon = memchr(s, ':', (size_t)(at - s));
        if (!colon) {
            snprintf(err, errlen, "backend \"%.200s\": credentials without a ':' before '@': expected [USER]:PASSWORD@",
                     url);
            return -EINVAL;
        }
        if (copy_part(u->user, sizeof u->user, s, colon) < 0 ||
            copy_part(u->password, sizeof u->password, colon + 1, at) < 0) {
            snprintf(err, errlen, "backend \"%.200s\": user or password too long (at most %d bytes) or a bad %% escape",
                     url, NK_CRED_MAX - 1);
            return -EINVAL;
        }
        u->has_password = 1;
        s = at + 1;
    }
    const char *host_end, *port_at = NULL;
    if (*s == '[') {
        const char *close = memchr(s, ']', (size_t)(auth_end - s));
        if (!close) {
            snprintf(err, errlen, "backend \"%.200s\": '[' without ']' around an IPv6 address", url);
            return -EINVAL;
        }
        if (copy_part(u->host, sizeof u->host, s + 1, close) < 0) {
            snprintf(err, errlen, "backend \"%.200s\": host too long", url);
            return -EINVAL;
        }
        host_end = close + 1;
        if (host_end < auth_end && *host_end != ':') {
            snprintf(err, errlen, "backend \"%.200s\": expected ':PORT' after ']'", url);
            return -EINVAL;
        }
    } else {
        host_end = memchr(s, ':', (size_t)(auth_end - s));
        if (!host_end)
            host_end = auth_end;
        if (host_end - s >= NK_HOST_MAX || copy_part(u->host, sizeof u->host, s, host_end) < 0) {
            snprintf(err, errlen, "backend \"%.200s\": host too long (at most %d bytes)", url, NK_HOST_MAX - 1);
            return -EINVAL;
        }
    }
    if (!u->host[0]) {
        snprintf(err, errlen, "backend \"%.200s\": no host: expected %s://HOST:PORT", url, u->scheme);
        return -EINVAL;
    }
    if (host_end < auth_end)
        port_at = host_end + 1;
    if (port_at && parse_num(port_at, auth_end, 1, 65535, &u->port) < 0) {
        snprintf(err, errlen, "backend \"%.200s\": port \"%.*s\": expected a number from 1 to 65535", url,
                 (int)(auth_end - port_at > 32 ? 32 : auth_end - port_at), port_at);
        return -EINVAL;
    }
    if (slash && slash + 1 < end && parse_num(slash + 1, end, 0, 1 << 30, &u->db) < 0) {
        snprintf(err, errlen, "backend \"%.200s\": database \"%.32s\": expected a number (redis://HOST:PORT/DB)", url,
                 slash + 1);
        return -EINVAL;
    }
    return 0;
}
