/* engine.c - the engine context and its INFO sections (see engine.h).
 * The providers here read other threads' counters through the components' own
 * get_stats calls (locks or relaxed atomics): INFO may be a moment stale. */
#define _GNU_SOURCE
#include "engine/engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>

#include "core/keywait.h"
#include "core/latmon.h"
#include "core/table.h"
#include "durability/bosc.h"
#include "durability/replog.h"
#include "durability/wal.h"
#include "engine/cmdstats.h"

static const char *const sections[] = {"server",       "clients",    "memory",       "persistence", "replication",
                                       "stats",        "pollers",    "cpu",          "commandstats", "errorstats",
                                       "latencystats", "cluster",    "keyspace",     "blockdev",     "mqtt",
                                       NULL};

const char *eng_info_section(int i)
{
    return i >= 0 && i < (int)(sizeof sections / sizeof *sections) ? sections[i] : NULL;
}

int eng_info_add(struct kv_engine *e, const char *section, eng_info_fn fn, eng_reset_fn reset, void *arg)
{
    int s = 0;
    while (sections[s] && strcmp(sections[s], section))
        s++;
    if (!sections[s])
        return -EINVAL;
    if (e->ninfo == ENG_INFO_MAX)
        return -ENOSPC;
    e->info[e->ninfo++] = (struct eng_info){s, fn, reset, arg};
    return 0;
}

/* As Redis: no argument or "default" is every section but commandstats and
 * latencystats (long, and costly to make); "all" and "everything" are all. */
static int want_section(int argc, const char **argv, const size_t *argl, const char *name)
{
    int in_default = strcmp(name, "commandstats") && strcmp(name, "latencystats");
    if (argc == 0)
        return in_default;
    for (int i = 0; i < argc; i++) {
        if (argl[i] == strlen(name) && strncasecmp(argv[i], name, argl[i]) == 0)
            return 1;
        if ((argl[i] == 3 && strncasecmp(argv[i], "all", 3) == 0) ||
            (argl[i] == 7 && strncasecmp(argv[i], "default", 7) == 0 && in_default) ||
            (argl[i] == 10 && strncasecmp(argv[i], "everything", 10) == 0))
            return 1;
    }
    return 0;
}

void eng_info_render(struct kv_engine *e, int argc, const char **argv, const size_t *argl, struct kvbuf *out)
{
    int first = 1;
    const char *sec;
    for (int si = 0; (sec = eng_info_section(si)); si++) {
        if (!want_section(argc, argv, argl, sec))
            continue;
        int n = 0; /* a section nobody provides (blockdev without a block device) is left out */
        for (int i = 0; i < e->ninfo; i++)
            n += e->info[i].section == si;
        if (!n)
            continue;
        kvbuf_printf(out, "%s# %c%s\r\n", first ? "" : "\r\n", sec[0] - 32, sec + 1);
        first = 0;
        for (int i = 0; i < e->ninfo; i++)
            if (e->info[i].section == si)
                e->info[i].fn(e->info[i].arg, out);
    }
}

void eng_reset_stats(struct kv_engine *e)
{
    for (int i = 0; i < e->ninfo; i++)
        if (e->info[i].reset)
            e->info[i].reset(e->info[i].arg);
    cst_reset(e->stats);
}

uint64_t eng_client_id(struct kv_engine *e)
{
    return atomic_fetch_add_explicit(&e->next_client_id, 1, memory_order_relaxed) + 1;
}

uint64_t eng_log_appended(const struct kv_engine *e)
{
    if (!e->wal)
        return 0;
    /* While the disk refuses the log, the records it could not write may stay
     * unwritten for long: an INFO or DBSIZE answers now (their counts may then
     * include those few changes) instead of waiting for the disk. */
    if (wal_write_error(e->wal, NULL, 0))
        return wal_durable_lsn(e->wal);
    return wal_appended_lsn(e->wal);
}

/* ---- the engine's own INFO sections */

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

static void info_memory(void *arg, struct kvbuf *b)
{
    struct kv_engine *e = arg;
    struct kvt_stats ts;
    char h1[32], h2[32];
    kvt_get_stats(e->table, &ts);
    human_bytes(h1, sizeof h1, ts.used_memory);
    human_bytes(h2, sizeof h2, ts.max_memory);
    kvbuf_printf(b,
                 "used_memory:%llu\r\nused_memory_human:%s\r\nmaxmemory:%llu\r\n"
                 "maxmemory_human:%s\r\nmaxmemory_policy:noeviction\r\n"
                 "table_buckets:%llu\r\ntable_rehashing_shards:%llu\r\n"
                 "mem_allocator:libc\r\n",
                 (unsigned long long)ts.used_memory, h1, (unsigned long long)ts.max_memory, h2,
                 (unsigned long long)ts.buckets, (unsigned long long)ts.rehashing);
}

