/* cluster.c - Redis Cluster's client protocol over a slot map set from outside.
 *
 * A node started with cluster_enabled serves the keyed commands of the slots it
 * owns in the engine's slot map (engine.h: struct kv_slotmap) and redirects the
 * rest as Redis Cluster does, so redis-cli -c, redis-py's RedisCluster and
 * redis-benchmark --cluster work unchanged. Nothing here gossips or elects: the
 * control plane (kvstore's cluster agent, with etcd as its truth) sets the whole
 * map with CLUSTER SETMAP and keeps the node's lease fresh with CLUSTER LEASE.
 *
 *   -CROSSSLOT    the keys of one command hash to different slots
 *   -MOVED s h:p  slot s is another node's
 *   -ASK s h:p    slot s is moving from here to h:p and a key is not here (any more)
 *   -TRYAGAIN     a multi-key command during that move with only some keys here
 *   -CLUSTERDOWN  the slot has no owner, no map was set, or the lease ran out
 *
 * A map carries a configuration epoch; a map older than the one in force is
 * refused, so a node never goes back to serving a slot from an older epoch.
 * The lease is the fence: a node cut off from the control plane stops serving
 * keys when its lease runs out, before the controller (which waits for the lease
 * in etcd to expire, longer) gives its slots to another node. It assumes the
 * two clocks advance at rates within the margin between the two lease lengths.
 *
 * Readers take the map with one acquire load and no lock; a replaced map is
 * freed RETIRE_MS later (a command holds it for microseconds). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd_int.h"
#include "core/clock.h"
#include "core/slot.h"
#include "core/table.h"
#include "engine/engine.h"

#define RETIRE_MS 10000
#define RETIRE_MAX 64 /* replaced maps younger than RETIRE_MS at most (each ~100 KB) */
#define LEASE_MAX_MS 600000

static const char *const cluster_help[] = {
    "CLUSTER <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "INFO",
    "    Return information about the cluster.",
    "KEYSLOT <key>",
    "    Return the hash slot for <key>.",
    "MYID",
    "    Return the node id.",
    "NODES",
    "    Return cluster configuration seen by node. Output format:",
    "    <id> <ip:port@cport> <flags> <master> <pings> <pongs> <epoch> <link> <slot> ...",
    "SHARDS",
    "    Return information about slot range mappings and the nodes associated with them.",
    "COUNTKEYSINSLOT <slot>",
    "    Return the number of keys in <slot>.",
    "GETKEYSINSLOT <slot> <count>",
    "    Return key names stored by current node in a slot.",
    "SLOTS",
    "    Return information about slots range mappings. Each range is made of:",
    "    start, end, master and replicas IP addresses, ports and ids",
    "SETMAP <epoch> <myid> NODES <n> <id> <host> <port> ... SLOTS <n> <start> <end> <node> ...",
    "       [MIGRATING <n> <slot> <node> ...] [IMPORTING <n> <slot> <node> ...]",
    "    (kvstore's control plane) Replace the slot map; <node> is an index into NODES.",
    "LEASE <milliseconds>",
    "    (kvstore's control plane) Serve keys for that long from now.",
    "HELP",
    "    Print this help.",
};

static const struct kv_slotmap *map_of(struct kv_engine *e)
{
    return atomic_load_explicit(&e->slotmap, memory_order_acquire);
}

static int lease_ok(struct kv_engine *e)
{
    return kv_mono_ms() < atomic_load_explicit(&e->lease_until_ms, memory_order_relaxed);
}

/* ---- which keys a command names */

/* The key arguments of d with argv: [*first, *last] by *step. 0 when it has none. */
static int key_args(const struct cmd_def *d, int argc, const char **argv, const size_t *argl, int *first,
                    int *last, int *step)
{
    if (d->flags & F_MOVABLEKEYS) { /* XREAD, XREADGROUP: ... STREAMS k1 .. kn id1 .. idn */
        for (int i = 1; i < argc; i++)
            if (argl[i] == 7 && !strncasecmp(argv[i], "STREAMS", 7)) {
                int n = (argc - i - 1) / 2;
                if (n < 1)
                    return 0;
                *first = i + 1, *last = i + n, *step = 1;
                return 1;
            }
        return 0;
    }
    *step = d->step > 0 ? d->step : 1;
    return cmd_key_range(d, argc, first, last);
}

