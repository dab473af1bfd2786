/* mqtt_session.c - a persistent MQTT session as bytes (see mqtt.h): what the key
 * <mqtt_session_prefix><client id> holds, written by mq_sess_save and read back
 * after a restart by mq_sess_restore. The bytes come from the store, which this
 * server wrote, but are read as untrusted all the same: every count and length
 * bounded, a damaged record logged and what was read before it kept. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "frontend/mqtt_int.h"
#include "proto/mqtt.h"

/* ---- a persistent session's bytes: "KVMQ 1\n", then lines
 *   f <qos> <since_ms> <len> <filter>\n     a subscription
 *   c <ms> <seq> <len> <topic>\n            a topic's cursor (messages after it are due)
 *   q <packet id>\n                         a QoS 2 id received, PUBREL not yet */

/* The cursor a restart may go on from: before the first message in flight on
 * that topic (not acknowledged), else the last one sent. */
static struct mq_id acked_cursor(const struct mq_sess *s, const struct mq_link *k)
{
    struct mq_id c = k->last;
    for (int i = 0; i < s->nflight; i++) {
        const struct mq_flight *f = &s->flight[i];
        if (f->topic != k->topic || f->state != FLIGHT_PUBLISHED)
            continue; /* (a QoS 2 message its client received: PUBREC came, not due again) */
        struct mq_id before = f->eid.seq ? (struct mq_id){f->eid.ms, f->eid.seq - 1}
                                         : (struct mq_id){f->eid.ms - 1, UINT64_MAX};
        if (before.ms < c.ms || (before.ms == c.ms && before.seq < c.seq))
            c = before;
    }
    return c;
}

int mq_sess_save(struct mq_broker *b, struct mq_sess *s, struct kvbuf *out)
{
    int rc = kvbuf_printf(out, "KVMQ 1\n");
    pthread_mutex_lock(&b->lock);
    for (struct mq_filter *f = s->filters; f && !rc; f = f->next)
        rc = kvbuf_printf(out, "f %d %lld %zu ", f->qos, (long long)f->since_ms, f->n) ||
             kvbuf_append(out, f->f, f->n) || kvbuf_append(out, "\n", 1);
    for (int i = 0; i < s->nlinks && !rc; i++) {
        struct mq_link *k = s->links[i];
        if (k->qos == 0)
            continue; /* QoS 0 is not kept for a client that is away: from the restart on */
        struct mq_id c = acked_cursor(s, k);
        rc = kvbuf_printf(out, "c %llu %llu %zu ", (unsigned long long)c.ms, (unsigned long long)c.seq, k->topic->n) ||
             kvbuf_append(out, k->topic->name, k->topic->n) || kvbuf_append(out, "\n", 1);
    }
    pthread_mutex_unlock(&b->lock);
    for (int id = 1; s->qos2_in && id < 65536 && !rc; id++)
        if (s->qos2_in[id >> 3] >> (id & 7) & 1)
            rc = kvbuf_printf(out, "q %d\n", id);
    return rc ? -ENOMEM : 0;
}

/* Read "<number> " at *p (bounded by end). */
static int rd_num(const char **p, const char *end, unsigned long long *v)
{
    const char *q = *p;
    unsigned long long n = 0;
    int digits = 0;
    while (q < end && *q >= '0' && *q <= '9' && digits < 20)
        n = n * 10 + (unsigned long long)(*q++ - '0'), digits++;
    if (!digits || q >= end || (*q != ' ' && *q != '\n'))
        return -1;
    *v = n;
    *p = q + 1;
    return 0;
}

void mq_sess_restore(struct mq_broker *b, struct mq_sess *s, const char *saved, size_t n)
{
    const char *p = saved, *end = saved + n;
    int64_t now = mq_unix_ms();
    if (n < 7 || memcmp(p, "KVMQ 1\n", 7))
        goto bad;
    p += 7;
    while (p < end) {
        char kind = *p;
        unsigned long long a = 0, bb = 0, len = 0;
        if (p + 2 > end || p[1] != ' ')
            goto bad;
        p += 2;
        if (kind == 'q') {
            if (rd_num(&p, end, &a) || a == 0 || a > 65535)
                goto bad;
            if (!s->qos2_in && !(s->qos2_in = calloc(8192, 1)))
                goto bad;
            s->qos2_in[a >> 3] |= (uint8_t)(1 << (a & 7));
            continue;
        }
        if ((kind != 'f' && kind != 'c') || rd_num(&p, end, &a) || rd_num(&p, end, &bb) || rd_num(&p, end, &len) ||
            len > (unsigned long long)(end - p) - 1 || p[len] != '\n')
            goto bad;
        const char *name = p;
        p += len + 1;
        if (kind == 'f') {
            if (a > 2 || !mqtt_filter_ok((const uint8_t *)name, len))
                goto bad;
            struct mq_filter *f = malloc(sizeof *f + len + 1);
            if (!f)
                goto bad;
            f->qos = (int)a;
            f->since_ms = (int64_t)bb;
            f->n = len;
            memcpy(f->f, name, len);
            f->next = s->filters;
            s->filters = f;
            s->nfilters++;
        } else if (mqtt_topic_ok((const uint8_t *)name, len)) {
            struct mq_topic *t = mq_topic_get(b, name, len); /* (a new topic is linked to s by its filters) */
            int qos = -1;
            for (struct mq_filter *f = s->filters; t && f; f = f->next)
                if (f->qos > qos && mqtt_match((const uint8_t *)f->f, f->n, (const uint8_t *)name, len))
                    qos = f->qos;
            if (t && qos >= 0 && !mq_link_of(s, t))
                mq_link_add(s, t, qos, 0);
            struct mq_link *k = t ? mq_link_of(s, t) : NULL;
            if (k)
                k->last = (struct mq_id){a, bb};
        }
    }
    goto link;
bad:
    kvlog_write(KVLOG_WARNING, "mqtt: the saved session of client %.*s is damaged at byte %zu of %zu; kept what "
                               "was read before it", (int)s->idlen, s->id, (size_t)(p - saved), n);
link:
    /* the topics its filters match that have no cursor: QoS 1/2 from the subscription's
     * time (nothing acknowledged yet), QoS 0 from now */
    for (size_t i = 0; i < b->tcap; i++)
        for (struct mq_topic *t = b->topics[i]; t; t = t->hnext) {
            int qos = -1;
            int64_t since = now;
            for (struct mq_filter *f = s->filters; f; f = f->next)
                if (f->qos > qos && mqtt_match((const uint8_t *)f->f, f->n, (const uint8_t *)t->name, t->n)) {
                    qos = f->qos;
                    since = f->qos ? f->since_ms : now;
                }
            if (qos >= 0 && !mq_link_of(s, t))
                mq_link_add(s, t, qos, since);
        }
}
