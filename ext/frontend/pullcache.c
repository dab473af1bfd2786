/* pullcache.c - loads, attaches and fills the pull cache's XDP program (see
 * pullcache.h; the program: ext/bpf/pullcache.bpf.c; slots: pullcache_slot.h).
 * Built with the program only when clang and libbpf were found (KV_HAVE_XDP):
 * without them pc_open says so. */
#define _GNU_SOURCE
#include "frontend/pullcache.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KV_HAVE_XDP
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <ifaddrs.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bpf/settings.h"
#include "core/stream.h"
#include "core/table.h"
#include "frontend/pullcache_slot.h"
#include <pullcache_bpf.h> /* generated into build/gen by kvstore/_bpfbuild.py: the compiled program as bytes */

struct pull_cache {
    struct bpf_object *obj;
    struct bpf_link *link;
    struct pc_slot *slots;      /* the map, mmapped */
    size_t map_bytes;
    uint32_t nslots;
    int stats_fd, native;
    struct kv_table *t;
    char ifname[IF_NAMESIZE];
    _Atomic uint64_t fills, invalidations;
    _Atomic uint64_t used;      /* slots written since start (skips the whole-map scan while 0) */
};

int pc_available(void) { return 1; }

static int silent(enum libbpf_print_level level, const char *fmt, va_list ap)
{
    (void)level, (void)fmt, (void)ap;
    return 0; /* libbpf's own messages: our errors say what failed */
}

/* The program's object with its read-only settings, not loaded yet. */
static struct bpf_object *open_object(int port, uint32_t nslots, uint32_t bounce_len, char *err, size_t errlen)
{
    libbpf_set_print(silent);
    struct bpf_object *obj = bpf_object__open_mem(kv_pullcache_bpf, kv_pullcache_bpf_len, NULL);
    if (!obj) {
        snprintf(err, errlen, "cannot open the pull cache's BPF object: %s", strerror(errno));
        return NULL;
    }
    struct pc_config cfg = {(uint32_t)port, nslots, bounce_len};
    if (kv_bpf_set_settings(obj, &cfg, sizeof cfg)) { /* the program's only read-only global */
        bpf_object__close(obj);
        snprintf(err, errlen, "the pull cache's BPF object has an unexpected settings section");
        return NULL;
    }
    return obj;
}

static int attach(struct bpf_object *obj, const char *prog_name, int ifindex, struct bpf_link **link, int *native,
                  char *err, size_t errlen)
{
    struct bpf_program *p = bpf_object__find_program_by_name(obj, prog_name);
    if (!p) {
        snprintf(err, errlen, "the BPF object has no program %s", prog_name);
        return -ENOENT;
    }
    *link = bpf_program__attach_xdp(p, ifindex);
    if (!*link) {
        int rc = -errno;
        snprintf(err, errlen, "cannot attach XDP to interface %d: %s%s", ifindex, strerror(-rc),
                 rc == -EBUSY || rc == -EEXIST ? " (another XDP program is attached to it)" : "");
        return rc;
    }
    LIBBPF_OPTS(bpf_xdp_query_opts, q);
    *native = bpf_xdp_query(ifindex, 0, &q) == 0 && q.attach_mode == XDP_ATTACHED_DRV;
    return 0;
}

/* The interface holding IPv4 address addr: its index, name in name. */
static int iface_of(const char *addr, char *name, char *err, size_t errlen)
{
    struct in_addr a;
    if (inet_pton(AF_INET, addr, &a) != 1 || a.s_addr == htonl(INADDR_ANY)) {
        snprintf(err, errlen, "the pull cache needs --bind to be one interface's IPv4 address, got '%s'", addr);
        return -EINVAL;
    }
    struct ifaddrs *ifs, *i;
    if (getifaddrs(&ifs)) {
        snprintf(err, errlen, "getifaddrs: %s", strerror(errno));
        return -errno;
    }
    int index = 0;
    for (i = ifs; i && !index; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == a.s_addr) {
            snprintf(name, IF_NAMESIZE, "%s", i->ifa_name);
            index = (int)if_nametoindex(i->ifa_name);
        }
    freeifaddrs(ifs);
    if (!index)
        snprintf(err, errlen, "no interface holds address %s", addr);
    return index ? index : -ENODEV;
}

/* ---- slots: the seqlock of pullcache_slot.h */

