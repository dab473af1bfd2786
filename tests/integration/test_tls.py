"""TLS on the RESP port (--tls-port, ext/core/tls.c, ext/frontend/tlsio.c): real servers
with certificates the test makes with the `openssl` command (kvstore.tlscerts), driven by
redis-cli --tls and redis-py ssl=True; the client-certificate rules of --tls-auth-clients
(yes / optional / no) checked against a real redis-server given the same files and
clients; large and pipelined traffic through partial TLS writes to a slow reader; bad
clients (no certificate, a certificate from another CA, plain RESP, a stalled handshake)
refused or waited for without holding up anyone else; the configuration errors."""
import os
import socket
import ssl
import subprocess
import tempfile
import time

import pytest
import redis

from kvstore import Node
from kvstore.config import ServerConfig
from kvstore.errors import ConfigError, ServerError
from kvstore.tlscerts import make_certs

from helpers.servers import RedisServer, free_port, listening_ports, need, start_node, stop_node

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    need("openssl")
    good = make_certs(str(tmp_path_factory.mktemp("tls-certs")))
    rogue = make_certs(str(tmp_path_factory.mktemp("tls-rogue")), ca_name="some-other-ca")
    return {**good, "rogue_crt": rogue["client_crt"], "rogue_key": rogue["client_key"]}


def tls_settings(certs, auth="yes"):
    return dict(tls_port=0, tls_cert_file=certs["server_crt"], tls_key_file=certs["server_key"],
                tls_ca_cert_file=certs["ca_crt"], tls_auth_clients=auth)


@pytest.fixture(scope="module")
def node(certs):
    n = start_node(threads=2, **tls_settings(certs))
    yield n
    stop_node(n)


def tls_client(port, certs, cert="client", **kw):
    """redis-py over TLS; cert: "client" (signed by the CA), "rogue" (another CA) or None."""
    if cert:
        kw.update(ssl_certfile=certs[f"{cert}_crt"], ssl_keyfile=certs[f"{cert}_key"])
    return redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=certs["ca_crt"], protocol=2,
                       socket_timeout=10, **kw)


def outcome(port, certs, cert):
    """"ok" if PING over TLS with that client certificate is answered, else "refused"."""
    try:
        with tls_client(port, certs, cert) as r:
            return "ok" if r.ping() else "refused"
    except (redis.ConnectionError, ssl.SSLError, OSError):
        return "refused"


def redis_cli(port, certs, *args, cert=True):
    need("redis-cli")
    argv = ["redis-cli", "-h", "127.0.0.1", "-p", str(port), "--tls", "--cacert", certs["ca_crt"]]
    if cert:
        argv += ["--cert", certs["client_crt"], "--key", certs["client_key"]]
    return subprocess.run(argv + list(args), capture_output=True, text=True, timeout=30)


def test_redis_cli_over_tls(node, certs):
    assert node.tls_port and node.tls_port != node.port
    p = redis_cli(node.tls_port, certs, "SET", "tls:cli", "hello")
    assert p.stdout.strip() == "OK", p.stderr
    assert redis_cli(node.tls_port, certs, "GET", "tls:cli").stdout.strip() == "hello"
    # one engine behind both ports
    assert node.client().get("tls:cli") == b"hello"
    info = redis_cli(node.tls_port, certs, "INFO", "server").stdout
    assert f"tls_port:{node.tls_port}" in info
    p = redis_cli(node.tls_port, certs, "CONFIG", "GET", "tls-*")
    assert p.stdout.split() == ["tls-port", str(node.tls_port), "tls-auth-clients", "yes"], p.stdout


def test_redis_py_ssl(node, certs):
    with tls_client(node.tls_port, certs) as r:
        assert r.set("tls:py", "v1") and r.get("tls:py") == b"v1"
        # values spanning many TLS records, and pipelines of many requests per record
        big = os.urandom(3 * 1024 * 1024 + 17)
        r.set("tls:big", big)
        assert r.get("tls:big") == big
        pipe = r.pipeline(transaction=False)
        for i in range(5000):
            pipe.set(f"tls:k{i}", str(i) * 20)
        pipe.execute()
        pipe = r.pipeline(transaction=False)
        for i in range(5000):
            pipe.get(f"tls:k{i}")
        assert pipe.execute() == [(str(i) * 20).encode() for i in range(5000)]
    assert node.client().get("tls:big") == big


