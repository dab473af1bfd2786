"""Hashes (ext/cmd/hash.c over the encoding in ext/core/hashenc.h).

1. byte for byte against redis-server: every command, its arity and argument
   errors, wrong types both ways, the empty hash deleted, HINCRBY overflow,
   HINCRBYFLOAT's number formatting, HRANDFIELD where its reply is determined,
   HSCAN's cursor and options, RESP3 shapes, TTL kept by hash writes, MULTI;
   small hashes only, so that Redis keeps them as listpacks (field order);
2. HRANDFIELD's random replies compared by shape (length, nesting, members,
   distinct or not) with redis-server's;
3. a large hash (past Redis's listpack limits) against a plain dict;
4. redis-py's hset(mapping=...), hgetall, hincrby, ...; INFO and DBSIZE count a hash
   as one key;
5. the stored encoding, as ext/core/hashenc.h describes it, written here
   independently into an in-process server's table and read by the commands; the
   same with damaged encodings (as a bad file or log could hold): every command
   replies, an error or a result, and the server stays up;
6. durability: hashes written, changed and emptied survive kill -9 with durability
   disk, and with a data file and little memory they leave memory and come back
   whole (read, changed, deleted while evicted), across kill -9 as well.
"""
import random
import struct

import pytest
import redis

from helpers import faultlib as fl
from helpers.conn import Raw, client
from helpers.keyspace import HELLO3, SPILL, apply_ops, assert_case_matches, fill, wait_flushed
from helpers.resp import resp_cmd as C, resp_parse
from kvstore import Server
from kvstore._native import ffi, lib

pytestmark = pytest.mark.timeout(120)

MAX = "9223372036854775807"
MIN = "-9223372036854775808"


def incrbyfloat(initial, incr):
    return ([C("HSET", "h", "f", initial)] if initial is not None else []) + [
        C("HINCRBYFLOAT", "h", "f", incr), C("HGET", "h", "f")]


FIELDS20 = [x for i in range(20) for x in (f"f{i:02d}", f"v{i}")]

