/* mqtt_int.h - the MQTT broker's structures, shared by mqtt_broker.c (topics,
 * sessions, subscriptions, retained messages: the broker lock's tables) and
 * mqtt_conn.c (a connection's packets and deliveries). See mqtt.h. */
#ifndef KV_MQTT_INT_H
#define KV_MQTT_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/kvbuf.h"
#include "core/list.h"
#include "core/log.h"
#include "frontend/mqtt.h"

struct kv_engine;

#define MQ_MAX_FILTERS 1000 /* subscriptions of one session (a SUBSCRIBE past it: 0x80 for the rest) */

/* A stream ID (core/stream.h's, without its header). */
struct mq_id {
    uint64_t ms, seq;
};

/* A topic the broker has seen written (a stream under the prefix). Never freed
 * while the broker lives. */
struct mq_topic {
    struct mq_topic *hnext;
    uint64_t h;
    struct list links;           /* mq_link.tnode: sessions whose filters match it */
    struct kvbuf retained;       /* its retained message: QoS byte, then the payload */
    int has_retained;
    _Atomic int indexed;         /* in the topic index (the hash <prefix>), or being put there */
    size_t n;
    char name[];                 /* the topic (without the prefix) */
};

/* A session's interest in one topic: the cursor into its stream. */
struct mq_link {
    struct list tnode;           /* on topic->links (broker lock) */
    struct mq_topic *topic;
    struct mq_sess *sess;
    int qos;                     /* the largest QoS its session's matching filters grant */
    _Atomic int dirty;           /* the stream was written since the session last read it */
    _Atomic int64_t queued;      /* writes to its stream counted by the tap, not yet sent to
                                    its session or dropped (what was there before: not counted) */
    struct mq_id last;           /* messages after this one are due (the session's thread) */
};

struct mq_filter {
    struct mq_filter *next;
    int qos;
    int64_t since_ms;            /* when it was subscribed (Unix ms): topics first written
                                    later are read from this time on */
    size_t n;
    char f[];
};

/* A PUBLISH sent with QoS 1 or 2 and not yet acknowledged. */
struct mq_flight {
    struct mq_topic *topic;      /* the message's topic (NULL: a retained copy) */
    struct mq_id eid;            /* and its stream entry */
    uint16_t id;
    uint8_t state;               /* FLIGHT_PUBLISHED, FLIGHT_RELEASED (QoS 2: PUBREL sent) */
    uint8_t qos;
    char *pkt;                   /* the packet, resent (DUP) on reconnect */
    size_t len;
};
enum { FLIGHT_PUBLISHED = 1, FLIGHT_RELEASED };

struct mq_sess {
    struct mq_sess *hnext;       /* broker hash by client id */
    struct list node;            /* broker->sessions */
    struct mq_conn *conn;        /* its connection, NULL while none (broker lock) */
    struct mq_poller *mp;        /* that connection's poller and eventfd (broker lock) */
    int evfd;
    _Atomic int ready;           /* some link is dirty */
    _Atomic int64_t queued;      /* the sum of its links' queued: its queue (mqtt_max_queued) */
    _Atomic uint64_t slowed;     /* pollers (bit idx % 64) where a publisher waits for it */
    int clean;
    struct mq_poller *waiter_mp; /* a CONNECT waiting for this session's connection to go: */
    int waiter_evfd;             /* woken when it has (broker lock) */
    int nfilters;
    struct mq_filter *filters;   /* broker lock */
    struct mq_link **links;      /* broker lock */
    int nlinks, caplinks;
    int next_link;               /* where mq_dirty_links goes on (broker lock) */
    /* the session's thread only */
    struct mq_flight *flight;
    int nflight, capflight;
    uint16_t next_id;
    uint8_t *qos2_in;            /* bitmap of QoS 2 packet ids received, PUBREL not yet (8 KiB) */
    uint64_t h;
    size_t idlen;
    char id[];
};

struct mq_ack {
    uint64_t need;               /* the LSN the log must hold first */
    uint16_t id;
    uint8_t type;
};
#define ACKS_MAX 65536 /* withheld; then its input waits too */

