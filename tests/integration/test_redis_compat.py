"""Byte-for-byte comparison with a real redis-server.

Each case sends the SAME raw bytes over a plain socket to redis-server and to
kvstore and compares what comes back:
  - "replies" cases: the N replies, then a PING on the same connection (so a
    server that closed, or sent extra bytes, shows up too);
  - "close" cases (protocol errors): everything until the server closes the
    connection (or 2 s pass), and whether it closed.
Where a value legitimately differs (HELLO's server/version/id, CLIENT ID, INFO,
TIME, COMMAND COUNT) the structure is compared instead.
"""
import pytest
import redis

from helpers.conn import Raw
from helpers.resp import info_dict, resp_cmd, resp_parse
from helpers.servers import PASSWORD, start_node, stop_node

pytestmark = pytest.mark.timeout(60)

C = resp_cmd
PING = C("PING")


# Every request-handling architecture must give the same bytes: the whole module
# runs once per architecture / EPOLLOUT policy (--arch, --poll-policy).
# The thread pool closes a client stalled mid-request after --client-timeout-ms (test_limits.py);
# Redis never does: here the timeout is longer than until_close's wait, so the bytes compare.
ARCHS = {"poller-direct": {}, "poller-strict": {"poll_policy": "strict"},
         "poller-flexpoll": {"poll_policy": "flexpoll"},
         "threadpool": {"arch": "threadpool", "threads": 8, "client_timeout_ms": 10000}}


@pytest.fixture(scope="module", params=list(ARCHS))
def kv_plain(request):
    """kvstore with no memory bound (CONFIG GET maxmemory is 0, as on redis-server)."""
    settings = {"threads": 2, **ARCHS[request.param]}
    n = start_node(**settings)
    yield n
    stop_node(n)


def converse(port, request, n_replies, flush=True, auth=None):
    """Send `request`, read `n_replies` replies, then PING: the list of raw replies."""
    with Raw(port) as r:
        if auth:
            assert r.send(C("AUTH", auth)).reply() == b"+OK\r\n"
        if flush:
            assert r.send(C("FLUSHALL")).reply() == b"+OK\r\n"
        return converse_on(r, request, n_replies)


def until_close(port, request, auth=None, flush=True, wait=2.0):
    """Send `request`; everything the server sends until it closes: (bytes, closed)."""
    with Raw(port) as r:
        if auth:
            assert r.send(C("AUTH", auth)).reply() == b"+OK\r\n"
        if flush:
            assert r.send(C("FLUSHALL")).reply() == b"+OK\r\n"
        r.send(request)
        return r.read_until_close(timeout=wait)


# ----------------------------------------------------------------- reply cases

