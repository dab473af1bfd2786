"""Run the C RESP server in this process over a Store. Python only starts and stops it;
poller threads serve every request in C."""
import os
import resource
import signal
import sys
import threading
import time

from kvstore import __version__, errors
from kvstore._cstruct import as_dict, split_prefix
from kvstore._native import ffi, lib
from kvstore import durability
from kvstore.config import ServerConfig, parse_address
from kvstore.store import Store


def have_dpdk():
    """True if this build has the kernel-bypass UDP front end (libdpdk found at build time)."""
    return bool(lib.srv_have_dpdk())


class Server:
    """Serve ``store`` over RESP2. Use as a context manager or call start()/stop()."""

    def __init__(self, store=None, config=None, from_peer=None, **settings):
        self.config = (config or ServerConfig(**settings)).validate()
        self.from_peer = from_peer  # "HOST:PORT": fetch this node's log from its peer before recovery
        self.store = store if store is not None else Store(max_memory=self.config.max_memory)
        self._srv = None
        self._keep = []
        self.log = None
        self.datafile = None
        self.recovery = None
        self.sender = None
        self.receiver = None
        self.fetched = None  # (peer LSN, local LSN, replaced) after a --from-peer start
        self.local_complete = False  # remote mode started without its peer, on a complete local log

    def _raise_fd_limit(self):
        """Like Redis: make room for maxclients connections (+ a margin for our own fds)."""
        need = self.config.maxclients + 64
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft >= need:
            return
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
        if target < need:
            print(f"kvstore: warning: open-file limit {target} is below maxclients + 64 = {need}; "
                  f"connections beyond ~{target - 64} will be refused by accept()", file=sys.stderr)

    def start(self):
        if self._srv is not None:
            return self
        self._raise_fd_limit()
        c = self.config
        try:
            self._start_durability()
        except BaseException:
            self._close_log()
            raise
        cfg = ffi.new("struct srv_config *")
        if c.arch == "dpdk" and not have_dpdk():
            raise errors.ConfigError("kvstore was built without DPDK (libdpdk-dev not found at build time)")
        self._keep = [ffi.new("char[]", s.encode()) for s in
                      (c.bind, c.requirepass, c.poll_policy, c.config_file, __version__, c.durability,
                       c.dpdk_iface, c.dpdk_eal_args)]
        (cfg.bind, cfg.requirepass, cfg.poll_policy, cfg.config_file, cfg.version,
         cfg.durability, cfg.dpdk_iface, cfg.dpdk_eal_args) = self._keep
        cfg.udp_workers = c.udp_workers
        cfg.udp_port = c.udp_port
        cfg.wal = self.log._w if self.log else ffi.NULL
        cfg.sender = self.sender._s if self.sender else ffi.NULL
        cfg.receiver = self.receiver._r if self.receiver else ffi.NULL
        cfg.bosc = self.datafile._b if self.datafile else ffi.NULL
        cfg.port = c.port
        cfg.threads = c.effective_threads
        cfg.maxclients = c.maxclients
        cfg.accept_mode = 1 if c.accept == "handoff" else 0
        cfg.arch = {"poller": 0, "threadpool": 1, "dpdk": 2, "udp": 3}[c.arch]
        cfg.network_only = 1 if c.network_only else 0
        cfg.tcp_backlog = c.tcp_backlog
        err = ffi.new("char[256]")
        out = ffi.new("struct srv **")
        rc = lib.srv_create(out, self.store._t, cfg, err, 256)
        if rc < 0:
            self._close_log()
            raise errors.ServerError(ffi.string(err).decode(errors="replace"), -rc)
        rc = lib.srv_start(out[0], err, 256)
        if rc < 0:
            lib.srv_destroy(out[0])
            self._close_log()
            raise errors.ServerError(ffi.string(err).decode(errors="replace"), -rc)
        self._srv = out[0]
        return self

    @property
    def port(self):
        return lib.srv_port(self._srv) if self._srv is not None else self.config.port

    @property
    def udp_port(self):
        """arch udp/dpdk: the UDP front end's port (the one bound when udp_port was 0)."""
        return lib.srv_udp_port(self._srv) if self._srv is not None else self.config.udp_port

    def stats(self):
        st = ffi.new("struct srv_stats *")
        lib.srv_get_stats(self._srv, st)
        d = as_dict(st, skip=("pollers",))  # pollers: the count; the list of their counters follows
        udp = split_prefix(d, "udp_")  # the UDP front end's counters (zero without one)
        if self.config.arch in ("udp", "dpdk"):
            d["udp"] = udp
        ps = ffi.new("struct srv_poller_stats *")
        d["pollers"] = []
        for i in range(st.pollers):
            lib.srv_get_poller_stats(self._srv, i, ps)
            d["pollers"].append(as_dict(ps))
        return d

    def _start_durability(self, from_peer=None):
        c = self.config
        if c.repl_port >= 0 and self.receiver is None:
            os.makedirs(c.data_dir, exist_ok=True)
            self.receiver = durability.Receiver(c.data_dir, c.bind, c.repl_port)
        if self.log is not None or self.datafile is not None:
            return
        if c.durability == "none":
            if c.data_file:  # a spilling cache: bounded memory, nothing durable
                os.makedirs(c.data_dir, exist_ok=True)
                self.datafile = durability.DataFile(self.store, c.data_dir, c.data_buckets, c.flush_interval_ms,
                                                    truncate_log=False, dirty_queue=c.dirty_queue)
                self.datafile.start(None)
            return
        os.makedirs(c.data_dir, exist_ok=True)
        if c.durability == "remote":
            # The local log lags the acknowledged writes by up to disk_log_interval_ms:
            # the peer's copy may reach further, and starting from the local log alone
            # would lose acknowledged writes and reuse their LSNs. Always compare.
            host, port = parse_address(self.from_peer, "from_peer") if self.from_peer else c.peer_address()
            self.fetched = self._fetch_waiting(host, port, c.peer_startup_wait_ms)
        elif self.from_peer:
            self.fetched = durability.fetch_from_peer(c.data_dir, *parse_address(self.from_peer, "from_peer"))
        if c.data_file:
            self.datafile = durability.DataFile(self.store, c.data_dir, c.data_buckets, c.flush_interval_ms,
                                                truncate_log=c.durability == "disk", dirty_queue=c.dirty_queue)
        self.recovery = durability.recover(self.store, c.data_dir,
                                           after_lsn=self.datafile.flushed_lsn if self.datafile else 0)
        remote = c.durability == "remote"
        self.log = durability.Log(self.store, c.data_dir, self.recovery.last_lsn + 1, sync=not remote,
                                  ship=remote, batch_ms=c.disk_log_interval_ms, segment_bytes=c.log_segment_size)
        if remote:
            host, port = c.peer_address()
            self.sender = durability.Sender(self.log, c.data_dir, host, port, c.ship_interval_us,
                                            c.max_batch_records, c.peer_timeout_ms)
        if self.datafile:
            self.datafile.start(self.log)

    def _fetch_waiting(self, host, port, wait_ms):
        data_dir = self.config.data_dir
        fresh = durability.node_id(data_dir, create=False) is None and not os.path.isdir(durability.log_dir(data_dir))
        complete = os.path.exists(os.path.join(durability.log_dir(data_dir), "LOCAL-COMPLETE"))
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            try:
                return durability.fetch_from_peer(data_dir, host, port)
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
                if fresh:
                    # A new node (no identity, no log) has acknowledged nothing: it may
                    # start; under a new identity it cannot reuse a lost node's LSNs.
                    return None
                raise errors.ServerError(
                    f"durability remote: could not read this node's log from its peer {host}:{port} within "
                    f"{wait_ms} ms ({e}). The peer may hold acknowledged writes that the local log lacks "
                    f"(it lags by up to disk_log_interval_ms), so the node does not start on the local log "
                    f"alone. Start the peer, or start this node with --durability disk to recover from the "
                    f"local log only (writes acknowledged only in the peer's memory would then be lost).",
                    e.errno) from None

    def _close_log(self):
        if self.datafile is not None:  # its flusher reads the log's durable LSN and the sender's
            self.datafile.close()
            self.datafile = None
        if self.sender is not None:
            self.sender.close()
            self.sender = None
        if self.log is not None:
            self.log.close()
            self.log = None
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None

    def stop(self):
        if self._srv is not None:
            lib.srv_stop(self._srv)  # pollers joined: nothing appends any more
        # The log wakes the pollers through their eventfds: close it while those
        # descriptors are still open (srv_destroy closes them).
        self._close_log()
        if self._srv is not None:
            lib.srv_destroy(self._srv)
            self._srv = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def serve_forever(self, on_ready=None):
        """Start, block until SIGINT or SIGTERM, stop cleanly. For the main thread."""
        stop = threading.Event()
        old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.start()
            if on_ready:
                on_ready(self)
            while not stop.wait(0.5):
                pass
        finally:
            self.stop()
            for s, h in old.items():
                signal.signal(s, h)
