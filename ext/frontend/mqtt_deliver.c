/* mqtt_deliver.c - an MQTT session's deliveries (see mqtt.h): what its raised
 * links' streams hold past their cursors, read with XREAD through the session's
 * connection and sent as PUBLISH packets; QoS 1 and 2 ones kept in flight until
 * acknowledged. Runs on the connection's poller only. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/stream.h"
#include "core/table.h"
#include "engine/engine.h"
#include "engine/session.h"
#include "frontend/mqtt_int.h"
#include "frontend/poller_int.h"
#include "proto/mqtt.h"
#include "proto/resp.h"

#define DELIVER_KEYS 64   /* streams one XREAD reads */
#define DELIVER_COUNT 64  /* entries it reads from each */
#define DELIVER_ROUNDS 8  /* XREADs per wake-up before the poller's other work */

/* ---- outgoing PUBLISH with QoS > 0 */

struct mq_flight *mq_flight_find(struct mq_sess *s, uint16_t id)
{
    for (int i = 0; i < s->nflight; i++)
        if (s->flight[i].id == id)
            return &s->flight[i];
    return NULL;
}

void mq_flight_drop(struct mq_sess *s, struct mq_flight *f)
{
    free(f->pkt);
    /* in the order they were sent: a reconnect resends them so (4.6) */
    size_t i = (size_t)(f - s->flight);
    memmove(f, f + 1, (size_t)(--s->nflight - (int)i) * sizeof *f);
}

int mq_send_publish(struct mq_sess *s, struct kvbuf *out, int qos, int retain, struct mq_topic *topic,
                    struct mq_id eid, const void *payload, size_t plen)
{
    if (qos == 0)
        return mqtt_put_publish(out, 0, retain, 0, 0, topic->name, topic->n, payload, plen);
    if (s->nflight >= 65535)
        return -EBUSY; /* every packet id is taken */
    if (s->nflight == s->capflight) {
        int nc = s->capflight ? s->capflight * 2 : 16;
        struct mq_flight *v = realloc(s->flight, sizeof *v * (size_t)nc);
        if (!v)
            return -ENOMEM;
        s->flight = v;
        s->capflight = nc;
    }
    uint16_t id = s->next_id;
    while (id == 0 || mq_flight_find(s, id)) /* at most 65535 in flight: one is free */
        id++;
    s->next_id = (uint16_t)(id + 1);
    size_t at = out->len;
    if (mqtt_put_publish(out, qos, retain, 0, id, topic->name, topic->n, payload, plen))
        return -ENOMEM;
    struct mq_flight *f = &s->flight[s->nflight];
    f->topic = retain ? NULL : topic;
    f->eid = eid;
    f->len = out->len - at;
    if (!(f->pkt = malloc(f->len)))
        return -ENOMEM;
    memcpy(f->pkt, out->p + at, f->len);
    f->id = id;
    f->qos = (uint8_t)qos;
    f->state = FLIGHT_PUBLISHED;
    s->nflight++;
    return 0;
}

/* ---- delivery from the stream tails */

int mq_rr_int(struct mq_rr *r, char type, long long *v)
{
    if (r->p >= r->end || *r->p != type)
        return -1;
    char *e;
    *v = strtoll(r->p + 1, &e, 10);
    if (e + 2 > r->end || e[0] != '\r')
        return -1;
    r->p = e + 2;
    return 0;
}

int mq_rr_bulk(struct mq_rr *r, const char **s, size_t *n)
{
    long long len;
    if (mq_rr_int(r, '$', &len) || len < 0 || len > r->end - r->p - 2)
        return -1;
    *s = r->p;
    *n = (size_t)len;
    r->p += len + 2;
    return 0;
}

int mq_reply_bulk(struct mq_conn *m, const char **v, size_t *n)
{
    struct mq_rr r = {m->scratch.p, m->scratch.p + m->scratch.len};
    return mq_rr_bulk(&r, v, n);
}

