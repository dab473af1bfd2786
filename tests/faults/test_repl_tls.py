"""--repl-tls (issue 12, item 1's TLS for the replication link): every replication connection
(log shipping, --from-peer, `kvstore recover --from-peer`) runs inside mutual TLS — each end
presents --tls-cert-file and verifies the other's certificate against --tls-ca-cert-file —
with the secret's handshake and per-frame MACs inside it. Certificates are made by the test
with the `openssl` command (kvstore.tlscerts)."""
import os
import shutil
import socket
import ssl
import threading
import time

import pytest

from helpers import faultlib as fl
from helpers import replwire as rw
from helpers.pair import FETCHED, SEED, Writers, cli, info, kill_at_random_moment, kv, two_free_ports
from kvstore import Node
from kvstore.config import ServerConfig
from kvstore.errors import ConfigError
from kvstore.tlscerts import make_certs

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("the openssl command is needed to make the test's certificates")
    good = make_certs(str(tmp_path_factory.mktemp("repl-tls-certs")))
    rogue = make_certs(str(tmp_path_factory.mktemp("repl-tls-rogue")), ca_name="some-other-ca")
    return {"good": good, "rogue": rogue}


def repl_tls(certs):
    """The settings of a node with --repl-tls (the pair's certificate serves both ends)."""
    g = certs["good"]
    return dict(repl_tls=True, tls_cert_file=g["server_crt"], tls_key_file=g["server_key"],
                tls_ca_cert_file=g["ca_crt"])


def client_ctx(certs, cert="good"):
    """A TLS client context trusting the pair's CA, presenting cert's client certificate
    ("good": signed by the pair's CA, "rogue": by another CA, None: none)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(certs["good"]["ca_crt"])
    if cert:
        ctx.load_cert_chain(certs[cert]["client_crt"], certs[cert]["client_key"])
    return ctx


@pytest.fixture
def receiver(tmp_path, certs):
    """A node that is only a log receiver, with --repl-tls (secret: replwire's)."""
    n = Node(port=0, data_dir=str(tmp_path / "receiver"), durability="none", repl_port=two_free_ports()[0],
             repl_secret_file=rw.write_secret(tmp_path / "repl.secret"), log_path=str(tmp_path / "receiver.stderr"),
             **repl_tls(certs))
    n.start()
    n.rport = n.settings["repl_port"]
    yield n
    n.kill()


class Proxy:
    """A TCP proxy on a free port to 127.0.0.1:target that keeps every byte it forwards."""

    def __init__(self, target):
        self.target = target
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        self.seen = bytearray()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return  # closed
            try:
                u = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:  # the target is not listening yet: as if refused
                c.close()
                continue
            u.settimeout(None)
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src, dst):
        try:
            while chunk := src.recv(65536):
                with self.lock:
                    self.seen += chunk
                dst.sendall(chunk)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.lsock.close()


@pytest.mark.timeout(240)
def test_a_tls_pair_replicates_and_survives_kill_9(pair, certs):
    pair.extra = repl_tls(certs)
    pair.start_both()
    assert "over TLS" in pair.nodes["a"].log()
    pair.wait_in_sync("a")
    w = Writers("tls:")
    w.start(pair.nodes["a"].port)
    kill_at_random_moment(random_gen(), w)
    pair.kill("a")
    w.join()
    assert w.total_acked() > 0
    shutil.rmtree(pair.dirs["a"])  # the machine is gone: its log comes back from B, over TLS
    a = pair.start("a", from_peer=True)
    m = FETCHED.search(a.log())
    assert m and m.group(4) == "it replaces the local log", a.log()
    w.verify(a.port, f"after kill -9 and the loss of A's disk, --repl-tls (seed {SEED})")
    pair.wait_in_sync("a")
    assert info(pair.nodes["b"], "replication")["log_receiver_auth_failures"] == 0


def random_gen():
    import random
    return random.Random(SEED)


