/* server.c - lifecycle over the registered front ends (see server.h), the
 * INFO lines that describe the whole server (server, clients, stats totals) and
 * srv_info, INFO's text for the control plane.
 * Control thread, except the INFO providers and stats getters (any thread: they
 * read the front ends' counters through add_stats, relaxed). */
#define _GNU_SOURCE
#include "server/server.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "core/table.h"
#include "engine/loading.h"
#include "frontend/nbd.h"

#define MAX_FRONTENDS 3 /* an arch's two, and the block device's (kv_config.nbd) */

/* Which front ends each arch runs; the first serves TCP (the node's port). */
static const struct arch {
    const char *name;
    const char *fe[MAX_FRONTENDS];
} archs[] = {
    {"poller", {"poller"}},
    {"threadpool", {"threadpool"}},
    {"udp", {"poller", "udp"}},
    {"dpdk", {"poller", "dpdk"}},
};

/* The totals INFO stats shows count from the last CONFIG RESETSTAT, as Redis's do:
 * what the counters held then is kept here and subtracted (the counters themselves
 * belong to the front ends' threads and the table, which only ever add). */
struct totals {
    uint64_t connections, commands, bytes_in, bytes_out, rejected, protocol_errors;
    uint64_t expired, hits, misses, oom;
};

struct srv {
    struct kv_engine *eng;
    int nfe;
    int udp;                 /* index of the arch's UDP front end, or -1 */
    int nbd;                 /* index of the block device's front end, or -1 */
    const struct kv_frontend_ops *ops[MAX_FRONTENDS];
    void *fe[MAX_FRONTENDS];
    pthread_mutex_t base_lock;
    struct totals base;
};

static void info_server(void *arg, struct kvbuf *b)
{
    struct srv *s = arg;
    const struct kv_config *c = &s->eng->cfg;
    struct utsname un;
    uname(&un);
    kvbuf_printf(b,
                 "kvstore_version:%s\r\n"
                 "redis_version:7.0.0\r\n" /* the RESP command level we implement */
                 "redis_mode:standalone\r\nos:%s %s %s\r\narch_bits:64\r\n"
                 "multiplexing_api:epoll\r\narch:%s\r\npoll_policy:%s\r\naccept_mode:%s\r\n"
                 "pollers:%d\r\nprocess_id:%d\r\ntcp_port:%d\r\n"
                 "uptime_in_seconds:%lld\r\nconfig_file:%s\r\n",
                 c->version, un.sysname, un.release, un.machine, c->arch, c->poll_policy, c->accept, c->threads,
                 (int)getpid(), s->eng->port, (long long)(time(NULL) - s->eng->start_time),
                 c->config_file ? c->config_file : "");
}

static void info_clients(void *arg, struct kvbuf *b)
{
    struct srv *s = arg;
    struct fe_stats st;
    srv_get_stats(s, &st);
    kvbuf_printf(b, "connected_clients:%llu\r\nmaxclients:%d\r\n", (unsigned long long)st.connected_clients,
                 __atomic_load_n(&s->eng->cfg.maxclients, __ATOMIC_RELAXED));
}

static void totals_now(struct srv *s, struct totals *t, uint64_t *ops_per_sec)
{
    struct fe_stats st;
    struct kvt_stats ts;
    srv_get_stats(s, &st);
    kvt_get_stats(s->eng->table, &ts);
    *t = (struct totals){st.total_connections, st.total_commands, st.bytes_in, st.bytes_out,
                         st.rejected_connections, st.protocol_errors, ts.expired_keys, ts.hits, ts.misses,
                         ts.oom_rejections};
    if (ops_per_sec)
        *ops_per_sec = st.ops_per_sec;
}

static void reset_stats(void *arg)
{
    struct srv *s = arg;
    struct totals t;
    totals_now(s, &t, NULL);
    pthread_mutex_lock(&s->base_lock);
    s->base = t;
    pthread_mutex_unlock(&s->base_lock);
}

