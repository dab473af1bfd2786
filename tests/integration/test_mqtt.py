"""MQTT 3.1.1 front end (--mqtt-port; ext/frontend/mqtt_*.c, ext/proto/mqtt.c) checked from
outside, against the OASIS MQTT 3.1.1 standard (section numbers below are its) and the
broker's own rules (topics are streams: a PUBLISH to T is an entry of the stream mqtt:T, an
XADD to mqtt:T reaches the subscribers of T).

Three kinds of client drive real servers started with start_node(mqtt_port=0):
  - paho-mqtt (a full client library, MQTT v3.1.1) for ordinary publish/subscribe traffic,
    retained messages, persistent sessions;
  - mosquitto_pub / mosquitto_sub (Debian's command-line clients) as separate processes,
    each bounded by a timeout;
  - RawMqtt (tests/helpers/mqttwire.py), a socket that sends exact bytes, for what a library
    will not send: packets a step at a time (the QoS 2 handshake, a PUBLISH resent with DUP,
    a PUBLISH left unacknowledged), bad CONNECTs, malformed packets, silence (keep alive),
    and a connection cut without DISCONNECT (the will).
What the server did is then read back both ways: over MQTT, and over RESP (redis-py) --
XRANGE of the topic's stream, GET of the retained key, INFO mqtt's counters.

Most tests share one server (2 pollers, durability none) and keep out of each other's way
with topics and client ids of their own; those that need particular settings (requirepass,
mqtt_max_packet, a disk log to restart from) or exact topic sets (the wildcard table, which
subscribes '#') start their own. Nothing depends on timing except upper bounds: every wait
for something that should happen is generous (TIMEOUT) and ends as soon as it happens; a
check that something does NOT happen waits a short grace period after a later event that
proves the server got that far (a message on the same stream, a CONNACK of the same id)."""
import itertools
import os
import queue
import shutil
import signal
import subprocess
import threading
import time

import paho.mqtt.client as paho
import pytest
import redis
from paho.mqtt.enums import CallbackAPIVersion

from kvstore.config import ServerConfig
from kvstore.errors import ConfigError, ServerError

from helpers import mqttwire as w
from helpers.servers import need, start_node, stop_node

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 20.0   # the most any wait for something that should happen takes
GRACE = 0.5      # how long a check that nothing (more) arrives waits
PREFIX = "mqtt:"
RETAINED = "mqtt-retained"  # the hash of retained messages: field topic, value QoS byte + payload

_ids = itertools.count()


def uid(tag):
    """A client id / topic level no other test (or earlier run against this server) uses."""
    return f"{tag}-{os.getpid()}-{next(_ids)}"


def wait_until(pred, timeout=TIMEOUT, interval=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def next_ms():
    """Let the wall clock pass the millisecond of what was just published. The server starts a
    subscription at the millisecond of its SUBSCRIBE (stream IDs are ms-seq), so a message stored
    earlier in that same millisecond is delivered to it as if it came after (see
    test_subscription_gets_only_messages_published_after_it, which checks exactly that): tests
    about something else (retained messages, wills) subscribe a millisecond later."""
    time.sleep(0.005)


def entries(r, topic):
    """The fields of the entries of topic's stream, oldest first (bytes -> bytes)."""
    return [fields for _id, fields in r.xrange(PREFIX + topic)]


def mqtt_info(r):
    return r.info("mqtt")


# ---------------------------------------------------------------- servers

@pytest.fixture(scope="module")
def node():
    n = start_node(mqtt_port=0, threads=2)
    yield n
    stop_node(n)


@pytest.fixture(scope="module")
def r(node):
    with redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=TIMEOUT) as c:
        yield c


@pytest.fixture
def own_node(kv_node_factory):
    """A server of its own for one test, MQTT on (settings as start_node's); stopped after."""
    return lambda **settings: kv_node_factory(**{"mqtt_port": 0, **settings})


# ---------------------------------------------------------------- clients

class Paho:
    """A connected paho-mqtt client (MQTT v3.1.1, its network loop in a thread) whose
    received messages queue up in .messages. connect() waits for the CONNACK."""

    def __init__(self, port, client_id=None, clean=True, will=None, username=None, password=None, keepalive=60):
        self.client_id = uid("paho") if client_id is None else client_id
        self.c = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=self.client_id,
                             clean_session=clean, protocol=paho.MQTTv311)
        self.messages = queue.Queue()
        self._connack = queue.Queue()
        self._acks = {}
        self._cv = threading.Condition()
        self.c.on_connect = lambda cl, ud, flags, rc, props: self._connack.put((flags.session_present, rc))
        self.c.on_message = lambda cl, ud, msg: self.messages.put(msg)
        self.c.on_subscribe = self._on_ack
        self.c.on_unsubscribe = self._on_ack
        if will:
            self.c.will_set(*will)
        if username is not None or password is not None:
            self.c.username_pw_set(username or "", password)
        self.c.connect("127.0.0.1", port, keepalive)
        self.c.loop_start()
        try:
            self.session_present, rc = self._connack.get(timeout=TIMEOUT)
        except queue.Empty:
            self.close()
            raise AssertionError(f"{self.client_id}: no CONNACK") from None
        assert rc == 0, f"{self.client_id}: CONNACK {rc}"

    def _on_ack(self, cl, ud, mid, codes, props):
        with self._cv:
            self._acks[mid] = [getattr(c, "value", c) for c in codes]
            self._cv.notify_all()

    def _wait_ack(self, mid):
        with self._cv:
            assert self._cv.wait_for(lambda: mid in self._acks, TIMEOUT), f"no acknowledgement of mid {mid}"
            return self._acks.pop(mid)

    def subscribe(self, *filters):
        """filters: (filter, qos) pairs; waits for the SUBACK, returns its return codes."""
        rc, mid = self.c.subscribe(list(filters))
        assert rc == 0
        return self._wait_ack(mid)

    def unsubscribe(self, *filters):
        rc, mid = self.c.unsubscribe(list(filters))
        assert rc == 0
        self._wait_ack(mid)

    def publish(self, topic, payload, qos=0, retain=False):
        """Publish and wait until it is acknowledged (QoS 1, 2) or sent (QoS 0)."""
        info = self.c.publish(topic, payload, qos=qos, retain=retain)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), f"{self.client_id}: publish to {topic} not acknowledged"

    def get(self, timeout=TIMEOUT):
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: no message within {timeout}s") from None

    def assert_quiet(self, wait=GRACE):
        """Nothing (more) arrives within wait seconds."""
        try:
            m = self.messages.get(timeout=wait)
        except queue.Empty:
            return
        raise AssertionError(f"{self.client_id}: unexpected message {m.topic} {m.payload!r}")

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