/* "<ms>-<seq>" (as this server formats IDs) */
static int parse_id(const char *s, size_t n, struct mq_id *id)
{
    uint64_t v[2] = {0, 0};
    int part = 0, digits = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '-' && part == 0 && digits) {
            part = 1, digits = 0;
        } else if (s[i] >= '0' && s[i] <= '9' && digits < 20) {
            v[part] = v[part] * 10 + (uint64_t)(s[i] - '0');
            digits++;
        } else {
            return -1;
        }
    }
    if (part != 1 || !digits)
        return -1;
    id->ms = v[0];
    id->seq = v[1];
    return 0;
}

/* Append "<ms>-<seq>" to b. 0 or -ENOMEM. */
static int put_id(struct kvbuf *b, struct mq_id id)
{
    char t[48];
    int n = resp_ll2str(t, (long long)id.ms); /* (ms fits: < 2^63 for any real clock) */
    t[n++] = '-';
    if (id.seq > (uint64_t)INT64_MAX) { /* UINT64_MAX: "every ID of that ms" */
        n += snprintf(t + n, sizeof t - (size_t)n, "%" PRIu64, id.seq);
    } else {
        n += resp_ll2str(t + n, (long long)id.seq);
    }
    return kvbuf_append(b, t, (size_t)n);
}

/* QoS 1/2 messages that may be sent now. While some are in flight, only once half
 * the window is free: a read and a send per acknowledgement cost more than the
 * message; refilled by halves, each read takes a run of entries. */
static int flight_room(const struct mq_conn *m)
{
    int max = m->b->eng->cfg.mqtt_max_inflight, n = m->sess->nflight;
    int room = n < max ? max - n : 0;
    return n && room < (max + 1) / 2 ? 0 : room;
}

/* ---- the direct read: a stream's tail sent from under its shard lock */

struct tail_read {
    struct mq_conn *m;
    struct mq_link *k;
    long long count, n;
    int64_t over;               /* the session's queue past mqtt_max_queued: QoS 0 ones to drop */
    long long skipped;          /* dropped */
    uint64_t by_qos[3];         /* what was sent, by QoS */
};

#define SKIP_MAX 4096 /* QoS 0 messages one read drops at most (under the shard lock) */

/* How far the session's queue is past its bound (mqtt_max_queued; 0: none). */
static int64_t queue_over(const struct mq_conn *m)
{
    int64_t max = m->b->eng->cfg.mqtt_max_queued, q = atomic_load_explicit(&m->sess->queued, memory_order_relaxed);
    return max > 0 && q > max ? q - max : 0;
}

/* Messages delivered at QoS 0 past a full queue are dropped, oldest first (counted). */
static int drop_it(int64_t *over, int qos)
{
    if (*over <= 0 || qos > 0)
        return 0;
    --*over;
    return 1;
}

/* The end of a read of k: n sent or dropped, of which skipped dropped. */
static void read_done(struct mq_broker *b, struct mq_link *k, long long n, long long skipped)
{
    if (skipped) {
        atomic_fetch_add_explicit(&b->st.dropped, (uint64_t)skipped, memory_order_relaxed);
        atomic_fetch_add_explicit(&b->st.queue_dropped, (uint64_t)skipped, memory_order_relaxed);
    }
    if (n)
        mq_dequeued(b, k, n);
}

/* What an entry's fields say of its message, one field at a time (i: the field's
 * index): the payload is its "payload" field, else its first value; the QoS its
 * "qos" field (none: 1, not published by MQTT: as reliably as the subscription asks). */
struct message {
    const char *payload;
    size_t plen;
    int qos;                    /* -1 until a "qos" field */
};

static void message_field(struct message *msg, long long i, const char *f, size_t flen, const char *v, size_t vlen)
{
    if ((flen == 7 && !memcmp(f, "payload", 7)) || i == 0) {
        msg->payload = v;
        msg->plen = vlen;
    }
    if (flen == 3 && !memcmp(f, "qos", 3) && vlen == 1 && v[0] >= '0' && v[0] <= '2')
        msg->qos = v[0] - '0';
}