static int reply_redirect(struct cmd_client *c, const char *kind, int slot, const struct kv_cnode *n)
{
    return resp_add_errorf(c->out, "%s %d %s:%d", kind, slot, n->host, n->port);
}

int cmd_cluster_route(struct cmd_client *c, const struct cmd_def *d, int argc, const char **argv,
                      const size_t *argl, int *rc)
{
    int asking = c->asking;
    c->asking = 0;
    int first, last, step;
    if (!key_args(d, argc, argv, argl, &first, &last, &step))
        return 1; /* no keys: any node serves it */
    int slot = kv_key_slot(argv[first], argl[first]);
    for (int i = first + step; i <= last; i += step)
        if (kv_key_slot(argv[i], argl[i]) != slot) {
            *rc = cmd_reply_err(c, "CROSSSLOT Keys in request don't hash to the same slot");
            return 0;
        }
    const struct kv_slotmap *m = map_of(c->eng);
    if (!m || m->owner[slot] == KV_SLOT_NONE) {
        *rc = cmd_reply_err(c, "CLUSTERDOWN Hash slot not served");
        return 0;
    }
    int owner = m->owner[slot];
    if (owner != m->self) {
        if (!(asking && m->importing[slot] != KV_SLOT_NONE && m->self >= 0)) {
            *rc = reply_redirect(c, "MOVED", slot, &m->nodes[owner]);
            return 0;
        }
    } else if (m->migrating[slot] != KV_SLOT_NONE) {
        /* moving away: what is still here is served here, the rest is asked for there */
        int here = 0, n = 0;
        for (int i = first; i <= last; i += step, n++)
            here += kvt_exists(c->table, argv[i], argl[i]) != 0; /* (-ENODATA: in the data file) */
        if (here < n) {
            if (here && n > 1)
                *rc = cmd_reply_err(c, "TRYAGAIN Multiple keys request during rehashing of slot");
            else
                *rc = reply_redirect(c, "ASK", slot, &m->nodes[m->migrating[slot]]);
            return 0;
        }
    }
    if (!lease_ok(c->eng)) { /* fenced: another node may own this slot by now */
        *rc = cmd_reply_err(c, "CLUSTERDOWN The cluster is down (this node's lease has run out)");
        return 0;
    }
    return 1;
}

/* ---- CLUSTER SETMAP and LEASE (the control plane's) */

static int arg_index(const struct cmd_args *a, int i, long long max, long long *v)
{
    return i < a->argc && !cmd_arg_ll(a, i, v) && *v >= 0 && *v <= max ? 0 : -1;
}

static int setmap_err(struct cmd_client *c, struct kv_slotmap *m, const char *why)
{
    free(m);
    return resp_add_errorf(c->out, "ERR CLUSTER SETMAP: %s", why);
}

/* A list "WORD <n> <slot> <node> ..." at *i into v (KV_SLOT_NONE elsewhere). */
static const char *slot_list(const struct cmd_args *a, int *i, struct kv_slotmap *m, uint16_t *v)
{
    long long n, slot, node;
    if (arg_index(a, ++*i, KV_SLOTS_N, &n))
        return "expected a count after MIGRATING/IMPORTING";
    for (long long k = 0; k < n; k++) {
        if (arg_index(a, ++*i, KV_SLOTS_N - 1, &slot) || arg_index(a, ++*i, m->nnodes - 1, &node))
            return "expected <slot 0-16383> <node index> pairs";
        if (v[slot] != KV_SLOT_NONE)
            return "a slot is listed twice";
        v[slot] = (uint16_t)node;
    }
    ++*i;
    return NULL;
}

