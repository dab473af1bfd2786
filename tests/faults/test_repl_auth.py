"""The replication link is authenticated (issue 12, item 1): a log receiver serves only a peer
that proves it holds the pair's secret (--repl-secret-file), both ways, and every frame after
the handshake carries a MAC and an implicit sequence number.

Before: anyone who reached --repl-port could read a node's whole log (FETCH) and write forged
records (HELLO claiming to be node A, one BATCH); A restarted, adopted the longer log "from its
peer", and GET acct:7 changed from balance=70 to balance=99999999. The attack here is that
one, frame for frame (protocol 1, as it worked then), then the same with a wrong secret."""
import os
import re
import socket
import stat
import struct
import threading

import pytest
import redis

from helpers import faultlib as fl
from helpers import replwire as rw
from helpers.pair import cli, info, kv, read_node_id, two_free_ports, wait_for
from helpers.servers import free_port
from kvstore import Node, durability
from kvstore.errors import ServerError


def forge(rport, node_id, key=b"acct:7", value=b"balance=99999999"):
    """The issue's attack on the receiver at rport, with no secret: FETCH node_id's log, HELLO
    claiming to be node_id, one forged BATCH setting key at the next LSN. What the receiver
    answered: {"files": [segment bytes], "hello": frame type or None, "batch": ACKed LSN or None}."""
    out = {"files": [], "hello": None, "batch": None}
    link = rw.Link(rport)
    link.sock.sendall(rw.frame(rw.FETCH, 0, 0, node_id))
    try:
        while True:
            ftype, _, _, payload, _ = link.recv_raw()
            if ftype != rw.FILE:
                break
            out["files"].append(payload)
    except rw.Closed:
        pass
    link.close()
    link = rw.Link(rport)
    link.sock.sendall(rw.frame(rw.HELLO, 1, 0, node_id))
    held = 0
    try:
        ftype, held, _, _, _ = link.recv_raw()
        out["hello"] = ftype
    except rw.Closed:
        pass
    lsn = held + 1 if out["hello"] == rw.HELLO_ACK else 1
    try:  # sent whatever the answer: an attacker does not wait for permission
        link.sock.sendall(rw.frame(rw.BATCH, lsn, lsn, fl.encode_record(fl.OP_SET, key, value, lsn)))
        ftype, acked, _, _, _ = link.recv_raw()
        out["batch"] = acked if ftype == rw.ACK else None
    except (rw.Closed, OSError):
        pass
    link.close()
    return out


def refusals(node):
    """The receiver's log lines refusing a connection."""
    return re.findall(r"log receiver: refused the connection from [\d.:]+: .*", node.log())


@pytest.mark.timeout(240)
def test_a_forged_peer_can_neither_read_nor_rewrite_a_nodes_log(pair):
    pair.start_both()
    a = pair.nodes["a"]
    c = kv(a.port)
    assert c.set("acct:7", "balance=70") is True
    for i in range(20):
        c.set(f"acct:{100 + i}", "balance=1")
    c.close()
    pair.wait_in_sync("a")
    nid = bytes.fromhex(read_node_id(pair.dirs["a"]))
    b = pair.nodes["b"]
    got = forge(pair.rport["b"], nid)
    assert not got["files"] and got["hello"] != rw.HELLO_ACK and got["batch"] is None, \
        f"B served an unauthenticated peer: {got}"
    # protocol 2 with the wrong secret: the proof fails, the receiver says so and closes
    link = rw.Link(pair.rport["b"])
    with pytest.raises(rw.Closed) as e:
        link.handshake(rw.pair_key(b"a-guess-at-the-pairs-secret-0000"), rw.ROLE_SENDER, nid)
    link.close()
    assert "authentication failed" in e.value.error, e.value.error
    # A's own link is unharmed: it still replicates
    c = kv(a.port)
    assert c.set("acct:8", "balance=5") is True
    c.close()
    pair.wait_in_sync("a")
    assert info(b, "replication")["log_receiver_auth_failures"] >= 3
    assert len(refusals(b)) >= 3, b.log()
    # A restarts, compares its log with B's copy and keeps the true history
    pair.kill("a")
    a = pair.start("a")
    c = kv(a.port)
    try:
        assert c.get("acct:7") == b"balance=70"
        assert c.get("acct:8") == b"balance=5"
    finally:
        c.close()


