"""The durability log from Python: recovery into a Store, opening the group-committed log."""
import dataclasses
import errno
import os
import time

from kvstore import errors
from kvstore._cstruct import as_dict
from kvstore._native import ffi, lib


@dataclasses.dataclass
class Recovery:
    records: int
    first_lsn: int
    last_lsn: int
    segments: int
    bytes: int
    truncated_bytes: int
    problem: str
    seconds: float

    @staticmethod
    def scan(directory):
        """Last valid LSN of the log in directory (0 if none), without applying it."""
        if not os.path.isdir(directory):
            return 0
        rec = ffi.new("struct wal_recovery *")
        err = ffi.new("char[1024]")
        rc = lib.wal_recover(ffi.NULL, directory.encode(), 0, 0, rec, err, 1024)
        errors.raise_for(rc, ffi.string(err).decode(errors="replace"), damaged=errors.CorruptLogError)
        return rec.last_lsn

    def summary(self):
        if not self.segments:
            return "no log found: starting empty"
        rng = f"LSN {self.first_lsn}..{self.last_lsn}" if self.records else f"up to LSN {self.last_lsn}"
        s = (f"recovered {self.records:,} records ({rng}) from {self.segments} log segment(s), "
             f"{self.bytes:,} bytes, in {self.seconds:.3f} s")
        return s + (f"; {self.problem}" if self.problem else "")


def log_dir(data_dir):
    return os.path.join(data_dir, "log")