static void entry_message(const struct xs_entry *e, const char **payload, size_t *plen, int *qos)
{
    const unsigned char *p = e->fields;
    struct xs_field f;
    struct message msg = {NULL, 0, -1};
    for (long long i = 0; xs_field_next(e, &p, &f) == 1; i++)
        message_field(&msg, i, f.f, f.flen, f.v, f.vlen);
    *payload = msg.payload, *plen = msg.plen, *qos = msg.qos < 0 ? 1 : msg.qos;
}

/* kvt_apply's read (arg: struct tail_read): PUBLISH packets of the entries after the
 * link's cursor, up to count. The table throws the call's result away (-ENODATA) if
 * a batch it needed has left memory; the caller then undoes what it appended. */
static int64_t read_tail(void *arg, const struct kvt_state *cur, struct kvt_change *ch)
{
    (void)ch;
    struct tail_read *d = arg;
    if (!cur->exists)
        return 0;
    if (cur->type != KVT_STREAM)
        return -EINVAL;
    struct mq_link *k = d->k;
    struct xs_id lo = k->last.seq == UINT64_MAX ? (struct xs_id){k->last.ms + 1, 0}
                                                : (struct xs_id){k->last.ms, k->last.seq + 1};
    if (k->last.ms == UINT64_MAX && k->last.seq == UINT64_MAX)
        return 0;
    struct xs_iter it;
    xs_iter_init(&it, cur->stream, lo, XS_ID_MAX, 0, 0);
    it.want = (uint64_t)d->count;
    struct xs_entry e;
    int rc = 0;
    while (d->n < d->count && d->skipped < SKIP_MAX && xs_iter_next(&it, &e) == 1) {
        const char *payload;
        size_t plen;
        int qos;
        entry_message(&e, &payload, &plen, &qos);
        if (qos > k->qos)
            qos = k->qos;
        if (drop_it(&d->over, qos)) {
            k->last = (struct mq_id){e.id.ms, e.id.seq};
            d->skipped++;
            continue;
        }
        /* 3.3.1-9: RETAIN is 0 on messages for established subscriptions */
        if ((rc = mq_send_publish(d->m->sess, &d->m->c->out, qos, 0, k->topic, (struct mq_id){e.id.ms, e.id.seq},
                                  payload, plen))) {
            if (rc == -E2BIG) { /* an entry XADDed larger than MQTT's 256 MB: skipped, counted */
                atomic_fetch_add_explicit(&d->m->b->st.dropped, 1, memory_order_relaxed);
                k->last = (struct mq_id){e.id.ms, e.id.seq};
                rc = 0;
                continue;
            }
            if (rc == -EBUSY) /* no packet id free: the rest after acknowledgements */
                rc = 0;
            break;
        }
        k->last = (struct mq_id){e.id.ms, e.id.seq};
        d->n++;
        d->by_qos[qos]++;
    }
    xs_iter_done(&it);
    return rc ? rc : d->n + d->skipped;
}

/* Send what link k's stream holds past its cursor, at most count, straight from the
 * table: the entries read (sent or dropped), -ENODATA (a batch or the key is out of memory: nothing
 * sent, XREAD brings it back), -EINVAL (not a stream), -ENOMEM. */
