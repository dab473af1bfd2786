"""CLIENT LIST / INFO / KILL and MONITOR (ext/cmd/client.c, ext/cmd/monitor.c).

CLIENT LIST's lines are compared with a real redis-server's for the same sequence
(field names and order identical; values that mean the same must be equal), kills
are made against real connections on every TCP architecture and the victims must
see their connection closed, and MONITOR is watched through `redis-cli monitor`
while clients on different pollers run commands.
"""
import re
import socket
import subprocess
import threading
import time

import pytest

from helpers.conn import Raw, UdpConn, client
from helpers.resp import resp_cmd
from helpers.servers import need

pytestmark = pytest.mark.timeout(120)

# Every TCP request-handling architecture: kills and listings must work on each.
ARCHS = {"poller": {}, "poller-handoff": {"accept": "handoff"}, "threadpool": {"arch": "threadpool", "threads": 4}}

MONITOR_LINE = re.compile(r'^\+?(\d+)\.(\d{6}) \[0 (\S+)\] (.*)$')


def fields(line):
    """[(name, value), ...] of one CLIENT LIST line, in order."""
    return [tuple(f.split("=", 1)) for f in line.strip().split(" ")]


def info(conn):
    """This connection's CLIENT INFO as a dict (conn: Raw)."""
    return dict(fields(conn.call("CLIENT", "INFO").decode()))


def listing(port, *args):
    """{id: {field: value}} of CLIENT LIST (with args) from a fresh connection."""
    with Raw(port) as r:
        text = r.call("CLIENT", "LIST", *args).decode()
    return {int(d["id"]): d for d in (dict(fields(ln)) for ln in text.splitlines() if ln)}