static int cluster_setmap(struct cmd_client *c, const struct cmd_args *a)
{
    struct kv_engine *e = c->eng;
    long long epoch, nn, ns, lo, hi, node;
    int i = 2;
    if (a->argc < 8 || cmd_arg_ll(a, i, &epoch) || epoch < 0)
        return cmd_reply_err(c, "ERR CLUSTER SETMAP: expected <epoch> <myid> NODES <n> ... SLOTS <n> ...");
    const char *myid = a->argv[i + 1];
    size_t myidlen = a->argl[i + 1];
    i += 2;
    if (!ARGIS(a, i, "NODES") || arg_index(a, i + 1, KV_CLUSTER_NODES_MAX, &nn) || nn < 1)
        return cmd_reply_err(c, "ERR CLUSTER SETMAP: expected NODES <n> (1 to 1024) after <myid>");
    struct kv_slotmap *m = calloc(1, sizeof *m + (size_t)nn * sizeof m->nodes[0]);
    if (!m)
        return -ENOMEM;
    m->epoch = (uint64_t)epoch;
    m->nnodes = (int)nn;
    m->self = -1;
    memset(m->owner, 0xff, sizeof m->owner);
    memset(m->migrating, 0xff, sizeof m->migrating);
    memset(m->importing, 0xff, sizeof m->importing);
    i += 2;
    for (int k = 0; k < nn; k++, i += 3) {
        long long port;
        if (i + 2 >= a->argc || a->argl[i] != 40 || a->argl[i + 1] == 0 || a->argl[i + 1] >= sizeof m->nodes[k].host ||
            arg_index(a, i + 2, 65535, &port) || port == 0)
            return setmap_err(c, m, "each node is <id: 40 characters> <host> <port 1-65535>");
        memcpy(m->nodes[k].id, a->argv[i], 40);
        memcpy(m->nodes[k].host, a->argv[i + 1], a->argl[i + 1]);
        m->nodes[k].port = (int)port;
        for (int j = 0; j < k; j++)
            if (!memcmp(m->nodes[j].id, m->nodes[k].id, 40))
                return setmap_err(c, m, "a node id is listed twice");
        if (myidlen == 40 && !memcmp(a->argv[i], myid, 40))
            m->self = k;
    }
    if (!ARGIS(a, i, "SLOTS") || arg_index(a, i + 1, KV_SLOTS_N, &ns))
        return setmap_err(c, m, "expected SLOTS <n> after the nodes");
    i += 2;
    for (long long k = 0; k < ns; k++, i += 3) {
        if (arg_index(a, i, KV_SLOTS_N - 1, &lo) || arg_index(a, i + 1, KV_SLOTS_N - 1, &hi) || hi < lo ||
            arg_index(a, i + 2, nn - 1, &node))
            return setmap_err(c, m, "each range is <start> <end> (0-16383, start <= end) <node index>");
        for (long long s = lo; s <= hi; s++) {
            if (m->owner[s] != KV_SLOT_NONE)
                return setmap_err(c, m, "a slot is in two ranges");
            m->owner[s] = (uint16_t)node;
        }
    }
    while (i < a->argc) {
        const char *why = ARGIS(a, i, "MIGRATING")   ? slot_list(a, &i, m, m->migrating)
                          : ARGIS(a, i, "IMPORTING") ? slot_list(a, &i, m, m->importing)
                                                     : "expected MIGRATING or IMPORTING after the slots";
        if (why)
            return setmap_err(c, m, why);
    }
    for (int s = 0; s < KV_SLOTS_N; s++)
        if ((m->migrating[s] != KV_SLOT_NONE && m->owner[s] != m->self) ||
            (m->importing[s] != KV_SLOT_NONE && m->owner[s] == m->self))
            return setmap_err(c, m, "a migrating slot must be this node's, an importing one another's");
    int64_t now = kv_mono_ms();
    pthread_mutex_lock(&e->slotmap_lock);
    struct kv_slotmap *old = atomic_load(&e->slotmap);
    if (old && old->epoch > m->epoch) {
        pthread_mutex_unlock(&e->slotmap_lock);
        char why[96];
        snprintf(why, sizeof why, "epoch %lld is older than the map's, %llu", epoch, (unsigned long long)old->epoch);
        return setmap_err(c, m, why);
    }
    /* maps replaced long enough ago are freed; the one just replaced joins them */
    int young = 0;
    for (struct kv_slotmap **p = &e->retired; *p;) {
        if (now - (*p)->retired_ms > RETIRE_MS) {
            struct kv_slotmap *gone = *p;
            *p = gone->retired_next;
            free(gone);
        } else {
            p = &(*p)->retired_next;
            young++;
        }
    }
    if (young >= RETIRE_MAX) { /* bounded memory: a control plane sets a map a few times a minute */
        pthread_mutex_unlock(&e->slotmap_lock);
        return setmap_err(c, m, "more than 64 maps in 10 seconds: try again later");
    }
    atomic_store_explicit(&e->slotmap, m, memory_order_release);
    if (old) {
        old->retired_ms = now;
        old->retired_next = e->retired;
        e->retired = old;
    }
    pthread_mutex_unlock(&e->slotmap_lock);
    return cmd_reply_ok(c);
}

