"""--arch udp: the UDP front end on kernel sockets (recvmmsg/sendmmsg), served by real
nodes on loopback and checked with real clients: every reply byte for byte
(udp_client.py) and `kvstore bench --udp --check`; replies held until the log holds
their write; requests that wait for the flusher or the loader; MGET resumed across
loads; several workers sharing one port. (kill -9 under load over UDP is in
tests/faults/test_disk_durability.py, machine loss in test_remote_durability.py.)"""
import os
import socket
import subprocess
import sys
import time

import pytest

from helpers import udp_client
from helpers.conn import UdpConn
from helpers.resp import Incomplete, resp_cmd, resp_reply_end
from kvstore import Node
from test_redis_compat import REPLY_CASES, converse

pytestmark = pytest.mark.timeout(120)
CLI = [sys.executable, "-m", "kvstore.cli"]


def udp_node(tmp_path, **settings):
    settings.setdefault("durability", "none")  # memory only unless a test asks for the log
    return Node(port=0, data_dir=tmp_path / "node", arch="udp", udp_port=0, **settings)


def test_every_reply_checked_and_the_bench(tmp_path):
    with udp_node(tmp_path, udp_workers=2) as node:
        st = udp_client.check(subprocess.run, node, "127.0.0.1", node.udp_port)
        assert st["udp_held_for_log"] == 0 and st["udp_stalled"] == 0, st  # nothing to wait for
        with node.client() as c:
            info = c.info("server")
        assert info["arch"] == "udp" and info["udp_port"] == node.udp_port and info["udp_workers"] == 2
        assert node.stop() == 0, node.log()[-2000:]


def one_per_datagram(request_bytes, n):
    """The case's requests, one per datagram; None where the UDP front end cannot carry the case
    as it stands: inline or partial requests, replies not one per request, or state kept between
    requests (a datagram is its own connection: HELLO, CLIENT SETNAME, AUTH last one request)."""
    out, pos = [], 0
    while pos < len(request_bytes):
        if request_bytes[pos:pos + 1] != b"*":
            return None
        try:
            end = resp_reply_end(request_bytes, pos)  # a request is an array of bulk strings
        except (Incomplete, ValueError):
            return None
        out.append(request_bytes[pos:end])
        pos = end
    words = {r.split(b"\r\n")[2].upper() for r in out if r.count(b"\r\n") > 2}
    if len(out) != n or words & {b"HELLO", b"CLIENT", b"AUTH", b"QUIT"}:
        return None
    return out


UDP_CASES = [(name, reqs) for name, b, n in REPLY_CASES if (reqs := one_per_datagram(b, n))]


@pytest.fixture(scope="module")
def udp_plain(tmp_path_factory):
    n = Node(port=0, data_dir=tmp_path_factory.mktemp("udp"), arch="udp", udp_port=0, udp_workers=2,
             durability="none").start()
    yield n
    n.stop()


@pytest.mark.parametrize("name,requests", UDP_CASES, ids=[c[0] for c in UDP_CASES])
def test_same_replies_as_redis_over_udp(redis_server, udp_plain, name, requests):
    """The compatibility cases that fit the UDP front end (one request per datagram, no
    connection state): the same bytes as redis-server gives over TCP, each reply in its own
    datagram, with the ERROR flag never set (these are command errors, not framing errors)."""
    want = converse(redis_server.port, b"".join(requests), len(requests))
    with UdpConn(udp_plain.udp_port) as u:
        assert u.call("FLUSHALL") == b"+OK\r\n"
        got = [u.reply(u.send(r)) for r in requests + [resp_cmd("PING")]]
    assert [flags for flags, _ in got] == [1] * len(got)
    assert [reply for _, reply in got] == want


def test_cases_over_udp_cover_the_commands():
    assert len(UDP_CASES) >= 40, [c[0] for c in UDP_CASES]


def test_network_only_answers_without_storing(tmp_path):
    with udp_node(tmp_path, network_only=True) as node, UdpConn(node.udp_port) as u:
        assert u.call("SET", "k", "v") == b"+OK\r\n"
        assert u.call("GET", "k") == b"$-1\r\n"


def test_reply_waits_for_the_sync(tmp_path, monkeypatch):
    delay = 0.3
    monkeypatch.setenv("KVSTORE_FAULT_SYNC_DELAY_US", str(int(delay * 1e6)))
    with udp_node(tmp_path, durability="disk", data_file=False) as node, UdpConn(node.udp_port) as u:
        assert u.call("PING") == b"+PONG\r\n"  # no write: not held
        for cmd, want in ((("SET", "k", "v"), b"+OK\r\n"), (("INCR", "n"), b":1\r\n"), (("DEL", "k"), b":1\r\n")):
            t0 = time.monotonic()
            assert u.call(*cmd) == want
            dt = time.monotonic() - t0
            assert dt >= delay - 0.005, f"{cmd} acknowledged after {dt:.3f} s, the sync takes {delay} s"
        # a read of a write still waiting for its sync waits too
        rid = u.send(resp_cmd("SET", "k", "new"))
        t0 = time.monotonic()
        with UdpConn(node.udp_port) as reader:
            time.sleep(0.05)
            assert reader.call("GET", "k") == b"$3\r\nnew\r\n"
            assert time.monotonic() - t0 >= delay - 0.06
        assert u.reply(rid) == (1, b"+OK\r\n")
        st = node.stats()
    assert st["udp_held_for_log"] >= 4, st