def wait_for(pred, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def closed_by_server(raw, timeout=10.0):
    """True once the server closed raw's connection (EOF or reset)."""
    _, closed = raw.read_until_close(timeout)
    return closed


# ---------------------------------------------------------------- CLIENT LIST / INFO

def sequence(port):
    """The same conversation on either server; returns (a's INFO, b's line about a,
    a's INFO line inside MULTI as b sees it, field names of LIST)."""
    with Raw(port) as a, Raw(port) as b:
        assert a.call("CLIENT", "SETNAME", "alpha") == b"OK"
        a_info = info(a)
        a.call("SET", "k", "v")
        assert a.call("MULTI") == b"OK"
        assert a.call("SET", "k", "v2") == b"QUEUED"
        assert a.call("INCR", "n") == b"QUEUED"
        seen = listing(port, "ID", a_info["id"])[int(a_info["id"])]
        a.call("DISCARD")
        after = listing(port, "ID", a_info["id"])[int(a_info["id"])]
        names = [k for k, _ in fields(b.call("CLIENT", "LIST").decode().splitlines()[0])]
        return a_info, seen, after, names, a.sock.getsockname()


SAME = ["name", "flags", "db", "sub", "psub", "ssub", "multi", "obl", "oll", "omem", "events", "cmd", "user",
        "redir", "resp"]


def test_client_list_and_info_fields_as_redis(redis_server, kv):
    r_info, r_seen, r_after, r_names, _ = sequence(redis_server.port)
    k_info, k_seen, k_after, k_names, k_sock = sequence(kv.port)
    assert k_names == r_names  # names and order of Redis 7.0's fields
    assert list(k_info) == list(r_info)
    for f in SAME:
        assert k_info[f] == r_info[f], f
        assert k_seen[f] == r_seen[f], f  # inside MULTI: flags x, multi 2, cmd incr
        assert k_after[f] == r_after[f], f
    # values true for this connection
    assert k_info["addr"] == "%s:%d" % k_sock
    assert k_info["laddr"] == "127.0.0.1:%d" % kv.port
    assert int(k_info["fd"]) > 2 and int(k_info["age"]) >= 0 and int(k_info["idle"]) >= 0
    assert k_info["name"] == "alpha" and k_info["cmd"] == "client|info" and k_info["flags"] == "N"
    assert int(k_info["argv-mem"]) == len("client") + len("info")
    assert k_seen["flags"] == "x" and k_seen["multi"] == "2" and k_seen["cmd"] == "incr"
    assert int(k_seen["multi-mem"]) >= len("setkv2incrn")
    assert k_after["multi"] == "-1" and k_after["cmd"] == "discard"
    assert int(k_info["tot-mem"]) >= int(k_info["qbuf"]) + int(k_info["qbuf-free"])


def test_client_list_filters_and_errors_as_redis(redis_server, kv):
    cases = [("LIST", "TYPE", "replica"), ("LIST", "TYPE", "pubsub"), ("LIST", "TYPE", "master"),
             ("LIST", "TYPE", "bogus"), ("LIST", "ID", "x"), ("LIST", "ID", "999999"), ("LIST", "FOO"),
             ("KILL", "1.2.3.4:5"), ("KILL", "ID", "999999"), ("KILL", "ID", "0"), ("KILL", "TYPE", "bogus"),
             ("KILL", "USER", "nobody"), ("KILL", "SKIPME", "maybe"), ("KILL", "ADDR", "1.2.3.4:5", "SKIPME"),
             ("KILL", "ADDR", "1.2.3.4:5", "LADDR", "9.9.9.9:1"), ("INFO", "x"), ("NOSUCH",)]
    for case in cases:
        with Raw(redis_server.port) as r, Raw(kv.port) as k:
            assert k.send(resp_cmd("CLIENT", *case)).reply() == r.send(resp_cmd("CLIENT", *case)).reply(), case


@pytest.mark.parametrize("arch", list(ARCHS))
def test_client_list_shows_every_connection(kv_node_factory, arch):
    n = kv_node_factory(**ARCHS[arch])
    conns = [client(n.port, client_name=f"c{i}") for i in range(4)]
    try:
        ids = [c.client_id() for c in conns]
        for c in conns:
            c.set("k", "v")
        ls = listing(n.port)
        assert set(ids) <= set(ls)
        for i, cid in enumerate(ids):
            assert ls[cid]["name"] == f"c{i}" and ls[cid]["cmd"] == "set"
        assert len({ls[cid]["fd"] for cid in ids}) == len(ids)
        conns[0].close()
        wait_for(lambda: ids[0] not in listing(n.port), what="a closed connection to leave CLIENT LIST")
        assert set(ids[1:]) <= set(listing(n.port))
    finally:
        for c in conns:
            c.close()


# ---------------------------------------------------------------- CLIENT KILL

@pytest.mark.parametrize("arch", list(ARCHS))
def test_client_kill_every_filter(kv_node_factory, arch):
    n = kv_node_factory(**ARCHS[arch])
    killer = client(n.port)

    def victim():
        v = Raw(n.port)
        cid = v.call("CLIENT", "ID")
        return v, cid, "%s:%d" % v.sock.getsockname()

    def check_killed(v, reply, expected):
        assert reply == expected
        assert closed_by_server(v), "the killed client's connection stays open"
        v.close()

    v, cid, addr = victim()
    reply = killer.execute_command("CLIENT", "KILL", addr)  # the old form: +OK
    check_killed(v, reply if reply is not True else b"OK", b"OK")
    v, cid, addr = victim()
    check_killed(v, killer.execute_command("CLIENT", "KILL", "ID", cid), 1)
    v, cid, addr = victim()
    check_killed(v, killer.execute_command("CLIENT", "KILL", "ADDR", addr), 1)
    v, cid, addr = victim()
    other, _, _ = victim()  # LADDR, USER, TYPE match every client: all but the killer go
    for filt in (("LADDR", "127.0.0.1:%d" % n.port), ("USER", "default"), ("TYPE", "normal")):
        assert killer.execute_command("CLIENT", "KILL", *filt) >= 2
        assert closed_by_server(v) and closed_by_server(other)
        v.close()
        other.close()
        v, cid, addr = victim()
        other, _, _ = victim()
    assert killer.ping()  # SKIPME yes (the default) spared the killer
    time.sleep(3.1)  # (3 s: young stays younger than that on a loaded machine)
    young, _, _ = victim()
    assert killer.execute_command("CLIENT", "KILL", "MAXAGE", "3") >= 2  # v and other, not young
    assert closed_by_server(v) and closed_by_server(other)
    assert young.call("PING") == b"PONG"
    # SKIPME no: the killer goes too, after its reply
    with Raw(n.port) as me:
        assert me.call("CLIENT", "KILL", "ID", me.call("CLIENT", "ID"), "SKIPME", "no") == 1
        assert closed_by_server(me)
    assert killer.execute_command("CLIENT", "KILL", "ID", cid) == 0  # already gone
    assert young.call("PING") == b"PONG"
    young.close()
    killer.close()


# ---------------------------------------------------------------- MONITOR

def monitor_proc(port):
    need("redis-cli")
    p = subprocess.Popen(["redis-cli", "-p", str(port), "monitor"], stdout=subprocess.PIPE, text=True, bufsize=1)
    assert p.stdout.readline().strip() == "OK"
    return p


def read_lines_until(proc, pred, timeout=20.0):
    """Monitor lines until pred(lines) holds (a thread reads them: readline blocks)."""
    lines, done = [], threading.Event()

    def reader():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if pred(list(lines)):
                break
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    assert done.wait(timeout), f"monitor lines so far: {lines[-10:]}"
    assert pred(lines), f"redis-cli monitor ended; lines: {lines[-10:]}"
    return lines


@pytest.mark.parametrize("arch", list(ARCHS))
def test_monitor_sees_every_connection(kv_node_factory, arch):
    # handoff: connections are dealt to the pollers round-robin, so these four are on
    # both pollers; reuseport and the pool: wherever the kernel and the workers put them
    n = kv_node_factory(**ARCHS[arch])
    mon = monitor_proc(n.port)
    try:
        conns = [Raw(n.port) for _ in range(4)]
        addrs = ["%s:%d" % c.sock.getsockname() for c in conns]
        for i, c in enumerate(conns):
            assert c.call("SET", f"key {i}", f'va"l\n{i}') == b"OK"
            c.call("CONFIG", "GET", "port")  # admin: never shown
            c.call("AUTH", "secret")  # shown redacted
        want = {(addrs[i], f'"SET" "key {i}" "va\\"l\\n{i}"') for i in range(4)}
        lines = read_lines_until(mon, lambda ls: sum('"AUTH"' in ln for ln in ls) >= 4)
        got = set()
        for ln in lines:
            m = MONITOR_LINE.match(ln)
            assert m, ln
            assert abs(int(m.group(1)) - time.time()) < 60
            got.add((m.group(3), m.group(4)))
        assert want <= got
        assert {(a, '"AUTH" "(redacted)"') for a in addrs} <= got
        assert not any('"CONFIG"' in ln for ln in lines)
        if arch == "poller-handoff":
            with Raw(n.port) as r:
                pollers = [ln for ln in r.call("INFO", "pollers").decode().splitlines() if ln.startswith("poller")]
            assert sum(int(re.search(r"clients=(\d+)", p).group(1)) > 0 for p in pollers) == 2
        for c in conns:
            c.close()
    finally:
        mon.kill()
        mon.wait()
    # the monitor is gone: its client leaves the registry and commands run as before
    wait_for(lambda: not any(d["flags"] == "O" for d in listing(n.port).values()), what="the monitor to leave")
    with Raw(n.port) as r:
        assert r.call("SET", "a", "b") == b"OK"


def test_monitor_transaction_and_refusals_as_redis(redis_server, kv):
    seq = [("MULTI",), ("SET", "t", "1"), ("MONITOR",), ("EXEC",)]
    for port in (redis_server.port, kv.port):
        with Raw(port) as m, Raw(port) as c:
            assert m.call("MONITOR") == b"OK"
            m.send(resp_cmd("MONITOR"))  # again: no reply at all, as Redis
            replies = [c.send(resp_cmd(*s)).reply() for s in seq]
            assert replies[-1] == b"*2\r\n+OK\r\n-ERR MONITOR isn't allowed for DENY BLOCKING client\r\n"
            c.call("PING")
            lines = []
            while not any('"PING"' in ln for ln in lines):
                lines.append(m.reply().decode())
            cmds = [ln.split("] ", 1)[1].strip() for ln in lines]
            assert cmds == ['"MULTI"', '"SET" "t" "1"', '"EXEC"', '"PING"'], port


def test_monitor_over_udp_is_refused(tmp_path):
    from kvstore import Node
    with Node(port=0, data_dir=tmp_path / "node", arch="udp", udp_port=0, udp_workers=1) as node:
        with UdpConn(node.udp_port) as u:
            assert u.call("MONITOR").startswith(b"-ERR MONITOR needs a connection")
        # UDP sessions are not clients: CLIENT LIST shows only the asking TCP connection
        ls = listing(node.port)
        assert len(ls) == 1 and all(d["flags"] == "N" for d in ls.values())


def test_monitor_that_cannot_keep_up_is_disconnected(kv_fresh):
    slow = Raw(kv_fresh.port)
    assert slow.call("MONITOR") == b"OK"
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    big = b"x" * (512 * 1024)
    with Raw(kv_fresh.port) as w:
        for _ in range(12):  # 12 x 8 x 512 KiB of lines: far past the 16 MiB bound and any socket buffer
            w.send(resp_cmd("SET", "big", big) * 8)
            w.replies(8, timeout=30)
            if not any(d["flags"] == "O" for d in listing(kv_fresh.port).values()):
                break
        wait_for(lambda: not any(d["flags"] == "O" for d in listing(kv_fresh.port).values()), timeout=30,
                 what="the slow monitor to be dropped")
        assert w.call("PING") == b"PONG"
    slow.close()
