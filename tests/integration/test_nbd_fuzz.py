"""The NBD server against random and mutated input (hypothesis): garbage in place of a handshake,
valid handshakes with bytes flipped, lengths lied about and options cut short, request streams
with random fields, and valid request streams split at random points. After every example the
server is up, a connection opened before the example still transmits, and a fresh connection
round-trips data. Well-formed requests with random fields must each get one well-formed reply
(tests/helpers/nbdwire.py checks every reply against the spec) and leave the stream in step.
Run against `kvstore blockdev serve` on a unix socket and TCP. Not against `nbdkit memory`, the
reference of test_nbd_protocol.py: Debian's nbdkit 1.32.5 aborts (an assertion in
raw_send_socket) when a client closes with replies unsent, which is what this fuzz does at random,
so a run against it fails by chance."""
import os
import random
import struct
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from helpers import nbdwire as w

SIZE, BS = 64 << 20, 4096
# NBD_FUZZ_EXAMPLES=2000 for a longer campaign than the suite's
FUZZ = settings(max_examples=int(os.environ.get("NBD_FUZZ_EXAMPLES", 60)), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SPEC_ERRORS = {w.EPERM, w.EIO, w.ENOMEM, w.EINVAL, w.ENOSPC, w.EOVERFLOW, w.ENOTSUP, w.ESHUTDOWN}


@pytest.fixture(scope="module", params=[k for k in w.KINDS if not k.startswith("nbdkit")])
def target(request):
    t = w.start(request.param, size=SIZE)
    t.witness = t.open()
    yield t
    t.witness.close()
    t.stop()


def check_server(target):
    """The server is up, the connection opened before the examples still works, and a fresh
    connection round-trips data."""
    assert target.alive(), f"the server died:\n{target.log()}"
    data = os.urandom(512)
    off = SIZE - 2 * BS + random.randrange(0, BS, 512)
    assert target.witness.write(off, data).error == 0
    assert target.witness.read(off, 512).data == data
    with target.open(structured=True) as c:
        data = os.urandom(BS)
        assert c.write(SIZE - BS, data).error == 0
        assert c.read(SIZE - BS, BS).data == data


def throw(target, prefix_steps, payload, pieces=1):
    """Open a connection, run prefix_steps(conn), send payload (in `pieces` parts), read what
    comes back for a moment, close. What the server answers is not checked here: only that
    it survives (check_server)."""
    c = target.connect(timeout=5)
    try:
        prefix_steps(c)
        cuts = sorted(random.sample(range(1, len(payload)), min(pieces - 1, max(len(payload) - 1, 0))))
        last = 0
        for cut in cuts + [len(payload)]:
            c.send(payload[last:cut])
            last = cut
        c.closed_by_server(0.2)
    except w.Closed:
        pass
    finally:
        c.close()


def mutate(data, flips):
    """data with bytes replaced at (position fraction, new byte) pairs."""
    b = bytearray(data)
    for frac, byte in flips:
        if b:
            b[int(frac * (len(b) - 1))] = byte
    return bytes(b)


# ---------------------------------------------------------------- strategies

u16, u32, u64 = st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF), st.integers(0, (1 << 64) - 1)
flips = st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=4)
known_opts = st.sampled_from([w.OPT_EXPORT_NAME, w.OPT_ABORT, w.OPT_LIST, w.OPT_STARTTLS, w.OPT_INFO, w.OPT_GO,
                              w.OPT_STRUCTURED_REPLY, w.OPT_LIST_META_CONTEXT, w.OPT_SET_META_CONTEXT,
                              w.OPT_EXTENDED_HEADERS])
names = st.one_of(st.just("kvstore"), st.just(""), st.text(max_size=40), st.binary(max_size=40))
info_types = st.lists(st.one_of(st.integers(0, 4), u16), max_size=6)


@st.composite
def an_option(draw):
    opt = draw(st.one_of(known_opts, u32))
    if opt in (w.OPT_INFO, w.OPT_GO) and draw(st.booleans()):
        name = draw(names)
        data = w.info_data(name if isinstance(name, bytes) else name.encode(), draw(info_types))
    else:
        data = draw(st.binary(max_size=64))
    lie = draw(st.one_of(st.none(), st.none(), st.integers(0, 80), st.sampled_from([0xFFFFFFFF, 1 << 31, 65536])))
    return w.option(opt, data, length=lie)


