"""Fault injection for `--durability remote`: a symmetric pair of nodes, each the other's log peer.

    A: serve --repl-port RA --durability remote --peer 127.0.0.1:RB --data-dir A
    B: serve --repl-port RB --durability remote --peer 127.0.0.1:RA --data-dir B

A write is acknowledged once it is in this node's memory and the peer acked it
(ext/REPLICATION.md). The faults are real: SIGKILL, SIGSTOP/SIGCONT, a data
directory deleted, a log directory deleted; the clients are real redis-py clients
(RESP2, no retries) and raw sockets; nothing is mocked.

Model of a writer (the loss-of-a-machine tests): several threads, each the only
writer of its own keys, one request in flight at a time. Every acknowledged write
is recorded; the single request in flight when the node died may or may not have
been applied. After recovery each key must hold its last acknowledged value, or
(for the one key per writer with a request in flight) the value that request
would have produced.

Every load is bounded in operations and in time; every wait has a deadline.
KVSTORE_FAULT_SEED=N changes the random kill points (default: fixed).
"""
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from helpers import faultlib
from helpers.conn import Raw, UdpConn, client
from helpers.resp import info_dict
from helpers.servers import free_port
from kvstore import Node

pytestmark = pytest.mark.timeout(120)

SEED = int(os.environ.get("KVSTORE_FAULT_SEED", "7301"))
PEER_TIMEOUT_MS = 300
CLI = [sys.executable, "-m", "kvstore.cli"]
NO_RETRY = Retry(NoBackoff(), 0)  # redis-py would otherwise resend a request after a dropped connection


# ---------------------------------------------------------------- helpers

def kv(port, timeout=10):
    """A redis-py client (RESP2) that never retries: a request is sent once."""
    return client(port, socket_timeout=timeout, socket_connect_timeout=5, retry=NO_RETRY)


def info(node, section):
    """INFO <section> over a raw socket (redis-py would split values such as the
    last error on ':' and ','), numbers as ints."""
    with Raw(node.port, timeout=5) as r:
        text = r.call("INFO", section)
    d = info_dict(text)
    d.pop("__sections__", None)
    return {k: int(v) if re.fullmatch(r"-?\d+", v) else v for k, v in d.items()}


