/* replog_auth.c - the handshake that opens every replication connection
 * (REPLICATION.md, "Authentication"): both ends prove they hold the pair's key
 * (SHA-256 of --repl-secret-file) with HMAC-SHA256 over a nonce from each side,
 * the connection's role and the node id it speaks for; the session key that MACs
 * every later frame is derived from the same transcript. Neither proof can be
 * replayed (fresh nonces), reflected (a label per side) or moved to another role
 * or node id (both are covered). Runs on the thread that owns the link. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "core/kvbuf.h"
#include "durability/replog_frame.h"

#define TRANSCRIPT (1 + 16 + 2 * RL_NONCE)

/* HMAC-SHA256(key, label NUL role node_id nonce_c nonce_s). */
static int derive(const unsigned char key[RL_KEY], const char *label, int role, const uint8_t node_id[16],
                  const unsigned char *nonce_c, const unsigned char *nonce_s, unsigned char out[RL_MAC])
{
    unsigned char buf[64 + TRANSCRIPT];
    size_t n = strlen(label) + 1;
    memcpy(buf, label, n);
    buf[n++] = (unsigned char)role;
    memcpy(buf + n, node_id, 16);
    memcpy(buf + n + 16, nonce_c, RL_NONCE);
    memcpy(buf + n + 16 + RL_NONCE, nonce_s, RL_NONCE);
    unsigned int outl = 0;
    unsigned char *r = HMAC(EVP_sha256(), key, RL_KEY, buf, n + TRANSCRIPT - 1, out, &outl);
    return r && outl == RL_MAC ? 0 : -EIO;
}

static const char CLIENT_PROOF[] = "kvstore repl v2 client proof";
static const char SERVER_PROOF[] = "kvstore repl v2 server proof";
static const char SESSION[] = "kvstore repl v2 session key";

/* The next handshake frame, which must be of type with len bytes: 0, -EPROTO,
 * or -EACCES if the peer refused (its ERROR frame's text, shown only, in err). */
static int expect(struct rl_link *l, uint32_t type, uint32_t len, struct kvbuf *pl, int timeout_ms, char *err,
                  size_t errlen)
{
    struct frame f = {0};
    int rc = rl_recv_frame(l, &f, pl, timeout_ms);
    if (!rc && f.type == F_ERROR) {
        snprintf(err, errlen, "the peer refused the connection: %.*s", (int)(pl->len < 300 ? pl->len : 300),
                 pl->len ? pl->p : "");
        return -EACCES;
    }
    return !rc && (f.type != type || pl->len != len) ? -EPROTO : rc;
}

int rl_auth_client(struct rl_link *l, const unsigned char key[RL_KEY], int role, const uint8_t node_id[16],
                   int timeout_ms, char *err, size_t errlen)
{
    unsigned char hello[16 + RL_NONCE], nonce_s[RL_NONCE], proof[RL_MAC], want[RL_MAC], session[RL_KEY];
    struct kvbuf pl = {0};
    int rc = RAND_bytes(hello + 16, RL_NONCE) == 1 ? 0 : -EIO;
    memcpy(hello, node_id, 16);
    if (!rc)
        rc = rl_send_frame(l, F_AUTH_HELLO, RL_VERSION, (uint64_t)role, hello, sizeof hello, timeout_ms);
    if (!rc)
        rc = expect(l, F_AUTH_CHALLENGE, RL_NONCE, &pl, timeout_ms, err, errlen);
    if (!rc) {
        memcpy(nonce_s, pl.p, RL_NONCE);
        rc = derive(key, CLIENT_PROOF, role, node_id, hello + 16, nonce_s, proof);
    }
    if (!rc)
        rc = rl_send_frame(l, F_AUTH_PROOF, 0, 0, proof, RL_MAC, timeout_ms);
    if (!rc)
        rc = expect(l, F_AUTH_PROOF, RL_MAC, &pl, timeout_ms, err, errlen);
    if (!rc)
        rc = derive(key, SERVER_PROOF, role, node_id, hello + 16, nonce_s, want);
    if (!rc && CRYPTO_memcmp(want, pl.p, RL_MAC)) {
        snprintf(err, errlen, "the peer failed to prove that it holds the replication secret (its "
                              "--repl-secret-file differs from this node's, or it is not this node's peer)");
        rc = -EACCES;
    }
    if (!rc)
        rc = derive(key, SESSION, role, node_id, hello + 16, nonce_s, session);
    if (!rc)
        rc = rl_link_set_session(l, session);
    if (rc && rc != -EACCES)
        snprintf(err, errlen, "replication handshake failed: %s", strerror(-rc));
    OPENSSL_cleanse(session, sizeof session);
    kvbuf_free(&pl);
    return rc;
}