@st.composite
def a_handshake(draw):
    cflags = draw(st.one_of(st.sampled_from([0, 1, 3]), u32))
    opts = draw(st.lists(an_option(), min_size=1, max_size=5))
    return mutate(struct.pack(">I", cflags) + b"".join(opts), draw(flips))


offsets = st.one_of(st.integers(0, SIZE - 1), st.sampled_from([0, SIZE - 512, SIZE - 1, SIZE, SIZE + BS,
                                                               1 << 63, (1 << 64) - 512]))
lengths = st.one_of(st.integers(1, 65536), st.sampled_from([0, 1, 511, BS, BS + 1, 65536, w.MAX_PAYLOAD + 1,
                                                            0xFFFFFFFF]))
commands = st.one_of(st.sampled_from([w.CMD_READ, w.CMD_WRITE, w.CMD_FLUSH, w.CMD_TRIM, w.CMD_WRITE_ZEROES,
                                      w.CMD_CACHE, w.CMD_BLOCK_STATUS, w.CMD_RESIZE]), u16)
cmd_flags = st.one_of(st.sampled_from([0, w.CMD_FLAG_FUA, w.CMD_FLAG_NO_HOLE, w.CMD_FLAG_DF, w.CMD_FLAG_FAST_ZERO,
                                       w.CMD_FLAG_REQ_ONE]), u16)


@st.composite
def a_raw_request(draw):
    """A request with any fields; a WRITE's payload may be short or long."""
    magic = draw(st.one_of(st.just(w.REQUEST_MAGIC), st.just(w.REQUEST_MAGIC), u32))
    cmd, length = draw(commands), draw(lengths)
    hdr = w.request(cmd, draw(offsets), length, draw(cmd_flags), draw(u64), magic)
    payload = b""
    if cmd == w.CMD_WRITE:
        n = draw(st.one_of(st.just(min(length, 65536)), st.integers(0, 512)))
        payload = bytes(n)
    return hdr + payload


@st.composite
def a_framed_request(draw):
    """A request the server can frame (valid magic; a WRITE's payload exactly its length, at
    most 64 KiB; no DISC) but with any type, flags, offset and length."""
    cmd = draw(commands.filter(lambda c: c != w.CMD_DISC))
    length = draw(st.integers(0, 65536) if cmd == w.CMD_WRITE else lengths.filter(lambda n: n <= 1 << 20))
    return cmd, draw(cmd_flags), draw(offsets), length


# ---------------------------------------------------------------- properties

@FUZZ
@given(junk=st.binary(max_size=300), pieces=st.integers(1, 4))
def test_garbage_instead_of_a_handshake(target, junk, pieces):
    throw(target, lambda c: c.greeting(), junk, pieces)
    check_server(target)


@FUZZ
@given(data=a_handshake(), pieces=st.integers(1, 4))
def test_mutated_handshakes(target, data, pieces):
    throw(target, lambda c: c.greeting(), data, pieces)
    check_server(target)


@FUZZ
@given(reqs=st.lists(a_raw_request(), min_size=1, max_size=8), structured=st.booleans(), flip=flips,
       pieces=st.integers(1, 4))
def test_random_and_mutated_request_streams(target, reqs, structured, flip, pieces):
    throw(target, lambda c: c.handshake(target.export, structured=structured),
          mutate(b"".join(reqs), flip), pieces)
    check_server(target)


@FUZZ
@given(reqs=st.lists(a_framed_request(), min_size=1, max_size=10), structured=st.booleans(),
       pieces=st.integers(1, 6))
def test_framed_requests_with_random_fields_each_get_one_valid_reply(target, reqs, structured, pieces):
    with target.open(structured=structured) as c:
        stream, handles = b"", []
        for i, (cmd, flags, off, length) in enumerate(reqs):
            h = (i << 48) | random.getrandbits(48)
            handles.append(h)
            c.expect_reply(h, cmd, off, length)
            stream += w.request(cmd, off, length, flags, h) + (os.urandom(length) if cmd == w.CMD_WRITE else b"")
        cuts = sorted(random.sample(range(1, len(stream)), min(pieces - 1, len(stream) - 1)))
        last = 0
        for cut in cuts + [len(stream)]:
            c.send(stream[last:cut])
            last = cut
            time.sleep(0.001)   # let the server see a partial request
        for h in handles:   # nbdwire raises Violation on any reply the spec does not allow
            r = c.recv_reply(h)
            assert r.error == 0 or r.error in SPEC_ERRORS, r
        data = os.urandom(512)   # and the stream is still in step
        assert c.write(BS, data).error == 0 and c.read(BS, 512).data == data
    check_server(target)


