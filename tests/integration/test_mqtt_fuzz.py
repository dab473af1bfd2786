"""MQTT front end under random and mutated input: the server must survive anything a client
sends, answer only with well-formed packets, close the connections it gives up on, and keep
serving everyone else.

Each case is one fresh TCP connection to the MQTT port: optionally a valid CONNECT first, then
the case's bytes (valid CONNECT / PUBLISH / SUBSCRIBE / ... packets with bytes flipped, cut,
inserted, the type byte replaced, or the remaining length replaced by an edge case: five
varint bytes 0x80 0x80 0x80 0x80 0x01, 127/128/16383/16384 boundaries, lengths longer or
shorter than the data), then a FIN. Per case the oracle is: everything the server sent parses
as a sequence of packets a server may send (type, fixed-header flags and lengths as 3.x.1
fixes them; a CONNACK only first and only once), and the server closes the connection after
the FIN (within a generous timeout; no hang). After each batch a separate paho client still
publishes and receives, RESP still answers PING, and the number of MQTT connections the server
reports goes back to what it was (nothing leaked); at the end the server process is alive.

Randomness is random.Random(seed) with fixed seeds: a failure names its seed and case index
and is reproduced by running the test again. Counts are bounded (a few hundred cases a test)
so that the file runs in seconds."""
import queue
import random
import socket
import struct
import threading
import time

import paho.mqtt.client as paho
import pytest
import redis
from paho.mqtt.enums import CallbackAPIVersion

from helpers import mqttwire as w
from helpers.servers import start_node, stop_node

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 20.0
CASES = 300      # per fuzz test
BATCH = 100      # cases between health checks


# ---------------------------------------------------------------- server and witness

@pytest.fixture(scope="module")
def node():
    n = start_node(mqtt_port=0, threads=2)
    yield n
    assert n.proc.poll() is None, "the server process died during the fuzz tests:\n" + n.log()[-3000:]
    stop_node(n)


@pytest.fixture(scope="module")
def r(node):
    with redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=TIMEOUT) as c:
        yield c


class Witness:
    """A paho client (its own session) that publishes to itself: the server still serves."""

    def __init__(self, port):
        self.topic = f"fuzz-witness/{time.monotonic_ns()}"
        self.n = 0
        self.msgs = queue.Queue()
        self.connected = queue.Queue()
        self.subacked = queue.Queue()
        self.c = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=f"fuzz-witness-{id(self)}",
                             clean_session=True, protocol=paho.MQTTv311)
        self.c.on_connect = lambda cl, ud, flags, rc, props: self.connected.put(rc)
        self.c.on_message = lambda cl, ud, msg: self.msgs.put(msg)
        self.c.on_subscribe = lambda cl, ud, mid, codes, props: self.subacked.put(mid)
        self.c.connect("127.0.0.1", port, 60)
        self.c.loop_start()
        assert self.connected.get(timeout=TIMEOUT) == 0
        self.c.subscribe(self.topic, 1)
        self.subacked.get(timeout=TIMEOUT)

    def roundtrip(self):
        self.n += 1
        payload = f"alive-{self.n}".encode()
        info = self.c.publish(self.topic, payload, qos=1)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), "witness: PUBLISH not acknowledged"
        deadline = time.monotonic() + TIMEOUT
        while True:
            m = self.msgs.get(timeout=max(0.01, deadline - time.monotonic()))
            if m.payload == payload:
                return

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


@pytest.fixture(scope="module")
def witness(node):
    wc = Witness(node.mqtt_port)
    yield wc
    wc.close()


def healthy(node, r, witness, baseline=None):
    """The server is up and serving: process alive, RESP PING, an MQTT round trip; and (with
    a baseline) its MQTT connection count back down to it: every fuzz connection was let go."""
    assert node.proc.poll() is None, "server process exited:\n" + node.log()[-3000:]
    assert r.ping()
    witness.roundtrip()
    if baseline is not None:
        deadline = time.monotonic() + TIMEOUT
        while r.info("mqtt")["mqtt_connections"] > baseline:
            assert time.monotonic() < deadline, \
                f"mqtt_connections stays at {r.info('mqtt')['mqtt_connections']} (baseline {baseline})"
            time.sleep(0.05)


