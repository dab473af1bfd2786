"""The command table (ext/cmd/cmd.c) through redis-py against a kvstore server: commands,
options, errors, binary safety, large values and deep pipelines. The same requests
compared byte for byte with a real redis-server: test_redis_compat.py; INFO: test_info.py."""
import time

import pytest
import redis

from helpers.conn import client

pytestmark = pytest.mark.timeout(60)

MAX = 2**63 - 1
MIN = -2**63


@pytest.fixture
def b(kv):
    """bytes client."""
    cl = client(kv.port)
    yield cl
    cl.close()


# ------------------------------------------------------------------ connection

def test_ping_echo(c):
    assert c.ping() is True
    assert c.echo("hello world") == "hello world"
    assert c.echo("") == ""


def test_node_client_and_health(kv):
    """kvstore's own client API as documented (Node.client(), health(), stats()) with
    the installed redis-py, without any protocol option."""
    with kv.client(socket_timeout=5) as cl:
        assert cl.ping() is True
    assert kv.health() is True
    st = kv.stats()
    assert st["tcp_port"] == kv.port
    assert st["poll_policy"] in ("direct", "strict", "flexpoll")


def test_kvstore_stats(kv):
    with client(kv.port) as cl:
        st = cl.kvstore_stats()
    assert st["tcp_port"] == kv.port
    assert st["pollers"] == 2 and len(st["poller_stats"]) == 2
    for p in st["poller_stats"]:
        assert set(p) >= {"clients", "commands", "epoll_wait", "epoll_ctl", "read", "write"}
    assert st["total_commands_processed"] >= 1
    assert st["maxmemory"] == 256 * 1024 * 1024


def test_quit_closes_connection(kv):
    conn = redis.Connection(host="127.0.0.1", port=kv.port, protocol=2, socket_timeout=5)
    conn.connect()
    conn.send_command("QUIT")
    assert conn.read_response() == b"OK"
    with pytest.raises((redis.ConnectionError, ConnectionError, OSError)):
        conn.send_command("PING")
        conn.read_response()
    conn.disconnect()


def test_select(c):
    assert c.execute_command("SELECT", 0) is True
    with pytest.raises(redis.ResponseError, match="DB index is out of range"):
        c.execute_command("SELECT", 1)
    with pytest.raises(redis.ResponseError, match="not an integer"):
        c.execute_command("SELECT", "x")


def test_client_name_and_id(kv):
    with client(kv.port, decode_responses=True, single_connection_client=True) as cl:
        assert cl.client_getname() is None
        assert cl.client_setname("worker-7") is True
        assert cl.client_getname() == "worker-7"
        cid = cl.client_id()
        assert isinstance(cid, int) and cid > 0
        assert cl.client_id() == cid
        with pytest.raises(redis.ResponseError, match="cannot contain spaces"):
            cl.client_setname("bad name")
        assert cl.client_getname() == "worker-7"
        with client(kv.port, single_connection_client=True) as other:
            assert other.client_id() != cid
            assert other.client_getname() is None


def test_hello(kv):
    with client(kv.port, single_connection_client=True) as cl:
        r = cl.execute_command("HELLO", 2)
        if isinstance(r, list):
            r = dict(zip(r[0::2], r[1::2]))
        r = {k.decode() if isinstance(k, bytes) else k: v for k, v in r.items()}
        assert r["proto"] == 2
        assert r["server"] in (b"kvstore", "kvstore")
        assert r["id"] == cl.client_id()
        for bad, msg in ((4, "NOPROTO unsupported protocol version"), (1, "NOPROTO"),
                         ("x", "Protocol version is not an integer or out of range")):
            with pytest.raises(redis.ResponseError, match=msg):
                cl.execute_command("HELLO", bad)
        assert cl.ping()  # still usable, still RESP2