LONG = "x" * 200
REPLY_CASES = [
    # basics
    ("ping", PING, 1),
    ("ping-arg", C("PING", "hello"), 1),
    ("echo", C("ECHO", "a\r\nb\x00c"), 1),
    ("set-get", C("SET", "k", "v") + C("GET", "k") + C("GET", "missing"), 3),
    ("del-multi", C("SET", "a", "1") + C("SET", "b", "2") + C("DEL", "a", "b", "c", "a"), 3),
    ("exists-dup", C("SET", "a", "1") + C("EXISTS", "a", "a", "b", "a"), 2),
    ("mget", C("MSET", "a", "1", "b", "2") + C("MGET", "a", "nope", "b"), 2),
    ("append-strlen", C("APPEND", "s", "abc") + C("APPEND", "s", "de") + C("STRLEN", "s")
     + C("STRLEN", "none") + C("GET", "s"), 5),
    ("nul-in-number", C("INCRBY", "k", "1\0") + C("EXPIRE", "k", "1\0") + C("HINCRBY", "h", "f", "2\0")
     + C("SET", "k", "v", "EX", "5\0"), 4),
    ("dbsize", C("DBSIZE") + C("SET", "a", "1") + C("DBSIZE") + C("FLUSHALL") + C("DBSIZE"), 5),
    ("flushall-args", C("FLUSHALL", "ASYNC") + C("FLUSHALL", "SYNC") + C("FLUSHALL", "FOO"), 3),
    ("case-insensitive", C("sEt", "k", "v", "nX") + C("gEt", "k"), 2),
    # unknown commands, arguments quoted and cut at 128 bytes
    ("unknown-noargs", C("FOO"), 1),
    ("unknown-args", C("foo", "a", "b c"), 1),
    ("unknown-long-arg", C("foo", LONG), 1),
    ("unknown-many-long-args", C("foo", "a" * 100, "b" * 100, "c" * 100), 1),
    ("unknown-long-name", C("n" * 300, "x"), 1),
    ("unknown-crlf-arg", C("foo", "a\r\nb"), 1),
    ("unknown-nul-arg", C("foo", "a\x00b", "c"), 1),
    ("unknown-empty-name", b"*1\r\n$0\r\n\r\n", 1),
    ("unknown-inline", b"FOO bar baz\r\n", 1),
    # wrong arity
    ("arity-get", C("GET") + C("GET", "a", "b"), 2),
    ("arity-set", C("SET", "a"), 1),
    ("arity-incr", C("INCR") + C("INCR", "a", "b"), 2),
    ("arity-mset", C("MSET", "a") + C("MSET", "a", "1", "b"), 2),
    ("arity-client-setname", C("CLIENT", "SETNAME") + C("CLIENT", "SETNAME", "a", "b"), 2),
    ("arity-client", C("CLIENT") + C("CLIENT", "GETNAME", "x") + C("CLIENT", "ID", "x"), 3),
    ("arity-misc", C("PING", "a", "b") + C("ECHO") + C("DEL") + C("EXISTS") + C("MGET")
     + C("STRLEN") + C("APPEND", "a") + C("DBSIZE", "x") + C("TIME", "x") + C("SELECT")
     + C("INCRBY", "a") + C("DECRBY", "a", "1", "2") + C("AUTH"), 13),
    ("arity-config", C("CONFIG") + C("CONFIG", "GET"), 2),
    # SET options and syntax errors
    ("set-nx-xx", C("SET", "k", "v", "NX", "XX") + C("SET", "k", "v", "XX", "NX"), 2),
    ("set-ex-px", C("SET", "k", "v", "EX", "10", "PX", "100") + C("SET", "k", "v", "PX", "100", "EX", "1"), 2),
    ("set-ex-0", C("SET", "k", "v", "EX", "0") + C("SET", "k", "v", "PX", "0"), 2),
    ("set-ex-neg", C("SET", "k", "v", "EX", "-1") + C("SET", "k", "v", "PXAT", "-5"), 2),
    ("set-ex-abc", C("SET", "k", "v", "EX", "abc") + C("SET", "k", "v", "EX", "1.5")
     + C("SET", "k", "v", "EX", "010") + C("SET", "k", "v", "EX", " 1"), 4),
    ("set-keepttl-ex", C("SET", "k", "v", "KEEPTTL", "EX", "10") + C("SET", "k", "v", "EX", "10", "KEEPTTL"), 2),
    ("set-missing-arg", C("SET", "k", "v", "EX") + C("SET", "k", "v", "FOO") + C("SET", "k", "v", "NX", "NX"), 3),
    ("set-ex-overflow", C("SET", "k", "v", "EX", "9223372036854775807")
     + C("SET", "k", "v", "PX", "9223372036854775807") + C("SET", "k", "v", "EXAT", "9223372036854775807")
     + C("SET", "k", "v", "EX", "99999999999999999999"), 4),
    ("set-ex-twice", C("SET", "k", "v", "EX", "10", "EX", "20") + C("SET", "k", "v", "PX", "10", "PX", "20000")
     + C("GET", "k"), 3),
    ("set-repeated-flags", C("SET", "k", "v", "NX", "NX") + C("SET", "k", "v", "KEEPTTL", "KEEPTTL")
     + C("SET", "k", "w", "GET", "GET"), 3),
    ("set-exat-past", C("SET", "k", "v", "EXAT", "1") + C("GET", "k") + C("EXISTS", "k")
     + C("SET", "k", "v", "PXAT", "1") + C("DBSIZE"), 5),
    ("set-nx-xx-ok", C("SET", "k", "v", "XX") + C("SET", "k", "v", "NX") + C("SET", "k", "w", "NX")
     + C("SET", "k", "w", "XX") + C("GET", "k"), 5),
    ("set-get-opt", C("SET", "k", "v1", "GET") + C("SET", "k", "v2", "GET") + C("SET", "k", "v3", "NX", "GET")
     + C("SET", "k", "v4", "XX", "GET") + C("GET", "k"), 5),
    ("set-ex-ok", C("SET", "k", "v", "EX", "100") + C("SET", "k", "v", "PX", "100000")
     + C("SET", "k", "v", "EXAT", "4102444800") + C("SET", "k", "v", "KEEPTTL") + C("GET", "k"), 5),
    # integers
    ("incr-basic", C("INCR", "n") + C("INCRBY", "n", "41") + C("DECR", "n") + C("DECRBY", "n", "-10")
     + C("GET", "n"), 5),
    ("incr-not-integer", C("SET", "n", "abc") + C("INCR", "n") + C("DECR", "n") + C("INCRBY", "n", "1"), 4),
    ("incr-odd-integers", C("SET", "n", "00") + C("INCR", "n") + C("SET", "n", "-0") + C("INCR", "n")
     + C("SET", "n", " 1") + C("INCR", "n") + C("SET", "n", "1 ") + C("INCR", "n")
     + C("SET", "n", "+1") + C("INCR", "n") + C("SET", "n", "") + C("INCR", "n"), 12),
    ("incr-overflow", C("SET", "n", "9223372036854775807") + C("INCR", "n") + C("INCRBY", "n", "1")
     + C("GET", "n"), 4),
    ("decr-overflow", C("SET", "n", "-9223372036854775808") + C("DECR", "n") + C("DECRBY", "n", "1"), 3),
    ("decrby-llong-min", C("DECRBY", "n", "-9223372036854775808") + C("GET", "n"), 2),
    ("incrby-llong-min", C("INCRBY", "n", "-9223372036854775808") + C("GET", "n"), 2),
    ("incrby-bad-arg", C("INCRBY", "n", "abc") + C("INCRBY", "n", "1.5") + C("INCRBY", "n", "99999999999999999999")
     + C("INCRBY", "n", "") + C("DECRBY", "n", "x"), 5),
    ("incr-too-long-value", C("SET", "n", "1" * 25) + C("INCR", "n") + C("SET", "n", "18446744073709551616")
     + C("INCR", "n"), 4),
    # SELECT, AUTH without a password
    ("select", C("SELECT", "0") + C("SELECT", "1") + C("SELECT", "abc") + C("SELECT", "-1"), 4),
    ("auth-no-password", C("AUTH", "pw") + C("AUTH", "default", "anything") + C("AUTH", "someone", "pw")
     + C("AUTH", "a", "b", "c"), 4),
    # CLIENT
    ("client-name", C("CLIENT", "GETNAME") + C("CLIENT", "SETNAME", "conn-1") + C("CLIENT", "GETNAME")
     + C("CLIENT", "SETNAME", "") + C("CLIENT", "GETNAME"), 5),
    ("client-name-bad", C("CLIENT", "SETNAME", "a b") + C("CLIENT", "SETNAME", "a\nb"), 2),
    ("client-unknown-sub", C("CLIENT", "FOO") + C("CONFIG", "FOO") + C("COMMAND", "FOO"), 3),
    # HELLO errors
    ("hello-errors", C("HELLO", "4") + C("HELLO", "1") + C("HELLO", "2", "FOO"), 3),
    ("hello-not-integer", C("HELLO", "abc"), 1),
    # CONFIG GET on settings both have with the same value
    ("config-get", C("CONFIG", "GET", "maxmemory") + C("CONFIG", "GET", "maxmemory-policy")
     + C("CONFIG", "GET", "appendonly") + C("CONFIG", "GET", "databases") + C("CONFIG", "GET", "nonexistent")
     + C("CONFIG", "GET", "save"), 6),
    ("config-get-uppercase", C("CONFIG", "GET", "MAXMEMORY"), 1),
    ("config-set-errors", C("CONFIG", "SET", "maxmemory", "abc") + C("CONFIG", "SET", "foo", "bar"), 2),
    ("flushdb", C("SET", "a", "1") + C("FLUSHDB") + C("DBSIZE") + C("FLUSHDB", "ASYNC") + C("FLUSHDB", "x"), 5),
    ("empty-key-and-values", C("SET", "", "empty") + C("GET", "") + C("APPEND", "n", "") + C("GET", "n")
     + C("ECHO", ""), 5),
    # inline commands
    ("inline-ping", b"PING\r\n", 1),
    ("inline-lf-only", b"PING\n", 1),
    ("inline-set-get", b"SET a b\r\nGET a\r\n", 2),
    ("inline-quoted", b"SET \"a b\" 'c d'\r\nGET \"a b\"\r\n", 2),
    ("inline-escapes", b"SET k \"\\x41\\n\\t\\\\\\\"\"\r\nGET k\r\n", 2),
    ("inline-single-quote-escape", b"SET k 'it\\'s'\r\nGET k\r\n", 2),
    ("inline-empty-lines", b"\r\n\r\n  \r\nPING\r\n", 1),
    ("inline-spaces", b"   SET    a    b   \r\nGET a\r\n", 2),
    ("empty-multibulk", b"*0\r\n*-1\r\nPING\r\n", 1),
    ("bulk-trailer-not-checked", b"*1\r\n$3\r\nPINGX\r\n", 1),
    # a request split into pieces is still one request
    ("pipelined-mixed", C("SET", "a", "1") + b"GET a\r\n" + C("INCR", "a") + b"INCR a\r\n", 4),
]