def test_slow_reader_gets_every_byte(node, certs):
    """Replies larger than the socket takes: TLS writes stop part-way (WANT_WRITE) and go
    on with the same bytes; a client reading slowly still gets exactly what was sent."""
    value = os.urandom(512 * 1024)
    with tls_client(node.tls_port, certs) as r:
        r.set("tls:slow", value)
    ctx = ssl.create_default_context(cafile=certs["ca_crt"])
    ctx.load_cert_chain(certs["client_crt"], certs["client_key"])
    n = 24
    with socket.create_connection(("127.0.0.1", node.tls_port), timeout=20) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"*2\r\n$3\r\nGET\r\n$8\r\ntls:slow\r\n" * n)
            want = (b"$%d\r\n" % len(value) + value + b"\r\n") * n
            time.sleep(1)  # not reading: the server's socket fills, its writes stop part-way
            got = bytearray()
            deadline = time.monotonic() + 60
            while len(got) < len(want) and time.monotonic() < deadline:
                chunk = s.recv(4096 if len(got) < 1 << 20 else 1 << 16)
                assert chunk, f"closed after {len(got)} of {len(want)} bytes"
                got += chunk
            assert bytes(got) == want


def test_client_certificates_as_redis(node, certs, tmp_path):
    """tls-auth-clients yes / optional / no: which clients get in, compared with a real
    redis-server given the same certificate files and the same clients."""
    cases = ("client", None, "rogue")
    seen = {}
    for auth in ("yes", "optional", "no"):
        n = node if auth == "yes" else start_node(threads=1, **tls_settings(certs, auth))
        try:
            seen[("kvstore", auth)] = tuple(outcome(n.tls_port, certs, c) for c in cases)
        finally:
            if n is not node:
                stop_node(n)
    need("redis-server")
    for auth in ("yes", "optional", "no"):
        port = free_port()
        ref = RedisServer("--tls-port", str(port), "--tls-cert-file", certs["server_crt"], "--tls-key-file",
                          certs["server_key"], "--tls-ca-cert-file", certs["ca_crt"], "--tls-auth-clients", auth)
        try:
            ref.start()
        except RuntimeError as e:
            pytest.skip(f"redis-server without TLS support? {e}")
        try:
            seen[("redis", auth)] = tuple(outcome(port, certs, c) for c in cases)
        finally:
            ref.stop()
    for auth in ("yes", "optional", "no"):
        assert seen[("kvstore", auth)] == seen[("redis", auth)], seen
    assert seen[("kvstore", "yes")] == ("ok", "refused", "refused")
    assert seen[("kvstore", "no")] == ("ok", "ok", "ok")


def test_refusals_are_logged_and_counted(node, certs):
    def failures():
        with tls_client(node.tls_port, certs) as r:
            return r.info("stats")["tls_handshake_failures"]

    before = failures()
    assert outcome(node.tls_port, certs, None) == "refused"
    assert outcome(node.tls_port, certs, "rogue") == "refused"
    # plain RESP on the TLS port is not a handshake either
    assert b"PONG" not in plain_ping(node.tls_port)
    deadline = time.monotonic() + 10
    while failures() < before + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert failures() >= before + 3
    log = node.log()
    assert "Error accepting a client connection" in log
    assert "peer did not return a certificate" in log
    assert node.client().ping()