static void info_persistence(void *arg, struct kvbuf *b)
{
    struct kv_engine *e = arg;
    kvbuf_printf(b, "loading:%d\r\ndurability:%s\r\naof_enabled:0\r\nrdb_changes_since_last_save:0\r\n",
                 atomic_load_explicit(&e->loading, memory_order_acquire), e->cfg.durability);
    if (e->wal) {
        struct wal_stats ws;
        wal_get_stats(e->wal, &ws);
        kvbuf_printf(b,
                     "log_appended_lsn:%llu\r\nlog_durable_lsn:%llu\r\nlog_groups:%llu\r\n"
                     "log_records:%llu\r\nlog_bytes:%llu\r\nlog_max_group_records:%llu\r\n"
                     "log_syncs:%llu\r\nlog_sync_avg_us:%.1f\r\nlog_sync_max_us:%.1f\r\n"
                     "log_failed:%d\r\nlog_segments:%llu\r\nlog_segments_prepared:%llu\r\n",
                     (unsigned long long)ws.appended_lsn, (unsigned long long)ws.durable_lsn,
                     (unsigned long long)ws.groups, (unsigned long long)ws.records, (unsigned long long)ws.bytes,
                     (unsigned long long)ws.max_group_records, (unsigned long long)ws.syncs,
                     ws.syncs ? (double)ws.sync_ns_total / (double)ws.syncs / 1000.0 : 0.0,
                     (double)ws.sync_ns_max / 1000.0, ws.failed, (unsigned long long)ws.segments,
                     (unsigned long long)ws.segments_prepared);
    }
    if (e->bosc) {
        struct bosc_stats bs;
        struct kvt_stats ts;
        bosc_get_stats(e->bosc, &bs);
        kvt_get_stats(e->table, &ts);
        kvbuf_printf(b,
                     "datafile_buckets:%llu\r\ndatafile_keys:%llu\r\nmemory_keys:%llu\r\n"
                     "datafile_flushed_lsn:%llu\r\ndatafile_sweeps:%llu\r\n"
                     "datafile_records_written:%llu\r\ndatafile_blocks_written:%llu\r\n"
                     "datafile_blocks_read:%llu\r\ndatafile_deferred:%llu\r\n"
                     "datafile_loads:%llu\r\ndatafile_evicted_keys:%llu\r\n"
                     "datafile_log_segments_deleted:%llu\r\ndatafile_failed:%d\r\n"
                     "datafile_error:%s\r\n"
                     /* ---- issue 14 (sweep): the sweep's I/O and CPU */
                     "datafile_bytes_written:%llu\r\ndatafile_bytes_read:%llu\r\n"
                     "datafile_write_calls:%llu\r\ndatafile_read_calls:%llu\r\n"
                     "datafile_sweep_seconds:%.6f\r\ndatafile_io_seconds:%.6f\r\n"
                     "datafile_sweep_cpu_seconds:%.6f\r\n"
                     /* ---- issue 14b (chunk): chunks settled before their sweep's end */
                     "datafile_sweep_chunks:%llu\r\ndatafile_chunk_evicted_keys:%llu\r\n"
                     /* the batch store: stream batches the records refer to */
                     "datafile_batch_segments:%llu\r\ndatafile_batch_file_bytes:%llu\r\n"
                     "datafile_batch_live_bytes:%llu\r\ndatafile_batches_written:%llu\r\n"
                     "datafile_batch_reads:%llu\r\ndatafile_batches_evicted:%llu\r\n"
                     "datafile_batches_loaded:%llu\r\n",
                     (unsigned long long)bs.buckets, (unsigned long long)ts.disk_keys,
                     (unsigned long long)ts.entries, (unsigned long long)bs.flushed_lsn,
                     (unsigned long long)bs.sweeps, (unsigned long long)bs.records,
                     (unsigned long long)bs.blocks_written, (unsigned long long)bs.blocks_read,
                     (unsigned long long)bs.deferred, (unsigned long long)bs.loads, (unsigned long long)bs.evicted,
                     (unsigned long long)bs.truncated_segments, bs.failed, bs.error,
                     (unsigned long long)bs.bytes_written, (unsigned long long)bs.bytes_read,
                     (unsigned long long)bs.write_calls, (unsigned long long)bs.read_calls,
                     (double)bs.sweep_ns / 1e9, (double)bs.io_ns / 1e9, (double)bs.flusher_cpu_ns / 1e9,
                     (unsigned long long)bs.sweep_chunks, (unsigned long long)bs.chunk_evicted,
                     (unsigned long long)bs.batch_segments, (unsigned long long)bs.batch_file_bytes,
                     (unsigned long long)bs.batch_live_bytes, (unsigned long long)bs.batches_written,
                     (unsigned long long)bs.batch_reads, (unsigned long long)ts.batches_evicted,
                     (unsigned long long)ts.batches_loaded);
    }
}

