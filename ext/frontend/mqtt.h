/* mqtt.h - MQTT 3.1.1 on the pollers: a broker whose topics are streams.
 *
 * With mqtt_port set, every poller also listens there (poller_life.c) and serves
 * the connections it accepts with this protocol instead of RESP: same threads,
 * same epoll loop, same log wake-ups (poller.c calls the hooks below). What a
 * client publishes to topic T is appended with XADD (through ses_run, so it is
 * logged, replicated, spilled and held like any write) to the stream
 * <mqtt_topic_prefix>T, one entry per message with the fields payload, qos, retain,
 * client and at (the server's receive time, Unix ms); a QoS 1 PUBACK (QoS 2 PUBREC)
 * is held until the log holds that entry, as a RESP reply would be.
 *
 * Subscribers read the stream tails: a session keeps, per topic its filters match,
 * the last ID it was given (a link), and any write to a stream under the prefix --
 * by MQTT or by a RESP client's XADD -- raises the links of that topic (through the
 * key-wait registry's tap, core/keywait.h) and wakes the session's poller, which
 * reads what is new with XREAD and sends it as PUBLISH packets. Nothing is copied
 * per subscriber until it is sent, and a slow subscriber only falls behind in the
 * stream (which keeps every message): nothing acknowledged is dropped.
 *
 * Threads: the broker's tables (topics, sessions, links, retained messages) are
 * guarded by one mutex, taken per packet that changes them and per write to a
 * topic with subscribers; a connection and its session are touched only by their
 * poller (a session moves to another poller only when its old connection is gone).
 */
#ifndef KV_FRONTEND_MQTT_H
#define KV_FRONTEND_MQTT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct kv_engine;
struct conn;
struct poller;
struct mq_broker;
struct mq_conn;

/* The broker over eng (settings eng->cfg.mqtt_*), its tap on stream writes and its
 * INFO section; topics already in the table are found. Control thread, before the
 * pollers start. 0 or -errno with a message in err. */
int mqtt_create(struct mq_broker **out, struct kv_engine *eng, char *err, size_t errlen);
void mqtt_destroy(struct mq_broker *b);

/* Per-poller state (in struct poller). */
struct mq_poller {
    _Atomic int wake;            /* some session of this poller has new messages */
    struct mq_conn *conns;       /* its MQTT connections (a doubly linked list) */
};

/* A connection the poller accepted on the MQTT port: its protocol state. 0 or -ENOMEM. */
int mqtt_conn_new(struct mq_broker *b, struct conn *c);
/* Parse and run the packets in c->in (as process_input for RESP). */
void mqtt_input(struct conn *c);
/* The connection closes (poller.c's conn_close, before the socket is closed): its
 * will is published unless it sent DISCONNECT, its session kept or ended. */
void mqtt_closed(struct conn *c);
/* Freed with the connection. */
void mqtt_conn_free(struct conn *c);
/* Its output drained (more may be delivered now). */
void mqtt_drained(struct conn *c);
/* The poller's eventfd fired, or its round ends: deliver to the sessions that were
 * woken (a write by this thread itself raises its sessions without the eventfd). */
void mqtt_wakeups(struct poller *p);
/* The calling thread is poller p's (at its start). */
void mqtt_poller_thread(struct poller *p);
/* Every TCP_CRON_MS: keep-alive expiry, takeovers that wait for the old connection. */
void mqtt_cron(struct poller *p);

#endif
