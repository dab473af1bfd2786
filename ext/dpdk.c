/* dpdk.c - the kernel-bypass UDP front end (--arch dpdk; framing in dpdk.h).
 * Threads: the control thread runs dp_create/start/stop/destroy; each worker lcore
 * owns one RX/TX queue pair, its own cmd_client and reply buffer, and touches the
 * shared table only through cmd_dispatch (kvt_* locks per shard). Counters are
 * single-writer atomics read by INFO/stats. Parses untrusted frames: every length
 * (Ethernet, IPv4, UDP, framing, RESP) is checked against what was received. */
#define _GNU_SOURCE
#include <rte_config.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_pause.h>
#include <rte_udp.h>

#include "cmd.h"
#include "dpdk.h"
#include "resp.h"
#include "server.h"

#define MAX_LCORES 64
#define BURST 32
#define NB_MBUF 8191
#define MBUF_CACHE 256
#define MAX_UDP_PAYLOAD 1472          /* a 1500-byte MTU: 1500 - IPv4 (20) - UDP (8) */
#define IDLE_SPINS 200000             /* empty polls before the lcore starts napping */
#define IDLE_NAP_US 20                /* nap between polls once idle: a shared machine
                                         should not lose a whole core to an idle server */
#define HDRS (sizeof(struct rte_ether_hdr) + sizeof(struct rte_ipv4_hdr) + sizeof(struct rte_udp_hdr))

struct dp_lstats { /* one writer (its lcore) */
    _Atomic uint64_t rx_packets, tx_packets, requests, dropped, tx_failed, bad_frames;
};

struct dp_lcore {
    struct dp_port *d;
    unsigned lcore_id;
    uint16_t queue;
    int launched;
    struct cmd_client cl;
    struct kvbuf out;
    struct resp_parser rp;
    const char **argv;
    size_t *argl;
    int argcap;
    struct dp_lstats st;
} __attribute__((aligned(64)));

struct dp_port {
    struct srv *srv;
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

static inline void inc(_Atomic uint64_t *c, uint64_t d)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + d, memory_order_relaxed);
}

/* ---- one datagram */

/* Run the RESP request in req[0..len) into lc->out. Returns the flags for the reply. */
static uint16_t run_request(struct dp_lcore *lc, char *req, size_t len)
{
    struct srv *s = lc->d->srv;
    const char *pass = srv_config(s)->requirepass;
    lc->out.len = 0;
    /* A datagram is its own connection: no state survives it (AUTH, HELLO 3,
     * CLIENT SETNAME would otherwise leak to every later sender on this lcore). */
    lc->cl.authenticated = !(pass && *pass);
    lc->cl.resp = 2;
    lc->cl.close_after_reply = 0;
    resp_reset(&lc->rp);
    lc->rp.unauth = !lc->cl.authenticated;
    int rc = resp_parse(&lc->rp, req, len);
    if (rc == RESP_ERROR) {
        resp_add_errorf(&lc->out, "ERR Protocol error: %s", lc->rp.err);
        return KVU_F_ERROR;
    }
    if (rc == RESP_AGAIN || lc->rp.scan != len || lc->rp.argc == 0) {
        resp_add_error(&lc->out, rc == RESP_AGAIN ? "ERR invalid request: incomplete RESP request in datagram"
                                 : lc->rp.argc == 0 ? "ERR invalid request: empty request"
                                                    : "ERR invalid request: more than one request in datagram");
        return KVU_F_ERROR;
    }
    int argc = lc->rp.argc;
    if (argc > lc->argcap) {
        int cap = argc < 64 ? 64 : argc;
        const char **v = realloc(lc->argv, (size_t)cap * sizeof *v);
        if (v)
            lc->argv = v;
        size_t *l = v ? realloc(lc->argl, (size_t)cap * sizeof *l) : NULL;
        if (!l) {
            resp_add_error(&lc->out, "ERR out of memory");
            return KVU_F_ERROR;
        }
        lc->argl = l;
        lc->argcap = cap;
    }
    for (int i = 0; i < argc; i++) {
        lc->argv[i] = req + lc->rp.argv[i].off;
        lc->argl[i] = lc->rp.argv[i].len;
    }
    if (cmd_dispatch(&lc->cl, argc, lc->argv, lc->argl)) {
        lc->out.len = 0;
        resp_add_error(&lc->out, "ERR out of memory");
        return KVU_F_ERROR;
    }
    if (lc->cl.stall) {
        /* Only a data file makes requests wait, and --arch dpdk runs without one
         * (config validation): never expected, but never block an lcore on it. */
        lc->cl.stall = CMD_STALL_NONE;
        lc->cl.resume_i = 0;
        lc->out.len = 0;
        resp_add_error(&lc->out, "TRYAGAIN the request must wait for the data file; use TCP");
        return KVU_F_ERROR;
    }
    inc(&lc->st.requests, 1);
    return 0;
}

