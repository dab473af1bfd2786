/* mqtt_conn.c - one MQTT connection on a poller (see mqtt.h): its packets in
 * order, publishes appended to streams through ses_run (acknowledgements held
 * for the log like RESP replies), subscriptions, keep-alive, will; deliveries
 * are mqtt_deliver.c's. Runs on the connection's poller only. Reads untrusted bytes: framing
 * and fields are checked by proto/mqtt.c, a malformed packet closes only this
 * connection, with a log line. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "core/counter.h"
#include "core/log.h"
#include "core/net.h"
#include "engine/engine.h"
#include "engine/session.h"
#include "frontend/mqtt_int.h"
#include "frontend/poller_int.h"
#include "frontend/tcp.h"
#include "proto/mqtt.h"
#include "proto/resp.h"

#define CONNECT_WAIT_MS 10000 /* a connection that sends no CONNECT in this time is closed */

enum { PUB_XADD, PUB_INDEX, PUB_RETAIN };
#define SAVE_MS 1000 /* acknowledged cursors of a persistent session are saved this often */
/* what a packet's handler says */
enum { H_OK, H_STALL, H_WAIT, H_CLOSE };

struct kvlog_rate mq_bad_rate = KVLOG_RATE_INIT(10);

void mq_logf(struct mq_conn *m, const char *what, const char *why)
{
    kvlog_rated(&mq_bad_rate, KVLOG_WARNING, "mqtt: closing client %s (%.*s): %s%s%s", m->c->ses.cl.addr,
                m->sess ? (int)m->sess->idlen : 0, m->sess ? m->sess->id : "", what, why ? ": " : "", why ? why : "");
}

size_t mq_backlog(const struct conn *c) { return c->out.len - c->out_off; }

/* ---- the connection's list on its poller */

int mqtt_conn_new(struct mq_broker *b, struct conn *c)
{
    struct mq_conn *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    m->b = b;
    m->c = c;
    m->last_in_ms = c->p->now;
    c->mq = m;
    c->ses.cl.out = &m->scratch; /* RESP replies of the commands it runs stay here */
    struct mq_poller *mp = &c->p->mq;
    m->next = mp->conns;
    if (mp->conns)
        mp->conns->prev = m;
    mp->conns = m;
    atomic_fetch_add_explicit(&b->st.connections, 1, memory_order_relaxed);
    return 0;
}

void mqtt_conn_free(struct conn *c)
{
    struct mq_conn *m = c->mq;
    if (!m)
        return;
    struct mq_poller *mp = &c->p->mq;
    if (m->prev)
        m->prev->next = m->next;
    else
        mp->conns = m->next;
    if (m->next)
        m->next->prev = m->prev;
    kvbuf_free(&m->scratch);
    kvbuf_free(&m->args);
    free(m->acks);
    free(m->will);
    free(m);
    c->mq = NULL;
}

/* ---- running commands */

/* Run argv through the session (its RESP reply in m->scratch). SES_DONE/SES_HOLD
 * (the LSN it needs added to *need), SES_STALL, or -1 when it failed (reply: an
 * error) or -ENOMEM. */
int mq_run(struct mq_conn *m, int argc, uint64_t *need)
{
    struct session *s = &m->c->ses;
    m->scratch.len = 0;
    int rc = ses_run(s, argc, m->argv, m->argl);
    if (rc < 0 || rc == SES_STALL)
        return rc;
    if (need && s->need > *need)
        *need = s->need;
    return m->scratch.len && m->scratch.p[0] == '-' ? -1 : rc;
}

/* The reply's error line, for a log line. */
const char *mq_run_error(struct mq_conn *m)
{
    if (!m->scratch.len || m->scratch.p[0] != '-' || kvbuf_reserve(&m->scratch, 1))
        return "out of memory";
    char *e = m->scratch.p + 1;
    char *end = memchr(e, '\r', m->scratch.len - 1);
    if (end)
        *end = 0;
    else
        m->scratch.p[m->scratch.len] = 0;
    return e;
}

/* Lay out argv from the key in m->args (built by the caller) and string values. */
static int argv_key(struct mq_conn *m, const char *pre, size_t plen, const void *name, size_t n)
{
    m->args.len = 0;
    if (kvbuf_append(&m->args, pre, plen) || kvbuf_append(&m->args, name, n))
        return -ENOMEM;
    m->argv[1] = m->args.p;
    m->argl[1] = m->args.len;
    return 0;
}