def test_many_bad_clients_at_once_while_a_good_one_works(target):
    """16 threads throw junk, cut handshakes and garbled requests at the server at the same
    time (its connections spread over its worker threads) while one client keeps writing and
    reading back: every round trip of the good client is right, and the server stays up."""
    def bad_client(seed):
        rnd = random.Random(seed)
        for _ in range(15):
            valid = struct.pack(">I", 3) + w.option(w.OPT_STRUCTURED_REPLY) + \
                w.option(w.OPT_GO, w.info_data(target.export))
            reqs = b"".join(w.request(rnd.choice([0, 1, 3, 4, 6, 0x77]), rnd.randrange(SIZE // 2),
                                      rnd.randrange(1 << 16), rnd.randrange(1 << 16), rnd.getrandbits(64))
                            for _ in range(4))   # offsets in the lower half: the good client's is the top
            data = bytearray(valid + reqs)
            for _ in range(rnd.randrange(4)):
                data[rnd.randrange(len(data))] = rnd.randrange(256)
            try:
                with target.connect(timeout=5) as c:
                    c.greeting()
                    c.send(bytes(data[:rnd.randrange(1, len(data) + 1)]))
                    c.closed_by_server(rnd.choice([0, 0.01, 0.1]))
            except (w.Closed, OSError):
                pass

    threads = [threading.Thread(target=bad_client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    with target.open(structured=True) as good:
        while any(t.is_alive() for t in threads):
            data = os.urandom(BS + 100)
            off = SIZE - 4 * BS + random.randrange(BS)
            assert good.write(off, data).error == 0
            assert good.read(off, len(data)).data == data
    for t in threads:
        t.join()
    check_server(target)


REGION = 64 * BS   # where the model test works: [BASE, BASE + REGION)
BASE = 16 << 20


@st.composite
def an_io(draw):
    kind = draw(st.sampled_from(["write", "write", "read", "zero", "trim", "flush"]))
    off = draw(st.one_of(st.integers(0, REGION - 1), st.sampled_from([0, BS - 1, BS, REGION - BS])))
    n = draw(st.one_of(st.integers(1, 3 * BS), st.sampled_from([1, BS, 2 * BS + 1])))
    n = min(n, REGION - off)
    return kind, off, n, draw(st.sampled_from([0, w.CMD_FLAG_FUA]))


@FUZZ
@given(ios=st.lists(an_io(), min_size=1, max_size=25), structured=st.booleans())
def test_random_unaligned_io_matches_a_model(target, ios, structured):
    check_model(target, ios, structured)


@pytest.fixture(scope="module", params=[512, 65536], ids=lambda bs: f"kvstore-bs{bs}")
def other_block_size(request):
    t = w.start("kvstore", size=SIZE, block_size=request.param)
    yield t
    t.stop()


@FUZZ
@given(ios=st.lists(an_io(), min_size=1, max_size=25), structured=st.booleans())
def test_random_unaligned_io_matches_a_model_with_other_block_sizes(other_block_size, ios, structured):
    check_model(other_block_size, ios, structured)


def check_model(target, ios, structured):
    """Writes, zeroes and trims at any offset and length (read-modify-write of edge blocks)
    read back as a plain bytearray says; trimmed bytes are unknown until written again
    (the spec lets them read as anything)."""
    model, known = bytearray(REGION), bytearray(b"\1") * REGION
    with target.open(structured=structured) as c:
        assert c.request(w.CMD_WRITE_ZEROES, BASE, REGION).error == 0
        for kind, off, n, flags in ios:
            if kind == "write":
                data = os.urandom(n)
                assert c.write(BASE + off, data, flags).error == 0
                model[off:off + n], known[off:off + n] = data, b"\1" * n
            elif kind == "zero":
                assert c.request(w.CMD_WRITE_ZEROES, BASE + off, n, flags).error == 0
                model[off:off + n], known[off:off + n] = bytes(n), b"\1" * n
            elif kind == "trim":
                assert c.request(w.CMD_TRIM, BASE + off, n, flags).error == 0
                known[off:off + n] = bytes(n)
            elif kind == "flush":
                assert c.request(w.CMD_FLUSH, flags=flags).error == 0
            else:
                got = c.read(BASE + off, n, flags).data
                for i in range(n):
                    if known[off + i]:
                        assert got[i] == model[off + i], f"byte {off + i} of the region: {ios}"
        got = c.read(BASE, REGION).data
        assert all(g == m for g, m, k in zip(got, model, known) if k), "the region differs from the model"