CASES = {
    # HSET, HMSET, HSETNX: order is insertion order, a field set again keeps its place
    "hset": [C("HSET", "h", "a", "1", "b", "2", "c", "3"), C("HSET", "h", "b", "20", "d", "4", "a", "10"),
             C("HGETALL", "h"), C("HKEYS", "h"), C("HVALS", "h"), C("HLEN", "h")],
    "hset-field-twice": [C("HSET", "h", "a", "1", "a", "2", "b", "3", "a", "4"), C("HGETALL", "h"),
                         C("HSET", "h", "b", "5", "b", "6"), C("HGETALL", "h")],
    "hset-arity": [C("HSET"), C("HSET", "h"), C("HSET", "h", "a"), C("HSET", "h", "a", "1", "b"),
                   C("HMSET", "h", "a"), C("HMSET", "h", "a", "1", "b"), C("EXISTS", "h")],
    "hmset": [C("HMSET", "h", "a", "1", "b", "2"), C("HMSET", "h", "b", "3", "c", "4"), C("HGETALL", "h")],
    "hsetnx": [C("HSETNX", "h", "a", "1"), C("HSETNX", "h", "a", "2"), C("HGET", "h", "a"),
               C("HSETNX", "h", "b", "3"), C("HGETALL", "h"), C("HSETNX", "h", "a"),
               C("HSETNX", "h", "a", "1", "2")],
    "many-fields": [C("HSET", "h", *FIELDS20), C("HSET", "h", *FIELDS20[10:30], "new", "x", "f03", "y"),
                    C("HGETALL", "h"), C("HLEN", "h")],
    # reads
    "hget": [C("HGET", "nokey", "a"), C("HSET", "h", "a", "1"), C("HGET", "h", "a"), C("HGET", "h", "b"),
             C("HGET", "h"), C("HGET", "h", "a", "b")],
    "hmget": [C("HMGET", "nokey", "a", "b"), C("HSET", "h", "a", "1", "b", "2"), C("HMGET", "h", "b", "x", "a", "b"),
              C("HMGET", "h"), C("HMGET", "h", "a")],
    "hmget-many": [C("HSET", "h", *FIELDS20),
                   C("HMGET", "h", *[f"f{i:02d}" for i in (3, 25, 3, 19, 0, 7, 7, 40, 11, 12, 13, 14)])],
    "hgetall-hkeys-hvals-absent": [C("HGETALL", "nokey"), C("HKEYS", "nokey"), C("HVALS", "nokey"),
                                   C("HGETALL"), C("HKEYS", "a", "b"), C("HVALS")],
    "hexists-hlen-hstrlen": [C("HSET", "h", "a", "hello", "b", ""), C("HEXISTS", "h", "a"), C("HEXISTS", "h", "z"),
                             C("HEXISTS", "nokey", "a"), C("HLEN", "h"), C("HLEN", "nokey"),
                             C("HSTRLEN", "h", "a"), C("HSTRLEN", "h", "b"), C("HSTRLEN", "h", "z"),
                             C("HSTRLEN", "nokey", "a"), C("HSET", "h", "n", "12345"), C("HSTRLEN", "h", "n"),
                             C("HEXISTS", "h"), C("HLEN"), C("HLEN", "h", "x"), C("HSTRLEN", "h")],
    "empty-and-binary": [C("HSET", "h", "", "", "\x00\r\n", "a\x00b", "\xff\xfe", "\r\n"), C("HGET", "h", ""),
                         C("HSTRLEN", "h", "\x00\r\n"), C("HGETALL", "h"), C("HEXISTS", "h", ""),
                         C("HDEL", "h", "\x00\r\n"), C("HKEYS", "h")],
    # HDEL, and the empty hash deleted
    "hdel": [C("HSET", "h", "a", "1", "b", "2", "c", "3", "d", "4"), C("HDEL", "h", "b", "x", "b"),
             C("HGETALL", "h"), C("HDEL", "h", "a", "d"), C("HKEYS", "h"), C("HDEL", "nokey", "a"),
             C("HDEL", "h"), C("HDEL", "h", "c"), C("EXISTS", "h"), C("HGETALL", "h"), C("HLEN", "h"),
             C("DBSIZE"), C("HDEL", "h", "c")],
    "hdel-many": [C("HSET", "h", *FIELDS20),
                  C("HDEL", "h", *[f"f{i:02d}" for i in (1, 3, 3, 5, 30, 7, 9, 11, 13, 15, 17, 19, 1)]),
                  C("HGETALL", "h"), C("HDEL", "h", *FIELDS20[::2]), C("EXISTS", "h")],
    # HINCRBY
    "hincrby": [C("HINCRBY", "h", "n", "5"), C("HINCRBY", "h", "n", "-7"), C("HINCRBY", "h", "m", "0"),
                C("HINCRBY", "nokey2", "x", "-3"), C("HGETALL", "h"), C("HGET", "nokey2", "x"),
                C("HINCRBY", "h", "n"), C("HINCRBY", "h", "n", "1", "2")],
    "hincrby-bad-increment": [C("HINCRBY", "h", "n", x) for x in
                              ("abc", "1.5", "", "99999999999999999999", " 1", "1 ", "+1", "01", "-0", "0x10")]
                             + [C("EXISTS", "h")],
    "hincrby-bad-value": [x for v in ("abc", "1.0", "007", "-0", " 1", "1 ", "", "+1", "9223372036854775808",
                                      "1" * 25, "-")
                          for x in (C("HSET", "h", "f", v), C("HINCRBY", "h", "f", "1"))] + [C("HGETALL", "h")],
    "hincrby-overflow": [C("HSET", "h", "n", MAX), C("HINCRBY", "h", "n", "1"), C("HINCRBY", "h", "n", "-1"),
                         C("HSET", "h", "m", MIN), C("HINCRBY", "h", "m", "-1"), C("HINCRBY", "h", "m", MAX),
                         C("HINCRBY", "h", "new", MIN), C("HINCRBY", "h", "new", "-1"), C("HINCRBY", "h", "n", MIN),
                         C("HGETALL", "h")],
    # HINCRBYFLOAT and Redis's formatting (long double, %.17Lf, trailing zeros trimmed)
    "hincrbyfloat-format": [x for init, incr in [
        ("10.50", "0.1"), ("5.0e3", "2.0e2"), (None, "1e300"), ("0.1", "0.2"), (None, "-0.0"),
        (None, "1.23456789012345678901234"), ("3", "-3"), ("1", "1e-20"), ("-1.5", "0.5"),
        ("123456789012345678", "1"), ("1e-4900", "0"), ("0x10", "1"), (None, ".5"), (None, "+1.5"),
        ("1e308", "1e308"), ("-5", "2.5e-3"), ("7", "1E2"), ("1.5", "-0.5"), (None, "3.0000000000000000001"),
    ] for x in incrbyfloat(init, incr)],
    "hincrbyfloat-huge": incrbyfloat(None, "1e4000") + incrbyfloat("-1.5e4000", "1"),
    "hincrbyfloat-bad-increment": [x for incr in ("abc", "", " 1", "1 ", "1e5000", "-1e5000", "1e-5000", "inf",
                                                  "-inf", "nan", "1" * 6000, "0x")
                                   for x in incrbyfloat(None, incr)] + [C("EXISTS", "h")],
    "hincrbyfloat-bad-value": [x for init in ("abc", "", " 1", "1 ", "nan", "1e5000", "1" * 6000, "1.5.5")
                               for x in incrbyfloat(init, "1")],
    "hincrbyfloat-inf-value": incrbyfloat("inf", "1") + incrbyfloat("-inf", "1") + incrbyfloat("1e4932", "1e4932"),
    "hincrbyfloat-nul": incrbyfloat("1\x00x", "1") + incrbyfloat("2", "1\x00") + incrbyfloat(None, "\x00")
    # the parser INCRBYFLOAT shares: a NUL inside a number makes it no float
    + [C("INCRBYFLOAT", "s", "1\x00"), C("SET", "s", "1\x00"), C("INCRBYFLOAT", "s", "1"), C("GET", "s")],
    "hincrbyfloat-arity": [C("HINCRBYFLOAT", "h", "f"), C("HINCRBYFLOAT", "h", "f", "1", "2")],
    # HRANDFIELD where the reply is determined: a count at least the size (the whole
    # hash, in order), count 0, absent keys, a hash of one field, and the errors
    "hrandfield-whole": [C("HSET", "h", "a", "1", "b", "2", "c", "3"), C("HRANDFIELD", "h", "3"),
                         C("HRANDFIELD", "h", "10"), C("HRANDFIELD", "h", "10", "WITHVALUES"),
                         C("HRANDFIELD", "h", "4611686018427387903", "withvalues"), C("HRANDFIELD", "h", "0"),
                         C("HRANDFIELD", "h", "0", "withvalues"), C("HRANDFIELD", "nokey"),
                         C("HRANDFIELD", "nokey", "5"), C("HRANDFIELD", "nokey", "-5", "WITHVALUES")],
    "hrandfield-one-field": [C("HSET", "h", "only", "v"), C("HRANDFIELD", "h"), C("HRANDFIELD", "h", "1"),
                             C("HRANDFIELD", "h", "-3"), C("HRANDFIELD", "h", "-2", "WITHVALUES"),
                             C("HRANDFIELD", "h", "1", "WITHVALUES")],
    "hrandfield-errors": [C("HSET", "h", "a", "1"), C("HRANDFIELD", "h", "x"), C("HRANDFIELD", "h", "1.5"),
                          C("HRANDFIELD", "h", MIN), C("HRANDFIELD", "h", "1", "foo"),
                          C("HRANDFIELD", "h", "1", "WITHVALUES", "x"), C("HRANDFIELD", "nokey", "1", "foo"),
                          C("HRANDFIELD", "h", "4611686018427387904", "WITHVALUES"),
                          C("HRANDFIELD", "h", "-4611686018427387904", "withvalues"),
                          C("HRANDFIELD", "h", "99999999999999999999"), C("HRANDFIELD")],
    # HSCAN: a small hash comes whole with cursor 0; MATCH on fields
    "hscan": [C("HSET", "h", "a", "1", "b", "2", "ab", "3", "ba", "4"), C("HSCAN", "h", "0"),
              C("HSCAN", "h", "0", "MATCH", "a*"), C("HSCAN", "h", "0", "MATCH", "*a", "COUNT", "1"),
              C("HSCAN", "h", "7", "match", "[ab]"), C("HSCAN", "h", "0", "match", "*"),
              C("HSCAN", "h", "0", "MATCH", "zz*"), C("HSCAN", "h", "0", "MATCH", "a*", "MATCH", "b*"),
              C("HSCAN", "h", "0", "cOuNt", "100", "mAtCh", "?"), C("HSCAN", "nokey", "0"),
              C("HSCAN", "h", "0", "MATCH", "\\a*")],
    "hscan-cursor": [C("HSET", "h", "a", "1")] + [C("HSCAN", "h", x) for x in (
        "", "-1", " 1", "1x", "18446744073709551615", "18446744073709551616", "+3", "-", "+", "1\x00x", "0x1",
        "-18446744073709551615", "-18446744073709551616", "00001")],
    "hscan-options": [C("HSET", "h", "a", "1"), C("HSCAN", "h", "0", "COUNT", "0"), C("HSCAN", "h", "0", "COUNT", "x"),
                      C("HSCAN", "h", "0", "COUNT", "-1"), C("HSCAN", "h", "0", "MATCH"),
                      C("HSCAN", "h", "0", "foo", "bar"), C("HSCAN", "h", "0", "MATCH", "a", "COUNT"),
                      C("HSCAN", "h", "0", "COUNT", "9223372036854775808"), C("HSCAN", "h", "0", "TYPE", "hash"),
                      C("HSCAN", "nokey", "0", "COUNT", "0"), C("HSCAN", "nokey", "x"),
                      C("HSCAN", "h", "0", "COUNT", "x", "MATCH"), C("HSCAN", "h"), C("HSCAN")],
    # RESP3: maps, nulls, nested HRANDFIELD pairs
    "resp3": [HELLO3, C("HSET", "h", "a", "1", "b", "2"), C("HGETALL", "h"), C("HGETALL", "nokey"),
              C("HGET", "h", "zz"), C("HMGET", "h", "a", "zz"), C("HMGET", "nokey", "a"),
              C("HRANDFIELD", "h", "10", "WITHVALUES"), C("HRANDFIELD", "h", "10"), C("HRANDFIELD", "nokey"),
              C("HRANDFIELD", "nokey", "3"), C("HRANDFIELD", "h", "0", "withvalues"), C("HSCAN", "h", "0"),
              C("HSCAN", "nokey", "0"), C("HKEYS", "h"), C("HVALS", "nokey"), C("HINCRBYFLOAT", "h", "a", "0.5")],
    "resp3-one-field": [HELLO3, C("HSET", "h", "only", "v"), C("HRANDFIELD", "h"),
                        C("HRANDFIELD", "h", "-2", "WITHVALUES"), C("HRANDFIELD", "h", "1", "WITHVALUES")],
    # wrong types: hash commands on a string
    "wrongtype-hash-commands-on-string": [C("SET", "s", "v")] + [C(*x) for x in (
        ("HSET", "s", "a", "1"), ("HMSET", "s", "a", "1"), ("HSETNX", "s", "a", "1"), ("HGET", "s", "a"),
        ("HMGET", "s", "a"), ("HGETALL", "s"), ("HKEYS", "s"), ("HVALS", "s"), ("HDEL", "s", "a"),
        ("HEXISTS", "s", "a"), ("HLEN", "s"), ("HSTRLEN", "s", "a"), ("HINCRBY", "s", "a", "1"),
        ("HINCRBYFLOAT", "s", "a", "1"), ("HRANDFIELD", "s"), ("HRANDFIELD", "s", "2", "WITHVALUES"),
        ("HRANDFIELD", "s", "0"), ("HSCAN", "s", "0"), ("HSCAN", "s", "0", "COUNT", "0"), ("GET", "s"))],
    # argument errors come before the type check where Redis checks them first
    "errors-before-type": [C("SET", "s", "v"), C("HINCRBY", "s", "a", "x"), C("HINCRBYFLOAT", "s", "a", "x"),
                           C("HINCRBYFLOAT", "s", "a", "inf"), C("HRANDFIELD", "s", "x"),
                           C("HRANDFIELD", "s", "1", "foo"), C("HSCAN", "s", "x"), C("HSET", "s", "a")],
    # ... and string commands on a hash
    "wrongtype-string-commands-on-hash": [C("HSET", "h", "a", "1")] + [C(*x) for x in (
        ("GET", "h"), ("INCR", "h"), ("INCRBY", "h", "2"), ("DECR", "h"), ("DECRBY", "h", "1"),
        ("APPEND", "h", "x"), ("STRLEN", "h"), ("MGET", "h", "nokey"), ("HGETALL", "h"),
        ("SET", "h", "v"), ("GET", "h"), ("HGET", "h", "a"))],
    "keyspace": [C("HSET", "h", "a", "1"), C("SET", "s", "v"), C("TYPE", "h"), C("EXISTS", "h", "s"), C("DBSIZE"),
                 C("DEL", "h"), C("TYPE", "h"), C("DBSIZE"), C("HSET", "h2", "a", "1"), C("UNLINK", "h2"),
                 C("EXISTS", "h2")],
    # a hash write keeps the key's TTL; a hash emptied and made again has none
    "ttl-kept": [C("HSET", "h", "a", "1"), C("EXPIRE", "h", "100"), C("HSET", "h", "b", "2"), C("TTL", "h"),
                 C("HDEL", "h", "a"), C("TTL", "h"), C("HINCRBY", "h", "c", "1"), C("TTL", "h"),
                 C("HINCRBYFLOAT", "h", "d", "1.5"), C("TTL", "h"), C("HSETNX", "h", "e", "1"), C("TTL", "h"),
                 C("HMSET", "h", "f", "1"), C("TTL", "h"), C("PERSIST", "h"), C("TTL", "h"),
                 C("EXPIRE", "h", "50"), C("HDEL", "h", "b", "c", "d", "e", "f"), C("EXISTS", "h"), C("TTL", "h"),
                 C("HSET", "h", "a", "1"), C("TTL", "h")],
    "expired-hash": [C("HSET", "h", "a", "1"), C("PEXPIREAT", "h", "1"), C("HGETALL", "h"), C("HLEN", "h"),
                     C("EXISTS", "h"), C("HSETNX", "h", "a", "2"), C("HGETALL", "h"), C("TTL", "h")],
    "multi": [C("MULTI"), C("HSET", "h", "a", "1", "b", "2"), C("HINCRBY", "h", "a", "5"), C("HGETALL", "h"),
              C("HDEL", "h", "b"), C("HINCRBY", "h", "a", "x"), C("EXEC"), C("HGETALL", "h"),
              C("MULTI"), C("HSET", "h", "a"), C("HGET", "h", "a"), C("EXEC")],
}


