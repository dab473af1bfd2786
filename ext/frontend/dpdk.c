/* dpdk.c - the kernel-bypass UDP front end (--arch dpdk; framing in udpfront.h):
 * DPDK lcores that take bursts of UDP datagrams from one port (rte_eth_rx_burst),
 * run the RESP request each carries on the engine, and send the reply back in
 * the same mbuf (rte_eth_tx_burst). Built only with KV_HAVE_DPDK (frontend.c
 * lists it then). mTCP, the paper's kernel-bypass TCP, is not packaged anywhere
 * usable: the fast path is UDP, as in MICA. TCP is still served by the pollers.
 * Threads: the control thread runs dp_create/start/stop/destroy; each worker lcore
 * owns one RX/TX queue pair, its uf_worker, eventfd and reply ring, and touches the
 * shared table only through cmd_dispatch (kvt_* locks per shard). Counters are
 * single-writer atomics read by INFO/stats. Parses untrusted frames: every length
 * (Ethernet, IPv4, UDP, framing, RESP) is checked against what was received.
 * An lcore busy-polls, so it also polls for durability: each turn it sends, in order,
 * the replies whose LSN the log holds; a request that waits for the data file keeps
 * its mbuf (and the burst behind it) and runs again once the lcore's eventfd says
 * the data file moved on, while nothing new is taken from the RX ring.
 * The mbuf pool is the AF_XDP umem (see pool_create): it must be one packed run of mbufs. */
#define _GNU_SOURCE
#include <rte_config.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mbuf_pool_ops.h>
#include <rte_mempool.h>
#include <rte_pause.h>
#include <rte_cycles.h>
#include <rte_udp.h>

#include "core/counter.h"
#include "engine/engine.h"
#include "frontend/frontend.h"
#include "frontend/udpfront.h"
#include "durability/wal.h"

#define MAX_LCORES 64
#define BURST 32
#define RING 1024                     /* replies built, waiting for the log (a power of two) */
#define NB_MBUF 8191
#define MBUF_CACHE 256
#define IDLE_SPINS 200000             /* empty polls before the lcore starts napping */
#define IDLE_NAP_US 20                /* first nap between polls once idle, doubling up to
                                         IDLE_NAP_MAX_US: a shared machine should not lose
                                         a core (or 10 % of one) to an idle server */
#define IDLE_NAP_MAX_US 1000
#define STALL_SPINS 100000            /* a stalled request runs again at least this often,
                                         in case a wakeup was lost (a refused load request) */
#define HDRS (sizeof(struct rte_ether_hdr) + sizeof(struct rte_ipv4_hdr) + sizeof(struct rte_udp_hdr))

struct dp_lcore {
    struct dp_port *d;
    unsigned lcore_id;
    uint16_t queue;
    int launched;
    int evfd;                    /* written by the log and the data file */
    struct uf_worker w;
    /* received burst: rx[rx_i..rx_n) still to run; rx[rx_i] is the stalled one if stalled */
    struct rte_mbuf *rx[BURST];
    int rx_i, rx_n, stalled;
    unsigned stall_spins;
    /* replies built in their request's mbuf: ring[head..head+n) (mod RING), sent in
     * order once the log holds their LSN */
    struct rte_mbuf *ring[RING];
    uint64_t lsn[RING];
    unsigned head, n;
} __attribute__((aligned(64)));

struct dp_port {
    struct kv_engine *eng;
    int port;                    /* udp_port, host order (INFO) */
    struct uf_info info;
    uint16_t port_id;
    int port_started;
    uint16_t udp_port;           /* network order */
    int nlcores;
    struct dp_lcore lc[MAX_LCORES];
    struct rte_mempool *pool;
    _Atomic int stopping;
    char *argbuf;                /* EAL argv strings (EAL may keep pointers into them) */
    char **argv;
};

/* rte_eal_init works once per process; a second server in it cannot have its own EAL. */
static atomic_int eal_used;

/* ---- one datagram */

