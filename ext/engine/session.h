/* session.h - the one request runner every front end uses.
 *
 * A session is one client's command state (struct cmd_client) on one engine. A
 * front end parses a request from its protocol and calls ses_run, which runs it
 * and says what must happen to the reply:
 *   SES_DONE   the reply is in out and may leave now;
 *   SES_HOLD   the reply is in out but depends on log records not yet durable: it
 *              may leave once the log's durable LSN reaches s->need (the front end
 *              keeps it, and the replies behind it, until then: wal_durable_lsn,
 *              woken through the eventfd given to ses_subscribe);
 *   SES_STALL  the request must wait for the data file (a key to load, memory
 *              being freed, a sweep): it left no reply, or a partial multi-key reply
 *              to keep (held like any reply when s->need says so), and the front end
 *              runs the same request again (ses_run with the same arguments) when
 *              its eventfd is woken — or, a blocking front end, after ses_wait.
 * s->need accumulates over the runs of one request, so a reply resumed after a
 * stall waits for every LSN any of its runs touched. Replies of one connection
 * must leave in order: a reply behind a held one waits too.
 * Threads: a session belongs to one front-end thread at a time; ses_subscribe is
 * for the control thread.
 */
#ifndef KV_SESSION_H
#define KV_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "cmd/cmd.h"
#include "core/kvbuf.h"

struct kv_engine;

enum { SES_DONE, SES_HOLD, SES_STALL };

struct session {
    struct cmd_client cl;    /* the connection's command state (AUTH, RESP version, name, ...) */
    struct kv_engine *eng;
    int evfd;                /* eventfd the data file writes when a requested load is done;
                                -1: the front end blocks in ses_wait instead */
    uint64_t need;           /* LSN the current request's reply depends on (0: none) */
    int again;               /* the last run stalled: the next run is the same request */
    int stall;               /* after SES_STALL: what it waits for (CMD_STALL_*) */
    /* Stream front ends (TCP): replies held in the output stream, from holds[i].off
     * on waiting for LSN holds[i].lsn (offsets and LSNs ascend); see ses_hold. */
    struct ses_hold { size_t off; uint64_t lsn; } *holds;
    int hold_head, hold_n, hold_cap;
    uint64_t hold_max;
};

/* A new client: id, authenticated unless the engine requires a password, RESP2,
 * replies appended to out. addr names the peer (CLIENT INFO), index the thread. */
void ses_init(struct session *s, struct kv_engine *eng, struct kvbuf *out, const char *addr, int index, int evfd);
void ses_free(struct session *s);
/* A TCP connection's session: listed by CLIENT LIST (and reachable by CLIENT KILL)
 * from ses_connect until ses_disconnect, which the front end calls before it
 * closes fd (ses_free does too). A killed connection's socket is shut down: the
 * front end sees end of stream. now_ms: CLOCK_MONOTONIC_COARSE (kv_coarse_ms). */
void ses_connect(struct session *s, int fd, int64_t now_ms);
void ses_disconnect(struct session *s);
/* CLIENT LIST's view of the front end's buffers and last interaction (relaxed
 * stores; see cmd_client_io). */
static inline void ses_io(struct session *s, int64_t now_ms, size_t qbuf, size_t qfree, size_t obl, size_t rbs)
{
    cmd_client_io(&s->cl, now_ms, qbuf, qfree, obl, rbs);
}

/* Run one request (argc >= 1; argv stays valid until the request is done, also
 * across a stall). Returns SES_DONE, SES_HOLD or SES_STALL (see above), or
 * -ENOMEM when even the reply could not be queued (close the connection). */
int ses_run(struct session *s, int argc, const char **argv, const size_t *argl);

/* For front ends whose replies leave as one byte stream, in order: the reply
 * appended at stream offset off depends on LSN need (s->need after ses_run); it and
 * everything after it wait until the log holds need. 0, or -ENOMEM. */
int ses_hold(struct session *s, size_t off, uint64_t need);
/* End of the part of a stream of len bytes that may be sent now: up to the first
 * reply whose LSN is not yet durable. Inline: asked on every write, and mostly
 * nothing is held. */
size_t ses_sendable_held(struct session *s, size_t len);
static inline size_t ses_sendable(struct session *s, size_t len) { return s->hold_n ? ses_sendable_held(s, len) : len; }
/* The stream's first n bytes were sent and dropped: its offsets move down by n. */
void ses_consumed(struct session *s, size_t n);

/* After SES_STALL in a blocking front end: wait (blocking) until what the request
 * needs is there. Returns 0 (run it again) or -errno; an error the request must
 * report is reported by running it again. */
int ses_wait(struct session *s);

/* Subscribe evfd to the log's and the data file's wake-ups (a thread that holds
 * replies or stalls requests waits on it). Control thread. 0, or -ENOSPC with
 * a message in err when the lists are full. */
int ses_subscribe(struct kv_engine *eng, int evfd, char *err, size_t errlen);

#endif