@pytest.mark.parametrize("name,request_bytes,n", REPLY_CASES, ids=[c[0] for c in REPLY_CASES])
def test_same_replies(redis_server, kv_plain, name, request_bytes, n):
    want = converse(redis_server.port, request_bytes, n)
    got = converse(kv_plain.port, request_bytes, n)
    assert got == want, f"request {request_bytes[:300]!r}"


def test_request_split_byte_by_byte(redis_server, kv_plain):
    """The same pipeline, delivered one byte per send, gives the same replies."""
    req = C("SET", "k", "v" * 40) + b"GET k\r\n" + C("MGET", "k", "x") + C("SET", "k", "v", "EX", "0")
    out = []
    for port in (redis_server.port, kv_plain.port):
        with Raw(port) as r:
            r.send(C("FLUSHALL")).reply()
            for i in range(len(req)):
                r.send(req[i:i + 1])
            out.append(r.replies(4))
    assert out[1] == out[0]


# ----------------------------------------------------------------- protocol errors: reply + close

CLOSE_CASES = [
    ("mbulk-not-number", b"*abc\r\n"),
    ("bulk-len-not-number", b"*3\r\n$x\r\n"),
    ("bulk-len-negative", b"*1\r\n$-5\r\n"),
    ("expected-dollar-got-colon", b"*2\r\n$3\r\nGET\r\n:3\r\n"),
    ("bulk-2gb", b"*1\r\n$2147483648\r\n"),
    ("bulk-over-512mb", b"*1\r\n$536870913\r\n"),
    ("bulk-len-huge", b"*1\r\n$99999999999999999999999\r\n"),
    ("mbulk-2-billion", b"*2000000000\r\n"),
    ("mbulk-over-1m", b"*1048577\r\n"),
    ("mbulk-huge", b"*99999999999999999999999\r\n"),
    ("unbalanced-double-quote", b"SET \"a b\r\n"),
    ("unbalanced-single-quote", b"SET 'a b\r\n"),
    ("quote-then-char", b"SET \"a\"b c\r\n"),
    ("reply-before-error", C("PING") + b"GET a\r\n" + b"*abc\r\n" + C("PING")),
    ("too-big-inline", b"A" * (70 * 1024)),
    ("too-big-mbulk-count", b"*" + b"1" * (70 * 1024)),
    ("too-big-bulk-count", b"*1\r\n$" + b"1" * (70 * 1024)),
    ("mbulk-count-cr-without-lf", b"*1\rX$4\r\nPING\r\n"),
    ("quit", C("QUIT")),
    ("quit-in-pipeline", C("PING") + C("QUIT") + C("PING")),
    ("inline-quit", b"PING\r\nQUIT\r\nPING\r\n"),
]