/* The frame's UDP payload, or NULL: *why = -1 not for us (count as dropped), -2 malformed. */
static uint8_t *frame_payload(struct dp_lcore *lc, struct rte_mbuf *m, size_t *len, int *why)
{
    *why = -1;
    if (m->nb_segs != 1 || m->data_len < HDRS)
        return NULL;
    struct rte_ether_hdr *eth = rte_pktmbuf_mtod(m, struct rte_ether_hdr *);
    if (eth->ether_type != rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4))
        return NULL; /* ARP, IPv6 neighbour discovery, ...: the client has a static neighbour */
    struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
    if (ip->version_ihl != RTE_IPV4_VHL_DEF || ip->next_proto_id != IPPROTO_UDP)
        return NULL; /* IPv4 options are not expected on this path */
    struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);
    if (udp->dst_port != lc->d->udp_port)
        return NULL;
    *why = -2;
    if (ip->fragment_offset & rte_cpu_to_be_16(RTE_IPV4_HDR_MF_FLAG | RTE_IPV4_HDR_OFFSET_MASK))
        return NULL; /* fragments: a request must fit one datagram */
    size_t iplen = rte_be_to_cpu_16(ip->total_length), ulen = rte_be_to_cpu_16(udp->dgram_len);
    if (iplen > m->data_len - sizeof *eth || ulen != iplen - sizeof *ip || ulen < sizeof *udp + KVU_HDR_LEN)
        return NULL;
    *len = ulen - sizeof *udp;
    return (uint8_t *)(udp + 1);
}

/* Turn request mbuf m into its reply in place (the reply's RESP is in lc->w.out). */
static void build_reply(struct dp_lcore *lc, struct rte_mbuf *m)
{
    struct rte_ether_hdr *eth = rte_pktmbuf_mtod(m, struct rte_ether_hdr *);
    struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
    struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);
    uint8_t *fh = (uint8_t *)(udp + 1);
    size_t plen = uf_frame_reply(&lc->w, fh, fh, m->buf_len - m->data_off - HDRS);
    /* addresses and ports swapped */
    struct rte_ether_addr ea = eth->dst_addr;
    eth->dst_addr = eth->src_addr;
    eth->src_addr = ea;
    rte_be32_t ia = ip->dst_addr;
    ip->dst_addr = ip->src_addr;
    ip->src_addr = ia;
    rte_be16_t pa = udp->dst_port;
    udp->dst_port = udp->src_port;
    udp->src_port = pa;
    size_t ulen = sizeof *udp + plen;
    udp->dgram_len = rte_cpu_to_be_16((uint16_t)ulen);
    ip->total_length = rte_cpu_to_be_16((uint16_t)(ulen + sizeof *ip));
    ip->time_to_live = 64;
    ip->fragment_offset = 0;
    /* Checksums in software: the port offers no TX offload, and a reply that
     * reused the request's (possibly partial, offloaded) checksum is dropped. */
    ip->hdr_checksum = 0;
    ip->hdr_checksum = rte_ipv4_cksum(ip);
    udp->dgram_cksum = 0;
    udp->dgram_cksum = rte_ipv4_udptcp_cksum(ip, udp);
    m->data_len = m->pkt_len = (uint32_t)(sizeof *eth + sizeof *ip + ulen);
    m->ol_flags = 0;
}

/* Send ring replies in order while the log holds their LSN. */
static void send_ready(struct dp_lcore *lc)
{
    if (!lc->n)
        return;
    int failed;
    uint64_t durable = uf_durable(&lc->w, &failed);
    while (lc->n) {
        struct rte_mbuf *tx[BURST];
        uint16_t m = 0;
        while (m < BURST && m < lc->n && (failed || lc->lsn[(lc->head + m) % RING] <= durable)) {
            tx[m] = lc->ring[(lc->head + m) % RING];
            m++;
        }
        if (!m)
            return;
        uint16_t sent = 0;
        if (!failed) /* a failed log: these writes can never be acknowledged */
            for (int tries = 0; sent < m && tries < 8; tries++)
                sent += rte_eth_tx_burst(lc->d->port_id, lc->queue, tx + sent, m - sent);
        st_inc(&lc->w.st.tx_packets, sent);
        if (sent < m) { /* TX ring full: the client sees a timeout, as for any lost datagram */
            st_inc(&lc->w.st.tx_failed, m - sent);
            rte_pktmbuf_free_bulk(tx + sent, m - sent);
        }
        lc->head = (lc->head + m) % RING;
        lc->n -= m;
    }
}