@pytest.fixture
def clients():
    """Make Paho clients (Paho's arguments); all are closed after the test."""
    made = []

    def make(*a, **kw):
        c = Paho(*a, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def raws():
    """Make RawMqtt connections; all are closed after the test."""
    made = []

    def make(port):
        c = w.RawMqtt(port, timeout=TIMEOUT)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def raw_session(make, port, client_id=None, **kw):
    """A RawMqtt connection after an accepted CONNECT (kw: connect_body's)."""
    c = make(port)
    c.connack = c.connect(uid("raw") if client_id is None else client_id, **kw)
    return c


def next_publish(c, timeout=TIMEOUT, ack=True):
    """The next PUBLISH a raw connection receives, acknowledged as its QoS asks (PUBACK;
    PUBREC, and PUBCOMP for the PUBREL that follows) unless ack is False. PUBRELs before it
    are answered; any other packet fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        p = c.read(max(0.001, deadline - time.monotonic()))
        if p.type == w.PUBREL:
            assert p.flags == 2, f"PUBREL with flags {p.flags:#x} (3.6.1: 0010)"
            c.send(w.pubcomp(p.pid))
            continue
        assert p.type == w.PUBLISH, f"expected PUBLISH, got {p!r}"
        if ack and p.qos == 1:
            c.send(w.puback(p.pid))
        elif ack and p.qos == 2:
            c.send(w.pubrec(p.pid))
        return p


def expect_answering_pubrel(c, ptype):
    """The next packet other than a PUBREL (which is answered with PUBCOMP): of type ptype."""
    while True:
        p = c.read()
        if p.type == w.PUBREL:
            c.send(w.pubcomp(p.pid))
            continue
        assert p.type == ptype, f"expected packet type {ptype}, got {p!r}"
        return p


def assert_no_publish(c, wait=GRACE):
    try:
        p = c.read(wait)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected packet {p!r}")


def ping_ok(c):
    """The raw connection is served: PINGREQ is answered by PINGRESP (3.12.4)."""
    assert c.send(w.pingreq())
    p = c.expect(w.PINGRESP)
    assert p.flags == 0 and p.body == b""


# mosquitto_pub / mosquitto_sub

def mosq_pub(port, topic, *args):
    need("mosquitto_pub")
    return subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-t", topic, *args],
                          capture_output=True, text=True, timeout=TIMEOUT + 10)


class MosqSub:
    """mosquitto_sub -d -v as a child process whose output lines are collected by a thread;
    wait_subscribed() returns once it printed that the SUBACK came."""

    running = []  # every one started: killed after each test (reap_mosquitto_sub)

    def __init__(self, port, *args):
        need("mosquitto_sub")
        # stdbuf: its output is a pipe here, line-buffer it so lines come as they are printed
        line = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []
        self.p = subprocess.Popen(line + ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-d", "-v", *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.subscribed = threading.Event()
        MosqSub.running.append(self)
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))
            if "received SUBACK" in line:
                self.subscribed.set()

    def wait_subscribed(self):
        assert self.subscribed.wait(TIMEOUT), "mosquitto_sub got no SUBACK:\n" + "\n".join(self.lines)

    def wait(self):
        """Its exit code (it must exit within the timeout), all its output read."""
        try:
            rc = self.p.wait(TIMEOUT + 10)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
        self.t.join(10)
        return rc

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()
        self.t.join(10)


@pytest.fixture(autouse=True)
def reap_mosquitto_sub():
    """No mosquitto_sub outlives its test, also when the test failed before waiting for it."""
    yield
    while MosqSub.running:
        MosqSub.running.pop().kill()


# ================================================================ publishing into streams

def test_paho_publish_is_an_entry_of_the_topic_stream(node, r, clients):
    """A PUBLISH to T appends to stream mqtt:T, in order, fields payload/qos/retain/client/at."""
    topic = f"pub/{uid('t')}/x"
    c = clients(node.mqtt_port)
    binary = bytes(range(256))  # any bytes: payloads are binary (3.3.3)
    before = int(time.time() * 1000)
    c.publish(topic, b"zero", qos=0)
    c.publish(topic, binary, qos=1)
    c.publish(topic, b"two", qos=2)
    c.publish(topic, b"kept", qos=1, retain=True)
    after = int(time.time() * 1000)
    got = entries(r, topic)  # QoS 0 ran before the acknowledged ones: one connection is in order
    assert [e[b"payload"] for e in got] == [b"zero", binary, b"two", b"kept"]
    assert [e[b"qos"] for e in got] == [b"0", b"1", b"2", b"1"]
    assert [e[b"retain"] for e in got] == [b"0", b"0", b"0", b"1"]
    assert {e[b"client"] for e in got} == {c.client_id.encode()}
    for e in got:
        assert set(e) == {b"payload", b"qos", b"retain", b"client", b"at"}
        # the server's receive time in Unix ms (loose bounds: clocks, not speed)
        assert before - 60_000 <= int(e[b"at"]) <= after + 60_000
    assert r.type(PREFIX + topic) == b"stream"


def test_mosquitto_pub_reaches_the_stream(node, r):
    topic = f"mosq/{uid('t')}"
    for q in ("0", "1", "2"):
        p = mosq_pub(node.mqtt_port, topic, "-q", q, "-m", f"hello-{q}", "-i", f"mosq-pub-{q}-{os.getpid()}")
        assert p.returncode == 0, p.stderr
    # mosquitto_pub sends QoS 0 then DISCONNECT: the entry is there before the server closes it
    got = wait_until(lambda: len(entries(r, topic)) == 3 and entries(r, topic), what="3 entries")
    assert [e[b"payload"] for e in got] == [b"hello-0", b"hello-1", b"hello-2"]
    assert [e[b"qos"] for e in got] == [b"0", b"1", b"2"]
    assert got[1][b"client"] == f"mosq-pub-1-{os.getpid()}".encode()


# ================================================================ QoS flows (4.3)

def test_qos1_publish_is_acknowledged_with_its_packet_id(node, r, raws):
    topic = f"q1/{uid('t')}"
    c = raw_session(raws, node.mqtt_port)
    c.send(w.publish(topic, b"a", qos=1, pid=0x1234) + w.publish(topic, b"b", qos=1, pid=0xFFFF))
    assert c.expect(w.PUBACK).pid == 0x1234
    assert c.expect(w.PUBACK).pid == 0xFFFF
    assert [e[b"payload"] for e in entries(r, topic)] == [b"a", b"b"]


def test_qos2_exactly_once_a_resent_publish_is_stored_once(node, r, raws):
    """4.3.3: PUBLISH QoS 2 id 7, the same again with DUP before PUBREL -> PUBREC both times,
    one entry; PUBREL -> PUBCOMP; after the release id 7 is a new message again."""
    topic = f"q2/{uid('t')}"
    c = raw_session(raws, node.mqtt_port)
    c.send(w.publish(topic, b"once", qos=2, pid=7))
    rec = c.expect(w.PUBREC)
    assert rec.pid == 7 and rec.flags == 0
    c.send(w.publish(topic, b"once", qos=2, pid=7, dup=True))
    assert c.expect(w.PUBREC).pid == 7
    # without DUP it is still the same unreleased id: not stored again either
    c.send(w.publish(topic, b"once", qos=2, pid=7))
    assert c.expect(w.PUBREC).pid == 7
    c.send(w.pubrel(7))
    comp = c.expect(w.PUBCOMP)
    assert comp.pid == 7 and comp.flags == 0
    assert [e[b"payload"] for e in entries(r, topic)] == [b"once"]
    # PUBREL of an id not in flight is still completed (4.3.3: the receiver MUST respond)
    c.send(w.pubrel(8))
    assert c.expect(w.PUBCOMP).pid == 8
    # id 7 was released: the next PUBLISH with it is a new message
    c.send(w.publish(topic, b"again", qos=2, pid=7))
    assert c.expect(w.PUBREC).pid == 7
    c.send(w.pubrel(7))
    assert c.expect(w.PUBCOMP).pid == 7
    assert [e[b"payload"] for e in entries(r, topic)] == [b"once", b"again"]


def test_qos2_duplicate_suppressed_across_a_reconnect(node, r, raws):
    """A persistent session remembers the unreleased QoS 2 id: resent on a new connection
    (as 4.4 asks the client to) it is acknowledged, not stored a second time."""
    topic = f"q2r/{uid('t')}"
    cid = uid("q2r")
    c = raw_session(raws, node.mqtt_port, cid, clean=False)
    c.send(w.publish(topic, b"m", qos=2, pid=9))
    assert c.expect(w.PUBREC).pid == 9
    c.abort()
    c2 = raws(node.mqtt_port)
    assert c2.connect(cid, clean=False).session_present == 1
    c2.send(w.publish(topic, b"m", qos=2, pid=9, dup=True))
    assert c2.expect(w.PUBREC).pid == 9
    c2.send(w.pubrel(9))
    assert c2.expect(w.PUBCOMP).pid == 9
    assert [e[b"payload"] for e in entries(r, topic)] == [b"m"]


def test_qos2_delivery_to_a_subscriber_follows_the_handshake(node, raws):
    """Outgoing QoS 2 (4.3.3, server as sender): PUBLISH, client PUBREC, server PUBREL
    (flags 0010), client PUBCOMP; the next message follows."""
    topic = f"q2o/{uid('t')}"
    sub = raw_session(raws, node.mqtt_port)
    sub.send(w.subscribe(3, [(topic, 2)]))
    sa = sub.expect(w.SUBACK)
    assert sa.pid == 3 and sa.codes == [2]
    pub = raw_session(raws, node.mqtt_port)
    for i, payload in enumerate((b"first", b"second")):
        pub.send(w.publish(topic, payload, qos=2, pid=100 + i))
        assert pub.expect(w.PUBREC).pid == 100 + i
        pub.send(w.pubrel(100 + i))
        assert pub.expect(w.PUBCOMP).pid == 100 + i
    p = next_publish(sub, ack=False)
    assert (p.topic, p.payload, p.qos, p.dup, p.retain) == (topic, b"first", 2, False, False)
    assert p.pid
    sub.send(w.pubrec(p.pid))
    rel = sub.read()
    if rel.type == w.PUBLISH:  # the second message may come before the PUBREL: set it aside
        second, rel = rel, sub.read()
    else:
        second = None
    assert rel.type == w.PUBREL and rel.flags == 2 and rel.pid == p.pid, rel
    sub.send(w.pubcomp(p.pid))
    q = second or next_publish(sub, ack=False)
    assert (q.payload, q.qos) == (b"second", 2)


def test_subscriber_gets_min_of_message_and_granted_qos(node, clients):
    """3.8.4: delivered QoS = min(published QoS, granted QoS); SUBACK grants what was asked."""
    base = f"qm/{uid('t')}"
    sub = clients(node.mqtt_port)
    assert sub.subscribe((f"{base}/g0", 0), (f"{base}/g1", 1), (f"{base}/g2", 2)) == [0, 1, 2]
    pub = clients(node.mqtt_port)
    for g in range(3):
        for q in range(3):
            pub.publish(f"{base}/g{g}", f"g{g}q{q}".encode(), qos=q)
    got = {}
    for _ in range(9):
        m = sub.get()
        got.setdefault(m.topic, []).append((m.payload.decode(), m.qos, m.retain))
    for g in range(3):
        assert got[f"{base}/g{g}"] == [(f"g{g}q{q}", min(g, q), False) for q in range(3)]
    sub.assert_quiet()


# ================================================================ subscriptions

def ref_match(filt, topic):
    """4.7: the reference topic-filter matcher the server is checked against."""
    if topic.startswith("$") and filt[:1] in ("+", "#"):
        return False  # 4.7.2
    f, t = filt.split("/"), topic.split("/")
    for i, part in enumerate(f):
        if part == "#":
            return True  # this level and every one below, also none ("sport/#" matches "sport")
        if i >= len(t) or (part != "+" and part != t[i]):
            return False
    return len(f) == len(t)


def test_reference_matcher_agrees_with_the_spec_examples():
    # 4.7.1.2, 4.7.1.3, 4.7.2 (non-normative examples)
    yes = [("sport/tennis/player1/#", "sport/tennis/player1"),
           ("sport/tennis/player1/#", "sport/tennis/player1/ranking"),
           ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon"), ("sport/#", "sport"), ("#", "sport"),
           ("sport/tennis/+", "sport/tennis/player1"), ("sport/+", "sport/"), ("+/+", "/finance"), ("/+", "/finance"),
           ("$SYS/#", "$SYS/x"), ("$SYS/+", "$SYS/x"), ("+/monitor/Clients", "x/monitor/Clients")]
    no = [("sport/tennis/+", "sport/tennis/player1/ranking"), ("sport/+", "sport"), ("+", "/finance"),
          ("#", "$SYS/x"), ("+/monitor/Clients", "$SYS/monitor/Clients"), ("+", "$SYS")]
    assert all(ref_match(f, t) for f, t in yes)
    assert not any(ref_match(f, t) for f, t in no)


WILDCARD_FILTERS = ["#", "+", "+/+", "/+", "+/x", "a", "a/+", "a/#", "a/+/c", "a/b/c", "a/+/+", "+/b/#", "a//c",
                    "$SYS/#", "$SYS/+", "$SYS", "+/SYS", "sport/#", "sport/tennis/+", "sport/tennis/player1/#"]
WILDCARD_TOPICS = ["a", "a/b", "a/b/c", "a/b/c/d", "a/", "a//c", "/x", "b/x", "x", "$SYS", "$SYS/x", "$other/b",
                   "sport", "sport/tennis/player1", "sport/tennis/player1/ranking"]


def test_wildcard_matching_table(own_node, raws):
    """Each filter subscribed on its own connection; one message per topic; every
    subscriber gets exactly the topics 4.7 says its filter matches ('$' topics not by a
    leading wildcard), each once. Own server: '#' must see nothing else."""
    n = own_node()
    subs = {}
    for i, f in enumerate(WILDCARD_FILTERS):
        c = raw_session(raws, n.mqtt_port, f"wild-{i}")
        c.send(w.subscribe(1, [(f, 0)]))
        assert c.expect(w.SUBACK).codes == [0], f
        subs[f] = c
    pub = raw_session(raws, n.mqtt_port, "wild-pub")
    for i, t in enumerate(WILDCARD_TOPICS):
        pub.send(w.publish(t, t, qos=1, pid=i + 1))
        assert pub.expect(w.PUBACK).pid == i + 1
    wrong = {}
    for f, c in subs.items():
        want = sorted(t for t in WILDCARD_TOPICS if ref_match(f, t))
        got = []
        try:
            for _ in want:
                p = next_publish(c)
                assert p.payload.decode() == p.topic, p
                got.append(p.topic)
        except (TimeoutError, w.Closed):
            pass
        if sorted(got) != want:
            wrong[f] = (sorted(got), want)
    for f, c in subs.items():  # and nothing more
        try:
            p = c.read(GRACE if f == WILDCARD_FILTERS[0] else 0.05)
            wrong.setdefault(f, ([], []))[0].append(f"extra {p!r}")
        except TimeoutError:
            pass
    assert not wrong, "filter: (got, expected) " + repr(wrong)


def test_overlapping_subscriptions_deliver_one_copy_at_the_highest_qos(node, raws, clients):
    """3.3.5: one client's overlapping subscriptions get each message once, at the
    largest QoS they grant; unsubscribing one of them lowers it to what is left."""
    base = f"ov/{uid('t')}"
    topic = f"{base}/x"
    sub = raw_session(raws, node.mqtt_port)
    sub.send(w.subscribe(1, [(f"{base}/#", 0), (f"{base}/+", 2)]))
    assert sub.expect(w.SUBACK).codes == [0, 2]
    sub.send(w.subscribe(2, [(topic, 1)]))  # a third one, in its own SUBSCRIBE
    assert sub.expect(w.SUBACK).codes == [1]
    pub = clients(node.mqtt_port)
    pub.publish(topic, b"m1", qos=2)
    pub.publish(topic, b"m2", qos=1)
    pub.publish(topic, b"end", qos=2)
    got = []
    while not got or got[-1][0] != b"end":
        p = next_publish(sub)
        got.append((p.payload, p.qos))
    assert got == [(b"m1", 2), (b"m2", 1), (b"end", 2)]
    sub.send(w.unsubscribe(3, [f"{base}/+"]))
    ua = expect_answering_pubrel(sub, w.UNSUBACK)  # end's PUBREL may come first
    assert ua.pid == 3 and ua.flags == 0
    pub.publish(topic, b"after", qos=2)
    p = next_publish(sub)
    assert (p.payload, p.qos) == (b"after", 1)  # max(0 from base/#, 1 from topic)
    assert_no_publish(sub)


def test_unsubscribe_stops_delivery(node, clients):
    topic = f"unsub/{uid('t')}"
    sub = clients(node.mqtt_port)
    control = clients(node.mqtt_port)
    assert sub.subscribe((topic, 1)) == [1]
    assert control.subscribe((topic, 1)) == [1]
    pub = clients(node.mqtt_port)
    pub.publish(topic, b"m1", qos=1)
    assert sub.get().payload == b"m1"
    assert control.get().payload == b"m1"
    sub.unsubscribe(topic)
    pub.publish(topic, b"m2", qos=1)
    assert control.get().payload == b"m2"  # the server has delivered m2 to who still wants it
    sub.assert_quiet()
    # unsubscribing a filter it does not have is acknowledged too (3.10.4-5)
    sub.unsubscribe(f"never/{uid('t')}")


def test_subscription_gets_only_messages_published_after_it(node, raws):
    """A subscription delivers messages the server received after the SUBSCRIBE (not the
    history of the stream; only a retained message is sent from before). The publish and
    the SUBSCRIBE are pipelined on one connection, so the server runs them back to back
    (usually in the same millisecond)."""
    leaked = []
    for i in range(5):
        topic = f"after/{uid('t')}"
        c = raw_session(raws, node.mqtt_port)
        c.send(w.publish(topic, b"before", qos=0) + w.subscribe(1, [(topic, 1)]) + w.publish(topic, b"after", qos=0))
        assert c.expect(w.SUBACK).codes == [1]
        p = next_publish(c)
        if p.payload != b"after":
            leaked.append((topic, p.payload))
        c.close()
    # and with time between them too
    topic = f"after/{uid('t')}"
    c = raw_session(raws, node.mqtt_port)
    c.send(w.publish(topic, b"old", qos=1, pid=1))
    assert c.expect(w.PUBACK).pid == 1
    time.sleep(0.05)
    c.send(w.subscribe(2, [(topic, 1)]) + w.publish(topic, b"new", qos=0))
    c.expect(w.SUBACK)
    assert next_publish(c).payload == b"new"
    assert not leaked, f"messages published before the SUBSCRIBE were delivered: {leaked}"


# ================================================================ retained messages (3.3.1.3)

def test_retained_set_replace_clear(node, r, clients):
    topic = f"ret/{uid('t')}"
    pub = clients(node.mqtt_port)
    n0 = mqtt_info(r)["mqtt_retained"]
    pub.publish(topic, b"v1", qos=1, retain=True)
    assert r.hget(RETAINED, topic) == b"\x01v1"  # QoS byte, then the payload
    assert mqtt_info(r)["mqtt_retained"] == n0 + 1

    next_ms()
    a = clients(node.mqtt_port)
    a.subscribe((topic, 1))
    m = a.get()
    assert (m.payload, m.retain, m.qos) == (b"v1", True, 1)  # 3.3.1-6: RETAIN set for a new subscription

    pub.publish(topic, b"v2", qos=2, retain=True)  # replaces it (3.3.1-5)
    m = a.get()
    assert (m.payload, m.retain) == (b"v2", False)  # 3.3.1-9: established subscription: RETAIN 0
    assert r.hget(RETAINED, topic) == b"\x02v2"
    assert mqtt_info(r)["mqtt_retained"] == n0 + 1

    next_ms()
    b = clients(node.mqtt_port)
    b.subscribe((topic, 1))
    m = b.get()
    assert (m.payload, m.retain, m.qos) == (b"v2", True, 1)  # min(QoS it was published with, granted)
    pub.publish(topic, b"plain", qos=1)
    m = b.get()
    assert (m.payload, m.retain) == (b"plain", False)  # v1 is gone: the next one is the new message
    assert a.get().payload == b"plain"

    pub.publish(topic, b"", qos=1, retain=True)  # 3.3.1-10: zero bytes clear it ...
    m = a.get()
    assert (m.payload, m.retain) == (b"", False)  # ... and are delivered as a normal message
    assert r.hexists(RETAINED, topic) is False
    assert mqtt_info(r)["mqtt_retained"] == n0

    next_ms()
    c = clients(node.mqtt_port)
    c.subscribe((topic, 1))
    pub.publish(topic, b"sentinel", qos=1)
    m = c.get()
    assert (m.payload, m.retain) == (b"sentinel", False), "a cleared retained message was sent"
    # the stream kept every message, retained or not
    assert [e[b"payload"] for e in entries(r, topic)] == [b"v1", b"v2", b"plain", b"", b"sentinel"]


def test_retained_messages_of_every_topic_a_wildcard_matches(node, clients):
    base = f"retw/{uid('t')}"
    pub = clients(node.mqtt_port)
    pub.publish(f"{base}/a", b"A", qos=2, retain=True)
    pub.publish(f"{base}/b/c", b"C", qos=1, retain=True)
    pub.publish(f"{base}/d", b"D", qos=1)  # not retained
    next_ms()
    s1 = clients(node.mqtt_port)
    s1.subscribe((f"{base}/#", 1))
    got = sorted((m.topic, m.payload, m.retain, m.qos) for m in (s1.get(), s1.get()))
    assert got == [(f"{base}/a", b"A", True, 1), (f"{base}/b/c", b"C", True, 1)]
    s1.assert_quiet()
    s0 = clients(node.mqtt_port)
    s0.subscribe((f"{base}/+", 0))
    m = s0.get()
    assert (m.topic, m.payload, m.retain, m.qos) == (f"{base}/a", b"A", True, 0)
    s0.assert_quiet()


def test_mosquitto_retained_and_cleared(node, r):
    topic = f"mret/{uid('t')}"
    assert mosq_pub(node.mqtt_port, topic, "-q", "1", "-r", "-m", "kept").returncode == 0
    s = MosqSub(node.mqtt_port, "-t", topic, "-C", "1", "-W", str(int(TIMEOUT)), "-q", "1")
    assert s.wait() == 0, "\n".join(s.lines)
    assert f"{topic} kept" in s.lines
    assert any("received PUBLISH (d0, q1, r1" in line for line in s.lines), s.lines
    assert mosq_pub(node.mqtt_port, topic, "-q", "1", "-r", "-n").returncode == 0
    assert r.hexists(RETAINED, topic) is False
    s = MosqSub(node.mqtt_port, "-t", topic, "-C", "1", "-W", str(int(TIMEOUT)), "-q", "1")
    s.wait_subscribed()
    assert mosq_pub(node.mqtt_port, topic, "-q", "1", "-m", "fresh").returncode == 0
    assert s.wait() == 0, "\n".join(s.lines)
    assert f"{topic} fresh" in s.lines and f"{topic} kept" not in s.lines


# ================================================================ RESP <-> MQTT

def test_resp_xadd_reaches_mqtt_subscribers(node, r, clients):
    base = f"rx/{uid('t')}"
    s2 = clients(node.mqtt_port)
    s2.subscribe((f"{base}/#", 2))
    s0 = clients(node.mqtt_port)
    s0.subscribe((f"{base}/a", 0))
    r.xadd(PREFIX + f"{base}/a", {"payload": "hi"})
    m = s2.get()
    assert (m.topic, m.payload, m.qos, m.retain) == (f"{base}/a", b"hi", 1, False)  # no qos field: min(1, 2)
    m = s0.get()
    assert (m.topic, m.payload, m.qos) == (f"{base}/a", b"hi", 0)  # min(1, 0)
    r.xadd(PREFIX + f"{base}/a", {"qos": "2", "payload": "two"})
    m = s2.get()
    assert (m.payload, m.qos) == (b"two", 2)
    assert s0.get().payload == b"two"
    r.xadd(PREFIX + f"{base}/b/c", {"temp": "21.5", "unit": "C"})  # no payload field: the first value
    m = s2.get()
    assert (m.topic, m.payload, m.qos) == (f"{base}/b/c", b"21.5", 1)
    s0.assert_quiet(0.1)


def test_resp_key_under_the_prefix_that_is_not_a_stream_does_not_stop_delivery(node, r, clients):
    base = f"rxs/{uid('t')}"
    s = clients(node.mqtt_port)
    s.subscribe((f"{base}/#", 1))
    r.set(PREFIX + f"{base}/str", "not a stream")
    r.xadd(PREFIX + f"{base}/ok", {"payload": "fine"})
    m = s.get()
    assert (m.topic, m.payload) == (f"{base}/ok", b"fine")
    pub = clients(node.mqtt_port)
    pub.publish(f"{base}/ok2", b"also", qos=1)
    assert s.get().payload == b"also"


# ================================================================ CONNECT (3.1, 3.2)

@pytest.mark.parametrize("kw, code", [
    (dict(proto=b"MQIsdp", level=3), w.BAD_VERSION),    # MQTT 3.1: 3.1.2-2, CONNACK 0x01
    (dict(level=3), w.BAD_VERSION),
    (dict(level=5), w.BAD_VERSION),
    (dict(level=0), w.BAD_VERSION),
], ids=["mqisdp-3", "mqtt-3", "mqtt-5", "mqtt-0"])
def test_connect_unacceptable_protocol_level(node, r, raws, kw, code):
    """3.1.2-2: an unsupported level gets CONNACK 0x01, then the server closes."""
    refused = mqtt_info(r)["mqtt_refused_connections"]
    c = raws(node.mqtt_port)
    c.send(w.connect(uid("lvl"), **kw))
    p = c.expect(w.CONNACK)
    assert (p.session_present, p.code) == (0, code)
    assert c.closed_within(10)
    assert mqtt_info(r)["mqtt_refused_connections"] > refused


def test_empty_client_id_without_clean_session_is_refused(node, raws):
    c = raws(node.mqtt_port)
    c.send(w.connect("", clean=False))
    p = c.expect(w.CONNACK)
    assert (p.session_present, p.code) == (0, w.BAD_ID)  # 3.1.3-8: 0x02, then close
    assert c.closed_within(10)


def test_empty_client_id_with_clean_session_is_assigned_one(node, r, raws):
    topic = f"auto/{uid('t')}"
    ids = []
    for _ in range(2):
        c = raws(node.mqtt_port)
        assert c.connect("", clean=True).code == 0  # 3.1.3-6
        c.send(w.publish(topic, b"x", qos=1, pid=1))
        assert c.expect(w.PUBACK).pid == 1
        ids.append(entries(r, topic)[-1][b"client"])
    assert all(ids) and ids[0] != ids[1], ids  # one of its own each


@pytest.mark.parametrize("body", [
    w.connect_body("x", proto=b"MQTX"),           # 3.1.2-1: other protocol name: MAY close, no CONNACK
    w.connect_body("x", proto=b"mqtt"),
    w.connect_body("x", reserved=True),           # 3.1.2-3: reserved flag not 0
    w.connect_body("x", password="pw"),           # 3.1.2-22: password without user name
    w.connect_body("x", flags=0x02 | 0x18),       # 3.1.2-13/14: will QoS without will flag (and QoS 3)
    w.connect_body("x", flags=0x02 | 0x20),       # 3.1.2-15: will retain without will flag
    w.connect_body("x", will=("w", b"m", 3, False)),  # 3.1.2-14: will QoS 3
    w.connect_body("x", will=("w/+", b"m", 0, False)),  # will topic with a wildcard
    w.connect_body(b"\xff\xfe"),                  # client id not UTF-8 (1.5.3)
    w.connect_body("x") + b"junk",                # longer than its fields
    w.connect_body("x")[:-3],                     # truncated client id
    b"",                                          # nothing at all
], ids=["name-MQTX", "name-lowercase", "reserved-flag", "password-no-user", "will-qos-no-will",
        "will-retain-no-will", "will-qos-3", "will-topic-wildcard", "client-id-not-utf8", "trailing-bytes",
        "truncated", "empty"])
def test_bad_connect_is_closed_without_connack(node, raws, body):
    c = raws(node.mqtt_port)
    c.send(w.packet(w.CONNECT, 0, body))
    with pytest.raises(w.Closed):
        p = c.read(10)
        raise AssertionError(f"got {p!r}, expected the connection closed without a CONNACK")


@pytest.mark.parametrize("first", [w.publish("a/b", b"x"), w.pingreq(), w.subscribe(1, [("a", 0)]),
                                   w.disconnect(), w.puback(1)],
                         ids=["publish", "pingreq", "subscribe", "disconnect", "puback"])
def test_first_packet_not_connect_closes(node, r, raws, first):
    """3.1.0-1: the first packet from the client MUST be CONNECT."""
    c = raws(node.mqtt_port)
    c.send(first)
    assert c.closed_within(10)
    assert r.exists(PREFIX + "a/b") == 0


def test_second_connect_closes(node, raws):
    """3.1.0-2: a second CONNECT is a protocol violation: disconnect."""
    c = raw_session(raws, node.mqtt_port)
    c.send(w.connect(uid("again")))
    assert c.closed_within(10)


def test_session_takeover_closes_the_first_connection(node, raws, clients):
    """3.1.4-2: a CONNECT with a client id already connected disconnects the old client; the
    new one gets the session (persistent here: session present, subscription kept)."""
    cid = uid("take")
    topic = f"take/{uid('t')}"
    a = raw_session(raws, node.mqtt_port, cid, clean=False)
    a.send(w.subscribe(1, [(topic, 1)]))
    a.expect(w.SUBACK)
    b = raws(node.mqtt_port)
    p = b.connect(cid, clean=False)
    assert p.session_present == 1
    assert a.closed_within(10)
    ping_ok(b)
    clients(node.mqtt_port).publish(topic, b"to-b", qos=1)
    assert next_publish(b).payload == b"to-b"
    # and a clean one taking over gets a fresh session
    c = raws(node.mqtt_port)
    assert c.connect(cid, clean=True).session_present == 0
    assert b.closed_within(10)
    ping_ok(c)


# ================================================================ authentication

def test_requirepass(own_node, raws):
    n = own_node(requirepass="pw")
    r = redis.Redis(port=n.port, password="pw", socket_timeout=TIMEOUT)
    cases = [(dict(user="u", password="wrong"), w.BAD_CREDENTIALS),
             (dict(), w.NOT_AUTHORIZED),
             (dict(user="u"), w.NOT_AUTHORIZED),
             (dict(user="u", password=""), w.BAD_CREDENTIALS),
             (dict(user="u", password="pwx"), w.BAD_CREDENTIALS)]
    for kw, code in cases:
        c = raws(n.mqtt_port)
        c.send(w.connect(uid("auth"), **kw))
        p = c.expect(w.CONNACK)
        assert (p.session_present, p.code) == (0, code), kw
        assert c.closed_within(10), kw
    assert mqtt_info(r)["mqtt_refused_connections"] >= len(cases)
    for user in ("anyone", "", "default"):
        c = raw_session(raws, n.mqtt_port, user=user, password="pw")
        c.send(w.publish("auth/ok", user, qos=1, pid=1))
        assert c.expect(w.PUBACK).pid == 1
    assert [e[b"payload"] for e in entries(r, "auth/ok")] == [b"anyone", b"", b"default"]
    # mosquitto_pub: refused with a wrong password, accepted with the right one
    p = mosq_pub(n.mqtt_port, "auth/m", "-q", "1", "-m", "no", "-u", "u", "-P", "nope")
    assert p.returncode != 0 and ("password" in p.stderr.lower() or "refused" in p.stderr.lower()), p.stderr
    p = mosq_pub(n.mqtt_port, "auth/m", "-q", "1", "-m", "yes", "-u", "u", "-P", "pw")
    assert p.returncode == 0, p.stderr
    assert [e[b"payload"] for e in entries(r, "auth/m")] == [b"yes"]
    r.close()


def test_persistent_session_with_a_password(own_node, raws):
    """With --requirepass, a clean-session-0 CONNECT reads its saved session (a command run
    for the client): it runs as the authenticated client, and the session is kept."""
    n = own_node(requirepass="pw")
    cid = uid("pwkeep")
    for present in (0, 1):
        c = raws(n.mqtt_port)
        c.send(w.connect(cid, clean=False, user="u", password="pw"))
        p = c.expect(w.CONNACK)
        assert (p.code, p.session_present) == (0, present)
        c.send(w.disconnect())
        assert c.closed_within(10)


def test_mqtt_users_file_as_mosquitto_passwd_writes_it(own_node, raws, tmp_path):
    """--mqtt-users takes mosquitto_passwd's file ($7$: PBKDF2-SHA512; $6$: salted SHA-512):
    the user's own password lets it in, a wrong one or another user's gets CONNACK 4,
    none gets 5; --requirepass is then not a password for MQTT."""
    need("mosquitto_passwd")
    import base64
    import hashlib
    path = tmp_path / "users"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(path), "alice", "s3cret"], check=True, timeout=30)
    subprocess.run(["mosquitto_passwd", "-b", str(path), "bob", "hunter2"], check=True, timeout=30)
    salt = b"0123456789ab"
    old = base64.b64encode(hashlib.sha512(b"legacy-pw" + salt).digest()).decode()
    with open(path, "a") as f:
        f.write(f"# a comment, then mosquitto's older form\ncarol:$6${base64.b64encode(salt).decode()}${old}\n")
    n = own_node(mqtt_users=str(path), requirepass="resp-only")
    for user, pw, code in [("alice", "s3cret", 0), ("bob", "hunter2", 0), ("carol", "legacy-pw", 0),
                           ("alice", "hunter2", w.BAD_CREDENTIALS), ("mallory", "s3cret", w.BAD_CREDENTIALS),
                           ("alice", "", w.BAD_CREDENTIALS), ("bob", "resp-only", w.BAD_CREDENTIALS),
                           ("alice", None, w.NOT_AUTHORIZED), (None, None, w.NOT_AUTHORIZED)]:
        c = raws(n.mqtt_port)
        kw = {k: v for k, v in (("user", user), ("password", pw)) if v is not None}
        c.send(w.connect(uid("users"), **kw))
        p = c.expect(w.CONNACK)
        assert p.code == code, (user, pw)
        if code:
            assert c.closed_within(10), (user, pw)
    p = mosq_pub(n.mqtt_port, "users/m", "-q", "1", "-m", "hi", "-u", "alice", "-P", "s3cret")
    assert p.returncode == 0, p.stderr
    p = mosq_pub(n.mqtt_port, "users/m", "-q", "1", "-m", "no", "-u", "alice", "-P", "wrong")
    assert p.returncode != 0


def test_mqtt_users_file_that_is_not_mosquitto_passwd_format_refuses_the_start(tmp_path):
    path = tmp_path / "users"
    path.write_text("alice:plaintext\n")
    with pytest.raises((ServerError, ConfigError), match="line 1"):
        start_node(mqtt_port=0, mqtt_users=str(path))


def test_mosquitto_mqtt31_is_refused(node):
    p = mosq_pub(node.mqtt_port, "v31", "-m", "x", "-V", "mqttv31")
    assert p.returncode != 0
    assert "protocol version" in p.stderr.lower(), p.stderr


# ================================================================ PUBLISH refused (3.3)

@pytest.mark.parametrize("pkt, key", [
    (w.publish("bad/+", b"x"), "bad/+"),                       # 3.3.2-2: no wildcards in a topic name
    (w.publish("bad/#", b"x", qos=1), "bad/#"),
    (w.publish("", b"x"), ""),                                 # 4.7.3-1: at least one character
    (w.publish("bad/dup0", b"x", qos=0, dup=True), "bad/dup0"),  # 3.3.1-2: DUP 0 for QoS 0
    (w.packet(w.PUBLISH, 6, w.s("bad/q3") + b"\x00\x01x"), "bad/q3"),  # 3.3.1-4: QoS 3
    (w.packet(w.PUBLISH, 7, w.s("bad/q3r") + b"\x00\x01x"), "bad/q3r"),
    (w.publish("bad/id0", b"x", qos=1, pid=0), "bad/id0"),     # 2.3.1-1: non-zero packet id
], ids=["plus", "hash", "empty", "qos0-dup", "qos3", "qos3-retain", "pid-0"])
def test_bad_publish_closes_and_stores_nothing(node, r, raws, pkt, key):
    c = raw_session(raws, node.mqtt_port)
    c.send(pkt)
    assert c.closed_within(10)
    # nothing stored: no stream for that name (the key of the empty name, the prefix itself,
    # may hold the broker's own bookkeeping, but never messages)
    assert r.type(PREFIX + key) != b"stream", r.type(PREFIX + key)
    if key:
        assert r.exists(PREFIX + key) == 0


# ================================================================ keep alive, DISCONNECT, wills

def test_keepalive_expiry_closes_and_publishes_the_will(node, r, raws):
    """3.1.2-24: no packet for 1.5 x keep alive -> the server disconnects, as a network
    failure: the will is published (3.1.2-8)."""
    wt = f"will/{uid('t')}"
    cid = uid("ka")
    c = raw_session(raws, node.mqtt_port, cid, keepalive=2, will=(wt, b"expired", 1, False))
    t0 = time.monotonic()
    assert c.closed_within(15), "no close after 1.5 x keep alive"
    # 3 s after the CONNECT (t0 is a little later): at least more than the keep alive itself
    assert time.monotonic() - t0 >= 2.2, "closed before 1.5 x keep alive"
    got = wait_until(lambda: entries(r, wt), what="the will")
    assert [(e[b"payload"], e[b"qos"], e[b"client"]) for e in got] == [(b"expired", b"1", cid.encode())]


def test_pings_keep_the_connection_alive(node, raws):
    c = raw_session(raws, node.mqtt_port, keepalive=1)
    end = time.monotonic() + 3.0  # twice the 1.5 s the server allows for one silence
    while time.monotonic() < end:
        ping_ok(c)
        time.sleep(0.2)
    ping_ok(c)
    assert c.closed_within(15)  # then silence: closed


def test_will_on_abnormal_close_with_retain(node, r, raws, clients):
    wt = f"will/{uid('t')}"
    cid = uid("will")
    watcher = clients(node.mqtt_port)
    watcher.subscribe((wt, 2))
    c = raw_session(raws, node.mqtt_port, cid, will=(wt, b"gone", 1, True))
    ping_ok(c)
    c.abort()  # no DISCONNECT: the will is published (3.1.2-8)
    m = watcher.get()
    assert (m.topic, m.payload, m.qos, m.retain) == (wt, b"gone", 1, False)
    e = entries(r, wt)
    assert len(e) == 1 and (e[0][b"payload"], e[0][b"qos"], e[0][b"retain"], e[0][b"client"]) == \
        (b"gone", b"1", b"1", cid.encode())
    assert r.hget(RETAINED, wt) == b"\x01gone"
    next_ms()
    late = clients(node.mqtt_port)  # will retain: a new subscriber gets it (3.1.2-17)
    late.subscribe((wt, 1))
    m = late.get()
    assert (m.payload, m.retain) == (b"gone", True)


def test_will_when_the_client_just_closes_the_socket(node, r, raws):
    wt = f"will/{uid('t')}"
    c = raw_session(raws, node.mqtt_port, will=(wt, b"fin", 0, False))
    c.close()  # a FIN, no DISCONNECT: still abnormal
    got = wait_until(lambda: entries(r, wt), what="the will")
    assert [e[b"payload"] for e in got] == [b"fin"]


def test_no_will_after_disconnect(node, r, raws):
    """3.14.4-3: on DISCONNECT the will is discarded. Reconnecting with the same id is the
    proof that the server is done with the first connection (a takeover waits for it)."""
    wt = f"will/{uid('t')}"
    cid = uid("nowill")
    c = raw_session(raws, node.mqtt_port, cid, clean=False, will=(wt, b"never", 1, True))
    c.send(w.disconnect())
    assert c.closed_within(10)  # 3.14.4: the server SHOULD close it
    c2 = raws(node.mqtt_port)
    assert c2.connect(cid, clean=False).session_present == 1
    ping_ok(c2)
    assert entries(r, wt) == []
    assert r.hexists(RETAINED, wt) is False
    # while the abnormal end of that same second connection publishes nothing either: it had no will
    c2.abort()
    c3 = raws(node.mqtt_port)
    c3.connect(cid, clean=True)
    assert entries(r, wt) == []


def test_mosquitto_sub_killed_publishes_its_will(node, r):
    wt = f"will/{uid('t')}"
    s = MosqSub(node.mqtt_port, "-t", f"nothing/{uid('t')}", "--will-topic", wt, "--will-payload", "killed",
                "--will-qos", "1")
    s.wait_subscribed()
    s.p.send_signal(signal.SIGKILL)
    s.kill()
    got = wait_until(lambda: entries(r, wt), what="mosquitto_sub's will")
    assert [(e[b"payload"], e[b"qos"]) for e in got] == [(b"killed", b"1")]


# ================================================================ persistent sessions (3.1.2.4)

def test_persistent_session_redelivers_what_came_while_away(node, clients):
    cid = uid("pers")
    base = f"pers/{uid('t')}"
    s = clients(node.mqtt_port, cid, clean=False)
    assert s.session_present is False
    assert s.subscribe((f"{base}/one", 1), (f"{base}/two", 2)) == [1, 2]
    s.close()
    pub = clients(node.mqtt_port)
    pub.publish(f"{base}/one", b"a", qos=1)
    pub.publish(f"{base}/one", b"b", qos=2)
    pub.publish(f"{base}/two", b"c", qos=2)
    s2 = clients(node.mqtt_port, cid, clean=False)
    assert s2.session_present is True  # 3.2.2-2
    got = {}
    for _ in range(3):
        m = s2.get()
        got.setdefault(m.topic, []).append((m.payload, m.qos))
    assert got == {f"{base}/one": [(b"a", 1), (b"b", 1)], f"{base}/two": [(b"c", 2)]}
    # the subscriptions are still there without subscribing again
    pub.publish(f"{base}/two", b"d", qos=1)
    assert s2.get().payload == b"d"
    s2.close()
    # clean session 1 ends it (3.1.2-6): no session present, no subscriptions
    s3 = clients(node.mqtt_port, cid, clean=True)
    assert s3.session_present is False
    control = clients(node.mqtt_port)
    control.subscribe((f"{base}/one", 1))
    pub.publish(f"{base}/one", b"e", qos=1)
    assert control.get().payload == b"e"
    s3.assert_quiet()


def test_unacknowledged_delivery_is_resent_with_dup_on_reconnect(node, raws, clients):
    """4.4: a QoS 1 PUBLISH not acknowledged when the connection ended is sent again, DUP set,
    when the persistent session reconnects."""
    cid = uid("dup")
    topic = f"dup/{uid('t')}"
    c = raw_session(raws, node.mqtt_port, cid, clean=False)
    c.send(w.subscribe(1, [(topic, 1)]))
    c.expect(w.SUBACK)
    pub = clients(node.mqtt_port)
    pub.publish(topic, b"unacked", qos=1)
    p = next_publish(c, ack=False)
    assert (p.payload, p.qos, p.dup) == (b"unacked", 1, False)
    c.abort()
    c2 = raws(node.mqtt_port)
    assert c2.connect(cid, clean=False).session_present == 1
    q = next_publish(c2)
    assert (q.payload, q.qos, q.dup, q.pid) == (b"unacked", 1, True, p.pid)
    pub.publish(topic, b"next", qos=1)
    q = next_publish(c2)
    assert (q.payload, q.dup) == (b"next", False)
    assert_no_publish(c2)


def test_mosquitto_persistent_session(node):
    cid = f"mosq-pers-{os.getpid()}"
    topic = f"mpers/{uid('t')}"
    s = MosqSub(node.mqtt_port, "-c", "-i", cid, "-q", "1", "-t", topic, "-E")
    assert s.wait() == 0, "\n".join(s.lines)
    assert mosq_pub(node.mqtt_port, topic, "-q", "1", "-m", "while-away").returncode == 0
    s = MosqSub(node.mqtt_port, "-c", "-i", cid, "-q", "1", "-t", topic, "-C", "1", "-W", str(int(TIMEOUT)))
    assert s.wait() == 0, "\n".join(s.lines)
    assert f"{topic} while-away" in s.lines
    assert any("received CONNACK (0)" in line for line in s.lines)


def test_mosquitto_pub_sub_roundtrip(node):
    topic = f"mrt/{uid('t')}"
    s = MosqSub(node.mqtt_port, "-t", topic, "-q", "2", "-C", "3", "-W", str(int(TIMEOUT)))
    s.wait_subscribed()
    for q in ("0", "1", "2"):
        assert mosq_pub(node.mqtt_port, topic, "-q", q, "-m", f"m{q}").returncode == 0
    assert s.wait() == 0, "\n".join(s.lines)
    assert [line for line in s.lines if line.startswith(topic + " ")] == [f"{topic} m0", f"{topic} m1", f"{topic} m2"]
    assert any("received PUBLISH (d0, q2, r0" in line for line in s.lines), s.lines


# ================================================================ malformed packets (4.8)

MALFORMED = {
    "varint-5-bytes": b"\x30\x80\x80\x80\x80\x01",
    "topic-longer-than-packet": w.packet(w.PUBLISH, 0, b"\x00\x0aabc"),
    "publish-qos1-no-id": w.packet(w.PUBLISH, 2, w.s("a/b")),
    "topic-not-utf8": w.publish(b"a/\xff", b"x"),
    "topic-nul": w.publish(b"a\x00b", b"x"),
    "topic-surrogate": w.publish(b"a/\xed\xa0\x80", b"x"),
    "topic-overlong-utf8": w.publish(b"a/\xc0\xaf", b"x"),
    "type-0": b"\x00\x00",
    "type-15": b"\xf0\x00",
    "subscribe-flags-0": w.subscribe(1, [("a", 0)], flags=0),
    "subscribe-flags-3": w.subscribe(1, [("a", 0)], flags=3),
    "unsubscribe-flags-0": w.unsubscribe(1, ["a"], flags=0),
    "pubrel-flags-0": w.packet(w.PUBREL, 0, b"\x00\x01"),
    "puback-flags-2": w.packet(w.PUBACK, 2, b"\x00\x01"),
    "pingreq-flags-1": w.packet(w.PINGREQ, 1),
    "disconnect-flags-8": w.packet(w.DISCONNECT, 8),
    "subscribe-no-filter": w.packet(w.SUBSCRIBE, 2, b"\x00\x01"),
    "subscribe-qos-3": w.subscribe(1, [("a", 3)]),
    "subscribe-qos-reserved-bits": w.subscribe(1, [("a", 0x41)]),
    "subscribe-hash-not-last": w.subscribe(1, [("a/#/b", 0)]),
    "subscribe-plus-in-level": w.subscribe(1, [("a+", 0)]),
    "subscribe-empty-filter": w.subscribe(1, [("", 0)]),
    "subscribe-truncated-filter": w.packet(w.SUBSCRIBE, 2, b"\x00\x01\x00\x05ab"),
    "subscribe-no-qos-byte": w.packet(w.SUBSCRIBE, 2, b"\x00\x01" + w.s("a")),
    "subscribe-id-0": w.subscribe(0, [("a", 0)]),
    "unsubscribe-no-filter": w.packet(w.UNSUBSCRIBE, 2, b"\x00\x01"),
    "puback-3-bytes": w.packet(w.PUBACK, 0, b"\x00\x01\x00"),
    "puback-1-byte": w.packet(w.PUBACK, 0, b"\x00"),
    "pubrel-id-0": w.packet(w.PUBREL, 2, b"\x00\x00"),
    "pingreq-with-body": w.packet(w.PINGREQ, 0, b"x"),
    "disconnect-with-body": w.packet(w.DISCONNECT, 0, b"x"),
    "connack-from-client": w.packet(w.CONNACK, 0, b"\x00\x00"),
    "suback-from-client": w.packet(w.SUBACK, 0, b"\x00\x01\x00"),
    "unsuback-from-client": w.packet(w.UNSUBACK, 0, b"\x00\x01"),
    "pingresp-from-client": w.packet(w.PINGRESP, 0),
}


@pytest.fixture(scope="module")
def witness(node):
    """A paho client that keeps publishing to itself through the malformed-packet tests."""
    c = Paho(node.mqtt_port)
    c.topic = f"witness/{uid('t')}"
    c.subscribe((c.topic, 1))
    c.count = itertools.count()
    yield c
    c.close()


def witness_roundtrip(wc):
    payload = f"alive-{next(wc.count)}".encode()
    wc.publish(wc.topic, payload, qos=1)
    m = wc.get()
    assert m.payload == payload


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_packet_closes_only_that_connection(node, r, raws, witness, name):
    bystander = raw_session(raws, node.mqtt_port)
    c = raw_session(raws, node.mqtt_port)
    c.send(MALFORMED[name])
    assert c.closed_within(10), f"{name}: connection still open"
    ping_ok(bystander)
    witness_roundtrip(witness)


@pytest.mark.parametrize("name", ["varint-5-bytes", "type-0", "type-15", "topic-longer-than-packet"])
def test_malformed_first_packet_closes(node, raws, witness, name):
    c = raws(node.mqtt_port)
    c.send(MALFORMED[name])
    assert c.closed_within(10)
    witness_roundtrip(witness)


def test_info_counts_malformed_packets(node, r, raws):
    """Each connection closed for a packet that breaks the packet format adds to
    mqtt_malformed_packets (what INFO says the counter is)."""
    uncounted = []
    for name in ("varint-5-bytes", "type-15", "subscribe-flags-0", "topic-not-utf8", "subscribe-qos-3",
                 "puback-3-bytes", "pingreq-with-body", "disconnect-with-body", "connack-from-client"):
        before = mqtt_info(r)["mqtt_malformed_packets"]
        c = raw_session(raws, node.mqtt_port)
        c.send(MALFORMED[name])
        assert c.closed_within(10), name
        if mqtt_info(r)["mqtt_malformed_packets"] <= before:
            uncounted.append(name)
    assert not uncounted, f"closed as malformed but not counted in mqtt_malformed_packets: {uncounted}"


def test_max_packet(own_node, raws):
    """mqtt_max_packet bounds a whole packet (fixed header included): exactly the limit is
    taken, one byte more closes the connection; a header claiming a huge length is refused
    without waiting for its body."""
    limit = 4096
    n = own_node(mqtt_max_packet=limit)
    r = redis.Redis(port=n.port, socket_timeout=TIMEOUT)
    topic = "big/t"
    overhead = len(w.publish(topic, b"", qos=1))
    plen = next(k for k in range(limit - overhead - 4, limit) if len(w.publish(topic, b"x" * k, qos=1)) == limit)
    fits = w.publish(topic, b"x" * plen, qos=1, pid=1)
    assert len(fits) == limit
    bystander = raw_session(raws, n.mqtt_port)
    c = raw_session(raws, n.mqtt_port)
    c.send(fits)
    assert c.expect(w.PUBACK).pid == 1
    too_big = w.publish(topic, b"y" * (plen + 1), qos=1, pid=2)
    assert len(too_big) == limit + 1
    c.send(too_big)
    assert c.closed_within(10)
    assert [len(e[b"payload"]) for e in entries(r, topic)] == [plen]
    c = raw_session(raws, n.mqtt_port)
    c.send(b"\x30" + w.varint(200_000_000) + b"\x00\x03big")  # body never sent
    assert c.closed_within(10)
    c = raw_session(raws, n.mqtt_port)
    c.send(w.subscribe(1, [("s/" + "z" * limit, 0)]))
    assert c.closed_within(10)
    ping_ok(bystander)
    bystander.send(w.publish(topic, b"small", qos=1, pid=3))
    assert bystander.expect(w.PUBACK).pid == 3
    assert mqtt_info(r)["mqtt_malformed_packets"] >= 3
    r.close()


def test_default_max_packet_is_one_mib(node, raws, witness):
    c = raw_session(raws, node.mqtt_port)
    c.send(b"\x30" + w.varint((1 << 20) + 1) + b"\x00")
    assert c.closed_within(10)
    c = raw_session(raws, node.mqtt_port)
    topic = f"mib/{uid('t')}"
    c.send(w.publish(topic, b"p" * 500_000, qos=1, pid=5))
    assert c.expect(w.PUBACK).pid == 5
    witness_roundtrip(witness)


# ================================================================ INFO mqtt

def test_info_counters_move(own_node, raws, clients):
    """INFO mqtt on a server of its own, so that every count is known."""
    n = own_node()
    r = redis.Redis(port=n.port, socket_timeout=TIMEOUT)
    zero = mqtt_info(r)
    assert zero["mqtt_port"] == n.mqtt_port and zero["mqtt_topic_prefix"] == PREFIX
    for k in ("mqtt_connections", "mqtt_sessions", "mqtt_topics", "mqtt_retained", "mqtt_messages_in_qos0",
              "mqtt_messages_in_qos1", "mqtt_messages_in_qos2", "mqtt_messages_out_qos0", "mqtt_messages_out_qos1",
              "mqtt_messages_out_qos2", "mqtt_dropped", "mqtt_refused_connections", "mqtt_malformed_packets"):
        assert zero[k] == 0, k
    sub = clients(n.mqtt_port)
    sub.subscribe(("info/#", 2))
    pub = clients(n.mqtt_port)
    during = mqtt_info(r)
    assert (during["mqtt_connections"], during["mqtt_sessions"]) == (2, 2)
    for q in range(3):
        pub.publish(f"info/q{q}", b"x", qos=q, retain=q == 1)
    assert sorted(sub.get().qos for _ in range(3)) == [0, 1, 2]
    wait_until(lambda: mqtt_info(r)["mqtt_messages_out_qos2"] == 1, what="out counters")
    after = mqtt_info(r)
    for q in range(3):
        assert after[f"mqtt_messages_in_qos{q}"] == 1, q
        assert after[f"mqtt_messages_out_qos{q}"] == 1, q
    assert after["mqtt_topics"] >= 3
    assert after["mqtt_retained"] == 1
    c = raws(n.mqtt_port)
    c.send(w.connect("", clean=False))
    assert c.expect(w.CONNACK).code == w.BAD_ID
    c = raw_session(raws, n.mqtt_port)
    c.send(MALFORMED["type-15"])
    assert c.closed_within(10)
    last = mqtt_info(r)
    assert last["mqtt_refused_connections"] == 1
    assert last["mqtt_malformed_packets"] == 1
    sub.close()
    pub.close()
    wait_until(lambda: mqtt_info(r)["mqtt_connections"] == 0, what="connections to drop to 0")
    assert mqtt_info(r)["mqtt_sessions"] == 0  # clean sessions end with their connections
    r.close()


# ================================================================ flow control and limits

def test_max_inflight_holds_further_messages_until_acknowledged(own_node, raws):
    n = own_node(mqtt_max_inflight=2)
    topic = "infl/t"
    sub = raw_session(raws, n.mqtt_port)
    sub.send(w.subscribe(1, [(topic, 1)]))
    sub.expect(w.SUBACK)
    pub = raw_session(raws, n.mqtt_port)
    for i in range(5):
        pub.send(w.publish(topic, f"m{i}", qos=1, pid=i + 1))
        assert pub.expect(w.PUBACK).pid == i + 1
    first = [next_publish(sub, ack=False) for _ in range(2)]
    assert [p.payload for p in first] == [b"m0", b"m1"]
    assert_no_publish(sub)  # two in flight: the rest wait in the stream
    sub.send(w.puback(first[0].pid))
    p = next_publish(sub, ack=False)
    assert p.payload == b"m2"
    sub.send(w.puback(first[1].pid) + w.puback(p.pid))
    assert [next_publish(sub).payload for _ in range(2)] == [b"m3", b"m4"]


def test_a_full_queue_drops_the_oldest_qos0_messages_and_counts_them(own_node, raws):
    """--mqtt-max-queued: a persistent session away while 300 QoS 0 messages arrive finds the
    newest 50 when it comes back; the 250 before them are dropped, oldest first, and counted.
    A session taking its topic at QoS 1 loses nothing (and, away, slows no one)."""
    n = own_node(mqtt_max_queued=50)
    r = redis.Redis(host="127.0.0.1", port=n.port, socket_timeout=TIMEOUT)
    for cid, qos in (("q0", 0), ("q1", 1)):
        sub = raw_session(raws, n.mqtt_port, cid, clean=False)
        sub.send(w.subscribe(1, [(f"{cid}/t", qos)]))
        sub.expect(w.SUBACK)
        sub.send(w.disconnect())
        assert sub.closed_within(10)
    pub = raw_session(raws, n.mqtt_port)
    for i in range(300):
        pub.send(w.publish("q0/t", f"m{i}"))
    for i in range(300):
        pub.send(w.publish("q1/t", f"k{i}", qos=1, pid=i + 1))
        assert pub.expect(w.PUBACK).pid == i + 1
    assert r.xlen(PREFIX + "q0/t") == 300
    for cid, want in (("q0", [f"m{i}" for i in range(250, 300)]), ("q1", [f"k{i}" for i in range(300)])):
        sub = raw_session(raws, n.mqtt_port, cid, clean=False)
        assert [next_publish(sub).payload.decode() for _ in want] == want
        assert_no_publish(sub)
    info = mqtt_info(r)
    assert info["mqtt_dropped_queue_full"] == 250
    assert info["mqtt_dropped"] == 250
    r.close()


def test_a_full_queue_slows_qos1_publishers_and_loses_nothing(own_node, raws):
    """A connected QoS 1 subscriber that does not acknowledge: once its queue holds
    --mqtt-max-queued messages the publisher's PUBACKs are withheld (its messages are stored
    all the same); they leave, in order, once the subscriber catches up, and it gets every
    message once."""
    n = own_node(mqtt_max_queued=20, mqtt_max_inflight=10)
    r = redis.Redis(host="127.0.0.1", port=n.port, socket_timeout=TIMEOUT)
    topic = "slow/t"
    sub = raw_session(raws, n.mqtt_port)
    sub.send(w.subscribe(1, [(topic, 1)]))
    sub.expect(w.SUBACK)
    pub = raw_session(raws, n.mqtt_port)
    pub.send(b"".join(w.publish(topic, f"m{i}", qos=1, pid=i + 1) for i in range(100)))
    wait_until(lambda: r.xlen(PREFIX + topic) == 100, what="all 100 stored")
    acks = []
    try:
        while True:
            acks.append(pub.expect(w.PUBACK, timeout=GRACE).pid)
    except TimeoutError:
        pass
    # 10 in flight + 20 queued at most before the publisher waits (a little more: the queue
    # is counted as entries are written, PUBACKs leave as the log takes them)
    assert len(acks) < 100
    assert acks == list(range(1, len(acks) + 1))
    assert mqtt_info(r)["mqtt_publishers_slowed"] >= 1
    ping_ok(pub)  # slowed, not stopped: its other packets are served
    got = [next_publish(sub).payload.decode() for _ in range(100)]  # acknowledged now
    assert got == [f"m{i}" for i in range(100)]
    while len(acks) < 100:
        acks.append(pub.expect(w.PUBACK).pid)
    assert acks == list(range(1, 101))
    assert_no_publish(sub)
    assert mqtt_info(r)["mqtt_dropped"] == 0
    r.close()


def test_a_client_slowed_by_its_own_queue_goes_on(own_node, raws):
    """One connection publishing QoS 1 to a topic it subscribes to at QoS 1, past its own
    queue bound: its PUBACKs wait for its queue, which shrinks as it acknowledges what it
    receives (its input is still read), so everything arrives and everything is acknowledged."""
    n = own_node(mqtt_max_queued=10, mqtt_max_inflight=4)
    c = raw_session(raws, n.mqtt_port)
    c.send(w.subscribe(1, [("self/t", 1)]))
    c.expect(w.SUBACK)
    c.send(b"".join(w.publish("self/t", f"m{i}", qos=1, pid=i + 1) for i in range(200)))
    acked, got = [], []
    deadline = time.monotonic() + TIMEOUT
    while len(acked) < 200 or len(got) < 200:
        assert time.monotonic() < deadline, f"{len(acked)} PUBACKs, {len(got)} messages"
        p = c.read(TIMEOUT)
        if p.type == w.PUBACK:
            acked.append(p.pid)
        else:
            assert p.type == w.PUBLISH and p.qos == 1
            got.append(p.payload.decode())
            c.send(w.puback(p.pid))
    assert acked == list(range(1, 201))
    assert got == [f"m{i}" for i in range(200)]


def test_max_sessions_refuses_with_server_unavailable(own_node, raws):
    n = own_node(mqtt_max_sessions=2)
    raw_session(raws, n.mqtt_port, "s1")
    raw_session(raws, n.mqtt_port, "s2", clean=False)
    c = raws(n.mqtt_port)
    c.send(w.connect("s3"))
    p = c.expect(w.CONNACK)
    assert p.code == w.UNAVAILABLE  # 3.2.2.3: 0x03
    assert c.closed_within(10)


# ================================================================ durability, configuration

def test_durable_publish_and_retained_survive_a_restart(own_node, raws):
    """durability disk: PUBACK leaves once the entry is logged; after a restart the stream
    is there, and the retained message (kept 'durably, as every write' in its key) is still
    sent to a new subscriber."""
    n = own_node(durability="disk")
    c = raw_session(raws, n.mqtt_port)
    c.send(w.publish("dur/t", b"logged", qos=1, pid=1))
    assert c.expect(w.PUBACK).pid == 1
    c.send(w.publish("dur/r", b"kept", qos=1, pid=2, retain=True))
    assert c.expect(w.PUBACK).pid == 2
    c.close()
    n.stop(timeout=60)
    n.start(timeout=60)
    r = redis.Redis(port=n.port, socket_timeout=TIMEOUT)
    assert [e[b"payload"] for e in entries(r, "dur/t")] == [b"logged"]
    assert r.hget(RETAINED, "dur/r") == b"\x01kept"
    s = raw_session(raws, n.mqtt_port)
    s.send(w.subscribe(1, [("dur/r", 1)]))
    s.expect(w.SUBACK)
    try:
        p = next_publish(s, timeout=5)
    except TimeoutError:
        p = None
    r.close()
    assert p is not None and (p.payload, p.retain) == (b"kept", True), \
        "retained message not sent to a new subscriber after a restart (its key is still there)"


def test_persistent_session_across_a_restart(own_node, raws):
    """durability disk: a persistent session is kept over a restart -- its subscription, and
    the messages that came while its client was away, before and after the restart."""
    n = own_node(durability="disk")
    s = raw_session(raws, n.mqtt_port, "dr-sub", clean=False)
    s.send(w.subscribe(1, [("dr/s/#", 1)]))
    assert s.expect(w.SUBACK).codes == [1]
    s.send(w.disconnect())
    assert s.closed_within(10)
    p = raw_session(raws, n.mqtt_port)
    p.send(w.publish("dr/s/a", b"before-restart", qos=1, pid=1))
    assert p.expect(w.PUBACK).pid == 1
    p.close()
    n.stop(timeout=60)
    n.start(timeout=60)
    p = raw_session(raws, n.mqtt_port)
    p.send(w.publish("dr/s/a", b"after-restart", qos=1, pid=2))
    assert p.expect(w.PUBACK).pid == 2
    s = raws(n.mqtt_port)
    assert s.connect("dr-sub", clean=False).session_present == 1
    got = [next_publish(s).payload for _ in range(2)]
    assert got == [b"before-restart", b"after-restart"]
    p.send(w.publish("dr/s/b", b"live", qos=1, pid=3))
    assert p.expect(w.PUBACK).pid == 3
    assert next_publish(s).payload == b"live"


def test_config_errors():
    with pytest.raises(ConfigError, match="mqtt_port: not supported with --arch threadpool"):
        ServerConfig.load(mqtt_port=0, arch="threadpool")
    # start_node runs `kvstore serve`, which refuses the same settings at start
    with pytest.raises((ConfigError, ServerError), match="mqtt_port: not supported with --arch threadpool"):
        n = start_node(mqtt_port=0, arch="threadpool")
        stop_node(n)
    with pytest.raises(ConfigError, match="mqtt_topic_prefix: must not be empty"):
        ServerConfig.load(mqtt_port=0, mqtt_topic_prefix="")
    with pytest.raises(ConfigError, match="mqtt_port: must differ from the RESP ports"):
        ServerConfig.load(port=7001, mqtt_port=7001)


def test_mqtt_off_by_default(own_node):
    n = own_node(mqtt_port=None)
    assert n.mqtt_port is None
