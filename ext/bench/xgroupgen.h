/* xgroupgen.h - the consumer load of the message queue (paper 004): consumers that
 * read a stream with XREADGROUP GROUP g <consumer> COUNT n STREAMS key > and
 * acknowledge what they got with XACK, as a worker pool draining a queue does.
 * Works against kvstore and Redis alike (RESP2). Called from Python through cffi
 * like lg_run: blocks, never prints, never exits.
 *
 * Each of cfg->conns connections is one consumer ("c<i>") on stream key:<i mod
 * streams> (key:%012llu) of group cfg->group, served by cfg->threads threads;
 * every consumer keeps its round in flight (a thread waits for whichever reply
 * comes first), so conns rounds are in flight in all. A consumer sends
 * XREADGROUP, and with each later read the XACK of the entries the previous
 * one returned (one write, two replies), so a round trip moves a batch in
 * and acknowledges the one before. It stops when its stream has nothing
 * new (a read answered with nil: the preloaded messages are consumed), at the
 * deadline, or at max_messages in total (then the last batch is acknowledged). */
#ifndef KVSTORE_XGROUPGEN_H
#define KVSTORE_XGROUPGEN_H

#include <stdint.h>

struct xg_config {
    const char *host;        /* IPv4 dotted address */
    int port;
    int threads, conns;      /* conns >= threads: consumers spread over threads */
    uint64_t streams;        /* consumer i reads key:%012llu with number i mod streams (1..10^12) */
    const char *group;       /* the group, created beforehand (XGROUP CREATE key group 0) */
    int count;               /* COUNT of each XREADGROUP, 1..100000 */
    int ack;                 /* 1: XACK every batch read (0: leave them pending, NOACK-like cost) */
    double duration;         /* seconds (0: until the streams are drained or max_messages) */
    uint64_t max_messages;   /* stop once this many were read in total (0: no bound) */
    const char *password;    /* AUTH first if non-NULL */
    volatile int *stop;      /* optional: nonzero stops the run promptly */
};

struct xg_result {
    uint64_t messages, reads, empty_reads, acked, errors;
    double elapsed;          /* first send to last reply, seconds */
    double throughput;       /* messages read per second */
    double lat_p50_us, lat_p99_us; /* per round trip (a read and the previous batch's XACK) */
    char first_error[128];
    char error[256];
};

/* 0, or -errno with out->error set (-EINVAL bad config, connect errors, -EPROTO a reply
 * that is not RESP or not what the command returns). */
int xg_run(const struct xg_config *cfg, struct xg_result *out);

#endif