static int woken(struct dp_lcore *lc)
{
    uint64_t v;
    return lc->evfd >= 0 && read(lc->evfd, &v, sizeof v) == sizeof v;
}

/* Run the received burst until all ran, one stalls, or the ring is full. */
static int run_received(struct dp_lcore *lc)
{
    if (lc->stalled && !woken(lc) && ++lc->stall_spins < STALL_SPINS)
        return 0;
    lc->stall_spins = 0;
    int ran = 0, failed;
    uint64_t durable = uf_durable(&lc->w, &failed);
    while (lc->rx_i < lc->rx_n && lc->n < RING) {
        struct rte_mbuf *m = lc->rx[lc->rx_i];
        int r;
        if (lc->stalled) {
            r = uf_resume(&lc->w);
        } else {
            if (lc->rx_i + 1 < lc->rx_n)
                rte_prefetch0(rte_pktmbuf_mtod(lc->rx[lc->rx_i + 1], void *));
            size_t len;
            int why;
            uint8_t *p = frame_payload(lc, m, &len, &why);
            if (!p) {
                st_inc(why == -2 ? &lc->w.st.bad_frames : &lc->w.st.dropped, 1);
                rte_pktmbuf_free(m);
                lc->rx_i++;
                ran++;
                continue;
            }
            r = uf_run(&lc->w, p, len);
        }
        if (r == UF_STALL) {
            lc->stalled = 1;
            break;
        }
        lc->stalled = 0;
        ran++;
        lc->rx_i++;
        if (r == UF_BAD) {
            st_inc(&lc->w.st.bad_frames, 1);
            rte_pktmbuf_free(m);
            continue;
        }
        build_reply(lc, m);
        unsigned at = (lc->head + lc->n) % RING;
        lc->ring[at] = m;
        lc->lsn[at] = lc->w.ses.need;
        if (lc->w.ses.need > durable)
            st_inc(&lc->w.st.held, 1);
        lc->n++;
    }
    return ran;
}

static int lcore_main(void *arg)
{
    struct dp_lcore *lc = arg;
    struct dp_port *d = lc->d;
    unsigned idle = 0, nap = IDLE_NAP_US;
    const double ns_per_tick = 1e9 / (double)rte_get_tsc_hz();
    uint64_t t0 = rte_rdtsc(), busy = 0;
    int worked = 0;
    while (!atomic_load_explicit(&d->stopping, memory_order_acquire)) {
        /* busy time: turns that did work (the lcore's CPU time is all of its time) */
        uint64_t t = rte_rdtsc();
        if (worked)
            busy += t - t0;
        t0 = t;
        if (busy > 1000000) {
            st_inc(&lc->w.st.busy_ns, (uint64_t)((double)busy * ns_per_tick));
            busy = 0;
        }
        send_ready(lc);
        int progress = run_received(lc);
        if (lc->rx_i == lc->rx_n && lc->n < RING - BURST) {
            uint16_t n = rte_eth_rx_burst(d->port_id, lc->queue, lc->rx, BURST);
            st_inc(&lc->w.st.rx_packets, n);
            lc->rx_i = 0;
            lc->rx_n = n;
            progress += n;
        }
        worked = progress > 0;
        if (progress) {
            idle = 0;
            nap = IDLE_NAP_US;
            continue;
        }
        if (lc->n || lc->stalled) { /* waiting for the log or the data file: keep polling */
            rte_pause();
        } else if (++idle > IDLE_SPINS) {
            usleep(nap);
            nap = nap * 2 > IDLE_NAP_MAX_US ? IDLE_NAP_MAX_US : nap * 2;
        } else {
            rte_pause();
        }
    }
    return 0;
}

