/* stream_group.c - a stream's consumer groups: consumers, the pending entries
 * list (an AVL tree by ID: XACK, XCLAIM and XPENDING of any ID in O(log n)) and
 * the read counter behind XINFO's lag, by Redis 7's rules (see stream.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/stream.h"
#include "core/stream_int.h"

/* ---- the PEL's AVL tree */

static inline int ht(const struct xs_nack *n) { return n ? n->h : 0; }

static inline void fix(struct xs_nack *n)
{
    int a = ht(n->l), b = ht(n->r);
    n->h = (a > b ? a : b) + 1;
}

static struct xs_nack *rot_right(struct xs_nack *n)
{
    struct xs_nack *l = n->l;
    n->l = l->r;
    l->r = n;
    fix(n);
    fix(l);
    return l;
}

static struct xs_nack *rot_left(struct xs_nack *n)
{
    struct xs_nack *r = n->r;
    n->r = r->l;
    r->l = n;
    fix(n);
    fix(r);
    return r;
}

static struct xs_nack *balance(struct xs_nack *n)
{
    fix(n);
    int bf = ht(n->l) - ht(n->r);
    if (bf > 1) {
        if (ht(n->l->l) < ht(n->l->r))
            n->l = rot_left(n->l);
        return rot_right(n);
    }
    if (bf < -1) {
        if (ht(n->r->r) < ht(n->r->l))
            n->r = rot_right(n->r);
        return rot_left(n);
    }
    return n;
}

/* Insert x (its id not in the tree). Depth is O(log n): recursion is bounded. */
static struct xs_nack *avl_insert(struct xs_nack *n, struct xs_nack *x)
{
    if (!n) {
        x->l = x->r = NULL;
        x->h = 1;
        return x;
    }
    if (xs_cmp(x->id, n->id) < 0)
        n->l = avl_insert(n->l, x);
    else
        n->r = avl_insert(n->r, x);
    return balance(n);
}

static struct xs_nack *avl_take_min(struct xs_nack *n, struct xs_nack **min)
{
    if (!n->l) {
        *min = n;
        return n->r;
    }
    n->l = avl_take_min(n->l, min);
    return balance(n);
}

/* Unlink the node with id into *out (NULL if absent). */
static struct xs_nack *avl_remove(struct xs_nack *n, struct xs_id id, struct xs_nack **out)
{
    if (!n)
        return NULL;
    int c = xs_cmp(id, n->id);
    if (c < 0) {
        n->l = avl_remove(n->l, id, out);
    } else if (c > 0) {
        n->r = avl_remove(n->r, id, out);
    } else {
        *out = n;
        if (!n->l || !n->r)
            return n->l ? n->l : n->r;
        struct xs_nack *m;
        struct xs_nack *r = avl_take_min(n->r, &m);
        m->l = n->l;
        m->r = r;
        return balance(m);
    }
    return balance(n);
}

static void avl_free(struct xstream *s, struct xs_nack *n)
{
    while (n) { /* the left spine by recursion, the right one by the loop */
        avl_free(s, n->l);
        struct xs_nack *r = n->r;
        s->mem -= xs_usable(n);
        free(n);
        n = r;
    }
}

struct xs_nack *xs_pel_find(const struct xs_group *g, struct xs_id id)
{
    for (struct xs_nack *n = g->pel; n;) {
        int c = xs_cmp(id, n->id);
        if (!c)
            return n;
        n = c < 0 ? n->l : n->r;
    }
    return NULL;
}

struct xs_nack *xs_pel_ceil(const struct xs_group *g, struct xs_id from, int exclusive)
{
    struct xs_nack *best = NULL;
    for (struct xs_nack *n = g->pel; n;) {
        int c = xs_cmp(n->id, from);
        if (c > 0 || (!c && !exclusive)) {
            best = n;
            n = n->l;
        } else {
            n = n->r;
        }
    }
    return best;
}

struct xs_nack *xs_pel_last(const struct xs_group *g)
{
    struct xs_nack *n = g->pel;
    while (n && n->r)
        n = n->r;
    return n;
}

struct xs_nack *xs_pel_deliver(struct xstream *s, struct xs_group *g, struct xs_id id, struct xs_consumer *owner,
                               int64_t now_ms)
{
    struct xs_nack *n = xs_pel_find(g, id);
    if (n) {
        xs_pel_chown(n, owner);
        n->delivery_count++;
        n->delivery_ms = now_ms;
        return n;
    }
    if (!(n = calloc(1, sizeof *n)))
        return NULL;
    s->mem += xs_usable(n);
    n->id = id;
    n->owner = owner;
    n->delivery_ms = now_ms;
    n->delivery_count = 1;
    owner->pending++;
    g->pel = avl_insert(g->pel, n);
    g->npel++;
    return n;
}

void xs_pel_chown(struct xs_nack *n, struct xs_consumer *owner)
{
    if (n->owner == owner)
        return;
    n->owner->pending--;
    owner->pending++;
    n->owner = owner;
}

int xs_pel_remove(struct xstream *s, struct xs_group *g, struct xs_id id)
{
    struct xs_nack *n = NULL;
    g->pel = avl_remove(g->pel, id, &n);
    if (!n)
        return 0;
    n->owner->pending--;
    g->npel--;
    s->mem -= xs_usable(n);
    free(n);
    return 1;
}

/* ---- groups and consumers */

static char *dup_name(struct xstream *s, const char *name, size_t nlen)
{
    char *p = malloc(nlen + 1);
    if (p) {
        memcpy(p, name, nlen);
        p[nlen] = 0;
        s->mem += xs_usable(p);
    }
    return p;
}

