"""cffi (API mode, out-of-line) build of kvstore._ext from the C sources in ext/.

The declarations below mirror the public headers; only what Python calls is
declared. Calls release the GIL (cffi's default), so C threads never wait on Python.
"""
import glob
import os
import shlex
import subprocess

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
EXT = os.path.relpath(os.path.join(HERE, "..", "ext"))
# Every C file of the server's layers (ext/<layer>/*.c); dpdk.c only when libdpdk is
# found. ext/bench/ (benchmark code) is kvstore._bench, built by _build_bench.py.
LAYERS = ["core", "proto", "durability", "cmd", "engine", "frontend", "server"]
SOURCES = sorted(os.path.relpath(p, EXT) for layer in LAYERS
                 for p in glob.glob(os.path.join(EXT, layer, "*.c"))
                 if os.path.basename(p) not in ("dpdk.c", "ldu_bench.c"))


def _dpdk_flags():
    """(cflags, libs) of libdpdk from pkg-config, or None when it is not installed (or
    KVSTORE_NO_DPDK=1 asks for a build without it): --arch dpdk then reports that."""
    if os.environ.get("KVSTORE_NO_DPDK") == "1":
        return None
    try:
        if subprocess.run(["pkg-config", "--exists", "libdpdk"]).returncode != 0:
            return None
        cflags = subprocess.run(["pkg-config", "--cflags", "libdpdk"], capture_output=True, text=True,
                                check=True).stdout
        libs = subprocess.run(["pkg-config", "--libs", "libdpdk"], capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return shlex.split(cflags), shlex.split(libs)


DPDK = _dpdk_flags()
EXTRA_CFLAGS, EXTRA_LIBS, MACROS = [], [], []
if DPDK:
    SOURCES.append("frontend/dpdk.c")
    EXTRA_CFLAGS, EXTRA_LIBS = DPDK
    MACROS.append(("KV_HAVE_DPDK", "1"))

CDEF = """
struct kv_table;
typedef void (*kvt_read_fn)(void *arg, const char *val, size_t vlen);
struct kvt_stats {
    uint64_t keys, entries, disk_keys, expires, used_memory, max_memory, buckets, rehashing;
    uint64_t expired_keys, oom_rejections, hits, misses;
};
int kvt_create(struct kv_table **out, uint64_t max_memory);
void kvt_destroy(struct kv_table *t);
void kvt_set_max_memory(struct kv_table *t, uint64_t max_memory);
int64_t kvt_get_copy(struct kv_table *t, const void *key, size_t klen, void *buf, size_t cap);
int kvt_set(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen,
            int flags, int64_t expire_ms, kvt_read_fn old_fn, void *old_arg);
int kvt_del(struct kv_table *t, const void *key, size_t klen);
int kvt_load_sync(struct kv_table *t, const void *key, size_t klen);
int kvt_wait_memory(struct kv_table *t);
int kvt_exists(struct kv_table *t, const void *key, size_t klen);
int kvt_incrby(struct kv_table *t, const void *key, size_t klen, int64_t delta, int64_t *result);
int64_t kvt_append(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen);
int64_t kvt_strlen(struct kv_table *t, const void *key, size_t klen);
int kvt_flush(struct kv_table *t);
typedef int64_t (*kvt_log_fn)(void *arg, int op, const void *key, size_t klen, const void *v1,
                              size_t n1, const void *v2, size_t n2, int64_t expire_ms);
void kvt_set_log(struct kv_table *t, kvt_log_fn fn, void *arg);
uint64_t kvt_count(struct kv_table *t);
uint64_t kvt_used_memory(struct kv_table *t);
void kvt_get_stats(struct kv_table *t, struct kvt_stats *st);
int kvt_housekeep(struct kv_table *t, unsigned first, unsigned n, unsigned budget);

struct resp_arg { size_t off; size_t len; };
struct resp_parser {
    size_t scan; long long pending; long long bulk; int argc, argcap;
    struct resp_arg *argv; int unauth; const char *err;
};
void resp_parser_init(struct resp_parser *p);
void resp_parser_free(struct resp_parser *p);
int resp_parse(struct resp_parser *p, char *buf, size_t len);
void resp_reset(struct resp_parser *p);

struct srv;
struct wal;
struct rl_sender;
struct rl_receiver;
struct kv_config {
    const char *bind; int port; int threads; int maxclients; const char *requirepass;
    const char *accept; const char *poll_policy; const char *config_file; const char *version;
    int tcp_backlog; struct wal *wal; const char *durability;
    struct rl_sender *sender; struct rl_receiver *receiver; const char *arch; int network_only; struct bosc *bosc;
    int udp_port; int udp_workers; const char *dpdk_iface; const char *dpdk_eal_args;
};
struct fe_thread_stats {
    uint64_t epoll_wait, epoll_ctl, reads, writes;
    uint64_t commands, accepted, clients, bytes_in, bytes_out;
};
struct fe_stats {
    uint64_t connected_clients, total_connections, rejected_connections;
    uint64_t total_commands, bytes_in, bytes_out, protocol_errors, ops_per_sec;
    int pollers;
    uint64_t udp_rx, udp_tx, udp_requests, udp_dropped, udp_tx_failed, udp_bad, udp_held, udp_stalls, udp_busy_ns;
};
int srv_create(struct srv **out, struct kv_table *t, const struct kv_config *cfg, char *err, size_t errlen);
int srv_start(struct srv *s, char *err, size_t errlen);
void srv_stop(struct srv *s);
void srv_destroy(struct srv *s);
int srv_port(const struct srv *s);
int srv_have_dpdk(void);
int srv_udp_port(const struct srv *s);
void srv_get_stats(struct srv *s, struct fe_stats *st);
int srv_get_poller_stats(struct srv *s, int i, struct fe_thread_stats *st);
int wal_subscribe(struct wal *w, int evfd);

struct wal_config { const char *dir; int sync; uint64_t segment_bytes; uint64_t max_pending; uint64_t first_lsn;
                   uint32_t sync_delay_us; uint64_t batch_bytes; uint32_t batch_ms; int ship; };
struct rl_sender_config {
    const char *host; int port; uint8_t node_id[16]; uint32_t interval_us; uint32_t max_batch_records;
    uint32_t timeout_ms;
};
struct rl_sender_stats {
    uint64_t batches, records, bytes, acked_lsn, sent_lsn;
    uint64_t connects, disconnects, catchup_records;
    int connected, degraded; char last_error[256];
};
struct rl_receiver_stats {
    uint64_t batches, records, bytes, held_lsn, syncs, fetches; int peers_connected;
};
int rl_sender_start(struct rl_sender **out, struct wal *w, const struct rl_sender_config *cfg,
                    char *err, size_t errlen);
void rl_sender_stop(struct rl_sender *s);
void rl_sender_get_stats(struct rl_sender *s, struct rl_sender_stats *st);
int rl_receiver_start(struct rl_receiver **out, const char *bind, int port, const char *peer_dir,
                      uint32_t sync_ms, char *err, size_t errlen);
int rl_receiver_port(struct rl_receiver *r);
void rl_receiver_stop(struct rl_receiver *r);
void rl_receiver_get_stats(struct rl_receiver *r, struct rl_receiver_stats *st);
int64_t rl_fetch(const char *host, int port, uint8_t node_id[16], const char *dest_dir,
                 uint32_t timeout_ms, char *err, size_t errlen);
struct wal_stats {
    uint64_t appended_lsn, durable_lsn, groups, records, bytes, syncs;
    uint64_t sync_ns_total, sync_ns_max, max_group_records; int failed;
};
struct wal_recovery {
    uint64_t records, first_lsn, last_lsn, segments, bytes, truncated_bytes; char problem[512];
};
int wal_open(struct wal **out, const struct wal_config *cfg, char *err, size_t errlen);
int wal_start(struct wal *w);
void wal_close(struct wal *w);
int64_t wal_log_fn(void *arg, int op, const void *key, size_t klen, const void *v1, size_t n1,
                   const void *v2, size_t n2, int64_t expire_ms);
uint64_t wal_durable_lsn(struct wal *w);
int wal_failed(struct wal *w);
const char *wal_error(struct wal *w);
void wal_get_stats(struct wal *w, struct wal_stats *st);
int wal_recover(struct kv_table *t, const char *dir, uint64_t after_lsn, int repair,
                struct wal_recovery *rec, char *err, size_t errlen);
uint32_t crc32c(uint32_t crc, const void *p, size_t n);
int wal_truncate(const char *dir, uint64_t upto);

struct bosc;
struct bosc_config { const char *path; uint32_t buckets; uint32_t flush_interval_ms; int locked_queue;
                     const char *log_dir; };
struct bosc_open_info {
    uint64_t flushed_lsn, generation, buckets, blocks, disk_keys, overflow_blocks; double seconds;
};
struct bosc_stats {
    uint64_t sweeps, records, blocks_read, blocks_written, bytes_written, syncs;
    uint64_t sweep_ns, io_ns, deferred;
    uint64_t loads, load_reads, evicted, evicted_bytes, truncated_segments;
    uint64_t flushed_lsn, disk_keys, buckets, blocks, queued;
    int failed; char error[256];
};
int bosc_open(struct bosc **out, struct kv_table *t, const struct bosc_config *cfg,
              struct bosc_open_info *info, char *err, size_t errlen);
void bosc_set_log(struct bosc *b, struct wal *w);
int bosc_start(struct bosc *b);
void bosc_close(struct bosc *b);
int bosc_sync(struct bosc *b);
int bosc_failed(struct bosc *b);
const char *bosc_error(struct bosc *b);
void bosc_get_stats(struct bosc *b, struct bosc_stats *st);

struct pp_conn { uint32_t a, b; };
struct pp_policy {
    const char *name; int write_at_round_end; int edge;
    int (*want_out)(struct pp_conn *st, int pending, int spurious);
};
const struct pp_policy *pp_find(const char *name);
#define PP_FLEX_SPURIOUS ...

struct ldu_node { struct ldu_node *next; uint32_t mark; uint8_t op; ...; };
struct ldu_obj { struct ldu_node node[2]; uint32_t used; };
struct ldu_queue { uint64_t pushes; ...; };
void ldu_obj_init(struct ldu_obj *o);
void ldu_queue_init(struct ldu_queue *q);
int ldu_log(struct ldu_queue *q, struct ldu_obj *o, int op, int absorb);
void ldu_defer(struct ldu_queue *q, struct ldu_node *n);
struct ldu_node *ldu_take(struct ldu_queue *q);
struct ldu_node *ldu_reverse(struct ldu_node *list);
int ldu_claim(struct ldu_node *n);
int ldu_release(struct ldu_obj *o, struct ldu_node *n);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "kvstore._ext",
    '#include "core/table.h"\n#include "proto/resp.h"\n#include "server/server.h"\n'
    '#include "durability/wal.h"\n#include "core/crc32c.h"\n#include "durability/replog.h"\n'
    '#include "core/ldu.h"\n#include "durability/bosc.h"\n#include "frontend/pollpolicy.h"\n',
    sources=[os.path.join(EXT, s) for s in SOURCES],
    include_dirs=[EXT],
    define_macros=MACROS,
    # with DPDK its pkg-config flags apply to every file (cffi has no per-file flags):
    # they only add include paths, -include rte_config.h and -march=corei7
    extra_compile_args=["-std=gnu11", "-O2", "-pthread", "-Wall", "-Wno-unused-parameter",
                        "-Wno-format-truncation",
                        "-fvisibility=hidden"] + EXTRA_CFLAGS,
    extra_link_args=["-pthread"] + EXTRA_LIBS,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