@pytest.mark.parametrize("name", list(CASES))
def test_same_replies_as_redis(redis_server, kv, name):
    assert_case_matches(redis_server.port, kv.port, CASES[name])


# ----------------------------------------------------------------- HRANDFIELD's random replies

def shape(v):
    """A reply's structure without the picks: type and length, nested."""
    if isinstance(v, list):
        return ("list", len(v), tuple(sorted({shape(x) for x in v})))
    return type(v).__name__


def rand_reply(port, args, resp):
    with Raw(port) as r:
        if resp == 3:
            r.send(HELLO3).reply()
        return resp_parse(r.send(C("HRANDFIELD", *args)).reply())[0]


HASH5 = {b"f%d" % i: b"v%d" % i for i in range(5)}


@pytest.mark.parametrize("resp", [2, 3])
def test_hrandfield_shapes_match_redis(redis_server, kv, resp):
    for port in (redis_server.port, kv.port):
        with client(port) as c:
            c.flushall()
            c.hset("h", mapping=HASH5)
    for count in (None, 1, 2, 4, 5, 6, -1, -3, -10):
        for withvalues in ((False,) if count is None else (False, True)):
            args = ["h"] + ([str(count)] if count is not None else []) + (["WITHVALUES"] if withvalues else [])
            want = rand_reply(redis_server.port, args, resp)
            got = rand_reply(kv.port, args, resp)
            assert shape(got) == shape(want), args
            if count is None:
                assert got in HASH5
                continue
            pairs = ([tuple(p) for p in got] if resp == 3 else list(zip(got[::2], got[1::2]))) if withvalues \
                else [(f, HASH5.get(f)) for f in got]
            assert all(HASH5.get(f) == v for f, v in pairs), (args, got)
            assert len(pairs) == (min(count, 5) if count > 0 else -count)
            if count > 0:
                assert len({f for f, _ in pairs}) == len(pairs), f"repeated fields for a positive count: {got}"


