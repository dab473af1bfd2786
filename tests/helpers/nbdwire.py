"""The NBD protocol from the client side, byte by byte, for conformance and fuzz tests: the
fixed-newstyle handshake a step at a time, options and their replies, requests, simple replies
and structured reply chunks (reassembled, and checked against the rules the protocol document
sets for them: a server that breaks one raises Violation). Written from the NBD protocol
document (NetworkBlockDevice/nbd doc/proto.md), not from any server's code, so a test that
agrees with it checks the server against the spec. Also starts the servers the tests speak to:
`nbdkit memory` (the reference) and `kvstore blockdev serve`. Used by tests only."""
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

from kvstore.process import Process

# ---- handshake
NBDMAGIC = 0x4E42444D41474943          # "NBDMAGIC"
IHAVEOPT = 0x49484156454F5054          # "IHAVEOPT"
REPLY_MAGIC = 0x3E889045565A9          # option replies
FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES = 1 << 0, 1 << 1            # handshake flags
FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES = 1 << 0, 1 << 1        # client flags

OPT_EXPORT_NAME, OPT_ABORT, OPT_LIST, OPT_PEEK_EXPORT, OPT_STARTTLS = 1, 2, 3, 4, 5
OPT_INFO, OPT_GO, OPT_STRUCTURED_REPLY = 6, 7, 8
OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT, OPT_EXTENDED_HEADERS = 9, 10, 11

REP_ACK, REP_SERVER, REP_INFO, REP_META_CONTEXT = 1, 2, 3, 4
REP_ERR = 1 << 31
REP_ERR_UNSUP, REP_ERR_POLICY, REP_ERR_INVALID, REP_ERR_PLATFORM = REP_ERR + 1, REP_ERR + 2, REP_ERR + 3, REP_ERR + 4
REP_ERR_TLS_REQD, REP_ERR_UNKNOWN, REP_ERR_SHUTDOWN = REP_ERR + 5, REP_ERR + 6, REP_ERR + 7
REP_ERR_BLOCK_SIZE_REQD, REP_ERR_TOO_BIG = REP_ERR + 8, REP_ERR + 9

INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE = 0, 1, 2, 3

# ---- transmission flags
TF_HAS_FLAGS, TF_READ_ONLY, TF_SEND_FLUSH, TF_SEND_FUA = 1 << 0, 1 << 1, 1 << 2, 1 << 3
TF_ROTATIONAL, TF_SEND_TRIM, TF_SEND_WRITE_ZEROES, TF_SEND_DF = 1 << 4, 1 << 5, 1 << 6, 1 << 7
TF_CAN_MULTI_CONN, TF_SEND_RESIZE, TF_SEND_CACHE, TF_SEND_FAST_ZERO = 1 << 8, 1 << 9, 1 << 10, 1 << 11

# ---- requests and replies
REQUEST_MAGIC, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC = 0x25609513, 0x67446698, 0x668E33EF
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM, CMD_CACHE = 0, 1, 2, 3, 4, 5
CMD_WRITE_ZEROES, CMD_BLOCK_STATUS, CMD_RESIZE = 6, 7, 8
CMD_FLAG_FUA, CMD_FLAG_NO_HOLE, CMD_FLAG_DF = 1 << 0, 1 << 1, 1 << 2
CMD_FLAG_REQ_ONE, CMD_FLAG_FAST_ZERO = 1 << 3, 1 << 4
REPLY_FLAG_DONE = 1 << 0
REPLY_TYPE_NONE, REPLY_TYPE_OFFSET_DATA, REPLY_TYPE_OFFSET_HOLE = 0, 1, 2
REPLY_TYPE_BLOCK_STATUS = 5
REPLY_TYPE_ERROR, REPLY_TYPE_ERROR_OFFSET = (1 << 15) + 1, (1 << 15) + 2

# ---- error values (the protocol's, not the platform's errno)
EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN = 1, 5, 12, 22, 28, 75, 95, 108
ERRNAMES = {EPERM: "EPERM", EIO: "EIO", ENOMEM: "ENOMEM", EINVAL: "EINVAL", ENOSPC: "ENOSPC",
            EOVERFLOW: "EOVERFLOW", ENOTSUP: "ENOTSUP", ESHUTDOWN: "ESHUTDOWN"}