static int cluster_lease(struct cmd_client *c, const struct cmd_args *a)
{
    long long ms;
    if (a->argc != 3 || cmd_arg_ll(a, 2, &ms) || ms < 0 || ms > LEASE_MAX_MS)
        return cmd_reply_err(c, "ERR CLUSTER LEASE: expected <milliseconds> from 0 to 600000");
    atomic_store_explicit(&c->eng->lease_until_ms, kv_mono_ms() + ms, memory_order_relaxed);
    return cmd_reply_ok(c);
}

/* ---- what clients read */

/* Ranges of consecutive slots with one owner: fn(arg, start, end, owner) for each. */
static int ranges(const struct kv_slotmap *m, int (*fn)(void *, int, int, int), void *arg)
{
    int n = 0;
    for (int s = 0; s < KV_SLOTS_N;) {
        int o = m->owner[s], e = s;
        while (e + 1 < KV_SLOTS_N && m->owner[e + 1] == o)
            e++;
        if (o != KV_SLOT_NONE) {
            if (fn && fn(arg, s, e, o))
                return -ENOMEM;
            n++;
        }
        s = e + 1;
    }
    return n;
}

struct slots_out {
    struct cmd_client *c;
    const struct kv_slotmap *m;
};

static int slots_range(void *arg, int start, int end, int owner)
{
    struct slots_out *o = arg;
    struct kvbuf *b = o->c->out;
    const struct kv_cnode *n = &o->m->nodes[owner];
    return resp_add_array(b, 3) || resp_add_int(b, start) || resp_add_int(b, end) || resp_add_array(b, 4) ||
           resp_add_bulk_str(b, n->host) || resp_add_int(b, n->port) || resp_add_bulk(b, n->id, 40) ||
           resp_add_map(b, o->c->resp, 0);
}

static int cluster_slots(struct cmd_client *c)
{
    const struct kv_slotmap *m = map_of(c->eng);
    if (!m)
        return resp_add_array(c->out, 0);
    struct slots_out o = {c, m};
    return resp_add_array(c->out, ranges(m, NULL, NULL)) || ranges(m, slots_range, &o) < 0 ? -ENOMEM : 0;
}

static int node_map(struct cmd_client *c, const struct kv_cnode *n)
{
    struct kvbuf *b = c->out;
    return resp_add_map(b, c->resp, 7) || resp_add_bulk_str(b, "id") || resp_add_bulk(b, n->id, 40) ||
           resp_add_bulk_str(b, "port") || resp_add_int(b, n->port) || resp_add_bulk_str(b, "ip") ||
           resp_add_bulk_str(b, n->host) || resp_add_bulk_str(b, "endpoint") || resp_add_bulk_str(b, n->host) ||
           resp_add_bulk_str(b, "role") || resp_add_bulk_str(b, "master") ||
           resp_add_bulk_str(b, "replication-offset") || resp_add_int(b, 0) || resp_add_bulk_str(b, "health") ||
           resp_add_bulk_str(b, "online");
}

struct shard_out {
    const struct kv_slotmap *m;
    int node, count;
    struct kvbuf *b;
};

static int shard_range(void *arg, int start, int end, int owner)
{
    struct shard_out *o = arg;
    if (owner != o->node)
        return 0;
    o->count++;
    return o->b ? resp_add_int(o->b, start) || resp_add_int(o->b, end) : 0;
}