def plain_ping(port):
    """What a plain-RESP PING sent to port gets back before the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"*1\r\n$4\r\nPING\r\n")
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
        return data


def test_plain_resp_on_tls_port_gets_no_reply(node):
    assert b"PONG" not in plain_ping(node.tls_port)
    assert node.client().ping()


def test_stalled_handshakes_hold_up_nobody(node, certs):
    """Pollers never wait for one client: half a ClientHello, or nothing at all, on
    many connections, while a TLS client and a plain one are served."""
    idle = [socket.create_connection(("127.0.0.1", node.tls_port), timeout=10) for _ in range(20)]
    try:
        for s in idle[:10]:
            s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello cut short
        t0 = time.monotonic()
        with tls_client(node.tls_port, certs) as r:
            for i in range(50):
                assert r.incr("tls:ctr") >= 1
        assert node.client().ping()
        assert time.monotonic() - t0 < 30
    finally:
        for s in idle:
            s.close()


def test_requirepass_applies_over_tls(certs):
    n = start_node(threads=1, requirepass="pw", **tls_settings(certs))
    try:
        with tls_client(n.tls_port, certs) as r:
            with pytest.raises(redis.AuthenticationError):
                r.get("x")
        with tls_client(n.tls_port, certs, password="pw") as r:
            assert r.ping()
    finally:
        stop_node(n)


def test_configuration_errors(certs, tmp_path):
    def load(**kw):
        return ServerConfig.load(**kw)

    with pytest.raises(ConfigError, match="tls_cert_file: --tls-port needs --tls-cert-file"):
        load(tls_port=0)
    with pytest.raises(ConfigError, match=r"tls_ca_cert_file: .*--tls-auth-clients no"):
        load(tls_port=0, tls_cert_file=certs["server_crt"], tls_key_file=certs["server_key"])
    with pytest.raises(ConfigError, match="not supported with --arch threadpool"):
        load(arch="threadpool", **tls_settings(certs))
    with pytest.raises(ConfigError, match="tls_auth_clients: expected 'yes', 'no' or 'optional'"):
        load(**{**tls_settings(certs), "tls_auth_clients": "maybe"})
    with pytest.raises(ConfigError, match="not a readable file"):
        load(**{**tls_settings(certs), "tls_key_file": str(tmp_path / "missing.key")})
    # what only OpenSSL can tell: the server refuses to start, saying which file and why
    bad = tmp_path / "bad.crt"
    bad.write_text("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
    with pytest.raises(ServerError, match=f"cannot load certificate {bad}"):
        start_node(**{**tls_settings(certs), "tls_cert_file": str(bad)})
    with pytest.raises(ServerError, match="cannot load private key .*key values mismatch"):
        start_node(**{**tls_settings(certs), "tls_key_file": certs["client_key"]})


def test_tls_off_by_default(kv_fresh, redis_server):
    """No TLS port unless asked; CONFIG GET tls-port says 0, as Redis's does without one."""
    assert kv_fresh.tls_port is None
    c = kv_fresh.client()
    assert "tls_port" not in c.info("server")
    ours = redis.Redis(port=kv_fresh.port, protocol=2, decode_responses=True)
    ref = redis.Redis(port=redis_server.port, protocol=2, decode_responses=True)
    assert ours.config_get("tls-port") == ref.config_get("tls-port") == {"tls-port": "0"}


@pytest.mark.parametrize("policy,accept", [("direct", "handoff"), ("strict", "reuseport"),
                                           ("flexpoll", "reuseport")])
def test_every_poll_policy_and_accept_mode(certs, policy, accept):
    """Edge-triggered (direct) and level-triggered (strict, flexpoll) pollers, connections
    accepted by their own poller or handed over by poller 0: the same bytes come back."""
    n = start_node(threads=2, poll_policy=policy, accept=accept, **tls_settings(certs))
    try:
        clients = [tls_client(n.tls_port, certs) for _ in range(4)]
        value = os.urandom(100 * 1024)
        for i, r in enumerate(clients):
            pipe = r.pipeline(transaction=False)
            for j in range(300):
                pipe.set(f"tls:{i}:{j}", value[j:] + b"%d" % j)
            pipe.execute()
        for i, r in enumerate(clients):
            pipe = r.pipeline(transaction=False)
            for j in range(300):
                pipe.get(f"tls:{i}:{j}")
            assert pipe.execute() == [value[j:] + b"%d" % j for j in range(300)]
            r.close()
        if accept == "handoff":  # poller 0 handed TLS connections round-robin: both served some
            assert all(p["commands"] > 0 for p in n.stats()["poller_stats"]), n.stats()["poller_stats"]
    finally:
        stop_node(n)


def test_tls_only_has_no_plain_port(certs):
    """--port -1 with --tls-port: nothing plain listens (Redis's `port 0`); INFO and CONFIG
    GET say port 0, as Redis's do then."""
    n = Node(port=-1, data_dir=tempfile.mkdtemp(prefix="kvstore-test-"), durability="none", threads=2,
             **tls_settings(certs)).start(timeout=60)
    try:
        assert n.tls_port and listening_ports(n.pid) == {n.tls_port}
        with tls_client(n.tls_port, certs, decode_responses=True) as r:
            assert r.ping()
            assert r.info("server")["tcp_port"] == 0
            assert r.config_get("port") == {"port": "0"}
    finally:
        stop_node(n)
    with pytest.raises(ConfigError, match="port: -1 .* needs --tls-port; without it, expected a port from 0 to 65535"):
        ServerConfig.load(port=-1)
