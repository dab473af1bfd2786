/* mqtt.c - MQTT 3.1.1 packets (see mqtt.h). Section numbers are the OASIS
 * standard's. Every read is bounded by the frame's length. */
#include "proto/mqtt.h"

#include <errno.h>
#include <string.h>

/* The flags each type's fixed header must carry (3.x.1); -1: PUBLISH's own. */
static const int fixed_flags[16] = {
    [MQTT_CONNECT] = 0, [MQTT_CONNACK] = 0, [MQTT_PUBLISH] = -1, [MQTT_PUBACK] = 0, [MQTT_PUBREC] = 0,
    [MQTT_PUBREL] = 2, [MQTT_PUBCOMP] = 0, [MQTT_SUBSCRIBE] = 2, [MQTT_SUBACK] = 0, [MQTT_UNSUBSCRIBE] = 2,
    [MQTT_UNSUBACK] = 0, [MQTT_PINGREQ] = 0, [MQTT_PINGRESP] = 0, [MQTT_DISCONNECT] = 0,
};

int mqtt_frame(const uint8_t *p, size_t n, size_t max_packet, struct mqtt_frame *f, const char **err)
{
    if (n < 2)
        return 0;
    f->type = p[0] >> 4;
    f->flags = p[0] & 15;
    if (f->type < MQTT_CONNECT || f->type > MQTT_DISCONNECT) {
        *err = "reserved packet type";
        return -1;
    }
    if (f->type == MQTT_PUBLISH ? ((f->flags >> 1) & 3) == 3 : f->flags != fixed_flags[f->type]) {
        *err = f->type == MQTT_PUBLISH ? "PUBLISH with QoS 3" : "reserved flags of the fixed header not as specified";
        return -1;
    }
    size_t len = 0;
    for (size_t i = 1;; i++) {
        if (i > 4) {
            *err = "remaining length longer than 4 bytes";
            return -1;
        }
        if (i >= n)
            return 0;
        len |= (size_t)(p[i] & 127) << (7 * (i - 1));
        if (!(p[i] & 128)) {
            f->hlen = i + 1;
            break;
        }
    }
    f->len = len;
    if (f->hlen + len > max_packet) {
        *err = "packet larger than the maximum packet size";
        return -1;
    }
    return n >= f->hlen + len;
}

/* ---- reading a body */

struct rd {
    const uint8_t *p;
    size_t n, off;
};

static int rd_u8(struct rd *r, int *v)
{
    if (r->off + 1 > r->n)
        return -1;
    *v = r->p[r->off++];
    return 0;
}

static int rd_u16(struct rd *r, int *v)
{
    if (r->off + 2 > r->n)
        return -1;
    *v = r->p[r->off] << 8 | r->p[r->off + 1];
    r->off += 2;
    return 0;
}

/* A length-prefixed field (1.5.3, 1.5.5 binary data). */
static int rd_bin(struct rd *r, struct mqtt_str *s)
{
    int len;
    if (rd_u16(r, &len) || r->off + (size_t)len > r->n)
        return -1;
    s->p = r->p + r->off;
    s->n = (size_t)len;
    r->off += (size_t)len;
    return 0;
}

static int rd_str(struct rd *r, struct mqtt_str *s) { return rd_bin(r, s) || !mqtt_utf8_ok(s->p, s->n) ? -1 : 0; }