/* A shard per node (Redis 7: its slot ranges as flat start/end pairs, and its nodes). */
static int cluster_shards(struct cmd_client *c)
{
    const struct kv_slotmap *m = map_of(c->eng);
    struct kvbuf *b = c->out;
    if (resp_add_array(b, m ? m->nnodes : 0))
        return -ENOMEM;
    for (int k = 0; m && k < m->nnodes; k++) {
        struct shard_out o = {m, k, 0, NULL};
        ranges(m, shard_range, &o);
        int n = o.count;
        o = (struct shard_out){m, k, 0, b};
        if (resp_add_map(b, c->resp, 2) || resp_add_bulk_str(b, "slots") || resp_add_array(b, 2LL * n) ||
            ranges(m, shard_range, &o) < 0 || resp_add_bulk_str(b, "nodes") || resp_add_array(b, 1) ||
            node_map(c, &m->nodes[k]))
            return -ENOMEM;
    }
    return 0;
}

struct nodes_out {
    struct kvbuf *t;
    int node;
};

static int nodes_range(void *arg, int start, int end, int owner)
{
    struct nodes_out *o = arg;
    if (owner != o->node)
        return 0;
    return start == end ? kvbuf_printf(o->t, " %d", start) : kvbuf_printf(o->t, " %d-%d", start, end);
}

static int cluster_nodes(struct cmd_client *c)
{
    const struct kv_slotmap *m = map_of(c->eng);
    struct kvbuf t = {0};
    int rc = 0;
    for (int k = 0; m && k < m->nnodes && !rc; k++) {
        const struct kv_cnode *n = &m->nodes[k];
        struct nodes_out o = {&t, k};
        rc = kvbuf_printf(&t, "%.40s %s:%d@0 %smaster - 0 0 %llu connected", n->id, n->host, n->port,
                          k == m->self ? "myself," : "", (unsigned long long)m->epoch) ||
             ranges(m, nodes_range, &o) < 0;
        for (int s = 0; s < KV_SLOTS_N && !rc && k == m->self; s++) {
            if (m->migrating[s] != KV_SLOT_NONE)
                rc = kvbuf_printf(&t, " [%d->-%.40s]", s, m->nodes[m->migrating[s]].id);
            else if (m->importing[s] != KV_SLOT_NONE)
                rc = kvbuf_printf(&t, " [%d-<-%.40s]", s, m->nodes[m->importing[s]].id);
        }
        rc = rc || kvbuf_append(&t, "\n", 1);
    }
    rc = rc || resp_add_verbatim(c->out, c->resp, t.len ? t.p : "", t.len);
    kvbuf_free(&t);
    return rc ? -ENOMEM : 0;
}

static int cluster_info(struct cmd_client *c)
{
    struct kv_engine *e = c->eng;
    const struct kv_slotmap *m = map_of(e);
    int assigned = 0, size = 0;
    for (int s = 0; m && s < KV_SLOTS_N; s++)
        assigned += m->owner[s] != KV_SLOT_NONE;
    for (int k = 0; m && k < m->nnodes; k++) {
        struct shard_out o = {m, k, 0, NULL};
        ranges(m, shard_range, &o);
        size += o.count > 0;
    }
    int ok = assigned == KV_SLOTS_N && lease_ok(e);
    unsigned long long epoch = m ? (unsigned long long)m->epoch : 0;
    char t[768];
    int n = snprintf(t, sizeof t,
                     "cluster_state:%s\r\ncluster_slots_assigned:%d\r\ncluster_slots_ok:%d\r\n"
                     "cluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_known_nodes:%d\r\n"
                     "cluster_size:%d\r\ncluster_current_epoch:%llu\r\ncluster_my_epoch:%llu\r\n"
                     "cluster_stats_messages_sent:0\r\ncluster_stats_messages_received:0\r\n"
                     "total_cluster_links_buffer_limit_exceeded:0\r\ncluster_lease_ms:%lld\r\n",
                     ok ? "ok" : "fail", assigned, assigned, m ? m->nnodes : 0, size, epoch, epoch,
                     (long long)(atomic_load(&e->lease_until_ms) - kv_mono_ms()));
    return resp_add_verbatim(c->out, c->resp, t, (size_t)n);
}

