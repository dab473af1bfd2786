"""MQTT 3.1.1 from the client side, byte by byte, for conformance and fuzz tests: encoders
for every packet a client sends (and a few it must not), a decoder for what a server sends,
and RawMqtt, a blocking socket that sends bytes and reads whole packets back. Written from
the OASIS MQTT 3.1.1 standard (section numbers below are its), not from any server's code,
so the tests that use it check the server against the spec. Nothing here is validated on
the way out: the point is to be able to send packets a correct client never would."""
import socket
import struct
import time

# packet types (2.2.1)
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 10, 11, 12, 13, 14

# CONNACK return codes (3.2.2.3)
ACCEPTED, BAD_VERSION, BAD_ID, UNAVAILABLE, BAD_CREDENTIALS, NOT_AUTHORIZED = 0, 1, 2, 3, 4, 5


# ---- encoding

def varint(n):
    """The remaining length (2.2.3): 7 bits a byte, low first, the top bit says more follow.
    Any non-negative n is encoded (also past the 4 bytes MQTT allows)."""
    out = bytearray()
    while True:
        d = n & 127
        n >>= 7
        out.append(d | (128 if n else 0))
        if not n:
            return bytes(out)


def packet(ptype, flags, body=b"", length=None):
    """A whole packet: the fixed header (type, flags, remaining length) then body.
    length: the remaining length to claim instead of len(body) (bytes or an int)."""
    if length is None:
        length = len(body)
    rl = length if isinstance(length, (bytes, bytearray)) else varint(length)
    return bytes([(ptype << 4) | flags]) + rl + body


def s(v):
    """A length-prefixed string or binary field (1.5.3)."""
    if isinstance(v, str):
        v = v.encode()
    return struct.pack(">H", len(v)) + v


def connect_body(client_id="", clean=True, keepalive=60, will=None, user=None, password=None,
                 proto=b"MQTT", level=4, reserved=False, flags=None):
    """CONNECT's variable header and payload (3.1.2, 3.1.3). will: (topic, message, qos, retain).
    flags: the connect flags byte to send instead of the one the fields make."""
    f = 0
    if reserved:
        f |= 1
    if clean:
        f |= 2
    payload = s(client_id)
    if will is not None:
        topic, msg, wqos, wretain = will
        f |= 4 | (wqos << 3) | (32 if wretain else 0)
        payload += s(topic) + s(msg)
    if user is not None:
        f |= 128
        payload += s(user)
    if password is not None:
        f |= 64
        payload += s(password)
    if flags is not None:
        f = flags
    return s(proto) + bytes([level, f]) + struct.pack(">H", keepalive) + payload


def connect(client_id="", **kw):
    return packet(CONNECT, 0, connect_body(client_id, **kw))


def publish(topic, payload=b"", qos=0, pid=None, retain=False, dup=False):
    """PUBLISH (3.3). pid: the packet identifier (QoS 1 and 2; None: 1 when qos > 0)."""
    if isinstance(payload, str):
        payload = payload.encode()
    flags = (8 if dup else 0) | (qos << 1) | (1 if retain else 0)
    body = s(topic)
    if qos:
        body += struct.pack(">H", 1 if pid is None else pid)
    return packet(PUBLISH, flags, body + payload)


def ack(ptype, pid):
    """PUBACK, PUBREC, PUBREL (flags 2, 3.6.1), PUBCOMP, UNSUBACK: a packet identifier."""
    return packet(ptype, 2 if ptype == PUBREL else 0, struct.pack(">H", pid))


def puback(pid):
    return ack(PUBACK, pid)


def pubrec(pid):
    return ack(PUBREC, pid)


def pubrel(pid):
    return ack(PUBREL, pid)


def pubcomp(pid):
    return ack(PUBCOMP, pid)


def subscribe(pid, filters, flags=2):
    """SUBSCRIBE (3.8): filters is [(filter, qos)] (qos: the whole requested-QoS byte)."""
    body = struct.pack(">H", pid) + b"".join(s(f) + bytes([q]) for f, q in filters)
    return packet(SUBSCRIBE, flags, body)


