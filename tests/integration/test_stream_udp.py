"""Streams over the UDP front end (--arch udp, issue 16): a datagram carrying k messages
for one stream appended as one batch, and pulls of sealed batches answered by the engine
(the pull cache's second level; its first level, XDP, is test_pull_cache.py). Checked
against what RESP clients see of the same stream (redis-py's XRANGE) and with
`kvstore bench --udp --xadd --batch` / `--pull --check`."""
import json
import socket
import subprocess
import sys

import pytest

from helpers.conn import UdpConn
from helpers.resp import resp_cmd
from helpers.streamwire import (F_PULL, F_REPLY, F_XADD, NO_BATCH, NO_STREAM, OPEN, SEALED, decode_pull,
                                pull_frame, xadd_frame)
from kvstore import Node

pytestmark = pytest.mark.timeout(120)
CLI = [sys.executable, "-m", "kvstore.cli"]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = Node(port=0, data_dir=tmp_path_factory.mktemp("sudp"), arch="udp", udp_port=0, durability="none").start()
    yield n
    n.stop()


def batch(u, key, messages, field=b"v"):
    """(flags, RESP reply) of one KVU_F_XADD datagram."""
    return u.reply(u.send(xadd_frame(key, field, messages), F_XADD))


def pull(u, key, no):
    flags, body = u.reply(u.send(pull_frame(key, no), F_PULL))
    assert flags == F_REPLY | F_PULL, (flags, body[:80])
    return body


def ids_of(reply):
    """[first ID, k] of a batch append's RESP reply."""
    head, first, count = reply.split(b"\r\n")[:3], None, None
    assert reply.startswith(b"*2\r\n$"), reply
    parts = reply.split(b"\r\n")
    first, count = parts[2].decode(), int(parts[3][1:])
    return first, count


def test_a_datagram_of_messages_is_one_batch_of_entries(node):
    msgs = [b"m%02d-" % i + bytes([65 + i % 26]) * 80 for i in range(16)]
    with UdpConn(node.udp_port) as u, node.client() as c:
        c.flushall()
        flags, reply = batch(u, b"sensors", msgs)
        assert flags == F_REPLY | F_XADD
        first, k = ids_of(reply)
        assert k == 16
        ms, seq = (int(x) for x in first.split("-"))
        got = c.xrange("sensors")
        assert [i.decode() for i, _ in got] == [f"{ms}-{seq + j}" for j in range(16)]  # consecutive IDs
        assert [f for _, f in got] == [{b"v": m} for m in msgs]
        flags, reply = batch(u, b"sensors", [b"x"] * 3, field=b"payload")
        second, k = ids_of(reply)
        assert k == 3 and tuple(map(int, second.split("-"))) > (ms, seq + 15)
        assert c.xlen("sensors") == 19 and c.xrange("sensors", second)[0][1] == {b"payload": b"x"}
        # a stream made by UDP is every RESP client's: a group reads it
        c.xgroup_create("sensors", "g", id="0")
        assert len(c.xreadgroup("g", "c1", {"sensors": ">"})[0][1]) == 19


def test_batch_append_errors_are_command_errors(node):
    with UdpConn(node.udp_port) as u, node.client() as c:
        c.set("plain", "x")
        flags, reply = batch(u, b"plain", [b"a"])
        assert flags == F_REPLY | F_XADD  # the command's error, not a framing one
        assert reply == b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
        assert c.get("plain") == b"x"


def bad_frames(node):
    with node.client() as c:
        return c.info("stats")["udp_bad_frames"]


