"""MQTT QoS 1 survives kill -9 and the loss of a machine: every message a PUBACK
acknowledged is in its topic's stream after the restart, and none is there twice
(each publisher sends each message once, so a second copy could only come from the
server). A persistent session's subscriber that was away gets, after the restart,
every acknowledged message published meanwhile (ext/frontend/mqtt.h: a PUBACK is
held until the log holds the XADD; the session's key says how far its client read).

Publishers are raw sockets here, not a client library, so the test knows exactly
which PUBACKs arrived before the kill: paho would resend unacknowledged messages on
reconnect and hide a loss."""
import shutil
import socket
import struct
import threading
import time

import pytest
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from helpers import faultlib as fl
from helpers.conn import client

pytestmark = pytest.mark.timeout(240)

WINDOW = 16


def packet(first, body):
    n, length = len(body), b""
    while True:
        d, n = n % 128, n // 128
        length += bytes([d | (128 if n else 0)])
        if not n:
            return bytes([first]) + length + body


def s16(b):
    return struct.pack(">H", len(b)) + b


class Publisher(threading.Thread):
    """QoS 1 PUBLISHes of distinct payloads to one topic, WINDOW in flight, until stopped
    or cut off; `acked` holds the payloads whose PUBACK came."""

    def __init__(self, port, name, stop):
        super().__init__(daemon=True)
        self.port, self.name, self.stop = port, name, stop
        self.topic = b"dev/" + name.encode()
        self.acked, self.sent = [], {}

    def run(self):
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            cid = ("pub-" + self.name).encode()
            s.sendall(packet(0x10, s16(b"MQTT") + bytes([4, 2, 0, 60]) + s16(cid)))
            assert s.recv(4) == b"\x20\x02\x00\x00"
            buf, i, next_id = b"", 0, 1
            while not self.stop.is_set():
                while len(self.sent) < WINDOW:
                    payload = b"%s:%07d:" % (self.name.encode(), i) + b"x" * 60
                    self.sent[next_id] = payload
                    s.sendall(packet(0x32, s16(self.topic) + struct.pack(">H", next_id) + payload))
                    i, next_id = i + 1, next_id % 60000 + 1
                data = s.recv(4096)
                if not data:
                    return
                buf += data
                while len(buf) >= 4:
                    assert buf[0] == 0x40 and buf[1] == 2, buf[:4]
                    (pid,) = struct.unpack(">H", buf[2:4])
                    self.acked.append(self.sent.pop(pid))
                    buf = buf[4:]
        except OSError:
            pass  # the server was killed: what was in flight may or may not be stored


def publish_then_kill(port, kill, n=3, at_least=300, seconds=20):
    stop = threading.Event()
    pubs = [Publisher(port, f"p{i}", stop) for i in range(n)]
    for p in pubs:
        p.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and min(len(p.acked) for p in pubs) < at_least:
        time.sleep(0.05)
    kill()
    stop.set()
    for p in pubs:
        p.join(timeout=15)
    assert all(p.acked for p in pubs), "a publisher got no PUBACK before the kill"
    return pubs


def check_streams(port, pubs):
    with client(port) as c:
        for p in pubs:
            entries = c.xrange(b"mqtt:" + p.topic, "-", "+")
            payloads = [f[b"payload"] for _, f in entries]
            assert len(payloads) == len(set(payloads)), f"{p.topic}: a message stored twice"
            have = set(payloads)
            lost = [x for x in p.acked if x not in have]
            assert not lost, f"{p.topic}: {len(lost)} of {len(p.acked)} PUBACKed messages lost, e.g. {lost[:2]}"
            assert all(f[b"qos"] == b"1" and f[b"client"] == b"pub-" + p.name.encode() for _, f in entries)


class Subscriber:
    """A paho client with a persistent session (clean session 0) and a QoS 1 subscription."""

    def __init__(self, port, topic=b"dev/#"):
        self.got, self.present = [], None
        self.c = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="keeper",
                             clean_session=False, protocol=mqtt.MQTTv311)
        self.c.on_message = lambda c, u, m: self.got.append(m.payload)
        self.c.on_connect = lambda c, u, f, rc, p: setattr(self, "present", f.session_present)
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        deadline = time.monotonic() + 10
        while self.present is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.present is not None, "no CONNACK"
        self.topic = topic

    def subscribe(self):
        r, mid = self.c.subscribe(self.topic.decode(), 1)
        assert r == mqtt.MQTT_ERR_SUCCESS

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


