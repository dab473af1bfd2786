/* mqttgen.h - MQTT 3.1.1 publishers and subscribers for the message-queue comparisons
 * (paper 004 against Mosquitto, the broker an IoT user would otherwise pick). Called
 * from Python through cffi like lg_run: blocks, never prints, never exits.
 *
 * cfg->conns clients (client ids "kvbench-<seed>-<i>", clean session) over cfg->threads
 * threads, each publishing cfg->msg_size-byte messages to topic "t/<i mod topics>":
 *   QoS 1: up to cfg->window PUBLISHes unacknowledged per client, each PUBACK lets
 *          the next one go; a message counts when its PUBACK arrives, its latency is
 *          PUBLISH to PUBACK;
 *   QoS 2: the same with PUBREC, PUBREL, PUBCOMP: a message counts at its PUBCOMP;
 *   QoS 0: rounds of cfg->window PUBLISHes followed by a PINGREQ; the PINGRESP says
 *          the broker has read them all (one connection is processed in order), so the
 *          round's messages count then, and the round trip is the latency.
 * Stops at the deadline or after cfg->messages in total (0: no bound).
 *
 * cfg->subscribers more clients ("kvbench-<seed>-s<i>") subscribe to "t/#" with QoS
 * cfg->sub_qos before anyone publishes, so each gets every message; they acknowledge
 * what their QoS asks (PUBACK; PUBREC then PUBCOMP). A payload of 8 bytes or more
 * starts with its send time, so a delivery's latency is publish to delivery. After
 * the publishers stop, deliveries are waited for until none came for 500 ms. */
#ifndef KVSTORE_MQTTGEN_H
#define KVSTORE_MQTTGEN_H

#include <stdint.h>

struct mq_config {
    const char *host;        /* IPv4 dotted address */
    int port;
    int threads, conns;      /* conns >= threads */
    int qos;                 /* 0, 1 or 2 */
    int subscribers;         /* 0..10000 clients subscribed to t/# */
    int sub_qos;             /* their subscriptions' QoS: 0, 1 or 2 */
    int window;              /* 1..65535: messages in flight per client */
    int msg_size;            /* payload bytes, 0..65536 */
    int topics;              /* 1..1000000 */
    double duration;         /* seconds (0: until messages) */
    uint64_t messages;       /* total bound (0: until duration) */
    uint64_t seed;
    volatile int *stop;
};

struct mq_result {
    uint64_t messages;       /* acknowledged (QoS 1) or confirmed by PINGRESP (QoS 0) */
    double elapsed, throughput;
    double lat_p50_us, lat_p99_us;
    uint64_t delivered;      /* PUBLISHes the subscribers received */
    double deliver_throughput, dlat_p50_us, dlat_p99_us, dlat_p999_us;
    char error[256];
};

/* 0, or -errno with out->error set (-EINVAL bad config, connect errors, -ECONNREFUSED
 * a CONNACK that refused, -EPROTO a packet that is not what MQTT answers). */
int mq_run(const struct mq_config *cfg, struct mq_result *out);

#endif