/* Refuse: an ERROR frame saying why (the peer shows it), and why in err. */
static int refuse(struct rl_link *l, int rc, const char *why, char *err, size_t errlen)
{
    rl_send_error(l, why);
    snprintf(err, errlen, "%s", why);
    return rc;
}

int rl_auth_server_step(struct rl_link *l, struct rl_auth_state *st, const unsigned char key[RL_KEY],
                        const struct frame *f, const struct kvbuf *pl, char *err, size_t errlen)
{
    if (st->step == 0) {
        if (f->type != F_AUTH_HELLO)
            return refuse(l, -EACCES, "authentication required: this log receiver accepts only peers that "
                                      "prove they hold its --repl-secret-file (protocol 2)", err, errlen);
        if (f->a != RL_VERSION)
            return refuse(l, -EPROTO, "unsupported replication protocol version (this node speaks 2)", err, errlen);
        if ((f->b != RL_ROLE_SENDER && f->b != RL_ROLE_FETCH) || pl->len != 16 + RL_NONCE)
            return refuse(l, -EPROTO, "malformed authentication hello", err, errlen);
        st->role = (int)f->b;
        memcpy(st->node_id, pl->p, 16);
        memcpy(st->nonce_c, pl->p + 16, RL_NONCE);
        if (RAND_bytes(st->nonce_s, RL_NONCE) != 1)
            return refuse(l, -EIO, "cannot make a nonce", err, errlen);
        st->step = 1;
        return rl_send_frame(l, F_AUTH_CHALLENGE, 0, 0, st->nonce_s, RL_NONCE, 1000);
    }
    if (st->step != 1 || f->type != F_AUTH_PROOF || pl->len != RL_MAC)
        return refuse(l, -EPROTO, "authentication proof expected", err, errlen);
    unsigned char want[RL_MAC], proof[RL_MAC], session[RL_KEY];
    if (derive(key, CLIENT_PROOF, st->role, st->node_id, st->nonce_c, st->nonce_s, want) ||
        derive(key, SERVER_PROOF, st->role, st->node_id, st->nonce_c, st->nonce_s, proof) ||
        derive(key, SESSION, st->role, st->node_id, st->nonce_c, st->nonce_s, session))
        return refuse(l, -EIO, "cannot compute the handshake's MACs", err, errlen);
    if (CRYPTO_memcmp(want, pl->p, RL_MAC)) {
        OPENSSL_cleanse(session, sizeof session);
        return refuse(l, -EACCES, "authentication failed: the proof does not match this node's replication "
                                  "secret (--repl-secret-file must be the same file on both nodes)", err, errlen);
    }
    int rc = rl_send_frame(l, F_AUTH_PROOF, 0, 0, proof, RL_MAC, 1000);
    if (!rc)
        rc = rl_link_set_session(l, session);
    OPENSSL_cleanse(session, sizeof session);
    if (rc)
        snprintf(err, errlen, "handshake: %s", strerror(-rc));
    st->step = rc ? 1 : 2;
    return rc;
}
