/* conn.c - connection and server commands: PING, ECHO, QUIT, AUTH, HELLO,
 * SELECT, TIME, INFO (CLIENT is client.c). Runs on front-end threads; arguments are untrusted. */
#define _GNU_SOURCE
#include "cmd/cmd_int.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "core/log.h"
#include "core/table.h"
#include "engine/engine.h"


/* ---- connection / server commands */

int c_ping(struct cmd_client *c, const struct cmd_args *a)
{
    if (a->argc > 2)
        return resp_add_errorf(c->out, "ERR wrong number of arguments for 'ping' command");
    if (a->argc == 2)
        return resp_add_bulk(c->out, a->argv[1], a->argl[1]);
    return kvbuf_append(c->out, "+PONG\r\n", 7);
}

int c_echo(struct cmd_client *c, const struct cmd_args *a)
{
    return resp_add_bulk(c->out, a->argv[1], a->argl[1]);
}

int c_quit(struct cmd_client *c, const struct cmd_args *a)
{
    (void)a;
    c->close_after_reply = 1;
    return cmd_reply_ok(c);
}

/* Compare in time independent of where the first difference is. */
static int secret_eq(const char *a, size_t al, const char *b, size_t bl)
{
    unsigned char d = al != bl;
    for (size_t i = 0; i < al; i++)
        d |= (unsigned char)(a[i] ^ b[i % (bl ? bl : 1)]);
    return d == 0 && al == bl;
}

/* Failed AUTHs one connection may make: the one after it closes the connection.
 * A connection could otherwise pipeline thousands of guesses per round trip; closed
 * after a few, each few guesses cost a new connection (handshake, accept, bounded
 * by maxclients) and reach the log. Not a delay: a poller must never sleep, and a
 * timer per connection would keep an attacker's sockets open longer, not shorter.
 * A person who mistypes a password a few times just connects again (redis-cli
 * does). Redis has no such bound; its answers are otherwise the same. */
#define CMD_AUTH_MAX_FAILURES 5

/* AUTH [user] pass, shared by AUTH and HELLO. Returns 1 ok, 0 replied with an error. */
static int do_auth(struct cmd_client *c, const char *user, size_t ul, const char *pass, size_t pl)
{
    const char *req = c->eng->cfg.requirepass;
    if (!req || !*req) {
        if (!user) {
            cmd_reply_err(c, "ERR AUTH <password> called without any password configured for the "
                         "default user. Are you sure your configuration is correct?");
            return 0;
        }
        /* with no password, the default user accepts any password, as in Redis */
        if (ul == 7 && !memcmp(user, "default", 7))
            return 1;
    } else if ((!user || (ul == 7 && !memcmp(user, "default", 7))) &&
               secret_eq(pass, pl, req, strlen(req))) {
        c->authenticated = 1;
        c->auth_failures = 0;
        return 1;
    }
    static struct kvlog_rate failures = KVLOG_RATE_INIT(5);
    atomic_fetch_add_explicit(&c->eng->auth_denied, 1, memory_order_relaxed);
    kvlog_rated(&failures, KVLOG_WARNING, "AUTH failed for client %s (id %llu)", c->addr, (unsigned long long)c->id);
    cmd_reply_err(c, "WRONGPASS invalid username-password pair or user is disabled.");
    if (++c->auth_failures >= CMD_AUTH_MAX_FAILURES && !c->datagram) {
        static struct kvlog_rate closes = KVLOG_RATE_INIT(5);
        kvlog_rated(&closes, KVLOG_WARNING, "closing client %s (id %llu) after %d failed AUTH attempts", c->addr,
                    (unsigned long long)c->id, c->auth_failures);
        c->close_after_reply = 1;
    }
    return 0;
}

int c_auth(struct cmd_client *c, const struct cmd_args *a)
{
    if (a->argc > 3)
        return cmd_reply_err(c, ERR_SYNTAX);
    int ok = a->argc == 2 ? do_auth(c, NULL, 0, a->argv[1], a->argl[1])
                          : do_auth(c, a->argv[1], a->argl[1], a->argv[2], a->argl[2]);
    return ok ? cmd_reply_ok(c) : 0;
}

int c_hello(struct cmd_client *c, const struct cmd_args *a)
{
    int i = 1, proto = c->resp;
    if (a->argc >= 2) {
        long long ver;
        if (cmd_arg_ll(a, 1, &ver))
            return cmd_reply_err(c, "ERR Protocol version is not an integer or out of range");
        if (ver < 2 || ver > 3)
            return cmd_reply_err(c, "NOPROTO unsupported protocol version");
        proto = (int)ver;
        i = 2;
    }
    const char *name = NULL;
    size_t namel = 0;
    int auth_i = 0;
    for (; i < a->argc; i++) {
        int more = a->argc - i - 1;
        if (ARGIS(a, i, "AUTH") && more >= 2) {
            auth_i = i;
            i += 2;
        } else if (ARGIS(a, i, "SETNAME") && more >= 1) {
            name = a->argv[i + 1];
            namel = a->argl[i + 1];
            i++;
        } else {
            return resp_add_errorf(c->out, "ERR Syntax error in HELLO option '%.*s'",
                                   (int)(a->argl[i] > 128 ? 128 : a->argl[i]), a->argv[i]);
        }
    }
    if (auth_i && !do_auth(c, a->argv[auth_i + 1], a->argl[auth_i + 1], a->argv[auth_i + 2],
                           a->argl[auth_i + 2]))
        return 0;
    if (!c->authenticated)
        return cmd_reply_err(c, "NOAUTH HELLO must be called with the client already authenticated, "
                            "otherwise the HELLO AUTH <user> <pass> option can be used to "
                            "authenticate the client and select the RESP protocol version at the "
                            "same time");
    if (name && !cmd_client_setname(c, name, namel))
        return 0;
    c->resp = proto;
    resp_add_map(c->out, c->resp, 7);
    resp_add_bulk_str(c->out, "server");
    resp_add_bulk_str(c->out, "kvstore");
    resp_add_bulk_str(c->out, "version");
    resp_add_bulk_str(c->out, c->eng->cfg.version);
    resp_add_bulk_str(c->out, "proto");
    resp_add_int(c->out, c->resp);
    resp_add_bulk_str(c->out, "id");
    resp_add_int(c->out, (long long)c->id);
    resp_add_bulk_str(c->out, "mode");
    resp_add_bulk_str(c->out, "standalone");
    resp_add_bulk_str(c->out, "role");
    resp_add_bulk_str(c->out, "master");
    resp_add_bulk_str(c->out, "modules");
    return resp_add_array(c->out, 0);
}

int c_select(struct cmd_client *c, const struct cmd_args *a)
{
    long long db;
    if (cmd_arg_ll(a, 1, &db))
        return cmd_reply_err(c, ERR_INT);
    if (db != 0)
        return cmd_reply_err(c, "ERR DB index is out of range");
    return cmd_reply_ok(c);
}

int c_time(struct cmd_client *c, const struct cmd_args *a)
{
    (void)a;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    char s[24], us[24];
    int n1 = resp_ll2str(s, tv.tv_sec), n2 = resp_ll2str(us, tv.tv_usec);
    resp_add_array(c->out, 2);
    resp_add_bulk(c->out, s, (size_t)n1);
    return resp_add_bulk(c->out, us, (size_t)n2);
}

int c_info(struct cmd_client *c, const struct cmd_args *a)
{
    kvt_lsn_touch(eng_log_appended(c->eng)); /* key counts and memory show pending writes */
    return cmd_info(c, a->argc - 1, a->argv + 1, a->argl + 1);
}