@pytest.mark.parametrize("name,request_bytes", CLOSE_CASES, ids=[c[0] for c in CLOSE_CASES])
def test_protocol_errors(redis_server, kv_plain, name, request_bytes):
    want = until_close(redis_server.port, request_bytes)
    got = until_close(kv_plain.port, request_bytes)
    assert got == want, f"request {request_bytes[:100]!r}: (reply, closed)"


def test_protocol_error_text_and_close(kv_plain):
    """Independently of redis-server: the Redis error texts, then the connection closes."""
    expect = {
        b"*abc\r\n": b"-ERR Protocol error: invalid multibulk length\r\n",
        b"*3\r\n$x\r\n": b"-ERR Protocol error: invalid bulk length\r\n",
        b"*1\r\n$-5\r\n": b"-ERR Protocol error: invalid bulk length\r\n",
        b"*2\r\n$3\r\nGET\r\n:3\r\n": b"-ERR Protocol error: expected '$', got ':'\r\n",
        b"*1\r\n$2147483648\r\n": b"-ERR Protocol error: invalid bulk length\r\n",
    }
    for req, err in expect.items():
        assert until_close(kv_plain.port, req) == (err, True), req
    # "$3" at the start of a request is an inline command named "$3", as in Redis
    assert converse(kv_plain.port, b"$3\r\n", 1) == [
        b"-ERR unknown command '$3', with args beginning with: \r\n", b"+PONG\r\n"]
    with Raw(kv_plain.port) as r:
        assert r.send(PING).reply() == b"+PONG\r\n"