def test_hrandfield_picks_every_field(kv):
    """Not always the same fields: many picks reach all five, with and without repeats."""
    with client(kv.port) as c:
        c.flushall()
        c.hset("h", mapping=HASH5)
        assert set(c.hrandfield("h", -300)) == set(HASH5)
        assert set().union(*(c.hrandfield("h", 2) for _ in range(200))) == set(HASH5)
        assert {c.hrandfield("h") for _ in range(300)} == set(HASH5)


def test_hrandfield_repeats_are_bounded(kv):
    """A negative count repeats fields without end: a reply that could pass 512 MB is
    refused (Redis would build it); smaller ones are served whole."""
    with client(kv.port) as c:
        c.flushall()
        c.hset("h", mapping={b"f" * 1000: b"v", b"g": b"w"})
        with pytest.raises(redis.ResponseError, match="out of range"):
            c.hrandfield("h", -1_000_000)
        got = c.hrandfield("h", -5000, withvalues=True)
        assert len(got) == 10000 and set(got[::2]) == {b"f" * 1000, b"g"}
        assert c.ping()


# ----------------------------------------------------------------- a large hash

def test_large_hash_against_a_model(redis_server, kv):
    """Past Redis's listpack limits (its order then differs): contents compared as a
    dict with redis-server's and a model; HSCAN returns it all with cursor 0."""
    rng = random.Random(7)
    model = {}
    servers = [client(p) for p in (redis_server.port, kv.port)]
    try:
        for c in servers:
            c.flushall()
        for step in range(30):
            fields = {b"field:%d" % rng.randrange(3000): rng.randbytes(rng.randrange(0, 200)) for _ in range(200)}
            gone = [b"field:%d" % rng.randrange(3000) for _ in range(60)]
            model.update(fields)
            removed = sum(model.pop(f, None) is not None for f in set(gone))
            added = [c.hset("big", mapping=fields) for c in servers]
            assert added[0] == added[1]
            assert [c.hdel("big", *gone) for c in servers] == [removed, removed]
        for c in servers:
            assert c.hgetall("big") == model
            assert c.hlen("big") == len(model)
            probe = [b"field:%d" % i for i in range(0, 3000, 7)]
            assert c.hmget("big", probe) == [model.get(f) for f in probe]
        cursor, items = servers[1].hscan("big", 0, count=10)
        assert cursor == 0 and items == model
        cursor, items = servers[1].hscan("big", 0, match="field:1?")
        assert items == {f: v for f, v in model.items() if len(f) == 8 and f.startswith(b"field:1")}
        assert len(set(servers[1].hrandfield("big", 50))) == 50
    finally:
        for c in servers:
            c.close()