def test_memory_far_below_the_data(tmp_path):
    """5x the memory bound written over UDP: requests wait for the flusher (stalls),
    every one is acknowledged, and every key reads back, over UDP (loads; MGET resumed
    key by key) and over TCP."""
    n, size = 6000, 400  # ~2.6 MB of values in 512 KiB
    value = lambda i: (b"%d:" % i) * (size // 6) + b"#"  # noqa: E731
    with udp_node(tmp_path, durability="disk", data_file=True, max_memory="512kb",
                  flush_interval_ms=100) as node, UdpConn(node.udp_port, timeout=20) as u:
        window = 64
        for i in range(0, n, window):
            reqs = [resp_cmd("SET", f"m:{j}", value(j)) for j in range(i, min(n, i + window))]
            assert list(u.exchange(reqs)) == [b"+OK\r\n"] * len(reqs)
        for i in range(0, n, 997):  # single keys, most of them evicted by now
            assert u.call("GET", f"m:{i}") == b"$%d\r\n%s\r\n" % (len(value(i)), value(i))
        keys = [f"m:{i}" for i in range(3)]  # an MGET whose reply fits a datagram
        assert u.call("MGET", *keys) == b"*3\r\n" + b"".join(
            b"$%d\r\n%s\r\n" % (len(value(i)), value(i)) for i in range(3))
        assert u.call("DBSIZE") == b":%d\r\n" % n
        with node.client(socket_timeout=20) as c:
            for i in range(0, n, 500):
                chunk = [f"m:{j}" for j in range(i, min(n, i + 500))]
                assert c.mget(chunk) == [value(j) for j in range(i, min(n, i + 500))]
        st = node.stats()
    assert st["udp_stalled"] > 0 and st["udp_held_for_log"] > 0, st
    assert int(st["used_memory"]) <= 512 * 1024, st


def test_udp_port_in_use_is_refused(tmp_path):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    try:
        r = subprocess.run([*CLI, "serve", "--arch", "udp", "--udp-port", str(port), "--port", "0",
                            "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=30)
    finally:
        s.close()
    assert r.returncode != 0
    assert f"cannot bind UDP 127.0.0.1:{port}: Address already in use" in r.stderr, r.stderr


def test_help_explains_the_udp_front_end():
    r = subprocess.run([*CLI, "serve", "--help"], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0
    for text in ("--udp-port", "--udp-workers", "udp = a UDP front end on kernel sockets"):
        assert text in " ".join(r.stdout.split()), text


def test_mutated_datagrams_never_hurt_the_server(tmp_path):
    """20,000 datagrams cut and bit-flipped from valid requests, plus random bytes: each gets at
    most one well-formed reply frame (or none: too short, flagged), and the server keeps serving."""
    import random
    import struct
    rng = random.Random(2026)
    seeds = [resp_cmd("SET", "k", "v"), resp_cmd("GET", "k"), resp_cmd("MGET", "a", "b", "c"), resp_cmd("PING"),
             resp_cmd("INCRBY", "n", "5"), resp_cmd("SET", "k", "x" * 300, "EX", "100"), b"PING\r\n"]
    def check(r):
        assert len(r) >= 8 and r[6:8] in (b"\x00\x01", b"\x00\x03"), r[:40]

    with udp_node(tmp_path) as node, UdpConn(node.udp_port, timeout=30) as u:
        replies = 0
        for i in range(20_000):
            d = bytearray(struct.pack(">IHH", i, 0, 0) + rng.choice(seeds))
            kind = rng.random()
            if kind < 0.3:
                d = d[:rng.randrange(len(d) + 1)]
            elif kind < 0.8:
                for _ in range(rng.randint(1, 4)):
                    d[rng.randrange(len(d))] ^= 1 << rng.randrange(8)
            else:
                d = bytearray(rng.randbytes(rng.randrange(1, 1500)))
            u.sock.send(bytes(d))
            if i % 64 == 63 or i == 19_999:
                # A PING behind them: its reply comes once the worker (one, FIFO) has taken
                # all of them, so a slow server (a loaded machine) never lets the socket's
                # buffer overflow and drop datagrams, which would make the counts below luck.
                # (Its id's top bits are set: four flips in one header to mistake a reply for it.)
                fence = 0xF0000000 | i
                u.sock.send(struct.pack(">IHH", fence, 0, 0) + resp_cmd("PING"))
                while True:
                    r = u.sock.recv(65536)
                    check(r)
                    if r[:4] == struct.pack(">I", fence):
                        assert r[8:] == b"+PONG\r\n", r[:40]
                        break
                    replies += 1
        assert u.call("PING") == b"+PONG\r\n"
        st = node.stats()
    assert replies > 5000 and int(st["udp_bad_frames"]) > 1000, (replies, st)
    assert node.proc is None or node.proc.poll() is None
