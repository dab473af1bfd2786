/* pullgen.c - drives the pull generator's XDP programs (pullgen.h, pullgen.bpf.c). */
#define _GNU_SOURCE
#include "bench/pullgen.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#ifdef KV_HAVE_XDP

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench/pullgen_maps.h"
#include "bpf/settings.h"
#include <pullgen_bpf.h> /* generated into build/gen by kvstore/_bpfbuild.py: the compiled programs as bytes */

#define FRAME_LEN (PG_SLACK + 14 + 20 + 8 + PG_PULL_PAYLOAD)
#define RUNS_PER_CALL (1u << 20) /* a test run's page pool is set up and torn down per call (~25 ms here) */
#define NGEN 2                   /* generator threads: one sends while the other's call is torn down */

struct gen {
    int prog_fd, ifindex, cpu;
    atomic_int done;
    atomic_int rc;
    const char *frame;
};

static int fail(struct pg_result *out, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out->error, sizeof out->error, fmt, ap);
    va_end(ap);
    return rc;
}

static int silent(enum libbpf_print_level level, const char *fmt, va_list ap) { return 0; }

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void sleep_s(double s)
{
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&t, NULL);
}

static void *generate(void *arg)
{
    struct gen *g = arg;
    if (g->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(g->cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
    struct xdp_md ctx = {.data_end = FRAME_LEN, .ingress_ifindex = (uint32_t)g->ifindex};
    while (!atomic_load(&g->done)) {
        LIBBPF_OPTS(bpf_test_run_opts, o, .data_in = g->frame, .data_size_in = FRAME_LEN, .ctx_in = &ctx,
                    .ctx_size_in = sizeof ctx, .flags = BPF_F_TEST_XDP_LIVE_FRAMES, .repeat = RUNS_PER_CALL,
                    .batch_size = 64);
        if (bpf_prog_test_run_opts(g->prog_fd, &o)) {
            atomic_store(&g->rc, -errno);
            break;
        }
    }
    return NULL;
}

/* The sinks' counters summed over the CPUs. */
static void sink_read(int fd, struct pg_sink *out)
{
    int ncpu = libbpf_num_possible_cpus();
    struct pg_sink *v = ncpu > 0 ? calloc((size_t)ncpu, sizeof *v) : NULL;
    uint32_t zero = 0;
    memset(out, 0, sizeof *out);
    if (v && bpf_map_lookup_elem(fd, &zero, v) == 0)
        for (int c = 0; c < ncpu; c++) {
            out->answered += v[c].answered;
            out->bad += v[c].bad;
            out->answer_bytes += v[c].answer_bytes;
        }
    free(v);
}

static void hist_read(int fd, uint64_t *out)
{
    int ncpu = libbpf_num_possible_cpus();
    uint64_t *v = ncpu > 0 ? calloc((size_t)ncpu, sizeof *v) : NULL;
    memset(out, 0, PG_HIST * sizeof *out);
    for (uint32_t k = 0; v && k < PG_HIST; k++)
        if (bpf_map_lookup_elem(fd, &k, v) == 0)
            for (int c = 0; c < ncpu; c++)
                out[k] += v[c];
    free(v);
}

/* The latency (us) below which a share q of the answers counted in h came. */
static double percentile(const uint64_t *h, uint64_t n, double q)
{
    uint64_t want = (uint64_t)((double)n * q), seen = 0;
    for (int i = 0; i < PG_HIST; i++) {
        seen += h[i];
        if (seen > want)
            return ((double)i + 0.5) * 1.024;
    }
    return (double)PG_HIST * 1.024;
}

static int check(const struct pg_config *c, struct pg_result *out)
{
    if (!c->ifname || !c->dst_mac || !c->src_addr || !c->dst_addr)
        return fail(out, -EINVAL, "interface, destination MAC and both addresses are required");
    if (c->dst_port < 1 || c->dst_port > 65535 || c->src_port < 0 || c->src_port > 65535)
        return fail(out, -EINVAL, "ports: expected 1..65535");
    if (c->streams < 1 || c->streams > 1000000)
        return fail(out, -EINVAL, "streams: expected 1..1000000, got %u", c->streams);
    if (c->batches < 1)
        return fail(out, -EINVAL, "batches: expected at least 1");
    if (c->window < 1 || c->window > 65536)
        return fail(out, -EINVAL, "window: expected 1..65536 pulls in flight, got %u", c->window);
    if (!(c->duration > 0) || c->duration > 3600 || c->warmup < 0 || c->warmup > 60)
        return fail(out, -EINVAL, "duration: expected 0 < s <= 3600 (warm-up 0..60 s)");
    return 0;
}

static int settings(const struct pg_config *c, struct pg_settings *s, struct pg_result *out)
{
    memset(s, 0, sizeof *s);
    unsigned m[6];
    if (sscanf(c->dst_mac, "%2x:%2x:%2x:%2x:%2x:%2x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) != 6)
        return fail(out, -EINVAL, "destination MAC: expected aa:bb:cc:dd:ee:ff, got '%s'", c->dst_mac);
    for (int i = 0; i < 6; i++)
        s->dst_mac[i] = (uint8_t)m[i];
    struct ifreq ifr = {0};
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", c->ifname);
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    int rc = fd < 0 ? -1 : ioctl(fd, SIOCGIFHWADDR, &ifr);
    if (fd >= 0)
        close(fd);
    if (rc)
        return fail(out, -ENODEV, "interface %s: %s", c->ifname, strerror(errno));
    memcpy(s->src_mac, ifr.ifr_hwaddr.sa_data, 6);
    if (inet_pton(AF_INET, c->src_addr, &s->saddr) != 1 || inet_pton(AF_INET, c->dst_addr, &s->daddr) != 1)
        return fail(out, -EINVAL, "addresses: expected IPv4, got '%s' and '%s'", c->src_addr, c->dst_addr);
    s->sport = htons((uint16_t)(c->src_port ? c->src_port : 40000));
    s->dport = htons((uint16_t)c->dst_port);
    uint16_t h[10] = {htons(0x4500), htons(20 + 8 + PG_PULL_PAYLOAD), 0, 0, htons(64 << 8 | IPPROTO_UDP), 0};
    memcpy(&h[6], &s->saddr, 4);
    memcpy(&h[8], &s->daddr, 4);
    uint32_t sum = 0;
    for (int i = 0; i < 10; i++)
        sum += h[i];
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    s->ip_check = (uint16_t)~sum;
    s->streams = c->streams;
    s->batches = c->batches;
    s->window = c->window;
    int ncpu = libbpf_num_possible_cpus();
    if (ncpu < 1 || ncpu > PG_MAX_CPUS)
        return fail(out, -ENOTSUP, "this machine has %d possible CPUs; the generator sums at most %d", ncpu,
                    PG_MAX_CPUS);
    s->ncpus = (uint32_t)ncpu;
    s->lost_after_ns = (uint64_t)(c->lost_ms ? c->lost_ms : 200) * 1000000u;
    return 0;
}

static struct bpf_object *open_object(const struct pg_settings *s, struct pg_result *out)
{
    libbpf_set_print(silent);
    struct bpf_object *obj = bpf_object__open_mem(kv_pullgen_bpf, kv_pullgen_bpf_len, NULL);
    if (!obj) {
        fail(out, -errno, "cannot open the generator's BPF object: %s", strerror(errno));
        return NULL;
    }
    if (kv_bpf_set_settings(obj, s, sizeof *s)) { /* the programs' only read-only global */
        bpf_object__close(obj);
        fail(out, -EINVAL, "the generator's BPF object has an unexpected settings section");
        return NULL;
    }
    return obj;
}

int pg_run(const struct pg_config *cfg, struct pg_result *out)
{
    memset(out, 0, sizeof *out);
    struct pg_settings s;
    int rc = check(cfg, out);
    if (rc || (rc = settings(cfg, &s, out)))
        return rc;
    int ifindex = (int)if_nametoindex(cfg->ifname);
    struct bpf_object *obj = open_object(&s, out);
    if (!obj)
        return -EINVAL;
    struct bpf_link *link = NULL;
    struct pg_ctl *ctl = MAP_FAILED;
    uint64_t *h0 = calloc(PG_HIST, sizeof *h0), *h1 = calloc(PG_HIST, sizeof *h1);
    size_t ctl_bytes = (size_t)sysconf(_SC_PAGESIZE);
    if (!h0 || !h1) {
        rc = fail(out, -ENOMEM, "out of memory");
        goto done;
    }
    if ((rc = bpf_object__load(obj))) {
        rc = fail(out, rc == -EPERM ? -EPERM : -ENOTSUP, "cannot load the generator's XDP programs: %s%s",
                  strerror(-rc), rc == -EPERM ? " (needs root: CAP_BPF and CAP_NET_ADMIN)" : "");
        goto done;
    }
    int ctl_fd = bpf_map__fd(bpf_object__find_map_by_name(obj, "ctl"));
    int hist_fd = bpf_map__fd(bpf_object__find_map_by_name(obj, "hist"));
    int sink_fd = bpf_map__fd(bpf_object__find_map_by_name(obj, "sink"));
    ctl = mmap(NULL, ctl_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ctl_fd, 0);
    if (ctl == MAP_FAILED) {
        rc = fail(out, -errno, "cannot map the generator's counters: %s", strerror(errno));
        goto done;
    }
    link = bpf_program__attach_xdp(bpf_object__find_program_by_name(obj, "pull_sink"), ifindex);
    if (!link) {
        rc = -errno;
        fail(out, rc, "cannot attach XDP to %s: %s%s", cfg->ifname, strerror(-rc),
             rc == -EBUSY || rc == -EEXIST ? " (another XDP program is attached to it)" : "");
        goto done;
    }
    LIBBPF_OPTS(bpf_xdp_query_opts, q);
    out->native = bpf_xdp_query(ifindex, 0, &q) == 0 && q.attach_mode == XDP_ATTACHED_DRV;
    static char frame[FRAME_LEN]; /* written by the program on every run: its content is never read */
    struct gen g = {.prog_fd = bpf_program__fd(bpf_object__find_program_by_name(obj, "pull_gen")),
                    .ifindex = ifindex, .cpu = cfg->cpu, .frame = frame};
    atomic_init(&g.done, 0);
    atomic_init(&g.rc, 0);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* bpf_ktime_get_ns's clock */
    __atomic_store_n(&ctl->last_seen_ns, (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec,
                     __ATOMIC_RELAXED);
    pthread_t th[NGEN];
    int started = 0;
    for (; started < NGEN; started++)
        if (pthread_create(&th[started], NULL, generate, &g))
            break;
    struct pg_ctl a, b;
    struct pg_sink ka, kb;
    sleep_s(cfg->warmup);
    a = *(volatile struct pg_ctl *)ctl;
    sink_read(sink_fd, &ka);
    hist_read(hist_fd, h0);
    double t0 = now_s(), end = t0 + cfg->duration;
    while (now_s() < end && !atomic_load(&g.rc) && !(cfg->stop && *cfg->stop))
        sleep_s(end - now_s() < 0.05 ? end - now_s() : 0.05);
    b = *(volatile struct pg_ctl *)ctl;
    sink_read(sink_fd, &kb);
    out->elapsed = now_s() - t0;
    hist_read(hist_fd, h1);
    __atomic_store_n(&ctl->stop, 1, __ATOMIC_RELAXED);
    atomic_store(&g.done, 1);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (!started) {
        rc = fail(out, -EAGAIN, "cannot start the generator's threads");
        goto done;
    }
    if ((rc = atomic_load(&g.rc))) {
        fail(out, rc, "the kernel's test run failed: %s%s", strerror(-rc),
             rc == -EINVAL ? " (live-frame XDP test runs need Linux 5.18)" : "");
        goto done;
    }
    out->sent = b.sent - a.sent;
    out->answered = kb.answered - ka.answered;
    out->bad = kb.bad - ka.bad;
    out->answer_bytes = kb.answer_bytes - ka.answer_bytes;
    out->lost = ((volatile struct pg_ctl *)ctl)->lost;
    out->throughput = out->elapsed > 0 ? (double)out->answered / out->elapsed : 0;
    uint64_t n = 0;
    for (int i = 0; i < PG_HIST; i++)
        n += (h1[i] -= h0[i]);
    if (n) {
        out->lat_p50_us = percentile(h1, n, 0.5);
        out->lat_p99_us = percentile(h1, n, 0.99);
        out->lat_p999_us = percentile(h1, n, 0.999);
    }
done:
    if (ctl != MAP_FAILED)
        munmap(ctl, ctl_bytes);
    bpf_link__destroy(link);
    bpf_object__close(obj);
    free(h0);
    free(h1);
    return rc;
}

#else /* built without clang or libbpf */

int pg_run(const struct pg_config *cfg, struct pg_result *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->error, sizeof out->error, "this build has no XDP pull generator: clang and libbpf-dev were not "
                                            "found when it was built (make dev installs them)");
    return -ENOTSUP;
}

#endif