# ----------------------------------------------------------------- redis-py

def test_redis_py_hash_calls(c):
    assert c.hset("dev:1", mapping={"temp": "21.5", "hum": "40", "fw": "1.2"}) == 3
    assert c.hset("dev:1", "temp", "22.0") == 0
    assert c.hgetall("dev:1") == {"temp": "22.0", "hum": "40", "fw": "1.2"}
    assert c.hincrby("dev:1", "hum", 5) == 45
    assert c.hincrbyfloat("dev:1", "temp", 0.25) == 22.25
    assert c.hget("dev:1", "temp") == "22.25"
    assert c.hmget("dev:1", ["fw", "nope", "hum"]) == ["1.2", None, "45"]
    assert c.hkeys("dev:1") == ["temp", "hum", "fw"] and c.hvals("dev:1") == ["22.25", "45", "1.2"]
    assert c.hlen("dev:1") == 3 and c.hexists("dev:1", "fw") and not c.hexists("dev:1", "x")
    assert c.hstrlen("dev:1", "temp") == 5
    assert c.hsetnx("dev:1", "fw", "2.0") == 0 and c.hsetnx("dev:1", "loc", "roof") == 1
    assert c.execute_command("HMSET", "dev:2", "a", "1") in (True, "OK")
    assert c.hrandfield("dev:1", 10, withvalues=True) == ["temp", "22.25", "hum", "45", "fw", "1.2", "loc", "roof"]
    assert dict(c.hscan_iter("dev:1", match="h*")) == {"hum": "45"}
    assert c.hscan("dev:1") == (0, {"temp": "22.25", "hum": "45", "fw": "1.2", "loc": "roof"})
    assert c.type("dev:1") == "hash"
    with c.pipeline(transaction=True) as p:
        p.hset("dev:3", "n", 1).hincrby("dev:3", "n", 2).hgetall("dev:3")
        assert p.execute() == [1, 3, {"n": "3"}]
    assert c.hdel("dev:2", "a") == 1 and c.exists("dev:2") == 0
    c.set("str", "v")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        c.hset("str", "a", 1)
    with pytest.raises(redis.ResponseError, match="hash value is not an integer"):
        c.hincrby("dev:1", "fw", 1)


