"""Helpers for the durability fault-injection tests (the fixtures built on them are in
tests/faults/conftest.py).

  - crc32c / parse_segment: an independent reader of the log format in ext/wal.h
  - start_disk_node: a kvstore.Node on a data dir (a fresh Node object each time)
  - run_serve / run_recover: `kvstore serve` / `kvstore recover` as plain processes,
    for the cases where the server must refuse to start
  - parse_recovery: the "recovered N records ..." line
  - recovery_of, persistence, mget_all, write_keys: a served node's recovery line,
    INFO persistence, and keys read or written with redis-py
"""
import contextlib
import os
import re
import select
import struct
import subprocess
import sys
import tempfile
import time

from kvstore import Node

from .conn import client

SEG_HDR = 16
REC_HDR = 32
REC_TRAILER = 8
MAGIC = b"KVSWAL02"
MAGIC_ZEROED = b"KVSWAL03"  # a segment prepared over zeros and written in place: its records end at the zeros
# Record header (ext/wal.h): 0 u32 crc | 4 u32 hcrc | 8 u32 klen | 12 u32 vlen | 16 u8 op |
# 17 u8 pad[3] | 20 i64 expire_ms | 28 u32 zero; then key, value, u64 lsn.
# hcrc = CRC32C(header[8:32]); crc = CRC32C(record[4:]).
OFF_CRC, OFF_HCRC, OFF_KLEN, OFF_VLEN, OFF_OP, OFF_EXPIRE = 0, 4, 8, 12, 16, 20
OP_SET, OP_DEL, OP_FLUSH = 1, 2, 3

# ---------------------------------------------------------------- CRC32C (Castagnoli)

_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    t = _CRC_TABLE
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the standard check value


# ---------------------------------------------------------------- the log format

class Record:
    def __init__(self, off, length, op, key, value, expire_ms, lsn, raw=b""):
        self.off, self.length, self.op, self.raw = off, length, op, raw
        self.key, self.value, self.expire_ms, self.lsn = key, value, expire_ms, lsn

    @property
    def end(self):
        return self.off + self.length

    def __repr__(self):
        return f"Record(off={self.off}, len={self.length}, op={self.op}, key={self.key!r}, lsn={self.lsn})"


def encode_record(op, key, value, lsn, expire_ms=0):
    """A record exactly as the server writes it."""
    h = struct.pack("<IIB3xqI", len(key), len(value), op, expire_ms, 0)   # header bytes 8..31
    body = struct.pack("<I", crc32c(h)) + h + key + value + struct.pack("<Q", lsn)
    return struct.pack("<I", crc32c(body)) + body


def parse_segment(path):
    """(first LSN from the header, [Record]) of a segment whose every record is valid.
    Raises AssertionError on anything else: the tests parse logs the server wrote."""
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) >= SEG_HDR and data[:8] in (MAGIC, MAGIC_ZEROED), f"{path}: bad header {data[:16]!r}"
    first = struct.unpack_from("<Q", data, 8)[0]
    recs, off = [], SEG_HDR
    while off < len(data):
        if data[:8] == MAGIC_ZEROED and not data[off:off + REC_HDR].strip(b"\0") and not data[off:].strip(b"\0"):
            break  # the zeros after the last record
        assert off + REC_HDR <= len(data), f"{path}: record header at {off} cut short"
        crc, hcrc, klen, vlen, op, expire, zero = struct.unpack_from("<IIIIB3xqI", data, off)
        assert crc32c(data[off + OFF_KLEN:off + REC_HDR]) == hcrc, f"{path}: bad header CRC at {off}"
        length = REC_HDR + klen + vlen + REC_TRAILER
        assert off + length <= len(data), f"{path}: record at {off} runs past the end"
        assert crc32c(data[off + 4:off + length]) == crc, f"{path}: bad CRC at {off}"
        key = data[off + REC_HDR:off + REC_HDR + klen]
        value = data[off + REC_HDR + klen:off + REC_HDR + klen + vlen]
        lsn = struct.unpack_from("<Q", data, off + length - 8)[0]
        recs.append(Record(off, length, op, key, value, expire, lsn, data[off:off + length]))
        off += length
    return first, recs


def log_dir(data_dir):
    return os.path.join(str(data_dir), "log")


def seg_name(first_lsn):
    return f"wal-{first_lsn:016x}.log"


def segments(data_dir):
    """Segment paths in LSN order."""
    d = log_dir(data_dir)
    if not os.path.isdir(d):
        return []
    names = sorted(n for n in os.listdir(d) if re.fullmatch(r"wal-[0-9a-f]{16}\.log", n))
    return [os.path.join(d, n) for n in names]


def all_records(data_dir):
    """Every record of every segment, in order, as [(path, Record)]."""
    out = []
    for p in segments(data_dir):
        _, recs = parse_segment(p)
        out += [(p, r) for r in recs]
    return out


def flip_bit(path, offset, bit):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ (1 << bit)]))


# ---------------------------------------------------------------- processes

def start_disk_node(data_dir, threads=2, **settings):
    """A new kvstore.Node on data_dir in disk mode, started. (A new object each time:
    Node.start() keeps the previous run's port, so a restarted Node whose server
    failed would look started.) Without the data file unless data_file=True: the
    log tests see every record replayed from LSN 1."""
    settings.setdefault("durability", "disk")
    settings.setdefault("data_file", False)
    n = Node(port=0, data_dir=str(data_dir), threads=threads, **settings)
    n.start()
    return n