static void info_stats(void *arg, struct kvbuf *b)
{
    struct srv *s = arg;
    struct totals t, base;
    uint64_t ops;
    totals_now(s, &t, &ops);
    pthread_mutex_lock(&s->base_lock);
    base = s->base;
    pthread_mutex_unlock(&s->base_lock);
    /* a counter read a moment before the reset's own read could be below it */
#define SINCE(f) (unsigned long long)(t.f > base.f ? t.f - base.f : 0)
    kvbuf_printf(b,
                 "total_connections_received:%llu\r\ntotal_commands_processed:%llu\r\n"
                 "instantaneous_ops_per_sec:%llu\r\ntotal_net_input_bytes:%llu\r\n"
                 "total_net_output_bytes:%llu\r\nrejected_connections:%llu\r\n"
                 "expired_keys:%llu\r\nevicted_keys:0\r\nkeyspace_hits:%llu\r\n"
                 "keyspace_misses:%llu\r\noom_rejections:%llu\r\n"
                 "total_error_replies_protocol:%llu\r\n",
                 SINCE(connections), SINCE(commands), (unsigned long long)ops, SINCE(bytes_in), SINCE(bytes_out),
                 SINCE(rejected), SINCE(expired), SINCE(hits), SINCE(misses), SINCE(oom), SINCE(protocol_errors));
#undef SINCE
}

int srv_create(struct srv **out, struct kv_table *t, const struct kv_config *cfg, char *err, size_t errlen)
{
    const struct arch *a = NULL;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (cfg->arch && !strcmp(archs[i].name, cfg->arch))
            a = &archs[i];
    if (!a) {
        snprintf(err, errlen, "unknown arch '%s': expected poller, threadpool, udp or dpdk",
                 cfg->arch ? cfg->arch : "");
        return -EINVAL;
    }
    if (cfg->tls_port >= 0 && strcmp(a->fe[0], "poller")) { /* TLS is the pollers' (frontend/tlsio.h) */
        snprintf(err, errlen, "tls-port is not supported with arch %s: use arch poller", a->name);
        return -EINVAL;
    }
    if (cfg->mqtt_port >= 0 && strcmp(a->fe[0], "poller")) { /* MQTT is the pollers' (frontend/mqtt.h) */
        snprintf(err, errlen, "mqtt-port is not supported with arch %s: use arch poller, udp or dpdk", a->name);
        return -EINVAL;
    }
    struct srv *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    s->base_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER; /* static-style: nothing to destroy */
    s->udp = s->nbd = -1;
    int rc = eng_create(&s->eng, t, cfg, err, errlen);
    if (rc < 0) {
        free(s);
        return rc;
    }
    /* after the engine's persistence lines: kvstore's loading fields follow "loading:" */
    if ((rc = eng_loading_init(s->eng)) < 0) {
        snprintf(err, errlen, "cannot set up the engine's loading state: %s", strerror(-rc));
        goto fail;
    }
    /* the server's INFO lines come before the front ends' in their sections */
    eng_info_add(s->eng, "server", info_server, NULL, s);
    eng_info_add(s->eng, "clients", info_clients, NULL, s);
    eng_info_add(s->eng, "stats", info_stats, reset_stats, s);
    cmd_stats_register(s->eng);
    cmd_cluster_register(s->eng);
    const char *names[MAX_FRONTENDS] = {0};
    int n = 0;
    while (n < MAX_FRONTENDS - 1 && a->fe[n]) {
        names[n] = a->fe[n];
        n++;
    }
    if (n > 1)
        s->udp = 1;
    if (cfg->nbd) { /* the block device, besides the arch's front ends */
        s->nbd = n;
        names[n++] = "nbd";
    }
    for (int i = 0; i < n; i++) {
        const struct kv_frontend_ops *ops = fe_find(names[i]);
        if (!ops) { /* only dpdk can be missing: it is built only with libdpdk */
            snprintf(err, errlen, "kvstore was built without DPDK (libdpdk-dev not found at build time)");
            rc = -ENOTSUP;
            goto fail;
        }
        if ((rc = ops->create(&s->fe[i], s->eng, err, errlen)) < 0)
            goto fail;
        s->ops[i] = ops;
        s->nfe = i + 1;
    }
    *out = s;
    return 0;
fail:
    srv_destroy(s);
    return rc;
}