def test_info_and_dbsize_count_a_hash_as_one_key(c):
    c.hset("h1", mapping={str(i): i for i in range(50)})
    c.hset("h2", "a", 1)
    c.set("s", "v")
    assert c.dbsize() == 3
    assert c.info("keyspace")["db0"]["keys"] == 3
    c.hdel("h2", "a")
    assert c.dbsize() == 2 and c.info("keyspace")["db0"]["keys"] == 2


# ----------------------------------------------------------------- durability

def random_hash_ops(rng, model, keys, n):
    """n random hash commands over keys, applied to model ({key: {field: value}});
    yields each command as a tuple of bytes."""
    for _ in range(n):
        k = rng.choice(keys)
        h = model.setdefault(k, {})
        op = rng.random()
        if op < 0.5:
            fields = {b"f%d" % rng.randrange(8): b"%d" % rng.randrange(1000) for _ in range(rng.randrange(1, 4))}
            h.update(fields)
            yield ("HSET", k, *[x for kv in fields.items() for x in kv])
        elif op < 0.7:
            f = b"n%d" % rng.randrange(3)
            h[f] = b"%d" % (int(h.get(f, b"0")) + 7)
            yield ("HINCRBY", k, f, "7")
        else:
            gone = [b"f%d" % rng.randrange(8) for _ in range(rng.randrange(1, 6))] + [b"n%d" % rng.randrange(3)]
            for f in gone:
                h.pop(f, None)
            yield ("HDEL", k, *gone)
        if not h:
            del model[k]