static long long direct_read(struct mq_conn *m, struct mq_link *k, long long count)
{
    struct mq_broker *b = m->b;
    struct conn *c = m->c;
    struct mq_sess *s = m->sess;
    size_t out0 = c->out.len;
    int flights0 = s->nflight;
    struct mq_id last0 = k->last;
    m->args.len = 0;
    if (kvbuf_append(&m->args, b->prefix, b->plen) || kvbuf_append(&m->args, k->topic->name, k->topic->n))
        return -ENOMEM;
    struct tail_read d = {m, k, count, 0, queue_over(m), 0, {0}};
    int64_t rc = kvt_apply(b->eng->table, m->args.p, m->args.len, read_tail, &d);
    if (rc < 0) { /* undone: what it appended, the packet ids it took, the cursor */
        c->out.len = out0;
        while (s->nflight > flights0)
            mq_flight_drop(s, &s->flight[s->nflight - 1]);
        k->last = last0;
        return rc;
    }
    for (int q = 0; q < 3; q++)
        if (d.by_qos[q])
            atomic_fetch_add_explicit(&b->st.out[q], d.by_qos[q], memory_order_relaxed);
    read_done(b, k, rc, d.skipped);
    return rc;
}

/* Send what the XREAD reply in m->scratch holds for the links m->dlinks. -1 if it
 * cannot be read (a bug: logged), -ENOMEM. */
static int send_entries(struct mq_conn *m, long long count)
{
    struct mq_broker *b = m->b;
    struct conn *c = m->c;
    struct mq_rr r = {m->scratch.p, m->scratch.p + m->scratch.len};
    long long nstreams, two, nent, nf;
    if (r.p < r.end && r.p[0] == '*' && r.p + 1 < r.end && r.p[1] == '-')
        return 0; /* nothing new */
    if (mq_rr_int(&r, '*', &nstreams))
        return -1;
    for (long long i = 0; i < nstreams; i++) {
        const char *key, *ids;
        size_t klen, idn;
        if (mq_rr_int(&r, '*', &two) || two != 2 || mq_rr_bulk(&r, &key, &klen) || mq_rr_int(&r, '*', &nent))
            return -1;
        struct mq_link *k = NULL;
        for (int j = 0; j < m->ndlinks && !k; j++) {
            struct mq_topic *t = m->dlinks[j]->topic;
            if (klen == b->plen + t->n && !memcmp(key + b->plen, t->name, t->n))
                k = m->dlinks[j];
        }
        if (!k)
            return -1;
        int full = 0; /* no packet id left: the rest of this stream after acknowledgements */
        int64_t over = queue_over(m);
        long long done = 0, skipped = 0;
        for (long long e = 0; e < nent; e++) {
            struct mq_id id;
            if (mq_rr_int(&r, '*', &two) || two != 2 || mq_rr_bulk(&r, &ids, &idn) || parse_id(ids, idn, &id) ||
                mq_rr_int(&r, '*', &nf))
                return -1;
            struct message msg = {NULL, 0, -1};
            if (nf % 2)
                return -1;
            for (long long f = 0; f + 1 < nf; f += 2) {
                const char *fk, *fv;
                size_t fkn, fvn;
                if (mq_rr_bulk(&r, &fk, &fkn) || mq_rr_bulk(&r, &fv, &fvn))
                    return -1;
                message_field(&msg, f / 2, fk, fkn, fv, fvn);
            }
            const char *payload = msg.payload;
            size_t plen = msg.plen;
            int qos = msg.qos < 0 ? 1 : msg.qos;
            if (qos > k->qos)
                qos = k->qos;
            if (full)
                continue;
            done++;
            if (drop_it(&over, qos)) {
                skipped++;
                k->last = id;
                continue;
            }
            /* 3.3.1-9: RETAIN is 0 on messages for established subscriptions */
            int sr = mq_send_publish(m->sess, &c->out, qos, 0, k->topic, id, payload, plen);
            if (sr == -EBUSY) {
                full = 1;
                done--;
                continue;
            }
            if (sr == -ENOMEM)
                return -ENOMEM;
            /* sent, or larger than MQTT's 256 MB (an XADD's): skipped, counted */
            atomic_fetch_add_explicit(sr ? &b->st.dropped : &b->st.out[qos], 1, memory_order_relaxed);
            k->last = id;
        }
        read_done(b, k, done, skipped);
        if (nent >= count || full) /* maybe more: read again */
            atomic_store_explicit(&k->dirty, 1, memory_order_relaxed), atomic_store(&m->sess->ready, 1);
    }
    return 0;
}