def wait_for(what, probe, timeout=10.0, interval=0.05):
    """Poll probe() until it returns a truthy value; fail with the last value seen."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = probe()
        except Exception as e:  # a node restarting: keep polling until the deadline
            last = e
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def read_node_id(data_dir):
    with open(os.path.join(data_dir, "node-id")) as f:
        return f.read().strip()


def cli(*args, timeout=60):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)


def two_free_ports():
    while True:
        a, b = free_port(), free_port()
        if a != b:
            return a, b


class Pair:
    """Nodes A and B, each the other's log peer. A fresh Node object per start (a Node
    whose server failed to restart would otherwise keep the previous run's port)."""

    def __init__(self, root):
        self.root = str(root)
        self.rport = dict(zip("ab", two_free_ports()))
        self.dirs = {n: os.path.join(self.root, n.upper()) for n in "ab"}
        self.nodes = {}
        self.all = []
        self.starts = 0
        self.extra = {}  # settings for every start (e.g. the UDP front end)

    def peer_of(self, name):
        return "b" if name == "a" else "a"

    def addr(self, name):
        """HOST:PORT of name's log receiver."""
        return f"127.0.0.1:{self.rport[name]}"

    def start(self, name, from_peer=False, wait=True, **extra):
        other = self.peer_of(name)
        self.starts += 1
        # As deployed, with the BOSC data file, and memory bounded below the data the
        # tests write: keys are flushed, evicted and loaded back throughout.
        settings = dict(repl_port=self.rport[name], durability="remote", peer=self.addr(other),
                        threads=1, peer_timeout_ms=PEER_TIMEOUT_MS, max_memory="256kb", flush_interval_ms=100)
        settings.update(self.extra, **extra)
        if from_peer:
            settings["from_peer"] = self.addr(other)
        n = Node(port=0, data_dir=self.dirs[name],
                 log_path=os.path.join(self.root, f"{name}-{self.starts}.stderr"), **settings)
        self.all.append(n)
        n.launch()
        self.nodes[name] = n
        if wait:
            n.wait_ready(timeout=30)
        return n

    def start_both(self):
        """Both at once, as a pair restarts: each compares its log with the other's at start."""
        for attempt in range(3):  # a port picked in advance may have been taken since: pick again
            try:
                b = self.start("b", wait=False)
                a = self.start("a", wait=False)
                b.wait_ready(timeout=30)
                a.wait_ready(timeout=30)
                return self
            except Exception:
                self.close()
                if attempt == 2:
                    raise
                self.rport = dict(zip("ab", two_free_ports()))

    def kill(self, name):
        n = self.nodes[name]
        if n.proc and n.proc.poll() is None:
            os.kill(n.pid, signal.SIGCONT)  # harmless if it runs; SIGKILL works on stopped ones anyway
        n.kill()

    def close(self):
        for n in self.all:
            if n.proc is not None:
                if n.proc.poll() is None:
                    try:
                        os.kill(n.pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
                n.kill()

    def wait_in_sync(self, writer="a", timeout=15.0):
        """writer's sender is connected, not degraded, and its peer holds its whole log."""
        w, r = self.nodes[writer], self.nodes[self.peer_of(writer)]

        def probe():
            iw, ip = info(w, "replication"), info(w, "persistence")
            ir = info(r, "replication")
            ok = (iw["log_peer_connected"] == 1 and iw["log_peer_degraded"] == 0
                  and iw["log_peer_acked_lsn"] == ip["log_appended_lsn"]
                  and ir["log_receiver_held_lsn"] == ip["log_appended_lsn"])
            return (iw, ip, ir) if ok else None
        return wait_for(f"{writer}'s peer to hold all of {writer}'s log", probe, timeout)


@pytest.fixture
def pair(tmp_path):
    p = Pair(tmp_path)
    yield p
    p.close()


# ---------------------------------------------------------------- the writer model

class Writers:
    """nwriters threads; writer w is the only writer of keys f"{prefix}{w}:{i}".
    model: key -> last acknowledged value (bytes) or None (absent); it carries over
    between runs (a run ends when the node dies or stop() is called)."""

    def __init__(self, prefix, nwriters=4, keys_per_writer=750, seed=SEED, udp=False):
        self.prefix = prefix
        self.udp = udp  # write through the UDP front end (start gets its port)
        self.keys = [[f"{prefix}{w}:{i}".encode() for i in range(keys_per_writer)] for w in range(nwriters)]
        self.model = {}
        self.seed = seed
        self.runs = 0
        self.threads = []

    def all_keys(self):
        return [k for ks in self.keys for k in ks]

    def start(self, port, max_ops=30000, max_seconds=30.0):
        self.runs += 1
        n = len(self.keys)
        self.stop_ev = threading.Event()
        self.inflight = [None] * n       # (key, value it would leave) of the request in flight
        self.acked = [0] * n
        self.errors = [None] * n
        self.wrong = []                  # replies that contradict the model
        self.lat = [[] for _ in range(n)]  # (send time, seconds until the reply)
        self.threads = [threading.Thread(target=self._run, args=(w, port, max_ops, max_seconds), daemon=True)
                        for w in range(n)]
        for t in self.threads:
            t.start()
        return self

    def _run(self, w, port, max_ops, max_seconds):
        rng = random.Random(f"{self.seed}-{self.prefix}-{self.runs}-{w}")
        keys = self.keys[w]
        deadline = time.monotonic() + max_seconds
        try:
            c = UdpKv(port) if self.udp else kv(port)
        except Exception as e:
            self.errors[w] = e
            return
        try:
            for _ in range(max_ops):
                if self.stop_ev.is_set() or time.monotonic() > deadline:
                    return
                key = rng.choice(keys)
                cur = self.model.get(key)
                r = rng.random()
                if r < 0.5:
                    op, new = "SET", str(rng.randrange(10**9)).encode()
                elif r < 0.85:
                    op, new = "INCR", str(int(cur) + 1 if cur is not None else 1).encode()
                else:
                    op, new = "DEL", None
                self.inflight[w] = (key, new)
                t0 = time.monotonic()
                if op == "SET":
                    reply = c.set(key, new)
                    good = reply is True
                elif op == "INCR":
                    reply = c.incr(key)
                    good = reply == int(new)
                else:
                    reply = c.delete(key)
                    good = reply == (1 if cur is not None else 0)
                self.lat[w].append((t0, time.monotonic() - t0))
                # acknowledged
                self.model[key] = new
                self.inflight[w] = None
                self.acked[w] += 1
                if not good:
                    self.wrong.append((op, key, cur, reply))
                    return
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            self.errors[w] = e  # the node died under us: inflight[w] stays recorded
        except Exception as e:  # anything else is a finding: keep it for the assertion
            self.errors[w] = e
            self.wrong.append(("exception", None, None, repr(e)))
        finally:
            c.close()

    def total_acked(self):
        return sum(self.acked)

    def stop(self):
        self.stop_ev.set()
        self.join()

    def join(self, timeout=20.0):
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "a writer thread did not finish in time"

    def alternatives(self):
        """key -> the value the request in flight would have left (at most one key per writer)."""
        return {f[0]: f[1] for f in self.inflight if f is not None}

    def verify(self, port, what, extra=None):
        """Every key holds its last acknowledged value (or its in-flight one); nothing else is
        there. extra: other keys the node must hold, {key: value}. Resolves the in-flight keys
        to what is observed, so the model carries on exactly."""
        assert not self.wrong, f"{what}: replies contradicting the acknowledged history: {self.wrong[:5]}"
        alt = self.alternatives()
        keys = self.all_keys()
        bad, observed = [], {}
        c = kv(port)
        try:
            for i in range(0, len(keys), 500):
                chunk = keys[i:i + 500]
                for k, v in zip(chunk, c.mget(chunk)):
                    observed[k] = v
                    exp = self.model.get(k)
                    if v != exp and not (k in alt and v == alt[k]):
                        bad.append((k, exp, alt.get(k, "-"), v))
            extra = extra or {}
            got_extra = dict(zip(extra, c.mget(list(extra)))) if extra else {}
            dbsize = c.dbsize()
        finally:
            c.close()
        lost = [b for b in bad if b[3] is None]
        assert not bad, (f"{what}: {len(bad)} of {len(keys)} keys do not hold their last acknowledged value "
                         f"({len(lost)} missing entirely); first (key, acked, in-flight, found): {bad[:8]}")
        assert got_extra == extra, f"{what}: other keys differ: {got_extra} != {extra}"
        present = sum(v is not None for v in observed.values()) + sum(v is not None for v in extra.values())
        assert dbsize == present, f"{what}: DBSIZE {dbsize}, but {present} keys expected"
        for k in alt:
            self.model[k] = observed[k]
        self.inflight = [None] * len(self.keys)
        return observed


class UdpKv:
    """The three writes Writers makes, over the UDP front end, with redis-py's results.
    One datagram per request, never resent: a dead node is a timeout (an OSError)."""

    def __init__(self, port):
        self.u = UdpConn(port, timeout=3.0)

    def _int(self, *args):
        r = self.u.call(*args)
        if not r.startswith(b":"):
            raise AssertionError(f"{args[0]}: {r!r}")
        return int(r[1:])

    def set(self, key, value):
        return self.u.call("SET", key, value) == b"+OK\r\n"

    def incr(self, key):
        return self._int("INCR", key)

    def delete(self, key):
        return self._int("DEL", key)

    def close(self):
        self.u.close()


def kill_at_random_moment(rng, writers, min_acked=200, low=0.1, high=1.2):
    """Wait until the writers have some acknowledged writes, then a random extra delay."""
    wait_for(f"{min_acked} acknowledged writes", lambda: writers.total_acked() >= min_acked
             or any(writers.errors), timeout=20)
    assert not any(writers.errors), f"writers failed before the fault: {writers.errors}"
    time.sleep(rng.uniform(low, high))


FETCHED = re.compile(r"kvstore: fetched the log from (\S+) up to LSN (\d+) \(local log ended at (\d+)\); "
                     r"(it replaces the local log|local log kept)")
RECOVERED = re.compile(r"kvstore: (?:recovered ([\d,]+) records \((?:LSN (\d+)\.\.(\d+)|up to LSN (\d+))\)"
                       r"|no log found: starting empty)")


def b_writes(pair, n=40):
    """A few writes on B too, so that A holds a log of B's (the pair is symmetric)."""
    c = kv(pair.nodes["b"].port)
    try:
        for i in range(n):
            assert c.set(f"b-side:{i}", f"bv{i}") is True
    finally:
        c.close()
    return {f"b-side:{i}".encode(): f"bv{i}".encode() for i in range(n)}


# ---------------------------------------------------------------- 1. loss of one machine

@pytest.mark.timeout(150)
def test_machine_loss_recovers_every_acknowledged_write_from_the_peer(pair):
    rng = random.Random(SEED)
    pair.start_both()
    b_keys = b_writes(pair)
    pair.wait_in_sync("b")
    a_id = read_node_id(pair.dirs["a"])
    w = Writers("m:")
    for it in range(3):
        w.start(pair.nodes["a"].port)
        kill_at_random_moment(rng, w)
        pair.kill("a")
        w.join()
        assert w.total_acked() > 0
        # The machine is gone: its whole data directory, identity included.
        shutil.rmtree(pair.dirs["a"])
        a = pair.start("a", from_peer=True)
        log = a.log()
        m = FETCHED.search(log)
        assert m, f"iteration {it}: no 'fetched the log' line:\n{log}"
        assert m.group(1) == pair.addr("b") and m.group(3) == "0" and m.group(4) == "it replaces the local log", log
        assert read_node_id(pair.dirs["a"]) == a_id, "the recovered node did not adopt its old identity"
        ip = info(a, "persistence")
        assert ip["durability"] == "remote"
        assert ip["log_appended_lsn"] == int(m.group(2)), (ip, log)
        w.verify(a.port, f"iteration {it} (seed {SEED}), after machine loss + --from-peer")
        # The recovered node replicates again (no LSN reuse refusal), and B's log, which
        # lived in the lost directory, is shipped to A again from B's own segments.
        pair.wait_in_sync("a")
        pair.wait_in_sync("b")
    b_info = info(pair.nodes["b"], "replication")
    assert b_info["log_peer_catchup_records"] > 0, b_info
    # B's own data was never touched.
    c = kv(pair.nodes["b"].port)
    try:
        assert dict(zip(b_keys, c.mget(list(b_keys)))) == b_keys
    finally:
        c.close()


def test_machine_loss_with_writes_over_the_udp_front_end(pair):
    """The UDP front end (--arch udp) acknowledges a write only once the peer's memory
    holds it too: the machine is lost (kill -9, directory deleted), and the node rebuilt
    from its peer holds every acknowledged write."""
    rng = random.Random(SEED + 1)
    pair.extra = dict(arch="udp", udp_port=0)
    pair.start_both()
    w = Writers("u:", udp=True)
    for it in range(2):
        w.start(pair.nodes["a"].udp_port)
        kill_at_random_moment(rng, w)
        st = info(pair.nodes["a"], "stats")
        assert st["udp_held_for_log"] > 0, st  # replies waited for the peer's ack
        pair.kill("a")
        w.join()
        shutil.rmtree(pair.dirs["a"])
        a = pair.start("a", from_peer=True)
        assert FETCHED.search(a.log()), a.log()
        w.verify(a.port, f"iteration {it} (seed {SEED + 1}), UDP writes, after machine loss + --from-peer")
        pair.wait_in_sync("a")


@pytest.mark.timeout(150)
def test_loss_of_either_machine_of_a_pair_writing_on_both_sides(pair):
    """Writers on both nodes. Machine B is lost (SIGKILL, data dir deleted) while A keeps
    writing: B is rebuilt from A's copy of its log, A ships its whole log to the new B
    (catch-up from LSN 1), and that copy then suffices to rebuild A after A's loss."""
    rng = random.Random(SEED + 2)
    pair.start_both()
    a, b = pair.nodes["a"], pair.nodes["b"]
    b_id = read_node_id(pair.dirs["b"])
    wa = Writers("ea:", nwriters=2, keys_per_writer=750)
    wb = Writers("eb:", nwriters=2, keys_per_writer=750)
    wa.start(a.port)
    wb.start(b.port)
    kill_at_random_moment(rng, wb)
    pair.kill("b")
    wb.join()
    shutil.rmtree(pair.dirs["b"])
    time.sleep(rng.uniform(0.2, 0.8))  # A writes on without its peer
    b = pair.start("b", from_peer=True)
    m = FETCHED.search(b.log())
    assert m and m.group(3) == "0" and m.group(4) == "it replaces the local log", b.log()
    assert read_node_id(pair.dirs["b"]) == b_id
    wb.verify(b.port, f"B after machine loss + --from-peer (seed {SEED + 2})")
    time.sleep(rng.uniform(0.1, 0.5))
    wa.stop()
    assert not any(wa.errors), f"writes to A failed while its peer was lost: {wa.errors}"
    iw, ip, ir = pair.wait_in_sync("a", timeout=20)
    assert iw["log_peer_catchup_records"] > 0, iw
    pair.wait_in_sync("b")
    wa.verify(a.port, "A, after its peer was lost and rebuilt")
    # Now lose A: the new B's copy of A's log (shipped again from scratch) must be complete.
    pair.kill("a")
    shutil.rmtree(pair.dirs["a"])
    a = pair.start("a", from_peer=True)
    assert FETCHED.search(a.log()), a.log()
    wa.verify(a.port, "A rebuilt from the rebuilt B's copy")
    pair.wait_in_sync("a")
    pair.wait_in_sync("b")
    wb.verify(b.port, "B at the end")


# ---------------------------------------------------------------- 2. process crash, disk kept

@pytest.mark.timeout(150)
def test_process_crash_local_recovery_holds_every_acknowledged_write(pair):
    rng = random.Random(SEED + 1)
    pair.start_both()
    w = Writers("p:")
    for it in range(3):
        w.start(pair.nodes["a"].port)
        kill_at_random_moment(rng, w)
        pair.kill("a")
        w.join()
        held_by_b = info(pair.nodes["b"], "replication")["log_receiver_held_lsn"]
        a = pair.start("a")  # same data dir, no --from-peer
        log = a.log()
        # The local log lags (it is written every disk_log_interval_ms): remote mode
        # compares it with the peer's copy at every start and takes the longer one.
        local_lsn = int(re.search(r"local log ended at (\d+)", log).group(1))
        if held_by_b > local_lsn:
            assert "it replaces the local log" in log, log
        assert RECOVERED.search(log), log
        recovered = info(a, "persistence")["log_appended_lsn"]
        try:
            w.verify(a.port, f"iteration {it} (seed {SEED + 1}), after SIGKILL + local recovery")
        except AssertionError as e:
            rep = info(a, "replication")
            raise AssertionError(
                f"{e}\n  local log recovered up to LSN {recovered}; the peer holds A's log up to LSN {held_by_b}; "
                f"A's sender: connected={rep['log_peer_connected']} degraded={rep['log_peer_degraded']} "
                f"last_error={rep['log_peer_last_error']!r}\n  A's stderr:\n{log}") from None
        pair.wait_in_sync("a")


# ---------------------------------------------------------------- 3. peer down

@pytest.mark.timeout(120)
def test_peer_down_writes_fall_back_to_local_sync_and_peer_catches_up(pair, tmp_path):
    pair.start_both()
    a = pair.nodes["a"]
    w = Writers("d:", nwriters=2, keys_per_writer=500)
    w.start(a.port)
    wait_for("writes acknowledged", lambda: w.total_acked() >= 200 or any(w.errors), timeout=20)
    t_kill = time.monotonic()
    pair.kill("b")
    time.sleep(1.5)  # writers keep going on A meanwhile
    acked_at_kill = sum(1 for lw in w.lat for t0, _ in lw if t0 >= t_kill)
    w.stop()
    assert not any(w.errors), f"writes to A failed while B was down: {w.errors}"
    after = [dt for lw in w.lat for t0, dt in lw if t0 >= t_kill]
    assert after, "no write was acknowledged after the peer went down"
    assert max(after) < 5.0, f"a write waited {max(after):.2f} s for a dead peer (timeout {PEER_TIMEOUT_MS} ms)"
    assert acked_at_kill > 0
    rep = wait_for("A to report the peer lost",
                   lambda: (lambda r: r if r["log_peer_degraded"] == 1 and r["log_peer_connected"] == 0 else None)(
                       info(a, "replication")), timeout=5)
    assert rep["log_peer_last_error"], rep
    # Further writes in degraded mode are acknowledged quickly, one by one.
    c = kv(a.port)
    t0 = time.monotonic()
    extra = {}
    for i in range(30):
        assert c.set(f"deg:{i}", f"v{i}") is True
        extra[f"deg:{i}".encode()] = f"v{i}".encode()
    c.close()
    assert time.monotonic() - t0 < 10.0
    assert info(a, "persistence")["log_syncs"] > 0
    # Those writes are on A's disk: SIGKILL A and recover locally (B is still down).
    pair.kill("a")
    a = pair.start("a")
    assert RECOVERED.search(a.log()), a.log()
    w.verify(a.port, "after peer loss, then SIGKILL of A + local recovery", extra=extra)
    rep = info(a, "replication")
    assert rep["log_peer_degraded"] == 1 and rep["log_peer_connected"] == 0, rep
    c = kv(a.port)
    for i in range(30, 40):
        assert c.set(f"deg:{i}", f"v{i}") is True
        extra[f"deg:{i}".encode()] = f"v{i}".encode()
    c.close()
    catchup_before = info(a, "replication")["log_peer_catchup_records"]
    # B comes back: A reconnects, catches it up from its segment files, leaves degraded mode.
    pair.start("b")
    iw, ip, ir = pair.wait_in_sync("a", timeout=20)
    assert iw["log_peer_catchup_records"] > catchup_before, iw
    assert ir["log_receiver_held_lsn"] == ip["log_appended_lsn"]
    # And B's copy is complete: it rebuilds A's data set.
    check_peer_copy(pair, tmp_path / "fetched", a, w.all_keys() + list(extra))


def check_peer_copy(pair, tmp_dir, a, keys):
    """`kvstore recover --from-peer` into an empty dir, then a disk-mode node on it: the same
    data as A (on every key of keys, the keys the test wrote; kvstore has no KEYS/SCAN)."""
    r = cli("recover", "--data-dir", tmp_dir, "--from-peer", pair.addr("b"))
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"keys: ([\d,]+)", r.stdout)
    assert m, r.stdout
    ca = kv(a.port)
    try:
        n = ca.dbsize()
        assert int(m.group(1).replace(",", "")) == n, (r.stdout, n)
        want = dict(zip(keys, ca.mget(keys)))
    finally:
        ca.close()
    node = Node(port=0, data_dir=str(tmp_dir), durability="disk", threads=1,
                log_path=str(tmp_dir) + ".stderr")
    node.start()
    try:
        cr = kv(node.port)
        got = dict(zip(keys, cr.mget(keys)))
        assert cr.dbsize() == n
        cr.close()
    finally:
        node.stop()
    diff = [k for k in keys if got.get(k) != want[k]]
    assert not diff, f"the peer's copy differs from A on {len(diff)} keys, e.g. {diff[:5]}"
    return r.stdout


