"""The UDP front end's stream framing (ext/frontend/udpfront.h), written from its
description: a batch of messages for one stream (KVU_F_XADD) and a pull of one batch
(KVU_F_PULL), and a decoder of the pull answer (ext/core/stream.h xs_pull_encode)."""
import struct

F_REPLY, F_ERROR, F_XADD, F_PULL = 0x1, 0x2, 0x4, 0x8
SEALED, OPEN, NO_BATCH, NO_STREAM, TOO_LARGE = range(5)


def xadd_frame(key, field, messages):
    """The request body (after the 8-byte header) of a KVU_F_XADD datagram."""
    out = struct.pack(">H", len(key)) + key + struct.pack(">H", len(field)) + field
    out += struct.pack(">H", len(messages))
    for m in messages:
        out += struct.pack(">H", len(m)) + m
    return out


def pull_frame(key, no, pad=0):
    """A pull's body; pad: zero bytes after it (room for the answer, which the pull cache
    writes in the request's place: the body padded to 1,464 makes a 1,472-byte datagram)."""
    body = struct.pack(">H", len(key)) + key + struct.pack(">Q", no)
    return body + b"\0" * max(0, pad - len(body))


def _varint(b, i):
    v = shift = 0
    while True:
        x = b[i]
        i += 1
        v |= (x & 0x7F) << shift
        if not x & 0x80:
            return v, i
        shift += 7


def decode_pull(body):
    """A pull answer as a dict: status, and for a batch (sealed, open, too large) count,
    version, no, first_ms and entries [(id 'ms-seq', deleted, [f, v, ...])]; for no such
    batch: no, oldest, next; for no such stream: no."""
    status = body[0]
    if status in (NO_BATCH, NO_STREAM):
        out = {"status": status, "no": struct.unpack(">Q", body[8:16])[0]}
        if status == NO_BATCH:
            out["oldest"], out["next"] = struct.unpack(">QQ", body[16:32])
            assert len(body) == 32
        else:
            assert len(body) == 16
        return out
    assert status in (SEALED, OPEN, TOO_LARGE) and body[1] == 0, body[:24]
    count, version, no, first_ms = struct.unpack(">HIQQ", body[2:24])
    entries, i = [], 24
    while i < len(body):
        flags = body[i]
        dms, i = _varint(body, i + 1)
        seq, i = _varint(body, i)
        nf, i = _varint(body, i)
        fields = []
        for _ in range(2 * nf):
            n, i = _varint(body, i)
            fields.append(body[i:i + n])
            i += n
        entries.append((f"{first_ms + dms}-{seq}", bool(flags & 1), fields))
    assert i == len(body)
    if status != TOO_LARGE:
        assert len(entries) == count, (len(entries), count)
    return {"status": status, "count": count, "version": version, "no": no, "first_ms": first_ms,
            "entries": entries}