/* Deliver what the session's raised links have (in rounds; the rest next wake-up).
 * Stops while the client's unsent output passes OUT_PAUSE / 2 (mqtt_drained goes
 * on) and, for links granting QoS 1 or 2, while mqtt_max_inflight messages are
 * unacknowledged (an acknowledgement goes on). */
void mq_deliver(struct mq_conn *m)
{
    struct conn *c = m->c;
    struct mq_sess *s = m->sess;
    if (!s || c->closed || c->ses.cl.close_after_reply || atomic_load_explicit(&m->kicked, memory_order_relaxed))
        return;
    size_t out_before = c->out.len;
    for (int round = 0; round < DELIVER_ROUNDS; round++) {
        long long count = DELIVER_COUNT;
        if (!m->delivering) {
            if (mq_backlog(c) > OUT_PAUSE / 2 || !atomic_load_explicit(&s->ready, memory_order_acquire))
                break;
            atomic_store_explicit(&s->ready, 0, memory_order_release);
            struct mq_link *v[DELIVER_KEYS];
            int max = m->single ? 1 : DELIVER_KEYS;
            int n = mq_dirty_links(m->b, s, v, max), room = flight_room(m);
            m->ndlinks = 0;
            for (int i = 0; i < n; i++) {
                if (v[i]->qos > 0 && room == 0)
                    atomic_store(&v[i]->dirty, 1); /* waits for an acknowledgement */
                else
                    m->dlinks[m->ndlinks++] = v[i];
            }
            if (n == max)
                atomic_store(&s->ready, 1); /* more links than one read takes */
            if (!m->ndlinks)
                break;
            /* straight from the table; what it cannot read there (out of memory) by XREAD */
            int slow = 0;
            for (int i = 0; i < m->ndlinks; i++) {
                struct mq_link *k = m->dlinks[i];
                long long want = DELIVER_COUNT;
                room = flight_room(m);
                if (k->qos > 0 && room < want)
                    want = room;
                if (want == 0) {
                    atomic_store(&k->dirty, 1); /* waits for an acknowledgement */
                    continue;
                }
                long long got = direct_read(m, k, want);
                if (got == -ENODATA) {
                    m->dlinks[slow++] = k;
                } else if (got == -ENOMEM) {
                    goto nomem;
                } else if (got < 0) {
                    kvlog_rated(&mq_bad_rate, KVLOG_WARNING, "mqtt: delivery of %.*s to %.*s failed: not a stream",
                                (int)k->topic->n, k->topic->name, (int)s->idlen, s->id);
                } else {
                    if (got >= want) { /* maybe more: read again */
                        atomic_store_explicit(&k->dirty, 1, memory_order_relaxed);
                        atomic_store(&s->ready, 1);
                    }
                }
            }
            m->ndlinks = slow;
            if (!slow)
                continue;
            room = flight_room(m);
            for (int i = 0; i < m->ndlinks; i++)
                if (m->dlinks[i]->qos > 0 && room < count)
                    count = room;
            if (count == 0) {
                for (int i = 0; i < m->ndlinks; i++)
                    atomic_store(&m->dlinks[i]->dirty, 1);
                continue;
            }
            /* XREAD COUNT n STREAMS key... id...: keys and IDs laid out in m->args */
            m->args.len = 0;
            int a = 0;
            mq_arg(m, &a, "XREAD", 5);
            mq_arg(m, &a, "COUNT", 5);
            char cnt[24];
            cnt[resp_ll2str(cnt, count)] = 0;
            size_t offs[2 * DELIVER_KEYS + 1], lens[2 * DELIVER_KEYS];
            int nk = m->ndlinks;
            for (int i = 0; i < nk; i++) {
                struct mq_topic *t = m->dlinks[i]->topic;
                offs[i] = m->args.len;
                if (kvbuf_append(&m->args, m->b->prefix, m->b->plen) || kvbuf_append(&m->args, t->name, t->n))
                    goto nomem;
                lens[i] = m->args.len - offs[i];
            }
            for (int i = 0; i < nk; i++) {
                offs[nk + i] = m->args.len;
                if (put_id(&m->args, m->dlinks[i]->last))
                    goto nomem;
                lens[nk + i] = m->args.len - offs[nk + i];
            }
            if (kvbuf_append(&m->args, cnt, strlen(cnt)))
                goto nomem;
            mq_arg(m, &a, m->args.p + m->args.len - strlen(cnt), strlen(cnt));
            mq_arg(m, &a, "STREAMS", 7);
            for (int i = 0; i < 2 * nk; i++)
                mq_arg(m, &a, m->args.p + offs[i], lens[i]);
            m->dcount = count; /* (kept for a run after a stall) */
            m->delivering = a;
        }
        count = m->dcount;
        int rc = mq_run(m, m->delivering, NULL);
        if (rc == SES_STALL) { /* a batch to read back from the data file: runs again then */
            pconn_stall(c);
            break;
        }
        m->delivering = 0;
        if (rc < 0 && rc != -1)
            goto nomem;
        if (rc == -1) {
            /* one stream that cannot be read (no longer a stream) must not hold up
             * the others: they are read one by one from now on, it alone dropped */
            if (m->ndlinks > 1) {
                m->single = 1;
                for (int i = 0; i < m->ndlinks; i++)
                    atomic_store(&m->dlinks[i]->dirty, 1);
                atomic_store(&s->ready, 1);
                continue;
            }
            kvlog_rated(&mq_bad_rate, KVLOG_WARNING, "mqtt: delivery of %.*s to %.*s failed: %s",
                        (int)m->dlinks[0]->topic->n, m->dlinks[0]->topic->name, (int)s->idlen, s->id, mq_run_error(m));
            continue;
        }
        int sr = send_entries(m, count);
        if (sr == -ENOMEM)
            goto nomem;
        if (sr < 0) {
            kvlog_write(KVLOG_WARNING, "mqtt: delivery to %.*s: unreadable XREAD reply", (int)s->idlen, s->id);
            break;
        }
    }
    if (atomic_load(&s->ready) && !m->delivering && mq_backlog(c) <= OUT_PAUSE / 2) {
        /* rounds left over: after the poller's other work, not never */
        atomic_store_explicit(&c->p->mq.wake, 1, memory_order_release);
        uint64_t one = 1;
        (void)!write(c->p->evfd, &one, sizeof one);
    }
    if (c->out.len > out_before)
        pconn_pending(c);
    return;
nomem:
    m->delivering = 0;
    mq_logf(m, "out of memory delivering", NULL);
    pconn_close(c);
}


void mqtt_drained(struct conn *c)
{
    struct mq_conn *m = c->mq;
    if (m->sess && !m->delivering && atomic_load_explicit(&m->sess->ready, memory_order_acquire))
        mq_deliver(m);
}

void mqtt_wakeups(struct poller *p)
{
    if (!atomic_load_explicit(&p->mq.wake, memory_order_relaxed) ||
        !atomic_exchange_explicit(&p->mq.wake, 0, memory_order_acq_rel))
        return;
    for (struct mq_conn *m = p->mq.conns, *next; m; m = next) {
        next = m->next;
        if (m->c->closed)
            continue;
        if (m->nacks)
            mq_release_acks(m); /* woken by a subscriber whose queue went down */
        if (m->waiting) {
            mqtt_input(m->c);
            if (!m->c->closed)
                pconn_pending(m->c);
        } else if (m->sess && !m->delivering && atomic_load_explicit(&m->sess->ready, memory_order_acquire)) {
            mq_deliver(m);
        }
    }
}

