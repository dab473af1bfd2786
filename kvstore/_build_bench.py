"""cffi (API mode, out-of-line) build of kvstore._bench, the benchmark code in ext/bench/.

Load generators (lg_run over TCP, ug_run over UDP), the naive baseline of the data
file (bosc_bench_naive) and the log record generator (rl_generate). None of it is
part of the server library (kvstore._ext), and this module links none of the
server's code: the generators only talk to servers over sockets, the baseline is
self-contained, and rl_generate appends through a function pointer to the main
module's wal_log_fn (one copy of the log code, the one that owns the log).
The declarations below mirror ext/bench/*.h; calls release the GIL (cffi's default).
"""
import glob
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
EXT = os.path.relpath(os.path.join(HERE, "..", "ext"))
# ldu_bench*.c are a standalone program (experiments/ldu_scalability.py builds it).
SOURCES = sorted(p for p in glob.glob(os.path.join(EXT, "bench", "*.c"))
                 if not os.path.basename(p).startswith("ldu_bench"))

CDEF = """
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
int ug_run(const struct lg_config *cfg, int timeout_ms, struct lg_result *out, uint64_t *timeouts);

double bosc_bench_naive(const char *path, uint32_t buckets, uint64_t n, uint32_t value_size, uint64_t seed);

typedef int64_t (*kvt_log_fn)(void *arg, int op, const void *key, size_t klen, const void *v1,
                              size_t n1, const void *v2, size_t n2, int64_t expire_ms);
int64_t rl_generate(kvt_log_fn append, void *arg, uint64_t n, uint32_t record_bytes);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "kvstore._bench",
    '#include "bench/loadgen.h"\n#include "bench/udpgen.h"\n#include "bench/bosc_naive.h"\n'
    '#include "bench/replog_gen.h"\n',
    sources=SOURCES,
    include_dirs=[EXT],
    extra_compile_args=["-std=gnu11", "-O2", "-pthread", "-Wall", "-Wno-unused-parameter",
                        "-Wno-format-truncation", "-fvisibility=hidden"],
    extra_link_args=["-pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