# ---------------------------------------------------------------- 4. peer slow (stopped)

@pytest.mark.timeout(120)
def test_stopped_peer_times_out_into_degraded_mode_and_catches_up_after(pair, tmp_path):
    pair.start_both()
    a, b = pair.nodes["a"], pair.nodes["b"]
    c = kv(a.port)
    expect = {}
    for i in range(100):
        assert c.set(f"s:{i}", f"v{i}") is True
        expect[f"s:{i}".encode()] = f"v{i}".encode()
    pair.wait_in_sync("a")
    # on a loaded machine an ack may have been late already: start from a healthy link
    wait_for("A's link to its peer to be up", lambda: info(a, "replication")["log_peer_degraded"] == 0)
    os.kill(b.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert c.set("s:slow", "x") is True  # socket timeout 10 s bounds the wait
        dt = time.monotonic() - t0
        expect[b"s:slow"] = b"x"
        assert dt < 5.0, f"a write waited {dt:.2f} s on a stopped peer (timeout {PEER_TIMEOUT_MS} ms)"
        assert dt > PEER_TIMEOUT_MS / 1000 * 0.5, f"acknowledged after {dt:.3f} s although the peer is stopped"
        rep = info(a, "replication")
        assert rep["log_peer_degraded"] == 1, rep
        # "did not acknowledge LSN ..." (or, once it retried, a failed handshake with the stopped peer)
        assert pair.addr("b") in rep["log_peer_last_error"], rep
        t0 = time.monotonic()
        for i in range(50):
            assert c.set(f"s2:{i}", f"w{i}") is True
            expect[f"s2:{i}".encode()] = f"w{i}".encode()
        assert time.monotonic() - t0 < 10.0, "degraded-mode writes kept waiting for the stopped peer"
        time.sleep(1.0)  # the sender keeps trying the stopped peer meanwhile
        assert info(a, "replication")["log_peer_degraded"] == 1
    finally:
        os.kill(b.pid, signal.SIGCONT)
    iw, ip, ir = pair.wait_in_sync("a", timeout=20)
    assert iw["log_peer_degraded"] == 0 and iw["log_peer_connected"] == 1
    for i in range(20):  # back in remote mode
        assert c.set(f"s3:{i}", f"z{i}") is True
        expect[f"s3:{i}".encode()] = f"z{i}".encode()
    c.close()
    pair.wait_in_sync("a")
    # B's copy is complete: lose machine A entirely and rebuild it from B.
    pair.kill("a")
    shutil.rmtree(pair.dirs["a"])
    a = pair.start("a", from_peer=True)
    assert FETCHED.search(a.log()), a.log()
    c = kv(a.port)
    keys = list(expect)
    got = dict(zip(keys, c.mget(keys)))
    assert c.dbsize() == len(expect)
    c.close()
    missing = [k for k in keys if got[k] != expect[k]]
    assert not missing, f"lost after SIGSTOP/SIGCONT of the peer: {missing[:10]}"


# ---------------------------------------------------------------- 5. the peer holds A's log

@pytest.mark.timeout(90)
def test_peer_holds_the_log_and_recover_from_peer_rebuilds_the_data(pair, tmp_path):
    pair.start_both()
    a = pair.nodes["a"]
    w = Writers("h:", nwriters=2, keys_per_writer=400)
    w.start(a.port, max_ops=1500)
    w.join(timeout=30)
    assert not any(w.errors), w.errors
    w.verify(a.port, "A itself")
    iw, ip, ir = pair.wait_in_sync("a")
    assert ir["log_receiver_held_lsn"] == iw["log_peer_acked_lsn"] == ip["log_appended_lsn"] > 0
    # B stores A's log under B/peer/<A's id>/ as ordinary segment files.
    a_id = read_node_id(pair.dirs["a"])
    pdir = os.path.join(pair.dirs["b"], "peer", a_id)
    segs = [n for n in os.listdir(pdir) if re.fullmatch(r"wal-[0-9a-f]{16}\.log", n)]
    assert segs, os.listdir(pdir)
    out = check_peer_copy(pair, tmp_path / "fetched", a, w.all_keys())
    assert f"up to LSN {ip['log_appended_lsn']} (local log ended at 0); it replaces the local log" in out, out
    assert read_node_id(str(tmp_path / "fetched")) == a_id
    expected_keys = sum(v is not None for v in w.model.values())
    assert re.search(rf"keys: {expected_keys:,}\b", out), out


# ---------------------------------------------------------------- 6. log lost, identity kept

def read_keys(port, keys):
    c = kv(port)
    try:
        return dict(zip(keys, c.mget(keys)))
    finally:
        c.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("new_writes", ["fewer", "more"])
def test_lost_log_with_identity_kept_never_loses_acknowledged_writes(pair, new_writes):
    """A's log directory is lost but its node-id remains; A restarts WITHOUT --from-peer.
    Remote mode compares logs with the peer at every start, so A comes back with its old
    writes and its new records continue after them (reusing LSNs would corrupt B's copy);
    then every acknowledged write, from before the loss and after it, must survive (a) a
    restart with --from-peer and (b) the loss of machine A, recovered from B's copy.
    new_writes: A acknowledges fewer / more new writes after the loss than the peer holds
    records of its old log."""
    pair.start_both()
    a = pair.nodes["a"]
    c = kv(a.port)
    acked = {}
    for i in range(100):
        assert c.set(f"old:{i}", f"o{i}") is True
        acked[f"old:{i}".encode()] = f"o{i}".encode()
    c.close()
    _, ip, _ = pair.wait_in_sync("a")
    n_old = ip["log_appended_lsn"]
    pair.kill("a")
    shutil.rmtree(os.path.join(pair.dirs["a"], "log"))
    a = pair.start("a")  # no --from-peer: remote mode compares with the peer at every start
    log = a.log()
    assert f"up to LSN {n_old} (local log ended at 0); it replaces the local log" in log, log
    # A is back with its old writes, and its new records continue after them (no LSN reuse).
    n_new = n_old // 2 if new_writes == "fewer" else n_old * 2
    c = kv(a.port)
    served = c.dbsize()
    for i in range(n_new):
        assert c.set(f"new:{i}", f"n{i}") is True
        acked[f"new:{i}".encode()] = f"n{i}".encode()
    c.close()
    _, ip, ir = pair.wait_in_sync("a")
    lsn_after = ip["log_appended_lsn"]
    assert lsn_after == n_old + n_new and ir["log_receiver_held_lsn"] == lsn_after, (ip, ir)
    story = [f"old log LSN 1..{n_old} held by B; A's log dir deleted, node-id kept; A restarted without "
             f"--from-peer, served {served} keys and acknowledged {n_new} new writes (LSN up to {lsn_after})"]
    problems = []
    if served != 100:
        problems.append(f"A served {served} keys after its restart, not the 100 it had acknowledged")

    def check(when, port, log):
        got = read_keys(port, list(acked))
        lost = {p: sorted(k for k in acked if k.startswith(p) and got[k] != acked[k]) for p in (b"old:", b"new:")}
        story.append(f"{when}: {(FETCHED.search(log) or [log.strip()])[0]}")
        if lost[b"old:"] or lost[b"new:"]:
            problems.append(f"{when}: acknowledged writes lost: {len(lost[b'old:'])} of {n_old} from before the "
                            f"log loss, {len(lost[b'new:'])} of {n_new} acknowledged after it "
                            f"(e.g. {(lost[b'old:'][:2] + lost[b'new:'][:2])})")

    # (a) A subsequent restart with --from-peer.
    pair.kill("a")
    a = pair.start("a", from_peer=True)
    check("restart with --from-peer", a.port, a.log())
    # (b) Then machine A is lost and rebuilt from B's copy.
    wait_for("A's sender to settle", lambda: info(a, "replication")["log_peer_last_error"] != ""
             or info(a, "replication")["log_peer_degraded"] == 0, timeout=10)
    pair.kill("a")
    shutil.rmtree(pair.dirs["a"])
    a = pair.start("a", from_peer=True)
    check("machine A lost, rebuilt with --from-peer", a.port, a.log())
    assert not problems, "\n  ".join(problems + ["-- what happened:"] + story)


# ---------------------------------------------------------------- 7. misconfiguration

@pytest.mark.timeout(60)
def test_remote_without_peer_is_refused(tmp_path):
    r = cli("serve", "--port", "0", "--durability", "remote", "--data-dir", tmp_path / "d", timeout=30)
    assert r.returncode != 0
    assert "listening on" not in r.stdout
    assert "--peer" in r.stderr, r.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("peer", ["nonsense", "127.0.0.1", "127.0.0.1:notaport", "127.0.0.1:0", "1.2.3:7380"])
def test_remote_with_malformed_peer_is_refused(tmp_path, peer):
    r = cli("serve", "--port", "0", "--durability", "remote", "--peer", peer, "--data-dir", tmp_path / "d",
            timeout=30)
    assert r.returncode != 0
    assert "listening on" not in r.stdout
    assert "peer" in r.stderr and peer in r.stderr, r.stderr
    assert re.search(r"\b(HOST|IPV4|IPv4):PORT\b", r.stderr), r.stderr  # the expected form
    assert re.search(r"\d+\.\d+\.\d+\.\d+:\d+", r.stderr), r.stderr  # with an example


# ---------------------------------------------------------------- receiver robustness

def _frame(ftype, a=0, b=0, payload=b""):
    import struct

    crc = faultlib.crc32c(payload) if payload else 0
    return struct.pack("<IIIIQQ", 0x5052564B, ftype, len(payload), crc, a, b) + payload


@pytest.mark.timeout(90)
def test_a_ghost_connection_does_not_lock_the_node_out(pair):
    """A connection that said HELLO with A's id and then went silent (a machine that
    vanished without a FIN) must not keep A's restarted sender from replicating; a
    second HELLO on one connection is a protocol error (no descriptor leak)."""
    import socket

    pair.start_both()
    a = pair.nodes["a"]
    c = kv(a.port)
    c.set("before", "1")
    c.close()
    pair.wait_in_sync("a")
    with open(os.path.join(pair.dirs["a"], "node-id")) as f:
        nid = bytes.fromhex(f.read().strip())
    rport = pair.rport["b"]
    ghost = socket.create_connection(("127.0.0.1", rport))
    ghost.sendall(_frame(1, 1, 0, nid))  # HELLO as A, then silence
    assert len(ghost.recv(32)) == 32  # HELLO_ACK
    pair.kill("a")
    a = pair.start("a")
    c = kv(a.port)
    c.set("after", "2")
    c.close()
    _, ip, ir = pair.wait_in_sync("a", timeout=20)
    assert ir["log_receiver_held_lsn"] == ip["log_appended_lsn"]
    # the replaced ghost was closed by the receiver
    ghost.settimeout(5)
    assert ghost.recv(100) == b""
    ghost.close()
    # a repeated HELLO on one connection: closed, not served
    s = socket.create_connection(("127.0.0.1", rport))
    s.settimeout(5)
    s.sendall(_frame(1, 1, 0, os.urandom(16)))
    assert len(s.recv(32)) == 32
    s.sendall(_frame(1, 1, 0, os.urandom(16)))
    assert s.recv(100) == b""
    s.close()