DESCRIPTION = "kvstore conformance export"   # what both servers are told to describe the export as
MAX_PAYLOAD = 32 << 20     # the largest request payload our server takes (its INFO_BLOCK_SIZE maximum)

REQ_HDR = struct.Struct(">IHHQQI")       # magic, flags, type, handle, offset, length
SIMPLE_HDR = struct.Struct(">IIQ")       # magic, error, handle
CHUNK_HDR = struct.Struct(">IHHQI")      # magic, flags, type, handle, length
OPT_HDR = struct.Struct(">QII")          # IHAVEOPT, option, length
OPT_REPLY_HDR = struct.Struct(">QIII")   # magic, option, reply type, length


class Closed(Exception):
    """The server closed the connection (EOF or reset) while we waited for bytes."""


class Violation(AssertionError):
    """The server sent bytes the NBD protocol document does not allow."""


def request(cmd, offset=0, length=0, flags=0, handle=1, magic=REQUEST_MAGIC):
    """The 28 bytes of a request header (the payload of a WRITE goes after it)."""
    return REQ_HDR.pack(magic, flags, cmd, handle, offset, length)


def option(opt, data=b"", length=None, magic=IHAVEOPT):
    """An option as the client sends it; `length` may lie about len(data)."""
    return OPT_HDR.pack(magic, opt, len(data) if length is None else length) + data


def info_data(name, infos=()):
    """The data of NBD_OPT_INFO / NBD_OPT_GO: the export name and the info types asked for."""
    name = name.encode() if isinstance(name, str) else name
    return struct.pack(">I", len(name)) + name + struct.pack(">H", len(infos)) + b"".join(
        struct.pack(">H", i) for i in infos)


class OptReply:
    """One option reply: .opt (echoed), .type (REP_*), .data; .is_error for the REP_ERR_* ones."""

    def __init__(self, opt, rtype, data):
        self.opt, self.type, self.data = opt, rtype, data

    @property
    def is_error(self):
        return bool(self.type & REP_ERR)

    def __repr__(self):
        return f"OptReply(opt={self.opt}, type={self.type:#x}, data={self.data[:64]!r})"


class Reply:
    """A request's whole reply. .error: 0 or the protocol's error value; .data: a READ's bytes
    (reassembled from its chunks); .structured; .chunks: [(flags, type, payload)];
    .message: an error chunk's text."""

    def __init__(self, handle, error=0, data=None, structured=False, chunks=(), message=""):
        self.handle, self.error, self.data = handle, error, data
        self.structured, self.chunks, self.message = structured, list(chunks), message

    def __repr__(self):
        return (f"Reply(handle={self.handle}, error={ERRNAMES.get(self.error, self.error)}, "
                f"structured={self.structured}, chunks={[(f, t, len(p)) for f, t, p in self.chunks]}, "
                f"message={self.message!r})")


class Export:
    """What the handshake ended with: .size, .flags (transmission), .info {type: data}."""

    def __init__(self, size, flags, info=None):
        self.size, self.flags, self.info = size, flags, info or {}

    def block_size(self):
        """(minimum, preferred, maximum) from NBD_INFO_BLOCK_SIZE, or None."""
        d = self.info.get(INFO_BLOCK_SIZE)
        return struct.unpack(">III", d) if d is not None else None


def parse_infos(replies):
    """{info type: its data} from NBD_REP_INFO replies; raises Violation on a malformed one."""
    out = {}
    for r in replies:
        if r.type != REP_INFO:
            continue
        if len(r.data) < 2:
            raise Violation(f"NBD_REP_INFO shorter than its type field: {r}")
        itype, = struct.unpack(">H", r.data[:2])
        body = r.data[2:]
        want = {INFO_EXPORT: 10, INFO_BLOCK_SIZE: 12}.get(itype)
        if want is not None and len(body) != want:
            raise Violation(f"NBD_INFO type {itype} has {len(body)} bytes, the spec says {want}")
        out[itype] = body
    return out


