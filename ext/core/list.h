/* list.h - intrusive circular doubly-linked lists (as Linux's list.h): a node
 * embedded in its owner, a head that is a node of its own. A node not on any
 * list points at itself, so "is it listed" is !list_empty(&node). Header-only;
 * no locking: a list belongs to one thread. */
#ifndef KV_LIST_H
#define KV_LIST_H

#include <stddef.h>

struct list {
    struct list *prev, *next;
};

#define list_entry(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

static inline void list_init(struct list *n) { n->prev = n->next = n; }
static inline int list_empty(const struct list *n) { return n->next == n; }

/* n (not on a list) becomes the first node after head. */
static inline void list_add(struct list *head, struct list *n)
{
    n->next = head->next;
    n->prev = head;
    head->next->prev = n;
    head->next = n;
}

/* Take n off its list (a no-op for a node on none). */
static inline void list_del(struct list *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    list_init(n);
}

/* Move every node of from to the empty head to; from is left empty. */
static inline void list_move_all(struct list *to, struct list *from)
{
    if (list_empty(from)) {
        list_init(to);
        return;
    }
    *to = *from;
    to->next->prev = to;
    to->prev->next = to;
    list_init(from);
}

#endif
