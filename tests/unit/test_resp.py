"""Properties of the incremental RESP request parser (ext/resp.c), driven through cffi.

The tests feed the parser the way the server does (ext/server.c process_input): the
bytes received so far sit in a growing buffer; the parser is called with the buffer
from the start of the current request; on RESP_DONE the request's arguments are read,
the request start advances by p.scan and the parser is reset; on RESP_AGAIN more bytes
are appended and the parser is called again with the same request start.

Whatever way a stream is split into reads, the sequence of parsed requests must be the
same. Every call gets a fresh buffer followed by "poison" bytes that are not part of
the data, so a parser reading past the length it was given would misparse.
"""
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvstore._native import ffi, lib

RESP_ERROR, RESP_AGAIN, RESP_DONE = -1, 0, 1
MAX_INLINE = 64 * 1024
# Bytes placed after the valid data of every call: a parser that looks past `len`
# finds line ends, headers and a complete request here and would misbehave.
POISON = b"\r\n*1\r\n$1\r\nX\r\n\n\r\n"


class Parser:
    """A resp_parser with its argv freed deterministically."""

    def __init__(self, unauth=False):
        self.p = ffi.new("struct resp_parser *")
        lib.resp_parser_init(self.p)
        self.p.unauth = 1 if unauth else 0

    def close(self):
        lib.resp_parser_free(self.p)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def parse(self, data):
        """One resp_parse call over `data` (the bytes from the request start).
        Returns (rc, args or None, buffer)."""
        buf = ffi.new("char[]", data + POISON)
        rc = lib.resp_parse(self.p, buf, len(data))
        p = self.p
        assert p.scan <= len(data), (rc, p.scan, len(data))
        if rc == RESP_DONE:
            assert p.scan > 0
            assert 0 <= p.argc <= p.argcap or (p.argc == 0)
            args = []
            for i in range(p.argc):
                off, n = p.argv[i].off, p.argv[i].len
                assert off + n <= p.scan, (i, off, n, p.scan)
                args.append(ffi.unpack(buf + off, n))
            return rc, args
        if rc == RESP_ERROR:
            assert p.err != ffi.NULL
            return rc, None
        assert rc == RESP_AGAIN, rc
        return rc, None

    @property
    def err(self):
        return ffi.string(self.p.err).decode("latin-1")


def feed(chunks, unauth=False):
    """Emulate the server over the successive reads `chunks`.

    Returns (requests, final) where requests is the list of parsed argument lists and
    final is ("again", leftover_bytes) or ("error", message)."""
    requests = []
    data = b""
    start = 0
    with Parser(unauth) as parser:
        for chunk in chunks:
            data += chunk
            while True:
                rc, args = parser.parse(data[start:])
                if rc == RESP_DONE:
                    requests.append(args)
                    start += parser.p.scan
                    lib.resp_reset(parser.p)
                    continue
                if rc == RESP_ERROR:
                    return requests, ("error", parser.err)
                break  # RESP_AGAIN: wait for the next read
        return requests, ("again", data[start:])


def split_at(data, cuts):
    cuts = sorted(set(c for c in cuts if 0 < c < len(data)))
    out, prev = [], 0
    for c in cuts:
        out.append(data[prev:c])
        prev = c
    out.append(data[prev:])
    return out


# ---------------------------------------------------------------- stream generation