int srv_start(struct srv *s, char *err, size_t errlen)
{
    for (int i = 0; i < s->nfe; i++) {
        int rc = s->ops[i]->start(s->fe[i], err, errlen);
        if (rc < 0) {
            srv_stop(s);
            return rc;
        }
    }
    return 0;
}

void srv_stop(struct srv *s)
{
    for (int i = s->nfe - 1; i >= 0; i--)
        s->ops[i]->stop(s->fe[i]);
}

void srv_destroy(struct srv *s)
{
    if (!s)
        return;
    for (int i = s->nfe - 1; i >= 0; i--)
        s->ops[i]->destroy(s->fe[i]);
    eng_loading_free(s->eng);
    eng_destroy(s->eng);
    free(s);
}

void srv_set_loading(struct srv *s, const char *waiting_for, const char *last_error, uint64_t attempts,
                     const char *node_id)
{
    eng_loading_set(s->eng, waiting_for, last_error, attempts, node_id);
}

int srv_attach(struct srv *s, struct wal *w, struct bosc *b, struct rl_sender *sender, char *err, size_t errlen)
{
    return eng_attach(s->eng, w, b, sender, err, errlen);
}

int srv_port(const struct srv *s) { return s->eng->port; }

int srv_tls_port(const struct srv *s) { return s->eng->cfg.tls_port < 0 ? -1 : s->eng->tls_port; }
int srv_mqtt_port(const struct srv *s) { return s->eng->mqtt_port; }

int srv_udp_port(const struct srv *s) { return s->udp >= 0 ? s->ops[s->udp]->port(s->fe[s->udp]) : s->eng->cfg.udp_port; }

struct nbd_server *srv_nbd(struct srv *s) { return s->nbd >= 0 && s->nbd < s->nfe ? s->fe[s->nbd] : NULL; }

int srv_have_dpdk(void) { return fe_find("dpdk") != NULL; }

void srv_get_stats(struct srv *s, struct fe_stats *st)
{
    memset(st, 0, sizeof *st);
    for (int i = 0; i < s->nfe; i++)
        s->ops[i]->add_stats(s->fe[i], st);
}

int srv_get_poller_stats(struct srv *s, int i, struct fe_thread_stats *st)
{
    if (!s->nfe || !s->ops[0]->thread_stats)
        return -EINVAL;
    return s->ops[0]->thread_stats(s->fe[0], i, st);
}

long srv_info(struct srv *s, const char *sections, char *buf, size_t cap)
{
    const char *argv[SRV_INFO_MAX_SECTIONS];
    size_t argl[SRV_INFO_MAX_SECTIONS];
    int argc = 0;
    if (cap == 0)
        return -EINVAL;
    for (const char *p = sections ? sections : ""; *p;) {
        size_t n = strcspn(p, " ");
        if (n) {
            if (argc == SRV_INFO_MAX_SECTIONS || n > SRV_INFO_MAX_NAME)
                return -EINVAL;
            argv[argc] = p;
            argl[argc++] = n;
        }
        p += n + (p[n] == ' ');
    }
    struct kvbuf b = {0};
    eng_info_render(s->eng, argc, argv, argl, &b);
    long len = (long)b.len;
    size_t n = b.len < cap ? b.len : cap - 1;
    if (n)
        memcpy(buf, b.p, n);
    buf[n] = '\0';
    kvbuf_free(&b);
    return len;
}