def test_many_arguments_over_1m(redis_server, kv_plain):
    """Redis 7 accepts more than 1M arguments in one request (its limit is INT_MAX)."""
    n = 1024 * 1024 + 1
    req = b"*%d\r\n$6\r\nEXISTS\r\n" % (n + 1) + b"$1\r\nk\r\n" * n
    out = []
    for port in (redis_server.port, kv_plain.port):
        with Raw(port, timeout=30) as r:
            try:
                r.send(req)
                out.append(r.reply(timeout=20))
            except (EOFError, TimeoutError, OSError) as e:
                out.append(f"<{type(e).__name__}: {r.buf[:100]!r}>")
    assert out[1] == out[0]


# ----------------------------------------------------------------- structure comparisons

def _call(port, *args):
    with Raw(port) as r:
        return resp_parse(r.send(C(*args)).reply())[0]


def test_hello_2_structure(redis_server, kv_plain):
    for args in (("HELLO", "2"), ("HELLO",), ("HELLO", "2", "SETNAME", "me"),
                 ("HELLO", "2", "AUTH", "default", "whatever")):
        want = _call(redis_server.port, *args)
        got = _call(kv_plain.port, *args)
        assert isinstance(got, list) and len(got) == len(want) == 14, args
        assert got[0::2] == want[0::2]  # same field names in the same order
        w, g = dict(zip(want[0::2], want[1::2])), dict(zip(got[0::2], got[1::2]))
        for k in (b"proto", b"mode", b"role", b"modules"):
            assert g[k] == w[k], k
        for k in (b"server", b"version"):
            assert isinstance(g[k], bytes) and g[k]
        assert isinstance(g[b"id"], int) and g[b"id"] > 0


def test_hello_setname_applies(redis_server, kv_plain):
    out = []
    for port in (redis_server.port, kv_plain.port):
        with Raw(port) as r:
            r.send(C("HELLO", "2", "SETNAME", "hello-name")).reply()
            out.append(r.send(C("CLIENT", "GETNAME")).reply())
    assert out[1] == out[0] == b"$10\r\nhello-name\r\n"


def test_client_id_structure(redis_server, kv_plain):
    for port in (redis_server.port, kv_plain.port):
        with Raw(port) as r1, Raw(port) as r2:
            a = r1.call("CLIENT", "ID")
            b = r2.call("CLIENT", "ID")
            assert isinstance(a, int) and isinstance(b, int) and a > 0 and b > 0 and a != b
            assert r1.call("CLIENT", "ID") == a  # stable for a connection


def test_time_structure(redis_server, kv_plain):
    import time
    for port in (redis_server.port, kv_plain.port):
        with Raw(port) as r:
            raw = r.send(C("TIME")).reply()
            v = resp_parse(raw)[0]
            assert raw.startswith(b"*2\r\n$")
            assert len(v) == 2 and all(x.isdigit() for x in v)
            assert abs(int(v[0]) - time.time()) < 60
            assert 0 <= int(v[1]) < 1_000_000