def encode_multibulk(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


tricky_args = st.sampled_from([b"", b"\r\n", b"\r", b"\n", b"\r\n\r\n", b"$3\r\n", b"*1\r\n",
                               b"\x00", b"\xff\xfe", b"-ERR x\r\n", b"$-1\r\n", b'"', b"'"])
bulk_arg = st.one_of(
    st.binary(max_size=40),
    tricky_args,
    st.lists(st.one_of(st.binary(max_size=6), tricky_args), max_size=4).map(b"".join),
)

WORD_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-:.{}@#%&+=/,<>"
inline_word = st.text(alphabet=WORD_CHARS, min_size=1, max_size=12).map(str.encode)


def dquote(b):
    """Double-quoted inline argument (sdssplitargs syntax) that decodes to b."""
    named = {b"\n"[0]: b"\\n", b"\r"[0]: b"\\r", b"\t"[0]: b"\\t", b"\b"[0]: b"\\b",
             b"\a"[0]: b"\\a", b'"'[0]: b'\\"', b"\\"[0]: b"\\\\"}
    out = []
    for i, c in enumerate(b):
        if c in named and (i % 2 == 0):
            out.append(named[c])
        elif 0x20 <= c < 0x7F and c not in (0x22, 0x5C):
            out.append(bytes([c]))
        else:
            out.append((b"\\x%02x" if i % 3 else b"\\x%02X") % c)
    return b'"' + b"".join(out) + b'"'


def squote(b):
    """Single-quoted inline argument: everything literal except \\' for a quote."""
    return b"'" + b.replace(b"'", b"\\'") + b"'"


squote_content = st.text(alphabet=WORD_CHARS + " \"\t$*'", max_size=10).map(str.encode)


@st.composite
def inline_request(draw):
    """(raw line, expected args) of an inline command."""
    n = draw(st.integers(0, 5))
    raw, expected = [], []
    for _ in range(n):
        kind = draw(st.sampled_from(["word", "word", "word", "dq", "sq"]))
        if kind == "word":
            w = draw(inline_word)
            raw.append(w)
            expected.append(w)
        elif kind == "dq":
            b = draw(st.binary(max_size=12))
            raw.append(dquote(b))
            expected.append(b)
        else:
            b = draw(squote_content)
            raw.append(squote(b))
            expected.append(b)
    lead = draw(st.sampled_from([b"", b" ", b"\t", b"  "]))
    seps = [draw(st.sampled_from([b" ", b"  ", b"\t", b" \t "])) for _ in raw]
    trail = draw(st.sampled_from([b"", b" ", b"\t"]))
    line = lead + b"".join(w + (s if i < len(raw) - 1 else b"") for i, (w, s) in enumerate(zip(raw, seps)))
    line += trail + draw(st.sampled_from([b"\r\n", b"\n"]))
    assume(not line.startswith(b"*"))
    return line, expected


@st.composite
def multibulk_request(draw):
    args = draw(st.lists(bulk_arg, max_size=6))
    return encode_multibulk(args), args


empty_request = st.sampled_from([(b"*0\r\n", []), (b"*-1\r\n", []), (b"\r\n", []), (b"\n", []),
                                 (b"   \r\n", [])])

request = st.one_of(multibulk_request(), multibulk_request(), inline_request(), empty_request)


@st.composite
def stream(draw, min_size=1, max_size=8):
    reqs = draw(st.lists(request, min_size=min_size, max_size=max_size))
    return b"".join(r for r, _ in reqs), [a for _, a in reqs]


# ---------------------------------------------------------------- valid streams

def test_single_multibulk():
    assert feed([b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"]) == ([[b"SET", b"k", b""]], ("again", b""))


def test_single_inline():
    assert feed([b"SET k v\r\n"]) == ([[b"SET", b"k", b"v"]], ("again", b""))
    assert feed([b"  get   k \n"]) == ([[b"get", b"k"]], ("again", b""))


def test_inline_quotes_and_escapes():
    line = b'set "a\\x41\\x4a\\n\\"q\\\\" \'it\\\'s\' "" \'\'\r\n'
    assert feed([line]) == ([[b"set", b"aAJ\n\"q\\", b"it's", b"", b""]], ("again", b""))


@pytest.mark.parametrize("raw", [b"*0\r\n", b"*-1\r\n", b"*-5\r\n", b"\r\n", b"\n", b" \t \r\n"])
def test_empty_requests(raw):
    with Parser() as parser:
        rc, args = parser.parse(raw)
        assert rc == RESP_DONE
        assert parser.p.argc == 0 and args == []
        assert parser.p.scan == len(raw)


def test_pipeline_leaves_partial_request():
    data = encode_multibulk([b"GET", b"a"]) + b"PING\r\n" + b"*2\r\n$3\r\nGET\r\n$5\r\nab"
    assert feed([data]) == ([[b"GET", b"a"], [b"PING"]], ("again", b"*2\r\n$3\r\nGET\r\n$5\r\nab"))


def _check_all_splittings(data, expected):
    # one read
    assert feed([data]) == (expected, ("again", b""))
    # one byte per read: every boundary is a split
    assert feed([data[i:i + 1] for i in range(len(data))]) == (expected, ("again", b""))
    # every two-way split
    for k in range(1, len(data)):
        assert feed([data[:k], data[k:]]) == (expected, ("again", b"")), k


FIXED_STREAMS = [
    (encode_multibulk([b"SET", b"key\r\nwith\r\nnewlines", b"\r\n"]) + b"GET key\r\n"
     + encode_multibulk([]) + encode_multibulk([b"", b"", b""]) + b"\n" + b"*-1\r\n"
     + encode_multibulk([bytes(range(256))]) + b'ECHO "x\\r\\ny" \'a b\'\n',
     [[b"SET", b"key\r\nwith\r\nnewlines", b"\r\n"], [b"GET", b"key"], [], [b"", b"", b""], [], [],
      [bytes(range(256))], [b"ECHO", b"x\r\ny", b"a b"]]),
    (b"PING\r\n" * 3 + encode_multibulk([b"$5\r\nhello", b"*2\r\n"]) + b"  \r\n",
     [[b"PING"]] * 3 + [[b"$5\r\nhello", b"*2\r\n"], []]),
    (encode_multibulk([b"x" * 70, b"\r\n" * 10]) + encode_multibulk([b"MSET"] + [b"k%d" % i for i in range(12)]),
     [[b"x" * 70, b"\r\n" * 10], [b"MSET"] + [b"k%d" % i for i in range(12)]]),
]


@pytest.mark.parametrize("idx", range(len(FIXED_STREAMS)))
def test_fixed_stream_every_split(idx):
    data, expected = FIXED_STREAMS[idx]
    _check_all_splittings(data, expected)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream(max_size=6))
def test_generated_stream_every_split(s):
    data, expected = s
    _check_all_splittings(data, expected)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream(), st.data())
def test_generated_stream_random_splits(s, data_st):
    data, expected = s
    cuts = data_st.draw(st.lists(st.integers(0, len(data)), max_size=12))
    assert feed(split_at(data, cuts)) == (expected, ("again", b""))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream(), st.data())