int mqtt_utf8_ok(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = p[i];
        if (c == 0)
            return 0; /* U+0000 (1.5.3: MUST NOT) */
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint32_t cp;
        if ((c & 0xe0) == 0xc0)
            k = 1, cp = c & 0x1f;
        else if ((c & 0xf0) == 0xe0)
            k = 2, cp = c & 0x0f;
        else if ((c & 0xf8) == 0xf0)
            k = 3, cp = c & 0x07;
        else
            return 0;
        if (i + k >= n)
            return 0; /* truncated sequence */
        for (size_t j = 1; j <= k; j++) {
            if ((p[i + j] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (p[i + j] & 0x3f);
        }
        /* overlong forms, surrogates (1.5.3: ill-formed) and past U+10FFFF */
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) ||
            (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
            return 0;
        i += k + 1;
    }
    return 1;
}

int mqtt_topic_ok(const uint8_t *p, size_t n)
{
    return n > 0 && n <= 65535 && !memchr(p, '+', n) && !memchr(p, '#', n) && mqtt_utf8_ok(p, n);
}

int mqtt_filter_ok(const uint8_t *p, size_t n)
{
    if (n == 0 || n > 65535 || !mqtt_utf8_ok(p, n))
        return 0;
    for (size_t i = 0; i < n; i++) {
        int level_start = i == 0 || p[i - 1] == '/';
        int level_end = i + 1 == n || p[i + 1] == '/';
        if (p[i] == '+' && !(level_start && level_end))
            return 0;
        if (p[i] == '#' && !(level_start && i + 1 == n))
            return 0;
    }
    return 1;
}

int mqtt_match(const uint8_t *f, size_t fn, const uint8_t *t, size_t tn)
{
    if (tn && t[0] == '$' && fn && (f[0] == '+' || f[0] == '#'))
        return 0; /* 4.7.2 */
    size_t i = 0, j = 0;
    for (;;) {
        if (i == fn)
            return j == tn;
        if (f[i] == '#') /* the level it stands for and every level below, also none: "a/#" matches "a" */
            return 1;
        if (f[i] == '+') { /* one whole level, possibly empty */
            while (j < tn && t[j] != '/')
                j++;
            i++;
        } else {
            while (i < fn && f[i] != '/') {
                if (j == tn || t[j] != f[i])
                    return 0;
                i++, j++;
            }
            if (j < tn && t[j] != '/')
                return 0;
        }
        /* both at a level's end: f[i] and t[j] are '/' or the end */
        if (i == fn)
            return j == tn;
        /* f has '/': "a/#" also matches "a" (the parent level) */
        if (j == tn)
            return fn - i == 2 && f[i + 1] == '#';
        i++, j++;
    }
}

int mqtt_parse_connect(const uint8_t *b, size_t n, struct mqtt_connect *c, const char **err)
{
    struct rd r = {b, n, 0};
    int flags;
    memset(c, 0, sizeof *c);
    if (rd_str(&r, &c->proto) || rd_u8(&r, &c->level)) {
        *err = "CONNECT without a protocol name and level";
        return -1;
    }
    int is_mqtt = c->proto.n == 4 && !memcmp(c->proto.p, "MQTT", 4);
    int is_31 = c->proto.n == 6 && !memcmp(c->proto.p, "MQIsdp", 6);
    if (!is_mqtt && !is_31) {
        *err = "CONNECT with a protocol name other than MQTT";
        return -1; /* 3.1.2.1: MAY disconnect */
    }
    if (!is_mqtt || c->level != 4)
        return MQTT_CONN_VERSION; /* 3.1.2.2: CONNACK 0x01, then disconnect */
    if (rd_u8(&r, &flags) || rd_u16(&r, &c->keepalive)) {
        *err = "CONNECT truncated in its flags or keep alive";
        return -1;
    }
    if (flags & 1) {
        *err = "CONNECT's reserved flag is not 0";
        return -1;
    }
    c->clean = !!(flags & 2);
    c->will = !!(flags & 4);
    c->will_qos = (flags >> 3) & 3;
    c->will_retain = !!(flags & 32);
    c->has_pass = !!(flags & 64);
    c->has_user = !!(flags & 128);
    if ((!c->will && (c->will_qos || c->will_retain)) || c->will_qos == 3) {
        *err = "CONNECT's will QoS or retain flags are not allowed";
        return -1;
    }
    if (c->has_pass && !c->has_user) {
        *err = "CONNECT with a password but no user name";
        return -1;
    }
    if (rd_str(&r, &c->client_id)) {
        *err = "CONNECT's client identifier missing or not UTF-8";
        return -1;
    }
    if (c->will && (rd_str(&r, &c->will_topic) || rd_bin(&r, &c->will_msg) ||
                    !mqtt_topic_ok(c->will_topic.p, c->will_topic.n))) {
        *err = "CONNECT's will topic or message malformed";
        return -1;
    }
    if ((c->has_user && rd_str(&r, &c->user)) || (c->has_pass && rd_bin(&r, &c->pass))) {
        *err = "CONNECT's user name or password malformed";
        return -1;
    }
    if (r.off != n) {
        *err = "CONNECT longer than its fields";
        return -1;
    }
    if (c->client_id.n == 0 && !c->clean)
        return MQTT_CONN_ID; /* 3.1.3-8 */
    return 0;
}

int mqtt_parse_publish(int flags, const uint8_t *b, size_t n, struct mqtt_publish *m, const char **err)
{
    struct rd r = {b, n, 0};
    int id = 0;
    m->qos = (flags >> 1) & 3;
    m->retain = flags & 1;
    m->dup = !!(flags & 8);
    if (m->qos == 0 && m->dup) {
        *err = "PUBLISH with QoS 0 and DUP set";
        return -1;
    }
    if (rd_bin(&r, &m->topic) || !mqtt_topic_ok(m->topic.p, m->topic.n)) {
        *err = "PUBLISH's topic name malformed, empty or with a wildcard";
        return -1;
    }
    if (m->qos && (rd_u16(&r, &id) || id == 0)) {
        *err = "PUBLISH without a packet identifier";
        return -1;
    }
    m->id = (uint16_t)id;
    m->payload.p = b + r.off;
    m->payload.n = n - r.off;
    return 0;
}

int mqtt_parse_id(const uint8_t *b, size_t n, uint16_t *id, const char **err)
{
    if (n != 2 || (b[0] == 0 && b[1] == 0)) {
        *err = "acknowledgement without a packet identifier, or longer than one";
        return -1;
    }
    *id = (uint16_t)(b[0] << 8 | b[1]);
    return 0;
}

int mqtt_next_sub(const uint8_t *b, size_t n, int with_qos, size_t *off, struct mqtt_str *filter, int *qos)
{
    struct rd r = {b, n, *off};
    if (r.off >= n)
        return 0;
    if (rd_bin(&r, filter))
        return -1;
    *qos = 0;
    if (with_qos && rd_u8(&r, qos))
        return -1;
    *off = r.off;
    return 1;
}

int mqtt_parse_subs(const uint8_t *b, size_t n, int with_qos, uint16_t *id, const char **err)
{
    struct rd r = {b, n, 0};
    int v;
    if (rd_u16(&r, &v) || v == 0) {
        *err = "SUBSCRIBE or UNSUBSCRIBE without a packet identifier";
        return -1;
    }
    *id = (uint16_t)v;
    size_t off = r.off;
    struct mqtt_str f;
    int qos, k, count = 0;
    while ((k = mqtt_next_sub(b, n, with_qos, &off, &f, &qos)) == 1) {
        if (!mqtt_filter_ok(f.p, f.n)) {
            *err = "topic filter malformed (empty, not UTF-8, or a wildcard not a whole level)";
            return -1;
        }
        if (qos > 2) {
            *err = "SUBSCRIBE with a requested QoS above 2 or reserved bits set";
            return -1;
        }
        count++;
    }
    if (k < 0) {
        *err = "SUBSCRIBE or UNSUBSCRIBE truncated in a topic filter";
        return -1;
    }
    if (count == 0) {
        *err = "SUBSCRIBE or UNSUBSCRIBE without a topic filter";
        return -1;
    }
    return count;
}

/* ---- writing */

int mqtt_put_header(struct kvbuf *out, int type, int flags, size_t len)
{
    uint8_t h[5];
    size_t k = 0;
    h[k++] = (uint8_t)(type << 4 | flags);
    do {
        uint8_t d = len & 127;
        len >>= 7;
        h[k++] = d | (len ? 128 : 0);
    } while (len && k < 5);
    return kvbuf_append(out, h, k);
}

int mqtt_put_connack(struct kvbuf *out, int session_present, int code)
{
    uint8_t p[4] = {MQTT_CONNACK << 4, 2, (uint8_t)(session_present && code == 0), (uint8_t)code};
    return kvbuf_append(out, p, 4);
}

int mqtt_put_ack(struct kvbuf *out, int type, uint16_t id)
{
    uint8_t p[4] = {(uint8_t)(type << 4 | (type == MQTT_PUBREL ? 2 : 0)), 2, (uint8_t)(id >> 8), (uint8_t)id};
    return kvbuf_append(out, p, 4);
}

int mqtt_put_publish(struct kvbuf *out, int qos, int retain, int dup, uint16_t id, const void *topic, size_t tlen,
                     const void *payload, size_t plen)
{
    size_t len = 2 + tlen + (qos ? 2 : 0) + plen;
    if (len > MQTT_MAX_REMAINING || tlen > 65535)
        return -E2BIG; /* no PUBLISH can carry it */
    if (kvbuf_reserve(out, len + 5) || mqtt_put_header(out, MQTT_PUBLISH, (dup ? 8 : 0) | qos << 1 | !!retain, len))
        return -ENOMEM;
    uint8_t *p = (uint8_t *)out->p + out->len;
    *p++ = (uint8_t)(tlen >> 8);
    *p++ = (uint8_t)tlen;
    memcpy(p, topic, tlen);
    p += tlen;
    if (qos) {
        *p++ = (uint8_t)(id >> 8);
        *p++ = (uint8_t)id;
    }
    if (plen)
        memcpy(p, payload, plen);
    out->len += len;
    return 0;
}

int mqtt_put_suback(struct kvbuf *out, uint16_t id, const uint8_t *codes, size_t n)
{
    uint8_t p[2] = {(uint8_t)(id >> 8), (uint8_t)id};
    return mqtt_put_header(out, MQTT_SUBACK, 0, 2 + n) || kvbuf_append(out, p, 2) || kvbuf_append(out, codes, n)
               ? -ENOMEM
               : 0;
}