/* ---- the mbuf pool, which is the AF_XDP umem
 *
 * The AF_XDP PMD (DPDK 22.11, unaligned-chunk mode) registers as its umem the memory from
 * the pool's first chunk (rounded down to a page) for populated_size x object size bytes,
 * and hands the kernel each received-into mbuf's offset in it on the fill ring. An mbuf
 * outside that span is an invalid fill descriptor: the kernel consumes it, receives
 * nothing into it and returns nothing, and the PMD (which refills one mbuf per packet
 * received) never replaces it. rte_pktmbuf_pool_create without hugepages lays objects out
 * so that none crosses a 4 KiB page: one 2,368-byte mbuf per page, a pool 1.7x longer than
 * that span, 42 % of its mbufs outside it. A few hundred mbufs held past the lcore's cache
 * (replies waiting for the log) make allocation walk the pool's ring through them, and
 * each one taken for the fill ring loses a slot of it until none is left: the port stops
 * receiving for good (the kernel counts rx_dropped, the pool still looks mostly free).
 * So: a pool created without the page constraint (RTE_MEMPOOL_F_NO_IOVA_CONTIG: the veth's
 * copy mode does no DMA), checked to be what the PMD registers. */

struct span_check {
    uintptr_t lo, hi; /* [lo, hi): the umem the PMD registers */
    size_t objsz;
    unsigned outside, chunks;
};

static void span_obj(struct rte_mempool *mp, void *arg, void *obj, unsigned idx)
{
    (void)idx;
    struct span_check *c = arg;
    uintptr_t start = (uintptr_t)obj - mp->header_size;
    if (start < c->lo || start + c->objsz > c->hi)
        c->outside++;
}

static void span_chunk(struct rte_mempool *mp, void *arg, struct rte_mempool_memhdr *m, unsigned idx)
{
    (void)mp, (void)m, (void)idx;
    ((struct span_check *)arg)->chunks++;
}

/* 0, or how many of pool's mbufs lie outside the umem the AF_XDP PMD makes of it (-1: more
 * than one chunk of memory, which the PMD cannot register at all). */
static long pool_outside_umem(struct rte_mempool *mp)
{
    struct span_check c = {0};
    rte_mempool_mem_iter(mp, span_chunk, &c);
    if (c.chunks != 1)
        return -1;
    uintptr_t first = (uintptr_t)STAILQ_FIRST(&mp->mem_list)->addr;
    uintptr_t page = (uintptr_t)getpagesize();
    c.objsz = rte_mempool_calc_obj_size(mp->elt_size, mp->flags, NULL);
    c.lo = first & ~(page - 1);
    c.hi = c.lo + (uintptr_t)mp->populated_size * c.objsz + (first - c.lo);
    rte_mempool_obj_iter(mp, span_obj, &c);
    return c.outside;
}

/* rte_pktmbuf_pool_create's steps, with the objects packed (see above). Returns 0 with
 * *res set, or -errno: DPDK's cause where it gives one, -ENOMEM for a short pool,
 * -ENOTSUP when the memory cannot be the AF_XDP umem (not one run, or mbufs outside it). */