def test_command_count_structure(redis_server, kv_plain):
    for port in (redis_server.port, kv_plain.port):
        v = _call(port, "COMMAND", "COUNT")
        assert isinstance(v, int) and v > 0


def test_info_structure(redis_server, kv_plain):
    fields = {"server": ["redis_version", "process_id", "tcp_port", "uptime_in_seconds"],
              "clients": ["connected_clients", "maxclients"],
              "memory": ["used_memory", "maxmemory"],
              "stats": ["total_connections_received", "total_commands_processed",
                        "rejected_connections", "keyspace_hits", "keyspace_misses",
                        "expired_keys"]}
    for port in (redis_server.port, kv_plain.port):
        with Raw(port) as r:
            raw = r.send(C("INFO")).reply()
            assert raw.startswith(b"$")
            text = resp_parse(raw)[0]
            assert text.startswith(b"# Server\r\n")
            info = info_dict(text)
            for sec, keys in fields.items():
                assert sec in info["__sections__"], (port, sec)
                for k in keys:
                    assert k in info, (port, k)
            assert int(info["tcp_port"]) == port
            # one section only
            one = info_dict(resp_parse(r.send(C("INFO", "clients")).reply())[0])
            assert one["__sections__"] == ["clients"]
            assert int(one["connected_clients"]) >= 1


def test_config_get_glob_structure(redis_server, kv_plain):
    for port in (redis_server.port, kv_plain.port):
        v = _call(port, "CONFIG", "GET", "maxmemory*")
        d = dict(zip(v[0::2], v[1::2]))
        assert d[b"maxmemory"] == b"0" and d[b"maxmemory-policy"] == b"noeviction"
        assert all(k.startswith(b"maxmemory") for k in d)
        v = _call(port, "CONFIG", "GET", "maxmemory", "appendonly", "maxmemory")  # order is unspecified
        assert dict(zip(v[0::2], v[1::2])) == {b"maxmemory": b"0", b"appendonly": b"no"} and len(v) == 4
        v = _call(port, "CONFIG", "GET", "*")
        assert len(v) % 2 == 0 and len(v) >= 2
        d = dict(zip(v[0::2], v[1::2]))
        assert {b"port", b"maxclients", b"maxmemory", b"bind", b"databases"} <= set(d)
        assert d[b"maxclients"].isdigit() and d[b"port"].isdigit()  # (port's value: test_redis_py)


# ----------------------------------------------------------------- requirepass

AUTH_REPLY_CASES = [
    ("noauth-ping", PING, 1),
    ("noauth-commands", C("GET", "a") + C("SET", "a", "b") + C("DBSIZE") + C("CONFIG", "GET", "port")
     + C("CLIENT", "ID") + C("SELECT", "0"), 6),
    ("noauth-inline", b"PING\r\nGET a\r\n", 2),
    ("noauth-unknown-first", C("FOO", "bar"), 1),
    ("noauth-arity-first", C("GET"), 1),
    ("wrongpass", C("AUTH", "nope") + C("AUTH", "default", "nope") + C("AUTH", "other", PASSWORD), 3),
    ("auth-syntax", C("AUTH", "a", "b", "c"), 1),
    ("auth-ok", C("AUTH", PASSWORD) + C("GET", "a"), 2),
    ("auth-default-ok", C("AUTH", "default", PASSWORD) + C("SET", "a", "b") + C("GET", "a"), 3),
    ("auth-wrong-then-right", C("AUTH", "x") + C("PING") + C("AUTH", PASSWORD) + C("PING"), 4),
    ("hello-noauth", C("HELLO", "2"), 1),
    ("hello-wrong-auth", C("HELLO", "2", "AUTH", "default", "nope"), 1),
    ("unauth-10-args-ok", b"*10\r\n" + b"$4\r\nPING\r\n" + b"$1\r\na\r\n" * 9, 1),
    ("unauth-16384-bulk-ok", b"*2\r\n$4\r\nAUTH\r\n$16384\r\n" + b"p" * 16384 + b"\r\n", 1),
    ("auth-then-11-args", C("AUTH", PASSWORD) + C("MSET", *("k%d" % i for i in range(10))) + C("GET", "k0"), 3),
    ("auth-then-big-bulk", C("AUTH", PASSWORD) + C("SET", "big", "v" * 20000) + C("STRLEN", "big"), 3),
]