class Conn:
    """One client connection to an NBD server. addr: a unix socket path (str) or (host, port).
    Every receive waits at most `timeout` seconds (socket.timeout is a test failure: the
    server neither answered nor closed)."""

    def __init__(self, addr, timeout=10.0):
        if isinstance(addr, str):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(addr)
        self.hflags = None
        self.structured = False
        self.export = None
        self._handle = 0
        self._pending = {}     # handle -> (cmd, offset, length) of requests not answered yet
        self._partial = {}     # handle -> Reply being assembled from structured chunks
        self._done = {}        # handle -> Reply finished while waiting for another one

    # ---- bytes
    def send(self, data):
        try:
            self.sock.sendall(data)
        except (ConnectionResetError, BrokenPipeError) as e:
            raise Closed(str(e)) from e

    def recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            except (ConnectionResetError, BrokenPipeError) as e:
                raise Closed(str(e)) from e
            if not chunk:
                raise Closed(f"EOF after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def closed_by_server(self, timeout=5.0):
        """True once the server closes the connection (EOF or reset) within timeout; bytes it
        sends meanwhile are read and dropped. False if it is still open after timeout."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.sock.settimeout(left)
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- handshake
    def greeting(self):
        """Read the server's first 18 bytes; returns the handshake flags (checked)."""
        magic, optmagic, hflags = struct.unpack(">QQH", self.recv_exact(18))
        if magic != NBDMAGIC or optmagic != IHAVEOPT:
            raise Violation(f"greeting magics {magic:#x} {optmagic:#x} (oldstyle or garbage)")
        if hflags & ~(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES):
            raise Violation(f"handshake flags {hflags:#x} set bits the spec does not define")
        self.hflags = hflags
        return hflags

    def client_flags(self, flags=FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES):
        self.send(struct.pack(">I", flags))
        self.cflags = flags

    def send_option(self, opt, data=b"", length=None):
        self.send(option(opt, data, length))

    def recv_option_reply(self, expect_opt=None):
        magic, opt, rtype, length = OPT_REPLY_HDR.unpack(self.recv_exact(OPT_REPLY_HDR.size))
        if magic != REPLY_MAGIC:
            raise Violation(f"option reply magic {magic:#x}")
        if expect_opt is not None and opt != expect_opt:
            raise Violation(f"option reply for option {opt}, the client sent option {expect_opt}")
        data = self.recv_exact(length) if length else b""
        return OptReply(opt, rtype, data)

    def option_replies(self, opt, data=b"", length=None):
        """Send an option, read its replies up to the final one (an ACK or an error; LIST's
        SERVER and INFO/GO's INFO replies come before it). Returns the list, final last."""
        self.send_option(opt, data, length)
        out = []
        while True:
            r = self.recv_option_reply(opt)
            out.append(r)
            if r.type not in (REP_SERVER, REP_INFO, REP_META_CONTEXT):
                return out

    def export_name(self, name=""):
        """NBD_OPT_EXPORT_NAME: the server answers with size and flags (and the 124 zero bytes
        unless both sides set NO_ZEROES) and transmission begins. Returns the Export."""
        self.send_option(OPT_EXPORT_NAME, name.encode())
        size, tflags = struct.unpack(">QH", self.recv_exact(10))
        no_zeroes = bool(self.hflags & FLAG_NO_ZEROES) and bool(self.cflags & FLAG_C_NO_ZEROES)
        if not no_zeroes:
            pad = self.recv_exact(124)
            if pad != bytes(124):
                raise Violation("the 124 reserved bytes after NBD_OPT_EXPORT_NAME are not zeros")
        self.export = Export(size, tflags)
        return self.export

    def info(self, name="", infos=(), go=False):
        """NBD_OPT_INFO (or _GO): (replies, Export or None on an error reply)."""
        opt = OPT_GO if go else OPT_INFO
        replies = self.option_replies(opt, info_data(name, infos))
        final = replies[-1]
        if final.is_error:
            return replies, None
        if final.type != REP_ACK:
            raise Violation(f"{'GO' if go else 'INFO'} ended with reply type {final.type:#x}")
        infos_got = parse_infos(replies)
        if INFO_EXPORT not in infos_got:
            raise Violation("a successful INFO/GO without NBD_INFO_EXPORT")
        size, tflags = struct.unpack(">QH", infos_got[INFO_EXPORT])
        exp = Export(size, tflags, infos_got)
        if go:
            self.export = exp
        return replies, exp

    def structured_reply(self):
        """NBD_OPT_STRUCTURED_REPLY; True when the server agreed (ACK)."""
        r = self.option_replies(OPT_STRUCTURED_REPLY)[-1]
        self.structured = r.type == REP_ACK
        return self.structured

    def handshake(self, name="", structured=False, infos=(INFO_BLOCK_SIZE,)):
        """The whole handshake the usual way: greeting, fixed newstyle + no zeroes,
        optionally structured replies, GO. Returns the Export."""
        self.greeting()
        self.client_flags(FLAG_C_FIXED_NEWSTYLE | (FLAG_C_NO_ZEROES if self.hflags & FLAG_NO_ZEROES else 0))
        if structured and not self.structured_reply():
            raise Violation("the server refused NBD_OPT_STRUCTURED_REPLY")
        replies, exp = self.info(name, infos, go=True)
        if exp is None:
            raise AssertionError(f"GO {name!r} failed: {replies}")
        return exp

    # ---- transmission
    def send_request(self, cmd, offset=0, length=0, flags=0, data=b"", handle=None):
        """Send one request (a WRITE's payload after it); returns its handle."""
        if handle is None:
            self._handle += 1
            handle = self._handle
        self._pending[handle] = (cmd, offset, length)
        self.send(request(cmd, offset, length, flags, handle) + data)
        return handle

    def expect_reply(self, handle, cmd, offset=0, length=0):
        """Register a request sent as raw bytes (not by send_request) so that its reply parses."""
        self._pending[handle] = (cmd, offset, length)

    def recv_reply(self, handle=None):
        """The whole reply to `handle` (default: whichever finishes first). Replies to other
        requests met on the way are kept for their own recv_reply."""
        if handle is not None and handle in self._done:
            return self._done.pop(handle)
        if handle is None and self._done:
            return self._done.pop(next(iter(self._done)))
        while True:
            r = self._recv_message()
            if r is None:
                continue
            if handle is None or r.handle == handle:
                return r
            self._done[r.handle] = r

    def _recv_message(self):
        """Read one simple reply or one chunk; returns the Reply it finished, or None."""
        magic, = struct.unpack(">I", self.recv_exact(4))
        if magic == SIMPLE_REPLY_MAGIC:
            error, handle = struct.unpack(">IQ", self.recv_exact(12))
            cmd, _, length = self._take_pending(handle, "simple reply")
            if self.structured and cmd == CMD_READ:
                raise Violation("a simple reply to NBD_CMD_READ after structured replies were negotiated")
            data = None
            if cmd == CMD_READ and error == 0:
                data = self.recv_exact(length)
            return Reply(handle, error, data)
        if magic == STRUCTURED_REPLY_MAGIC:
            if not self.structured:
                raise Violation("a structured reply chunk without NBD_OPT_STRUCTURED_REPLY")
            flags, rtype, handle, length = struct.unpack(">HHQI", self.recv_exact(16))
            payload = self.recv_exact(length) if length else b""
            return self._chunk(handle, flags, rtype, payload)
        raise Violation(f"reply magic {magic:#x}")

    def _take_pending(self, handle, what):
        if handle not in self._pending:
            raise Violation(f"{what} for handle {handle:#x}, which no request in flight has")
        return self._pending.pop(handle)

    def _chunk(self, handle, flags, rtype, payload):
        if handle not in self._pending:
            raise Violation(f"structured chunk for handle {handle:#x}, which no request in flight has")
        cmd, off, length = self._pending[handle]
        r = self._partial.get(handle)
        if r is None:
            r = self._partial[handle] = Reply(handle, structured=True,
                                              data=bytearray(length) if cmd == CMD_READ else None)
            r.covered = []
        r.chunks.append((flags, rtype, payload))
        if rtype == REPLY_TYPE_NONE:
            if payload or not flags & REPLY_FLAG_DONE:
                raise Violation(f"NBD_REPLY_TYPE_NONE with {len(payload)} bytes, flags {flags:#x}")
        elif rtype in (REPLY_TYPE_OFFSET_DATA, REPLY_TYPE_OFFSET_HOLE):
            if cmd != CMD_READ:
                raise Violation(f"content chunk type {rtype} in the reply to command {cmd}")
            if rtype == REPLY_TYPE_OFFSET_DATA:
                if len(payload) < 9:
                    raise Violation(f"OFFSET_DATA chunk of {len(payload)} bytes (at least 9)")
                coff, = struct.unpack(">Q", payload[:8])
                clen, body = len(payload) - 8, payload[8:]
            else:
                if len(payload) != 12:
                    raise Violation(f"OFFSET_HOLE chunk of {len(payload)} bytes (exactly 12)")
                coff, clen = struct.unpack(">QI", payload)
                if clen == 0:
                    raise Violation("OFFSET_HOLE of size 0")
                body = bytes(clen)
            if coff < off or coff + clen > off + length:
                raise Violation(f"content chunk [{coff}, +{clen}) outside the request [{off}, +{length})")
            for a, b in r.covered:
                if coff < b and a < coff + clen:
                    raise Violation(f"content chunk [{coff}, +{clen}) overlaps an earlier one [{a}, {b})")
            r.covered.append((coff, coff + clen))
            r.data[coff - off:coff - off + clen] = body
        elif rtype & (1 << 15):
            if len(payload) < 6:
                raise Violation(f"error chunk of {len(payload)} bytes (at least 6)")
            err, mlen = struct.unpack(">IH", payload[:6])
            extra = 8 if rtype == REPLY_TYPE_ERROR_OFFSET else 0
            if mlen > len(payload) - 6 - extra:
                raise Violation(f"error chunk message length {mlen} past its payload ({len(payload)})")
            if rtype not in (REPLY_TYPE_ERROR, REPLY_TYPE_ERROR_OFFSET) or err == 0:
                raise Violation(f"error chunk type {rtype:#x}, error {err}")
            r.error = r.error or err
            r.message = payload[6:6 + mlen].decode(errors="replace")
        else:
            raise Violation(f"structured chunk type {rtype} not defined for this request")
        if not flags & REPLY_FLAG_DONE:
            return None
        del self._pending[handle], self._partial[handle]
        if cmd == CMD_READ:
            if r.error == 0:
                got = sum(b - a for a, b in r.covered)
                if got != length:
                    raise Violation(f"READ of {length} bytes ended without error with {got} bytes of content")
            r.data = bytes(r.data) if r.error == 0 else None
        return r

    def request(self, cmd, offset=0, length=0, flags=0, data=b""):
        """Send a request and wait for its reply."""
        return self.recv_reply(self.send_request(cmd, offset, length, flags, data))

    def read(self, offset, length, flags=0):
        return self.request(CMD_READ, offset, length, flags)

    def write(self, offset, data, flags=0):
        return self.request(CMD_WRITE, offset, len(data), flags, data)

    def disconnect(self):
        self.send(request(CMD_DISC, handle=0xD15C))


# ---------------------------------------------------------------- servers under test

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KINDS = ["nbdkit", "kvstore", "kvstore-tcp"]   # the reference first; ours on a unix socket and TCP


def start(kind, **kw):
    """A started Target; the test is skipped when its server is not installed (nbdkit) or
    not built yet (`kvstore blockdev serve`, before the server lands)."""
    import pytest
    if kind.startswith("nbdkit") and shutil.which("nbdkit") is None:
        pytest.skip("nbdkit is not installed (make deps installs it)")
    parts = [os.path.join("ext", "frontend", "nbd.c"), os.path.join("cli", "blockdev.py")]
    missing = [p for p in parts if not os.path.exists(os.path.join(ROOT, p))]
    if kind.startswith("kvstore") and missing:
        # only while the tree lacks the server or its command: once both are in, a build that
        # cannot serve fails these tests instead
        pytest.skip(f"this tree has no `kvstore blockdev serve` yet ({', '.join(missing)} missing)")
    return Target(kind, **kw).start()


class Target:
    """An NBD server for the tests. kind: "nbdkit" or "kvstore" (its .kind), on a unix socket,
    or with "-tcp" on 127.0.0.1 (.tcp). .addr: what Conn connects to (a socket path or
    (host, port)); .size, .export, .read_only; start() -> self, stop(), alive()."""

    def __init__(self, kind, size=64 << 20, export="kvstore", read_only=False, block_size=4096):
        self.kind, _, transport = kind.partition("-")
        self.tcp = transport == "tcp"
        self.size, self.export, self.read_only = size, export, read_only
        self.block_size = block_size
        self.dir = tempfile.mkdtemp(prefix=f"nbd-{kind}-")
        self.sock_path = os.path.join(self.dir, "nbd.sock")
        self.addr = self.sock_path
        self.proc = None

    def argv(self):
        if self.kind == "nbdkit":
            # The filters make nbdkit's export name strict and its block size limits those
            # our server advertises, so that the same checks hold for both.
            where = ["-i", "127.0.0.1", "-p", str(self.addr[1])] if self.tcp else ["-U", self.sock_path]
            return ["nbdkit", "-f", *where, "-e", self.export, "--exit-with-parent",
                    "--filter=exportname", "--filter=blocksize-policy"] + \
                (["-r"] if self.read_only else []) + \
                ["memory", str(self.size), f"exportname={self.export}", "exportname=", "exportname-strict=true",
                 "exportname-list=explicit", f"exportdesc=fixed:{DESCRIPTION}",
                 "blocksize-minimum=1", f"blocksize-preferred={self.block_size}",
                 f"blocksize-maximum={MAX_PAYLOAD}", "blocksize-error-policy=error"]
        return [sys.executable, "-m", "kvstore.cli", "blockdev", "serve", "--size", str(self.size),
                "--backend", "embedded", *(["--listen", "127.0.0.1:0"] if self.tcp else ["--unix", self.sock_path]),
                "--export", self.export, "--description", DESCRIPTION,
                "--block-size", str(self.block_size), "--threads", "2",
                "--durability", "none", "--data-dir", os.path.join(self.dir, "data"),
                "--port", "0"] + (["--read-only"] if self.read_only else [])

    def start(self, timeout=60.0):
        if self.kind == "nbdkit":
            if self.tcp:
                from .servers import free_port
                self.addr = ("127.0.0.1", free_port())
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=open(os.path.join(self.dir, "nbdkit.log"), "wb"))
            deadline = time.monotonic() + timeout
            while not self._connectable():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nbdkit did not start: {self.log()}")
                time.sleep(0.05)
            return self
        ready = rb"kvstore blockdev listening on nbd://127\.0\.0\.1:(\d+)/" if self.tcp else \
            rb"kvstore blockdev listening on nbd\+unix:///"
        self.proc = Process(self.argv(), ready_line=ready, log_path=os.path.join(self.dir, "serve.log"),
                            name="kvstore-blockdev")
        self.proc.start(timeout)
        if self.tcp:
            self.addr = ("127.0.0.1", int(self.proc.match.group(1)))
        return self

    def _connectable(self):
        try:
            with socket.socket(socket.AF_INET if self.tcp else socket.AF_UNIX) as s:
                s.connect(self.addr)
            return True
        except OSError:
            return False

    @property
    def pid(self):
        return self.proc.pid if self.proc is not None else None

    def alive(self):
        if self.kind == "nbdkit":
            return self.proc is not None and self.proc.poll() is None
        return self.proc is not None and self.proc.running

    def log_path(self):
        return os.path.join(self.dir, "nbdkit.log" if self.kind == "nbdkit" else "serve.log")

    def log(self, since=0, tail=4000):
        """The server's log (stderr) from byte `since` on, at most its last `tail` characters."""
        try:
            with open(self.log_path(), "rb") as f:
                f.seek(since)
                return f.read().decode(errors="replace")[-tail:]
        except FileNotFoundError:
            return ""

    def log_mark(self):
        """Where the log ends now: log_since(mark) returns what is written after it."""
        try:
            return os.path.getsize(self.log_path())
        except FileNotFoundError:
            return 0

    def log_since(self, mark, timeout=5.0):
        """The log lines written after mark, waiting up to timeout for the first."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.log(mark, tail=1 << 20)
            if "\n" in text or time.monotonic() > deadline:
                return text
            time.sleep(0.05)

    def stop(self):
        if self.proc is not None:
            if self.kind == "nbdkit":
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            else:
                self.proc.stop()
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def connect(self, timeout=10.0):
        return Conn(self.addr, timeout)

    def open(self, structured=False, name=None):
        """A connection through the usual handshake (GO to this export)."""
        c = self.connect()
        c.handshake(self.export if name is None else name, structured=structured)
        return c