def test_unauth_does_not_change_small_requests(s, data_st):
    data, expected = s
    assume(all(len(a) <= 10 and all(len(x) <= 16384 for x in a) for a in expected))
    cuts = data_st.draw(st.lists(st.integers(0, len(data)), max_size=6))
    assert feed(split_at(data, cuts), unauth=True) == (expected, ("again", b""))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream(), st.data())
def test_truncated_stream_waits(s, data_st):
    """A stream cut anywhere parses the complete requests before the cut and then
    waits; the rest of the stream completes it."""
    data, expected = s
    k = data_st.draw(st.integers(0, len(data)))
    reqs, final = feed([data[:k]])
    assert final[0] == "again"
    assert reqs == expected[:len(reqs)]
    assert feed([data[:k], data[k:]]) == (expected, ("again", b""))


@st.composite
def mutated_stream(draw):
    """A valid stream with a few random byte edits: mostly malformed input."""
    data = bytearray(draw(stream())[0])
    noise = st.one_of(st.binary(min_size=1, max_size=3),
                      st.sampled_from([b"\r", b"\n", b"\r\n", b"*", b"$", b"-", b"0", b"9", b'"', b"'",
                                       b"\\", b" ", b"$-1", b"*-1", b"99999999999"]))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert":
            data[pos:pos] = draw(noise)
        elif op == "delete":
            del data[pos:pos + draw(st.integers(1, 4))]
        else:
            data[pos:pos + 1] = draw(noise)
    return bytes(data)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_stream(), st.booleans(), st.data())
def test_any_bytes_parse_the_same_however_split(data, unauth, data_st):
    """For any input (valid or not, below the 64 KiB line limits) the outcome -- the
    requests parsed, then the error or the unparsed rest -- does not depend on how
    the bytes were split into reads."""
    whole = feed([data], unauth=unauth)
    cuts = data_st.draw(st.lists(st.integers(0, len(data)), max_size=10))
    assert feed(split_at(data, cuts), unauth=unauth) == whole
    assert feed([data[i:i + 1] for i in range(len(data))], unauth=unauth) == whole


# ---------------------------------------------------------------- malformed streams