@pytest.mark.parametrize("name,request_bytes,n", AUTH_REPLY_CASES, ids=[c[0] for c in AUTH_REPLY_CASES])
def test_auth_same_replies(redis_auth, kv_auth, name, request_bytes, n):
    want = converse(redis_auth.port, request_bytes, n, flush=False)
    got = converse(kv_auth.port, request_bytes, n, flush=False)
    assert got == want, f"request {request_bytes[:300]!r}"


AUTH_CLOSE_CASES = [
    ("unauth-11-args", b"*11\r\n"),
    ("unauth-11-args-full", b"*11\r\n" + b"$4\r\nPING\r\n" + b"$1\r\na\r\n" * 10),
    ("unauth-20000-bulk", b"*2\r\n$4\r\nAUTH\r\n$20000\r\n"),
    ("unauth-16385-bulk", b"*2\r\n$3\r\nGET\r\n$16385\r\n"),
    ("unauth-big-mbulk-count", b"*2000000000\r\n"),
]


@pytest.mark.parametrize("name,request_bytes", AUTH_CLOSE_CASES, ids=[c[0] for c in AUTH_CLOSE_CASES])
def test_auth_protocol_limits(redis_auth, kv_auth, name, request_bytes):
    want = until_close(redis_auth.port, request_bytes, flush=False)
    got = until_close(kv_auth.port, request_bytes, flush=False)
    assert got == want, f"request {request_bytes[:100]!r}: (reply, closed)"


def test_auth_limits_texts(kv_auth):
    assert until_close(kv_auth.port, b"*11\r\n", flush=False) == (
        b"-ERR Protocol error: unauthenticated multibulk length\r\n", True)
    assert until_close(kv_auth.port, b"*2\r\n$4\r\nAUTH\r\n$20000\r\n", flush=False) == (
        b"-ERR Protocol error: unauthenticated bulk length\r\n", True)
    # after AUTH the limits are lifted
    assert until_close(kv_auth.port, b"*11\r\n", auth=PASSWORD, flush=False, wait=0.5) == (b"", False)


def test_hello_auth_structure(redis_auth, kv_auth):
    for port in (redis_auth.port, kv_auth.port):
        with Raw(port) as r:
            v = r.call("HELLO", "2", "AUTH", "default", PASSWORD)
            assert isinstance(v, list) and len(v) == 14
            assert dict(zip(v[0::2], v[1::2]))[b"proto"] == 2
            assert r.call("PING") == b"PONG"


# ----------------------------------------------------------------- RESP3 (after HELLO 3)

def converse3(port, request, n_replies):
    """Like converse(), on a connection switched to RESP3 with HELLO 3."""
    with Raw(port) as r:
        assert r.send(C("FLUSHALL")).reply() == b"+OK\r\n"
        hello = r.send(C("HELLO", "3")).reply()
        assert hello.startswith(b"%7\r\n"), hello[:200]
        return converse_on(r, request, n_replies)


def converse_on(r, request, n_replies):
    r.send(request)
    out = []
    try:
        for _ in range(n_replies):
            out.append(r.reply(timeout=5))
        r.send(PING)
        out.append(r.reply(timeout=5))
    except (EOFError, TimeoutError, OSError) as e:
        out.append(f"<{type(e).__name__}: {e}>")
    return out