@pytest.fixture
def receiver(tmp_path):
    """A node whose only job is to be a log receiver (secret: replwire's): the Node."""
    n = Node(port=0, data_dir=str(tmp_path / "receiver"), durability="none", repl_port=two_free_ports()[0],
             repl_secret_file=rw.write_secret(tmp_path / "repl.secret"), log_path=str(tmp_path / "receiver.stderr"))
    n.start()
    n.rport = n.settings["repl_port"]
    yield n
    n.kill()


def held_by(receiver, nid):
    """The LSN the receiver holds of nid's log (a new, honest connection's HELLO_ACK)."""
    s = rw.FakeSender(receiver.rport, nid)
    s.close()
    return s.held


def test_an_unauthenticated_or_wrongly_keyed_fetch_is_refused(receiver, tmp_path):
    nid = os.urandom(16)
    s = rw.FakeSender(receiver.rport, nid)
    assert s.batch(fl.encode_record(fl.OP_SET, b"k", b"v", 1)) == 1
    s.close()
    assert forge(receiver.rport, nid)["files"] == []
    dest = tmp_path / "fetched"
    dest.mkdir()
    with pytest.raises(ServerError, match="authentication failed"):
        durability.fetch_from_peer(str(dest), "127.0.0.1", receiver.rport,
                                   key=rw.pair_key(b"another-pairs-secret-0123456789"))
    assert not [n for n in os.listdir(dest) if n.startswith("log")], os.listdir(dest)
    # `kvstore recover --from-peer` without the secret, with the wrong one, with the right one
    r = cli("recover", "--data-dir", dest, "--from-peer", f"127.0.0.1:{receiver.rport}")
    assert r.returncode != 0 and "head -c 32 /dev/urandom" in r.stderr, r.stderr
    wrong = rw.write_secret(tmp_path / "wrong.secret", b"another-pairs-secret-0123456789")
    r = cli("recover", "--data-dir", dest, "--from-peer", f"127.0.0.1:{receiver.rport}", "--repl-secret-file", wrong)
    assert r.returncode != 0 and "authentication failed" in r.stderr, r.stderr
    d2 = tmp_path / "fetched2"
    os.mkdir(d2)
    with open(d2 / "node-id", "w") as f:
        f.write(nid.hex() + "\n")
    r = cli("recover", "--data-dir", d2, "--from-peer", f"127.0.0.1:{receiver.rport}", "--repl-secret-file",
            rw.write_secret(tmp_path / "right.secret"))
    assert r.returncode == 0 and "keys: 1," in r.stdout, r.stdout + r.stderr
    assert len(refusals(receiver)) >= 3, receiver.log()


def test_a_replayed_tampered_or_reordered_frame_closes_the_link(receiver):
    nid = os.urandom(16)
    s = rw.FakeSender(receiver.rport, nid)
    rec1 = fl.encode_record(fl.OP_SET, b"k1", b"v1", 1)
    sealed = s.link.sealed(rw.BATCH, 1, 1, rec1)
    s.link.sock.sendall(sealed)
    s.link.send_seq += 1
    assert s.link.recv()[1] == 1
    s.link.sock.sendall(sealed)  # replayed: its sequence number is spent
    assert s.link.closed() is None
    s.close()
    rec2 = fl.encode_record(fl.OP_SET, b"k2", b"v2", 2)
    # tampered: a byte of the payload changed after the MAC (its CRC made to match again)
    s = rw.FakeSender(receiver.rport, nid)
    good = s.link.sealed(rw.BATCH, 2, 2, rec2)
    evil = fl.encode_record(fl.OP_SET, b"k2", b"XX", 2)
    hdr = rw.header(rw.BATCH, 2, 2, evil)
    s.link.sock.sendall(hdr + evil + good[-32:])
    assert s.link.closed() is None
    s.close()
    # reordered: the frame MACed for the next sequence number sent first
    s = rw.FakeSender(receiver.rport, nid)
    s.link.sock.sendall(s.link.sealed(rw.BATCH, 2, 2, rec2, seq=s.link.send_seq + 1))
    assert s.link.closed() is None
    s.close()
    assert held_by(receiver, nid) == 1, "a refused frame was stored"
    assert info(receiver, "replication")["log_receiver_auth_failures"] >= 3


