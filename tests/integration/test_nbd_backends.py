"""The block device's network backends (ext/frontend/nbd_resp.c, nbd_memcache.c over
nbd_netkv.c) against real servers started here: redis-server, memcached and a kvstore
node. tests/c/nbd_backend_test.c (built with ASan/UBSan) opens backend contexts on an
epoll and drives them as the NBD server does: pipelined GET/PUT/DEL/SYNC of many
blocks, absent blocks read as zeros, one block's operations in order, 32 requests of a
128 KiB I/O in one writev (the client's counters), a pipeline larger than the socket
buffers, and no allocation per operation once warm (malloc wrapped at link time); the open's errors (AUTH refused, the wrong kind of server, nothing
listening); the server stopped with operations in flight and killed: they complete
with EIO, and the context reconnects once the server is back on the same port (with a
kvstore node in disk mode, every write completed before the kill reads back); a server
that stops answering. A scripted fake Redis (FakeRedis) cuts every reply at each place a
header or trailer can be cut, and sends the malformed replies a broken or hostile server
could: each is refused with its reason logged (the connection reset, or for a value that
is not a block, that read failed with EIO), and the block reads again afterwards."""
import os
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from helpers.netkv import KVServer
from helpers.pair import stop_process
from helpers.servers import PASSWORD, free_port

ROOT = Path(__file__).resolve().parent.parent.parent
EXT = ROOT / "ext"
BIN = ROOT / "tests" / "c" / "bin"
SOURCES = ["tests/c/nbd_backend_test.c", "ext/frontend/nbd_netkv.c", "ext/frontend/nbd_netkv_open.c",
           "ext/frontend/nbd_resp.c", "ext/frontend/nbd_memcache.c", "ext/frontend/nbd_meta.c", "ext/core/log.c",
           "ext/proto/resp.c"]