PREFIX = encode_multibulk([b"PING"])
ERRORS = [
    # (stream, unauth, message)
    (b"*abc\r\n", False, "Protocol error: invalid multibulk length"),
    (b"*-x\r\n", False, "Protocol error: invalid multibulk length"),
    (b"*2147483648\r\n", False, "Protocol error: invalid multibulk length"),  # Redis 7: INT_MAX
    (b"*99999999999999999999999\r\n", False, "Protocol error: invalid multibulk length"),
    (b"*9223372036854775808\r\n", False, "Protocol error: invalid multibulk length"),
    (b"*01\r\n", False, "Protocol error: invalid multibulk length"),
    (b"*+1\r\n", False, "Protocol error: invalid multibulk length"),
    (b"* 1\r\n", False, "Protocol error: invalid multibulk length"),
    (b"*-0\r\n", False, "Protocol error: invalid multibulk length"),
    (b"*\r\n", False, "Protocol error: invalid multibulk length"),
    (b"*1\r\n$-1\r\n", False, "Protocol error: invalid bulk length"),
    (b"*2\r\n$1\r\na\r\n$-1\r\n", False, "Protocol error: invalid bulk length"),
    (b"*1\r\n$abc\r\n", False, "Protocol error: invalid bulk length"),
    (b"*1\r\n$536870913\r\n", False, "Protocol error: invalid bulk length"),
    (b"*1\r\n$\r\n", False, "Protocol error: invalid bulk length"),
    (b"*1\r\n$03\r\n", False, "Protocol error: invalid bulk length"),
    (b"*1\r\n$+3\r\n", False, "Protocol error: invalid bulk length"),
    (b"*1\r\n:1\r\n", False, "Protocol error: expected '$', got ':'"),
    (b"*2\r\n$1\r\na\r\n+OK\r\n", False, "Protocol error: expected '$', got '+'"),
    (b'set "abc\r\n', False, "Protocol error: unbalanced quotes in request"),
    (b"set 'abc\r\n", False, "Protocol error: unbalanced quotes in request"),
    (b'set "a"b\r\n', False, "Protocol error: unbalanced quotes in request"),
    (b"set 'a'b\n", False, "Protocol error: unbalanced quotes in request"),
    (b'set "a\\"\r\n', False, "Protocol error: unbalanced quotes in request"),
    (b"*11\r\n", True, "Protocol error: unauthenticated multibulk length"),
    (b"*1\r\n$16385\r\n", True, "Protocol error: unauthenticated bulk length"),
]


@pytest.mark.parametrize("raw,unauth,message", ERRORS, ids=[repr(e[0])[:40] for e in ERRORS])
def test_protocol_errors(raw, unauth, message):
    # in one read
    assert feed([raw], unauth=unauth) == ([], ("error", message))
    # one byte per read: no request and no error before the last byte
    assert feed([raw[i:i + 1] for i in range(len(raw))], unauth=unauth) == ([], ("error", message))
    with Parser(unauth) as parser:
        for k in range(1, len(raw)):
            rc, _ = parser.parse(raw[:k])
            assert rc == RESP_AGAIN, (raw[:k], parser.err if rc == RESP_ERROR else rc)
        rc, _ = parser.parse(raw)
        assert rc == RESP_ERROR and parser.err == message
    # after valid pipelined requests
    assert feed([PREFIX + b"GET k\r\n" + raw], unauth=unauth) == ([[b"PING"], [b"GET", b"k"]],
                                                                  ("error", message))


def test_unauth_limits_are_inclusive():
    assert feed([b"*10\r\n"], unauth=True) == ([], ("again", b"*10\r\n"))
    raw = b"*1\r\n$16384\r\n"
    assert feed([raw], unauth=True) == ([], ("again", raw))
    value = b"v" * 16384
    assert feed([raw + value + b"\r\n"], unauth=True) == ([[value]], ("again", b""))
    # authenticated clients get the normal limits
    assert feed([b"*11\r\n$16385\r\n"]) == ([], ("again", b"*11\r\n$16385\r\n"))


def test_multibulk_count_limit_is_inclusive():
    assert feed([b"*1048576\r\n"]) == ([], ("again", b"*1048576\r\n"))
    assert feed([b"*1\r\n$536870912\r\n"]) == ([], ("again", b"*1\r\n$536870912\r\n"))


def _grow_until_error(prefix, filler, limit_len):
    """Feed prefix + filler bytes until the buffer (from the request start) is exactly
    limit_len bytes: must still wait; one more byte: must fail."""
    with Parser() as parser:
        data = prefix
        step = 8192
        while len(data) < limit_len:
            data += filler * min(step, limit_len - len(data))
            rc, _ = parser.parse(data)
            assert rc == RESP_AGAIN, (len(data), parser.err if rc == RESP_ERROR else rc)
        assert len(data) == limit_len
        rc, _ = parser.parse(data + filler)
        assert rc == RESP_ERROR
        return parser.err


def test_too_big_inline_request():
    assert _grow_until_error(b"", b"a", MAX_INLINE) == "Protocol error: too big inline request"
    assert feed([b"a" * (MAX_INLINE + 100)]) == ([], ("error", "Protocol error: too big inline request"))