def test_strangers_that_stall_mid_handshake_do_not_hold_up_the_peer(receiver):
    """Twelve connections that send one byte of a frame and go silent: the receiver thread
    (which also serves the real peer) reads handshakes without blocking, so an honest sender
    is still served at once; the stalled ones are closed after the handshake deadline."""
    import time

    stalled = []
    for _ in range(12):
        s = socket.create_connection(("127.0.0.1", receiver.rport))
        s.sendall(b"K")
        stalled.append(s)
    t0 = time.monotonic()
    nid = os.urandom(16)
    sender = rw.FakeSender(receiver.rport, nid)
    assert sender.batch(fl.encode_record(fl.OP_SET, b"k", b"v", 1)) == 1
    took = time.monotonic() - t0
    sender.close()
    assert took < 4, f"the honest sender waited {took:.1f} s behind the stalled strangers"
    for s in stalled:
        s.settimeout(15)
        try:
            while s.recv(4096):
                pass
        except ConnectionResetError:
            pass
        s.close()
    assert info(receiver, "replication")["log_receiver_auth_failures"] >= 12


@pytest.mark.parametrize("case", ["fetch role sends HELLO", "HELLO for another node id"])
def test_a_connection_may_act_only_as_its_handshake_said(receiver, case):
    nid, other = os.urandom(16), os.urandom(16)
    role = rw.ROLE_FETCH if case.startswith("fetch") else rw.ROLE_SENDER
    link = rw.Link(receiver.rport).handshake(rw.pair_key(), role, nid)
    link.send(rw.HELLO, rw.VERSION, 0, nid if role == rw.ROLE_FETCH else other)
    with pytest.raises(rw.Closed) as e:
        link.recv()
    assert "another role or node id" in e.value.error
    link.close()


def test_the_client_refuses_a_receiver_that_cannot_prove_the_secret(tmp_path):
    """A fake receiver (an attacker in the middle, or a wrong --peer) answers the handshake
    without the secret: the recovering node writes nothing it sent."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def fake():
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(10)
            f = conn.makefile("rb")
            f.read(32 + 48)  # AUTH_HELLO
            conn.sendall(rw.frame(rw.AUTH_CHALLENGE, 0, 0, os.urandom(32)))
            f.read(32 + 32)  # AUTH_PROOF
            conn.sendall(rw.frame(rw.AUTH_PROOF, 0, 0, os.urandom(32)))
            conn.sendall(rw.frame(rw.FILE, 1, 0, b"KVSWAL02" + struct.pack("<Q", 1)))
            f.read()  # until the client closes
    t = threading.Thread(target=fake, daemon=True)
    t.start()
    dest = tmp_path / "d"
    dest.mkdir()
    with pytest.raises(ServerError, match="failed to prove that it holds the replication secret"):
        durability.fetch_from_peer(str(dest), "127.0.0.1", port, key=rw.pair_key())
    t.join(10)
    srv.close()
    assert not os.path.exists(dest / "log"), os.listdir(dest)


@pytest.mark.timeout(120)
def test_a_peer_with_a_different_secret_is_refused_and_logged(pair, tmp_path):
    """A's secret differs from B's: A's fetch of its state is refused (A says why and, having
    no state of its own, waits for it with -LOADING instead of starting empty), B logs the
    refusals, rate-limited."""
    pair.start("b")
    wrong = rw.write_secret(tmp_path / "other.secret", b"a-secret-that-is-not-the-pairs")
    a = pair.start("a", repl_secret_file=wrong, peer_startup_wait_ms=0)
    wait_for("A's fetch to be refused twice", lambda: info(a, "persistence")["loading_fetch_attempts"] >= 2)
    p = info(a, "persistence")
    assert p["loading"] == 1 and "repl-secret-file" in str(p["loading_last_error"]), p
    c = kv(a.port)
    with pytest.raises(redis.BusyLoadingError):
        c.set("still", "refused")
    c.close()
    b = pair.nodes["b"]
    assert info(b, "replication")["log_receiver_auth_failures"] >= 2
    assert any("authentication failed" in line for line in refusals(b)), b.log()
    # a flood of bad handshakes: every one refused, the log lines bounded
    before = len(refusals(b))
    for _ in range(40):
        link = rw.Link(pair.rport["b"])
        link.sock.sendall(rw.frame(rw.HELLO, 1, 0, os.urandom(16)))
        link.closed()
        link.close()
    assert info(b, "replication")["log_receiver_auth_failures"] >= 42
    assert len(refusals(b)) - before < 20, "every refusal logged: not rate-limited"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["no secret", "readable by others", "too short"])
def test_a_missing_or_unsafe_secret_file_is_refused(tmp_path, case):
    path = tmp_path / "s"
    if case == "readable by others":
        rw.write_secret(path, mode=0o644)
    elif case == "too short":
        rw.write_secret(path, b"short")
    args = ["serve", "--port", "0", "--durability", "none", "--repl-port", "0", "--data-dir", tmp_path / "d"]
    if case != "no secret":
        args += ["--repl-secret-file", path]
    r = cli(*args, timeout=60)
    assert r.returncode != 0 and "listening on" not in r.stdout
    want = {"no secret": "head -c 32 /dev/urandom", "readable by others": "chmod 600",
            "too short": "at least 16"}[case]
    assert want in r.stderr, r.stderr
    if case == "readable by others":
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644  # reported, not changed behind the user's back


def _listening(port):
    """The IPv4 address a TCP socket of this machine listens on at port (from /proc/net/tcp)."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if int(p, 16) == port and state == "0A":
                return socket.inet_ntoa(struct.pack("<I", int(addr, 16)))
    return None