RESP3_CASES = [
    ("nulls", C("GET", "x") + C("SET", "k", "v") + C("SET", "k", "w", "NX") + C("SET", "n", "v", "XX")
     + C("SET", "k2", "v", "GET") + C("MGET", "k", "x") + C("CLIENT", "GETNAME") + C("SET", "k", "z", "GET"), 8),
    ("scalars", C("INCR", "n") + C("EXISTS", "n", "n") + C("DEL", "n", "x") + C("ECHO", "e") + C("PING", "p")
     + C("APPEND", "s", "ab") + C("STRLEN", "s") + C("DBSIZE") + C("SELECT", "0"), 9),
    ("errors", C("INCR", "s") + C("NOSUCH", "a") + C("GET") + C("SET", "k", "v", "EX", "0")
     + C("SELECT", "1"), 5),
    ("config-get-map", C("CONFIG", "GET", "maxmemory") + C("CONFIG", "GET", "nonexistent")
     + C("CONFIG", "GET", "appendonly"), 3),
    ("command-docs-none", C("COMMAND", "DOCS", "nosuchcommand"), 1),
    ("client-name", C("CLIENT", "SETNAME", "r3") + C("CLIENT", "GETNAME"), 2),
    ("back-to-resp2", C("HELLO", "2", "SETNAME", "x") + C("GET", "x") + C("CONFIG", "GET", "maxmemory"), 3),
]


@pytest.mark.parametrize("name,request_bytes,n", RESP3_CASES, ids=[c[0] for c in RESP3_CASES])
def test_resp3_same_replies(redis_server, kv_plain, name, request_bytes, n):
    want = converse3(redis_server.port, request_bytes, n)
    got = converse3(kv_plain.port, request_bytes, n)
    if name == "back-to-resp2":  # HELLO's own reply carries server/version/id: compare its shape
        assert got[0].startswith(b"*14\r\n") and want[0].startswith(b"*14\r\n")
        got, want = got[1:], want[1:]
    assert got == want, f"request {request_bytes[:300]!r}"


def test_hello_3_structure(redis_server, kv_plain):
    for args in (("HELLO", "3"), ("HELLO", "3", "SETNAME", "me")):
        w = _call(redis_server.port, *args)
        g = _call(kv_plain.port, *args)
        assert isinstance(g, dict) and list(g) == list(w)
        for k in (b"proto", b"mode", b"role", b"modules"):
            assert g[k] == w[k], k
        assert g[b"proto"] == 3


def _call3(port, *args):
    with Raw(port) as r:
        r.send(C("HELLO", "3")).reply()
        return r.send(C(*args)).reply()


def test_resp3_info_is_verbatim_text(redis_server, kv_plain):
    """In RESP3, INFO and CLIENT INFO are verbatim strings ("=<len>\\r\\ntxt:...")."""
    for args in (("INFO", "server"), ("CLIENT", "INFO")):
        want = _call3(redis_server.port, *args)
        got = _call3(kv_plain.port, *args)
        assert want.startswith(b"=") and want[want.index(b"\r\n") + 2:].startswith(b"txt:")
        assert got[:1] == want[:1], (args, got[:80])
        assert got[got.index(b"\r\n") + 2:].startswith(b"txt:"), (args, got[:80])


# the command flags kvstore keeps (Redis has more: admin, noscript, loading, stale, ...)
MODELED_FLAGS = {"write", "readonly", "denyoom", "blocking", "fast", "no_auth", "movablekeys"}


def test_command_table_matches_redis(redis_server, kv_plain):
    """For every command kvstore has, COMMAND gives Redis 7's arity, key positions and the
    flags kvstore models (a cluster client routes by the key positions; a client library
    treats blocking commands apart; containers such as XGROUP show neither flags nor keys)."""
    def table(port):
        with redis.Redis(port=port, decode_responses=True) as c:
            return {name: (e["arity"], set(e["flags"]) & MODELED_FLAGS, e["first_key_pos"], e["last_key_pos"],
                           e["step_count"]) for name, e in c.command().items()}
    want, got = table(redis_server.port), table(kv_plain.port)
    assert {"get", "xread", "xreadgroup", "xgroup", "append"} <= set(got) & set(want)
    differ = {n: (got[n], want[n]) for n in got if n in want and got[n] != want[n]}
    assert not differ, differ


def test_resp3_command_info_flags_are_sets(redis_server, kv_plain):
    want = _call3(redis_server.port, "COMMAND", "INFO", "get")
    got = _call3(kv_plain.port, "COMMAND", "INFO", "get")
    head = b"*1\r\n*10\r\n$3\r\nget\r\n:2\r\n~2\r\n+readonly\r\n+fast\r\n"
    assert want.startswith(head)
    assert got.startswith(head), got[:120]