void mq_arg(struct mq_conn *m, int *n, const void *s, size_t len)
{
    m->argv[*n] = s;
    m->argl[(*n)++] = len;
}

static const char *const digit[3] = {"0", "1", "2"};

/* Append a message to topic's stream (and, retained, to the retained store): the
 * one write path of PUBLISH and of wills. SES_DONE/SES_HOLD with the LSN in
 * *need, SES_STALL (run it again with the same message), -1 refused (logged by
 * the caller with run_error), -ENOMEM. */
static int store(struct mq_conn *m, const void *topic, size_t tlen, const void *payload, size_t plen, int qos,
                 int retain, uint64_t *need)
{
    struct mq_broker *b = m->b;
    struct session *s = &m->c->ses;
    int rc;
    if (m->step == PUB_XADD) {
        if (!s->again) /* the same time when run again after a stall */
            m->at[resp_ll2str(m->at, mq_unix_ms())] = 0;
        if (argv_key(m, b->prefix, b->plen, topic, tlen))
            return -ENOMEM;
        int n = 0;
        char maxlen[24];
        mq_arg(m, &n, "XADD", 4);
        n++; /* the key */
        long long cap = b->eng->cfg.mqtt_stream_maxlen;
        if (cap > 0) {
            mq_arg(m, &n, "MAXLEN", 6);
            mq_arg(m, &n, "~", 1);
            mq_arg(m, &n, maxlen, (size_t)snprintf(maxlen, sizeof maxlen, "%lld", cap));
        }
        mq_arg(m, &n, "*", 1);
        mq_arg(m, &n, "payload", 7);
        mq_arg(m, &n, payload, plen);
        mq_arg(m, &n, "qos", 3);
        mq_arg(m, &n, digit[qos], 1);
        mq_arg(m, &n, "retain", 6);
        mq_arg(m, &n, digit[!!retain], 1);
        mq_arg(m, &n, "client", 6);
        mq_arg(m, &n, m->sess ? m->sess->id : "", m->sess ? m->sess->idlen : 0);
        mq_arg(m, &n, "at", 2);
        mq_arg(m, &n, m->at, strlen(m->at));
        if ((rc = mq_run(m, n, need)) == SES_STALL || rc < 0)
            return rc;
        struct mq_topic *full;
        m->step = mq_topic_claim(&full) ? PUB_INDEX : PUB_RETAIN;
        if (full && qos > 0 && !m->slowed_on) { /* a subscriber's queue is full: this publisher waits */
            m->slowed_on = full;
            atomic_fetch_add_explicit(&b->st.slowed, 1, memory_order_relaxed);
        }
    }
    if (m->step == PUB_INDEX) { /* a topic new to this run: in the index a restart reads */
        int n = 0;
        if (argv_key(m, b->prefix, b->plen, "", 0))
            return -ENOMEM;
        mq_arg(m, &n, "HSET", 4);
        n++;
        mq_arg(m, &n, topic, tlen);
        mq_arg(m, &n, "", 0);
        if ((rc = mq_run(m, n, need)) == SES_STALL || rc < 0)
            return rc;
        m->step = PUB_RETAIN;
    }
    if (!retain) {
        m->step = PUB_XADD;
        return SES_DONE;
    }
    /* the retained message kept for new subscribers (a field of the retained hash:
     * QoS byte + payload), or gone */
    if (argv_key(m, b->retained_key, b->rklen, "", 0))
        return -ENOMEM;
    int n = 0;
    if (plen) {
        char *v = malloc(plen + 1);
        if (!v)
            return -ENOMEM;
        v[0] = (char)qos;
        memcpy(v + 1, payload, plen);
        mq_arg(m, &n, "HSET", 4);
        n++;
        mq_arg(m, &n, topic, tlen);
        mq_arg(m, &n, v, plen + 1);
        rc = mq_run(m, n, need);
        free(v);
    } else {
        mq_arg(m, &n, "HDEL", 4);
        n++;
        mq_arg(m, &n, topic, tlen);
        rc = mq_run(m, n, need);
    }
    if (rc == SES_STALL || rc < 0)
        return rc;
    m->step = PUB_XADD;
    return mq_retain(b, topic, tlen, qos, payload, plen) ? -ENOMEM : rc;
}