/* ---- a full or failing disk, as commands and INFO see it: the state lives in
 * the log and the data file, which retry by themselves; this only reads it */

int eng_disk_refusal(struct kv_engine *e, char *msg, size_t n)
{
    const char *what = "durability log";
    int err = e->wal ? wal_write_error(e->wal, NULL, 0) : 0;
    if (!err && e->bosc) {
        err = bosc_write_error(e->bosc, NULL, 0, NULL);
        what = "data file";
    }
    if (!err)
        return 0;
    /* Redis's text with the file it could not write; then what happens next,
     * since unlike Redis's "see the logs" the node recovers by itself. */
    snprintf(msg, n,
             "MISCONF Errors writing to the %s: %s. Writes are refused until it can be written again "
             "(retried automatically; see INFO persistence)", what, strerror(err));
    return 1;
}

void eng_disk_info(void *arg, struct kvbuf *out)
{
    struct kv_engine *e = arg;
    char msg[256] = "";
    if (e->wal) {
        struct wal_stats ws;
        wal_get_stats(e->wal, &ws);
        int err = wal_write_error(e->wal, msg, sizeof msg);
        kvbuf_printf(out, "aof_last_write_status:%s\r\nlog_write_status:%s\r\nlog_write_error:%s\r\n"
                          "log_write_errors:%llu\r\n", err ? "err" : "ok", err ? "err" : "ok", msg,
                     (unsigned long long)ws.write_errors);
    }
    if (e->bosc) {
        uint64_t n = 0;
        int err = bosc_write_error(e->bosc, msg, sizeof msg, &n);
        kvbuf_printf(out, "datafile_write_status:%s\r\ndatafile_write_error:%s\r\ndatafile_write_errors:%llu\r\n",
                     err ? "err" : "ok", err ? msg : "", (unsigned long long)n);
    }
}

static void info_replication(void *arg, struct kvbuf *b)
{
    struct kv_engine *e = arg;
    kvbuf_printf(b, "role:master\r\nconnected_slaves:0\r\n");
    if (e->cfg.sender) {
        struct rl_sender_stats rs;
        rl_sender_get_stats(e->cfg.sender, &rs);
        kvbuf_printf(b,
                     "log_peer_connected:%d\r\nlog_peer_degraded:%d\r\nlog_peer_acked_lsn:%llu\r\n"
                     "log_peer_sent_lsn:%llu\r\nlog_peer_batches:%llu\r\nlog_peer_records:%llu\r\n"
                     "log_peer_bytes:%llu\r\nlog_peer_connects:%llu\r\nlog_peer_disconnects:%llu\r\n"
                     "log_peer_catchup_records:%llu\r\nlog_peer_auth_failures:%llu\r\nlog_peer_last_error:%s\r\n",
                     rs.connected, rs.degraded, (unsigned long long)rs.acked_lsn, (unsigned long long)rs.sent_lsn,
                     (unsigned long long)rs.batches, (unsigned long long)rs.records, (unsigned long long)rs.bytes,
                     (unsigned long long)rs.connects, (unsigned long long)rs.disconnects,
                     (unsigned long long)rs.catchup_records, (unsigned long long)rs.auth_failures, rs.last_error);
    }
    if (e->cfg.receiver) {
        struct rl_receiver_stats rr;
        rl_receiver_get_stats(e->cfg.receiver, &rr);
        kvbuf_printf(b,
                     "log_receiver_port:%d\r\nlog_receiver_peers:%d\r\nlog_receiver_held_lsn:%llu\r\n"
                     "log_receiver_batches:%llu\r\nlog_receiver_records:%llu\r\n"
                     "log_receiver_syncs:%llu\r\nlog_receiver_fetches:%llu\r\nlog_receiver_auth_failures:%llu\r\n",
                     rl_receiver_port(e->cfg.receiver), rr.peers_connected, (unsigned long long)rr.held_lsn,
                     (unsigned long long)rr.batches, (unsigned long long)rr.records, (unsigned long long)rr.syncs,
                     (unsigned long long)rr.fetches, (unsigned long long)rr.auth_failures);
    }
}