static struct pc_slot *slot_take(struct pull_cache *pc, uint64_t idx)
{
    struct pc_slot *s = &pc->slots[idx];
    _Atomic uint32_t *seq = (_Atomic uint32_t *)&s->seq;
    for (;;) {
        uint32_t v = atomic_load_explicit(seq, memory_order_relaxed);
        if (!(v & 1) && atomic_compare_exchange_weak_explicit(seq, &v, v + 1, memory_order_acquire,
                                                              memory_order_relaxed))
            return s;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

static void slot_give(struct pc_slot *s)
{
    atomic_fetch_add_explicit((_Atomic uint32_t *)&s->seq, 1, memory_order_release);
}

static uint64_t key_hash(const void *key, size_t klen)
{
    uint64_t h = PC_HASH_SEED;
    for (size_t i = 0; i < klen; i += 8) {
        uint64_t w = 0; /* the last word zero-padded, as the program masks it */
        memcpy(&w, (const char *)key + i, klen - i < 8 ? klen - i : 8);
        h = pc_hash_word(h, w);
    }
    return h;
}

static int holds(const struct pc_slot *s, const void *key, size_t klen, uint64_t no)
{
    return s->klen == klen && s->no == no && !memcmp(s->key, key, klen);
}

/* The table's batch hook (pullcache.h's rules), key's shard locked. */
static void on_batch(void *arg, const void *key, size_t klen, const struct xs_batch *b, int ev)
{
    struct pull_cache *pc = arg;
    if (klen == 0 || klen > PC_KEY_MAX)
        return;
    if (!b) { /* the stream is gone: every slot of it */
        if (!atomic_load_explicit(&pc->used, memory_order_relaxed))
            return;
        for (uint32_t i = 0; i < pc->nslots; i++) {
            struct pc_slot *s = &pc->slots[i];
            if (s->klen != klen || memcmp(s->key, key, klen)) /* a racy peek; checked again taken */
                continue;
            s = slot_take(pc, i);
            if (s->klen == klen && !memcmp(s->key, key, klen)) {
                s->klen = 0;
                atomic_fetch_add_explicit(&pc->invalidations, 1, memory_order_relaxed);
            }
            slot_give(s);
        }
        return;
    }
    struct pc_slot *s = slot_take(pc, pc_index(key_hash(key, klen), b->no, pc->nslots));
    if (ev == XS_EV_GONE) {
        if (holds(s, key, klen, b->no)) {
            s->klen = 0;
            atomic_fetch_add_explicit(&pc->invalidations, 1, memory_order_relaxed);
        }
    } else if (ev == XS_EV_SEALED || holds(s, key, klen, b->no)) { /* sealed, or changed while cached */
        size_t n = xs_pull_encode(b, s->reply, PC_REPLY_MAX);
        if (s->reply[0] == XS_PULL_SEALED) {
            s->klen = (uint16_t)klen;
            s->no = b->no;
            s->len = (uint16_t)n;
            memcpy(s->key, key, klen);
            memset(s->key + klen, 0, PC_KEY_MAX - klen);
            atomic_fetch_add_explicit(&pc->fills, 1, memory_order_relaxed);
            atomic_store_explicit(&pc->used, 1, memory_order_relaxed);
        } else { /* larger than a datagram (the engine answers it); the slot's bytes are gone */
            if (s->klen)
                atomic_fetch_add_explicit(&pc->invalidations, 1, memory_order_relaxed);
            s->klen = 0;
        }
    }
    slot_give(s);
}

int pc_open(struct pull_cache **out, struct kv_table *t, const char *bind_addr, int port, uint32_t nslots,
            char *err, size_t errlen)
{
    *out = NULL;
    if (nslots < 1 || nslots > PC_MAX_SLOTS) {
        snprintf(err, errlen, "pull cache slots must be between 1 and %u, got %u", PC_MAX_SLOTS, nslots);
        return -EINVAL;
    }
    struct pull_cache *pc = calloc(1, sizeof *pc);
    if (!pc) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    pc->stats_fd = -1;
    pc->nslots = nslots;
    int rc, ifindex = iface_of(bind_addr, pc->ifname, err, errlen);
    if (ifindex < 0) {
        free(pc);
        return ifindex;
    }
    if (!(pc->obj = open_object(port, nslots, 0, err, errlen))) {
        free(pc);
        return -EINVAL;
    }
    struct bpf_map *slots = bpf_object__find_map_by_name(pc->obj, "slots");
    struct bpf_map *stats = bpf_object__find_map_by_name(pc->obj, "stats");
    if (!slots || !stats || bpf_map__set_max_entries(slots, nslots)) {
        snprintf(err, errlen, "the pull cache's BPF object lacks its maps");
        rc = -EINVAL;
        goto fail;
    }
    if ((rc = bpf_object__load(pc->obj))) {
        snprintf(err, errlen, "cannot load the pull cache's XDP program: %s%s", strerror(-rc),
                 rc == -EPERM ? " (needs root or CAP_BPF + CAP_NET_ADMIN)" : "");
        goto fail;
    }
    pc->map_bytes = ((size_t)nslots * sizeof(struct pc_slot) + 4095) & ~(size_t)4095;
    void *m = mmap(NULL, pc->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, bpf_map__fd(slots), 0);
    if (m == MAP_FAILED) {
        rc = -errno;
        snprintf(err, errlen, "cannot map the pull cache's slots: %s", strerror(errno));
        goto fail;
    }
    pc->slots = m;
    pc->stats_fd = bpf_map__fd(stats);
    pc->t = t;
    if ((rc = attach(pc->obj, "pull_cache", ifindex, &pc->link, &pc->native, err, errlen)))
        goto fail;
    kvt_set_batch_hook(t, on_batch, pc);
    *out = pc;
    return 0;
fail:
    pc->t = NULL;
    pc_close(pc);
    return rc;
}

void pc_close(struct pull_cache *pc)
{
    if (!pc)
        return;
    if (pc->t)
        kvt_set_batch_hook(pc->t, NULL, NULL);
    if (pc->link)
        bpf_link__destroy(pc->link); /* detaches: pulls go to the engine */
    if (pc->slots)
        munmap(pc->slots, pc->map_bytes);
    bpf_object__close(pc->obj);
    free(pc);
}

static void read_stats(int fd, uint64_t out[PC_NSTATS])
{
    int ncpu = libbpf_num_possible_cpus();
    uint64_t *v = ncpu > 0 ? calloc((size_t)ncpu, sizeof *v) : NULL;
    for (uint32_t k = 0; v && k < PC_NSTATS; k++)
        if (bpf_map_lookup_elem(fd, &k, v) == 0)
            for (int c = 0; c < ncpu; c++)
                out[k] += v[c];
    free(v);
}

void pc_get_stats(struct pull_cache *pc, struct pc_stats *out)
{
    memset(out, 0, sizeof *out);
    uint64_t st[PC_NSTATS] = {0};
    read_stats(pc->stats_fd, st);
    out->hits = st[PC_ST_HITS];
    out->misses = st[PC_ST_MISSES];
    out->torn = st[PC_ST_TORN];
    out->no_room = st[PC_ST_NO_ROOM];
    out->fills = atomic_load_explicit(&pc->fills, memory_order_relaxed);
    out->invalidations = atomic_load_explicit(&pc->invalidations, memory_order_relaxed);
    out->slots = pc->nslots;
    out->native = pc->native;
    snprintf(out->ifname, sizeof out->ifname, "%s", pc->ifname);
}

/* ---- the object's other programs: the bounce-only yardsticks, pass */

struct pc_prog {
    struct bpf_object *obj;
    struct bpf_link *link;
    int stats_fd;
};

struct pc_prog *pc_prog_attach(const char *ifname, const char *program, int port, uint32_t bounce_len, char *err,
                               size_t errlen)
{
    int ifindex = (int)if_nametoindex(ifname), native;
    if (!ifindex) {
        snprintf(err, errlen, "no interface %s", ifname);
        return NULL;
    }
    if (strcmp(program, "pull_bounce") && strcmp(program, "pull_bounce_copy") && strcmp(program, "pass")) {
        snprintf(err, errlen, "no XDP program %s: expected pull_bounce, pull_bounce_copy or pass", program);
        return NULL;
    }
    struct pc_prog *b = calloc(1, sizeof *b);
    if (!b || !(b->obj = open_object(port, 1, bounce_len, err, errlen))) {
        free(b);
        return NULL;
    }
    int rc = bpf_object__load(b->obj);
    if (rc) {
        snprintf(err, errlen, "cannot load the XDP programs: %s", strerror(-rc));
    } else if (!attach(b->obj, program, ifindex, &b->link, &native, err, errlen)) {
        b->stats_fd = bpf_map__fd(bpf_object__find_map_by_name(b->obj, "stats"));
        return b;
    }
    bpf_object__close(b->obj);
    free(b);
    return NULL;
}

uint64_t pc_prog_bounced(struct pc_prog *b)
{
    uint64_t st[PC_NSTATS] = {0};
    read_stats(b->stats_fd, st);
    return st[PC_ST_BOUNCED];
}

void pc_prog_detach(struct pc_prog *b)
{
    if (!b)
        return;
    bpf_link__destroy(b->link);
    bpf_object__close(b->obj);
    free(b);
}

#else /* built without clang or libbpf */

int pc_available(void) { return 0; }

int pc_open(struct pull_cache **out, struct kv_table *t, const char *bind_addr, int port, uint32_t slots,
            char *err, size_t errlen)
{
    *out = NULL;
    snprintf(err, errlen, "this build has no pull cache: clang and libbpf-dev were not found when it was built "
                          "(make dev installs them)");
    return -ENOTSUP;
}

void pc_close(struct pull_cache *pc) {}
void pc_get_stats(struct pull_cache *pc, struct pc_stats *out) { memset(out, 0, sizeof *out); }

struct pc_prog *pc_prog_attach(const char *ifname, const char *program, int port, uint32_t bounce_len, char *err,
                               size_t errlen)
{
    snprintf(err, errlen, "this build has no XDP programs (clang and libbpf-dev were not found)");
    return NULL;
}

uint64_t pc_prog_bounced(struct pc_prog *p) { return 0; }
void pc_prog_detach(struct pc_prog *p) {}

#endif