/* Save a persistent session to its key (mq_sess_save), so a restart finds it:
 * SES_DONE/SES_HOLD with the LSN in *need, SES_STALL (run again), -1, -ENOMEM.
 * A clean session is not kept: SES_DONE. */
static int save_session(struct mq_conn *m, uint64_t *need)
{
    struct mq_sess *s = m->sess;
    struct mq_broker *b = m->b;
    if (!s || s->clean)
        return SES_DONE;
    struct kvbuf v = {0};
    int n = 0, rc = argv_key(m, b->session_prefix, b->splen, s->id, s->idlen);
    if (rc || mq_sess_save(b, s, &v)) {
        kvbuf_free(&v);
        return -ENOMEM;
    }
    mq_arg(m, &n, "SET", 3);
    n++;
    mq_arg(m, &n, v.p, v.len);
    rc = mq_run(m, n, need);
    kvbuf_free(&v);
    if (rc == SES_DONE || rc == SES_HOLD) {
        m->cursors_moved = 0;
        m->saved_ms = m->c->p->now;
    }
    return rc;
}

/* What a packet's handler returns after a run: H_OK, H_STALL or H_CLOSE (logged). */
static int run_result(struct mq_conn *m, int rc, const char *what)
{
    if (rc == SES_STALL)
        return H_STALL;
    if (rc < 0) {
        mq_logf(m, what, rc == -1 ? mq_run_error(m) : "out of memory");
        return H_CLOSE;
    }
    return H_OK;
}

/* What a restart left in the store, read once per run before it is needed: the
 * topic index (which topics a restored session's filters match) and the retained
 * messages (for subscriptions). H_OK, H_STALL (run the packet again), H_CLOSE. */
static int load_state(struct mq_conn *m)
{
    struct mq_broker *b = m->b;
    if (!atomic_load(&b->indexed)) {
        int n = 0;
        if (argv_key(m, b->prefix, b->plen, "", 0))
            return H_CLOSE;
        mq_arg(m, &n, "HKEYS", 5);
        n++;
        int h = run_result(m, mq_run(m, n, NULL), "reading the topic index");
        if (h != H_OK)
            return h;
        if (mq_load_index(b, m->scratch.p, m->scratch.len))
            return H_CLOSE;
    }
    if (!atomic_load(&b->retained_loaded)) {
        int n = 0;
        if (argv_key(m, b->retained_key, b->rklen, "", 0))
            return H_CLOSE;
        mq_arg(m, &n, "HGETALL", 7);
        n++;
        int h = run_result(m, mq_run(m, n, NULL), "reading the retained messages");
        if (h != H_OK)
            return h;
        if (mq_load_retained(b, m->scratch.p, m->scratch.len))
            return H_CLOSE;
    }
    return H_OK;
}

/* Queue an acknowledgement that may leave once the log holds need. */
static int ack(struct conn *c, int type, uint16_t id, uint64_t need)
{
    size_t at = c->out.len;
    if (mqtt_put_ack(&c->out, type, id))
        return -ENOMEM;
    return ses_hold(&c->ses, at, need);
}

/* A PUBACK or PUBREC: queued behind the ones withheld while the publisher is slowed
 * (they leave in the order of their PUBLISHes, 4.6), else as ack. 0 or -ENOMEM. */
static int pub_ack(struct mq_conn *m, int type, uint16_t id, uint64_t need)
{
    if (!m->slowed_on && !m->nacks)
        return ack(m->c, type, id, need);
    if (m->nacks == m->capacks) {
        int nc = m->capacks ? m->capacks * 2 : 64;
        struct mq_ack *v = realloc(m->acks, sizeof *v * (size_t)nc);
        if (!v)
            return -ENOMEM;
        m->acks = v;
        m->capacks = nc;
    }
    m->acks[m->nacks++] = (struct mq_ack){need, id, (uint8_t)type};
    return 0;
}

void mq_release_acks(struct mq_conn *m)
{
    struct conn *c = m->c;
    if (!m->nacks || c->closed || (m->slowed_on && mq_slow(m->b, m)))
        return;
    for (int i = 0; i < m->nacks; i++)
        if (ack(c, m->acks[i].type, m->acks[i].id, m->acks[i].need)) {
            mq_logf(m, "out of memory", NULL);
            pconn_close(c);
            return;
        }
    m->nacks = 0;
    pconn_pending(c);
}