/* Turn request mbuf m into its reply in place. Returns 0 to send it, -1 to drop it. */
static int serve_frame(struct dp_lcore *lc, struct rte_mbuf *m)
{
    if (m->nb_segs != 1 || m->data_len < HDRS)
        return -1;
    struct rte_ether_hdr *eth = rte_pktmbuf_mtod(m, struct rte_ether_hdr *);
    if (eth->ether_type != rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4))
        return -1; /* ARP, IPv6 neighbour discovery, ...: the client has a static neighbour */
    struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
    if (ip->version_ihl != RTE_IPV4_VHL_DEF || ip->next_proto_id != IPPROTO_UDP)
        return -1; /* IPv4 options are not expected on this path */
    if (ip->fragment_offset & rte_cpu_to_be_16(RTE_IPV4_HDR_MF_FLAG | RTE_IPV4_HDR_OFFSET_MASK))
        return -2; /* fragments: a request must fit one datagram */
    struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);
    if (udp->dst_port != lc->d->udp_port)
        return -1;
    size_t iplen = rte_be_to_cpu_16(ip->total_length), ulen = rte_be_to_cpu_16(udp->dgram_len);
    if (iplen > m->data_len - sizeof *eth || ulen != iplen - sizeof *ip || ulen < sizeof *udp + KVU_HDR_LEN)
        return -2;
    uint8_t *fh = (uint8_t *)(udp + 1);
    uint16_t flags = (uint16_t)(fh[6] << 8 | fh[7]);
    if (flags)
        return -2; /* a reply, or a flag this version does not know */

    uint16_t rflags = run_request(lc, (char *)fh + KVU_HDR_LEN, ulen - sizeof *udp - KVU_HDR_LEN);
    size_t room = m->buf_len - m->data_off - HDRS - KVU_HDR_LEN;
    if (room > MAX_UDP_PAYLOAD - KVU_HDR_LEN)
        room = MAX_UDP_PAYLOAD - KVU_HDR_LEN;
    if (lc->out.len > room) {
        size_t big = lc->out.len;
        lc->out.len = 0;
        resp_add_errorf(&lc->out, "ERR reply too large for a UDP datagram (%zu bytes, at most %zu); use TCP",
                        big, room);
        rflags |= KVU_F_ERROR;
    }
    /* the reply: addresses and ports swapped, same frame header with REPLY set */
    struct rte_ether_addr ea = eth->dst_addr;
    eth->dst_addr = eth->src_addr;
    eth->src_addr = ea;
    rte_be32_t ia = ip->dst_addr;
    ip->dst_addr = ip->src_addr;
    ip->src_addr = ia;
    rte_be16_t pa = udp->dst_port;
    udp->dst_port = udp->src_port;
    udp->src_port = pa;
    rflags |= KVU_F_REPLY;
    fh[4] = fh[5] = 0; /* seq 0: the whole reply is this datagram */
    fh[6] = (uint8_t)(rflags >> 8);
    fh[7] = (uint8_t)rflags;
    memcpy(fh + KVU_HDR_LEN, lc->out.p, lc->out.len);
    ulen = sizeof *udp + KVU_HDR_LEN + lc->out.len;
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
    return 0;
}

