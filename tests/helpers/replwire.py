"""The replication link's wire format from the client side (ext/durability/REPLICATION.md), in
Python, for tests that speak to a log receiver frame by frame: a fake sender (test_wal_units),
forged and tampered peers (test_repl_auth). Written from the spec, not from the C code: a test
that agrees with it checks the spec as well as the receiver."""
import hashlib
import hmac
import os
import socket
import struct

from . import faultlib as fl

MAGIC = 0x5052564B
VERSION = 2
(HELLO, HELLO_ACK, BATCH, ACK, FETCH, FILE, END, ERROR,
 AUTH_HELLO, AUTH_CHALLENGE, AUTH_PROOF) = range(1, 12)
ROLE_SENDER, ROLE_FETCH = 1, 2
SECRET = b"c2VjcmV0LXNoYXJlZC1ieS10aGUtcGFpci1vZi1ub2Rlcw=="  # what write_secret puts in the file


def write_secret(path, secret=SECRET, mode=0o600):
    """A replication secret file as an operator makes one (`chmod 600`); returns its path."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(secret + b"\n")
    os.chmod(path, mode)
    return str(path)


def pair_key(secret=SECRET):
    """The key both ends derive from the secret file: SHA-256 of its stripped content."""
    return hashlib.sha256(secret.strip()).digest()


def header(ftype, a, b, payload):
    crc = fl.crc32c(payload) if payload else 0
    return struct.pack("<IIIIQQ", MAGIC, ftype, len(payload), crc, a, b)


def frame(ftype, a=0, b=0, payload=b""):
    """An unauthenticated frame (the handshake's, or a version-1 peer's)."""
    return header(ftype, a, b, payload) + payload


def _derive(key, label, role, node_id, nonce_c, nonce_s):
    return hmac.new(key, label + b"\0" + bytes([role]) + node_id + nonce_c + nonce_s, hashlib.sha256).digest()


class Closed(Exception):
    """The receiver closed the connection (after an ERROR frame, if it sent one: .error)."""

    def __init__(self, error=None):
        super().__init__(error or "connection closed")
        self.error = error


class Link:
    """A client connection to a log receiver: handshake(), then MACed frames (send/recv)."""

    def __init__(self, port, host="127.0.0.1", timeout=5, ssl_context=None):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        if ssl_context is not None:  # --repl-tls: the frames inside TLS (the handshake runs here)
            self.sock = ssl_context.wrap_socket(self.sock, server_hostname=None)
        self.session = None
        self.send_seq = self.recv_seq = 0

    def _read(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(min(n - len(out), 1 << 20))
            if not chunk:
                raise Closed()
            out += chunk
        return out

    def recv_raw(self):
        """(type, a, b, payload, header bytes) of the next frame, its MAC (if any) not read."""
        try:
            hdr = self._read(32)
            magic, ftype, n, _, a, b = struct.unpack("<IIIIQQ", hdr)
            assert magic == MAGIC, f"not a replication frame: {hdr!r}"
            return ftype, a, b, self._read(n), hdr
        except OSError:  # reset, or a timeout: the receiver is done with us
            raise Closed() from None

    def mac(self, from_server, seq, hdr, payload):
        return hmac.new(self.session, bytes([from_server]) + struct.pack("<Q", seq) + hdr + payload,
                        hashlib.sha256).digest()

    def recv(self):
        """(type, a, b, payload) of the next frame, its MAC checked once authenticated.
        An ERROR frame raises Closed(its text)."""
        ftype, a, b, payload, hdr = self.recv_raw()
        if self.session is not None:
            got = self._read(32)
            assert hmac.compare_digest(got, self.mac(1, self.recv_seq, hdr, payload)), "bad MAC from the receiver"
            self.recv_seq += 1
        if ftype == ERROR:
            raise Closed(payload.decode(errors="replace"))
        return ftype, a, b, payload

    def sealed(self, ftype, a=0, b=0, payload=b"", seq=None):
        """The bytes of one authenticated frame (seq: the sequence number its MAC covers)."""
        hdr = header(ftype, a, b, payload)
        return hdr + payload + self.mac(0, self.send_seq if seq is None else seq, hdr, payload)

    def send(self, ftype, a=0, b=0, payload=b""):
        if self.session is None:
            self.sock.sendall(frame(ftype, a, b, payload))
        else:
            self.sock.sendall(self.sealed(ftype, a, b, payload))
            self.send_seq += 1

    def handshake(self, key, role, node_id):
        """Prove we hold key; check the receiver's proof; the session key MACs what follows."""
        nonce_c = os.urandom(32)
        self.send(AUTH_HELLO, VERSION, role, node_id + nonce_c)
        ftype, _, _, nonce_s = self.recv()
        assert ftype == AUTH_CHALLENGE and len(nonce_s) == 32
        self.send(AUTH_PROOF, 0, 0, _derive(key, b"kvstore repl v2 client proof", role, node_id, nonce_c, nonce_s))
        ftype, _, _, proof = self.recv()
        want = _derive(key, b"kvstore repl v2 server proof", role, node_id, nonce_c, nonce_s)
        assert ftype == AUTH_PROOF and hmac.compare_digest(proof, want), "the receiver's proof does not match"
        self.session = _derive(key, b"kvstore repl v2 session key", role, node_id, nonce_c, nonce_s)
        return self

    def closed(self, timeout=5):
        """Wait for the receiver to close; its ERROR frame's text, or None."""
        self.sock.settimeout(timeout)
        try:
            while True:
                self.recv()
        except Closed as e:
            return e.error
        except AssertionError:  # a frame we cannot check (it stopped MACing: a refusal)
            return None

    def close(self):
        self.sock.close()


class FakeSender:
    """A node's log sender, frame by frame, authenticated with key."""

    def __init__(self, port, node_id, key=None, ssl_context=None):
        self.link = Link(port, ssl_context=ssl_context).handshake(key or pair_key(), ROLE_SENDER, node_id)
        self.link.send(HELLO, VERSION, 0, node_id)
        ftype, self.held, _, _ = self.link.recv()
        assert ftype == HELLO_ACK

    def batch(self, *recs):
        """Send one BATCH; the LSN the ACK names (None: the connection was closed)."""
        lsns = [struct.unpack_from("<Q", r, len(r) - 8)[0] for r in recs]
        self.link.send(BATCH, lsns[0], lsns[-1], b"".join(recs))
        try:
            return self.link.recv()[1]
        except Closed:
            return None

    def close(self):
        self.link.close()


def stalled_strangers(port, n, first=b"K"):
    """n connections to the receiver at port that send the first bytes of a frame (or of a
    TLS ClientHello) and go silent: the sockets, for the caller to close."""
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(first)
        out.append(s)
    return out
