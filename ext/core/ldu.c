/* ldu.c - LDU lock-less deferred-update queue (see ldu.h). No locks; the
 * memory-order choice of every atomic is explained where it is made. */
#include "core/ldu.h"

#include <stddef.h>

void ldu_obj_init(struct ldu_obj *o)
{
    for (int i = 0; i < 2; i++) {
        o->node[i].next = NULL;
        atomic_init(&o->node[i].mark, 0);
        o->node[i].op = (uint8_t)i;
    }
    atomic_init(&o->used, 0);
}

void ldu_queue_init(struct ldu_queue *q)
{
    atomic_init(&q->head, NULL);
    atomic_init(&q->pushes, 0);
}

static void push(struct ldu_queue *q, struct ldu_node *n)
{
    /* llist_add: link n in front of the current head and publish it with a CAS.
     * Release on success so the consumer that acquires the head sees n->next
     * and everything the producer wrote before logging (the object's new state). */
    struct ldu_node *first = atomic_load_explicit(&q->head, memory_order_relaxed);
    do {
        n->next = first;
    } while (!atomic_compare_exchange_weak_explicit(&q->head, &first, n, memory_order_release,
                                                    memory_order_relaxed));
    atomic_fetch_add_explicit(&q->pushes, 1, memory_order_relaxed);
}


int ldu_log(struct ldu_queue *q, struct ldu_obj *o, int op, int absorb)
{
    struct ldu_node *me = &o->node[op], *other = &o->node[!op];
    /* Phase 1, update-side absorbing: the opposite operation is still pending,
     * so the pair cancels. The exchange (not a load then a store) decides the
     * race with a consumer claiming that mark: exactly one of us gets the 1.
     * acq_rel: the consumer's apply of the mark we take away must not be
     * reordered after our cancellation becoming visible, and vice versa. */
    /* (A plain load first: most logs find nothing to absorb, and a load costs no
     * locked instruction.) */
    if (atomic_load_explicit(&other->mark, memory_order_relaxed)) {
        if (absorb && atomic_exchange_explicit(&other->mark, 0, memory_order_acq_rel))
            return 0;
        if (!absorb)
            atomic_exchange_explicit(&other->mark, 0, memory_order_acq_rel); /* superseded */
    }
    /* Phase 2, garbage-log reuse: set our mark first; if the node is still
     * queued (used bit already set) the consumer will see the mark when it
     * gets there, or in ldu_release's second claim if it is past it. */
    atomic_store_explicit(&me->mark, 1, memory_order_release);
    uint32_t bit = 1u << op;
    /* The RMWs on `used` (ours here, the consumer's in ldu_release) are totally
     * ordered. If ours comes second it reads the cleared bit and we push. If ours
     * comes first, the consumer's acquire RMW reads from our release RMW, so its
     * second claim that follows sees the mark stored above. */
    if (atomic_fetch_or_explicit(&o->used, bit, memory_order_acq_rel) & bit)
        return 0;
    /* Phase 3: the node was not queued: push it. */
    push(q, me);
    return 1;
}

void ldu_defer(struct ldu_queue *q, struct ldu_node *n)
{
    push(q, n); /* mark untouched: re-creating a claimed op could revive a cancelled one */
}

struct ldu_node *ldu_take(struct ldu_queue *q)
{
    /* llist_del_all: acquire pairs with the producers' release CAS, so every
     * node reached from the returned head has its next and its object's state. */
    return atomic_exchange_explicit(&q->head, NULL, memory_order_acquire);
}

struct ldu_node *ldu_reverse(struct ldu_node *list)
{
    struct ldu_node *out = NULL;
    while (list) {
        struct ldu_node *next = list->next;
        list->next = out;
        out = list;
        list = next;
    }
    return out;
}

int ldu_claim(struct ldu_node *n)
{
    /* acquire: what the producer wrote before setting the mark is visible to the apply */
    return atomic_exchange_explicit(&n->mark, 0, memory_order_acquire) != 0;
}

int ldu_release(struct ldu_obj *o, struct ldu_node *n)
{
    /* Clear used first, then look at the mark again: a producer that set the
     * mark after our claim but saw used still set did not push; this second
     * claim is the only place its update can be picked up (see ldu_log for why
     * acq_rel on `used` is enough). */
    atomic_fetch_and_explicit(&o->used, ~(1u << n->op), memory_order_acq_rel);
    return atomic_exchange_explicit(&n->mark, 0, memory_order_acquire) != 0;
}