static int lcore_main(void *arg)
{
    struct dp_lcore *lc = arg;
    struct dp_port *d = lc->d;
    struct rte_mbuf *rx[BURST], *tx[BURST];
    unsigned idle = 0;
    while (!atomic_load_explicit(&d->stopping, memory_order_acquire)) {
        uint16_t n = rte_eth_rx_burst(d->port_id, lc->queue, rx, BURST);
        if (!n) {
            if (++idle > IDLE_SPINS)
                usleep(IDLE_NAP_US);
            else
                rte_pause();
            continue;
        }
        idle = 0;
        inc(&lc->st.rx_packets, n);
        uint16_t nt = 0;
        for (uint16_t i = 0; i < n; i++) {
            if (i + 1 < n)
                rte_prefetch0(rte_pktmbuf_mtod(rx[i + 1], void *));
            int rc = serve_frame(lc, rx[i]);
            if (rc == 0) {
                tx[nt++] = rx[i];
            } else {
                inc(rc == -2 ? &lc->st.bad_frames : &lc->st.dropped, 1);
                rte_pktmbuf_free(rx[i]);
            }
        }
        uint16_t sent = 0;
        for (int tries = 0; sent < nt && tries < 8; tries++)
            sent += rte_eth_tx_burst(d->port_id, lc->queue, tx + sent, nt - sent);
        inc(&lc->st.tx_packets, sent);
        if (sent < nt) { /* TX ring full: the client sees a timeout, as for any lost datagram */
            inc(&lc->st.tx_failed, nt - sent);
            rte_pktmbuf_free_bulk(tx + sent, nt - sent);
        }
        kvbuf_shrink(&lc->out, 64 * 1024);
    }
    return 0;
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

int dp_create(struct dp_port **out, struct srv *s, struct kv_table *t, const char *iface, int lcores,
              int udp_port, const char *eal_args, char *err, size_t errlen)
{
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
    d->srv = s;
    d->nlcores = lcores;
    d->udp_port = rte_cpu_to_be_16((uint16_t)udp_port);
    int rc = eal_init(d, iface, lcores, eal_args, err, errlen);
    if (rc)
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
    d->pool = rte_pktmbuf_pool_create("kv_mbuf", NB_MBUF, MBUF_CACHE, 0, RTE_MBUF_DEFAULT_BUF_SIZE,
                                      (int)rte_socket_id());
    if (!d->pool) {
        snprintf(err, errlen, "mbuf pool: %s", rte_strerror(rte_errno));
        rc = -ENOMEM;
        goto fail;
    }
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
        resp_parser_init(&lc->rp);
        lc->cl.id = 0;
        lc->cl.resp = 2;
        lc->cl.out = &lc->out;
        lc->cl.srv = s;
        lc->cl.table = t;
        lc->cl.poller = (int)i; /* CLIENT INFO: the lcore's index */
        snprintf(lc->cl.addr, sizeof lc->cl.addr, "udp:%s:%d", iface, udp_port);
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

int dp_start(struct dp_port *d, char *err, size_t errlen)
{
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

void dp_stop(struct dp_port *d)
{
    if (!d)
        return;
    /* release: lcores that see it have nothing more to finish */
    atomic_store_explicit(&d->stopping, 1, memory_order_release);
    for (int i = 0; i < d->nlcores; i++) {
        if (d->lc[i].launched) {
            rte_eal_wait_lcore(d->lc[i].lcore_id);
            d->lc[i].launched = 0;
        }
    }
}

void dp_destroy(struct dp_port *d)
{
    if (!d)
        return;
    dp_stop(d);
    if (d->port_started)
        rte_eth_dev_stop(d->port_id);
    rte_eth_dev_close(d->port_id); /* detaches the XDP program from the interface */
    for (int i = 0; i < d->nlcores; i++) {
        resp_parser_free(&d->lc[i].rp);
        kvbuf_free(&d->lc[i].out);
        free(d->lc[i].argv);
        free(d->lc[i].argl);
        free(d->lc[i].cl.name);
    }
    if (d->pool)
        rte_mempool_free(d->pool);
    rte_eal_cleanup();
    free(d->argbuf);
    free(d->argv);
    free(d);
}

void dp_get_stats(struct dp_port *d, struct dp_stats *st)
{
    memset(st, 0, sizeof *st);
    for (int i = 0; d && i < d->nlcores; i++) {
        struct dp_lstats *l = &d->lc[i].st;
        st->rx_packets += atomic_load_explicit(&l->rx_packets, memory_order_relaxed);
        st->tx_packets += atomic_load_explicit(&l->tx_packets, memory_order_relaxed);
        st->requests += atomic_load_explicit(&l->requests, memory_order_relaxed);
        st->dropped += atomic_load_explicit(&l->dropped, memory_order_relaxed);
        st->tx_failed += atomic_load_explicit(&l->tx_failed, memory_order_relaxed);
        st->bad_frames += atomic_load_explicit(&l->bad_frames, memory_order_relaxed);
    }
}
