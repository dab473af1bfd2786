"""Durability of a served node in `--durability disk`: real server processes killed with
SIGKILL under load, a slow disk (KVSTORE_FAULT_SYNC_DELAY_US), and real clients (raw RESP
sockets and redis-py). Nothing is mocked. The log's own tests (recovery, torn tails,
damage, group commit): test_wal.py.

What is checked:
  1. kill -9 under a write load loses no acknowledged write (poller, threadpool, udp);
  2. replies are held until durable (writes and the reads that see them), in order.
"""
import os
import random
import select
import socket
import threading
import time

import pytest

from helpers import faultlib as fl
from helpers.conn import Raw, UdpConn, client
from helpers.faultlib import appended_lsn, mget_all, persistence, recovery_of, wait_applied
from helpers.resp import Incomplete, resp_cmd, resp_parse, resp_reply_end

pytestmark = pytest.mark.timeout(120)


# ================================================================ 1. kill -9 under load

KEYS_PER_WRITER = 600


class TcpConn:
    """A pipelined RESP connection: exchange sends a batch, yields each one-line reply."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def exchange(self, requests):
        self.sock.sendall(b"".join(requests))
        for _ in requests:
            while b"\r\n" not in self.buf:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise EOFError("server closed the connection")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\r\n", 1)
            yield line + b"\r\n"

    def close(self):
        self.sock.close()


class Writer(threading.Thread):
    """One connection writing only its own keys, `depth` requests per round trip.

    state: the acknowledged state of every key it owns (bytes or None).
    pending: [(request number, key, value after it)] for requests sent whose reply
    has not been read, in request order (an MSET contributes one entry per key).
    After a crash, for some j the recovered state must equal state + pending[:j]:
    requests on one connection get ascending LSNs, and recovery replays a prefix
    of the log."""

    def __init__(self, wid, port, state, depth, seed, seq0, max_ops, deadline, udp=False):
        super().__init__(daemon=True, name=f"writer-{wid}")
        self.wid, self.port, self.depth, self.udp = wid, port, depth, udp
        self.state = state
        self.rng = random.Random(seed)
        self.seq = seq0
        self.max_ops, self.deadline = max_ops, deadline
        self.pending = []
        self.acked = 0
        self.wrong = []          # replies that do not match the model: server bugs
        self.ended_by = None
        self.keys = list(state)
        self.skeys = [k for k in self.keys if b":s:" in k]

    def _value(self, key):
        self.seq += 1
        return b"%s@%d#" % (key, self.seq) + b"x" * (self.seq % 61)

    def _make(self, proj):
        """One request: (bytes, [(key, new value)], expected reply)."""
        key = self.rng.choice(self.keys)
        cur = proj.get(key, self.state[key])
        r = self.rng.random()
        if b":s:" in key:
            if r < 0.1:
                return resp_cmd("DEL", key), [(key, None)], b":%d\r\n" % (cur is not None)
            if r < 0.2:
                ks = self.rng.sample(self.skeys, 3)
                pairs = [(k, self._value(k)) for k in ks]
                args = [x for kv in pairs for x in kv]
                return resp_cmd("MSET", *args), pairs, b"+OK\r\n"
            v = self._value(key)
            return resp_cmd("SET", key, v), [(key, v)], b"+OK\r\n"
        if b":c:" in key:
            if r < 0.05:
                return resp_cmd("DEL", key), [(key, None)], b":%d\r\n" % (cur is not None)
            by = 1 if r < 0.8 else self.rng.randint(-50, 1000)
            new = (int(cur) if cur is not None else 0) + by
            cmd = resp_cmd("INCR", key) if by == 1 else resp_cmd("INCRBY", key, by)
            return cmd, [(key, b"%d" % new)], b":%d\r\n" % new
        # append key
        if r < 0.08:
            return resp_cmd("DEL", key), [(key, None)], b":%d\r\n" % (cur is not None)
        self.seq += 1
        piece = b"|%d" % self.seq
        new = (cur or b"") + piece
        return resp_cmd("APPEND", key, piece), [(key, new)], b":%d\r\n" % len(new)

    def run(self):
        try:
            conn = UdpConn(self.port, timeout=3.0) if self.udp else TcpConn(self.port)
        except OSError as e:
            self.ended_by = f"connect: {e}"
            return
        reqno = 0
        ops = 0
        try:
            while ops < self.max_ops and time.monotonic() < self.deadline:
                proj, batch = {}, []
                for _ in range(self.depth):
                    data, changes, expect = self._make(proj)
                    reqno += 1
                    for k, v in changes:
                        proj[k] = v
                        self.pending.append((reqno, k, v))
                    batch.append((reqno, data, changes, expect))
                ops += len(batch)
                for (no, _, changes, expect), reply in zip(batch, conn.exchange([b[1] for b in batch])):
                    if reply != expect:
                        self.wrong.append((no, changes, expect, reply))
                    # acknowledged: its effect is now part of the acked state
                    for k, v in changes:
                        self.state[k] = v
                    self.pending = [p for p in self.pending if p[0] != no]
                    self.acked += 1
            self.ended_by = "limit"
        except (OSError, EOFError) as e:
            self.ended_by = f"{type(e).__name__}: {e}"
        finally:
            conn.close()

    def check(self, observed):
        """Problems (empty if fine) comparing the recovered state with the model; on
        success self.state becomes the recovered state."""
        pend_keys = {k for _, k, _ in self.pending}
        problems = []
        for k in self.keys:
            if k not in pend_keys and observed[k] != self.state[k]:
                problems.append(f"{k!r}: acknowledged {self.state[k]!r:.80}, recovered {observed[k]!r:.80}")
        if problems:
            return problems
        cand = {k: self.state[k] for k in pend_keys}
        if all(observed[k] == cand[k] for k in pend_keys):
            ok_j = 0
        else:
            ok_j = None
            for j, (_, k, v) in enumerate(self.pending, 1):
                cand[k] = v
                if all(observed[k2] == cand[k2] for k2 in pend_keys):
                    ok_j = j
                    break
        if ok_j is None:
            return [f"no prefix of the {len(self.pending)} unacknowledged changes explains the recovered "
                    f"state: acked {[(k, self.state[k]) for k in sorted(pend_keys)]!r:.600}, pending "
                    f"{self.pending!r:.600}, recovered {[(k, observed[k]) for k in sorted(pend_keys)]!r:.600}"]
        for k in pend_keys:
            self.state[k] = observed[k]
        self.pending = []
        return []


@pytest.mark.slow
@pytest.mark.timeout(300)  # ~60 s on an idle machine: up to 8 runs of up to 8 s of writes, restarts, checks
@pytest.mark.parametrize("arch", ["poller", "threadpool", "udp"])
def test_kill9_under_write_load_loses_no_acknowledged_write(data_dir, nodes, monkeypatch, arch):
    """4 connections (pipelines of 1, 1, 8 and 32; with arch udp, UDP sockets with as many
    datagrams in flight) write SET/MSET/DEL/INCR/INCRBY/APPEND
    on 2,400 keys (each key has one writer); SIGKILL at a seeded random point; restart
    on the same directory; every acknowledged write must be there with its last
    acknowledged value (or, for keys with requests in flight, a prefix of those).
    8 kills in a row on one directory (5 with threadpool and udp). The node runs as
    deployed: with its BOSC data file, and with memory bounded far below the data
    (512 KiB for ~1.5 MB), so keys are flushed, evicted, loaded back on reads and
    INCR/APPEND, and writes wait for the flusher; each recovery reads the data file and
    replays the log after it."""
    depths = [1, 1, 8, 32]
    states = [{b"w%d:%s:%d" % (w, b"sca"[i % 3:i % 3 + 1], i): None for i in range(KEYS_PER_WRITER)}
              for w in range(len(depths))]
    all_keys = [k for st in states for k in st]
    seed = int(os.environ.get("KVSTORE_TEST_SEED", "20240611"))  # set it to explore other kill points
    rng = random.Random(seed)
    last_lsn = 0
    runs = []
    # 8 kills on the pollers; 5 on the other front ends, which share everything below the
    # request runner and still meet each kind of kill point (it % 3) on both disk speeds
    iterations = 8 if arch == "poller" else 5
    t_start = time.monotonic()

    def set_disk_speed(it):
        # every other run a slower disk: bigger groups, more in flight at the kill
        if it % 2:
            monkeypatch.setenv("KVSTORE_FAULT_SYNC_DELAY_US", str(rng.choice([500, 2000, 5000])))
        else:
            monkeypatch.delenv("KVSTORE_FAULT_SYNC_DELAY_US", raising=False)

    spill = dict(data_file=True, max_memory="512kb", flush_interval_ms=100, arch=arch)
    if arch == "udp":
        spill["udp_port"] = 0
    set_disk_speed(0)
    node = nodes(data_dir, **spill)
    for it in range(iterations):
        deadline = time.monotonic() + 8.0
        udp = arch == "udp"
        writers = [Writer(w, node.udp_port if udp else node.port, states[w], d, rng.random(),
                          (it + 1) * 10_000_000, 40_000, deadline, udp=udp)
                   for w, d in enumerate(depths)]
        for w in writers:
            w.start()
        # the kill point: after a random number of acknowledged writes, or a random time
        target = rng.randint(2000, 15000) if it % 3 != 2 else 10 ** 9
        kill_after = 6.0 if it % 3 != 2 else rng.uniform(0.3, 1.5)
        t0 = time.monotonic()
        # ... but not before 200 writes were acknowledged (a loaded machine may take longer
        # than kill_after for them; the writers stop at their own deadline)
        while (sum(w.acked for w in writers) < target and time.monotonic() - t0 < kill_after
               or sum(w.acked for w in writers) < 200) and any(w.is_alive() for w in writers):
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.01))
        node.kill()
        for w in writers:
            w.join(15)
            assert not w.is_alive(), f"{w.name} still running after the kill"
        acked = sum(w.acked for w in writers)
        wrong = [x for w in writers for x in w.wrong]
        assert not wrong, f"run {it}: replies that do not match the model: {wrong[:5]}"
        assert acked >= 200, f"run {it}: only {acked} writes acknowledged before the kill"

        # Restart on the same directory (the next run's load goes to this server).
        nsegs = len(fl.segments(data_dir))
        set_disk_speed(it + 1)
        node = nodes(data_dir, **spill)
        rec = recovery_of(node)
        flushed = fl.parse_datafile(node.log())
        assert flushed is not None, node.log()
        # the data file holds up to `flushed`, the log replays from just after it
        assert rec.first in (None, flushed + 1) and rec.last >= last_lsn and rec.segments == nsegs, (rec, flushed)
        assert "log corrupt" not in node.log()
        info = persistence(node.port)
        assert info["log_durable_lsn"] == rec.last, (info, rec)
        last_lsn = rec.last
        in_flight = sum(len(w.pending) for w in writers)
        observed = mget_all(node.port, all_keys)
        problems = [p for w in writers for p in w.check(observed)]
        assert not problems, (f"run {it} (kill after {acked} acknowledged writes, {rec.line}):\n"
                              + "\n".join(problems[:20]))
        runs.append((acked, in_flight, rec.line))
    node.stop()
    # The final directory also reads back cleanly offline.
    rc, out, err = fl.run_recover(data_dir, "--check-only")
    assert rc == 0, err
    rec = fl.parse_recovery(out)
    assert rec.last == last_lsn
    print("runs (acknowledged writes, unacknowledged changes at the kill, recovery):", *runs, sep="\n  ")
    print(f"took {time.monotonic() - t_start:.1f} s")


# ================================================================ 2. held replies

def collect(conns, timeout=15.0):
    """conns: {name: (Raw, replies wanted)} -> {name: [(arrival time, reply bytes)]}.
    Reads all sockets from one thread, timestamping each reply as it completes."""
    out = {k: [] for k in conns}
    deadline = time.monotonic() + timeout
    while True:
        for k, (r, want) in conns.items():
            while len(out[k]) < want:
                try:
                    end = resp_reply_end(r.buf)
                except Incomplete:
                    break
                out[k].append((time.monotonic(), r.buf[:end]))
                r.buf = r.buf[end:]
        waiting = {r.sock: r for k, (r, want) in conns.items() if len(out[k]) < want}
        if not waiting:
            return out
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"replies so far: {out}")
        ready, _, _ = select.select(list(waiting), [], [], left)
        for s in ready:
            chunk = s.recv(65536)
            if not chunk:
                raise EOFError(f"server closed; replies so far: {out}")
            waiting[s].buf += chunk


def until(raw, t):
    """What raw receives until monotonic time t (nothing is read when t has passed already: a
    window measured from the request, not from this call, which a loaded machine may delay
    past the reply the window must not see)."""
    left = t - time.monotonic()
    return raw.read_for(left)[0] if left > 0.001 else b""


def _slow_node(data_dir, nodes, monkeypatch, delay_us):
    monkeypatch.setenv("KVSTORE_FAULT_SYNC_DELAY_US", str(delay_us))
    n = nodes(data_dir)
    monkeypatch.delenv("KVSTORE_FAULT_SYNC_DELAY_US")
    return n


DELAY = 0.3


@pytest.mark.timeout(60)
def test_write_reply_waits_for_the_sync(data_dir, nodes, monkeypatch):
    n = _slow_node(data_dir, nodes, monkeypatch, int(DELAY * 1e6))
    with Raw(n.port, timeout=10) as a:
        t0 = time.monotonic()
        assert a.call("PING") == b"PONG"          # no write: not held
        for cmd in (("SET", "k", "v"), ("INCR", "n"), ("APPEND", "k", "w"), ("DEL", "k"),
                    ("MSET", "a", "1", "b", "2"), ("FLUSHALL",)):
            t0 = time.monotonic()
            a.send(resp_cmd(*cmd))
            assert until(a, t0 + DELAY * 0.6) == b"", f"{cmd}: reply before the sync"
            reply = a.reply(timeout=10)
            dt = time.monotonic() - t0
            assert not reply.startswith(b"-"), (cmd, reply)
            assert dt >= DELAY - 0.005, f"{cmd} acknowledged after {dt:.3f} s, the sync takes {DELAY} s"
    info = persistence(n.port)
    assert info["log_durable_lsn"] == info["log_appended_lsn"]


@pytest.mark.parametrize("read", [("GET", "k"), ("MGET", "k", "other"), ("EXISTS", "k"), ("STRLEN", "k")],
                         ids=lambda r: r[0])
@pytest.mark.timeout(60)
def test_read_of_a_pending_write_waits_for_its_sync(data_dir, nodes, monkeypatch, read):
    delay = 1.0  # the read must go out while the SET waits: a wide window for a loaded machine
    n = _slow_node(data_dir, nodes, monkeypatch, int(delay * 1e6))
    with client(n.port) as c:
        c.set("k", "old")
        c.set("other", "o")
    with Raw(n.port, timeout=10) as a, Raw(n.port, timeout=10) as b, Raw(n.port, timeout=10) as watch:
        lsn = appended_lsn(watch)
        t_set = time.monotonic()
        a.send(resp_cmd("SET", "k", "new-value"))
        wait_applied(watch, lsn)
        b.send(resp_cmd(*read))
        assert until(b, t_set + delay * 0.5) == b"", "the read was answered before the write it sees was durable"
        got = collect({"a": (a, 1), "b": (b, 1)})
    (ta, ra), = got["a"]
    (tb, rb), = got["b"]
    assert ra == b"+OK\r\n"
    expect = {"GET": b"$9\r\nnew-value\r\n", "MGET": b"*2\r\n$9\r\nnew-value\r\n$1\r\no\r\n",
              "EXISTS": b":1\r\n", "STRLEN": b":9\r\n"}[read[0]]
    assert rb == expect
    assert ta - t_set >= delay - 0.005
    assert tb - t_set >= delay - 0.005, f"read answered {tb - t_set:.3f} s after the SET (sync: {delay} s)"
    # both leave at the same sync; the two connections' pollers may wake apart on a loaded machine
    assert tb >= ta - 0.2, f"read answered {ta - tb:.3f} s before the SET's acknowledgement"


CRASH_WRITES = {  # write -> (key read by the other client, its value before, its value after)
    "SET": (("SET", "k", "new"), "k", b"old", b"new"),
    "INCR": (("INCR", "n"), "n", b"41", b"42"),
    "APPEND": (("APPEND", "k", "+x"), "k", b"old", b"old+x"),
    "MSET": (("MSET", "k2", "z", "k", "m"), "k", b"old", b"m"),
    "DEL": (("DEL", "k"), "k", b"old", None),
    "FLUSHALL": (("FLUSHALL",), "k", b"old", None),
}


@pytest.mark.parametrize("write", list(CRASH_WRITES))
@pytest.mark.timeout(60)
def test_no_read_reveals_a_write_that_a_crash_undoes(data_dir, nodes, monkeypatch, write):
    """With a 1 s sync: connection X's SET occupies the log thread; connection A's write
    (DEL, FLUSHALL, SET, ...) then waits in the next group; connection B reads the key;
    SIGKILL about 0.5 s in, before A's record is written. Whatever B was told before
    the kill must still be true after the restart: a reply that reveals A's write
    (e.g. nil after A's DEL) may only leave once that write is durable."""
    cmd, key, before, after = CRASH_WRITES[write]
    n = _slow_node(data_dir, nodes, monkeypatch, 1_000_000)
    with client(n.port) as c:
        c.mset({"k": "old", "n": "41"})
    with Raw(n.port, timeout=10) as x, Raw(n.port, timeout=10) as a, Raw(n.port, timeout=10) as b:
        t0 = time.monotonic()
        x.send(resp_cmd("SET", "filler", "f"))
        time.sleep(0.1)
        a.send(resp_cmd(*cmd))
        time.sleep(0.05)
        b.send(resp_cmd("GET", key))
        seen, _ = b.read_for(0.3)
        a_reply, _ = a.read_for(0.01)
        elapsed = time.monotonic() - t0
        n.kill()
    assert a_reply == b"", f"{write} acknowledged before its sync: {a_reply!r}"
    n = nodes(data_dir)
    with client(n.port) as c:
        now = c.get(key)
    assert now in (before, after), now
    if seen:
        told = resp_parse(seen)[0]
        assert told == now, (
            f"before the crash ({elapsed:.2f} s after X's SET) a reader was told {key}={told!r}, "
            f"revealing the unacknowledged {' '.join(cmd)}; after the restart {key}={now!r}")


@pytest.mark.timeout(60)
def test_replies_on_one_connection_leave_in_order(data_dir, nodes, monkeypatch):
    n = _slow_node(data_dir, nodes, monkeypatch, int(DELAY * 1e6))
    with client(n.port) as c:
        c.set("old", "durable")
    with Raw(n.port, timeout=10) as a:
        t0 = time.monotonic()
        a.send(resp_cmd("SET", "k", "v"))
        a.send(resp_cmd("PING"))                  # right after, separately
        a.send(resp_cmd("GET", "old") + resp_cmd("ECHO", "e"))
        assert until(a, t0 + DELAY * 0.6) == b"", "a reply overtook the pending SET's +OK"
        got = collect({"a": (a, 4)})["a"]
    assert [r for _, r in got] == [b"+OK\r\n", b"+PONG\r\n", b"$7\r\ndurable\r\n", b"$1\r\ne\r\n"]
    assert got[0][0] - t0 >= DELAY - 0.005
    assert all(t >= got[0][0] for t, _ in got)


@pytest.mark.timeout(60)
def test_reads_of_durable_keys_are_not_delayed(data_dir, nodes, monkeypatch):
    """With a 2 s sync, a GET of a key written long ago, from a third connection,
    while another connection's SET waits for its sync, is answered at once."""
    delay = 2.0
    n = _slow_node(data_dir, nodes, monkeypatch, int(delay * 1e6))
    with client(n.port) as c:
        c.mset({"old1": "a", "old2": "b"})
    with Raw(n.port, timeout=10) as a, Raw(n.port, timeout=10) as b, Raw(n.port, timeout=10) as c3:
        lsn = appended_lsn(c3)
        t_set = time.monotonic()
        a.send(resp_cmd("SET", "k", "v"))
        wait_applied(c3, lsn)  # the SET is applied (on whichever poller) before b's GET arrives
        b.send(resp_cmd("GET", "k"))
        time.sleep(0.05)
        t_read = time.monotonic()
        c3.send(resp_cmd("GET", "old1") + resp_cmd("GET", "missing") + resp_cmd("PING")
                + resp_cmd("MGET", "old1", "old2"))
        got = collect({"c": (c3, 4)})["c"]
        rest = collect({"a": (a, 1), "b": (b, 1)})
    assert [r for _, r in got] == [b"$1\r\na\r\n", b"$-1\r\n", b"+PONG\r\n", b"*2\r\n$1\r\na\r\n$1\r\nb\r\n"]
    assert got[-1][0] - t_read < 1.0, f"reads of durable keys took {got[-1][0] - t_read:.3f} s"
    ta = rest["a"][0][0]
    assert got[-1][0] < ta, "the reads were not answered while the SET was pending"
    assert ta - t_set >= delay - 0.005
    assert rest["b"][0][1] == b"$1\r\nv\r\n" and rest["b"][0][0] - t_set >= delay - 0.005


# ================================================================ review regressions

@pytest.mark.timeout(60)
@pytest.mark.parametrize("cmd", [("INCR", "k"), ("APPEND", "k", "x"), ("DBSIZE",), ("EXISTS", "k")])
def test_replies_that_reveal_a_pending_write_wait_for_it(data_dir, nodes, monkeypatch, cmd):
    """An error from INCR on a value not yet durable, APPEND's new length, DBSIZE, EXISTS:
    each reveals the pending SET, so none may arrive before the SET's own +OK."""
    n = _slow_node(data_dir, nodes, monkeypatch, 700_000)
    with Raw(n.port, timeout=10) as a, Raw(n.port, timeout=10) as b, Raw(n.port, timeout=10) as watch:
        lsn = appended_lsn(watch)
        t_set = time.monotonic()
        a.send(resp_cmd("SET", "k", "not-a-number"))
        wait_applied(watch, lsn)
        b.send(resp_cmd(*cmd))
        got = collect({"a": (a, 1), "b": (b, 1)})
    (ta, ra), (tb, rb) = got["a"][0], got["b"][0]
    assert ra == b"+OK\r\n"
    # the sync takes 0.7 s from after the SET was applied: held, b's reply cannot come sooner
    assert tb - t_set >= 0.7 - 0.005, f"{cmd[0]} answered {tb - t_set:.3f} s after the SET it reveals: {rb!r}"
    # both leave at the same sync; the two connections' pollers may wake apart on a loaded machine
    assert tb >= ta - 0.2, f"{cmd[0]} answered {ta - tb:.3f} s before the write it reveals was durable: {rb!r}"
