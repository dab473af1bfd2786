"""Durability from Python: the log, its recovery into a Store, the BOSC data file, the remote
mode's sender and receiver, and Durability, which opens and closes them in order for a server."""
import dataclasses
import errno
import logging
import os
import time

from kvstore import errors
from kvstore._cstruct import as_dict
from kvstore._native import ffi, lib
from kvstore.config import parse_address
from kvstore.log import logger


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


def has_state(data_dir):
    """True if data_dir holds this node's state: a log segment or a data file (an identity
    alone is not state: it names state that may be elsewhere)."""
    try:
        names = os.listdir(log_dir(data_dir))
    except FileNotFoundError:
        names = []
    return any(n.startswith("wal-") and n.endswith(".log") for n in names) or os.path.exists(data_file(data_dir))


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


SECRET_HOWTO = "make one with `head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE` and give both nodes a copy"
MIN_SECRET_BYTES = 16


def repl_key(path):
    """The pair's replication key: SHA-256 of the secret file's content (surrounding
    whitespace removed, so an editor's newline does not matter). Refused, as ssh refuses a
    private key, if group or others may read the file; refused if shorter than 16 bytes."""
    import hashlib
    import stat

    if not path:
        raise errors.ConfigError(f"repl_secret_file: the replication link needs a secret file: {SECRET_HOWTO}")
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise errors.ConfigError(f"repl_secret_file {path}: not a regular file; {SECRET_HOWTO}")
        if st.st_mode & 0o077:
            raise errors.ConfigError(
                f"repl_secret_file {path}: permissions {stat.S_IMODE(st.st_mode):04o} are too open (group or "
                f"others may read the secret): chmod 600 {path}")
        with open(path, "rb") as f:
            secret = f.read(65536).strip()
    except OSError as e:
        raise errors.ConfigError(f"repl_secret_file {path}: cannot read it ({e.strerror}); {SECRET_HOWTO}") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise errors.ConfigError(f"repl_secret_file {path}: the secret is {len(secret)} bytes, at least "
                                 f"{MIN_SECRET_BYTES} are needed; {SECRET_HOWTO}")
    return hashlib.sha256(secret).digest()


def repl_tls_files(config):
    """--repl-tls: (cert, key, CA) PEM files of the replication link's mutual TLS (the
    RESP port's --tls-* files), or None without --repl-tls."""
    if not config.repl_tls:
        return None
    return config.tls_cert_file, config.tls_key_file, config.tls_ca_cert_file


def _tls_struct(tls):
    """A struct rl_tls_files for tls ((cert, key, CA) or None: plain TCP) and what keeps
    its strings alive."""
    if not tls:
        return ffi.NULL, ()
    keep = [ffi.new("char[]", os.fsencode(p)) for p in tls]
    return ffi.new("struct rl_tls_files *", {"cert_file": keep[0], "key_file": keep[1], "ca_file": keep[2]}), keep