struct mq_conn {
    struct mq_conn *prev, *next; /* on its poller's list */
    struct mq_broker *b;
    struct conn *c;
    struct mq_sess *sess;        /* after an accepted CONNECT */
    int disconnected;            /* DISCONNECT received: no will */
    int waiting;                 /* its CONNECT waits for the session's old connection to go */
    _Atomic int kicked;          /* taken over by a new connection (set by its thread): closing */
    int keepalive;               /* seconds, 0: none */
    int64_t last_in_ms;          /* CLOCK_MONOTONIC_COARSE */
    struct mq_topic *slowed_on;  /* its last QoS 1/2 message filled a connected session's queue */
    struct mq_ack *acks;         /* the PUBACKs/PUBRECs withheld meanwhile, in order */
    int nacks, capacks;
    int step;                    /* a publish resumed after a stall: its next part (PUB_*) */
    char at[24];                 /* that publish's receive time, kept across the stall */
    int delivering;              /* a delivery's XREAD stalled: it runs again first (argc) */
    long long dcount;            /* its COUNT */
    int single;                  /* a stream could not be read: one stream per XREAD */
    struct kvbuf scratch;        /* ses_run's RESP replies */
    struct kvbuf args;           /* the key of the request being run (keys + IDs for XREAD) */
    const char *argv[136];
    size_t argl[136];
    struct mq_link *dlinks[64];  /* the links the stalled XREAD reads */
    int ndlinks;
    int connected;               /* its CONNECT was accepted */
    int present;                 /* its CONNECT found the session (kept across a stall) */
    char *saved;                 /* the session as its key held it (a CONNECT loading it) */
    size_t savedlen;
    int loaded;                  /* that key was read (saved NULL: there was none) */
    int redo;                    /* an internal request stalled: REDO_* runs again first */
    int cursors_moved;           /* acknowledgements moved cursors since the session was saved */
    int64_t saved_ms;            /* when (CLOCK_MONOTONIC_COARSE) */
    char *will;                  /* topic, then message; NULL: none */
    size_t will_tlen, will_mlen;
    int will_qos, will_retain;
};

struct mq_stats {
    _Atomic uint64_t connections, sessions, in[3], out[3], retained, dropped, refused, malformed;
    _Atomic uint64_t queue_dropped, slowed; /* QoS 0 past a session's queue bound; publishers slowed */
};

struct mq_broker {
    struct kv_engine *eng;
    pthread_mutex_t lock;
    char *prefix, *retained_key, *session_prefix;
    size_t plen, rklen, splen;
    /* topics and sessions by hash (chained; grown by doubling) */
    struct mq_topic **topics;
    size_t ntopics, tcap;
    struct mq_sess **sess;
    size_t nsess, scap;
    struct list sessions;
    uint64_t next_auto;          /* ids given to clients that sent none */
    _Atomic int indexed;         /* the topic index was read (mq_load_index) */
    _Atomic int retained_loaded; /* the retained messages were read (mq_load_retained) */
    struct mq_users *users;      /* --mqtt-users, or NULL */
    struct poller *_Atomic slow_p[64]; /* the poller of slowed-bit i (idx % 64) */
    struct mq_stats st;
};

/* ---- mqtt_broker.c (each takes the broker lock unless it says it is held) */

/* The session of client id (found, or new; an old one taken over is ended first when
 * clean): 1 found (session present), 0 new, -EBUSY its connection is still attached
 * (that one is shut down: try again once it is gone), -ENOSPC mqtt_max_sessions
 * reached, -ENOMEM. Attaches m to it on 0 and 1 (and on a second call by m: 1). A
 * new persistent session is restored from saved (mq_sess_save's bytes) if given. */
int mq_sess_attach(struct mq_broker *b, struct mq_conn *m, const char *id, size_t idlen, int clean, int evfd,
                   struct mq_poller *mp, const char *saved, size_t savedlen);
/* After an XADD by MQTT on this thread: 1 if its topic must be put in the topic
 * index (the hash whose key is the prefix itself, which no topic can be: HKEYS lists
 * every topic published), which the caller does; 0 if it is there already. The tap
 * (which that XADD ran) left the topic in a thread-local: no lock. *full is that
 * topic if the write filled the queue (mqtt_max_queued) of a connected session that
 * takes it at QoS 1 or 2, else NULL. */
int mq_topic_claim(struct mq_topic **full);
/* m's publisher is slowed (m->slowed_on set: its PUBACKs/PUBRECs withheld) while a
 * connected session taking that topic at QoS 1/2 has more than half of
 * mqtt_max_queued queued: 1 still so (its poller is woken when that queue is down to
 * half), 0 not (slowed_on cleared). */
int mq_slow(struct mq_broker *b, struct mq_conn *m);
/* n messages of link k were sent or dropped: its queue and its session's shrink;
 * publishers waiting for the session are woken once that is down to half. */
void mq_dequeued(struct mq_broker *b, struct mq_link *k, int64_t n);
/* Wake the publishers waiting for s (any thread). */
void mq_wake_slowed(struct mq_broker *b, struct mq_sess *s);
/* The index read back (a RESP array of topics, HKEYS's reply): every topic known,
 * linked to the sessions whose filters match it. 0 or -ENOMEM. */
int mq_load_index(struct mq_broker *b, const char *reply, size_t n);
/* The retained messages read back (HGETALL's reply: topic, QoS byte + payload, ...):
 * kept for topics that have none yet in this run. 0 or -ENOMEM. */
int mq_load_retained(struct mq_broker *b, const char *reply, size_t n);
/* Broker lock held: the topic (made, and linked to the sessions whose filters match
 * it, when new; NULL out of memory); s's link to t or NULL; a link of s to t at qos
 * whose cursor starts at since_ms (0: the stream's start), raised. */
struct mq_topic *mq_topic_get(struct mq_broker *b, const char *name, size_t n);
struct mq_link *mq_link_of(struct mq_sess *s, struct mq_topic *t);
int mq_link_add(struct mq_sess *s, struct mq_topic *t, int qos, int64_t since_ms);

