/* mqtt.h - MQTT 3.1.1 packets: bytes from the network to packets, packets to bytes.
 *
 * Untrusted input, bounded: a packet is framed by its fixed header (the remaining
 * length a varint of at most 4 bytes, and never more than the caller's maximum
 * packet size), then each variable part is read within that length; every string is
 * checked as the specification asks (well-formed UTF-8, no U+0000). A parse either
 * yields the packet or says why it is malformed; the connection is then closed
 * (MQTT 3.1.1 has no error reply, section 4.8). Parsing copies nothing: strings point
 * into the caller's buffer. No allocation, no state: any thread.
 */
#ifndef KV_PROTO_MQTT_H
#define KV_PROTO_MQTT_H

#include <stddef.h>
#include <stdint.h>

#include "core/kvbuf.h"

enum {
    MQTT_CONNECT = 1, MQTT_CONNACK, MQTT_PUBLISH, MQTT_PUBACK, MQTT_PUBREC, MQTT_PUBREL, MQTT_PUBCOMP,
    MQTT_SUBSCRIBE, MQTT_SUBACK, MQTT_UNSUBSCRIBE, MQTT_UNSUBACK, MQTT_PINGREQ, MQTT_PINGRESP, MQTT_DISCONNECT,
};

/* CONNACK return codes (3.2.2.3) */
enum {
    MQTT_CONN_OK = 0, MQTT_CONN_VERSION = 1, MQTT_CONN_ID = 2, MQTT_CONN_UNAVAILABLE = 3,
    MQTT_CONN_CREDENTIALS = 4, MQTT_CONN_NOT_AUTHORIZED = 5,
};

#define MQTT_MAX_REMAINING 268435455 /* the largest remaining length four varint bytes hold */

struct mqtt_str {
    const uint8_t *p;
    size_t n;
};

struct mqtt_frame {
    int type, flags;     /* the first byte's two halves */
    size_t hlen;         /* fixed header bytes (2..5) */
    size_t len;          /* remaining length: the body after the fixed header */
};

/* Frame the packet at p[0..n): 1 and *f when it is all there, 0 when more bytes
 * are needed, -1 when it is malformed or larger than max_packet bytes (whole
 * packet), with the reason in *err. Checks the type and the fixed header's flags
 * (3.x.1: reserved bits as the specification fixes them, PUBLISH's QoS 3 refused). */
int mqtt_frame(const uint8_t *p, size_t n, size_t max_packet, struct mqtt_frame *f, const char **err);

struct mqtt_connect {
    struct mqtt_str proto;       /* "MQTT" */
    int level;                   /* 4 for 3.1.1 */
    int clean, keepalive;        /* clean session flag, keep alive in seconds */
    int will, will_qos, will_retain;
    int has_user, has_pass;
    struct mqtt_str client_id, will_topic, will_msg, user, pass;
};

/* CONNECT's body: 0, a CONNACK code the connection is refused with
 * (MQTT_CONN_VERSION: a protocol level other than 4 under the name "MQTT", or
 * MQIsdp/3; MQTT_CONN_ID: an empty client id without clean session), or -1 malformed
 * (*err: why; close without a CONNACK). */
int mqtt_parse_connect(const uint8_t *b, size_t n, struct mqtt_connect *c, const char **err);

struct mqtt_publish {
    int qos, retain, dup;
    uint16_t id;                 /* QoS 1 and 2 only */
    struct mqtt_str topic, payload;
};

/* PUBLISH's body (flags: the fixed header's): 0 or -1 malformed (*err). The topic
 * is checked as a topic name (mqtt_topic_ok). */
int mqtt_parse_publish(int flags, const uint8_t *b, size_t n, struct mqtt_publish *m, const char **err);

/* The packet id of PUBACK, PUBREC, PUBREL, PUBCOMP (a body of exactly 2 bytes, the
 * id not 0): 0 or -1 (*err). */
int mqtt_parse_id(const uint8_t *b, size_t n, uint16_t *id, const char **err);

/* SUBSCRIBE and UNSUBSCRIBE: the packet id (not 0), then topic filters (each with a
 * requested QoS byte for SUBSCRIBE). mqtt_parse_subs checks the whole body -- at
 * least one filter, every filter well formed (mqtt_filter_ok) and every QoS 0..2
 * with its reserved bits 0 -- and returns the number of filters, or -1 (*err).
 * mqtt_next_sub then walks them from *off (start at 2, after the id): 1 and the
 * next filter, 0 at the end. */
int mqtt_parse_subs(const uint8_t *b, size_t n, int with_qos, uint16_t *id, const char **err);
int mqtt_next_sub(const uint8_t *b, size_t n, int with_qos, size_t *off, struct mqtt_str *filter, int *qos);

/* A topic name one may publish to: 1..65535 bytes of well-formed UTF-8 without
 * U+0000 and without wildcards. A topic filter: the same with '+' as a whole level
 * and '#' as the whole last level. */
int mqtt_utf8_ok(const uint8_t *p, size_t n);
int mqtt_topic_ok(const uint8_t *p, size_t n);
int mqtt_filter_ok(const uint8_t *p, size_t n);
/* Does filter match topic (4.7)? A topic starting with '$' is not matched by a
 * filter starting with a wildcard. */
int mqtt_match(const uint8_t *filter, size_t flen, const uint8_t *topic, size_t tlen);

/* Append a packet to out: 0 or -ENOMEM. */
int mqtt_put_header(struct kvbuf *out, int type, int flags, size_t len);
int mqtt_put_connack(struct kvbuf *out, int session_present, int code);
/* PUBACK, PUBREC, PUBREL (flags 2), PUBCOMP, UNSUBACK: a packet id and nothing else. */
int mqtt_put_ack(struct kvbuf *out, int type, uint16_t id);
/* PUBLISH: 0, -E2BIG (larger than a packet can be: nothing appended) or -ENOMEM. */
int mqtt_put_publish(struct kvbuf *out, int qos, int retain, int dup, uint16_t id, const void *topic, size_t tlen,
                     const void *payload, size_t plen);
int mqtt_put_suback(struct kvbuf *out, uint16_t id, const uint8_t *codes, size_t n);

#endif