def node_id(data_dir, create=True, value=None):
    """This node's identity (16 bytes), which names its log at the peer; made once
    (or adopted from the peer's copy of the log when a lost node recovers)."""
    path = os.path.join(data_dir, "node-id")
    try:
        with open(path) as f:
            return bytes.fromhex(f.read().strip())
    except FileNotFoundError:
        if not create:
            return None
        nid = value or os.urandom(16)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(nid.hex() + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
        _fsync_dir(data_dir)
        return nid


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fetch_from_peer(data_dir, host, port, timeout_ms=5000):
    """Fetch the copy of this node's log that the peer holds. If it reaches further
    than the local log (which may be gone), it replaces the local log (the old one is
    kept as log.replaced-<time>). Returns (peer_last_lsn, local_last_lsn, replaced)."""
    import shutil

    staging = os.path.join(data_dir, "log.from-peer")
    shutil.rmtree(staging, ignore_errors=True)
    err = ffi.new("char[512]")
    known = node_id(data_dir, create=False)
    nid = ffi.new("uint8_t[16]", known or bytes(16))  # zeros: "the only log you hold"
    last = lib.rl_fetch(host.encode(), port, nid, staging.encode(), timeout_ms, err, 512)
    if last < 0:
        shutil.rmtree(staging, ignore_errors=True)
        # Not raise_for: every failure here is the peer's (a refusal comes back as EINVAL,
        # which raise_for would call a bad setting), and start-up waits on ServerError.
        raise errors.ServerError(ffi.string(err).decode(errors="replace"), -last)
    if known is None and any(nid):
        node_id(data_dir, value=bytes(nid))  # this node's identity, as the peer knows it
    try:
        local = Recovery.scan(log_dir(data_dir))
    except errors.CorruptLogError:
        local = 0  # a damaged local log: the peer's copy is the way back
    if last > local:
        _fsync_dir(staging)
        if os.path.isdir(log_dir(data_dir)):
            os.rename(log_dir(data_dir), f"{log_dir(data_dir)}.replaced-{time.time_ns()}")  # unique: restarts within a second
        os.rename(staging, log_dir(data_dir))
        _fsync_dir(data_dir)  # the renames must survive a power cut before anything relies on them
        return last, local, True
    shutil.rmtree(staging, ignore_errors=True)
    return last, local, False


def recover(store, data_dir, repair=True, after_lsn=0):
    """Replay <data_dir>/log into store: the records after after_lsn (what the data
    file already holds). Raises errors.CorruptLogError if the log is damaged
    anywhere but its torn tail (nothing after the damage is applied)."""
    rec = ffi.new("struct wal_recovery *")
    err = ffi.new("char[1024]")
    t0 = time.monotonic()
    rc = lib.wal_recover(store._t, log_dir(data_dir).encode(), after_lsn, 1 if repair else 0, rec, err, 1024)
    errors.raise_for(rc, ffi.string(err).decode(errors="replace"), damaged=errors.CorruptLogError,
                     hint={errno.EILSEQ: "The server will not start on a damaged log: move the damaged "
                                         "segment away (keeping a copy) to start from what precedes it."})
    return Recovery(rec.records, rec.first_lsn, rec.last_lsn, rec.segments, rec.bytes, rec.truncated_bytes,
                    ffi.string(rec.problem).decode(errors="replace"), time.monotonic() - t0)


def data_file(data_dir):
    return os.path.join(data_dir, "data.kvd")


class DataFile:
    """The BOSC data file behind a store's table: opened (and scanned) before the
    log replays, so the replay marks its keys dirty for the flusher."""

    def __init__(self, store, data_dir, buckets=65536, flush_interval_ms=5000, truncate_log=True,
                 dirty_queue="ldu"):
        cfg = ffi.new("struct bosc_config *")
        # Remote mode keeps every log segment: a peer that lost its copy of this
        # node's log is caught up by shipping the log from LSN 1.
        self._keep = [ffi.new("char[]", data_file(data_dir).encode()),
                      ffi.new("char[]", log_dir(data_dir).encode()) if truncate_log else ffi.NULL]
        cfg.path, cfg.log_dir = self._keep
        cfg.buckets = buckets
        cfg.flush_interval_ms = flush_interval_ms
        cfg.locked_queue = 1 if dirty_queue == "locked" else 0
        info = ffi.new("struct bosc_open_info *")
        out = ffi.new("struct bosc **")
        err = ffi.new("char[1024]")
        rc = lib.bosc_open(out, store._t, cfg, info, err, 1024)
        errors.raise_for(rc, ffi.string(err).decode(errors="replace"),
                         hint={errno.EILSEQ: "The server will not start on a damaged data file: restore the node "
                                             "from its peer (move the data directory away, start with "
                                             "--from-peer) or from a backup."})
        self._b = out[0]
        self.info = as_dict(info)

    @property
    def flushed_lsn(self):
        return self.info["flushed_lsn"]

    def summary(self):
        i = self.info
        return (f"data file: {i['disk_keys']:,} keys in {i['buckets']:,} buckets ({i['blocks']:,} blocks), "
                f"flushed up to LSN {i['flushed_lsn']}, scanned in {i['seconds']:.3f} s")

    def start(self, log=None):
        """Start the flusher and loader; log's durable LSN bounds what may become clean."""
        lib.bosc_set_log(self._b, log._w if log is not None else ffi.NULL)
        errors.raise_for(lib.bosc_start(self._b), "cannot start the data file's flusher")

    def sync(self):
        """Sweep now and wait for it (tests and experiments)."""
        errors.raise_for(lib.bosc_sync(self._b), "the data file failed")

    def stats(self):
        st = ffi.new("struct bosc_stats *")
        lib.bosc_get_stats(self._b, st)
        return as_dict(st)

    def close(self):
        if self._b is not None:
            lib.bosc_close(self._b)
            self._b = None


class Log:
    """An open group-committed log attached to a store's table (every write is logged)."""

    def __init__(self, store, data_dir, first_lsn, sync=True, ship=False, batch_ms=1000, segment_bytes=0):
        cfg = ffi.new("struct wal_config *")
        cfg.segment_bytes = segment_bytes  # 0: the default, 64 MiB
        self._dir = ffi.new("char[]", log_dir(data_dir).encode())
        cfg.dir = self._dir
        cfg.sync = 1 if sync else 0
        cfg.ship = 1 if ship else 0
        cfg.batch_ms = batch_ms
        cfg.first_lsn = first_lsn
        # Fault injection for tests and experiments: a disk this much slower per sync.
        cfg.sync_delay_us = int(os.environ.get("KVSTORE_FAULT_SYNC_DELAY_US", "0"))
        out = ffi.new("struct wal **")
        err = ffi.new("char[512]")
        errors.raise_for(lib.wal_open(out, cfg, err, 512), ffi.string(err).decode(errors="replace"))
        self._w = out[0]
        self._store = store  # None: a bare log (experiments append to it directly)
        rc = lib.wal_start(self._w)
        if rc < 0:
            lib.wal_close(self._w)
            errors.raise_for(rc, "cannot start the log thread")
        if store is not None:
            lib.kvt_set_log(store._t, ffi.addressof(lib, "wal_log_fn"), self._w)

    def stats(self):
        st = ffi.new("struct wal_stats *")
        lib.wal_get_stats(self._w, st)
        return as_dict(st)

    def close(self):
        """Detach from the table, write and sync what is buffered, stop the log thread."""
        if self._w is not None:
            if self._store is not None:
                lib.kvt_set_log(self._store._t, ffi.NULL, ffi.NULL)
            lib.wal_close(self._w)
            self._w = None


class Sender:
    """Remote mode's log sender: ships the log to the peer's receiver."""

    def __init__(self, log, data_dir, host, port, interval_us=100, max_batch_records=65536, timeout_ms=1000):
        cfg = ffi.new("struct rl_sender_config *")
        self._host = ffi.new("char[]", host.encode())
        cfg.host = self._host
        cfg.port = port
        cfg.node_id = node_id(data_dir)
        cfg.interval_us = interval_us
        cfg.max_batch_records = max_batch_records
        cfg.timeout_ms = timeout_ms
        out = ffi.new("struct rl_sender **")
        err = ffi.new("char[256]")
        errors.raise_for(lib.rl_sender_start(out, log._w, cfg, err, 256), ffi.string(err).decode(errors="replace"))
        self._s = out[0]

    def stats(self):
        st = ffi.new("struct rl_sender_stats *")
        lib.rl_sender_get_stats(self._s, st)
        return as_dict(st)

    def close(self):
        if self._s is not None:
            lib.rl_sender_stop(self._s)
            self._s = None


class Receiver:
    """This node's log receiver: stores a peer's log (in memory, synced to disk every sync_ms)."""

    def __init__(self, data_dir, bind, port, sync_ms=1000):
        out = ffi.new("struct rl_receiver **")
        err = ffi.new("char[256]")
        rc = lib.rl_receiver_start(out, bind.encode(), port, os.path.join(data_dir, "peer").encode(), sync_ms,
                                   err, 256)
        errors.raise_for(rc, ffi.string(err).decode(errors="replace"))
        self._r = out[0]

    @property
    def port(self):
        return lib.rl_receiver_port(self._r)

    def stats(self):
        st = ffi.new("struct rl_receiver_stats *")
        lib.rl_receiver_get_stats(self._r, st)
        return as_dict(st)

    def close(self):
        if self._r is not None:
            lib.rl_receiver_stop(self._r)
            self._r = None