@pytest.fixture
def baseline(r, witness):
    """MQTT connections open before the test (the witness's)."""
    return r.info("mqtt")["mqtt_connections"]


# ---------------------------------------------------------------- what a server may send

def check_server_stream(buf, complete):
    """Parse what the server sent: a list of (type, flags, body); fails the test on anything a
    server must not send. complete: the stream ended with a FIN (not a reset), so no packet
    may be cut short."""
    out, i = [], 0
    while i < len(buf):
        if len(buf) - i < 2:
            assert not complete, f"server sent a truncated packet: {buf[i:]!r}"
            break
        first = buf[i]
        length, mult, j = 0, 1, i + 1
        while True:
            if j >= len(buf):
                assert not complete, f"server sent a truncated remaining length: {buf[i:]!r}"
                return out
            b = buf[j]
            length += (b & 127) * mult
            mult *= 128
            j += 1
            if not b & 128:
                break
            assert j - i - 1 < 4, f"server sent a remaining length of more than 4 bytes: {buf[i:j + 1]!r}"
        if j + length > len(buf):
            assert not complete, f"server sent a packet shorter than its remaining length: {buf[i:]!r}"
            break
        ptype, flags, body = first >> 4, first & 15, buf[j:j + length]
        i = j + length
        if ptype == w.CONNACK:
            assert flags == 0 and len(body) == 2 and body[0] in (0, 1) and body[1] <= 5, body
            assert not out, "CONNACK not the first packet, or sent twice"
            assert body[1] == 0 or body[0] == 0, "session present with a refusal (3.2.2-4)"
        elif ptype == w.PUBLISH:
            qos = (flags >> 1) & 3
            assert qos != 3, "PUBLISH with QoS 3"
            assert qos or not flags & 8, "QoS 0 PUBLISH with DUP"
            assert len(body) >= 2
            (tlen,) = struct.unpack(">H", body[:2])
            assert 2 + tlen + (2 if qos else 0) <= len(body), "PUBLISH shorter than its topic"
            topic = body[2:2 + tlen]
            assert tlen and b"+" not in topic and b"#" not in topic and b"\0" not in topic, topic
            topic.decode()  # UTF-8
            if qos:
                assert body[2 + tlen:4 + tlen] != b"\0\0", "PUBLISH with packet id 0"
        elif ptype in (w.PUBACK, w.PUBREC, w.PUBCOMP, w.UNSUBACK):
            assert flags == 0 and len(body) == 2 and body != b"\0\0", (ptype, flags, body)
        elif ptype == w.PUBREL:
            assert flags == 2 and len(body) == 2 and body != b"\0\0", (ptype, flags, body)
        elif ptype == w.SUBACK:
            assert flags == 0 and len(body) >= 3 and body[:2] != b"\0\0", body
            assert all(c in (0, 1, 2, 0x80) for c in body[2:]), body
        elif ptype == w.PINGRESP:
            assert flags == 0 and body == b"", body
        else:
            raise AssertionError(f"server sent packet type {ptype} (only a client sends it, or reserved)")
        out.append((ptype, flags, body))
    if out:
        assert out[0][0] == w.CONNACK, f"server sent {out[0][0]} before any CONNACK"
    return out