/* The time now, Unix ms (CLOCK_REALTIME, as stream IDs). */
int64_t mq_unix_ms(void);
/* Is a session of client id in memory? */
int mq_sess_known(struct mq_broker *b, const char *id, size_t idlen);
/* m's connection is gone: detach its session; a clean one is ended. */
void mq_sess_detach(struct mq_broker *b, struct mq_conn *m);
/* Subscribe s to filter f (granted qos); existing links keep their cursors. Appends
 * to out the retained messages of the topics it matches (as PUBLISH packets whose
 * QoS is at most qos; QoS > 0 ones through mq_flight_add). 0 or -ENOMEM. */
int mq_subscribe(struct mq_broker *b, struct mq_conn *m, const char *f, size_t n, int qos, struct kvbuf *out);
void mq_unsubscribe(struct mq_broker *b, struct mq_sess *s, const char *f, size_t n);
/* Remember (or clear: plen 0) topic's retained message in memory. 0 or -ENOMEM. */
int mq_retain(struct mq_broker *b, const char *topic, size_t tlen, int qos, const void *payload, size_t plen);
/* Collect up to max dirty links of s (clearing their flags) into v. */
int mq_dirty_links(struct mq_broker *b, struct mq_sess *s, struct mq_link **v, int max);
/* The tap (keywait): key was written. */
void mq_tap(void *arg, const void *key, size_t klen);

/* ---- mqtt_session.c */
/* A persistent session as bytes (its filters, the cursors of its links up to what
 * its client acknowledged, the QoS 2 ids it received and has not seen released)
 * appended to out: what the key <mqtt_session_prefix><client id> holds, read back
 * by mq_sess_attach after a restart. 0 or -ENOMEM. */
int mq_sess_save(struct mq_broker *b, struct mq_sess *s, struct kvbuf *out);
/* Restore s (new, listed, no links yet) from saved (mq_sess_save's bytes); broker
 * lock held. */
void mq_sess_restore(struct mq_broker *b, struct mq_sess *s, const char *saved, size_t n);

/* ---- mqtt_users.c: the password file (--mqtt-users, mosquitto_passwd's format) */
struct mq_users;
/* Read it: 0, or -errno with a message naming the line in err. */
int mq_users_load(const char *path, struct mq_users **out, char *err, size_t errlen);
void mq_users_free(struct mq_users *us);
/* 1 if user is in the file and pass is its password (constant time), else 0. Any thread. */
int mq_users_check(const struct mq_users *us, const void *user, size_t ulen, const void *pass, size_t plen);

/* ---- mqtt_conn.c */

/* poller.c's, for a connection of either protocol */
void pconn_close(struct conn *c);
void pconn_stall(struct conn *c);
void pconn_pending(struct conn *c);
int pconn_stalled(const struct conn *c);

/* shared by mqtt_conn.c and mqtt_deliver.c */
extern struct kvlog_rate mq_bad_rate;
/* Log (rate-limited) why m is being closed. */
void mq_logf(struct mq_conn *m, const char *what, const char *why);
/* Set argument *n of the request being built and count it. */
void mq_arg(struct mq_conn *m, int *n, const void *s, size_t len);
/* Run m->argv[0..argc) through the connection's session (the RESP reply in
 * m->scratch): SES_DONE/SES_HOLD (the LSN it needs raised into *need), SES_STALL,
 * -1 when the reply is an error (mq_run_error: its text), or -ENOMEM. */
int mq_run(struct mq_conn *m, int argc, uint64_t *need);
const char *mq_run_error(struct mq_conn *m);
/* A reader of RESP2 replies this server wrote (XREAD's, HKEYS's, ...): bounded all
 * the same. mq_rr_int: "<type><n>\r\n" (0 and n, or -1); mq_rr_bulk: a bulk string
 * (0 and its bytes, or -1: nil or anything else). */
struct mq_rr {
    const char *p, *end;
};
int mq_rr_int(struct mq_rr *r, char type, long long *v);
int mq_rr_bulk(struct mq_rr *r, const char **s, size_t *n);
/* The bulk string mq_run's reply is: 0 and its bytes, or -1 (nil, or not a bulk). */
int mq_reply_bulk(struct mq_conn *m, const char **v, size_t *n);
/* Bytes queued to c and not yet sent. */
size_t mq_backlog(const struct conn *c);
/* The acknowledgements withheld from a slowed publisher go out once it is no longer so. */
void mq_release_acks(struct mq_conn *m);
/* Deliver what the session's raised links have (mqtt_deliver.c). */
void mq_deliver(struct mq_conn *m);
struct mq_flight *mq_flight_find(struct mq_sess *s, uint16_t id);
void mq_flight_drop(struct mq_sess *s, struct mq_flight *f);

/* Queue a QoS 1/2 PUBLISH of s for acknowledgement (its packet id taken from the
 * session): appends the packet to out. 0 or -ENOMEM. */
int mq_send_publish(struct mq_sess *s, struct kvbuf *out, int qos, int retain, struct mq_topic *topic,
                    struct mq_id eid, const void *payload, size_t plen);

#endif