@pytest.mark.parametrize("repl_bind", [None, "0.0.0.0"])
def test_the_receiver_binds_repl_bind_not_bind(tmp_path, repl_bind):
    """--bind 0.0.0.0 opens the RESP port to the network; the receiver stays on 127.0.0.1
    unless --repl-bind says otherwise."""
    rport = free_port()
    n = Node(bind="0.0.0.0", port=0, data_dir=str(tmp_path / "d"), durability="none", repl_port=rport,
             repl_bind=repl_bind, repl_secret_file=rw.write_secret(tmp_path / "s"),
             log_path=str(tmp_path / "n.stderr"))
    n.start()
    try:
        assert _listening(rport) == (repl_bind or "127.0.0.1")
    finally:
        n.kill()


@pytest.mark.timeout(120)
def test_a_node_is_not_its_own_peer(tmp_path):
    """Reflection: the pair shares one secret, so a node's sender redirected (by anyone on
    the path) to the node's own --repl-port used to pass the handshake; the node then stored
    its own log under peer/<its id>, acknowledged it to itself and told clients their writes
    were held by another machine. Here --peer simply names the node's own --repl-port: its
    receiver must refuse the handshake (it knows its own id), the node stays degraded
    (syncing every write locally) and its receiver holds no log."""
    rport = two_free_ports()[0]
    n = Node(port=0, data_dir=str(tmp_path / "self"), durability="remote", peer=f"127.0.0.1:{rport}",
             repl_port=rport, init=True, repl_secret_file=rw.write_secret(tmp_path / "repl.secret"),
             peer_timeout_ms=500, threads=1, log_path=str(tmp_path / "self.stderr"))
    n.launch()
    try:
        n.wait_ready(timeout=30)
        c = kv(n.port)
        for i in range(20):
            assert c.set(f"k{i}", "v") is True
        c.close()
        wait_for("the reflected handshake to be refused",
                 lambda: info(n, "replication")["log_receiver_auth_failures"] >= 1)
        r = info(n, "replication")
        assert r["log_peer_connected"] == 0 and r["log_peer_degraded"] == 1, r
        assert r["log_receiver_peers"] == 0 and r["log_receiver_held_lsn"] == 0, r
        assert any("own id" in line for line in refusals(n)), n.log()
        assert not os.listdir(tmp_path / "self" / "peer") if os.path.isdir(tmp_path / "self" / "peer") else True
    finally:
        n.kill()