struct xs_group *xs_group_find(const struct xstream *s, const char *name, size_t nlen)
{
    for (struct list *n = s->groups.next; n != &s->groups; n = n->next) {
        struct xs_group *g = list_entry(n, struct xs_group, node);
        if (g->nlen == nlen && !memcmp(g->name, name, nlen))
            return g;
    }
    return NULL;
}

struct xs_group *xs_group_create(struct xstream *s, const char *name, size_t nlen, struct xs_id last_id,
                                 int64_t entries_read)
{
    struct xs_group *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    if (!(g->name = dup_name(s, name, nlen))) {
        free(g);
        return NULL;
    }
    s->mem += xs_usable(g);
    g->nlen = nlen;
    g->last_id = last_id;
    g->entries_read = entries_read;
    list_init(&g->consumers);
    list_add(s->groups.prev, &g->node); /* at the end: creation order */
    s->ngroups++;
    return g;
}

static void consumer_free(struct xstream *s, struct xs_consumer *c)
{
    s->mem -= xs_usable(c->name) + xs_usable(c);
    free(c->name);
    free(c);
}

void xs_group_destroy(struct xstream *s, struct xs_group *g)
{
    list_del(&g->node);
    s->ngroups--;
    avl_free(s, g->pel);
    while (!list_empty(&g->consumers)) {
        struct xs_consumer *c = list_entry(g->consumers.next, struct xs_consumer, node);
        list_del(&c->node);
        consumer_free(s, c);
    }
    s->mem -= xs_usable(g->name) + xs_usable(g);
    free(g->name);
    free(g);
}

void xs_groups_free(struct xstream *s)
{
    while (!list_empty(&s->groups))
        xs_group_destroy(s, list_entry(s->groups.next, struct xs_group, node));
}

struct xs_consumer *xs_consumer_find(const struct xs_group *g, const char *name, size_t nlen)
{
    for (struct list *n = g->consumers.next; n != &g->consumers; n = n->next) {
        struct xs_consumer *c = list_entry(n, struct xs_consumer, node);
        if (c->nlen == nlen && !memcmp(c->name, name, nlen))
            return c;
    }
    return NULL;
}

struct xs_consumer *xs_consumer_create(struct xstream *s, struct xs_group *g, const char *name, size_t nlen,
                                       int64_t now_ms)
{
    struct xs_consumer *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    if (!(c->name = dup_name(s, name, nlen))) {
        free(c);
        return NULL;
    }
    s->mem += xs_usable(c);
    c->nlen = nlen;
    c->seen_ms = now_ms;
    list_add(g->consumers.prev, &c->node);
    g->nconsumers++;
    return c;
}

uint64_t xs_consumer_delete(struct xstream *s, struct xs_group *g, struct xs_consumer *c)
{
    uint64_t had = c->pending;
    for (struct xs_nack *n = xs_pel_ceil(g, XS_ID_MIN, 0); n && c->pending;) {
        struct xs_id id = n->id;
        struct xs_nack *next = xs_pel_ceil(g, id, 1);
        if (n->owner == c)
            xs_pel_remove(s, g, id);
        n = next;
    }
    list_del(&c->node);
    g->nconsumers--;
    consumer_free(s, c);
    return had;
}

/* ---- the read counter (Redis 7: t_stream.c's lag rules) */

struct xs_id xs_first_id(const struct xstream *s)
{
    struct xs_entry e;
    return xs_first(s, &e) == 1 ? e.id : XS_ID_MIN;
}

/* Deleted entries may lie in [start, +inf): counting on from start would be wrong. */
static int tombstones_from(const struct xstream *s, struct xs_id start)
{
    if (!s->length || xs_is_zero(s->max_deleted))
        return 0;
    if (xs_cmp(xs_first_id(s), s->max_deleted) > 0)
        return 0; /* the last deletion is before the first entry */
    return xs_cmp(start, s->max_deleted) <= 0;
}

int64_t xs_entries_read_at(const struct xstream *s, struct xs_id id)
{
    if (!s->entries_added)
        return 0;
    int cmp_last = xs_cmp(id, s->last_id);
    if (!s->length && cmp_last <= 0)
        return (int64_t)s->entries_added;
    if (!cmp_last)
        return (int64_t)s->entries_added;
    if (cmp_last > 0)
        return XS_ENTRIES_READ_UNKNOWN;
    struct xs_id first = xs_first_id(s);
    if (xs_is_zero(s->max_deleted) || xs_cmp(s->max_deleted, first) < 0) {
        int c = xs_cmp(id, first);
        if (c < 0)
            return (int64_t)(s->entries_added - s->length);
        if (!c)
            return (int64_t)(s->entries_added - s->length + 1);
    }
    return XS_ENTRIES_READ_UNKNOWN;
}

void xs_group_advance(const struct xstream *s, struct xs_group *g, struct xs_id id)
{
    if (xs_cmp(id, g->last_id) <= 0)
        return;
    if (g->entries_read != XS_ENTRIES_READ_UNKNOWN && !tombstones_from(s, id))
        g->entries_read++;
    else if (s->entries_added)
        g->entries_read = xs_entries_read_at(s, id);
    g->last_id = id;
}

int xs_group_lag(const struct xstream *s, const struct xs_group *g, int64_t *lag)
{
    if (!s->entries_added) {
        *lag = 0;
        return 1;
    }
    if (g->entries_read != XS_ENTRIES_READ_UNKNOWN && !tombstones_from(s, g->last_id)) {
        *lag = (int64_t)s->entries_added - g->entries_read;
        return 1;
    }
    int64_t er = xs_entries_read_at(s, g->last_id);
    if (er == XS_ENTRIES_READ_UNKNOWN)
        return 0;
    *lag = (int64_t)s->entries_added - er;
    return 1;
}