def test_resp3_client(kv):
    """redis-py's default protocol (RESP3 in redis-py 8) opens with HELLO 3."""
    with client(kv.port, protocol=3, decode_responses=True, single_connection_client=True) as cl:
        assert cl.connection.handshake_metadata[b"proto" if b"proto" in cl.connection.handshake_metadata
                                               else "proto"] == 3
        cl.flushall()
        assert cl.get("nope") is None
        assert cl.set("k", "v") is True and cl.get("k") == "v"
        assert cl.set("k", "w", nx=True) is None
        assert cl.set("k", "w", get=True) == "v"
        assert cl.mget("k", "nope") == ["w", None]
        assert cl.incr("n") == 1 and cl.exists("k", "n", "x") == 2
        assert cl.config_get("maxmemory") == {"maxmemory": str(256 * 1024 * 1024)}
        assert cl.client_getname() is None
        assert cl.client_setname("r3") and cl.client_getname() == "r3"
        info = cl.info("everything")
        assert info["tcp_port"] == kv.port and "total_epoll_wait_calls" in info
        with pytest.raises(redis.ResponseError, match="not an integer"):
            cl.incr("k")


def test_command_count_and_docs(c):
    n = c.command_count()
    assert isinstance(n, int) and n >= 20
    names = c.command_list()
    assert len(names) == n
    assert {"get", "set", "incr", "mget", "client", "config", "info"} <= set(names)
    assert len(c.command()) == n
    # "COMMAND DOCS" as one name: redis-py's COMMAND reply callback does not apply
    docs = c.execute_command("COMMAND DOCS", "get", "set")
    d = dict(zip(docs[0::2], docs[1::2]))
    assert set(d) == {"get", "set"}
    get_doc = dict(zip(d["get"][0::2], d["get"][1::2]))
    assert get_doc["group"] == "string" and get_doc["summary"]
    assert c.execute_command("COMMAND DOCS", "nosuchcommand") == []
    all_docs = c.execute_command("COMMAND DOCS")
    assert len(all_docs) == 2 * n
    info = c.execute_command("COMMAND INFO", "get", "nosuch")
    assert info[0][0] == "get" and info[0][1] == 2 and info[1] is None


def test_config_get(c):
    assert c.config_get("maxmemory") == {"maxmemory": str(256 * 1024 * 1024)}
    everything = c.config_get("*")
    for k in ("maxmemory", "maxclients", "port", "bind", "maxmemory-policy"):
        assert k in everything, k
    assert everything["bind"] == "127.0.0.1"
    assert everything["maxclients"] == "10000"
    assert set(c.config_get("maxm*")) == {"maxmemory", "maxmemory-policy", "maxmemory-clients"}
    assert set(c.config_get("max*")) == {"maxmemory", "maxmemory-policy", "maxmemory-clients", "maxclients"}
    assert c.config_get("?ort") == {"port": everything["port"]}
    assert c.config_get("nosuch*") == {}


def test_config_get_port_is_the_listening_port(c, kv):
    """Started with --port 0, CONFIG GET port must say the port actually bound."""
    assert c.config_get("port") == {"port": str(kv.port)}


def test_time(c):
    s, us = c.time()
    assert abs(s - time.time()) < 60 and 0 <= us < 1_000_000


# ------------------------------------------------------------------ strings

def test_set_get_del_exists(c):
    assert c.get("a") is None
    assert c.set("a", "1") is True
    assert c.get("a") == "1"
    c.set("b", "2")
    assert c.exists("a", "b", "c") == 2
    assert c.exists("a", "a", "a") == 3  # duplicates count every time
    assert c.delete("a", "b", "c", "a") == 2
    assert c.exists("a", "b") == 0
    assert c.delete("a") == 0


def test_set_nx_xx_get(c):
    assert c.set("k", "v", xx=True) is None
    assert c.get("k") is None
    assert c.set("k", "v1", nx=True) is True
    assert c.set("k", "v2", nx=True) is None
    assert c.get("k") == "v1"
    assert c.set("k", "v3", xx=True) is True
    assert c.get("k") == "v3"
    assert c.set("k", "v4", get=True) == "v3"
    assert c.set("new", "x", get=True) is None
    assert c.get("new") == "x"
    assert c.set("k", "v5", xx=True, get=True) == "v4"
    assert c.set("k2", "v", xx=True, get=True) is None and c.get("k2") is None
    with pytest.raises(redis.ResponseError, match="syntax error"):
        c.execute_command("SET", "k", "v", "NX", "XX")