def run_case(port, data, chunks=1, timeout=TIMEOUT, connect=None):
    """One connection: send data (in `chunks` writes), then FIN; read until the server closes.
    Returns the packets it sent (checked). Fails if the server does not close in time.
    connect: a CONNECT sent first, its CONNACK waited for (and checked with the rest)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf, complete = b"", True
    try:
        if connect:
            s.sendall(connect)
            while len(buf) < 4:
                chunk = s.recv(4 - len(buf))
                assert chunk, "closed instead of a CONNACK"
                buf += chunk
            assert buf[:2] == b"\x20\x02" and buf[3] == 0, f"not an accepting CONNACK: {buf!r}"
        try:
            if chunks <= 1:
                s.sendall(data)
            else:
                step = max(1, len(data) // chunks)
                for k in range(0, len(data), step):
                    s.sendall(data[k:k + step])
            s.shutdown(socket.SHUT_WR)
        except OSError:  # EPIPE, ECONNRESET, ENOTCONN: the server closed first (it read enough to give up)
            complete = False
        deadline = time.monotonic() + timeout
        while True:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                raise AssertionError(f"server did not close the connection within {timeout}s after the "
                                     f"client's FIN; sent {data[:200]!r}") from None
            except ConnectionResetError:
                complete = False
                break
            if not chunk:
                break
            buf += chunk
    finally:
        s.close()
    return check_server_stream(buf, complete)


# ---------------------------------------------------------------- valid packets to mutate
# (first byte, body): the remaining length is computed, or replaced by a mutation

def pkt(first, body):
    return bytes([first]) + w.varint(len(body)) + body


def connect_parts(rng, tag):
    cid = f"fz-{tag}-{rng.randrange(1 << 30)}"
    kw = rng.choice([
        dict(),
        dict(clean=False),
        dict(keepalive=0),
        dict(will=(f"fz/will/{tag}", b"w", rng.randrange(3), rng.random() < 0.5)),
        dict(user="u", password="p"),
        dict(user="u"),
        dict(will=("fz/w2", b"x" * 40, 1, False), user="user", password=b"\x00\xff"),
    ])
    return (w.CONNECT << 4, w.connect_body(cid, **kw))


def other_parts(rng, tag):
    topic = rng.choice([f"fz/{tag}", f"fz/{tag}/a/b", "fz/$x", f"fz/{tag}/" + "é" * 3, "fz"])
    payload = rng.randbytes(rng.choice([0, 1, 5, 100, 300]))
    q = rng.randrange(3)
    pid = rng.randrange(1, 65536)
    choices = [
        lambda: ((w.PUBLISH << 4) | (q << 1) | rng.randrange(2),
                 w.s(topic) + (struct.pack(">H", pid) if q else b"") + payload),
        lambda: ((w.SUBSCRIBE << 4) | 2, struct.pack(">H", pid) + b"".join(
            w.s(f) + bytes([rng.randrange(3)]) for f in rng.sample(
                ["fz/#", f"fz/{tag}/+", "fz/+/a/#", f"fz/{tag}", "+/x", "$SYS/#"], rng.randrange(1, 4)))),
        lambda: ((w.UNSUBSCRIBE << 4) | 2, struct.pack(">H", pid) + w.s(f"fz/{tag}") + w.s("fz/#")),
        lambda: ((w.PUBACK << 4), struct.pack(">H", pid)),
        lambda: ((w.PUBREC << 4), struct.pack(">H", pid)),
        lambda: ((w.PUBREL << 4) | 2, struct.pack(">H", pid)),
        lambda: ((w.PUBCOMP << 4), struct.pack(">H", pid)),
        lambda: ((w.PINGREQ << 4), b""),
        lambda: ((w.DISCONNECT << 4), b""),
        lambda: connect_parts(rng, tag),
    ]
    return rng.choice(choices)()


EDGE_LENGTHS = [
    b"\x80\x80\x80\x80\x01",   # five bytes: more than 2.2.3 allows
    b"\xff\xff\xff\xff\x7f",
    b"\xff\xff\xff\x7f",       # 268435455, the largest
    b"\x80\x80\x80\x80",       # continuation never ends
    b"\x80", b"\xff",          # cut after a continuation byte
    b"\x00", b"\x01", b"\x7f", b"\x80\x01", b"\xff\x7f", b"\x80\x80\x01",  # 0, 1, 127, 128, 16383, 16384
    b"\x80\x00", b"\x81\x80\x00",  # longer than needed (non-minimal)
    w.varint(1 << 20), w.varint((1 << 20) + 1), w.varint(2097151), w.varint(2097152),
]


def mutate(rng, first, body):
    """Bytes of a packet built from (first, body) with one to three mutations."""
    length = w.varint(len(body))
    data_first, data_len, data_body = bytes([first]), length, bytearray(body)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        op = rng.randrange(8)
        if op == 0 and data_body:  # flip bytes of the body
            for _ in range(rng.randrange(1, 4)):
                k = rng.randrange(len(data_body))
                data_body[k] ^= rng.randrange(1, 256)
        elif op == 1:  # cut the body short (the length stays)
            data_body = data_body[:rng.randrange(len(data_body) + 1)]
        elif op == 2:  # insert bytes
            k = rng.randrange(len(data_body) + 1)
            data_body[k:k] = rng.randbytes(rng.randrange(1, 8))
        elif op == 3:  # an edge-case remaining length
            data_len = rng.choice(EDGE_LENGTHS)
        elif op == 4:  # a length off by a little
            data_len = w.varint(max(0, len(data_body) + rng.choice([-3, -2, -1, 1, 2, 3, 100])))
        elif op == 5:  # another type / flags
            data_first = bytes([rng.randrange(256)])
        elif op == 6:  # flip a flag bit only
            data_first = bytes([data_first[0] ^ (1 << rng.randrange(4))])
        else:  # the body's length prefix of a field
            if len(data_body) >= 2:
                k = rng.randrange(len(data_body) - 1)
                data_body[k:k + 2] = rng.choice([b"\xff\xff", b"\x00\x00", b"\x00\x01", b"\x7f\xff"])
    return data_first + data_len + bytes(data_body)


def valid_connect(tag):
    return w.connect(f"fz-{tag}", clean=True, keepalive=30)


def fuzz(node, r, witness, baseline, seed, make_case):
    rng = random.Random(seed)
    for i in range(CASES):
        data, chunks = make_case(rng, i)
        try:
            run_case(node.mqtt_port, data, chunks)
        except AssertionError as e:
            raise AssertionError(f"seed {seed} case {i}: {e}") from None
        if (i + 1) % BATCH == 0:
            healthy(node, r, witness)
    healthy(node, r, witness, baseline)


# ---------------------------------------------------------------- fuzz tests

SEEDS = [1, 2, 3]


@pytest.mark.parametrize("seed", SEEDS)
def test_fuzz_mutated_connect_as_first_packet(node, r, witness, baseline, seed):
    def case(rng, i):
        first, body = connect_parts(rng, f"c{i}")
        data = mutate(rng, first, body)
        if rng.random() < 0.3:  # and something after it
            data += pkt(*other_parts(rng, f"c{i}"))
        return data, 1
    fuzz(node, r, witness, baseline, 1000 + seed, case)


@pytest.mark.parametrize("seed", SEEDS)
def test_fuzz_mutated_packets_after_a_valid_connect(node, r, witness, baseline, seed):
    def case(rng, i):
        tag = f"p{i}"
        data = valid_connect(tag)
        for _ in range(rng.randrange(3)):  # some valid traffic first
            data += pkt(*other_parts(rng, tag))
        data += mutate(rng, *other_parts(rng, tag))
        if rng.random() < 0.5:
            data += w.pingreq()
        return data, rng.choice([1, 1, 2, 7])
    fuzz(node, r, witness, baseline, 2000 + seed, case)


@pytest.mark.parametrize("seed", SEEDS)
def test_fuzz_random_bytes(node, r, witness, baseline, seed):
    def case(rng, i):
        junk = rng.randbytes(rng.randrange(1, 80))
        if rng.random() < 0.5:
            return valid_connect(f"r{i}") + junk, 1
        return junk, 1
    fuzz(node, r, witness, baseline, 3000 + seed, case)


def test_fuzz_valid_sessions_cut_into_random_pieces(node, r, witness, baseline):
    """Valid packets split at random points into separate writes: the server reassembles them
    and answers each as if it had come whole."""
    rng = random.Random(4004)
    port = node.mqtt_port
    for i in range(60):
        tag = f"v{i}"
        topic = f"fz/split/{tag}"
        data = w.connect(f"fz-{tag}") + w.subscribe(1, [(f"fz/split/{tag}/none", 1)])
        want = [(w.CONNACK, None), (w.SUBACK, 1)]
        for k in range(rng.randrange(1, 6)):
            pid = 10 + k
            q = rng.randrange(3)
            payload = rng.randbytes(rng.choice([0, 3, 126, 127, 128, 16383 - 20, 16384]))
            data += w.publish(topic, payload, qos=q, pid=pid)
            if q == 1:
                want.append((w.PUBACK, pid))
            elif q == 2:
                data += w.pubrel(pid)
                want += [(w.PUBREC, pid), (w.PUBCOMP, pid)]
        data += w.pingreq() + w.unsubscribe(2, [f"fz/split/{tag}/none"]) + w.disconnect()
        want += [(w.PINGRESP, None), (w.UNSUBACK, 2)]
        c = w.RawMqtt(port, timeout=TIMEOUT)
        try:
            cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randrange(1, 12))))
            prev = 0
            for cut in cuts + [len(data)]:
                c.send(data[prev:cut])
                prev = cut
                if rng.random() < 0.2:
                    time.sleep(0.001)
            got = []
            for _ in want:
                p = c.read()
                got.append((p.type, None if p.type in (w.CONNACK, w.PINGRESP) else p.pid))
            assert got == want, f"case {i}"
            assert c.closed_within(TIMEOUT), f"case {i}: not closed after DISCONNECT"
        finally:
            c.close()
    healthy(node, r, witness, baseline)


def test_fuzz_concurrent_connections(node, r, witness, baseline):
    """The same kinds of cases from several threads at once: connections on both pollers,
    subscriptions, publishes, wills and garbage interleaved (the broker's shared tables)."""
    errors = []

    def worker(k):
        rng = random.Random(7000 + k)
        try:
            for i in range(CASES // 4):
                tag = f"t{k}-{i}"
                if rng.random() < 0.3:
                    first, body = connect_parts(rng, tag)
                    data = mutate(rng, first, body)
                else:
                    data = valid_connect(tag)
                    for _ in range(rng.randrange(5)):
                        data += pkt(*other_parts(rng, tag))
                    if rng.random() < 0.7:
                        data += mutate(rng, *other_parts(rng, tag))
                run_case(node.mqtt_port, data, rng.choice([1, 2]))
        except BaseException as e:  # (reported by the main thread)
            errors.append(f"worker {k}: {e!r}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        witness.roundtrip()  # served all along
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert not errors, errors
    healthy(node, r, witness, baseline)


def test_fuzz_persistent_sessions_survive_garbage(node, r, witness, baseline):
    """Persistent sessions (clean session 0) from a small pool of client ids -- so connections
    resume and take over each other's sessions -- each sent valid then mutated packets. Then
    every id connects properly: its session is there (session present), usable, and ends."""
    rng = random.Random(6006)
    ids = [f"fz-pers-{k}" for k in range(6)]
    for i in range(CASES):
        cid = rng.choice(ids)
        tag = f"s{i}"
        data = b""
        for _ in range(rng.randrange(4)):
            data += pkt(*other_parts(rng, tag))
        data += mutate(rng, *other_parts(rng, tag))
        holder = None
        if rng.random() < 0.08:  # the id is connected elsewhere: this case takes it over (~0.2 s each)
            holder = w.RawMqtt(node.mqtt_port, timeout=TIMEOUT)
            holder.connect(cid, clean=False)
        try:
            out = run_case(node.mqtt_port, data, rng.choice([1, 3]), connect=w.connect(cid, clean=False, keepalive=30))
            if holder:
                assert holder.closed_within(TIMEOUT), "the connection taken over was not closed"
        except AssertionError as e:
            raise AssertionError(f"case {i}: {e}") from None
        finally:
            if holder:
                holder.close()
        if (i + 1) % BATCH == 0:
            healthy(node, r, witness)
    for cid in ids:
        c = w.RawMqtt(node.mqtt_port, timeout=TIMEOUT)
        try:
            assert c.connect(cid, clean=False).session_present == 1, cid
            c.send(w.subscribe(1, [("fz/pers/check", 1)]))
            while True:  # deliveries and resent PUBLISH/PUBREL of its session may come first
                p = c.read()
                if p.type == w.SUBACK:
                    break
                assert p.type in (w.PUBLISH, w.PUBREL), p
            assert p.codes == [1]
            c.send(w.pingreq())
            while c.read().type != w.PINGRESP:
                pass
        finally:
            c.close()
        c = w.RawMqtt(node.mqtt_port, timeout=TIMEOUT)
        try:
            assert c.connect(cid, clean=True).session_present == 0
        finally:
            c.close()
    healthy(node, r, witness, baseline)


@pytest.mark.parametrize("length", [0, 1, 127, 128, 16383, 16384, 65535, 200000])
def test_remaining_length_boundaries_are_framed_right(node, r, length):
    """A PUBLISH whose remaining length sits on a varint boundary (1/2/3-byte encodings) is
    taken whole: PUBACK, and the stream holds exactly its payload."""
    topic = f"fz/len/{length}"
    head = w.s(topic) + struct.pack(">H", 1)
    if length < len(head):  # too short to be a QoS 1 PUBLISH: a QoS 0 one with a cut topic, malformed
        c = w.RawMqtt(node.mqtt_port, timeout=TIMEOUT)
        c.connect("fz-len-short")
        c.send(w.packet(w.PUBLISH, 2, head[:length]))
        assert c.closed_within(10)
        c.close()
        return
    payload = bytes((i * 7) & 255 for i in range(length - len(head)))
    p = w.packet(w.PUBLISH, 2, head + payload)
    assert p[1:1 + len(w.varint(length))] == w.varint(length)
    c = w.RawMqtt(node.mqtt_port, timeout=TIMEOUT)
    try:
        c.connect(f"fz-len-{length}")
        c.send(p)
        assert c.expect(w.PUBACK).pid == 1
        ping_ok = c.send(w.pingreq()) and c.expect(w.PINGRESP)
        assert ping_ok
    finally:
        c.close()
    e = r.xrange("mqtt:" + topic)
    assert [f[b"payload"] for _id, f in e] == [payload]


def test_remaining_length_edge_encodings(node, r, witness, baseline):
    """The fixed header's length itself: five bytes (0x80 0x80 0x80 0x80 0x01) and more than
    the maximum packet close the connection; a length longer than the data sent so far makes
    the server wait for the rest (the connection stays, the packet completes later)."""
    port = node.mqtt_port
    for bad in (b"\x30\x80\x80\x80\x80\x01", b"\x30\xff\xff\xff\xff\x7f", b"\x82\x80\x80\x80\x80\x01",
                b"\x30\xff\xff\xff\x7f", b"\x30" + w.varint((1 << 20) + 1)):
        for with_connect in (True, False):
            c = w.RawMqtt(port, timeout=TIMEOUT)
            try:
                if with_connect:
                    c.connect("fz-edge")
                c.send(bad)
                assert c.closed_within(10), f"{bad!r} (after CONNECT: {with_connect}): still open"
            finally:
                c.close()
    # longer than the data: the rest arrives later, byte by byte
    topic = "fz/edge/late"
    p = w.publish(topic, b"L" * 300, qos=1, pid=42)
    c = w.RawMqtt(port, timeout=TIMEOUT)
    try:
        c.connect("fz-late")
        c.send(p[:20])
        with pytest.raises(TimeoutError):
            c.read(0.3)  # nothing to answer yet, and not closed
        for k in range(20, len(p), 37):
            c.send(p[k:k + 37])
        assert c.expect(w.PUBACK).pid == 42
        c.send(w.pingreq())
        c.expect(w.PINGRESP)
    finally:
        c.close()
    assert [f[b"payload"] for _id, f in r.xrange("mqtt:" + topic)] == [b"L" * 300]
    healthy(node, r, witness, baseline)


def test_many_half_sent_packets_do_not_block_others(node, r, witness, baseline):
    """Connections that stop in the middle of a packet (header only, a claimed length never
    delivered) hold nothing up: the others are served meanwhile; when they go, they are gone."""
    rng = random.Random(5005)
    socks = []
    try:
        for i in range(40):
            s = socket.create_connection(("127.0.0.1", node.mqtt_port), timeout=TIMEOUT)
            part = rng.choice([b"\x10", b"\x10\xff", valid_connect(f"h{i}")[:7],
                               valid_connect(f"h{i}") + b"\x30\xff\x7f" + b"x" * 10,
                               valid_connect(f"h{i}") + b"\x82"])
            s.sendall(part)
            socks.append(s)
        healthy(node, r, witness)
    finally:
        for s in socks:
            s.close()
    healthy(node, r, witness, baseline)


def test_server_alive_at_the_end(node, r, witness):
    assert node.proc.poll() is None
    assert node.health()
    assert r.ping()
    info = r.info("mqtt")
    assert info["mqtt_malformed_packets"] > 0  # the fuzz cases were seen as such
    witness.roundtrip()
