"""cffi (API mode, out-of-line) build of kvstore._ext from the C sources in ext/.

SPEC names what Python calls; its declarations are taken from the headers
(kvstore/_cdef.py), so they cannot drift from the C. Calls release the GIL (cffi's
default), so C threads never wait on Python.
"""
import glob
import os
import runpy
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
HEADERS = sorted(glob.glob(os.path.join(EXT, "*", "*.h")))


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


def _have_uring():
    """liburing (--datafile-io uring) is found by pkg-config (liburing-dev), unless
    KVSTORE_NO_URING=1 asks for a build without it: that mode then reports it is missing."""
    if os.environ.get("KVSTORE_NO_URING") == "1":
        return False
    try:
        return subprocess.run(["pkg-config", "--exists", "liburing"]).returncode == 0
    except OSError:
        return False


URING = _have_uring()
if URING:
    EXTRA_LIBS = EXTRA_LIBS + ["-luring"]
    MACROS.append(("KV_HAVE_URING", "1"))

# The pull cache's XDP program (ext/bpf/pullcache.bpf.c, issue 16), embedded by
# frontend/pullcache.c; without it --pull-cache-slots says the build lacks it.
XDP = runpy.run_path(os.path.join(HERE, "_bpfbuild.py"))["bpf_object"](
    EXT, os.path.join("bpf", "pullcache.bpf.c"), "pullcache", os.path.join(HERE, "..", "build", "gen"))
INCLUDE_DIRS = [EXT]
if XDP:
    INCLUDE_DIRS.append(XDP[0])
    EXTRA_LIBS = EXTRA_LIBS + XDP[1]
    MACROS.append(("KV_HAVE_XDP", "1"))

# What Python uses, by the header that declares it; the declarations themselves are
# copied from the headers at build time (_cdef.py), never written twice.
SPEC = [
    ("core/table.h", ["struct kv_table;", "typedef kvt_read_fn", "struct kvt_stats", "kvt_create", "kvt_destroy",
                      "kvt_set_max_memory", "kvt_max_memory", "kvt_get_copy", "kvt_set", "kvt_del", "kvt_load_sync",
                      "kvt_wait_memory", "kvt_exists", "kvt_incrby", "kvt_append", "kvt_strlen", "kvt_flush",
                      "typedef kvt_log_fn", "kvt_set_log", "kvt_count", "kvt_used_memory", "kvt_get_stats",
                      "kvt_housekeep", "kvt_now_ms", "kvt_set_clock_offset", "#define KVT_SHARDS"]),
    ("proto/resp.h", ["struct resp_arg", "struct resp_parser", "resp_parser_init", "resp_parser_free", "resp_parse",
                      "resp_reset"]),
    ("engine/engine.h", ["struct wal;", "struct bosc;", "struct rl_sender;", "struct rl_receiver;",
                         "struct kv_config"]),
    ("frontend/frontend.h", ["struct fe_stats", "struct fe_thread_stats"]),
    ("server/server.h", ["struct srv;", "srv_create", "srv_start", "srv_stop", "srv_destroy", "srv_port", "srv_tls_port", "srv_mqtt_port",
                         "srv_udp_port", "srv_have_dpdk", "srv_get_stats", "srv_get_poller_stats", "srv_info",
                         "#define SRV_INFO_MAX_SECTIONS", "#define SRV_INFO_MAX_NAME"]),
    ("durability/wal.h", ["struct wal_config", "struct wal_stats", "struct wal_recovery", "wal_open", "wal_start",
                          "wal_close", "wal_log_fn", "wal_durable_lsn", "wal_failed", "wal_error", "wal_get_stats",
                          "wal_subscribe", "wal_recover", "wal_truncate", "wal_sync_bound_us",
                          "#define WAL_SYNC_BUCKETS"]),
    ("core/crc32c.h", ["crc32c"]),
    ("core/log.h", ["kvlog_open", "kvlog_reopen", "kvlog_raw", "kvlog_write_errors"]),
    ("durability/replog.h", ["struct rl_tls_files", "struct rl_sender_config", "struct rl_sender_stats", "struct rl_receiver_stats",
                             "rl_sender_start", "rl_sender_stop", "rl_sender_get_stats", "rl_receiver_start",
                             "rl_receiver_port", "rl_receiver_set_self", "rl_receiver_stop", "rl_receiver_get_stats", "rl_fetch"]),
    ("durability/bosc.h", ["struct bosc_config", "struct bosc_open_info", "struct bosc_stats", "bosc_open",
                           "bosc_set_log", "bosc_start", "bosc_close", "bosc_sync", "bosc_failed", "bosc_error",
                           "bosc_get_stats"]),
    ("frontend/pollpolicy.h", ["struct pp_conn", "struct pp_policy", "pp_find", "#define PP_FLEX_SPURIOUS"]),
    ("core/ldu.h", ["struct ldu_node", "struct ldu_obj", "struct ldu_queue", "ldu_obj_init", "ldu_queue_init",
                    "ldu_log", "ldu_defer", "ldu_take", "ldu_reverse", "ldu_claim", "ldu_release"]),
    ("server/server.h", ["srv_set_loading", "srv_attach"]),  # a node waiting for its state (identity)
    # the block device (issue 15): a network-backend server (eng NULL) or, through srv_nbd, the
    # embedded one a Server runs when kv_config.nbd is set
    ("frontend/nbd.h", ["struct nbd_server;", "struct nbd_config", "struct nbd_stats", "nbd_create", "nbd_start",
                        "nbd_stop", "nbd_destroy", "nbd_port", "nbd_get_stats", "#define NBD_MAX_THREADS",
                        "#define NBD_MAX_CONNS_PER_THREAD"]),
    ("server/server.h", ["srv_nbd"]),
    # the pull cache (issue 16): whether this build has it; the experiment's bounce-only yardstick
    # and the pass-through program for a veth's client end (tests, experiments)
    ("frontend/pullcache.h", ["pc_available", "struct pc_prog;", "pc_prog_attach", "pc_prog_bounced",
                              "pc_prog_detach"]),
    ("frontend/nbd_netkv.h", ["struct nk_url", "nk_parse_url"]),  # the block device's backend URLs (tests)
]


# kvstore/_cdef.py, run by path: the package cannot be imported while its extensions build
CDEF = runpy.run_path(os.path.join(HERE, "_cdef.py"))["cdef"](EXT, SPEC)

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "kvstore._ext",
    "".join(f'#include "{header}"\n' for header, _ in SPEC),
    sources=[os.path.join(EXT, s) for s in SOURCES],
    # setuptools rebuilds the module only when a file named here is newer than it: the
    # headers too, or a change to a header alone left a stale module
    depends=HEADERS + ([os.path.join(XDP[0], "pullcache_bpf.h")] if XDP else []),
    include_dirs=INCLUDE_DIRS,
    define_macros=MACROS,
    # with DPDK its pkg-config flags apply to every file (cffi has no per-file flags):
    # they only add include paths, -include rte_config.h and -march=corei7
    extra_compile_args=["-std=gnu11", "-O2", "-pthread", "-Wall", "-Wno-unused-parameter",
                        "-Wno-format-truncation",
                        "-fvisibility=hidden"] + EXTRA_CFLAGS,
    # OpenSSL: TLS on the RESP port and the replication link, HMAC for the link's authentication
    libraries=["ssl", "crypto"],
    extra_link_args=["-pthread"] + EXTRA_LIBS,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