@pytest.mark.parametrize("flags,body", [
    (F_XADD, xadd_frame(b"s", b"v", [b"a", b"b"])[:-1]),                   # the last message cut short
    (F_XADD, xadd_frame(b"s", b"v", [b"a"]) + b"\0"),                       # a byte past the last message
    (F_XADD, xadd_frame(b"s", b"v", [])),                                   # no message
    (F_XADD, b"\0\x01s\0\x01v\x04\x01" + b"\0\x01a" * 1025),                # more than 1,024
    (F_XADD, b"\0\0" + xadd_frame(b"s", b"v", [b"a"])[2:]),                 # an empty key
    (F_XADD, b"\0\x01s\0\0\0\x01\0\x01a"),                                  # an empty field name
    (F_XADD, b"\xff\xff" + b"s"),                                           # a key longer than the datagram
    (F_PULL, pull_frame(b"s", 0)[:-1]),                                     # a batch number of 7 bytes
    (F_PULL | F_XADD, pull_frame(b"s", 0)),                                 # two operations
    (0x10, resp_cmd("PING")),                                               # a flag this version lacks
    (F_REPLY | F_PULL, pull_frame(b"s", 0)),                                # a reply (no reflection)
])
def test_malformed_frames_are_dropped_and_counted(node, flags, body):
    before = bad_frames(node)
    with UdpConn(node.udp_port, timeout=0.5) as u, node.client() as c:
        u.send(body, flags)
        u.sock.settimeout(0.5)
        with pytest.raises(socket.timeout):
            u.sock.recv(65536)
        assert bad_frames(node) == before + 1
        assert u.call("PING") == b"+PONG\r\n"  # the worker carries on
        assert c.exists("s") == 0  # nothing appended


def test_pulls_answer_every_batch_as_xrange_sees_it(node):
    with UdpConn(node.udp_port) as u, node.client() as c:
        c.flushall()
        for i in range(15):
            batch(u, b"feed", [b"%03d" % (i * 20 + j) + b"." * 82 for j in range(20)])
        everything = [(i.decode(), [x for kv in f.items() for x in kv]) for i, f in c.xrange("feed")]
        answers, no = [], 0
        while True:
            body = pull(u, b"feed", no)
            a = decode_pull(body)
            if a["status"] == NO_BATCH:
                break
            assert len(body) <= 24 + 1400  # a batch's entries fit one datagram
            assert a["status"] in (SEALED, OPEN) and a["no"] == no and a["version"] == 0
            answers.append(a)
            no += 1
        assert a["oldest"] == 0 and a["next"] == no == len(answers) > 10  # ~14 entries of 85 B per batch
        assert [x["status"] for x in answers[:-1]] == [SEALED] * (no - 1)  # only the newest may be open
        flat = [(i, f) for x in answers for i, d, f in x["entries"] if not d]
        assert flat == everything
        # a deleted entry: marked in its batch, whose version moves
        victim = answers[1]["entries"][3][0]
        assert c.xdel("feed", victim) == 1
        again = decode_pull(pull(u, b"feed", 1))
        assert again["version"] == 1 and again["entries"][3] == (victim, True, answers[1]["entries"][3][2])
        # trimmed batches are gone, and the answer says where the stream starts now
        c.xtrim("feed", maxlen=100, approximate=False)
        gone = decode_pull(pull(u, b"feed", 0))
        assert gone["status"] == NO_BATCH and gone["oldest"] > 0 and gone["next"] == no
        padded = u.reply(u.send(pull_frame(b"feed", 1, pad=1464), F_PULL))[1]
        assert padded == pull(u, b"feed", 1)  # padding (room for the pull cache's answer) is ignored
        assert decode_pull(pull(u, b"nothing", 0)) == {"status": NO_STREAM, "no": 0}
        c.set("plain", "x")
        assert pull(u, b"plain", 0).startswith(b"-WRONGTYPE")


def test_bench_appends_batches_and_pulls_them_back(node):
    with node.client() as c:
        c.flushall()
    base = [*CLI, "bench", "--udp", "-p", str(node.udp_port), "-r", "4", "-t", "1", "-c", "2", "--check", "--json"]
    r = json.loads(subprocess.run([*base, "--xadd", "--batch", "16", "-n", "400"], capture_output=True,
                                  text=True, timeout=60, check=True).stdout)
    assert r["errors"] == 0 and r["requests"] == 400 and r["sets"] == 400 * 16, r
    with node.client() as c:
        assert sum(c.xlen(f"key:{i:012d}") for i in range(4)) == 400 * 16
    with UdpConn(node.udp_port) as u:  # a pull past the end says how many batches a stream has
        batches = min(decode_pull(pull(u, b"key:%012d" % i, 10 ** 6))["next"] for i in range(4))
    r = json.loads(subprocess.run([*base, "--pull", str(batches), "-n", "2000"], capture_output=True,
                                  text=True, timeout=60, check=True).stdout)
    assert r["errors"] == 0 and r["gets"] == 2000 and r["hits"] == 2000, r  # every number asked is there
