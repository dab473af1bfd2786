/* info.c - the INFO reply: server, clients, memory, persistence, replication,
 * stats, per-poller syscall counters, CPU, keyspace. Runs on a poller thread; reads
 * other pollers' counters with relaxed atomics (statistics may be a moment stale). */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "durability/replog.h"
#include "durability/bosc.h"
#include "server/server_int.h"
#include "core/table.h"
#include "durability/wal.h"

static void human_bytes(char *dst, size_t n, uint64_t v)
{
    const char *u[] = {"B", "K", "M", "G", "T"};
    double d = (double)v;
    int i = 0;
    while (d >= 1024 && i < 4) {
        d /= 1024;
        i++;
    }
    snprintf(dst, n, "%.2f%s", d, u[i]);
}

static int kvbuf_printf(struct kvbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int kvbuf_printf(struct kvbuf *b, const char *fmt, ...)
{
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -EINVAL;
    return kvbuf_append(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static const char *sections[] = {"server", "clients", "memory", "persistence", "replication", "stats",
                                 "pollers", "cpu", "keyspace"};
#define NSECTIONS (int)(sizeof sections / sizeof sections[0])

static int want_section(int argc, const char **argv, const size_t *argl, const char *name)
{
    if (argc == 0)
        return 1; /* default: every section we have */
    for (int i = 0; i < argc; i++) {
        if (argl[i] == strlen(name) && strncasecmp(argv[i], name, argl[i]) == 0)
            return 1;
        if ((argl[i] == 3 && strncasecmp(argv[i], "all", 3) == 0) ||
            (argl[i] == 7 && strncasecmp(argv[i], "default", 7) == 0) ||
            (argl[i] == 10 && strncasecmp(argv[i], "everything", 10) == 0))
            return 1;
    }
    return 0;
}

int srv_info(struct srv *s, int argc, const char **argv, const size_t *argl, int proto,
             struct kvbuf *out)
{
    struct kvbuf b = {0};
    struct srv_stats st;
    struct kvt_stats ts;
    srv_get_stats(s, &st);
    kvt_get_stats(s->table, &ts);
    char h1[32], h2[32];
    int first = 1;
    for (int si = 0; si < NSECTIONS; si++) {
        const char *sec = sections[si];
        if (!want_section(argc, argv, argl, sec))
            continue;
        if (!first)
            kvbuf_append(&b, "\r\n", 2);
        first = 0;
        char title[32];
        snprintf(title, sizeof title, "# %c%s\r\n", sec[0] - 32, sec + 1);
        kvbuf_append(&b, title, strlen(title));
        if (!strcmp(sec, "server")) {
            struct utsname un;
            uname(&un);
            kvbuf_printf(&b,
                         "kvstore_version:%s\r\n"
                         "redis_version:7.0.0\r\n" /* the RESP command level we implement */
                         "redis_mode:standalone\r\nos:%s %s %s\r\narch_bits:64\r\n"
                         "multiplexing_api:epoll\r\narch:%s\r\npoll_policy:%s\r\naccept_mode:%s\r\n"
                         "pollers:%d\r\nprocess_id:%d\r\ntcp_port:%d\r\n"
                         "uptime_in_seconds:%lld\r\nconfig_file:%s\r\n",
                         s->version, un.sysname, un.release, un.machine,
                         s->cfg.arch == SRV_ARCH_THREADPOOL ? "threadpool"
                         : s->cfg.arch == SRV_ARCH_DPDK ? "dpdk"
                         : s->cfg.arch == SRV_ARCH_UDP  ? "udp"
                                                        : "poller",
                         s->policy->name,
                         s->cfg.accept_mode == SRV_ACCEPT_HANDOFF ? "handoff" : "reuseport",
                         s->npollers, (int)getpid(), s->port,
                         (long long)(time(NULL) - s->start_time),
                         s->config_file ? s->config_file : "");
            if (s->cfg.arch == SRV_ARCH_DPDK || s->cfg.arch == SRV_ARCH_UDP)
                kvbuf_printf(&b, "udp_port:%d\r\nudp_workers:%d\r\n", srv_udp_port(s), s->cfg.udp_workers);
        } else if (!strcmp(sec, "clients")) {
            kvbuf_printf(&b, "connected_clients:%llu\r\nmaxclients:%d\r\n",
                         (unsigned long long)st.connected_clients, s->cfg.maxclients);
        } else if (!strcmp(sec, "memory")) {
            human_bytes(h1, sizeof h1, ts.used_memory);
            human_bytes(h2, sizeof h2, ts.max_memory);
            kvbuf_printf(&b,
                         "used_memory:%llu\r\nused_memory_human:%s\r\nmaxmemory:%llu\r\n"
                         "maxmemory_human:%s\r\nmaxmemory_policy:noeviction\r\n"
                         "table_buckets:%llu\r\ntable_rehashing_shards:%llu\r\n"
                         "mem_allocator:libc\r\n",
                         (unsigned long long)ts.used_memory, h1, (unsigned long long)ts.max_memory,
                         h2, (unsigned long long)ts.buckets, (unsigned long long)ts.rehashing);
        } else if (!strcmp(sec, "persistence")) {
            kvbuf_printf(&b, "loading:0\r\ndurability:%s\r\naof_enabled:0\r\n"
                             "rdb_changes_since_last_save:0\r\n", s->durability);
            if (s->cfg.wal) {
                struct wal_stats ws;
                wal_get_stats(s->cfg.wal, &ws);
                kvbuf_printf(&b,
                             "log_appended_lsn:%llu\r\nlog_durable_lsn:%llu\r\nlog_groups:%llu\r\n"
                             "log_records:%llu\r\nlog_bytes:%llu\r\nlog_max_group_records:%llu\r\n"
                             "log_syncs:%llu\r\nlog_sync_avg_us:%.1f\r\nlog_sync_max_us:%.1f\r\n"
                             "log_failed:%d\r\n",
                             (unsigned long long)ws.appended_lsn, (unsigned long long)ws.durable_lsn,
                             (unsigned long long)ws.groups, (unsigned long long)ws.records,
                             (unsigned long long)ws.bytes, (unsigned long long)ws.max_group_records,
                             (unsigned long long)ws.syncs,
                             ws.syncs ? (double)ws.sync_ns_total / (double)ws.syncs / 1000.0 : 0.0,
                             (double)ws.sync_ns_max / 1000.0, ws.failed);
            }
            if (s->cfg.bosc) {
                struct bosc_stats bs;
                bosc_get_stats(s->cfg.bosc, &bs);
                kvbuf_printf(&b,
                             "datafile_buckets:%llu\r\ndatafile_keys:%llu\r\nmemory_keys:%llu\r\n"
                             "datafile_flushed_lsn:%llu\r\ndatafile_sweeps:%llu\r\n"
                             "datafile_records_written:%llu\r\ndatafile_blocks_written:%llu\r\n"
                             "datafile_blocks_read:%llu\r\ndatafile_deferred:%llu\r\n"
                             "datafile_loads:%llu\r\ndatafile_evicted_keys:%llu\r\n"
                             "datafile_log_segments_deleted:%llu\r\ndatafile_failed:%d\r\n"
                             "datafile_error:%s\r\n",
                             (unsigned long long)bs.buckets, (unsigned long long)ts.disk_keys,
                             (unsigned long long)ts.entries, (unsigned long long)bs.flushed_lsn,
                             (unsigned long long)bs.sweeps, (unsigned long long)bs.records,
                             (unsigned long long)bs.blocks_written, (unsigned long long)bs.blocks_read,
                             (unsigned long long)bs.deferred, (unsigned long long)bs.loads,
                             (unsigned long long)bs.evicted, (unsigned long long)bs.truncated_segments,
                             bs.failed, bs.error);
            }
        } else if (!strcmp(sec, "replication")) {
            kvbuf_printf(&b, "role:master\r\nconnected_slaves:0\r\n");
            if (s->cfg.sender) {
                struct rl_sender_stats rs;
                rl_sender_get_stats(s->cfg.sender, &rs);
                kvbuf_printf(&b,
                             "log_peer_connected:%d\r\nlog_peer_degraded:%d\r\nlog_peer_acked_lsn:%llu\r\n"
                             "log_peer_sent_lsn:%llu\r\nlog_peer_batches:%llu\r\nlog_peer_records:%llu\r\n"
                             "log_peer_bytes:%llu\r\nlog_peer_connects:%llu\r\nlog_peer_disconnects:%llu\r\n"
                             "log_peer_catchup_records:%llu\r\nlog_peer_last_error:%s\r\n",
                             rs.connected, rs.degraded, (unsigned long long)rs.acked_lsn,
                             (unsigned long long)rs.sent_lsn, (unsigned long long)rs.batches,
                             (unsigned long long)rs.records, (unsigned long long)rs.bytes,
                             (unsigned long long)rs.connects, (unsigned long long)rs.disconnects,
                             (unsigned long long)rs.catchup_records, rs.last_error);
            }
            if (s->cfg.receiver) {
                struct rl_receiver_stats rr;
                rl_receiver_get_stats(s->cfg.receiver, &rr);
                kvbuf_printf(&b,
                             "log_receiver_port:%d\r\nlog_receiver_peers:%d\r\nlog_receiver_held_lsn:%llu\r\n"
                             "log_receiver_batches:%llu\r\nlog_receiver_records:%llu\r\n"
                             "log_receiver_syncs:%llu\r\nlog_receiver_fetches:%llu\r\n",
                             rl_receiver_port(s->cfg.receiver), rr.peers_connected,
                             (unsigned long long)rr.held_lsn, (unsigned long long)rr.batches,
                             (unsigned long long)rr.records, (unsigned long long)rr.syncs,
                             (unsigned long long)rr.fetches);
            }
        } else if (!strcmp(sec, "stats")) {
            uint64_t ops = 0;
            for (int i = 0; i < OPS_SAMPLES; i++)
                ops += atomic_load_explicit(&s->ops_samples[i], memory_order_relaxed);
            kvbuf_printf(&b,
                         "total_connections_received:%llu\r\ntotal_commands_processed:%llu\r\n"
                         "instantaneous_ops_per_sec:%llu\r\ntotal_net_input_bytes:%llu\r\n"
                         "total_net_output_bytes:%llu\r\nrejected_connections:%llu\r\n"
                         "expired_keys:%llu\r\nevicted_keys:0\r\nkeyspace_hits:%llu\r\n"
                         "keyspace_misses:%llu\r\noom_rejections:%llu\r\n"
                         "total_error_replies_protocol:%llu\r\n",
                         (unsigned long long)st.total_connections,
                         (unsigned long long)st.total_commands,
                         (unsigned long long)(ops / OPS_SAMPLES), (unsigned long long)st.bytes_in,
                         (unsigned long long)st.bytes_out,
                         (unsigned long long)st.rejected_connections,
                         (unsigned long long)ts.expired_keys, (unsigned long long)ts.hits,
                         (unsigned long long)ts.misses, (unsigned long long)ts.oom_rejections,
                         (unsigned long long)st.protocol_errors);
            if (s->cfg.arch == SRV_ARCH_DPDK || s->cfg.arch == SRV_ARCH_UDP) /* the UDP front end (udpfront.h) */
                kvbuf_printf(&b,
                             "udp_rx_packets:%llu\r\nudp_tx_packets:%llu\r\nudp_requests:%llu\r\n"
                             "udp_dropped_not_ours:%llu\r\nudp_tx_failed:%llu\r\nudp_bad_frames:%llu\r\n"
                             "udp_held_for_log:%llu\r\nudp_stalled:%llu\r\nudp_busy_us:%llu\r\n",
                             (unsigned long long)st.udp_rx, (unsigned long long)st.udp_tx,
                             (unsigned long long)st.udp_requests, (unsigned long long)st.udp_dropped,
                             (unsigned long long)st.udp_tx_failed, (unsigned long long)st.udp_bad,
                             (unsigned long long)st.udp_held, (unsigned long long)st.udp_stalls,
                             (unsigned long long)(st.udp_busy_ns / 1000));
        } else if (!strcmp(sec, "pollers")) {
            uint64_t tot[4] = {0};
            for (int i = 0; i < s->npollers; i++) {
                struct srv_poller_stats ps;
                srv_get_poller_stats(s, i, &ps);
                kvbuf_printf(&b,
                             "poller%d:clients=%llu,commands=%llu,epoll_wait=%llu,epoll_ctl=%llu,"
                             "read=%llu,write=%llu\r\n",
                             i, (unsigned long long)ps.clients, (unsigned long long)ps.commands,
                             (unsigned long long)ps.epoll_wait, (unsigned long long)ps.epoll_ctl,
                             (unsigned long long)ps.reads, (unsigned long long)ps.writes);
                tot[0] += ps.epoll_wait;
                tot[1] += ps.epoll_ctl;
                tot[2] += ps.reads;
                tot[3] += ps.writes;
            }
            kvbuf_printf(&b,
                         "total_epoll_wait_calls:%llu\r\ntotal_epoll_ctl_calls:%llu\r\n"
                         "total_read_calls:%llu\r\ntotal_write_calls:%llu\r\n",
                         (unsigned long long)tot[0], (unsigned long long)tot[1],
                         (unsigned long long)tot[2], (unsigned long long)tot[3]);
        } else if (!strcmp(sec, "cpu")) {
            struct rusage ru;
            getrusage(RUSAGE_SELF, &ru);
            kvbuf_printf(&b, "used_cpu_sys:%ld.%06ld\r\nused_cpu_user:%ld.%06ld\r\n",
                         (long)ru.ru_stime.tv_sec, (long)ru.ru_stime.tv_usec,
                         (long)ru.ru_utime.tv_sec, (long)ru.ru_utime.tv_usec);
        } else if (!strcmp(sec, "keyspace")) {
            if (ts.keys)
                kvbuf_printf(&b, "db0:keys=%llu,expires=%llu,avg_ttl=0\r\n",
                             (unsigned long long)ts.keys, (unsigned long long)ts.expires);
        }
    }
    int rc = resp_add_verbatim(out, proto, b.p ? b.p : "", b.len);
    kvbuf_free(&b);
    return rc;
}