def check_hashes(port, model, keys, others=0):
    with client(port) as c:
        p = c.pipeline(transaction=False)
        for k in keys:
            p.hgetall(k)
        got = dict(zip(keys, p.execute()))
        assert {k: v for k, v in got.items() if v} == model
        assert c.dbsize() == len(model) + others
        assert {c.type(k) for k in model} <= {b"hash"}


def test_hashes_survive_kill9_with_durability_disk(tmp_path):
    rng = random.Random(1)
    keys = [b"dev:%03d" % i for i in range(60)]
    model = {}
    with fl.started_nodes() as start:
        n = start(tmp_path)
        apply_ops(n.port, list(random_hash_ops(rng, model, keys, 3000)))
        ttl_key = b"with-ttl"
        model[ttl_key] = {b"a": b"1"}
        with client(n.port) as c:
            assert c.hset(ttl_key, b"a", b"1") == 1 and c.expire(ttl_key, 1000) is True
        n.kill()   # every write was acknowledged: each must be back
        n = start(tmp_path)
        check_hashes(n.port, model, keys + [ttl_key])
        with client(n.port) as c:
            assert 900 < c.ttl(ttl_key) <= 1000
        apply_ops(n.port, list(random_hash_ops(rng, model, keys, 500)))
        assert n.stop() == 0
        n = start(tmp_path)
        check_hashes(n.port, model, keys + [ttl_key])
        n.stop()


def test_hashes_leave_memory_read_changed_and_deleted_while_evicted(tmp_path):
    """A data file and 256 KiB of memory: hashes are evicted by filler strings, then
    read whole, changed, emptied and expired while out of memory (each loaded
    first); all of it is there after kill -9."""
    rng = random.Random(2)
    keys = [b"dev:%04d" % i for i in range(400)]
    model = {}
    filler = 3000
    with fl.started_nodes() as start:
        n = start(tmp_path, **SPILL)
        apply_ops(n.port, [("HSET", k, *[x for j in range(6) for x in (b"f%d" % j, b"%s-%d" % (k, j))])
                           for k in keys])
        model.update({k: {b"f%d" % j: b"%s-%d" % (k, j) for j in range(6)} for k in keys})
        with client(n.port) as c:
            assert c.expire(keys[-1], 1000) is True
        fill(n.port, b"fill", filler)
        i = wait_flushed(n.port)
        assert i["datafile_evicted_keys"] > 0 and i["memory_keys"] < len(keys) + filler, i
        loads = i["datafile_loads"]
        check_hashes(n.port, model, keys, filler)
        assert fl.persistence(n.port)["datafile_loads"] > loads, "no hash was read back from the data file"
        fill(n.port, b"fill", filler)   # evict them again
        wait_flushed(n.port)
        apply_ops(n.port, list(random_hash_ops(rng, model, keys, 1500)))
        emptied = keys[:40]
        apply_ops(n.port, [("HDEL", k, *[b"f%d" % j for j in range(8)], b"n0", b"n1", b"n2") for k in emptied])
        for k in emptied:
            model.pop(k, None)
        check_hashes(n.port, model, keys, filler)
        with client(n.port) as c:
            assert 900 < c.ttl(keys[-1]) <= 1000, "the TTL did not survive eviction"
        n.kill()
        n = start(tmp_path, **SPILL)
        check_hashes(n.port, model, keys, filler)
        with client(n.port) as c:
            assert 900 < c.ttl(keys[-1]) <= 1000
        n.stop()


