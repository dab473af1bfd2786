"""cffi (API mode, out-of-line) build of kvstore._bench, the benchmark code in ext/bench/.

Load generators (lg_run over TCP, ug_run over UDP, xg_run: stream consumers,
mq_run: MQTT publishers), the naive baseline of the data
file (bosc_bench_naive) and the log record generator (rl_generate). None of it is
part of the server library (kvstore._ext), and this module links none of the
server's code: the generators only talk to servers over sockets, the baseline is
self-contained, and rl_generate appends through a function pointer to the main
module's wal_log_fn (one copy of the log code, the one that owns the log).
SPEC names what Python calls; its declarations come from the headers (_cdef.py).
Calls release the GIL (cffi's default).
"""
import glob
import os
import runpy

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
EXT = os.path.relpath(os.path.join(HERE, "..", "ext"))
# ldu_bench*.c are a standalone program (experiments/ldu_scalability.py builds it).
# *.bpf.c are XDP programs for clang's BPF target, embedded through build/gen (below).
SOURCES = sorted(p for p in glob.glob(os.path.join(EXT, "bench", "*.c"))
                 if not os.path.basename(p).startswith("ldu_bench") and not p.endswith(".bpf.c"))

# What Python uses, by header; the declarations are copied from the headers (_cdef.py).
SPEC = [
    ("bench/loadgen.h", ["struct lg_config", "struct lg_result", "lg_run"]),
    ("bench/udpgen.h", ["ug_run"]),
    ("bench/xgroupgen.h", ["struct xg_config", "struct xg_result", "xg_run"]),
    ("bench/mqttgen.h", ["struct mq_config", "struct mq_result", "mq_run"]),
    ("bench/pullgen.h", ["struct pg_config", "struct pg_result", "pg_run"]),
    ("bench/bosc_naive.h", ["bosc_bench_naive"]),
    ("core/table.h", ["typedef kvt_log_fn"]),
    ("bench/replog_gen.h", ["rl_generate"]),
]


# The pull experiment's XDP generator (ext/bench/pullgen.bpf.c), embedded by pullgen.c;
# without clang and libbpf pg_run says the build lacks it.
XDP = runpy.run_path(os.path.join(HERE, "_bpfbuild.py"))["bpf_object"](
    EXT, os.path.join("bench", "pullgen.bpf.c"), "pullgen", os.path.join(HERE, "..", "build", "gen"))

# kvstore/_cdef.py, run by path: the package cannot be imported while its extensions build
CDEF = runpy.run_path(os.path.join(HERE, "_cdef.py"))["cdef"](EXT, SPEC)

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "kvstore._bench",
    "".join(f'#include "{header}"\n' for header, _ in SPEC if header.startswith("bench/")),
    sources=SOURCES,
    depends=sorted(glob.glob(os.path.join(EXT, "*", "*.h")))  # a header change rebuilds it too
    + ([os.path.join(XDP[0], "pullgen_bpf.h")] if XDP else []),
    include_dirs=[EXT] + ([XDP[0]] if XDP else []),
    define_macros=[("KV_HAVE_XDP", "1")] if XDP else [],
    extra_compile_args=["-std=gnu11", "-O2", "-pthread", "-Wall", "-Wno-unused-parameter",
                        "-Wno-format-truncation", "-fvisibility=hidden"],
    extra_link_args=["-pthread"] + (XDP[1] if XDP else []),
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