def fetch_from_peer(data_dir, host, port, timeout_ms=5000, *, key, tls=None):
    """Fetch the copy of this node's log that the peer holds, over a link authenticated
    with key (repl_key), inside mutual TLS when tls ((cert, key, CA) files) is given. If it reaches further than the local log (which may be gone), it
    replaces the local log (the old one is kept as log.replaced-<time>). Returns
    (peer_last_lsn, local_last_lsn, replaced)."""
    import shutil

    staging = os.path.join(data_dir, "log.from-peer")
    shutil.rmtree(staging, ignore_errors=True)
    err = ffi.new("char[512]")
    known = node_id(data_dir, create=False)
    nid = ffi.new("uint8_t[16]", known or bytes(16))  # zeros: "the only log you hold"
    tls_files, _keep = _tls_struct(tls)
    last = lib.rl_fetch(host.encode(), port, key, nid, staging.encode(), timeout_ms, tls_files, err, 512)
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
    anywhere but its torn tail (nothing after the damage is applied) or if its newest
    segment is missing (the segment its manifest names)."""
    rec = ffi.new("struct wal_recovery *")
    err = ffi.new("char[1024]")
    t0 = time.monotonic()
    rc = lib.wal_recover(store._t, log_dir(data_dir).encode(), after_lsn, 1 if repair else 0, rec, err, 1024)
    errors.raise_for(rc, ffi.string(err).decode(errors="replace"), damaged=errors.CorruptLogError,
                     hint={errno.EILSEQ: "The server will not start on a damaged or incomplete log: restore "
                                         "the segment from a backup (or the peer: --from-peer), or move a damaged "
                                         "segment away (keeping a copy) to start from what precedes it."})
    return Recovery(rec.records, rec.first_lsn, rec.last_lsn, rec.segments, rec.bytes, rec.truncated_bytes,
                    ffi.string(rec.problem).decode(errors="replace"), time.monotonic() - t0)


def data_file(data_dir):
    return os.path.join(data_dir, "data.kvd")


AUTO_BUCKETS_MIN = 65536
# --datafile-io -> struct bosc_config.io_mode (BOSC_IO_* bits: 1 O_DIRECT, 2 io_uring)
IO_MODES = {"buffered": 0, "direct": 1, "uring": 2, "uring-direct": 3}


def auto_buckets(max_memory):
    """A new data file's buckets when --data-buckets is 0: one per 4 KiB of the memory
    bound. A sweep writes each dirty bucket's whole chain, so the records a block write
    carries are the dirty records over the blocks of their chains: with ~170 bytes of
    memory and ~120 bytes of file per record, this keeps chains near one block while
    the file is 1-3x memory (fewer buckets: longer chains rewritten; more: blocks half
    empty). Home copies are sparse, so unused buckets cost no disk."""
    return max(AUTO_BUCKETS_MIN, min(1 << 30, max_memory // 4096))


class DataFile:
    """The BOSC data file behind a store's table: opened (and scanned) before the
    log replays, so the replay marks its keys dirty for the flusher."""

    def __init__(self, store, data_dir, buckets=0, flush_interval_ms=5000, truncate_log=True,
                 dirty_queue="ldu", io="buffered",
                 sweep_chunk_pct=5):
        cfg = ffi.new("struct bosc_config *")
        # Remote mode keeps every log segment: a peer that lost its copy of this
        # node's log is caught up by shipping the log from LSN 1.
        self._keep = [ffi.new("char[]", data_file(data_dir).encode()),
                      ffi.new("char[]", log_dir(data_dir).encode()) if truncate_log else ffi.NULL]
        cfg.path, cfg.log_dir = self._keep
        cfg.buckets = buckets or auto_buckets(store.max_memory)
        cfg.flush_interval_ms = flush_interval_ms
        cfg.locked_queue = 1 if dirty_queue == "locked" else 0
        cfg.io_mode = IO_MODES[io]
        cfg.sweep_chunk_pct = sweep_chunk_pct
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
    """Remote mode's log sender: ships the log to the peer's receiver (key: repl_key)."""

    def __init__(self, log, data_dir, host, port, interval_us=100, max_batch_records=65536, timeout_ms=1000, *,
                 key, tls=None):
        cfg = ffi.new("struct rl_sender_config *")
        self._host = ffi.new("char[]", host.encode())
        cfg.host = self._host
        cfg.port = port
        cfg.node_id = node_id(data_dir)
        cfg.key = key
        cfg.interval_us = interval_us
        cfg.max_batch_records = max_batch_records
        cfg.timeout_ms = timeout_ms
        _, keep = _tls_struct(tls)  # read by rl_sender_start only
        if keep:
            cfg.tls.cert_file, cfg.tls.key_file, cfg.tls.ca_file = keep
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
    """This node's log receiver: stores a peer's log (in memory, synced to disk every sync_ms);
    only peers proving they hold key (repl_key) are served, and with tls ((cert, key, CA)
    files: --repl-tls) only over TLS with a certificate the CA verifies."""

    def __init__(self, data_dir, bind, port, sync_ms=1000, *, key, tls=None):
        out = ffi.new("struct rl_receiver **")
        err = ffi.new("char[256]")
        tls_files, _keep = _tls_struct(tls)
        rc = lib.rl_receiver_start(out, bind.encode(), port, os.path.join(data_dir, "peer").encode(), sync_ms,
                                   key, tls_files, err, 256)
        errors.raise_for(rc, ffi.string(err).decode(errors="replace"))
        self._r = out[0]

    @property
    def port(self):
        return lib.rl_receiver_port(self._r)

    def set_self(self, nid):
        """This node's own id: a handshake naming it (this node's own sender or fetch
        redirected to its own --repl-port) is refused, never stored and acknowledged."""
        lib.rl_receiver_set_self(self._r, nid)

    def stats(self):
        st = ffi.new("struct rl_receiver_stats *")
        lib.rl_receiver_get_stats(self._r, st)
        return as_dict(st)

    def close(self):
        if self._r is not None:
            lib.rl_receiver_stop(self._r)
            self._r = None


class Durability:
    """A server's durability pieces, opened in dependency order and closed in reverse.

    open(): the log receiver (a peer's log, independent of the rest); then, with durability
    disk or remote: this node's log fetched from its peer (remote always compares, waiting
    up to peer_startup_wait_ms), the data file (scanned: its flushed LSN bounds the replay),
    the replay into the store, the log (from the LSN after the replay), the sender (remote),
    and last the data file's flusher, which reads the log's durable LSN. durability none
    with a data file: the data file alone (a spilling cache).
    Remote mode, no local state (no log segment, no data file): the node is either new
    (config.init, and the peer holds no log of this pair) or one that lost its disk, whose
    log and identity the peer holds. If the peer cannot be asked within
    peer_startup_wait_ms, open() returns with `waiting` set (what it waits for): the server
    starts refusing keyspace commands (-LOADING) and calls wait_for_state(), which retries
    with backoff and opens the rest once the state is back. A definitive answer that the
    state is not there (or that --init would hide it) raises errors.ServerError.
    close(): the data file first (its flusher reads the log's and the sender's LSNs), then
    the sender, the log, the receiver. Both run on the thread that starts/stops the server
    (wait_for_state on the server's loader thread, before the server attaches the result)."""

    RETRY_MS = (200, 5000)  # backoff of the retries while waiting: first, largest

    def __init__(self, store, config, from_peer=None):
        self.store = store
        self.config = config
        self.from_peer = from_peer  # "HOST:PORT": fetch this node's log from its peer before recovery
        self.receiver = None
        self.datafile = None
        self.recovery = None
        self.log = None
        self.sender = None
        self.fetched = None  # (peer LSN, local LSN, replaced) after a fetch
        self._key = None  # the replication link's key (repl_key), when a link is used
        self._tls = repl_tls_files(config)  # --repl-tls: the link's (cert, key, CA) files, or None
        self.local_complete = False  # remote mode started without its peer, on a complete local log
        self.waiting = None  # what a node with no local state waits for (None: not waiting)
        self.attempts = 0  # tries to reach the peer for a node with no local state
        self.last_error = ""  # the last try's failure
        self._lines = []  # what start-up found, as logged (report())

    def open(self):
        """Open everything the config asks for; on failure close what was opened and raise.
        Remote mode may return with `waiting` set (see the class): then call wait_for_state()."""
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def _say(self, line, level=logging.INFO):
        """One start-up finding: logged when it happens (the log's timestamp says when) and kept for report()."""
        self._lines.append(line)
        logger.log(level, "%s", line)

    def _open(self):
        c = self.config
        if c.repl_port >= 0 or c.durability == "remote" or self.from_peer:
            self._key = repl_key(c.repl_secret_file)  # every replication connection proves it
        if c.repl_port >= 0:
            os.makedirs(c.data_dir, exist_ok=True)
            self.receiver = Receiver(c.data_dir, c.repl_bind, c.repl_port, key=self._key, tls=self._tls)
            self._say(f"log receiver on {c.repl_bind}:{self.receiver.port}")
        if c.durability == "none":
            if c.data_file:  # a spilling cache: bounded memory, nothing durable
                os.makedirs(c.data_dir, exist_ok=True)
                self.datafile = DataFile(self.store, c.data_dir, c.data_buckets, c.flush_interval_ms,
                                         truncate_log=False, dirty_queue=c.dirty_queue, io=c.datafile_io,
                                         sweep_chunk_pct=c.sweep_chunk_pct)
                self._say(self.datafile.summary())
                self.datafile.start(None)
            return
        os.makedirs(c.data_dir, exist_ok=True)
        self._given_node_id()
        self._receiver_knows_self()
        if c.durability == "remote":
            # The local log lags the acknowledged writes by up to disk_log_interval_ms:
            # the peer's copy may reach further, and starting from the local log alone
            # would lose acknowledged writes and reuse their LSNs. Always compare.
            address = self._source()
            if has_state(c.data_dir):
                if c.init:
                    self._say(f"--init ignored: {os.path.abspath(c.data_dir)} already holds this node's state")
                self.fetched = self._fetch_waiting(*address, c.peer_startup_wait_ms)
            elif not self._first_contact(*address, c.peer_startup_wait_ms):
                return  # waiting: the server serves -LOADING and calls wait_for_state()
        elif self.from_peer:
            self.fetched = fetch_from_peer(c.data_dir, *parse_address(self.from_peer, "from_peer"), key=self._key,
                                           tls=self._tls)
        self._open_state()

    def _source(self):
        return parse_address(self.from_peer or self.config.peer, "from_peer" if self.from_peer else "peer")

    def _given_node_id(self):
        """--node-id: must match the data dir's identity; kept there when the dir has none."""
        c = self.config
        if not c.node_id:
            return
        given, have = bytes.fromhex(c.node_id), node_id(c.data_dir, create=False)
        if have is not None and have != given:
            raise errors.ConfigError(f"node_id: --node-id {c.node_id.lower()} but {c.data_dir}/node-id holds "
                                     f"{have.hex()}: this data dir belongs to another node (give its id, or none)")
        if have is None:
            node_id(c.data_dir, value=given)

    def _receiver_knows_self(self, create=False):
        nid = node_id(self.config.data_dir, create=create)
        if self.receiver is not None and nid is not None:
            self.receiver.set_self(nid)

    def _open_state(self):
        """Everything after this node's log is in place (fetched, or local): the data file,
        the replay, the log, the sender, the flusher."""
        c = self.config
        if self.fetched is not None:
            peer_lsn, local_lsn, replaced = self.fetched
            self._say(f"fetched the log from {self.from_peer or c.peer} up to LSN {peer_lsn} (local log ended "
                      f"at {local_lsn}); " + ("it replaces the local log" if replaced else "local log kept"))
        if self.local_complete:
            self._say(f"peer {c.peer} unreachable; this node last ran without it, syncing every acknowledged "
                      f"write locally (LOCAL-COMPLETE), so it starts from its own log", logging.WARNING)
        if c.data_file:
            self.datafile = DataFile(self.store, c.data_dir, c.data_buckets, c.flush_interval_ms,
                                     truncate_log=c.durability == "disk", dirty_queue=c.dirty_queue,
                                     io=c.datafile_io, sweep_chunk_pct=c.sweep_chunk_pct)
            self._say(self.datafile.summary())
        self.recovery = recover(self.store, c.data_dir, after_lsn=self.datafile.flushed_lsn if self.datafile else 0)
        self._say(self.recovery.summary(), logging.WARNING if self.recovery.problem else logging.INFO)
        remote = c.durability == "remote"
        self.log = Log(self.store, c.data_dir, self.recovery.last_lsn + 1, sync=not remote, ship=remote,
                       batch_ms=c.disk_log_interval_ms, segment_bytes=c.log_segment_size)
        if remote:
            host, port = c.peer_address()
            self._receiver_knows_self(create=True)  # final now (maybe adopted from the peer's copy)
            self.sender = Sender(self.log, c.data_dir, host, port, c.ship_interval_us, c.max_batch_records,
                                 c.peer_timeout_ms, key=self._key, tls=self._tls)
        if self.datafile:
            self.datafile.start(self.log)

    def _first_contact(self, host, port, wait_ms):
        """A node with no local state asks its peer, for up to wait_ms: True once its state
        is in place (its log fetched, or a new node accepted), False if the peer could not
        be asked (then `waiting` says what the node waits for)."""
        deadline = time.monotonic() + wait_ms / 1000
        while not self._attempt(host, port):
            if time.monotonic() >= deadline:
                nid = node_id(self.config.data_dir, create=False)
                who = f"node {nid.hex()}" if nid else "identity unknown until the peer's copy names it"
                self.waiting = (f"the peer {host}:{port} to confirm that this is a new node (--init)" if self.config.init
                                else f"its log from the peer {host}:{port} ({who}; the data dir holds no state)")
                self._say(f"no local state and the peer {host}:{port} cannot be asked ({self.last_error}): waiting "
                          f"for {self.waiting}; keyspace commands are refused (-LOADING) until then", logging.WARNING)
                return False
            time.sleep(0.2)  # the peer may be starting too
        return True

    def wait_for_state(self, stop, progress=None):
        """For a node left `waiting` by open(): retry the peer with backoff until the state is
        back, then open the rest (as open() would have). stop: a threading.Event that ends
        the wait (returns False). progress(attempts, last_error): called after each failed
        try. True once open; raises errors.ServerError on a definitive refusal."""
        host, port = self._source()
        delay = self.RETRY_MS[0]
        reported = None
        while not stop.wait(delay / 1000):
            if self._attempt(host, port, timeout_ms=2000):
                self._say(f"the peer {host}:{port} answered after {self.attempts} tries: recovering")
                self._open_state()
                self.waiting = None
                return True
            if progress:
                progress(self.attempts, self.last_error)
            if self.last_error != reported or self.attempts % 20 == 0:  # a line per change, and now and then
                reported = self.last_error
                logger.warning("still waiting for %s (try %d: %s); keyspace commands refused", self.waiting,
                               self.attempts, self.last_error)
            delay = min(delay * 2, self.RETRY_MS[1])
        return False

    def _attempt(self, host, port, timeout_ms=5000):
        """One try of a node with no local state: True once its state is in place, False if
        the peer could not be asked (last_error says why), ServerError if it answered that
        the state is not there (no --init) or that --init would hide a node's log."""
        self.attempts += 1
        data_dir = self.config.data_dir
        try:
            if self.config.init:
                probed = self._peek(host, port, timeout_ms)
            else:
                fetched = fetch_from_peer(data_dir, host, port, timeout_ms, key=self._key, tls=self._tls)
        except errors.ServerError as e:
            self.last_error = str(e)
            return False
        if self.config.init:
            return self._init_new(host, port, *probed)
        nid = node_id(data_dir, create=False)
        if fetched[0] == 0:
            who = f"node {nid.hex()}" if nid else "any node"
            raise errors.ServerError(
                f"durability remote: {os.path.abspath(data_dir)} holds no state and the peer {host}:{port} holds no "
                f"log records of {who}, so this node's state is nowhere to recover. If it is a brand-new node, "
                f"start it with --init; if it lost its disk, give its --node-id (the peer names the logs it holds "
                f"under <its data dir>/peer/).", errno.ENOENT)
        self.fetched = fetched
        return True

    def _peek(self, host, port, timeout_ms):
        """(last LSN, node id or None) of the only log the peer holds, fetched as a node that
        lost its disk would fetch it, into a scratch directory that is then removed."""
        import shutil

        scratch = os.path.join(self.config.data_dir, "init-probe")
        shutil.rmtree(scratch, ignore_errors=True)
        os.makedirs(scratch)
        try:
            fetched = fetch_from_peer(scratch, host, port, timeout_ms, key=self._key, tls=self._tls)
            return fetched[0], node_id(scratch, create=False)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _init_new(self, host, port, last, held):
        """--init with no local state: the peer must hold no log records of this pair's node
        (they would be this node's, lost with its disk). True: the new node's identity is set."""
        c = self.config
        if last > 0:
            raise errors.ServerError(
                f"--init refused: the peer {host}:{port} holds the log of node {held.hex()} up to LSN {last}, this "
                f"pair's node, which had state. If this node is that one (its disk was lost), start it without "
                f"--init to recover its log; if that node is gone for good, remove peer/{held.hex()} from the "
                f"peer's data dir first.", errno.EEXIST)
        # An empty log at the peer acknowledged nothing: keep its identity (one log per node there).
        nid = node_id(c.data_dir, create=False) or node_id(c.data_dir, value=held)
        self._say(f"new node {nid.hex()} (--init): the peer {host}:{port} holds no log records of this pair")
        return True

    def _fetch_waiting(self, host, port, wait_ms):
        """A node with local state compares its log with the peer's copy, waiting up to
        wait_ms for the peer; then refuses to start, unless it last ran without the peer
        (LOCAL-COMPLETE)."""
        data_dir = self.config.data_dir
        complete = os.path.exists(os.path.join(log_dir(data_dir), "LOCAL-COMPLETE"))
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            try:
                return fetch_from_peer(data_dir, host, port, key=self._key, tls=self._tls)
            except errors.ServerError as e:
                if complete:
                    # It last ran without its peer, syncing every acknowledged write
                    # locally (the marker goes before any peer ack counts): its own log
                    # holds everything the peer could.
                    self.local_complete = True
                    return None
                if time.monotonic() < deadline:
                    time.sleep(0.2)  # the peer may be starting too
                    continue
                raise errors.ServerError(
                    f"durability remote: could not read this node's log from its peer {host}:{port} within "
                    f"{wait_ms} ms ({e}). The peer may hold acknowledged writes that the local log lacks "
                    f"(it lags by up to disk_log_interval_ms), so the node does not start on the local log "
                    f"alone. Start the peer, or start this node with --durability disk to recover from the "
                    f"local log only (writes acknowledged only in the peer's memory would then be lost).",
                    e.errno) from None

    def c_handles(self):
        """The C handles the server's srv_config points to (NULL for what is not open)."""
        return {"wal": self.log._w if self.log else ffi.NULL,
                "sender": self.sender._s if self.sender else ffi.NULL,
                "receiver": self.receiver._r if self.receiver else ffi.NULL,
                "bosc": self.datafile._b if self.datafile else ffi.NULL}

    def report(self):
        """What start-up found, one line each, in order (each was logged when it happened):
        log receiver port, log fetched from the peer, LOCAL-COMPLETE start, data file and
        recovery summaries."""
        return list(self._lines)

    def close(self):
        if self.datafile is not None:  # its flusher reads the log's durable LSN and the sender's
            flushed = self.datafile.stats()["flushed_lsn"]
            self.datafile.close()
            self.datafile = None
            logger.info("data file closed: it holds the changes up to LSN %d (the log has the rest)", flushed)
        if self.sender is not None:
            self.sender.close()
            self.sender = None
            logger.info("log sender stopped")
        if self.log is not None:
            st = self.log.stats()
            self.log.close()
            self.log = None
            if st.get("write_error"):  # (the log thread gave up on what the disk refused: never acknowledged)
                logger.warning("log closed while the disk refused it: synced up to LSN %d only",
                               st.get("durable_lsn", 0))
            else:
                logger.info("log closed: written and synced up to LSN %d", st.get("appended_lsn", 0))
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None
            logger.info("log receiver stopped")
