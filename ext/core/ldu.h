/* ldu.h - LDU, lightweight log-based deferred update (paper 003): a lock-less
 * multi-producer / single-consumer queue of per-object update logs.
 *
 * Each object embeds a struct ldu_obj: one log node per operation (insert and
 * remove), each with a mark, and a `used` bit per node saying it is queued.
 * Producers record an operation with ldu_log(): a remove that finds the insert
 * mark set clears it and logs nothing (update-side absorbing, and vice versa);
 * a node still queued is reused by setting its mark again (garbage-log reuse);
 * otherwise the node is pushed with one CAS on the queue head (Linux llist).
 * The single consumer takes the whole list with one atomic exchange
 * (ldu_take), claims each node's mark with an exchange (ldu_claim), applies
 * it, then releases the node (ldu_release), which reports a reuse that raced
 * with the apply so the consumer can apply it too.
 *
 * Threads: any number of producers, one consumer per queue at a time. An
 * object's operations must alternate insert/remove per object or be
 * serialised by the caller (paper: "update operations always run in
 * insert-remove or remove-insert order"); kvstore calls ldu_log under the
 * key's shard lock.
 */
#ifndef KV_LDU_H
#define KV_LDU_H

#include <stdatomic.h>
#include <stdint.h>

enum { LDU_INSERT = 0, LDU_REMOVE = 1 };

struct ldu_node {
    struct ldu_node *next;   /* queue link, written before the node is published */
    _Atomic uint32_t mark;   /* 1 = this operation is pending */
    uint8_t op;              /* LDU_INSERT or LDU_REMOVE: which of obj->node[] this is */
};

struct ldu_obj {
    struct ldu_node node[2];
    _Atomic uint32_t used;   /* bit op set while node[op] is queued */
};

struct ldu_queue {
    _Atomic(struct ldu_node *) head;
    _Atomic uint64_t pushes; /* nodes pushed (not reused or absorbed): statistics */
} __attribute__((aligned(64)));

void ldu_obj_init(struct ldu_obj *o);
void ldu_queue_init(struct ldu_queue *q);

/* Record operation op on o. absorb: a pending opposite operation cancels this
 * one (set it only when the pair truly nets to nothing for the consumer).
 * Returns 1 if a node was pushed, 0 if the log was absorbed or a queued node
 * was reused. Lock-free; never blocks. */
int ldu_log(struct ldu_queue *q, struct ldu_obj *o, int op, int absorb);

/* Consumer: queue a node it took (and has not released) again for a later
 * round, as it is: its mark is not restored (an op logged since may have
 * cancelled the claimed one), so the next round must look at the object's
 * state rather than at marks alone (kvstore's flusher reads the key's current
 * value). Its used bit stays set throughout, so no producer pushes it
 * meanwhile: never queued twice. */
void ldu_defer(struct ldu_queue *q, struct ldu_node *n);

/* Consumer: take every queued node (most recent first). Read a node's next
 * before releasing or deferring it: a producer may queue it again at once. */
struct ldu_node *ldu_take(struct ldu_queue *q);
/* Consumer: reverse a taken list into push (oldest first) order. */
struct ldu_node *ldu_reverse(struct ldu_node *list);
/* Consumer: atomically clear n's mark; 1 if it was set (the update must be applied). */
int ldu_claim(struct ldu_node *n);
/* Consumer, after applying n: clear its used bit, then claim its mark once more
 * (a producer may have reused the node in between). Returns 1 if that second
 * claim succeeded: the caller must apply the operation again. (The node may
 * already be queued again by that producer: never re-push it after release.) */
int ldu_release(struct ldu_obj *o, struct ldu_node *n);

static inline struct ldu_obj *ldu_obj_of(struct ldu_node *n)
{
    return (struct ldu_obj *)((char *)(n - n->op) - __builtin_offsetof(struct ldu_obj, node));
}

#endif
