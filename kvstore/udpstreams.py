"""kvstore.udpstreams: publish to and pull from streams over the UDP front end (--arch udp),
with the framing of ext/frontend/udpfront.h: a datagram of k messages for one stream
appended as one batch (KVU_F_XADD), and a pull of one sealed batch (KVU_F_PULL), which the
pull cache's XDP program may answer before the server sees it.

    with UdpStreams("127.0.0.1", 6380) as u:
        first_id, k = u.xadd(b"sensors", [b"21.5", b"21.7"])
        answer = u.pull(b"sensors", 0)  # status, version, entries: ext/core/stream.h

One request in flight at a time; a lost datagram raises socket.timeout (UDP: nothing is
resent). RESP clients see the same streams (XRANGE, XREADGROUP)."""
import socket
import struct

F_REPLY, F_ERROR, F_XADD, F_PULL = 0x1, 0x2, 0x4, 0x8
SEALED, OPEN, NO_BATCH, NO_STREAM, TOO_LARGE = range(5)


class UdpStreams:
    def __init__(self, host, port, timeout=2.0):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.connect((host, port))
        self.sock.settimeout(timeout)
        self.next_id = 1

    def _call(self, flags, body):
        rid = self.next_id
        self.next_id = (self.next_id + 1) & 0xFFFFFFFF
        self.sock.send(struct.pack(">IHH", rid, 0, flags) + body)
        while True:
            d = self.sock.recv(65536)
            got, _seq, rflags = struct.unpack(">IHH", d[:8])
            if got == rid:
                return rflags, d[8:]

    def xadd(self, key, messages, field=b"v"):
        """Append messages (bytes) to stream key as entries FIELD message, one batch:
        (first entry ID, count); the IDs are consecutive. A command error raises ValueError."""
        body = struct.pack(">H", len(key)) + key + struct.pack(">H", len(field)) + field
        body += struct.pack(">H", len(messages)) + b"".join(struct.pack(">H", len(m)) + m for m in messages)
        _flags, reply = self._call(F_XADD, body)
        if not reply.startswith(b"*2\r\n"):
            raise ValueError(reply.decode(errors="replace").strip())
        parts = reply.split(b"\r\n")
        return parts[2].decode(), int(parts[3][1:])

    def pull(self, key, no, pad=True):
        """The pull answer (bytes: status, version, entries, ext/core/stream.h) of batch number
        no of stream key. pad: the datagram is padded to 1,472 bytes (one MTU), room for the answer, which
        the pull cache (XDP) writes in its place; an unpadded pull is the engine's to answer."""
        body = struct.pack(">H", len(key)) + key + struct.pack(">Q", no)
        _flags, reply = self._call(F_PULL, body + b"\0" * (1464 - len(body)) if pad else body)
        if reply[:1] == b"-":
            raise ValueError(reply.decode(errors="replace").strip())
        return reply

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