/* ---- packets */

static int on_connect(struct mq_conn *m, const uint8_t *body, size_t n)
{
    struct conn *c = m->c;
    struct mq_broker *b = m->b;
    struct mqtt_connect k;
    const char *err = NULL;
    int rc = mqtt_parse_connect(body, n, &k, &err);
    if (rc < 0) {
        mq_logf(m, "malformed CONNECT", err);
        atomic_fetch_add_explicit(&b->st.malformed, 1, memory_order_relaxed);
        return H_CLOSE;
    }
    /* the password file if there is one, else --requirepass (any user name) */
    const char *pass = b->eng->cfg.requirepass;
    if (rc == 0 && b->users && !(k.has_user && k.has_pass && mq_users_check(b->users, k.user.p, k.user.n, k.pass.p, k.pass.n)))
        rc = k.has_pass ? MQTT_CONN_CREDENTIALS : MQTT_CONN_NOT_AUTHORIZED;
    else if (rc == 0 && !b->users && pass && *pass &&
             !(k.has_pass && k.pass.n == strlen(pass) && CRYPTO_memcmp(k.pass.p, pass, k.pass.n) == 0))
        rc = k.has_pass ? MQTT_CONN_CREDENTIALS : MQTT_CONN_NOT_AUTHORIZED;
    if (rc == MQTT_CONN_CREDENTIALS || rc == MQTT_CONN_NOT_AUTHORIZED)
        atomic_fetch_add_explicit(&b->eng->auth_denied, 1, memory_order_relaxed);
    if (rc == 0) /* before it runs anything: reading its saved session needs it with --requirepass */
        c->ses.cl.authenticated = 1;
    char idbuf[40];
    const char *id = (const char *)k.client_id.p;
    size_t idlen = k.client_id.n;
    if (m->sess) { /* run again after a stall: the session it attached to */
        id = m->sess->id;
        idlen = m->sess->idlen;
    } else if (rc == 0 && idlen == 0) { /* 3.1.3-6: the server assigns one */
        pthread_mutex_lock(&b->lock);
        uint64_t seq = ++b->next_auto;
        pthread_mutex_unlock(&b->lock);
        idlen = (size_t)snprintf(idbuf, sizeof idbuf, "auto-%" PRIx64 "-%" PRIu64, (uint64_t)getpid(), seq);
        id = idbuf;
    }
    uint64_t need = 0;
    if (rc == 0 && !k.clean && !m->loaded && !mq_sess_known(b, id, idlen)) {
        /* a persistent session kept across a restart: its key, read once */
        int n = 0;
        if (argv_key(m, b->session_prefix, b->splen, id, idlen))
            return H_CLOSE;
        mq_arg(m, &n, "GET", 3);
        n++;
        int g = run_result(m, mq_run(m, n, &need), "reading its saved session");
        if (g != H_OK)
            return g;
        const char *v;
        size_t vlen;
        if (mq_reply_bulk(m, &v, &vlen) == 0) {
            if (!(m->saved = malloc(vlen + 1)))
                return H_CLOSE;
            memcpy(m->saved, v, vlen);
            m->savedlen = vlen;
        }
        m->loaded = 1;
    }
    if (m->saved) { /* topics written before a restart, which its filters may match */
        int g = load_state(m);
        if (g != H_OK)
            return g;
    }
    if (rc == 0 && !m->sess) {
        int a = mq_sess_attach(b, m, id, idlen, k.clean, c->p->evfd, &c->p->mq, m->saved, m->savedlen);
        free(m->saved);
        m->saved = NULL;
        if (a == -EBUSY)
            return H_WAIT; /* the session's old connection is being closed */
        if (a == -ENOMEM)
            return H_CLOSE;
        if (a == -ENOSPC) {
            kvlog_rated(&mq_bad_rate, KVLOG_WARNING, "mqtt: refused client %.*s: mqtt-max-sessions (%d) reached",
                        (int)idlen, id, b->eng->cfg.mqtt_max_sessions);
            rc = MQTT_CONN_UNAVAILABLE;
        }
        m->present = a == 1 && !k.clean;
    }
    if (rc) {
        atomic_fetch_add_explicit(&b->st.refused, 1, memory_order_relaxed);
        c->ses.cl.close_after_reply = 1; /* 3.2.2-5: CONNACK, then close */
        return mqtt_put_connack(&c->out, 0, rc) ? H_CLOSE : H_OK;
    }
    /* kept (a new persistent session too, so a restart finds it), or a session a
     * clean CONNECT ends gone from the store: CONNACK once the log holds that */
    if (k.clean && k.client_id.n) { /* (an id the server assigned never had a saved session) */
        int n = 0;
        if (argv_key(m, b->session_prefix, b->splen, m->sess->id, m->sess->idlen))
            return H_CLOSE;
        mq_arg(m, &n, "DEL", 3);
        n++;
        int d = run_result(m, mq_run(m, n, &need), "ending its saved session");
        if (d != H_OK)
            return d;
    } else {
        int d = run_result(m, save_session(m, &need), "saving its session");
        if (d != H_OK)
            return d;
    }
    m->keepalive = k.keepalive;
    if (k.will) {
        if (!(m->will = malloc(k.will_topic.n + k.will_msg.n + 1)))
            return H_CLOSE;
        memcpy(m->will, k.will_topic.p, k.will_topic.n);
        memcpy(m->will + k.will_topic.n, k.will_msg.p, k.will_msg.n);
        m->will_tlen = k.will_topic.n;
        m->will_mlen = k.will_msg.n;
        m->will_qos = k.will_qos;
        m->will_retain = k.will_retain;
    }
    free(c->ses.cl.name); /* CLIENT LIST names it by its client id */
    c->ses.cl.name = strndup(m->sess->id, m->sess->idlen);
    m->connected = 1;
    size_t at = c->out.len;
    if (mqtt_put_connack(&c->out, m->present, 0) || ses_hold(&c->ses, at, need))
        return H_CLOSE;
    /* 4.4: unacknowledged PUBLISH and PUBREL packets are sent again */
    struct mq_sess *s = m->sess;
    for (int i = 0; i < s->nflight; i++) {
        struct mq_flight *f = &s->flight[i];
        if (f->state == FLIGHT_PUBLISHED) {
            f->pkt[0] |= 8; /* DUP */
            if (kvbuf_append(&c->out, f->pkt, f->len))
                return H_CLOSE;
        } else if (mqtt_put_ack(&c->out, MQTT_PUBREL, f->id)) {
            return H_CLOSE;
        }
    }
    return H_OK;
}