# ----------------------------------------------------------------- the stored encoding

KVT_TYPE_HASH = 1 << 4  # table.h: kvt_set's flag for an encoded hash (log replay, data-file load)


def varint(n):
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def encode(pairs):
    """The format of ext/core/hashenc.h, written from its description."""
    return struct.pack("<I", len(pairs)) + b"".join(varint(len(f)) + f + varint(len(v)) + v for f, v in pairs)


PAIRS = [(b"temp", b"21.5"), (b"x" * 200, b"y" * 300), (b"", b""), (b"n", b"41")]
READS = [("HGETALL", "k"), ("HKEYS", "k"), ("HVALS", "k"), ("HLEN", "k"), ("HGET", "k", "n"),
         ("HGET", "k", "zz"), ("HMGET", "k", "n", "temp", *[f"m{i}" for i in range(12)]), ("HEXISTS", "k", "temp"),
         ("HSTRLEN", "k", "temp"), ("HRANDFIELD", "k"), ("HRANDFIELD", "k", "3", "WITHVALUES"),
         ("HRANDFIELD", "k", "-5", "WITHVALUES"), ("HRANDFIELD", "k", "100"), ("HSCAN", "k", "0", "MATCH", "t*")]
WRITES = [("HSET", "k", "n", "1", "new", "2"), ("HSETNX", "k", "new2", "v"), ("HDEL", "k", "temp", "zz"),
          ("HINCRBY", "k", "n", "1"), ("HINCRBYFLOAT", "k", "n", "0.5"),
          ("HDEL", "k", *[f"m{i}" for i in range(12)], "n")]


def test_stored_encoding_and_damaged_values():
    rng = random.Random(3)
    with Server(port=0, threads=1, durability="none") as srv:
        def put(v):
            assert lib.kvt_set(srv.store._t, b"k", 1, v, len(v), KVT_TYPE_HASH, 0, ffi.NULL, ffi.NULL) == 1

        with client(srv.port) as c:
            put(encode(PAIRS))
            assert c.hgetall("k") == dict(PAIRS) and c.hkeys("k") == [f for f, _ in PAIRS]
            assert c.hincrby("k", "n", 1) == 42 and c.hset("k", "z", "1") == 1
            assert c.hgetall("k") == {**dict(PAIRS), b"n": b"42", b"z": b"1"}
            assert c.type("k") == b"hash"
            valid = encode(PAIRS)
            outcomes = {"ok": 0, "damaged": 0}
            for i in range(400):
                v = bytearray(valid)
                for _ in range(rng.randrange(1, 4)):
                    at = rng.randrange(len(v))
                    how = rng.randrange(4)
                    if how == 0:
                        v[at] ^= 1 << rng.randrange(8)
                    elif how == 1:
                        del v[at:]
                    elif how == 2:
                        v[at] = rng.choice([0x80, 0xFF, 0x7F, rng.randrange(256)])
                    else:
                        v[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
                put(bytes(v))
                for cmd in READS + [rng.choice(WRITES)]:
                    try:
                        c.execute_command(*cmd)
                        outcomes["ok"] += 1
                    except redis.ResponseError as e:
                        assert "damaged" in str(e) or "not an integer" in str(e) or "not a float" in str(e), (cmd, e)
                        outcomes["damaged"] += "damaged" in str(e)
                assert c.delete("k") in (0, 1)   # 0: a write emptied it
            assert outcomes["ok"] > 0 and outcomes["damaged"] > 0, outcomes
            assert c.ping() and c.dbsize() == 0
