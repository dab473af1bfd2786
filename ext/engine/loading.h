/* loading.h - a node that waits for its state: while the engine is loading,
 * keyspace commands are refused with -LOADING (cmd/dispatch.c admit) and INFO
 * persistence says what the node waits for; once the state is back the control
 * plane attaches the log, the data file and the sender (eng_attach) and the node
 * serves.
 *
 * Why: a node that lost its disk while its peer was down must not serve (nor
 * take writes under a new identity) until its log is back from the peer; it
 * still listens and answers INFO, PING and what Redis allows while loading, so
 * operators and health checks see why (issue 12, item 2).
 * Threads: eng_loading_set and eng_attach run on the control thread (Python);
 * eng_loading_error and the INFO provider on any front-end thread. The texts are
 * guarded by the state's mutex; the loading flag itself is engine.h's atomic.
 */
#ifndef KV_LOADING_H
#define KV_LOADING_H

#include <stddef.h>
#include <stdint.h>

struct kv_engine;
struct wal;
struct bosc;
struct rl_sender;

#define ENG_LOADING_TEXT 512 /* bytes kept of each text (longer ones are cut) */

/* Allocate the engine's loading state (e->ld), set the flag from e->cfg.loading
 * and register the kvstore lines of INFO persistence. Control thread, right after
 * eng_create (server/server.c; an engine without it never waits: e->ld NULL).
 * 0, -ENOMEM or -ENOSPC (INFO registry full). */
int eng_loading_init(struct kv_engine *e);
void eng_loading_free(struct kv_engine *e);

/* What the node waits for (shown by INFO and in the -LOADING error), the last
 * failed attempt's error ("" for none), how many attempts were made, and the
 * node id (hex, "" while unknown). NULL leaves a text as it is. Control thread. */
void eng_loading_set(struct kv_engine *e, const char *waiting_for, const char *last_error, uint64_t attempts,
                     const char *node_id);

/* Remember a front-end thread's eventfd (ses_subscribe): a log or data file
 * attached later wakes it too. Control thread, before the front ends run.
 * 0 or -ENOSPC. */
int eng_note_evfd(struct kv_engine *e, int evfd);

/* The state is back: subscribe every noted eventfd to w and b, publish w, b and
 * sender (any may be NULL), then clear the loading flag (release: a command
 * admitted afterwards sees the pointers). Control thread, once, while the
 * engine is loading. 0, -EALREADY (not loading) or -ENOSPC with err. */
int eng_attach(struct kv_engine *e, struct wal *w, struct bosc *b, struct rl_sender *sender, char *err,
               size_t errlen);

/* The -LOADING error for a refused command, NUL-terminated in buf: "LOADING
 * kvstore is waiting for <what>...". Any thread. */
void eng_loading_error(struct kv_engine *e, char *buf, size_t n);

#endif