static int pool_create(const char *name, unsigned n, struct rte_mempool **res, char *err, size_t errlen)
{
    struct rte_pktmbuf_pool_private priv = {.mbuf_data_room_size = RTE_MBUF_DEFAULT_BUF_SIZE};
    struct rte_mempool *mp = rte_mempool_create_empty(name, n, sizeof(struct rte_mbuf) + RTE_MBUF_DEFAULT_BUF_SIZE,
                                                      MBUF_CACHE, sizeof priv, (int)rte_socket_id(),
                                                      RTE_MEMPOOL_F_NO_IOVA_CONTIG);
    if (!mp) {
        snprintf(err, errlen, "mbuf pool: %s", rte_strerror(rte_errno));
        return -(rte_errno ? rte_errno : ENOMEM);
    }
    int rc = rte_mempool_set_ops_byname(mp, rte_mbuf_best_mempool_ops(), NULL);
    if (rc) {
        snprintf(err, errlen, "mbuf pool ops: %s", rte_strerror(-rc));
        goto fail;
    }
    rte_pktmbuf_pool_init(mp, &priv);
    rc = rte_mempool_populate_default(mp);
    if (rc < 0 || (unsigned)rc != n) {
        snprintf(err, errlen, "mbuf pool: %d of %u mbufs: %s", rc < 0 ? 0 : rc, n, rc < 0 ? rte_strerror(-rc) : "");
        rc = rc < 0 ? rc : -ENOMEM;
        goto fail;
    }
    rte_mempool_obj_iter(mp, rte_pktmbuf_init, NULL);
    long out = pool_outside_umem(mp);
    if (out) {
        if (out < 0)
            snprintf(err, errlen, "mbuf pool: not one run of memory, so not an AF_XDP umem");
        else
            snprintf(err, errlen, "mbuf pool: %ld of %u mbufs outside the AF_XDP umem (they would be lost "
                                  "on the fill ring)", out, n);
        rc = -ENOTSUP;
        goto fail;
    }
    *res = mp;
    return 0;
fail:
    rte_mempool_free(mp);
    return rc;
}

/* ---- lifecycle */

/* "--lcores" value: main lcore 0 floats over every allowed CPU (it is the control
 * thread, which must not be pinned); worker lcore i is pinned to the i-th allowed
 * CPU counted from the last, away from CPU 0 where interrupts tend to land. */
static int lcores_arg(char *dst, size_t n, int workers, char *err, size_t errlen)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set)) {
        snprintf(err, errlen, "sched_getaffinity: %s", strerror(errno));
        return -errno;
    }
    int cpus[CPU_SETSIZE], nc = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set))
            cpus[nc++] = c;
    size_t o = (size_t)snprintf(dst, n, "0@(");
    for (int i = 0; i < nc && o < n; i++)
        o += (size_t)snprintf(dst + o, n - o, i ? ",%d" : "%d", cpus[i]);
    o += (size_t)snprintf(dst + o, n > o ? n - o : 0, ")");
    for (int i = 1; i <= workers && o < n; i++)
        o += (size_t)snprintf(dst + o, n - o, ",%d@%d", i, cpus[(nc - i % nc) % nc]);
    if (o >= n) {
        snprintf(err, errlen, "too many CPUs for the --lcores argument");
        return -E2BIG;
    }
    return 0;
}

static int eal_init(struct dp_port *d, const char *iface, int lcores, const char *extra, char *err, size_t errlen)
{
    char lcarg[4096], vdev[512], prefix[64];
    int rc = lcores_arg(lcarg, sizeof lcarg, lcores, err, errlen);
    if (rc)
        return rc;
    snprintf(vdev, sizeof vdev, "net_af_xdp0,iface=%s,start_queue=0,queue_count=%d", iface, lcores);
    snprintf(prefix, sizeof prefix, "kvstore-%d", (int)getpid());
    const char *fixed[] = {"kvstore", "--no-huge", "--no-pci", "-m", "256", "--no-telemetry",
                           "--file-prefix", prefix, "--lcores", lcarg, "--vdev", vdev,
                           "--log-level", "*:warning"};
    size_t nf = sizeof fixed / sizeof *fixed, total = 0, ne = 0;
    for (size_t i = 0; i < nf; i++)
        total += strlen(fixed[i]) + 1;
    if (extra) {
        total += strlen(extra) + 1;
        ne = strlen(extra) / 2 + 1;
    }
    d->argbuf = malloc(total);
    d->argv = calloc(nf + ne + 1, sizeof *d->argv);
    if (!d->argbuf || !d->argv)
        return -ENOMEM;
    char *p = d->argbuf;
    int argc = 0;
    for (size_t i = 0; i < nf; i++) {
        d->argv[argc++] = strcpy(p, fixed[i]);
        p += strlen(fixed[i]) + 1;
    }
    if (extra) {
        strcpy(p, extra);
        for (char *t = strtok(p, " \t"); t; t = strtok(NULL, " \t"))
            d->argv[argc++] = t;
    }
    /* rte_eal_init pins the calling (control) thread; threads it starts later,
     * the TCP pollers among them, would inherit that: keep its affinity as it was. */
    cpu_set_t saved;
    int have_saved = !pthread_getaffinity_np(pthread_self(), sizeof saved, &saved);
    rc = rte_eal_init(argc, d->argv);
    if (have_saved)
        pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
    if (rc < 0) {
        snprintf(err, errlen, "DPDK EAL init failed: %s (see the EAL messages above)", rte_strerror(rte_errno));
        return -(rte_errno ? rte_errno : EINVAL);
    }
    return 0;
}

