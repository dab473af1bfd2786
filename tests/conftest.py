"""Shared fixtures for kvstore's tests.

Servers under test:
  kv            - one kvstore Node (2 pollers) for a whole test module
  kv_fresh      - a kvstore Node of its own for one test
  redis_server  - a real redis-server (session), the reference for byte comparisons
  redis_auth / kv_auth - the same two with requirepass set (module)

Every server listens on 127.0.0.1 on a port the OS picked. redis-server is
started with --save '' --appendonly no (no files), and --databases 1, as kvstore
has a single database (its CONFIG GET databases says 1), so that SELECT 1 means
the same thing on both.
"""
import os
import resource
import shutil
import socket
import struct
import subprocess
import tempfile
import time

import pytest

import kvstore
from kvstore import Node

PASSWORD = "pw"


# ---------------------------------------------------------------- helpers

def free_port():
    """A TCP port that was free a moment ago (for servers that cannot bind port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_nofile(want):
    """Raise this process's RLIMIT_NOFILE soft limit to at least `want` if allowed.
    Children (servers started afterwards) inherit it. Returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def client(port, **kw):
    """A redis-py client speaking RESP2 (kvstore speaks RESP2 only; redis-py >= 8
    would otherwise open with HELLO 3)."""
    kw.setdefault("socket_timeout", 10)
    kw.setdefault("protocol", 2)
    return kvstore.Client(host="127.0.0.1", port=port, **kw)


def rss_bytes(pid):
    """Resident set size of a process, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def resp_cmd(*args):
    """Encode a command as a RESP multibulk request."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        elif isinstance(a, int):
            a = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Incomplete(Exception):
    pass


def resp_reply_end(buf, pos=0):
    """End offset of the complete RESP2/RESP3 reply starting at buf[pos]; raises Incomplete."""
    nl = buf.find(b"\r\n", pos)
    if nl < 0:
        raise Incomplete
    t = buf[pos:pos + 1]
    line = buf[pos + 1:nl]
    if t in (b"+", b"-", b":", b"_", b"#", b",", b"("):
        return nl + 2
    if t in (b"$", b"=", b"!"):
        n = int(line)
        if n < 0:
            return nl + 2
        end = nl + 2 + n + 2
        if len(buf) < end:
            raise Incomplete
        return end
    if t in (b"*", b"~", b">", b"%", b"|"):
        n = int(line) * (2 if t in (b"%", b"|") else 1)
        p = nl + 2
        for _ in range(max(n, 0)):
            p = resp_reply_end(buf, p)
        if t == b"|":  # an attribute precedes the actual reply
            p = resp_reply_end(buf, p)
        return p
    raise ValueError(f"not a RESP reply at {pos}: {buf[pos:pos + 60]!r}")


def resp_parse(buf, pos=0):
    """Decode one complete RESP2/RESP3 reply: (value, end). Errors decode to ('ERR', text),
    maps to dicts, RESP3 null to None."""
    nl = buf.index(b"\r\n", pos)
    t, line = buf[pos:pos + 1], buf[pos + 1:nl]
    if t == b"+":
        return line, nl + 2
    if t == b"-":
        return ("ERR", line), nl + 2
    if t in (b":", b"("):
        return int(line), nl + 2
    if t == b"_":
        return None, nl + 2
    if t == b"#":
        return line == b"t", nl + 2
    if t == b",":
        return float(line), nl + 2
    if t in (b"$", b"=", b"!"):
        n = int(line)
        if n < 0:
            return None, nl + 2
        v = buf[nl + 2:nl + 2 + n]
        if t == b"!":
            v = ("ERR", v)
        return v, nl + 2 + n + 2
    if t in (b"*", b"~", b">"):
        n = int(line)
        if n < 0:
            return None, nl + 2
        p, items = nl + 2, []
        for _ in range(n):
            v, p = resp_parse(buf, p)
            items.append(v)
        return items, p
    if t == b"%":
        p, d = nl + 2, {}
        for _ in range(int(line)):
            k, p = resp_parse(buf, p)
            v, p = resp_parse(buf, p)
            d[k if not isinstance(k, list) else tuple(k)] = v
        return d, p
    raise ValueError(f"not a RESP reply: {buf[pos:pos + 60]!r}")