int c_cluster(struct cmd_client *c, const struct cmd_args *a)
{
    if (ARGIS(a, 1, "HELP"))
        return cmd_sub_arity(c, a, 2, "cluster|help") ? CMD_REPLY_HELP(c, cluster_help) : 0;
    if (!c->eng->cfg.cluster_enabled)
        return cmd_reply_err(c, "ERR This instance has cluster support disabled");
    if (ARGIS(a, 1, "KEYSLOT"))
        return cmd_sub_arity(c, a, 3, "cluster|keyslot") ? resp_add_int(c->out, kv_key_slot(a->argv[2], a->argl[2]))
                                                          : 0;
    if (ARGIS(a, 1, "MYID")) {
        const struct kv_slotmap *m = map_of(c->eng);
        if (!cmd_sub_arity(c, a, 2, "cluster|myid"))
            return 0;
        return m && m->self >= 0 ? resp_add_bulk(c->out, m->nodes[m->self].id, 40) : resp_add_null(c->out, c->resp);
    }
    if (ARGIS(a, 1, "SLOTS"))
        return cmd_sub_arity(c, a, 2, "cluster|slots") ? cluster_slots(c) : 0;
    if (ARGIS(a, 1, "SHARDS"))
        return cmd_sub_arity(c, a, 2, "cluster|shards") ? cluster_shards(c) : 0;
    if (ARGIS(a, 1, "NODES"))
        return cmd_sub_arity(c, a, 2, "cluster|nodes") ? cluster_nodes(c) : 0;
    if (ARGIS(a, 1, "INFO"))
        return cmd_sub_arity(c, a, 2, "cluster|info") ? cluster_info(c) : 0;
    if (ARGIS(a, 1, "COUNTKEYSINSLOT") || ARGIS(a, 1, "GETKEYSINSLOT")) {
        int get = ARGIS(a, 1, "GETKEYSINSLOT");
        long long slot, max = -1;
        if (!cmd_sub_arity(c, a, get ? 4 : 3, get ? "cluster|getkeysinslot" : "cluster|countkeysinslot"))
            return 0;
        if (cmd_arg_ll(a, 2, &slot) || (get && cmd_arg_ll(a, 3, &max)))
            return cmd_reply_err(c, ERR_INT);
        if (slot < 0 || slot >= KV_SLOTS_N || (get && max < 0))
            return cmd_reply_err(c, get ? "ERR Invalid slot or number of keys" : "ERR Invalid slot");
        return cmd_keys_in_slot(c, (int)slot, max);
    }
    if (ARGIS(a, 1, "SETMAP"))
        return cluster_setmap(c, a);
    if (ARGIS(a, 1, "LEASE"))
        return cluster_lease(c, a);
    return cmd_unknown_sub(c, a, "CLUSTER");
}

int c_asking(struct cmd_client *c, const struct cmd_args *a)
{
    (void)a;
    if (!c->eng->cfg.cluster_enabled)
        return cmd_reply_err(c, "ERR This instance has cluster support disabled");
    c->asking = 1; /* for the next command (cmd_cluster_route clears it) */
    return cmd_reply_ok(c);
}

/* READONLY / READWRITE: a replica's reads; this cluster has no replicas that serve
 * reads (a node's copy is its log peer), so both only say OK, as Redis does on a
 * primary. */
int c_readmode(struct cmd_client *c, const struct cmd_args *a)
{
    (void)a;
    if (!c->eng->cfg.cluster_enabled)
        return cmd_reply_err(c, "ERR This instance has cluster support disabled");
    return cmd_reply_ok(c);
}

static void info_cluster(void *arg, struct kvbuf *out)
{
    struct kv_engine *e = arg;
    kvbuf_printf(out, "cluster_enabled:%d\r\n", e->cfg.cluster_enabled ? 1 : 0);
}

int cmd_cluster_register(struct kv_engine *e) { return eng_info_add(e, "cluster", info_cluster, NULL, e); }