static void dp_stop(void *st);
static void dp_destroy(void *st);
static void dp_totals(void *st, struct uf_totals *t);

/* Initialise DPDK's EAL (once per process: a second create fails with -EALREADY),
 * probe an AF_XDP port on dpdk_iface and set up udp_workers RX/TX queue pairs, one
 * per worker lcore. Nothing is received until dp_start. */
static int dp_create(void **out, struct kv_engine *eng, char *err, size_t errlen)
{
    const char *iface = eng->cfg.dpdk_iface, *eal_args = eng->cfg.dpdk_eal_args;
    int lcores = eng->cfg.udp_workers, udp_port = eng->cfg.udp_port;
    if (!iface || !*iface) {
        snprintf(err, errlen, "arch dpdk needs an interface (--dpdk-iface), e.g. one end of a veth pair");
        return -EINVAL;
    }
    if (lcores < 1 || lcores >= MAX_LCORES) {
        snprintf(err, errlen, "dpdk lcores must be between 1 and %d, got %d", MAX_LCORES - 1, lcores);
        return -EINVAL;
    }
    if (udp_port < 1 || udp_port > 65535) {
        snprintf(err, errlen, "dpdk UDP port must be between 1 and 65535, got %d", udp_port);
        return -EINVAL;
    }
    if (atomic_exchange(&eal_used, 1)) {
        snprintf(err, errlen, "DPDK's EAL was already initialised in this process: one dpdk server per process");
        return -EALREADY;
    }
    struct dp_port *d = calloc(1, sizeof *d);
    if (!d)
        return -ENOMEM;
    d->eng = eng;
    d->port = udp_port;
    d->info = (struct uf_info){dp_totals, d, &d->port, lcores};
    d->nlcores = lcores;
    d->udp_port = rte_cpu_to_be_16((uint16_t)udp_port);
    int rc = uf_register_info(eng, &d->info);
    if (rc < 0 || (rc = eal_init(d, iface, lcores, eal_args, err, errlen)))
        goto fail_noeal;
    if (rte_eth_dev_get_port_by_name("net_af_xdp0", &d->port_id)) {
        snprintf(err, errlen, "no DPDK port for AF_XDP on interface %s (is the net_af_xdp driver installed, "
                              "the interface up, and are we root?)", iface);
        rc = -ENODEV;
        goto fail;
    }
    if (rte_lcore_count() < (unsigned)lcores + 1) {
        snprintf(err, errlen, "EAL gave %u lcores, %d needed", rte_lcore_count(), lcores + 1);
        rc = -EINVAL;
        goto fail;
    }
    rc = pool_create("kv_mbuf", NB_MBUF, &d->pool, err, errlen);
    if (rc)
        goto fail;
    struct rte_eth_conf conf;
    memset(&conf, 0, sizeof conf);
    rc = rte_eth_dev_configure(d->port_id, (uint16_t)lcores, (uint16_t)lcores, &conf);
    if (rc) {
        snprintf(err, errlen, "configure port on %s: %s", iface, rte_strerror(-rc));
        goto fail;
    }
    int sock = rte_eth_dev_socket_id(d->port_id);
    for (int q = 0; q < lcores; q++) {
        if ((rc = rte_eth_rx_queue_setup(d->port_id, (uint16_t)q, 0, (unsigned)sock, NULL, d->pool)) ||
            (rc = rte_eth_tx_queue_setup(d->port_id, (uint16_t)q, 0, (unsigned)sock, NULL))) {
            snprintf(err, errlen, "queue %d on %s: %s", q, iface, rte_strerror(-rc));
            goto fail;
        }
    }
    rc = rte_eth_dev_start(d->port_id);
    if (rc) {
        snprintf(err, errlen, "start port on %s: %s", iface, rte_strerror(-rc));
        goto fail;
    }
    d->port_started = 1;
    unsigned id, i = 0;
    RTE_LCORE_FOREACH_WORKER(id) {
        if (i >= (unsigned)lcores)
            break;
        struct dp_lcore *lc = &d->lc[i];
        lc->d = d;
        lc->lcore_id = id;
        lc->queue = (uint16_t)i;
        char addr[64];
        snprintf(addr, sizeof addr, "udp:%s:%d", iface, udp_port);
        lc->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        uf_init(&lc->w, eng, (int)i, lc->evfd, addr);
        if (lc->evfd < 0) {
            rc = -errno;
            snprintf(err, errlen, "lcore %u: eventfd: %s", id, strerror(errno));
            goto fail;
        }
        if ((rc = ses_subscribe(eng, lc->evfd, err, errlen)) < 0)
            goto fail;
        i++;
    }
    *out = d;
    return 0;
fail:
    dp_destroy(d);
    return rc < 0 ? rc : -rc;
fail_noeal:
    free(d->argbuf);
    free(d->argv);
    free(d);
    return rc;
}