@pytest.mark.parametrize("tls", [False, True], ids=["plain-control", "repl-tls"])
def test_a_proxy_between_the_nodes_sees_no_written_value(pair, certs, tls):
    if tls:
        pair.extra = repl_tls(certs)
    proxy = Proxy(pair.rport["b"])
    try:
        b = pair.start("b", wait=False)
        a = pair.start("a", wait=False, peer=f"127.0.0.1:{proxy.port}")
        b.wait_ready(timeout=30)
        a.wait_ready(timeout=30)
        pair.wait_in_sync("a")  # A has its identity (--init, through the proxy) and a connected sender
        marker = b"value-the-wire-must-hide-"
        c = kv(a.port)
        try:
            for i in range(50):
                c.set(f"k{i}", marker + str(i).encode())
        finally:
            c.close()
        pair.wait_in_sync("a")
        with proxy.lock:
            seen = bytes(proxy.seen)
        assert len(seen) > 1000, "the proxy forwarded (almost) nothing: A did not replicate through it"
        assert (marker in seen) == (not tls), f"tls={tls}: a written value {'not ' if not tls else ''}in the clear"
    finally:
        proxy.close()


def refused_tls(node):
    return [line for line in node.log().splitlines() if "refused the connection" in line and "TLS" in line]


def test_a_plain_client_or_another_cas_certificate_is_refused(receiver, certs):
    nid = os.urandom(16)
    rec = fl.encode_record(fl.OP_SET, b"k", b"v", 1)
    attempts = {"plain TCP": None, "a certificate of another CA": client_ctx(certs, "rogue"),
                "no certificate": client_ctx(certs, None)}
    for what, ctx in attempts.items():
        with pytest.raises((rw.Closed, OSError, AssertionError)):
            s = rw.FakeSender(receiver.rport, nid, ssl_context=ctx)
            s.batch(rec)  # (TLS 1.3: a rejected client certificate shows at the first read)
            s.close()
            pytest.fail(f"{what}: the --repl-tls receiver accepted it")
    # Strangers stalled mid-TLS-handshake do not hold up the honest peer (non-blocking handshakes).
    stalled = rw.stalled_strangers(receiver.rport, 6, first=b"\x16\x03\x01")  # a TLS record header
    t0 = time.monotonic()
    s = rw.FakeSender(receiver.rport, nid, ssl_context=client_ctx(certs))  # the control: the pair's CA
    assert s.batch(rec) == 1
    s.close()
    assert time.monotonic() - t0 < 4, "the honest sender waited behind the stalled handshakes"
    # ... nor when their handshake deadline (5 s) closes them: no ERROR is written into a TLS
    # session that never began (the write would wait on each stranger in turn).
    time.sleep(5.5)
    t0 = time.monotonic()
    s = rw.FakeSender(receiver.rport, nid, ssl_context=client_ctx(certs))
    assert s.batch(fl.encode_record(fl.OP_SET, b"k2", b"v2", 2)) == 2
    s.close()
    assert time.monotonic() - t0 < 4, "the honest sender waited while the stalled handshakes were closed"
    for s in stalled:
        s.close()
    assert info(receiver, "replication")["log_receiver_auth_failures"] >= 3
    assert refused_tls(receiver), receiver.log()


def test_recover_from_peer_over_tls(receiver, certs, tmp_path):
    nid = os.urandom(16)
    s = rw.FakeSender(receiver.rport, nid, ssl_context=client_ctx(certs))
    assert s.batch(fl.encode_record(fl.OP_SET, b"k", b"v", 1)) == 1
    s.close()
    dest = tmp_path / "fetched"
    dest.mkdir()
    with open(dest / "node-id", "w") as f:
        f.write(nid.hex() + "\n")
    secret = rw.write_secret(tmp_path / "right.secret")
    base = ["recover", "--data-dir", dest, "--from-peer", f"127.0.0.1:{receiver.rport}", "--repl-secret-file", secret]
    g = certs["good"]
    files = ["--tls-cert-file", g["server_crt"], "--tls-key-file", g["server_key"], "--tls-ca-cert-file", g["ca_crt"]]
    r = cli(*base)  # plain: refused by the --repl-tls receiver
    assert r.returncode != 0, r.stdout + r.stderr
    r = cli(*base, "--repl-tls", *files[:4])  # the CA missing: a config error naming it
    assert r.returncode != 0 and "tls_ca_cert_file" in r.stderr, r.stderr
    r = cli(*base, "--repl-tls", *files)
    assert r.returncode == 0 and "keys: 1," in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("missing", ["tls_cert_file", "tls_key_file", "tls_ca_cert_file"])
def test_repl_tls_without_its_files_is_a_config_error_naming_them(tmp_path, certs, missing):
    settings = dict(durability="remote", peer="127.0.0.1:7000", repl_secret_file=rw.write_secret(tmp_path / "s"),
                    data_dir=str(tmp_path / "d"), **repl_tls(certs))
    settings[missing] = ""
    with pytest.raises(ConfigError, match=missing):
        ServerConfig(**settings).validate()