static int on_publish(struct mq_conn *m, int flags, const uint8_t *body, size_t n)
{
    struct mq_broker *b = m->b;
    struct mqtt_publish pb;
    const char *err;
    if (mqtt_parse_publish(flags, body, n, &pb, &err)) {
        mq_logf(m, "malformed PUBLISH", err);
        atomic_fetch_add_explicit(&b->st.malformed, 1, memory_order_relaxed);
        return H_CLOSE;
    }
    struct mq_sess *s = m->sess;
    uint64_t need = 0;
    if (pb.qos == 2 && s->qos2_in && (s->qos2_in[pb.id >> 3] >> (pb.id & 7) & 1)) {
        /* 4.3.3: a resent QoS 2 PUBLISH whose PUBREL has not come: not stored again.
         * Its first PUBREC may have been lost with a connection: this one waits for
         * everything logged so far. */
        need = eng_log_appended(b->eng);
        int h = run_result(m, save_session(m, &need), "saving its session");
        return h != H_OK ? h : pub_ack(m, MQTT_PUBREC, pb.id, need) ? H_CLOSE : H_OK;
    }
    int rc = store(m, pb.topic.p, pb.topic.n, pb.payload.p, pb.payload.n, pb.qos, pb.retain, &need);
    if (rc == SES_STALL)
        return H_STALL;
    m->step = PUB_XADD;
    if (rc < 0) {
        if (rc == -1 && pb.qos == 0) { /* nothing to refuse it with: counted */
            atomic_fetch_add_explicit(&b->st.dropped, 1, memory_order_relaxed);
            kvlog_rated(&mq_bad_rate, KVLOG_WARNING, "mqtt: QoS 0 message from %.*s to %.*s dropped: %s",
                        (int)s->idlen, s->id, (int)pb.topic.n, (const char *)pb.topic.p, mq_run_error(m));
            return H_OK;
        }
        /* QoS 1/2: no acknowledgement; the client sends it again on a new connection */
        mq_logf(m, "message not stored", rc == -1 ? mq_run_error(m) : "out of memory");
        return H_CLOSE;
    }
    atomic_fetch_add_explicit(&b->st.in[pb.qos], 1, memory_order_relaxed);
    if (pb.qos == 1)
        return pub_ack(m, MQTT_PUBACK, pb.id, need) ? H_CLOSE : H_OK;
    if (pb.qos == 2) {
        if (!s->qos2_in && !(s->qos2_in = calloc(8192, 1)))
            return H_CLOSE;
        s->qos2_in[pb.id >> 3] |= (uint8_t)(1 << (pb.id & 7));
        /* a persistent session keeps the id (not stored twice after a restart) */
        int h = run_result(m, save_session(m, &need), "saving its session");
        if (h == H_STALL)
            return H_STALL; /* run again: the id is known now, the message is not stored again */
        return h != H_OK ? h : pub_ack(m, MQTT_PUBREC, pb.id, need) ? H_CLOSE : H_OK;
    }
    return H_OK;
}