@contextlib.contextmanager
def started_nodes(**defaults):
    """start(data_dir, **settings) -> a started disk-mode Node (a new one each call, with
    `defaults` under `settings`); whatever still runs when the block ends is killed."""
    started = []

    def start(data_dir, **settings):
        n = start_disk_node(data_dir, **{**defaults, **settings})
        started.append(n)
        return n

    try:
        yield start
    finally:
        for n in started:
            if n.proc:
                n.kill()


# ---------------------------------------------------------------- a served node

def recovery_of(node):
    """The server's recovery summary (a Recovered or "empty"); fails if it printed none."""
    rec = parse_recovery(node.log())
    assert rec is not None, f"no recovery line in the server's stderr:\n{node.log()}"
    return rec


def persistence(port):
    """INFO persistence of the node on port, parsed by redis-py."""
    with client(port) as c:
        return c.info("persistence")


def appended_lsn(raw):
    """log_appended_lsn from INFO persistence over an open Raw connection (cheaper than a new
    client per look, which matters when a test races a slow sync)."""
    text = raw.call("INFO", "persistence").decode()
    return int(re.search(r"^log_appended_lsn:(\d+)\r$", text, re.M).group(1))


def wait_applied(raw, after, timeout=30.0):
    """Until the node's log has a record past LSN `after` (appended_lsn(raw), taken before a
    write was sent): the write is applied, its record waits for its sync. Records are appended
    under the key's shard lock, so a read of that key sent after this sees the write. (A
    sleep instead is a guess that a loaded machine gets wrong.)"""
    deadline = time.monotonic() + timeout
    while (lsn := appended_lsn(raw)) <= after:
        assert time.monotonic() < deadline, f"no record past LSN {after} after {timeout} s"
        time.sleep(0.002)
    return lsn


def mget_all(port, keys, chunk=500):
    """{key: value or None} for every key, read with MGETs of `chunk` keys."""
    out = {}
    with client(port) as c:
        for i in range(0, len(keys), chunk):
            part = keys[i:i + chunk]
            for k, v in zip(part, c.mget(part)):
                out[k] = v
    return out


def write_keys(port, items):
    """SET each (key, value), one request each (one log record each), in order."""
    with client(port) as c:
        for k, v in items:
            assert c.set(k, v) is True


SERVE = [sys.executable, "-m", "kvstore.cli", "serve"]
RECOVER = [sys.executable, "-m", "kvstore.cli", "recover"]


def run_serve(data_dir, timeout=20.0, extra=()):
    """Run `kvstore serve --durability disk` on data_dir expecting it to REFUSE to start.
    Returns (exit code, stdout, stderr). If it starts instead (prints "listening on"),
    it is killed at once and the exit code returned is None."""
    args = SERVE + ["--bind", "127.0.0.1", "--port", "0", "--threads", "2", "--durability", "disk",
                    "--data-dir", str(data_dir)] + list(extra)
    with tempfile.TemporaryFile() as errf:
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=errf)
        out = b""
        deadline = time.monotonic() + timeout
        started = False
        while time.monotonic() < deadline:
            ready, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(p.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
            if b"listening on" in out:
                started = True
                break
        if started or p.poll() is None:
            p.kill()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        p.stdout.close()
        errf.seek(0)
        err = errf.read()
    rc = None if started else p.returncode
    return rc, out.decode(errors="replace"), err.decode(errors="replace")


def run_recover(data_dir, *extra, timeout=30.0):
    c = subprocess.run(RECOVER + ["--data-dir", str(data_dir)] + list(extra),
                       capture_output=True, text=True, timeout=timeout)
    return c.returncode, c.stdout, c.stderr


_RECOVERED = re.compile(
    r"recovered ([\d,]+) records \((?:LSN (\d+)\.\.(\d+)|up to LSN (\d+))\) "
    r"from (\d+) log segment\(s\)(.*)")


_DATAFILE = re.compile(r"data file: [\d,]+ keys in .* flushed up to LSN (\d+)")


def parse_datafile(log):
    """The flushed LSN from the server's "data file: ..." start line, or None."""
    m = _DATAFILE.search(log)
    return int(m.group(1)) if m else None


class Recovered:
    def __init__(self, line, m):
        self.line = line
        self.records = int(m.group(1).replace(",", ""))
        if m.group(2):
            self.first, self.last = int(m.group(2)), int(m.group(3))
        else:
            self.first, self.last = None, int(m.group(4))
        self.segments = int(m.group(5))
        self.rest = m.group(6)

    @property
    def torn(self):
        return "torn tail" in self.rest

    def __repr__(self):
        return f"Recovered({self.line!r})"


def parse_recovery(text):
    """The recovery summary in a server's stderr (or `kvstore recover` output):
    a Recovered, or "empty" for "no log found: starting empty", or None."""
    for line in text.splitlines():
        if "no log found: starting empty" in line:
            return "empty"
        m = _RECOVERED.search(line)
        if m:
            return Recovered(line.strip(), m)
    return None
