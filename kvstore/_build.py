"""cffi (API mode, out-of-line) build of kvstore._ext from the C sources in ext/.

The declarations below mirror the public headers; only what Python calls is
declared. Calls release the GIL (cffi's default), so C threads never wait on Python.
"""
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
EXT = os.path.relpath(os.path.join(HERE, "..", "ext"))
SOURCES = ["table.c", "resp.c", "cmd.c", "pollpolicy.c", "server.c", "loadgen.c"]

CDEF = """
struct kv_table;
typedef void (*kvt_read_fn)(void *arg, const char *val, size_t vlen);
struct kvt_stats {
    uint64_t keys, expires, used_memory, max_memory, buckets, rehashing;
    uint64_t expired_keys, oom_rejections, hits, misses;
};
int kvt_create(struct kv_table **out, uint64_t max_memory);
void kvt_destroy(struct kv_table *t);
void kvt_set_max_memory(struct kv_table *t, uint64_t max_memory);
int64_t kvt_get_copy(struct kv_table *t, const void *key, size_t klen, void *buf, size_t cap);
int kvt_set(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen,
            int flags, int64_t expire_ms, kvt_read_fn old_fn, void *old_arg);
int kvt_del(struct kv_table *t, const void *key, size_t klen);
int kvt_exists(struct kv_table *t, const void *key, size_t klen);
int kvt_incrby(struct kv_table *t, const void *key, size_t klen, int64_t delta, int64_t *result);
int64_t kvt_append(struct kv_table *t, const void *key, size_t klen, const void *val, size_t vlen);
int64_t kvt_strlen(struct kv_table *t, const void *key, size_t klen);
void kvt_flush(struct kv_table *t);
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
struct srv_config {
    const char *bind; int port; int threads; int maxclients; const char *requirepass;
    int accept_mode; const char *poll_policy; const char *config_file; const char *version;
    int tcp_backlog;
};
struct srv_poller_stats {
    uint64_t epoll_wait, epoll_ctl, reads, writes;
    uint64_t commands, accepted, clients, bytes_in, bytes_out;
};
struct srv_stats {
    uint64_t connected_clients, total_connections, rejected_connections;
    uint64_t total_commands, bytes_in, bytes_out, protocol_errors;
    int pollers;
};
int srv_create(struct srv **out, struct kv_table *t, const struct srv_config *cfg, char *err, size_t errlen);
int srv_start(struct srv *s, char *err, size_t errlen);
void srv_stop(struct srv *s);
void srv_destroy(struct srv *s);
int srv_port(const struct srv *s);
void srv_get_stats(struct srv *s, struct srv_stats *st);
int srv_get_poller_stats(struct srv *s, int i, struct srv_poller_stats *st);

struct lg_config {
    const char *host; int port; int threads; int conns; int pipeline; int value_size;
    uint64_t keyspace; int set_ratio, get_ratio; uint64_t requests; double duration; double rate;
    int proto; int check; const char *password; uint64_t seed; volatile int *stop;
    ...;
};
struct lg_result {
    uint64_t requests, sets, gets, hits, misses, errors;
    uint64_t bytes_sent, bytes_received;
    double elapsed, throughput;
    double lat_mean_us, lat_p50_us, lat_p90_us, lat_p99_us, lat_p999_us, lat_max_us;
    char first_error[128];
    char error[256];
    ...;
};
int lg_run(const struct lg_config *cfg, struct lg_result *out);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "kvstore._ext",
    '#include "table.h"\n#include "resp.h"\n#include "server.h"\n#include "loadgen.h"\n',
    sources=[os.path.join(EXT, s) for s in SOURCES],
    include_dirs=[EXT],
    extra_compile_args=["-std=gnu11", "-O2", "-pthread", "-Wall", "-Wno-unused-parameter",
                        "-fvisibility=hidden"],
    extra_link_args=["-pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