static int on_subscribe(struct mq_conn *m, const uint8_t *body, size_t n, int sub)
{
    struct conn *c = m->c;
    uint16_t id;
    const char *err;
    int count = mqtt_parse_subs(body, n, sub, &id, &err);
    if (count < 0) {
        mq_logf(m, sub ? "malformed SUBSCRIBE" : "malformed UNSUBSCRIBE", err);
        atomic_fetch_add_explicit(&m->b->st.malformed, 1, memory_order_relaxed);
        return H_CLOSE;
    }
    if (sub) { /* retained messages a restart left, and topics, known before any match */
        int h = load_state(m);
        if (h != H_OK)
            return h;
    }
    uint8_t codes[count];
    struct kvbuf retained = {0};
    size_t off = 2;
    struct mqtt_str f;
    int qos, i = 0;
    while (mqtt_next_sub(body, n, sub, &off, &f, &qos) == 1) {
        if (sub) {
            codes[i] = (uint8_t)qos;
            if (mq_subscribe(m->b, m, (const char *)f.p, f.n, qos, &retained))
                codes[i] = 0x80; /* failure */
        } else {
            mq_unsubscribe(m->b, m->sess, (const char *)f.p, f.n);
        }
        i++;
    }
    uint64_t need = 0;
    int h = run_result(m, save_session(m, &need), "saving its session");
    if (h != H_OK) { /* (run again after a stall: the same subscriptions, the same retained messages) */
        kvbuf_free(&retained);
        return h;
    }
    size_t at = c->out.len;
    int rc = sub ? mqtt_put_suback(&c->out, id, codes, (size_t)count) : mqtt_put_ack(&c->out, MQTT_UNSUBACK, id);
    /* retained messages after the SUBACK */
    rc = rc || ses_hold(&c->ses, at, need) || kvbuf_append(&c->out, retained.p, retained.len);
    kvbuf_free(&retained);
    return rc ? H_CLOSE : H_OK;
}

static int on_ack(struct mq_conn *m, int type, const uint8_t *body, size_t n)
{
    struct conn *c = m->c;
    struct mq_sess *s = m->sess;
    uint16_t id;
    const char *err;
    if (mqtt_parse_id(body, n, &id, &err)) {
        mq_logf(m, "malformed acknowledgement", err);
        atomic_fetch_add_explicit(&m->b->st.malformed, 1, memory_order_relaxed);
        return H_CLOSE;
    }
    uint64_t need = 0;
    if (type == MQTT_PUBREL) { /* 4.3.3: forget the id, PUBCOMP */
        int known = s->qos2_in && (s->qos2_in[id >> 3] >> (id & 7) & 1);
        if (known)
            s->qos2_in[id >> 3] &= (uint8_t)~(1 << (id & 7));
        int h = known ? run_result(m, save_session(m, &need), "saving its session") : H_OK;
        if (h == H_STALL) /* run again: the id is forgotten already, saved then */
            s->qos2_in[id >> 3] |= (uint8_t)(1 << (id & 7));
        return h != H_OK ? h : ack(c, MQTT_PUBCOMP, id, need) ? H_CLOSE : H_OK;
    }
    struct mq_flight *f = mq_flight_find(s, id);
    if (!f) /* acknowledges nothing in flight (a duplicate): ignored */
        return H_OK;
    if (type == MQTT_PUBREC && f->qos == 2) { /* PUBREL from now on, also when resent */
        f->state = FLIGHT_RELEASED;
        free(f->pkt);
        f->pkt = NULL;
        /* its cursor saved first: a restart must not send it again as a new message */
        int h = run_result(m, save_session(m, &need), "saving its session");
        return h != H_OK ? h : ack(c, MQTT_PUBREL, id, need) ? H_CLOSE : H_OK;
    }
    if ((type == MQTT_PUBACK && f->qos == 1) || (type == MQTT_PUBCOMP && f->state == FLIGHT_RELEASED)) {
        mq_flight_drop(s, f);
        m->cursors_moved = 1; /* saved within SAVE_MS (mqtt_cron) */
        atomic_store(&s->ready, 1); /* room for links that waited */
    }
    return H_OK;
}

