"""kvstore.bench: drive any RESP (or memcached) server with the C load generator."""
import threading
import time

from kvstore import errors
from kvstore.errors import ConfigError
from kvstore._cstruct import as_dict
from kvstore._bench import ffi, lib  # the load generators: benchmark code, its own module


def parse_ratio(text):
    """'1:0' -> (1, 0). SET:GET."""
    try:
        s, g = (int(x) for x in str(text).split(":"))
    except ValueError:
        raise ConfigError(f"ratio: expected SET:GET as two integers such as 1:0, 1:9 or 0:1, got {text!r}") from None
    if s < 0 or g < 0 or s + g == 0:
        raise ConfigError(f"ratio: both parts must be >= 0 and not both 0, got {text!r}")
    return s, g


def run(host="127.0.0.1", port=6380, threads=2, conns=50, pipeline=1, value_size=85,
        keyspace=1_000_000, ratio="1:0", requests=0, duration=0.0, rate=0.0, protocol="resp",
        check=False, password=None, seed=1, progress=None, udp=False, timeout_ms=500, xadd=False):
    """Run one load and return a dict of struct lg_result's fields (latencies in microseconds),
    first_error as text.

    The load runs in C threads; this thread only waits (and calls progress(elapsed)
    about once a second if given). Ctrl-C stops the load early and returns what was
    measured so far.

    udp=True drives the UDP front end (--arch udp or dpdk): `conns` UDP sockets, `pipeline`
    requests in flight on each, replies matched by the frame id; the result has a
    `timeouts` count (requests whose reply never came within timeout_ms).

    xadd=True: the writes are XADD KEY * v VALUE (streams; RESP over TCP, writes only)."""
    s, g = parse_ratio(ratio)
    if protocol not in ("resp", "memcache"):
        raise ConfigError(f"protocol: expected 'resp' or 'memcache', got {protocol!r}")
    if not requests and not duration:
        raise ConfigError("give a request count (requests) or a duration in seconds, or both")
    keep = [ffi.new("char[]", host.encode())]
    cfg = ffi.new("struct lg_config *")
    cfg.host = keep[0]
    cfg.port, cfg.threads, cfg.conns, cfg.pipeline = port, threads, conns, pipeline
    cfg.value_size, cfg.keyspace, cfg.set_ratio, cfg.get_ratio = value_size, keyspace, s, g
    cfg.requests, cfg.duration, cfg.rate = requests, duration, rate
    cfg.proto = 1 if protocol == "memcache" else 0
    cfg.check = 1 if check else 0
    if xadd and (protocol != "resp" or udp or g):
        raise ConfigError("xadd: RESP over TCP, writes only (--ratio N:0)")
    cfg.xadd = 1 if xadd else 0
    if password:
        keep.append(ffi.new("char[]", password.encode()))
        cfg.password = keep[-1]
    cfg.seed = seed
    stop = ffi.new("int *")
    cfg.stop = stop
    res = ffi.new("struct lg_result *")
    box = {}

    tmo = ffi.new("uint64_t *")

    def work():  # releases the GIL for the whole run
        box["rc"] = lib.ug_run(cfg, timeout_ms, res, tmo) if udp else lib.lg_run(cfg, res)

    t = threading.Thread(target=work, name="kvstore-bench", daemon=True)
    start = time.monotonic()
    t.start()
    try:
        while t.is_alive():
            t.join(1.0)
            if progress and t.is_alive():
                progress(time.monotonic() - start)
    except KeyboardInterrupt:
        stop[0] = 1
        t.join()
    rc = box.get("rc", -1)
    errors.raise_for(rc, ffi.string(res.error).decode(errors="replace"))  # EINVAL: a bad setting
    out = as_dict(res, skip=("error",))  # error: the failed run's message, raised above
    if udp:
        out["timeouts"] = tmo[0]
    return out