def test_too_big_mbulk_count_string():
    assert _grow_until_error(b"*", b"1", MAX_INLINE) == "Protocol error: too big mbulk count string"
    assert feed([b"*" + b"1" * (MAX_INLINE + 100)]) == ([], ("error", "Protocol error: too big mbulk count string"))


def test_too_big_bulk_count_string():
    # the limit counts from the start of the bulk header, not of the request
    head = b"*2\r\n$1\r\na\r\n"
    with Parser() as parser:
        data = head + b"$" + b"1" * (MAX_INLINE - 1)
        rc, _ = parser.parse(data)
        assert rc == RESP_AGAIN, parser.err if rc == RESP_ERROR else rc
        rc, _ = parser.parse(data + b"1")
        assert rc == RESP_ERROR
        assert parser.err == "Protocol error: too big bulk count string"
    assert feed([head + b"$" + b"1" * (MAX_INLINE + 100)]) == ([], ("error", "Protocol error: too big bulk count string"))


# ---------------------------------------------------------------- memory stays bounded

def test_declared_huge_bulk_allocates_nothing():
    """A client declaring a 512 MB bulk and sending 1 MB of it: the parser holds no
    memory proportional to the declared length (argv grows per received argument)."""
    head = b"*2\r\n$536870912\r\n"
    with Parser() as parser:
        data = bytearray(head)
        chunk = b"z" * 65536
        for _ in range(16):
            data += chunk
            rc, _ = parser.parse(bytes(data))
            assert rc == RESP_AGAIN
            assert parser.p.argc == 0
            assert parser.p.argcap <= 8
            assert parser.p.scan == len(head)
            assert parser.p.bulk == 536870912


def test_declared_huge_count_allocates_per_argument():
    head = b"*1048576\r\n"
    with Parser() as parser:
        rc, _ = parser.parse(head)
        assert rc == RESP_AGAIN and parser.p.argcap <= 8
        data = head + b"$1\r\nx\r\n" * 100
        rc, _ = parser.parse(data)
        assert rc == RESP_AGAIN
        assert parser.p.argc == 100
        assert parser.p.argcap <= 256
        assert parser.p.pending == 1048576 - 100


def test_parser_state_reset():
    with Parser() as parser:
        rc, args = parser.parse(b"*1\r\n$4\r\nPING\r\n")
        assert rc == RESP_DONE and args == [b"PING"]
        lib.resp_reset(parser.p)
        assert parser.p.scan == 0 and parser.p.argc == 0
        assert parser.p.pending == -1 and parser.p.bulk == -1
        rc, args = parser.parse(b"ECHO hi\n")
        assert rc == RESP_DONE and args == [b"ECHO", b"hi"]


def test_inline_unescapes_in_place_within_request():
    """Inline unescaping writes inside the request only, never past p.scan."""
    line = b'set k "\\x41\\x42\\x43"\r\n'
    follow = b"*1\r\n$4\r\nPING\r\n"
    buf = ffi.new("char[]", line + follow)
    with Parser() as parser:
        rc = lib.resp_parse(parser.p, buf, len(line) + len(follow))
        assert rc == RESP_DONE
        assert parser.p.scan == len(line)
        assert ffi.unpack(buf + len(line), len(follow)) == follow
        a = parser.p.argv[2]
        assert ffi.unpack(buf + a.off, a.len) == b"ABC"


def test_expected_dollar_message_format():
    for c in b":+-*#x0":
        raw = b"*1\r\n" + bytes([c]) + b"3\r\n"
        assert feed([raw]) == ([], ("error", "Protocol error: expected '$', got '%c'" % c))


def test_byte_after_cr_is_skipped_as_redis_does():
    """Redis skips the byte after '\\r' in length lines without checking it is '\\n'."""
    assert feed([b"*1\rX$4\rYPING\r\n"]) == feed([b"*1\r\n$4\r\nPING\r\n"])


def test_large_multibulk_count_waits_for_arguments():
    """A count up to INT_MAX is accepted (as Redis 7); memory grows only with arguments received."""
    p = ffi.new("struct resp_parser *")
    lib.resp_parser_init(p)
    data = b"*2000000000\r\n" + b"$1\r\nk\r\n" * 1000
    buf = ffi.new("char[]", data)
    assert lib.resp_parse(p, buf, len(data)) == RESP_AGAIN
    assert p.argc == 1000 and p.argcap <= 1024
    lib.resp_parser_free(p)