/* A packet the protocol does not allow here: counted, logged, the connection closed. */
static int violation(struct mq_conn *m, const char *what)
{
    atomic_fetch_add_explicit(&m->b->st.malformed, 1, memory_order_relaxed);
    mq_logf(m, what, NULL);
    return H_CLOSE;
}

static int packet(struct mq_conn *m, const struct mqtt_frame *f, const uint8_t *body)
{
    struct conn *c = m->c;
    if (!m->connected && f->type != MQTT_CONNECT) {
        return violation(m, "first packet is not CONNECT"); /* 3.1.0-1 */
    }
    switch (f->type) {
    case MQTT_CONNECT:
        if (m->connected) {
            return violation(m, "second CONNECT"); /* 3.1.0-2 */
        }
        return on_connect(m, body, f->len);
    case MQTT_PUBLISH:
        return on_publish(m, f->flags, body, f->len);
    case MQTT_PUBACK:
    case MQTT_PUBREC:
    case MQTT_PUBREL:
    case MQTT_PUBCOMP:
        return on_ack(m, f->type, body, f->len);
    case MQTT_SUBSCRIBE:
        return on_subscribe(m, body, f->len, 1);
    case MQTT_UNSUBSCRIBE:
        return on_subscribe(m, body, f->len, 0);
    case MQTT_PINGREQ:
        if (f->len) {
            return violation(m, "PINGREQ with a body");
        }
        return mqtt_put_header(&c->out, MQTT_PINGRESP, 0, 0) ? H_CLOSE : H_OK;
    case MQTT_DISCONNECT:
        if (f->len) {
            return violation(m, "DISCONNECT with a body");
        }
        m->disconnected = 1; /* 3.14.4-3: the will is discarded */
        c->ses.cl.close_after_reply = 1;
        return H_OK;
    default: /* CONNACK, SUBACK, UNSUBACK, PINGRESP: only a server sends them */
        return violation(m, "a packet only a server sends");
    }
}

void mqtt_input(struct conn *c)
{
    struct mq_conn *m = c->mq;
    struct mq_broker *b = m->b;
    if (m->redo) { /* a save of the session stalled: it goes first */
        int rc = save_session(m, NULL);
        if (rc == SES_STALL) {
            pconn_stall(c);
            return;
        }
        m->redo = 0;
        if (rc < 0)
            kvlog_rated(&mq_bad_rate, KVLOG_WARNING, "mqtt: saving the session of %.*s failed: %s",
                        (int)m->sess->idlen, m->sess->id, rc == -1 ? mq_run_error(m) : "out of memory");
    }
    mq_release_acks(m);
    if (m->delivering) { /* a delivery stalled: it goes first */
        mq_deliver(m);
        if (c->closed || pconn_stalled(c))
            return;
    }
    size_t max = (size_t)b->eng->cfg.mqtt_max_packet;
    while (!c->closed && !pconn_stalled(c) && !c->ses.cl.close_after_reply) {
        if (mq_backlog(c) > OUT_PAUSE) {
            c->paused = 1; /* as RESP: no input until the client reads */
            break;
        }
        if (m->nacks >= ACKS_MAX) {
            pconn_stall(c); /* a client that does not wait for its acknowledgements: no input either */
            break;
        }
        struct mqtt_frame f;
        const char *err = NULL;
        int r = mqtt_frame((const uint8_t *)c->in.p + c->in_off, c->in.len - c->in_off, max, &f, &err);
        if (r == 0)
            break;
        if (r < 0) {
            atomic_fetch_add_explicit(&b->st.malformed, 1, memory_order_relaxed);
            st_inc(&c->p->st->protocol_errors, 1);
            mq_logf(m, "malformed packet", err);
            c->ses.cl.close_after_reply = 1; /* what is queued before it still leaves (held ones too) */
            break;
        }
        int h = packet(m, &f, (const uint8_t *)c->in.p + c->in_off + f.hlen);
        if (h == H_CLOSE) {
            c->ses.cl.close_after_reply = 1;
            break;
        }
        if (h == H_STALL) {
            pconn_stall(c);
            break;
        }
        if (h == H_WAIT) {
            m->waiting = 1; /* mqtt_cron and wake-ups try again */
            break;
        }
        m->waiting = 0;
        c->in_off += f.hlen + f.len;
        m->last_in_ms = c->p->now;
        st_inc(&c->p->st->commands, 1);
    }
    if (c->in_off == c->in.len) {
        c->in.len = c->in_off = 0;
    } else if (c->in_off > 0 && (c->in_off >= c->in.cap / 2 || c->in.cap - c->in.len < TCP_READ_CHUNK)) {
        kvbuf_consume(&c->in, c->in_off);
        c->in_off = 0;
    }
    if (!c->closed && m->sess && atomic_load_explicit(&m->sess->ready, memory_order_acquire))
        mq_deliver(m);
}

