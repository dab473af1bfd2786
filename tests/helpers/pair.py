"""Two kvstore nodes in `--durability remote`, each the other's log peer (Pair; the `pair`
fixture in tests/faults/conftest.py), and a model of writers whose every acknowledged
write must survive (Writers): shared by test_remote_durability.py and test_replog.py."""
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvstore import Node

from .conn import Raw, UdpConn, client
from .replwire import write_secret
from .resp import info_dict
from .servers import free_port


SEED = int(os.environ.get("KVSTORE_FAULT_SEED", "7301"))


PEER_TIMEOUT_MS = 300


CLI = [sys.executable, "-m", "kvstore.cli"]


NO_RETRY = Retry(NoBackoff(), 0)  # redis-py would otherwise resend a request after a dropped connection


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


def wait_for(what, probe, timeout=30.0, interval=0.05):
    """Poll probe() until it returns a truthy value; fail with the last value seen. The
    deadline is generous (a loaded machine): it only bounds how long a failure takes."""
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


def stop_process(pid, timeout=30.0):
    """SIGSTOP pid and return once every one of its threads is stopped. kill() only
    queues the signal: one thread takes it and then stops the others, so on a loaded
    machine the process can run (answer, acknowledge) for milliseconds after kill()
    returned. A test that times what a stopped process no longer does starts after this."""
    os.kill(pid, signal.SIGSTOP)

    def all_stopped():
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            return False
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:  # a thread that exited
                continue
            if state not in ("T", "t"):
                return False
        return True

    wait_for(f"every thread of pid {pid} to be stopped", all_stopped, timeout=timeout, interval=0.001)


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
        self.created = set()  # nodes started once: a brand-new node needs --init, a later start does not
        self.secret = write_secret(os.path.join(self.root, "repl.secret"))  # both nodes share it

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
                        repl_secret_file=self.secret, threads=1, peer_timeout_ms=PEER_TIMEOUT_MS, max_memory="256kb", flush_interval_ms=100)
        settings.update(self.extra, **extra)
        if from_peer:
            settings["from_peer"] = self.addr(other)
        if name not in self.created:  # its first start: a new node (init=False: start it as one that lost its disk)
            settings.setdefault("init", True)
        if not settings.get("init"):
            settings.pop("init", None)  # a flag: there is no --no-init
        self.created.add(name)
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
            created = set(self.created)
            try:
                b = self.start("b", wait=False)
                a = self.start("a", wait=False)
                b.wait_ready(timeout=30)
                a.wait_ready(timeout=30)
                return self
            except Exception:
                self.close()
                self.created = created  # a node that never came up is still new
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

    def wait_in_sync(self, writer="a", timeout=60.0):
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

    def join(self, timeout=60.0):
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
             or any(writers.errors), timeout=60)
    assert not any(writers.errors), f"writers failed before the fault: {writers.errors}"
    time.sleep(rng.uniform(low, high))


FETCHED = re.compile(r"fetched the log from (\S+) up to LSN (\d+) \(local log ended at (\d+)\); "
                     r"(it replaces the local log|local log kept)")


RECOVERED = re.compile(r"(?:recovered ([\d,]+) records \((?:LSN (\d+)\.\.(\d+)|up to LSN (\d+))\)"
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