def test_a_connection_flood_cannot_evict_the_peers_handshake_in_progress(receiver):
    """Handshake-slot starvation: with every receiver slot taken, the oldest unauthenticated
    connection made room, so a stranger opening ~16 connections per round trip of the peer's
    handshake evicted the peer's connection every time (the peer never got in). The round trip
    is slowed here instead of the stranger sped up: the peer sends its HELLO and gets the
    challenge, a stranger (source 127.0.0.2) opens 40 silent connections, which the receiver
    accepts (each evicting one), then the peer sends its proof. Now each address holds at
    most 4 unauthenticated slots and a flooder only evicts its own: the handshake completes."""
    key, nid = rw.pair_key(), os.urandom(16)
    base = info(receiver, "replication")["log_receiver_auth_failures"]
    link = rw.Link(receiver.rport)
    nonce_c = os.urandom(32)
    link.send(rw.AUTH_HELLO, rw.VERSION, rw.ROLE_SENDER, nid + nonce_c)
    ftype, _, _, nonce_s = link.recv()
    assert ftype == rw.AUTH_CHALLENGE
    flood = []
    try:
        for _ in range(40):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.connect(("127.0.0.1", receiver.rport))
            flood.append(s)
        # 40 accepted into at most 16 slots: at least 24 made room by evicting someone
        wait_for("the flood to be accepted",
                 lambda: info(receiver, "replication")["log_receiver_auth_failures"] >= base + 24)
        link.send(rw.AUTH_PROOF, 0, 0, rw._derive(key, b"kvstore repl v2 client proof", rw.ROLE_SENDER, nid,
                                                  nonce_c, nonce_s))
        ftype, _, _, proof = link.recv()  # evicted: Closed("... its slot was needed")
        assert ftype == rw.AUTH_PROOF
        link.session = rw._derive(key, b"kvstore repl v2 session key", rw.ROLE_SENDER, nid, nonce_c, nonce_s)
        link.send(rw.HELLO, rw.VERSION, 0, nid)
        assert link.recv()[0] == rw.HELLO_ACK
    finally:
        link.close()
        for s in flood:
            s.close()


# ------------------------------------------------ every drop says why (rconn_drop)

def drops(node):
    return re.findall(r"log receiver: dropped the connection from [\d.:]+ \(node ([0-9a-f]{32})\): (.*)", node.log())


def dropped(node, nid, pattern):
    """Wait for the receiver's log to say it dropped nid's connection with a reason matching pattern."""
    return wait_for(f"a drop of node {nid.hex()} matching {pattern!r}",
                    lambda: [why for who, why in drops(node) if who == nid.hex() and re.search(pattern, why)],
                    timeout=10)


def test_every_connection_the_receiver_drops_says_why(receiver):
    """A sender that only sees "Connection reset by peer" needs the receiver's side: each way
    it drops an authenticated sender names the reason in its log (before, none was logged)."""
    nid = os.urandom(16)
    rec = [fl.encode_record(fl.OP_SET, b"k%d" % i, b"v", i) for i in range(1, 4)]

    s = rw.FakeSender(receiver.rport, nid)  # a gap: LSN 3 while nothing is held
    assert s.batch(rec[2]) is None
    s.close()
    dropped(receiver, nid, r"a batch from LSN 3 leaves a gap: held up to 0")

    s = rw.FakeSender(receiver.rport, nid)  # the frame names LSNs its records do not carry
    s.link.send(rw.BATCH, 1, 2, rec[0])
    assert s.link.closed() is None
    s.close()
    dropped(receiver, nid, r"a batch named LSNs 1-2 but carried 1 records up to LSN 1")

    s = rw.FakeSender(receiver.rport, nid)  # one HELLO per connection
    s.link.send(rw.HELLO, rw.VERSION, 0, nid)
    assert s.link.closed() is None
    s.close()
    dropped(receiver, nid, r"a second HELLO")

    s = rw.FakeSender(receiver.rport, nid)  # a frame a sender never sends
    s.link.send(rw.HELLO_ACK, 0, 0, b"")
    assert s.link.closed() is None
    s.close()
    dropped(receiver, nid, r"an unexpected frame")

    old = rw.FakeSender(receiver.rport, nid)  # one sender per node: the newest wins
    new = rw.FakeSender(receiver.rport, nid)
    assert old.link.closed() is None
    dropped(receiver, nid, r"replaced by a newer connection of the same node")
    assert new.batch(rec[0]) == 1  # the newer one is served
    new.close()
    dropped(receiver, nid, r"the peer closed the connection")