/* ---- the connection's end */

void mqtt_closed(struct conn *c)
{
    struct mq_conn *m = c->mq;
    struct mq_broker *b = m->b;
    if (m->sess && m->will && !m->disconnected && !atomic_load(&c->p->ps->stopping)) { /* 3.1.2-8: published on an abnormal end */
        uint64_t need = 0;
        m->step = PUB_XADD;
        c->ses.again = 0;
        int rc = store(m, m->will, m->will_tlen, m->will + m->will_tlen, m->will_mlen, m->will_qos,
                       m->will_retain, &need);
        if (rc == SES_STALL || rc < 0)
            kvlog_write(KVLOG_WARNING, "mqtt: will of client %.*s not published: %s", (int)m->sess->idlen,
                        m->sess->id, rc == SES_STALL ? "the store waits for memory" : mq_run_error(m));
        else
            atomic_fetch_add_explicit(&b->st.in[m->will_qos], 1, memory_order_relaxed);
    }
    if (m->sess && m->cursors_moved && !m->redo && !m->delivering && !c->ses.again) {
        /* what its client acknowledged last (best effort: at worst sent again) */
        int rc = save_session(m, NULL);
        if (rc == SES_STALL || rc < 0)
            kvlog_rated(&mq_bad_rate, KVLOG_WARNING, "mqtt: the session of %.*s not saved at its end: %s",
                        (int)m->sess->idlen, m->sess->id, rc == SES_STALL ? "the store waits for memory"
                                                          : rc == -1      ? mq_run_error(m)
                                                                          : "out of memory");
    }
    mq_sess_detach(b, m);
    atomic_fetch_sub_explicit(&b->st.connections, 1, memory_order_relaxed);
}

void mqtt_cron(struct poller *p)
{
    for (struct mq_conn *m = p->mq.conns, *next; m; m = next) {
        next = m->next;
        struct conn *c = m->c;
        if (m->nacks)
            mq_release_acks(m); /* (were a wake-up missed) */
        if (c->closed)
            continue;
        int64_t idle = p->now - m->last_in_ms;
        if (!m->connected && !m->waiting && idle > CONNECT_WAIT_MS) {
            mq_logf(m, "no CONNECT", NULL);
            pconn_close(c);
        } else if (m->sess && m->keepalive && idle > (int64_t)m->keepalive * 1500) {
            mq_logf(m, "keep alive expired", NULL); /* 3.1.2-24: 1.5 times the keep alive */
            pconn_close(c);
        } else if (m->waiting) {
            mqtt_input(c);
            if (!c->closed)
                pconn_pending(c);
        } else if (m->cursors_moved && p->now - m->saved_ms >= SAVE_MS && !m->redo && !m->delivering &&
                   !pconn_stalled(c)) {
            m->redo = 1; /* save what its client acknowledged */
            mqtt_input(c);
            if (!c->closed)
                pconn_pending(c);
        }
    }
}