class Raw:
    """A plain TCP connection for sending exact bytes and reading exact replies."""

    def __init__(self, port, timeout=5.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = b""
        self.eof = False

    def send(self, data):
        self.sock.sendall(data)
        return self

    def _fill(self, deadline):
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = self.sock.recv(1 << 20)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.eof = True
        self.buf += chunk
        return chunk

    def reply(self, timeout=None):
        """Bytes of exactly one complete reply (raises on EOF or timeout)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            try:
                end = resp_reply_end(self.buf)
                out, self.buf = self.buf[:end], self.buf[end:]
                return out
            except Incomplete:
                pass
            if self.eof:
                raise EOFError(f"connection closed; partial reply {self.buf[:200]!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no complete reply; have {self.buf[:200]!r}")
            self._fill(deadline)

    def replies(self, n, timeout=None):
        return [self.reply(timeout) for _ in range(n)]

    def value(self, timeout=None):
        return resp_parse(self.reply(timeout))[0]

    def call(self, *args):
        """Send one command, return its decoded reply."""
        self.send(resp_cmd(*args))
        return self.value()

    def read_until_close(self, timeout=None):
        """Everything until the server closes: (bytes, closed?)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while not self.eof and time.monotonic() < deadline:
            try:
                self._fill(deadline)
            except (socket.timeout, TimeoutError):
                break
        out, self.buf = self.buf, b""
        return out, self.eof

    def read_for(self, seconds):
        """Whatever arrives within `seconds` (and whether the server closed)."""
        return self.read_until_close(timeout=seconds)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class UdpConn:
    """The UDP front end (--arch udp/dpdk; framing in ext/udpfront.h) over a connected
    UDP socket: each request one datagram with the next id, replies returned in request
    order. Nothing is resent: a lost datagram, or a dead server, is a socket.timeout."""

    def __init__(self, port, host="127.0.0.1", timeout=5.0):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.connect((host, port))
        self.sock.settimeout(timeout)
        self.next_id = 1
        self.early = {}  # id -> (flags, reply) received before the one awaited

    def send(self, request, flags=0):
        rid = self.next_id
        self.next_id += 1
        self.sock.send(struct.pack(">IHH", rid, 0, flags) + request)
        return rid

    def reply(self, rid):
        """(flags, RESP reply) of request rid."""
        while rid not in self.early:
            d = self.sock.recv(65536)
            got, _seq, flags = struct.unpack(">IHH", d[:8])
            self.early[got] = (flags, d[8:])
        return self.early.pop(rid)

    def exchange(self, requests):
        """Send every request, then yield their replies (RESP bytes) in order."""
        ids = [self.send(r) for r in requests]
        for rid in ids:
            yield self.reply(rid)[1]

    def call(self, *args):
        return self.reply(self.send(resp_cmd(*args)))[1]

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def info_dict(raw_info):
    """INFO text -> {field: str}, plus '__sections__' list in order."""
    if isinstance(raw_info, bytes):
        raw_info = raw_info.decode()
    out, sections = {}, []
    for line in raw_info.split("\r\n"):
        if line.startswith("# "):
            sections.append(line[2:].strip().lower())
        elif line and ":" in line:
            k, v = line.split(":", 1)
            out[k] = v
    out["__sections__"] = sections
    return out


# ---------------------------------------------------------------- real redis-server

class RedisServer:
    def __init__(self, *extra):
        self.binary = shutil.which("redis-server")
        self.extra = list(extra)
        self.proc = None
        self.port = None
        self.dir = None

    def start(self, timeout=15.0):
        self.dir = tempfile.mkdtemp(prefix="redis-ref-")
        last = ""
        for _ in range(5):  # the free port may be taken in between: retry
            self.port = free_port()
            args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                    "--save", "", "--appendonly", "no", "--databases", "1",
                    "--dir", self.dir, "--daemonize", "no", "--logfile", ""] + self.extra
            self.log = open(os.path.join(self.dir, "redis.log"), "wb")
            self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with Raw(self.port, timeout=1) as r:
                        rep = r.send(b"PING\r\n").reply()
                        if rep in (b"+PONG\r\n",) or rep.startswith(b"-NOAUTH"):
                            return self
                except OSError:
                    time.sleep(0.05)
            self.stop()
            with open(os.path.join(self.dir, "redis.log"), errors="replace") as f:
                last = f.read()[-1000:]
        raise RuntimeError(f"redis-server did not start: {last}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "log", None):
            self.log.close()
        self.proc = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def _need(binary):
    if shutil.which(binary) is None:
        pytest.skip(f"{binary} is not installed (apt-get install redis-server redis-tools)")


def _start_node(**settings):
    n = Node(port=0, data_dir=tempfile.mkdtemp(prefix="kvstore-test-"), **settings)
    n.start()
    return n


def _stop_node(n):
    rc = n.stop()
    shutil.rmtree(n.data_dir, ignore_errors=True)
    return rc


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def kv():
    """A kvstore server (2 pollers, 256 MB bound) shared by one test module."""
    n = _start_node(threads=2, max_memory="256mb")
    yield n
    _stop_node(n)


@pytest.fixture
def kv_fresh():
    """A kvstore server for one test."""
    n = _start_node(threads=2)
    yield n
    _stop_node(n)


@pytest.fixture
def kv_node_factory():
    """Start kvstore servers with any settings; all are stopped after the test."""
    nodes = []

    def make(**settings):
        settings.setdefault("threads", 2)
        n = _start_node(**settings)
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        if n.proc:
            _stop_node(n)


@pytest.fixture(scope="module")
def kv_auth():
    n = _start_node(threads=2, requirepass=PASSWORD)
    yield n
    _stop_node(n)


@pytest.fixture(scope="session")
def redis_server():
    """A real redis-server, the reference implementation."""
    _need("redis-server")
    r = RedisServer().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def redis_auth():
    _need("redis-server")
    r = RedisServer("--requirepass", PASSWORD).start()
    yield r
    r.stop()