def test_set_ex_px_expire(c):
    # 1.5 s: the six calls before the first GET must fit in it even on a loaded machine
    # ("keep" expired before its KEEPTTL SET would rightly have no TTL left to keep)
    assert c.set("px", "v", px=1500) is True
    assert c.set("ex", "v", ex=100) is True
    assert c.set("keep", "v", px=1500) is True
    assert c.set("keep", "v2", keepttl=True) is True   # keeps the 1.5 s
    assert c.set("reset", "v", px=1500) is True
    assert c.set("reset", "v2") is True                 # plain SET clears the TTL
    assert c.get("px") == "v"
    time.sleep(1.6)
    assert c.get("px") is None
    assert c.exists("px") == 0
    assert c.get("keep") is None
    assert c.get("reset") == "v2"
    assert c.get("ex") == "v"
    assert c.info("stats")["expired_keys"] >= 2


def test_set_exat_pxat(c):
    now = int(time.time())
    assert c.set("future", "v", exat=now + 100) is True
    assert c.set("futurems", "v", pxat=(now + 100) * 1000) is True
    assert c.get("future") == "v" and c.get("futurems") == "v"
    assert c.set("past", "v", exat=now - 100) is True
    assert c.get("past") is None
    assert c.set("soon", "v", pxat=int(time.time() * 1000) + 150) is True
    time.sleep(0.5)
    assert c.get("soon") is None


def test_set_option_errors(c):
    for args, msg in ((("EX", "0"), "invalid expire time"), (("EX", "-1"), "invalid expire time"),
                      (("PX", "0"), "invalid expire time"), (("EX", "abc"), "not an integer"),
                      (("EX", "10", "PX", "10"), "syntax error"), (("KEEPTTL", "EX", "10"), "syntax error"),
                      (("EX",), "syntax error"), (("BOGUS",), "syntax error")):
        with pytest.raises(redis.ResponseError, match=msg):
            c.execute_command("SET", "k", "v", *args)
    assert c.get("k") is None


def test_mget_mset(c):
    assert c.mset({"a": "1", "b": "2", "c": "3"}) is True
    assert c.mget("a", "x", "c", "b") == ["1", None, "3", "2"]
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'mset'"):
        c.execute_command("MSET", "a", "1", "b")
    assert c.get("b") == "2"


def test_incr_decr(c):
    assert c.incr("n") == 1
    assert c.incrby("n", 41) == 42
    assert c.decr("n") == 41
    assert c.decrby("n", 50) == -9
    assert c.incrby("n", -1) == -10
    assert c.get("n") == "-10"
    c.set("big", MAX - 1)
    assert c.incr("big") == MAX
    c.set("small", MIN + 1)
    assert c.decr("small") == MIN


def test_incr_errors(c):
    c.set("s", "abc")
    c.set("f", "1.5")
    for key in ("s", "f"):
        with pytest.raises(redis.ResponseError, match="value is not an integer or out of range"):
            c.incr(key)
    c.set("max", MAX)
    with pytest.raises(redis.ResponseError, match="increment or decrement would overflow"):
        c.incr("max")
    with pytest.raises(redis.ResponseError, match="increment or decrement would overflow"):
        c.incrby("max", 10)
    assert c.get("max") == str(MAX)
    c.set("min", MIN)
    with pytest.raises(redis.ResponseError, match="overflow"):
        c.decr("min")
    for bad in ("abc", "1.5", "99999999999999999999", ""):
        with pytest.raises(redis.ResponseError, match="value is not an integer or out of range"):
            c.execute_command("INCRBY", "n", bad)
    with pytest.raises(redis.ResponseError, match="decrement would overflow"):
        c.execute_command("DECRBY", "n", str(MIN))
    assert c.get("n") is None


