"""Client connections for the tests: Raw (exact bytes over TCP), UdpConn (the UDP front
end's framing) and client() (redis-py speaking RESP2)."""
import socket
import struct
import time

import kvstore

from .resp import Incomplete, resp_cmd, resp_parse, resp_reply_end


def client(port, **kw):
    """A redis-py client speaking RESP2 (kvstore speaks RESP2 only; redis-py >= 8
    would otherwise open with HELLO 3)."""
    kw.setdefault("socket_timeout", 10)
    kw.setdefault("protocol", 2)
    return kvstore.Client(host="127.0.0.1", port=port, **kw)


class Raw:
    """A plain TCP connection for sending exact bytes and reading exact replies."""

    def __init__(self, port, timeout=5.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = b""
        self.eof = False

    def send(self, data):
        self.sock.sendall(data)
        return self

    def _fill(self, deadline):
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = self.sock.recv(1 << 20)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.eof = True
        self.buf += chunk
        return chunk

    def reply(self, timeout=None):
        """Bytes of exactly one complete reply (raises on EOF or timeout)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            try:
                end = resp_reply_end(self.buf)
                out, self.buf = self.buf[:end], self.buf[end:]
                return out
            except Incomplete:
                pass
            if self.eof:
                raise EOFError(f"connection closed; partial reply {self.buf[:200]!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no complete reply; have {self.buf[:200]!r}")
            self._fill(deadline)

    def replies(self, n, timeout=None):
        return [self.reply(timeout) for _ in range(n)]

    def value(self, timeout=None):
        return resp_parse(self.reply(timeout))[0]

    def call(self, *args):
        """Send one command, return its decoded reply."""
        self.send(resp_cmd(*args))
        return self.value()

    def read_until_close(self, timeout=None):
        """Everything until the server closes: (bytes, closed?)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while not self.eof and time.monotonic() < deadline:
            try:
                self._fill(deadline)
            except (socket.timeout, TimeoutError):
                break
        out, self.buf = self.buf, b""
        return out, self.eof

    def read_for(self, seconds):
        """Whatever arrives within `seconds` (and whether the server closed)."""
        return self.read_until_close(timeout=seconds)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class UdpConn:
    """The UDP front end (--arch udp/dpdk; framing in ext/udpfront.h) over a connected
    UDP socket: each request one datagram with the next id, replies returned in request
    order. Nothing is resent: a lost datagram, or a dead server, is a socket.timeout."""

    def __init__(self, port, host="127.0.0.1", timeout=5.0):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.connect((host, port))
        self.sock.settimeout(timeout)
        self.next_id = 1
        self.early = {}  # id -> (flags, reply) received before the one awaited

    def send(self, request, flags=0):
        rid = self.next_id
        self.next_id += 1
        self.sock.send(struct.pack(">IHH", rid, 0, flags) + request)
        return rid

    def reply(self, rid):
        """(flags, RESP reply) of request rid."""
        while rid not in self.early:
            d = self.sock.recv(65536)
            got, _seq, flags = struct.unpack(">IHH", d[:8])
            self.early[got] = (flags, d[8:])
        return self.early.pop(rid)

    def exchange(self, requests):
        """Send every request, then yield their replies (RESP bytes) in order."""
        ids = [self.send(r) for r in requests]
        for rid in ids:
            yield self.reply(rid)[1]

    def call(self, *args):
        return self.reply(self.send(resp_cmd(*args)))[1]

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
