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


def _run_c(call, stop, res, progress):
    """call() (a C load generator: it releases the GIL for the whole run) in a thread, with
    progress(elapsed) about once a second; Ctrl-C sets *stop, which ends the run early with
    what was measured. A failure (rc < 0) raises with the generator's res.error."""
    box = {}

    def work():
        box["rc"] = call()

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
    errors.raise_for(box.get("rc", -1), ffi.string(res.error).decode(errors="replace"))  # EINVAL: a bad setting


def run(host="127.0.0.1", port=6380, threads=2, conns=50, pipeline=1, value_size=85,
        keyspace=1_000_000, ratio="1:0", requests=0, duration=0.0, rate=0.0, protocol="resp",
        check=False, password=None, seed=1, progress=None, udp=False, timeout_ms=500, xadd=False, batch=1,
        pull=0):
    """Run one load and return a dict of struct lg_result's fields (latencies in microseconds),
    first_error as text.

    The load runs in C threads; this thread only waits (and calls progress(elapsed)
    about once a second if given). Ctrl-C stops the load early and returns what was
    measured so far.

    udp=True drives the UDP front end (--arch udp or dpdk): `conns` UDP sockets, `pipeline`
    requests in flight on each, replies matched by the frame id; the result has a
    `timeouts` count (requests whose reply never came within timeout_ms).

    xadd=True: the writes are XADD KEY * v VALUE (streams; writes only). Over TCP each is one RESP
    XADD (pipeline sends -P at once); with udp=True each datagram carries `batch` messages for
    one stream (the front end's batch framing: one change, one reply), and `sets` counts messages.
    pull=N (udp): every request pulls a batch number below N of a stream KEY (the pull cache's
    load); hits count batches returned, misses batches that are not there."""
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
    if xadd and (protocol != "resp" or g):
        raise ConfigError("xadd: RESP, writes only (--ratio N:0)")
    if batch != 1 and not (xadd and udp):
        raise ConfigError("batch: messages per datagram of --udp --xadd; over TCP, -P pipelines XADDs")
    if pull and (not udp or xadd):
        raise ConfigError("pull: the UDP front end's pulls (--udp, not with --xadd)")
    cfg.xadd = 1 if xadd else 0
    cfg.batch = batch if xadd and udp else 0
    cfg.pull_batches = pull
    if password:
        keep.append(ffi.new("char[]", password.encode()))
        cfg.password = keep[-1]
    cfg.seed = seed
    stop = ffi.new("int *")
    cfg.stop = stop
    res = ffi.new("struct lg_result *")

    tmo = ffi.new("uint64_t *")
    _run_c(lambda: lib.ug_run(cfg, timeout_ms, res, tmo) if udp else lib.lg_run(cfg, res), stop, res, progress)
    out = as_dict(res, skip=("error",))  # error: the failed run's message, raised above
    if udp:
        out["timeouts"] = tmo[0]
    return out


def consume(host="127.0.0.1", port=6380, threads=2, conns=8, streams=64, group="g", count=100, ack=True,
            duration=0.0, max_messages=0, password=None, progress=None):
    """The message queue's read side (C, ext/bench/xgroupgen.h): conns consumers, each reading
    stream key:%012d (its number modulo streams) with XREADGROUP GROUP group c<i> COUNT count
    STREAMS key > and acknowledging each batch with XACK sent with the next read. The group
    must exist. Runs until every consumer's stream has nothing new, the duration, or
    max_messages. Returns struct xg_result's fields as a dict (messages/s in throughput)."""
    if not duration and not max_messages:
        duration = 0.0  # until drained
    keep = [ffi.new("char[]", host.encode()), ffi.new("char[]", group.encode())]
    cfg = ffi.new("struct xg_config *")
    cfg.host, cfg.group = keep[0], keep[1]
    cfg.port, cfg.threads, cfg.conns, cfg.streams = port, threads, conns, streams
    cfg.count, cfg.ack, cfg.duration, cfg.max_messages = count, 1 if ack else 0, duration, max_messages
    if password:
        keep.append(ffi.new("char[]", password.encode()))
        cfg.password = keep[-1]
    stop = ffi.new("int *")
    cfg.stop = stop
    res = ffi.new("struct xg_result *")
    _run_c(lambda: lib.xg_run(cfg, res), stop, res, progress)
    return as_dict(res, skip=("error",))


def mqtt(host="127.0.0.1", port=1883, threads=2, conns=8, qos=0, window=16, msg_size=85, topics=64,
         duration=0.0, messages=0, seed=1, subscribers=0, sub_qos=0, progress=None):
    """MQTT 3.1.1 publishers and subscribers (C, ext/bench/mqttgen.h): conns clients publishing
    msg_size-byte messages to topics t/<i mod topics>, `window` in flight each (QoS 1 and 2:
    unacknowledged PUBLISHes; QoS 0: rounds closed by a PINGREQ/PINGRESP), and `subscribers`
    clients subscribed to t/# with QoS sub_qos, each receiving every message (latency: publish
    to delivery). Returns struct mq_result's fields."""
    if not duration and not messages:
        raise ConfigError("give a duration in seconds or a message count, or both")
    keep = [ffi.new("char[]", host.encode())]
    cfg = ffi.new("struct mq_config *")
    cfg.host = keep[0]
    cfg.port, cfg.threads, cfg.conns, cfg.qos, cfg.window = port, threads, conns, qos, window
    cfg.msg_size, cfg.topics, cfg.duration, cfg.messages, cfg.seed = msg_size, topics, duration, messages, seed
    cfg.subscribers, cfg.sub_qos = subscribers, sub_qos
    stop = ffi.new("int *")
    cfg.stop = stop
    res = ffi.new("struct mq_result *")
    _run_c(lambda: lib.mq_run(cfg, res), stop, res, progress)
    return as_dict(res, skip=("error",))


def pull_xdp(ifname, dst_mac, src_addr, dst_addr, port, streams=4, batches=100, window=128, duration=2.0,
             warmup=0.3, cpu=-1, progress=None):
    """UDP pulls of batches 0 .. batches-1 of streams key:%012d from a server at dst_addr:port
    behind the veth end ifname (whose peer, with MAC dst_mac, runs XDP), written and sent by an
    XDP program and their answers taken by another before the network stack
    (ext/bench/pullgen.h: the pull experiment's generator; root). At most `window` pulls in
    flight; the generator's threads run on CPU `cpu` (-1: wherever this thread may). Returns
    struct pg_result's fields: answers per second in throughput, latencies in microseconds."""
    keep = [ffi.new("char[]", str(v).encode()) for v in (ifname, dst_mac, src_addr, dst_addr)]
    cfg = ffi.new("struct pg_config *")
    cfg.ifname, cfg.dst_mac, cfg.src_addr, cfg.dst_addr = keep
    cfg.dst_port, cfg.streams, cfg.batches, cfg.window = port, streams, batches, window
    cfg.duration, cfg.warmup, cfg.cpu = duration, warmup, cpu
    stop = ffi.new("int *")
    cfg.stop = stop
    res = ffi.new("struct pg_result *")
    _run_c(lambda: lib.pg_run(cfg, res), stop, res, progress)
    return as_dict(res, skip=("error",))
