/* tls.c - TLS contexts and connections over OpenSSL (see tls.h).
 * Settings follow Redis 7's defaults: TLS 1.2 and 1.3 only, no compression, no
 * renegotiation, the server's cipher preference, a session cache (resumption
 * saves the certificate exchange). Every OpenSSL error is drained from the
 * thread's error queue into the connection's message right where it happens, so
 * a failure on one connection never shows up as the reason of another's.
 * Threads: contexts made on the control thread, shared read-only; a connection
 * used by one thread at a time. Parses untrusted records (OpenSSL does). */
#define _GNU_SOURCE
#include "core/tls.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

struct tls_psk {
    char id[TLS_PSK_ID_MAX + 1];
    unsigned char key[TLS_PSK_MAX];
    unsigned keylen;
};

struct tls_ctx {
    SSL_CTX *ssl;
    int server;
    struct tls_psk *psk;   /* pre-shared keys (psk_file), sorted by nothing: few */
    int npsk;
};

struct tls_conn {
    SSL *ssl;
    int fd;
    int ready;        /* handshake done */
    char err[160];    /* why the last call failed */
};

/* The thread's OpenSSL error queue as "reason" (the newest), emptied. */
static void drain_errors(char *dst, size_t n, const char *fallback)
{
    unsigned long e, last = 0;
    while ((e = ERR_get_error()) != 0)
        last = e;
    if (last)
        ERR_error_string_n(last, dst, n);
    else
        snprintf(dst, n, "%s", fallback);
}

int tls_auth_parse(const char *s)
{
    if (!s || !strcmp(s, "yes"))
        return TLS_AUTH_YES;
    if (!strcmp(s, "no"))
        return TLS_AUTH_NO;
    if (!strcmp(s, "optional"))
        return TLS_AUTH_OPTIONAL;
    return -EINVAL;
}

static int fail(char *err, size_t errlen, const char *what, const char *file)
{
    char why[128];
    drain_errors(why, sizeof why, "unknown error");
    snprintf(err, errlen, "%s %s: %s", what, file, why);
    return -EINVAL;
}

#define TLS_PSK_LINES 4096 /* keys one file may hold */

static int hexval(int ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
         : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* psk_file's "identity:hexkey" lines into c->psk (blank lines and # comments
 * skipped). 0 or -EINVAL with the file and line named in err. */
static int load_psk(struct tls_ctx *c, const char *file, char *err, size_t errlen)
{
    FILE *f = fopen(file, "re");
    if (!f)
        return snprintf(err, errlen, "cannot open PSK file %s: %s", file, strerror(errno)), -EINVAL;
    char line[512];
    int no = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        no++;
        size_t n = strlen(line);
        if (n == sizeof line - 1 && line[n - 1] != '\n') {
            rc = snprintf(err, errlen, "PSK file %s line %d: longer than %zu bytes", file, no, sizeof line - 2);
            break;
        }
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' '))
            line[--n] = 0;
        if (!n || line[0] == '#')
            continue;
        char *colon = strrchr(line, ':');
        size_t idlen = colon ? (size_t)(colon - line) : 0, hexlen = colon ? strlen(colon + 1) : 0;
        if (!colon || !idlen || idlen > TLS_PSK_ID_MAX || !hexlen || hexlen % 2 || hexlen > 2 * TLS_PSK_MAX) {
            rc = snprintf(err, errlen, "PSK file %s line %d: expected IDENTITY:HEXKEY (identity 1 to %d bytes, key "
                                       "1 to %d bytes in hex, as `psktool -u IDENTITY -p FILE` writes)",
                          file, no, TLS_PSK_ID_MAX, TLS_PSK_MAX);
            break;
        }
        if (c->npsk == TLS_PSK_LINES) {
            rc = snprintf(err, errlen, "PSK file %s: more than %d keys", file, TLS_PSK_LINES);
            break;
        }
        struct tls_psk *p = realloc(c->psk, (size_t)(c->npsk + 1) * sizeof *p);
        if (!p) {
            rc = snprintf(err, errlen, "out of memory");
            break;
        }
        c->psk = p;
        p += c->npsk;
        memcpy(p->id, line, idlen);
        p->id[idlen] = 0;
        p->keylen = (unsigned)(hexlen / 2);
        for (size_t i = 0; i < hexlen / 2; i++) {
            int hi = hexval(colon[1 + 2 * i]), lo = hexval(colon[2 + 2 * i]);
            if (hi < 0 || lo < 0) {
                rc = snprintf(err, errlen, "PSK file %s line %d: the key is not hexadecimal", file, no);
                break;
            }
            p->key[i] = (unsigned char)(hi << 4 | lo);
        }
        if (rc)
            break;
        c->npsk++;
    }
    fclose(f);
    if (!rc && !c->npsk)
        rc = snprintf(err, errlen, "PSK file %s: no keys", file);
    return rc ? -EINVAL : 0;
}

