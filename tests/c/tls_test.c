/* tls_test.c - ext/core/tls.c over a socketpair: a blocking client thread
 * (tls_handshake_wait, tls_write_all, tls_read_full) against a non-blocking
 * server driven by poll() like a poller (tls_read/tls_write with their WANTs,
 * a write repeated with the same bytes), echoing 4 MiB that cross many records
 * and fill the socket; then a client without a certificate refused by a server
 * that requires one, with the reason; the contexts' refusals of missing files.
 * Usage: tls_test CERT_DIR (ca.crt, server.crt/.key, client.crt/.key: kvstore.tlscerts). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/tls.h"
#include "stress.h"

#define TOTAL (4u << 20)

static char dir[512];

static const char *path(const char *name)
{
    static __thread char buf[4][600];
    static __thread int i;
    char *p = buf[i++ & 3];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

struct client_arg {
    struct tls_ctx *ctx;
    int fd;
    unsigned char *data;
    int rc;           /* handshake's result */
    char err[160];
};

static void *client_main(void *p)
{
    struct client_arg *a = p;
    struct tls_conn *t = tls_conn_new(a->ctx, a->fd);
    CHECK(t);
    a->rc = tls_handshake_wait(t, 10000);
    snprintf(a->err, sizeof a->err, "%s", tls_conn_error(t));
    if (a->rc == 0 && a->data) {
        unsigned char *back = malloc(TOTAL);
        CHECK(back);
        CHECK(tls_write_all(t, a->data, TOTAL, 10000) == 0, "%s", tls_conn_error(t));
        CHECK(tls_read_full(t, back, TOTAL, 10000) == 0, "%s", tls_conn_error(t));
        CHECK(memcmp(back, a->data, TOTAL) == 0, "echoed bytes differ");
        free(back);
    } else if (a->rc == 0) {
        unsigned char b;
        a->rc = tls_read_full(t, &b, 1, 10000); /* TLS 1.3: the refusal arrives after the handshake */
        snprintf(a->err, sizeof a->err, "%s", tls_conn_error(t));
    }
    tls_conn_free(t);
    return NULL;
}

static void wait_fd(int fd, ssize_t want)
{
    struct pollfd p = {.fd = fd, .events = want == TLS_WANT_WRITE ? POLLOUT : POLLIN};
    CHECK(poll(&p, 1, 10000) == 1, "no event for 10 s");
}

/* The poller's way: non-blocking reads into room for at least TLS_RECORD_MAX
 * (all 4 MiB first: the blocking client writes everything before it reads),
 * then everything back; a write that stopped is repeated with the same bytes. */
static void serve_echo(struct tls_conn *t, int fd)
{
    unsigned char *buf = malloc(TOTAL);
    CHECK(buf);
    size_t have = 0, sent = 0;
    int writes_stopped = 0;
    while (have < TOTAL) {
        size_t room = TOTAL - have < TLS_RECORD_MAX ? TOTAL - have : TLS_RECORD_MAX;
        ssize_t r = tls_read(t, buf + have, room);
        if (r > 0) {
            have += (size_t)r;
        } else {
            CHECK(r == -EAGAIN || r == TLS_WANT_WRITE, "read: %zd %s", r, tls_conn_error(t));
            wait_fd(fd, r);
        }
    }
    while (sent < have) {
        ssize_t w = tls_write(t, buf + sent, have - sent);
        if (w > 0) {
            sent += (size_t)w;
        } else {
            CHECK(w == TLS_WANT_WRITE || w == -EAGAIN, "write: %zd %s", w, tls_conn_error(t));
            writes_stopped++;
            wait_fd(fd, w);
        }
    }
    CHECK(writes_stopped > 0, "the socket never filled: the repeated write was not exercised");
    printf("echoed %u bytes, %d writes stopped by a full socket, %s %s\n", TOTAL, writes_stopped,
           tls_conn_version(t), tls_conn_cipher(t));
    free(buf);
}

static void pair(int sv[2])
{
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    int small = 16 * 1024; /* a small socket: writes stop part-way */
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    CHECK(fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0);
}

int main(int argc, char **argv)
{
    CHECK(argc == 2, "usage: tls_test CERT_DIR");
    snprintf(dir, sizeof dir, "%s", argv[1]);
    char err[256];
    CHECK(tls_auth_parse("yes") == TLS_AUTH_YES && tls_auth_parse("optional") == TLS_AUTH_OPTIONAL &&
          tls_auth_parse("no") == TLS_AUTH_NO && tls_auth_parse("maybe") == -EINVAL);

    struct tls_ctx *srv, *cli, *anon, *bad;
    struct tls_opts so = {.server = 1, .cert_file = path("server.crt"), .key_file = path("server.key"),
                          .ca_file = path("ca.crt"), .auth = TLS_AUTH_YES};
    CHECK(tls_ctx_new(&srv, &so, err, sizeof err) == 0, "%s", err);
    struct tls_opts co = {.cert_file = path("client.crt"), .key_file = path("client.key"), .ca_file = path("ca.crt")};
    CHECK(tls_ctx_new(&cli, &co, err, sizeof err) == 0, "%s", err);
    struct tls_opts ao = {.ca_file = path("ca.crt")};
    CHECK(tls_ctx_new(&anon, &ao, err, sizeof err) == 0, "%s", err);
    struct tls_opts no_ca = so;
    no_ca.ca_file = NULL;
    CHECK(tls_ctx_new(&bad, &no_ca, err, sizeof err) == -EINVAL && strstr(err, "tls-ca-cert-file"), "%s", err);
    struct tls_opts missing = so;
    missing.cert_file = path("nope.crt");
    CHECK(tls_ctx_new(&bad, &missing, err, sizeof err) == -EINVAL && strstr(err, "cannot load certificate"), "%s",
          err);

    /* 1: echo through a full socket */
    int sv[2];
    pair(sv);
    unsigned char *data = malloc(TOTAL);
    CHECK(data);
    struct rng r;
    rng_seed(&r, 42, 0);
    for (size_t i = 0; i < TOTAL; i++)
        data[i] = (unsigned char)rng_next(&r);
    struct client_arg ca = {.ctx = cli, .fd = sv[1], .data = data};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, client_main, &ca) == 0);
    struct tls_conn *t = tls_conn_new(srv, sv[0]);
    CHECK(t);
    serve_echo(t, sv[0]);
    CHECK(pthread_join(th, NULL) == 0);
    CHECK(ca.rc == 0, "client handshake: %s", ca.err);
    tls_conn_free(t);
    close(sv[0]);
    close(sv[1]);

    /* 2: no client certificate, the server requires one: refused, with the reason */
    pair(sv);
    struct client_arg aa = {.ctx = anon, .fd = sv[1]};
    CHECK(pthread_create(&th, NULL, client_main, &aa) == 0);
    t = tls_conn_new(srv, sv[0]);
    int rc;
    while ((rc = tls_handshake(t)) == -EAGAIN || rc == TLS_WANT_WRITE)
        wait_fd(sv[0], rc);
    CHECK(rc == -EPROTO && strstr(tls_conn_error(t), "certificate"), "%d %s", rc, tls_conn_error(t));
    printf("refused: %s\n", tls_conn_error(t));
    tls_conn_free(t);
    close(sv[0]); /* the client's read ends */
    CHECK(pthread_join(th, NULL) == 0);
    CHECK(aa.rc != 0, "the client was not refused");
    close(sv[1]);

    tls_ctx_free(srv);
    tls_ctx_free(cli);
    tls_ctx_free(anon);
    free(data);
    printf("ok\n");
    return 0;
}
