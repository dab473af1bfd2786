"""Build the C stress programs against ext/ with sanitizers and run them.

  table_stress.c  concurrent table stress (white box: ext/core/table_int.h), built twice:
                  -fsanitize=thread and -fsanitize=address,undefined
  table_ops_stress.c  kvt_scan's guarantee while shards grow, rehash and shrink; kvt_apply
                  increments from four threads; transactions isolated (TSan, ASan/UBSan)
  resp_fuzz.c     mutational fuzzer of ext/resp.c, -fsanitize=address,undefined
  wal_stress.c    the write-ahead log with concurrent appenders (through the table's
                  logger), a consumer of the sender's view (records in place, prefixes
                  consumed) and mode switches, then recovery; built with each
                  sanitizer, with 4 KiB chunks
  session_test.c  ext/engine/session.c, the request runner, on a real table, log and
                  data file with memory far below the data: DONE/HOLD/STALL, blocking and
                  eventfd waits, MGET resumed over stalls, held replies; TSan and ASan/UBSan
  wal_ship_test.c  the log's chunks in ship mode at their edges (4 KiB chunks): records
                  larger than a chunk, units, FLUSH, max_pending's -EAGAIN, a slow
                  consumer holding its view while chunks are recycled (every record
                  checked twice), disk-full rounds and mode switches, then exact
                  recovery; built with each sanitizer
  wal_notify_test.c  the log's wake-up list: a poller asleep for an LSN is woken once it
                  is durable, never lost; one that wants nothing is not
                  woken (until a failure wakes all); built with each sanitizer
  wal_diskfull_test.c  the log while RLIMIT_FSIZE (a full disk's stand-in) refuses its
                  writes round after round: the error is reported, appends refused, the
                  refused group kept and written once the limit is raised, recovery
                  exact with no torn tail; built with each sanitizer
  ldu_stress.c    ext/ldu.c: producers log insert/remove on shared objects while a
                  consumer applies concurrently (claim/release/second claim), then a
                  drain; checks the applied state, that no node is lost or doubled,
                  and that absorbing and reuse happen; built with each sanitizer
  nbd_proto_test.c  ext/proto/nbd.c, the NBD protocol's bytes: encoders against exact bytes,
                  valid options and request headers parsed back (every split of a header), then
                  mutated and random input to every parser in exact-size buffers;
                  -fsanitize=address,undefined
  mqtt_proto_test.c  ext/proto/mqtt.c, the MQTT 3.1.1 packet codec: the remaining length at
                  every varint boundary, fixed-header flags, CONNECT/PUBLISH/SUBSCRIBE rules
                  of the specification at their edges, topic matching (section 4.7's examples,
                  then exhaustively against a reference matcher), encoders against exact
                  bytes, then mutated packets of every type framed and parsed in exact-size
                  buffers against reference parsers; -fsanitize=address,undefined
  hashenc_fuzz.c  ext/core/hashenc.c, the encoding of a hash: random HSET/HDEL batches
                  against a model (fields in Redis's listpack order), then the decoder and
                  the writers fed damaged encodings and random bytes, each in a buffer of
                  exactly its size; -fsanitize=address,undefined
  stream_test.c   ext/core/stream*.c, a stream value: ID rules at their edges, random
                  XADD/XDEL/trims against a sorted model (ranges both ways, batches' bounds
                  and numbers, exact memory count), then consumer groups' PEL against a
                  sorted model; -fsanitize=address,undefined
  bosc_stress.c   the table with a BOSC data file behind it (spill mode): concurrent
                  workers checked against per-thread models while the flusher evicts
                  and keys are loaded back, then DBSIZE, a restart on the same file and
                  FLUSHALL; built with each sanitizer
  bosc_diskfull_test.c  the data file while RLIMIT_FSIZE (a full disk's stand-in) stops
                  its sweeps part way, round after round: the error reported, the file
                  not failed, every key readable (memory or its block) meanwhile, all
                  written once the limit is raised, and again after a reopen; each sanitizer
  bosc_keys_test.c typed records through eviction, load and restart; the data file's
                  key listing (exactly once, under writes, tickets nobody takes, a damaged
                  block) and expired records reclaimed from blocks nothing writes, with
                  the table's clock moved; built with each sanitizer
  nbd_server_test.c  the NBD server with the embedded backend on a table and disk log, two
                  raw clients on a unix socket writing the same unaligned ranges at once
                  (read-modify-write of the edges): each block part read back is one
                  writer's, never a mix; FLUSH, FUA, TRIM, WRITE_ZEROES pipelined; TSan, ASan/UBSan
  tls_test.c      ext/core/tls.c over a socketpair: a blocking client thread against a
                  non-blocking server echoing 4 MiB through a small socket (writes stopped
                  and repeated), a client without a certificate refused; each sanitizer

Binaries go to tests/c/bin/ (gitignored). A run fails on a non-zero exit status or
on any sanitizer report in its output. To reproduce a failure by hand, run the
command printed in the failure message (same environment variables). The seed can
be changed with KVSTORE_C_SEED=<n>.
"""
import os
import re
import shlex
import hashlib
import shutil
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
EXT = ROOT / "ext"
BIN = HERE / "bin"