static int dp_start(void *st, char *err, size_t errlen)
{
    struct dp_port *d = st;
    for (int i = 0; i < d->nlcores; i++) {
        struct dp_lcore *lc = &d->lc[i];
        int rc = rte_eal_remote_launch(lcore_main, lc, lc->lcore_id);
        if (rc) {
            snprintf(err, errlen, "cannot launch lcore %u: %s", lc->lcore_id, rte_strerror(-rc));
            dp_stop(d);
            return rc < 0 ? rc : -rc;
        }
        lc->launched = 1;
    }
    return 0;
}

static void dp_stop(void *st)
{
    struct dp_port *d = st;
    /* release: lcores that see it have nothing more to finish */
    atomic_store_explicit(&d->stopping, 1, memory_order_release);
    for (int i = 0; i < d->nlcores; i++) {
        if (d->lc[i].launched) {
            rte_eal_wait_lcore(d->lc[i].lcore_id);
            d->lc[i].launched = 0;
        }
    }
}

static void dp_destroy(void *st)
{
    struct dp_port *d = st;
    if (!d)
        return;
    dp_stop(d);
    if (d->port_started)
        rte_eth_dev_stop(d->port_id);
    rte_eth_dev_close(d->port_id); /* detaches the XDP program from the interface */
    for (int i = 0; i < d->nlcores; i++) {
        struct dp_lcore *lc = &d->lc[i];
        if (lc->d) {
            uf_free(&lc->w);
            if (lc->evfd >= 0)
                close(lc->evfd);
        }
        for (int j = lc->rx_i; j < lc->rx_n; j++) /* stopped while these waited */
            rte_pktmbuf_free(lc->rx[j]);
        for (; lc->n; lc->n--, lc->head = (lc->head + 1) % RING)
            rte_pktmbuf_free(lc->ring[lc->head]);
    }
    if (d->pool)
        rte_mempool_free(d->pool);
    rte_eal_cleanup();
    free(d->argbuf);
    free(d->argv);
    free(d);
}

static int dp_port_of(const void *st) { return ((const struct dp_port *)st)->port; }

static void dp_totals(void *st, struct uf_totals *t)
{
    struct dp_port *d = st;
    for (int i = 0; i < d->nlcores; i++)
        uf_add_totals(&d->lc[i].w.st, t);
}

static void dp_add_stats(void *st, struct fe_stats *out)
{
    struct uf_totals t = {0};
    dp_totals(st, &t);
    uf_add_stats(&t, out);
}

const struct kv_frontend_ops fe_dpdk = {"dpdk", dp_create, dp_start, dp_stop, dp_destroy, dp_port_of, dp_add_stats,
                                        NULL};