def test_append_strlen_dbsize_flushall(c):
    assert c.append("s", "abc") == 3
    assert c.append("s", "de") == 5
    assert c.get("s") == "abcde"
    assert c.strlen("s") == 5
    assert c.strlen("none") == 0
    assert c.append("n", "1") == 1
    assert c.incr("n") == 2  # APPEND produces a normal string INCR can read
    assert c.dbsize() == 2
    c.mset({f"k{i}": i for i in range(100)})
    assert c.dbsize() == 102
    assert c.flushall() is True
    assert c.dbsize() == 0
    assert c.get("s") is None


# ------------------------------------------------------------------ binary safety, big values

def test_binary_values_all_bytes(b):
    b.flushall()
    every = bytes(range(256))
    assert b.set(b"bin", every)
    assert b.get(b"bin") == every
    assert b.strlen(b"bin") == 256
    for i in range(256):
        assert b.set(b"byte:%d" % i, bytes([i]) * 3)
    got = b.mget([b"byte:%d" % i for i in range(256)])
    assert got == [bytes([i]) * 3 for i in range(256)]


def test_binary_keys(b):
    b.flushall()
    keys = [bytes([i]) for i in range(256)] + [b"a\r\nb", b"\x00\x00key\x00", b"\r\n", b"",
                                               b"*1\r\n$4\r\nPING\r\n", b"\xff\xfe", every_key()]
    assert len(set(keys)) == len(keys)
    for i, k in enumerate(keys):
        assert b.set(k, b"v%d\r\n\x00" % i)
    assert b.dbsize() == len(keys)
    for i, k in enumerate(keys):
        assert b.get(k) == b"v%d\r\n\x00" % i, k
        assert b.exists(k) == 1
    assert b.get(b"a\r") is None and b.get(b"a\r\nb\x00") is None  # exact keys only
    assert b.delete(*keys) == len(keys)
    assert b.dbsize() == 0


def every_key():
    return bytes(range(256)) * 2


def test_value_with_crlf_and_nul(b):
    v = b"line1\r\nline2\r\n\x00\x00$5\r\n*3\r\n-ERR x\r\n"
    assert b.set(b"weird", v)
    assert b.get(b"weird") == v
    assert b.append(b"weird", b"\r\n") == len(v) + 2


@pytest.mark.timeout(120)
def test_10mb_value(b):
    big = bytes(range(256)) * (10 * 1024 * 1024 // 256)
    assert len(big) == 10 * 1024 * 1024
    assert b.set(b"big", big)
    assert b.strlen(b"big") == len(big)
    assert b.get(b"big") == big
    assert b.append(b"big", b"tail") == len(big) + 4
    got = b.get(b"big")
    assert len(got) == len(big) + 4 and got[:4096] == big[:4096] and got.endswith(b"tail")
    assert b.delete(b"big") == 1


# ------------------------------------------------------------------ pipelining

@pytest.mark.timeout(120)
def test_pipeline_10000(c):
    p = c.pipeline(transaction=False)
    n = 10_000
    for i in range(n // 4):
        p.set(f"p:{i}", f"v{i}")
        p.get(f"p:{i}")
        p.incr(f"ctr:{i % 7}")
        p.exists(f"p:{i}", f"nope:{i}")
    res = p.execute()
    assert len(res) == n
    counters = [0] * 7
    for i in range(n // 4):
        s, g, inc, ex = res[4 * i:4 * i + 4]
        assert s is True, i
        assert g == f"v{i}", i
        counters[i % 7] += 1
        assert inc == counters[i % 7], i
        assert ex == 1, i
    assert c.dbsize() == n // 4 + 7


@pytest.mark.timeout(60)
def test_pipeline_errors_in_the_middle(c):
    p = c.pipeline(transaction=False)
    p.set("a", "x")
    p.incr("a")           # error
    p.get("a")
    p.execute_command("NOSUCH", "arg")  # error
    p.echo("still here")
    res = p.execute(raise_on_error=False)
    assert res[0] is True and res[2] == "x" and res[4] == "still here"
    assert isinstance(res[1], redis.ResponseError) and "not an integer" in str(res[1])
    assert isinstance(res[3], redis.ResponseError) and "unknown command" in str(res[3])