/* OpenSSL asks for identity's key (TLS 1.2 PSK suites, and TLS 1.3 external PSKs
 * with SHA-256): its length, or 0 for an unknown identity (the handshake fails). */
static unsigned int psk_server_cb(SSL *ssl, const char *identity, unsigned char *psk, unsigned int max)
{
    const struct tls_ctx *c = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    for (int i = 0; identity && c && i < c->npsk; i++) {
        if (strcmp(c->psk[i].id, identity) == 0 && c->psk[i].keylen <= max) {
            memcpy(psk, c->psk[i].key, c->psk[i].keylen);
            return c->psk[i].keylen;
        }
    }
    return 0;
}

int tls_ctx_new(struct tls_ctx **out, const struct tls_opts *o, char *err, size_t errlen)
{
    int psk = o->server && o->psk_file && *o->psk_file;
    if (psk && o->auth != TLS_AUTH_NO) {
        snprintf(err, errlen, "with a PSK file the key authenticates the client: tls-auth-clients must be no");
        return -EINVAL;
    }
    *out = NULL;
    ERR_clear_error();
    if (o->server && !psk && (!o->cert_file || !*o->cert_file || !o->key_file || !*o->key_file)) {
        snprintf(err, errlen, "a TLS server needs tls-cert-file and tls-key-file");
        return -EINVAL;
    }
    int need_ca = o->server ? o->auth != TLS_AUTH_NO : 1;
    if (need_ca && (!o->ca_file || !*o->ca_file)) {
        snprintf(err, errlen, o->server ? "tls-ca-cert-file must be specified when tls-auth-clients is yes or "
                                          "optional (or set tls-auth-clients no)"
                                        : "a TLS client needs a CA certificate file to verify its peer");
        return -EINVAL;
    }
    struct tls_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    c->server = o->server;
    c->ssl = SSL_CTX_new(o->server ? TLS_server_method() : TLS_client_method());
    if (!c->ssl) {
        free(c);
        return fail(err, errlen, "cannot create a TLS context", "");
    }
    SSL_CTX_set_min_proto_version(c->ssl, TLS1_2_VERSION);
    SSL_CTX_set_options(c->ssl, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
    /* a peer that closes the socket without close_notify ends the stream (read 0),
     * as with a plain socket, instead of failing it */
    SSL_CTX_set_options(c->ssl, SSL_OP_IGNORE_UNEXPECTED_EOF);
#endif
    /* Partial writes: a poller writes what the socket takes and keeps the rest in
     * its own buffer, which may move (grow) before the write is repeated. */
    SSL_CTX_set_mode(c->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_clear_mode(c->ssl, SSL_MODE_AUTO_RETRY); /* non-blocking callers want WANT_READ back */
    if (psk) {
        int rc = load_psk(c, o->psk_file, err, errlen);
        if (rc < 0) {
            tls_ctx_free(c);
            return rc;
        }
        SSL_CTX_set_app_data(c->ssl, c);
        SSL_CTX_set_psk_server_callback(c->ssl, psk_server_cb);
        /* TLS 1.2 clients need the PSK suites (TLS 1.3 uses its own with the key) */
        SSL_CTX_set_cipher_list(c->ssl, "PSK:DEFAULT");
    }
    if (o->server) {
        static const unsigned char sid[] = "kvstore";
        SSL_CTX_set_session_cache_mode(c->ssl, SSL_SESS_CACHE_SERVER);
        SSL_CTX_set_session_id_context(c->ssl, sid, sizeof sid - 1);
    }
    if (o->cert_file && *o->cert_file) {
        if (SSL_CTX_use_certificate_chain_file(c->ssl, o->cert_file) != 1) {
            tls_ctx_free(c);
            return fail(err, errlen, "cannot load certificate", o->cert_file);
        }
        if (SSL_CTX_use_PrivateKey_file(c->ssl, o->key_file ? o->key_file : o->cert_file, SSL_FILETYPE_PEM) != 1) {
            tls_ctx_free(c);
            return fail(err, errlen, "cannot load private key", o->key_file ? o->key_file : o->cert_file);
        }
        if (SSL_CTX_check_private_key(c->ssl) != 1) {
            tls_ctx_free(c);
            return fail(err, errlen, "private key does not match the certificate", o->cert_file);
        }
    }
    if (o->ca_file && *o->ca_file && SSL_CTX_load_verify_locations(c->ssl, o->ca_file, NULL) != 1) {
        tls_ctx_free(c);
        return fail(err, errlen, "cannot load CA certificate(s)", o->ca_file);
    }
    int mode = SSL_VERIFY_PEER;
    if (o->server)
        mode = o->auth == TLS_AUTH_NO ? SSL_VERIFY_NONE
             : o->auth == TLS_AUTH_YES ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : SSL_VERIFY_PEER;
    SSL_CTX_set_verify(c->ssl, mode, NULL);
    *out = c;
    return 0;
}

void tls_ctx_free(struct tls_ctx *c)
{
    if (!c)
        return;
    SSL_CTX_free(c->ssl);
    if (c->psk)
        OPENSSL_cleanse(c->psk, (size_t)c->npsk * sizeof *c->psk);
    free(c->psk);
    free(c);
}

struct tls_conn *tls_conn_new(struct tls_ctx *c, int fd)
{
    struct tls_conn *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->ssl = SSL_new(c->ssl);
    if (!t->ssl || SSL_set_fd(t->ssl, fd) != 1) {
        ERR_clear_error();
        SSL_free(t->ssl);
        free(t);
        return NULL;
    }
    t->fd = fd;
    if (c->server)
        SSL_set_accept_state(t->ssl);
    else
        SSL_set_connect_state(t->ssl);
    return t;
}

void tls_conn_free(struct tls_conn *t)
{
    if (!t)
        return;
    if (t->ready) {
        /* close_notify, best effort: the socket is closed right after, whatever
         * the peer does (SSL_shutdown never waits for its answer here). */
        SSL_set_quiet_shutdown(t->ssl, 0);
        SSL_shutdown(t->ssl);
    }
    ERR_clear_error();
    SSL_free(t->ssl);
    free(t);
}

/* The outcome r of an SSL_* call as tls.h's codes; the reason kept in t->err. */
static int outcome(struct tls_conn *t, int r, const char *op)
{
    int e = SSL_get_error(t->ssl, r);
    int sys = errno;
    switch (e) {
    case SSL_ERROR_WANT_READ:
        return -EAGAIN;
    case SSL_ERROR_WANT_WRITE:
        return TLS_WANT_WRITE;
    case SSL_ERROR_ZERO_RETURN:
        snprintf(t->err, sizeof t->err, "%s: the peer closed the TLS session", op);
        ERR_clear_error();
        return 0;
    case SSL_ERROR_SYSCALL:
        if (ERR_peek_error() == 0) {
            /* EOF without close_notify (OpenSSL 3 reports it as SSL_ERROR_SSL with
             * "unexpected eof"; older ones here), or a socket error. */
            snprintf(t->err, sizeof t->err, "%s: %s", op, sys ? strerror(sys) : "unexpected EOF");
            t->ready = 0; /* fatal: OpenSSL forbids SSL_shutdown after it (tls_conn_free) */
            return sys ? -sys : -ECONNRESET;
        }
        /* fall through */
    default: {
        t->ready = 0; /* fatal, as above */
        char why[128];
        drain_errors(why, sizeof why, "protocol error");
        long v = SSL_get_verify_result(t->ssl);
        if (v != X509_V_OK)
            snprintf(t->err, sizeof t->err, "%s: %s (%s)", op, why, X509_verify_cert_error_string(v));
        else
            snprintf(t->err, sizeof t->err, "%s: %s", op, why);
        return -EPROTO;
    }
    }
}

int tls_handshake(struct tls_conn *t)
{
    if (t->ready)
        return 0;
    ERR_clear_error();
    int r = SSL_do_handshake(t->ssl);
    if (r == 1) {
        t->ready = 1;
        return 0;
    }
    int rc = outcome(t, r, "TLS handshake");
    return rc == 0 ? -ECONNRESET : rc;
}

/* One SSL_read_ex (out 0) or SSL_write_ex (out 1), the handshake first if not done. */
static ssize_t transfer(struct tls_conn *t, void *buf, size_t n, int out)
{
    if (!t->ready) {
        int rc = tls_handshake(t);
        if (rc < 0)
            return rc;
    }
    ERR_clear_error();
    size_t done = 0;
    int r = out ? SSL_write_ex(t->ssl, buf, n, &done) : SSL_read_ex(t->ssl, buf, n, &done);
    if (r == 1)
        return (ssize_t)done;
    int rc = outcome(t, r, out ? "TLS write" : "TLS read");
    if (out)
        return rc == 0 ? -EPIPE : rc;
    return rc == -ECONNRESET ? 0 : rc; /* an EOF without close_notify ends the stream too */
}

ssize_t tls_read(struct tls_conn *t, void *buf, size_t n) { return transfer(t, buf, n, 0); }

ssize_t tls_write(struct tls_conn *t, const void *buf, size_t n)
{
    return transfer(t, (void *)buf, n, 1); /* only read from when out */
}

/* ---- blocking */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait until the socket is ready for what rc asked (-EAGAIN: readable,
 * TLS_WANT_WRITE: writable), at most timeout_ms (< 0: forever). 0 or -ETIMEDOUT. */
static int wait_for(struct tls_conn *t, int rc, int timeout_ms)
{
    struct pollfd p = {.fd = t->fd, .events = rc == TLS_WANT_WRITE ? POLLOUT : POLLIN};
    for (;;) {
        int r = poll(&p, 1, timeout_ms);
        if (r > 0)
            return 0;
        if (r == 0) {
            snprintf(t->err, sizeof t->err, "TLS: no progress for %d ms", timeout_ms);
            return -ETIMEDOUT;
        }
        if (errno != EINTR)
            return -errno;
    }
}

int tls_handshake_wait(struct tls_conn *t, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;
    for (;;) {
        int rc = tls_handshake(t);
        if (rc != -EAGAIN && rc != TLS_WANT_WRITE)
            return rc;
        int64_t left = end - now_ms();
        if (left <= 0 || (rc = wait_for(t, rc, (int)left)) < 0) {
            snprintf(t->err, sizeof t->err, "TLS handshake: no answer within %d ms", timeout_ms);
            return -ETIMEDOUT;
        }
    }
}

/* Exactly n bytes through tls_read (out 0) or tls_write (out 1), waiting as needed. */
static int move_all(struct tls_conn *t, char *buf, size_t n, int timeout_ms, int out)
{
    size_t off = 0;
    while (off < n) {
        ssize_t r = out ? tls_write(t, buf + off, n - off) : tls_read(t, buf + off, n - off);
        if (r > 0) {
            off += (size_t)r;
        } else if (r == -EAGAIN || r == TLS_WANT_WRITE) {
            int rc = wait_for(t, (int)r, timeout_ms);
            if (rc < 0)
                return rc;
        } else {
            return r == 0 ? (out ? -EPIPE : -ECONNRESET) : (int)r;
        }
    }
    return 0;
}

int tls_read_full(struct tls_conn *t, void *buf, size_t n, int timeout_ms) { return move_all(t, buf, n, timeout_ms, 0); }

int tls_write_all(struct tls_conn *t, const void *buf, size_t n, int timeout_ms)
{
    return move_all(t, (char *)buf, n, timeout_ms, 1); /* only read from when out */
}

/* ---- about a connection */

const char *tls_conn_error(const struct tls_conn *t) { return t->err; }
int tls_conn_ready(const struct tls_conn *t) { return t->ready; }
const char *tls_conn_version(const struct tls_conn *t) { return t->ready ? SSL_get_version(t->ssl) : ""; }

const char *tls_conn_cipher(const struct tls_conn *t)
{
    const char *c = t->ready ? SSL_get_cipher_name(t->ssl) : NULL;
    return c ? c : "";
}