SEED = int(os.environ.get("KVSTORE_C_SEED", "1"))
TABLE_OPS = 500_000      # operations per worker thread and phase
FUZZ_ITERATIONS = 200_000
STREAM_ROUNDS = 4_000    # stream_test: each round checks the whole stream against the model
LDU_OPS = 1_000_000      # ldu_log calls per producer thread
BOSC_OPS = 60_000        # per worker thread (4): ~5 s under TSan on an idle 2-core machine
TABLE_OPS_ROUNDS = 30     # table_ops_stress: full scans; x100 increments and transactions
RUN_TIMEOUT = 240        # seconds per run: generous for a slow, shared machine

COMMON = ["-std=gnu11", "-g", "-O1", "-Wall", "-Wno-unused-parameter", "-pthread", f"-I{EXT}"]
TSAN = ["-fsanitize=thread"]
ASAN_UBSAN = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]

ENV = {
    # detect_deadlocks=0: a transaction and FLUSHALL hold all 256 shard locks at once,
    # and TSan's lock-order checker tracks at most 64 per thread (races still count).
    "TSAN_OPTIONS": "halt_on_error=1:handle_abort=1:detect_deadlocks=0",
    "ASAN_OPTIONS": "abort_on_error=1:detect_leaks=1:handle_abort=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}

SANITIZER_MARKERS = (
    "WARNING: ThreadSanitizer",
    "ERROR: ThreadSanitizer",
    "ERROR: AddressSanitizer",
    "ERROR: LeakSanitizer",
    "runtime error:",          # UBSan
    "Sanitizer:DEADLYSIGNAL",
)

def _ext(*names):
    return [str(EXT / n) for n in names]


# The C files each stress binary links (paths under ext/), by component.
STREAM = [str(p) for p in sorted(EXT.glob("core/stream*.c"))]  # a stream value's parts, however split
# the table, with what its stream keys need
TABLE = [str(p) for p in sorted(EXT.glob("core/table*.c"))] + _ext("core/siphash.c", "core/ldu.c") + STREAM
WAL = [str(p) for p in sorted(EXT.glob("durability/wal*.c"))] + _ext(  # the log's parts, however split
    "core/crc32c.c", "core/log.c", "core/latmon.c")
BOSC = [str(p) for p in sorted(EXT.glob("durability/bosc_*.c"))]  # the data file's parts, however split

def layer_sources(*layers):
    """Every C file of these ext/ layers, so that splitting a file needs no edit here."""
    return [str(p) for layer in layers for p in sorted((EXT / layer).glob("*.c"))]


SERVER_LIB = layer_sources("core", "proto", "durability", "engine", "cmd")
NBD = [str(p) for p in sorted(EXT.glob("frontend/nbd*.c"))]
LIBS = ["-lssl", "-lcrypto", "-lpthread"]  # after the sources: core/tls.c and the replication link's HMAC use OpenSSL

BUILDS = {
    "tls_test_tsan": (["tls_test.c", *_ext("core/tls.c")], TSAN),
    "tls_test_asan": (["tls_test.c", *_ext("core/tls.c")], ASAN_UBSAN),
    "session_test_tsan": (["session_test.c", *SERVER_LIB], TSAN),
    "session_test_asan": (["session_test.c", *SERVER_LIB], ASAN_UBSAN),
    # the NBD server (every frontend/nbd*.c: its backends too, however many) over the embedded engine
    "nbd_server_test_tsan": (["nbd_server_test.c", *SERVER_LIB, *NBD], TSAN),
    "nbd_server_test_asan": (["nbd_server_test.c", *SERVER_LIB, *NBD], ASAN_UBSAN),
    "table_stress_tsan": (["table_stress.c", *TABLE], TSAN),
    "table_stress_asan": (["table_stress.c", *TABLE], ASAN_UBSAN),
    "table_ops_stress_tsan": (["table_ops_stress.c", *TABLE], TSAN),
    "table_ops_stress_asan": (["table_ops_stress.c", *TABLE], ASAN_UBSAN),
    "resp_fuzz_asan": (["resp_fuzz.c", *_ext("proto/resp.c")], ASAN_UBSAN),
    "hashenc_fuzz_asan": (["hashenc_fuzz.c", *_ext("core/hashenc.c", "core/siphash.c")], ASAN_UBSAN),
    "nbd_proto_test_asan": (["nbd_proto_test.c", *_ext("proto/nbd.c")], ASAN_UBSAN),
    "mqtt_proto_test_asan": (["mqtt_proto_test.c", *_ext("proto/mqtt.c")], ASAN_UBSAN),
    "stream_test_asan": (["stream_test.c", *STREAM], ASAN_UBSAN),
    # 4 KiB chunks (1 MiB in the server): records cross many chunk boundaries
    "wal_stress_tsan": (["wal_stress.c", *WAL, *TABLE], TSAN + ["-DWAL_CHUNK_BYTES=4096"]),
    "wal_stress_asan": (["wal_stress.c", *WAL, *TABLE], ASAN_UBSAN + ["-DWAL_CHUNK_BYTES=4096"]),
    "wal_ship_test_tsan": (["wal_ship_test.c", *WAL, *TABLE], TSAN + ["-DWAL_CHUNK_BYTES=4096"]),
    "wal_ship_test_asan": (["wal_ship_test.c", *WAL, *TABLE], ASAN_UBSAN + ["-DWAL_CHUNK_BYTES=4096"]),
    "wal_notify_test_tsan": (["wal_notify_test.c", *_ext("durability/wal_notify.c")], TSAN),
    "wal_notify_test_asan": (["wal_notify_test.c", *_ext("durability/wal_notify.c")], ASAN_UBSAN),
    "wal_diskfull_test_tsan": (["wal_diskfull_test.c", *WAL, *TABLE], TSAN),
    "wal_diskfull_test_asan": (["wal_diskfull_test.c", *WAL, *TABLE], ASAN_UBSAN),
    "ldu_stress_tsan": (["ldu_stress.c", *_ext("core/ldu.c")], TSAN),
    "ldu_stress_asan": (["ldu_stress.c", *_ext("core/ldu.c")], ASAN_UBSAN),
    "bosc_stress_tsan": (["bosc_stress.c", *BOSC, *TABLE, *WAL], TSAN),
    "bosc_stress_asan": (["bosc_stress.c", *BOSC, *TABLE, *WAL], ASAN_UBSAN),
    "bosc_diskfull_test_tsan": (["bosc_diskfull_test.c", *BOSC, *TABLE, *WAL], TSAN),
    "bosc_diskfull_test_asan": (["bosc_diskfull_test.c", *BOSC, *TABLE, *WAL], ASAN_UBSAN),
    "bosc_keys_test_tsan": (["bosc_keys_test.c", *BOSC, *TABLE, *WAL], TSAN),
    "bosc_keys_test_asan": (["bosc_keys_test.c", *BOSC, *TABLE, *WAL], ASAN_UBSAN),
}

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


def _tree_digest():
    """A digest of every C source and header this directory and ext/ hold: a binary built from the
    same command and the same tree is reused (the data file's suites run these builds again under
    each forced I/O mode, in a child pytest, tests/faults/test_datafile_io_modes.py)."""
    h = hashlib.sha256()
    for p in sorted([*HERE.glob("*.[ch]"), *EXT.rglob("*.[ch]")]):
        h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


_TREE = []
JOBS = os.cpu_count() or 1


def _objects(sources, flags):
    """Each source compiled (in parallel, JOBS at a time) to an object file of its own under
    BIN/obj/<tree digest>/, named by its compile command: the table's, the log's and the
    engine's files are compiled once per set of flags, not once per binary that links them.
    Objects of other trees are removed first."""
    objdir = BIN / "obj" / _TREE[0][:16]
    if not objdir.exists():
        for old in (BIN / "obj").glob("*"):
            shutil.rmtree(old, ignore_errors=True)
        objdir.mkdir(parents=True, exist_ok=True)
    jobs, objs = [], []
    for src in sources:
        cmd = ["gcc", *COMMON, *flags, "-c", src]
        obj = objdir / (hashlib.sha256(shlex.join(cmd).encode()).hexdigest()[:32] + ".o")
        objs.append(str(obj))
        if not obj.exists():
            jobs.append((cmd, obj))

    def compile_one(job):
        cmd, obj = job
        tmp = obj.with_name(f".{obj.name}.{uuid.uuid4().hex}")  # concurrent sessions must not clobber each other
        r = subprocess.run([*cmd, "-o", str(tmp)], capture_output=True, text=True, timeout=300)
        if r.returncode == 0:
            os.replace(tmp, obj)
            return None
        tmp.unlink(missing_ok=True)
        return f"$ {shlex.join(cmd)}\n{r.stderr[-5000:]}"

    with ThreadPoolExecutor(JOBS) as pool:
        errors = [e for e in pool.map(compile_one, jobs) if e]
    return objs, errors


def _build(name):
    sources, flags = BUILDS[name]
    BIN.mkdir(exist_ok=True)
    out = BIN / name
    tmp = BIN / f".{name}.{uuid.uuid4().hex}"  # concurrent sessions must not clobber each other
    srcs = [str(HERE / s) if not os.path.isabs(s) else s for s in sources]
    cmd = ["gcc", *COMMON, *flags, *srcs, *LIBS, "-o", str(tmp)]
    if not _TREE:
        _TREE.append(_tree_digest())
    key = hashlib.sha256((shlex.join(cmd[:-1]) + _TREE[0]).encode()).hexdigest()
    stamp = BIN / f"{name}.key"
    if out.exists() and stamp.exists() and stamp.read_text() == key:
        return out
    objs, errors = _objects(srcs, flags)
    if errors:
        pytest.fail(f"build of {name} failed:\n" + "\n".join(errors))
    link = ["gcc", *COMMON, *flags, *objs, *LIBS, "-o", str(tmp)]
    r = subprocess.run(link, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        pytest.fail(f"build of {name} failed:\n$ {shlex.join(link)}\n{r.stderr[-5000:]}")
    os.replace(tmp, out)
    stamp.write_text(key)
    return out


@pytest.fixture(scope="module")
def binaries():
    built = {}

    def get(name):
        if name not in built:
            built[name] = _build(name)
        return built[name]
    return get


LOG_LINE = re.compile(r"^\d+:M \d\d \w{3} \d{4} \d\d:\d\d:\d\d\.\d{3} [.*#-] ")


def _run(binary, *args):
    cmd = [str(binary), *map(str, args)]
    env = {**os.environ, **ENV}
    shown = " ".join(f"{k}={v}" for k, v in ENV.items()) + " " + shlex.join(cmd)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env,
                           timeout=RUN_TIMEOUT, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"timed out after {RUN_TIMEOUT}s: {shown}\n{(e.stderr or b'')[-5000:]!r}")
    output = r.stdout + r.stderr
    reports = [m for m in SANITIZER_MARKERS if m in output]
    if r.returncode != 0 or reports:
        pytest.fail(f"exit status {r.returncode}, sanitizer reports {reports}\n$ {shown}\n{output[-8000:]}",
                    pytrace=False)
    # the components' log lines (core/log.c, on stderr) may come after the program's "ok"
    said = "\n".join(ln for ln in output.splitlines() if not LOG_LINE.match(ln))
    assert said.rstrip().endswith("ok"), output[-2000:]
    return output


@pytest.mark.parametrize("mode", ["chaos", "flush", "exact"])
def test_table_stress_tsan(binaries, mode):
    _run(binaries("table_stress_tsan"), SEED, mode, TABLE_OPS)


@pytest.mark.parametrize("mode", ["chaos", "flush", "exact"])
def test_table_stress_asan_ubsan(binaries, mode):
    _run(binaries("table_stress_asan"), SEED, mode, TABLE_OPS)


@pytest.mark.parametrize("build", ["tsan", "asan"])
@pytest.mark.parametrize("mode", ["scan", "apply", "tx"])
def test_table_ops_stress(binaries, build, mode):
    _run(binaries(f"table_ops_stress_{build}"), SEED, mode, TABLE_OPS_ROUNDS)


@pytest.mark.parametrize("seed_offset", [0, 1])
def test_resp_fuzz_asan_ubsan(binaries, seed_offset):
    out = _run(binaries("resp_fuzz_asan"), SEED + seed_offset, FUZZ_ITERATIONS)
    assert "requests parsed" in out


@pytest.mark.parametrize("seed_offset", [0, 1])
def test_hashenc_fuzz_asan_ubsan(binaries, seed_offset):
    out = _run(binaries("hashenc_fuzz_asan"), SEED + seed_offset, FUZZ_ITERATIONS)
    assert "values" in out and "valid" in out


@pytest.mark.parametrize("seed_offset", [0, 1])
def test_stream_asan_ubsan(binaries, seed_offset):
    out = _run(binaries("stream_test_asan"), SEED + seed_offset, STREAM_ROUNDS)
    assert "added" in out and "deliveries" in out


@pytest.mark.parametrize("seed_offset", [0, 1])
def test_nbd_proto_asan_ubsan(binaries, seed_offset):
    out = _run(binaries("nbd_proto_test_asan"), SEED + seed_offset, FUZZ_ITERATIONS)
    assert "mutated inputs parsed" in out and "encoders exact" in out


@pytest.mark.parametrize("seed_offset", [0, 1])
def test_mqtt_proto_asan_ubsan(binaries, seed_offset):
    out = _run(binaries("mqtt_proto_test_asan"), SEED + seed_offset, FUZZ_ITERATIONS)
    assert "mutated packets" in out and "encoders exact" in out and "match pairs" in out


@pytest.mark.parametrize("build", ["wal_stress_tsan", "wal_stress_asan"])
def test_wal_stress(binaries, build, tmp_path):
    out = _run(binaries(build), SEED, 20_000, tmp_path / "log")
    assert "recovered the same table" in out and "none inside a unit" in out


@pytest.mark.parametrize("build", ["wal_ship_test_tsan", "wal_ship_test_asan"])
def test_wal_ship(binaries, build, tmp_path):
    # The chunks in ship mode: a view held while chunks are recycled stays intact,
    # oversized records, -EAGAIN, the disk-full retry; recovery exact.
    out = _run(binaries(build), SEED, tmp_path / "log")
    assert "views held" in out and "failed writes retried" in out


@pytest.mark.parametrize("build", ["wal_notify_test_tsan", "wal_notify_test_asan"])
def test_wal_notify(binaries, build):
    # The log wakes a poller asleep for an LSN once it is durable: no wake-up lost.
    out = _run(binaries(build), 20_000)
    assert "no wake-up lost" in out


@pytest.mark.parametrize("build", ["wal_diskfull_test_tsan", "wal_diskfull_test_asan"])
def test_wal_disk_full(binaries, build, tmp_path):
    out = _run(binaries(build), tmp_path / "log")
    assert "failed writes retried" in out


@pytest.mark.parametrize("mode", ["all", "flushall"])
@pytest.mark.parametrize("build", ["bosc_stress_tsan", "bosc_stress_asan"])
def test_bosc_stress(binaries, build, mode, tmp_path, monkeypatch):
    # "flushall" runs the FLUSHALL/restart phase alone, so that a failure in the
    # concurrent phases cannot hide one there. The data file goes to a mkdtemp dir
    # under $TMPDIR: here tmp_path, so a run a sanitizer aborts leaves nothing in /tmp.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out = _run(binaries(build), SEED, BOSC_OPS, mode)
    assert "evictions" in out


@pytest.mark.parametrize("build", ["bosc_diskfull_test_tsan", "bosc_diskfull_test_asan"])
def test_bosc_disk_full(binaries, build, tmp_path):
    out = _run(binaries(build), tmp_path / "data")
    assert "every key as last written" in out


# A sweep settled chunk by chunk (bosc_sweep.c): a few keys a chunk, so every sweep has
# many, each synced, recorded, evicted and its writers woken before the next; the disk
# refusing a later chunk after earlier ones were settled; a stress run doing both.
@pytest.mark.parametrize("build", ["bosc_diskfull_test_tsan", "bosc_diskfull_test_asan"])
def test_bosc_disk_full_in_chunks(binaries, build, tmp_path, monkeypatch):
    monkeypatch.setitem(ENV, "KVSTORE_C_SWEEP_CHUNK", "16")
    out = _run(binaries(build), tmp_path / "data")
    assert "every key as last written" in out
    assert int(re.search(r"(\d+) chunks settled", out).group(1)) > 0, out[-2000:]


@pytest.mark.parametrize("build", ["bosc_stress_tsan", "bosc_stress_asan"])
def test_bosc_stress_in_chunks(binaries, build, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setitem(ENV, "KVSTORE_C_SWEEP_CHUNK", "64")
    out = _run(binaries(build), SEED, BOSC_OPS, "all")
    assert "evictions" in out
    assert int(re.search(r"\((\d+) chunks settled", out).group(1)) > 0, out[-2000:]


@pytest.mark.parametrize("build", ["bosc_keys_test_tsan", "bosc_keys_test_asan"])
def test_bosc_keys(binaries, build, tmp_path):
    out = _run(binaries(build), tmp_path)
    assert "expired records reclaimed" in out and "full listings" in out


# (mode, producers, objects): many objects (absorbing and reuse across batches), and
# few objects hammered by more producers (claim/release races on the same nodes).
@pytest.mark.parametrize("build", ["ldu_stress_tsan", "ldu_stress_asan"])
@pytest.mark.parametrize("mode,producers,objects", [("absorb", 3, 64), ("absorb", 4, 4), ("supersede", 3, 64)])
def test_ldu_stress(binaries, build, mode, producers, objects):
    out = _run(binaries(build), SEED, mode, LDU_OPS, producers, objects)
    assert "pushes" in out


@pytest.mark.parametrize("build", ["session_test_tsan", "session_test_asan"])
def test_session(binaries, build, tmp_path):
    out = _run(binaries(build), tmp_path)
    assert "load stalls" in out


@pytest.mark.parametrize("build", ["nbd_server_test_tsan", "nbd_server_test_asan"])
def test_nbd_server(binaries, build, tmp_path):
    out = _run(binaries(build), tmp_path, 400)
    assert "block parts checked" in out


@pytest.mark.parametrize("build", ["tls_test_tsan", "tls_test_asan"])
def test_tls(binaries, build, tmp_path):
    from kvstore.tlscerts import make_certs
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (make deps installs it)")
    make_certs(str(tmp_path))
    out = _run(binaries(build), tmp_path)
    assert "writes stopped" in out and "refused:" in out