def wait_for(pred, what, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_kill9_during_qos1_publishing_loses_and_doubles_nothing_acknowledged(tmp_path):
    with fl.started_nodes(mqtt_port=0) as start:
        n = start(tmp_path)
        pubs = publish_then_kill(n.mqtt_port, n.kill)
        n = start(tmp_path)
        check_streams(n.port, pubs)
        n.stop()


def test_a_persistent_session_gets_what_was_published_while_away_across_kill9(tmp_path):
    with fl.started_nodes(mqtt_port=0) as start:
        n = start(tmp_path)
        sub = Subscriber(n.mqtt_port)
        assert sub.present is False
        sub.subscribe()
        time.sleep(0.5)  # SUBACK (held for the log: the session is saved)
        sub.close()
        pubs = publish_then_kill(n.mqtt_port, n.kill, n=2, at_least=200)
        n = start(tmp_path)
        sub = Subscriber(n.mqtt_port)
        assert sub.present is True, "the session was not kept across the restart"
        acked = {x for p in pubs for x in p.acked}
        wait_for(lambda: acked <= set(sub.got), "every acknowledged message to reach the persistent session")
        sub.close()
        # what it acknowledged is not sent again on the next connection
        sub2 = Subscriber(n.mqtt_port)
        time.sleep(1.0)
        assert not (acked & set(sub2.got)), "acknowledged messages delivered again"
        sub2.close()
        n.stop()


@pytest.mark.timeout(150)
def test_machine_loss_keeps_every_acknowledged_message_from_the_peer(pair):
    """durability remote: the node is killed and its directory deleted; rebuilt from the
    peer's copy of its log, every PUBACKed message is in its stream, once."""
    pair.extra = {"mqtt_port": 0}
    pair.start_both()
    a = pair.nodes["a"]
    pubs = publish_then_kill(a.mqtt_port, lambda: pair.kill("a"))
    shutil.rmtree(pair.dirs["a"])
    a = pair.start("a", from_peer=True)
    check_streams(a.port, pubs)


def test_a_subscriber_far_behind_gets_messages_whose_batches_left_memory(tmp_path):
    """256 KiB of memory and a data file: a persistent session away while 3,000
    messages arrive, whose sealed batches are written to the batch store and leave
    memory; on reconnect every message comes, in order (the batches out of memory
    are read back through XREAD, which waits for the loader)."""
    from helpers.keyspace import SPILL, fill, wait_flushed
    with fl.started_nodes(mqtt_port=0, **SPILL) as start:
        n = start(tmp_path)
        sub = Subscriber(n.mqtt_port, topic=b"far/#")
        sub.subscribe()
        time.sleep(0.5)
        sub.close()
        sent = [b"m:%05d:" % i + b"y" * 70 for i in range(3000)]
        pub = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="far-pub",
                          protocol=mqtt.MQTTv311)
        pub.connect("127.0.0.1", n.mqtt_port)
        pub.loop_start()
        for m in sent:
            pub.publish("far/x", m, qos=1)
        with client(n.port) as c:
            wait_for(lambda: c.xlen(b"mqtt:far/x") == len(sent), "every message stored")
        pub.disconnect()
        pub.loop_stop()
        fill(n.port, b"fill", 3000)
        i = wait_flushed(n.port)
        assert i["datafile_batches_evicted"] > 0, "no batch of the stream left memory"
        loads = i["datafile_batches_loaded"]
        sub = Subscriber(n.mqtt_port, topic=b"far/#")
        assert sub.present is True
        wait_for(lambda: len(sub.got) >= len(sent), "the messages to arrive", timeout=60)
        assert sub.got[:len(sent)] == sent
        assert fl.persistence(n.port)["datafile_batches_loaded"] > loads, "nothing was read back"
        sub.close()
        n.stop()