STALL_MS = 1000  # the client resets a connection this long unanswered (30 s in the server)
FLAGS = [f"-DNK_STALL_MS={STALL_MS}", "-std=gnu11", "-g", "-O1", "-Wall", "-Wno-unused-parameter", "-pthread", f"-I{EXT}",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
ENV = {"ASAN_OPTIONS": "abort_on_error=1:detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")
BAD_BLOCK = 999999

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


def build(name, *extra):
    BIN.mkdir(exist_ok=True)
    out = BIN / name
    tmp = BIN / f".{name}.{uuid.uuid4().hex}"
    cmd = ["gcc", *FLAGS, *extra, *[str(ROOT / s) for s in SOURCES], "-Wl,--wrap=malloc,--wrap=realloc,--wrap=calloc",
           "-o", str(tmp)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        pytest.fail(f"build failed:\n$ {shlex.join(cmd)}\n{r.stderr[-5000:]}")
    os.replace(tmp, out)
    return out


@pytest.fixture(scope="module")
def binary():
    return build("nbd_backend_test_asan")


@pytest.fixture(scope="module")
def binary_64k():
    return build("nbd_backend_test_64k_asan", "-DBS=65536")


@pytest.fixture
def server_of():
    made = []

    def make(kind, **kw):
        s = KVServer(kind, **kw).start()
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


def run(binary, *args, timeout=120):
    cmd = [str(binary), *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env={**os.environ, **ENV},
                       timeout=timeout)
    out = r.stdout + r.stderr
    bad = [m for m in SANITIZER_MARKERS if m in out]
    assert r.returncode == 0 and not bad, f"exit {r.returncode}, {bad}\n$ {shlex.join(cmd)}\n{out[-6000:]}"
    assert r.stdout.rstrip().endswith("ok"), out[-3000:]
    return r.stdout


def prefix():
    return f"nbdtest:{uuid.uuid4().hex[:8]}:"


# ---------------------------------------------------------------- tests

@pytest.mark.parametrize("kind", ["redis", "memcached", "kvstore"])
def test_pipelined_blocks(binary, server_of, kind):
    srv = server_of(kind)
    p = prefix()
    srv.set_raw(f"{p}{BAD_BLOCK}".encode(), b"short")  # not a block: a GET of it must fail, not pass it on
    out = run(binary, srv.url, p, "basic", BAD_BLOCK)
    assert "32 GETs in 1 writev" in out and "wrong-length value: EIO" in out
    assert "warm: no allocation" in out


@pytest.mark.parametrize("kind", ["redis", "memcached"])
def test_pipelined_64k_blocks(binary_64k, server_of, kind):
    # 64 KiB values: payloads many times the client's input buffer, read straight into the blocks
    srv = server_of(kind)
    out = run(binary_64k, srv.url, prefix(), "basic")
    assert "32 GETs in 1 writev" in out and "warm: no allocation" in out


def test_redis_password_and_database(binary, server_of):
    srv = server_of("redis", password=PASSWORD)
    out = run(binary, srv.url + "/0", prefix(), "basic")
    assert "32 GETs in 1 writev" in out


def test_kvstore_password(binary, server_of):
    srv = server_of("kvstore", password=PASSWORD)
    run(binary, srv.url, prefix(), "basic")
    msg = open_error(binary, f"kvstore://127.0.0.1:{srv.port}")
    assert "NOAUTH" in msg and "give the password in the URL: kvstore://:PASSWORD@HOST:PORT" in msg, msg
    msg = open_error(binary, f"kvstore://:wrong@127.0.0.1:{srv.port}")
    assert msg.startswith(f"{-13}:") and "AUTH refused" in msg, msg


def open_error(binary, url):
    out = run(binary, url, "nbd:", "openfail")
    return out.split("open failed: ", 1)[1]


def test_open_errors(binary, server_of):
    red = server_of("redis", password=PASSWORD)
    mc = server_of("memcached")
    port = red.port
    msg = open_error(binary, f"redis://:wrong@127.0.0.1:{port}")
    assert msg.startswith(f"{-13}:") and "AUTH refused: WRONGPASS" in msg, msg      # -EACCES
    msg = open_error(binary, f"redis://127.0.0.1:{port}")
    assert "INFO refused: NOAUTH" in msg and "give the password in the URL: redis://:PASSWORD@HOST:PORT" in msg, msg
    msg = open_error(binary, f"kvstore://:{PASSWORD}@127.0.0.1:{port}")
    assert "is not a kvstore node" in msg and "redis://" in msg, msg
    msg = open_error(binary, f"redis://127.0.0.1:{mc.port}")
    assert "unexpected reply" in msg, msg
    msg = open_error(binary, f"memcached://:pw@127.0.0.1:{mc.port}")
    assert "no password accepted" in msg, msg
    msg = open_error(binary, f"redis://127.0.0.1:{free_port()}")
    assert "cannot connect to redis://127.0.0.1:" in msg and "refused" in msg, msg


class Driver:
    """nbd_backend_test in an interactive mode: it says a word and waits for a line."""

    def __init__(self, binary, *args):
        self.child = subprocess.Popen([str(binary), *map(str, args)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env={**os.environ, **ENV})
        self.said = []

    def expect(self, word):
        while True:
            line = self.child.stdout.readline()  # the child fails by itself within 20 s
            if not line:
                break
            self.said.append(line)
            if line.strip() == word:
                return
            if line.startswith("FAIL"):
                break
        self.child.kill()
        pytest.fail(f"no {word}: " + "".join(self.said) + self.child.stderr.read()[-4000:])

    def reply(self):
        self.child.stdin.write("go\n")
        self.child.stdin.flush()

    def finish(self):
        out, err = self.child.communicate(timeout=90)
        out = "".join(self.said) + out
        bad = [m for m in SANITIZER_MARKERS if m in err]
        assert self.child.returncode == 0 and not bad and out.rstrip().endswith("ok"), out + err[-4000:]
        return out, err

    def close(self):
        if self.child.poll() is None:
            self.child.kill()
            self.child.wait()


@pytest.mark.parametrize("kind, durability", [("redis", "none"), ("memcached", "none"), ("kvstore", "disk")])
def test_server_killed_mid_flight(binary, server_of, kind, durability):
    srv = server_of(kind, durability=durability)
    d = Driver(binary, srv.url, prefix(), "kill", *(["durable"] if durability == "disk" else []))
    try:
        d.expect("FREEZE")
        stop_process(srv.pid)  # requests pile up unanswered (every thread stopped before they are sent)
        d.reply()
        d.expect("KILL")
        srv.stop(sig=signal.SIGKILL)      # the kernel resets its connections
        d.reply()
        d.expect("RESTART")
        srv.start()                       # the same port (and data dir)
        d.reply()
        out, err = d.finish()
    finally:
        d.close()
    assert "failed with EIO" in out and "reconnected" in out
    assert "lost:" in err  # the log line that says why


@pytest.mark.parametrize("kind", ["redis", "memcached"])
def test_server_stops_answering(binary, server_of, kind):
    srv = server_of(kind)
    d = Driver(binary, srv.url, prefix(), "stall")
    try:
        d.expect("FREEZE")
        stop_process(srv.pid)
        d.reply()
        d.expect("THAW")
        os.kill(srv.pid, signal.SIGCONT)
        d.reply()
        out, err = d.finish()
    finally:
        d.close()
        if srv.proc and srv.proc.proc:
            os.kill(srv.pid, signal.SIGCONT)
    assert "unanswered requests failed" in out and "reconnected" in out
    assert "the server stopped answering" in err


# ---------------------------------------------------------------- a scripted server

def block_bytes(block, gen=1, bs=4096):
    """nbd_backend_test.c's fill(): the bytes a test block holds."""
    mask = (1 << 64) - 1
    s = (block * 0x9E3779B97F4A7C15 + gen + 1) & mask
    out = bytearray()
    for _ in range(bs // 8):
        s ^= (s << 13) & mask
        s ^= s >> 7
        s ^= (s << 17) & mask
        out += s.to_bytes(8, "little")
    return bytes(out)


def good(block):
    return b"$4096\r\n" + block_bytes(block) + b"\r\n"


class FakeRedis:
    """Answers INFO as Redis would and GET <prefix><n> with script(n): bytes sent in
    pieces (every boundary of the first 12 and last 4 bytes, and the middle), so that
    the client sees each reply cut at each place a header or trailer can be cut."""
    scheme = "redis"

    def __init__(self, script):
        self.script = script
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()

    @staticmethod
    def _command(buf):
        """One RESP array of bulk strings from buf: (args, rest), or (None, buf)."""
        if b"\r\n" not in buf:
            return None, buf
        head, rest = buf.split(b"\r\n", 1)
        args = []
        for _ in range(int(head[1:])):
            if b"\r\n" not in rest:
                return None, buf
            ln, rest2 = rest.split(b"\r\n", 1)
            n = int(ln[1:])
            if len(rest2) < n + 2:
                return None, buf
            args.append(rest2[:n])
            rest = rest2[n + 2:]
        return args, rest

    def _reply(self, args):
        if args[0].upper() == b"INFO":
            text = b"# Server\r\nredis_version:7.0.0\r\n"
            return b"$%d\r\n%s\r\n" % (len(text), text)
        if args[0].upper() == b"GET":
            if args[1].endswith(b":meta"):  # the device's record, at open: none yet (the SET is +OK)
                return b"$-1\r\n"
            return self.script(int(args[1].rsplit(b":", 1)[1]))
        return b"+OK\r\n"

    def _send(self, conn, data):
        cuts = sorted({*range(1, min(12, len(data))), len(data) // 2, *range(max(1, len(data) - 4), len(data))})
        last = 0
        for cut in cuts + [len(data)]:
            conn.sendall(data[last:cut])
            last = cut
            time.sleep(0.001)

    def _serve(self, conn):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while True:
                    args, buf = self._command(buf)
                    if args is None:
                        break
                    reply = self._reply(args)
                    try:
                        self._send(conn, reply)
                    except OSError:
                        return

    def close(self):
        self.sock.close()


class FakeMemcached(FakeRedis):
    """The same for memcached's text protocol: "version", and "mg <prefix><n> v"."""
    scheme = "memcached"

    @staticmethod
    def _command(buf):
        if b"\r\n" not in buf:
            return None, buf
        line, rest = buf.split(b"\r\n", 1)
        args = line.split()
        if args[:1] == [b"ms"]:  # the device's record, at open: its data follows
            n = int(args[2]) + 2
            if len(rest) < n:
                return None, buf
            rest = rest[n:]
        return args, rest

    def _reply(self, args):
        if args[0] == b"version":
            return b"VERSION 1.6.18\r\n"
        if args[0] == b"ms":
            return b"HD\r\n"
        if args[0] == b"mg":
            if args[1].endswith(b":meta"):
                return b"EN\r\n"
            return self.script(int(args[1].rsplit(b":", 1)[1]))
        return b"ERROR\r\n"


def probe(binary, script, k, fake_class=FakeRedis):
    fake = fake_class(script)
    try:
        r = subprocess.run([str(binary), f"{fake.scheme}://127.0.0.1:{fake.port}", "fake:", "probe", str(k)],
                           capture_output=True,
                           text=True, errors="replace", env={**os.environ, **ENV}, timeout=120)
    finally:
        fake.close()
    bad = [m for m in SANITIZER_MARKERS if m in r.stderr]
    assert r.returncode == 0 and not bad and r.stdout.rstrip().endswith("ok"), r.stdout + r.stderr[-4000:]
    return r.stdout.splitlines(), r.stderr


def test_replies_cut_anywhere(binary):
    lines, _ = probe(binary, lambda n: good(n) if n % 2 == 0 else b"$-1\r\n", 6)
    assert lines[:6] == [f"get {i} rc=0 {'block' if i % 2 == 0 else 'zeros'}" for i in range(6)]


@pytest.mark.parametrize("reply, rc, log", [
    (b"x" * 2000, -5, "reply line longer than 1024 bytes"),
    (b"$-5\r\n", -5, 'unexpected reply "$-5"'),
    (b"*1\r\n$1\r\na\r\n", -5, 'unexpected reply "*1"'),
    (b"$536870913\r\n", -5, "unexpected reply"),                     # past Redis's largest bulk string
    (b"$4096\r\n" + block_bytes(1) + b"XY", -5, "payload not followed by CRLF"),
    (b"+OK\r\n+OK\r\n", -5, "a reply to no request"),               # one reply too many
    (b"\n", -5, "malformed reply line"),
    (b"$10\r\n0123456789\r\n", -5, "block 1 has 10 bytes, not 4096"),  # not a block: the connection goes on
    (b"-ERR boom\r\n", -5, "GET refused: ERR boom"),
    (b"-OOM no room\r\n", -28, "GET refused: OOM no room"),          # -ENOSPC
])
def test_bad_replies(binary, reply, rc, log):
    lines, err = probe(binary, lambda n: reply if n == 1 else good(n), 3)
    assert lines[0] == "get 0 rc=0 block"
    assert lines[1] == f"get {1} rc={rc} -"
    assert lines[-2] == "recovered: block"
    assert log in err, err[-3000:]


def mc_good(block):
    return b"VA 4096 f0\r\n" + block_bytes(block) + b"\r\n"


def test_memcached_replies_cut_anywhere(binary):
    lines, _ = probe(binary, lambda n: mc_good(n) if n % 2 == 0 else b"EN\r\n", 6, FakeMemcached)
    assert lines[:6] == [f"get {i} rc=0 {'block' if i % 2 == 0 else 'zeros'}" for i in range(6)]


@pytest.mark.parametrize("reply, rc, log", [
    (b"CLIENT_ERROR bad command line format\r\n", -5, 'unexpected reply "CLIENT_ERROR'),  # out of step after it
    (b"ERROR\r\n", -5, 'unexpected reply "ERROR"'),
    (b"VA x\r\n", -5, "unexpected reply"),
    (b"VA\r\n", -5, 'unexpected reply "VA"'),                        # no size (refused before strtol)
    (b"VA 1073741825\r\n", -5, "unexpected reply"),
    (b"VA 4096\r\n" + block_bytes(1) + b"\n\n", -5, "payload not followed by CRLF"),
    (b"HDX\r\n", -5, "unexpected reply"),
    (b"VA 3\r\nabc\r\n", -5, "block 1 has 3 bytes, not 4096"),
    (b"HD\r\n", -5, "block 1: Input/output error"),                 # a hit without the value asked for
    (b"SERVER_ERROR out of memory storing object\r\n", -28, "SERVER_ERROR out of memory"),
    (b"SERVER_ERROR busy\r\n", -5, "SERVER_ERROR busy"),
])
def test_memcached_bad_replies(binary, reply, rc, log):
    lines, err = probe(binary, lambda n: reply if n == 1 else mc_good(n), 3, FakeMemcached)
    assert lines[0] == "get 0 rc=0 block"
    assert lines[1] == f"get 1 rc={rc} -"
    assert lines[-2] == "recovered: block"
    assert log in err, err[-3000:]


def test_old_memcached_refused(binary):
    class Old(FakeMemcached):
        def _reply(self, args):
            return b"VERSION 1.5.22\r\n" if args[0] == b"version" else super()._reply(args)
    fake = Old(mc_good)
    try:
        msg = open_error(binary, f"memcached://127.0.0.1:{fake.port}")
    finally:
        fake.close()
    assert "memcached 1.5.22 has no meta commands (mg/ms/md): 1.6 or later is needed" in msg, msg