static void info_cpu(void *arg, struct kvbuf *b)
{
    (void)arg;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    kvbuf_printf(b, "used_cpu_sys:%ld.%06ld\r\nused_cpu_user:%ld.%06ld\r\n", (long)ru.ru_stime.tv_sec,
                 (long)ru.ru_stime.tv_usec, (long)ru.ru_utime.tv_sec, (long)ru.ru_utime.tv_usec);
}

static void info_keyspace(void *arg, struct kvbuf *b)
{
    struct kv_engine *e = arg;
    struct kvt_stats ts;
    kvt_get_stats(e->table, &ts);
    if (ts.keys)
        kvbuf_printf(b, "db0:keys=%llu,expires=%llu,avg_ttl=0\r\n", (unsigned long long)ts.keys,
                     (unsigned long long)ts.expires);
}

/* ---- lifecycle */

static int dup_str(const char **dst, const char *src, const char *dflt)
{
    if (!src)
        src = dflt;
    if (!src) {
        *dst = NULL;
        return 0;
    }
    *dst = strdup(src);
    return *dst ? 0 : -ENOMEM;
}

#define CFG_STRINGS(X) X(bind, "127.0.0.1") X(requirepass, NULL) X(accept, "reuseport") X(poll_policy, "direct") \
    X(config_file, NULL) X(version, "0") X(durability, "none") X(arch, "poller") X(dpdk_iface, NULL)               \
    X(dpdk_eal_args, NULL) X(mqtt_topic_prefix, "mqtt:") X(mqtt_retained_key, "mqtt-retained") \
    X(mqtt_session_prefix, "mqtt-session:") X(mqtt_users, NULL)

static void stream_gone(void *arg, const void *key, size_t klen) { kw_signal(arg, key, klen); }

int eng_create(struct kv_engine **out, struct kv_table *t, const struct kv_config *cfg, char *err, size_t errlen)
{
    struct kv_engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    e->cfg = *cfg;
    int rc = 0;
#define DUP(f, d) rc |= dup_str(&e->cfg.f, cfg->f, d);
    CFG_STRINGS(DUP)
#undef DUP
    if (rc) {
        eng_destroy(e);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    e->table = t;
    e->wal = cfg->wal;
    e->bosc = cfg->bosc;
    e->port = cfg->port;
    e->mqtt_port = -1; /* (the pollers bind it) */
    e->start_time = time(NULL);
    pthread_mutex_init(&e->clients_lock, NULL);
    pthread_mutex_init(&e->slotmap_lock, NULL);
    list_init(&e->clients);
    list_init(&e->monitors);
    /* statistics: the log and the data file report to the latency monitor; they
     * are closed before the engine is destroyed (kvstore/server.py's stop) */
    if (cst_create(&e->stats, cfg->slowlog_log_slower_than, cfg->slowlog_max_len) ||
        latmon_create(&e->latmon, (uint32_t)cfg->latency_monitor_threshold) || kw_create(&e->keywait)) {
        eng_destroy(e);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    kvt_set_gone_hook(t, stream_gone, e->keywait); /* blocked readers of a deleted stream look again */
    if (e->wal)
        wal_set_latmon(e->wal, e->latmon);
    if (e->bosc)
        bosc_set_latmon(e->bosc, e->latmon);
    /* the engine's sections; the server and the front ends add theirs */
    eng_info_add(e, "memory", info_memory, NULL, e);
    eng_info_add(e, "persistence", info_persistence, NULL, e);
    eng_info_add(e, "persistence", eng_disk_info, NULL, e);
    eng_info_add(e, "replication", info_replication, NULL, e);
    eng_info_add(e, "cpu", info_cpu, NULL, e);
    eng_info_add(e, "keyspace", info_keyspace, NULL, e);
    *out = e;
    return 0;
}

void eng_destroy(struct kv_engine *e)
{
    if (!e)
        return;
#define FREE(f, d) free((char *)e->cfg.f);
    CFG_STRINGS(FREE)
#undef FREE
    cst_destroy(e->stats);
    latmon_destroy(e->latmon);
    if (e->keywait && e->table)
        kvt_set_gone_hook(e->table, NULL, NULL);
    kw_destroy(e->keywait);
    if (e->clients.next) { /* not when eng_create failed before it */
        pthread_mutex_destroy(&e->clients_lock);
        pthread_mutex_destroy(&e->slotmap_lock);
    }
    free(atomic_load(&e->slotmap));
    for (struct kv_slotmap *m = e->retired, *next; m; m = next) {
        next = m->retired_next;
        free(m);
    }
    free(e);
}