def unsubscribe(pid, filters, flags=2):
    return packet(UNSUBSCRIBE, flags, struct.pack(">H", pid) + b"".join(s(f) for f in filters))


def pingreq():
    return packet(PINGREQ, 0)


def disconnect():
    return packet(DISCONNECT, 0)


# ---- decoding what the server sends

class Closed(Exception):
    """The server closed the connection (EOF or reset)."""


class Packet:
    """One packet received: type, flags and body, with PUBLISH's fields decoded."""

    def __init__(self, ptype, flags, body):
        self.type, self.flags, self.body = ptype, flags, body
        if ptype == PUBLISH:
            self.qos = (flags >> 1) & 3
            self.retain = bool(flags & 1)
            self.dup = bool(flags & 8)
            (tlen,) = struct.unpack(">H", body[:2])
            self.topic = body[2:2 + tlen].decode()
            off = 2 + tlen
            self.pid = None
            if self.qos:
                (self.pid,) = struct.unpack(">H", body[off:off + 2])
                off += 2
            self.payload = body[off:]
        elif ptype in (PUBACK, PUBREC, PUBREL, PUBCOMP, UNSUBACK, SUBACK) and len(body) >= 2:
            (self.pid,) = struct.unpack(">H", body[:2])
        if ptype == CONNACK and len(body) == 2:
            self.session_present = body[0] & 1
            self.code = body[1]
        if ptype == SUBACK:
            self.codes = list(body[2:])

    def __repr__(self):
        if self.type == PUBLISH:
            return (f"PUBLISH(topic={self.topic!r}, payload={self.payload!r}, qos={self.qos}, "
                    f"retain={self.retain}, dup={self.dup}, pid={self.pid})")
        return f"Packet(type={self.type}, flags={self.flags:#x}, body={self.body!r})"


class RawMqtt:
    """A TCP connection to an MQTT server that sends whatever bytes it is given and reads
    whole packets back (blocking, each read bounded by a timeout)."""

    def __init__(self, port, host="127.0.0.1", timeout=20.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = b""

    def send(self, data):
        """Send data; False when the server has already closed the connection."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            return False

    def _fill(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no packet from the server in time")
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            raise TimeoutError("no packet from the server in time") from None
        except (ConnectionResetError, ConnectionAbortedError):
            raise Closed("connection reset") from None
        if not chunk:
            raise Closed("EOF")
        self.buf += chunk

    def read(self, timeout=None):
        """The next packet (Packet); Closed if the server closes first, TimeoutError if
        nothing complete arrives within timeout seconds."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if len(self.buf) >= 2:
                length, mult, i = 0, 1, 1
                complete = False
                while i < len(self.buf) and i <= 4:
                    b = self.buf[i]
                    length += (b & 127) * mult
                    mult *= 128
                    i += 1
                    if not b & 128:
                        complete = True
                        break
                if complete and len(self.buf) >= i + length:
                    first = self.buf[0]
                    body = self.buf[i:i + length]
                    self.buf = self.buf[i + length:]
                    return Packet(first >> 4, first & 15, body)
            self._fill(deadline)

    def expect(self, ptype, timeout=None):
        """The next packet, which must be of type ptype."""
        p = self.read(timeout)
        assert p.type == ptype, f"expected packet type {ptype}, got {p!r}"
        return p

    def closed_within(self, timeout=10.0):
        """True when the server closes the connection within timeout seconds (any packets
        it sends first are read and dropped); False if it is still open then."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                self.read(max(0.0, deadline - time.monotonic()) or 0.001)
        except Closed:
            return True
        except TimeoutError:
            return False

    def connect(self, client_id, expect_code=ACCEPTED, **kw):
        """Send CONNECT and read the CONNACK: the Packet (its code checked)."""
        self.send(connect(client_id, **kw))
        p = self.expect(CONNACK)
        assert p.code == expect_code, f"CONNACK code {p.code}, expected {expect_code}"
        return p

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def abort(self):
        """Close with a TCP reset (SO_LINGER 0): an abnormal end, no DISCONNECT."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
