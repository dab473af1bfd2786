"""Run the C RESP server in this process over a Store. Python only starts and stops it
(settings into the C config, durability opened before and closed after) and reads its
counters (info(), stats(), the metrics endpoint); the C threads serve every request."""
import resource
import signal
import threading

from kvstore import __version__, errors, log, metrics
from kvstore._cstruct import as_dict, split_prefix
from kvstore._native import ffi, lib
from kvstore.client import Client
from kvstore.cluster import Agent, cluster_id
from kvstore.config import ServerConfig
from kvstore.durability import Durability, node_id
from kvstore.store import Store

# The C struct that Server.start fills from the settings' metadata (ServerConfig.c_values).
C_CONFIG = "struct kv_config"
# Descriptors kept for the server's own files beyond maxclients + 4 per thread (log segments,
# data file, replication sockets, metrics, Python's own): Redis keeps 32, kvstore has more files.
FD_RESERVE = 64


def have_dpdk():
    """True if this build has the kernel-bypass UDP front end (libdpdk found at build time)."""
    return bool(lib.srv_have_dpdk())


def c_config(config, **extra):
    """(cdata of C_CONFIG filled from config's settings and extra {C field: value}, keep-alive
    list). str values become char * (kept alive by the list, which must outlive the cdata)."""
    cfg, keep = ffi.new(C_CONFIG + " *"), []
    for name, value in {**config.c_values(), **extra}.items():
        if isinstance(value, str):
            keep.append(ffi.new("char[]", value.encode()))
            value = keep[-1]
        setattr(cfg, name, value)
    return cfg, keep


class Server:
    """Serve ``store`` over RESP2. Use as a context manager or call start()/stop()."""

    def __init__(self, store=None, config=None, from_peer=None, c_extra=None, **settings):
        self.config = (config or ServerConfig(**settings)).validate()
        # {struct kv_config field: cdata} set besides the settings, e.g. nbd (kvstore.BlockDevice's
        # struct nbd_config *: the engine also serves a block device); the caller keeps what
        # the cdata points to alive
        self._c_extra = dict(c_extra or {})
        self.from_peer = from_peer  # "HOST:PORT": fetch this node's log from its peer before recovery
        self.store = store if store is not None else Store(max_memory=self.config.max_memory)
        self._srv = None
        self._keep = []
        self._durability = None
        self._warnings = []
        self._maxclients = self.config.maxclients  # lowered by _adjust_fd_limit to what the fd limit allows
        self._metrics = None  # kvstore.metrics.Endpoint while serving metrics
        # Held while the C objects are read from another thread (a metrics scrape) and
        # while stop() frees them: a scrape never reads a destroyed server.
        self._guard = threading.Lock()
        # A node that waits for its state (Durability.waiting): the thread that waits and
        # attaches it, the event that ends the wait, and why it failed (serve_forever raises it).
        self._loader = None
        self._agent = None  # kvstore.cluster.Agent with --cluster-etcd
        self._loader_stop = threading.Event()
        self.loading_failure = None

    def _adjust_fd_limit(self):
        """Redis's adjustOpenFilesLimit: raise RLIMIT_NOFILE to maxclients + the server's own
        descriptors, as far as allowed (the hard limit too when privileged); if it stays lower,
        lower maxclients to fit (Redis's log lines), so clients past it get -ERR max number of
        clients reached instead of the accept() of a process out of descriptors. Sets
        self._maxclients; returns the warning lines. ConfigError if not even one client fits."""
        c = self.config
        reserve = FD_RESERVE + 4 * c.effective_threads  # per thread: epoll, eventfd, listener, spare
        need = c.maxclients + reserve
        self._maxclients = c.maxclients
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft >= need:
            return []
        error = None
        for limits in ((need, hard if hard == resource.RLIM_INFINITY else max(need, hard)),  # privileged
                       (need if hard == resource.RLIM_INFINITY else min(need, hard), hard)):
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, limits)
                break
            except (ValueError, OSError) as e:
                error = error or (e.strerror if isinstance(e, OSError) else str(e))
        best = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if best >= need:
            log.logger.info("Increased maximum number of open files to %d (it was originally set to %d).",
                            best, soft)
            return []
        if best - reserve < 1:
            raise errors.ConfigError(
                f"Your current 'ulimit -n' of {soft} is not enough for the server to start. Please increase your "
                f"open file limit to at least {need} (maxclients {c.maxclients} + {reserve} for the server's own "
                f"files), or lower --maxclients.")
        self._maxclients = best - reserve
        return [f"You requested maxclients of {c.maxclients} requiring at least {need} max file descriptors.",
                f"Server can't set maximum open files to {need} because of OS error: {error or 'limit too low'}.",
                f"Current maximum open files is {best}. maxclients has been reduced to {self._maxclients} to "
                f"compensate for low ulimit. If you need higher maxclients increase 'ulimit -n'."]

    def start(self):
        if self._srv is not None:
            return self
        c = self.config
        if c.arch == "dpdk" and not have_dpdk():
            raise errors.ConfigError("kvstore was built without DPDK (libdpdk-dev not found at build time)")
        log.configure(c.log_level, c.log_file)  # first: what start-up finds goes to the configured log
        self._warnings = self._adjust_fd_limit()
        for w in self._warnings:
            log.logger.warning("%s", w)
        self._durability = Durability(self.store, c, self.from_peer).open()
        waiting = self._durability.waiting is not None  # no local state, the peer not asked yet: -LOADING
        cfg, self._keep = c_config(c, version=__version__, loading=int(waiting), maxclients=self._maxclients,
                                   **self._durability.c_handles(), **self._c_extra)
        err = ffi.new("char[256]")
        out = ffi.new("struct srv **")
        rc = lib.srv_create(out, self.store._t, cfg, err, 256)
        if rc >= 0:
            rc = lib.srv_start(out[0], err, 256)
            if rc < 0:
                lib.srv_destroy(out[0])
        if rc < 0:
            self._durability.close()
            errors.raise_for(rc, ffi.string(err).decode(errors="replace"))
        self._srv = out[0]
        self._show_identity()
        if waiting:  # the listener is up: now wait for the state, on a thread of its own
            self._loader = threading.Thread(target=self._wait_for_state, name="kvstore-loading", daemon=True)
            self._loader.start()
        if c.metrics_port >= 0:  # after the start: a scrape never sees a server half made
            try:
                self._metrics = metrics.Endpoint(c.metrics_bind, c.metrics_port, self._read_counters)
            except BaseException:
                self.stop()
                raise
            log.logger.info("metrics on http://%s:%d/metrics", c.metrics_bind, self._metrics.port)
        if c.cluster_etcd:
            self._start_agent()
        return self

    def _start_agent(self):
        """The cluster agent (kvstore/cluster.py): the node's lease and slot map from etcd."""
        c = self.config
        if self.port < 0:
            self.stop()
            raise errors.ConfigError("cluster_etcd: the agent talks to its node over --port; it is off (-1)")
        host = c.cluster_announce or ("127.0.0.1" if c.bind in ("0.0.0.0", "") else c.bind)
        client = Client(host="127.0.0.1" if c.bind in ("0.0.0.0", "") else c.bind, port=self.port,
                        password=c.requirepass or None, socket_timeout=5, protocol=2)
        self._agent = Agent(c.cluster_etcd, c.cluster_name, cluster_id(node_id(c.data_dir)), host, self.port,
                            client, ttl=c.cluster_lease_ttl)
        self._agent.start()
        log.logger.info("cluster %s: node %s, etcd %s, lease %d s", c.cluster_name, self._agent.id, c.cluster_etcd,
                        c.cluster_lease_ttl)

    def _show_identity(self):
        """INFO persistence's node_id and, while waiting, what the node waits for."""
        d = self._durability
        nid = node_id(self.config.data_dir, create=False) if self.config.durability == "remote" else None
        lib.srv_set_loading(self._srv, d.waiting.encode() if d.waiting else ffi.NULL, d.last_error.encode(),
                            d.attempts, nid.hex().encode() if nid else ffi.NULL)

    def _wait_for_state(self):
        """The loader thread: wait until the node's state is back (Durability.wait_for_state),
        then attach the log, data file and sender to the running server, which serves. A
        failure is logged and kept; serve_forever then stops the server and raises it."""
        d = self._durability

        def progress(attempts, last_error):
            with self._guard:
                if self._srv is not None:
                    lib.srv_set_loading(self._srv, ffi.NULL, last_error.encode(), attempts, ffi.NULL)

        try:
            if not d.wait_for_state(self._loader_stop, progress):
                return  # stopped while waiting
            h = d.c_handles()
            err = ffi.new("char[256]")
            with self._guard:
                self._show_identity()  # the identity may come from the peer's copy
                errors.raise_for(lib.srv_attach(self._srv, h["wal"], h["bosc"], h["sender"], err, 256),
                                 ffi.string(err).decode(errors="replace"))
            log.logger.warning("state recovered after %d tries: serving", d.attempts)
        except Exception as e:  # noqa: BLE001 - any failure ends the wait; serve_forever reports it
            self.loading_failure = e
            log.logger.error("the node cannot recover its state: %s", e)

    def startup_report(self):
        """What start-up did and found, one line each: fd-limit warning, log fetched from
        the peer, LOCAL-COMPLETE start, log receiver port, data file and recovery summaries."""
        lines = self._warnings + (self._durability.report() if self._durability else [])
        if self._metrics is not None:
            lines.append(f"metrics on http://{self.config.metrics_bind}:{self._metrics.port}/metrics")
        return lines

    @property
    def durability(self):
        """The running server's kvstore.durability.Durability (its log, data file, sender,
        receiver and their stats()), or None when stopped."""
        return self._durability

    @property
    def port(self):
        return lib.srv_port(self._srv) if self._srv is not None else self.config.port

    @property
    def tls_port(self):
        """The TLS port (the one bound when tls_port was 0), or None when TLS is off."""
        port = lib.srv_tls_port(self._srv) if self._srv is not None else self.config.tls_port
        return port if port >= 0 else None

    @property
    def mqtt_port(self):
        """The MQTT port (the one bound when mqtt_port was 0), or None when MQTT is off."""
        port = lib.srv_mqtt_port(self._srv) if self._srv is not None else self.config.mqtt_port
        return port if port >= 0 else None

    @property
    def udp_port(self):
        """arch udp/dpdk: the UDP front end's port (the one bound when udp_port was 0)."""
        return lib.srv_udp_port(self._srv) if self._srv is not None else self.config.udp_port

    def _nbd_server(self):
        """The struct nbd_server * of the block device this engine serves (kv_config.nbd set:
        kvstore.BlockDevice reads its port and counters), or NULL; valid until stop()."""
        return lib.srv_nbd(self._srv)

    @property
    def metrics_port(self):
        """The metrics endpoint's port (the one bound when metrics_port was 0), or None when off."""
        return self._metrics.port if self._metrics is not None else None

    def info(self, section="default"):
        """What INFO <section> shows, read without a connection, as redis-py's info() gives it:
        {field: value}, numbers as int or float, k=v lists (cmdstat_<cmd>, db0, poller0, ...) as
        dicts. section: INFO's arguments, space separated ("persistence replication", "all",
        "everything"; "default" or "" the default set). Any thread; ServerError when stopped."""
        with self._guard:
            return metrics.parse_info(self._info_text(section))

    def _info_text(self, section):
        """INFO's text (caller holds _guard)."""
        if self._srv is None:
            raise errors.ServerError("the server is not running")
        words = str(section).split()
        if (len(words) > lib.SRV_INFO_MAX_SECTIONS or any(len(w) > lib.SRV_INFO_MAX_NAME for w in words)
                or not str(section).isascii()):
            raise errors.ConfigError(f"info: expected at most {lib.SRV_INFO_MAX_SECTIONS} section names of at "
                                     f"most {lib.SRV_INFO_MAX_NAME} ASCII characters, got {section!r}")
        arg = " ".join(words).encode()
        cap = 1 << 16
        while True:  # the text grows between two calls only by a few counters' digits
            buf = ffi.new("char[]", cap)
            n = errors.raise_for(lib.srv_info(self._srv, arg, buf, cap))
            if n < cap:
                return ffi.string(buf, n).decode(errors="replace")
            cap = n + 4096

    def _read_counters(self):
        """What a metrics scrape reads (kvstore.metrics.Collector): None once stopped."""
        with self._guard:
            if self._srv is None:
                return None
            snap = {"info": metrics.parse_info(self._info_text("everything")), "sync": None}
            log = self._durability.log if self._durability else None
            if log is not None:
                st = log.stats()
                bounds = [lib.wal_sync_bound_us(i) / 1e6 for i in range(lib.WAL_SYNC_BUCKETS - 1)]
                snap["sync"] = (bounds, st["sync_buckets"], st["sync_ns_total"] / 1e9)
            return snap

    def stats(self):
        st = ffi.new("struct fe_stats *")
        lib.srv_get_stats(self._srv, st)
        d = as_dict(st, skip=("pollers",))  # pollers: the count; the list of their counters follows
        udp = split_prefix(d, "udp_")  # the UDP front end's counters (zero without one)
        if self.config.arch in ("udp", "dpdk"):
            d["udp"] = udp
        ps = ffi.new("struct fe_thread_stats *")
        d["pollers"] = []
        for i in range(st.pollers):
            lib.srv_get_poller_stats(self._srv, i, ps)
            d["pollers"].append(as_dict(ps))
        return d

    def stop(self):
        if self._agent is not None:  # first: the lease given back, so the cluster sees the node go
            self._agent.stop()
            self._agent = None
        if self._metrics is not None:  # no scrape starts once the server is going
            self._metrics.close()
            self._metrics = None
        if self._loader is not None:  # it may be opening the durability pieces: let it finish
            self._loader_stop.set()
            self._loader.join()
            self._loader = None
        with self._guard:  # a scrape in flight finishes reading first
            self._stop()

    def _stop(self):
        if self._srv is not None:
            lib.srv_stop(self._srv)  # pollers joined: nothing appends any more
        # The log wakes the pollers through their eventfds: close it while those
        # descriptors are still open (srv_destroy closes them).
        if self._durability is not None:
            self._durability.close()
        if self._srv is not None:
            lib.srv_destroy(self._srv)
            self._srv = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def serve_forever(self, on_ready=None):
        """Start, block until SIGINT or SIGTERM, stop cleanly; SIGHUP reopens the log file
        (after logrotate moved it). For the main thread."""
        serve_until_signal(self.start, self.stop, (lambda: on_ready(self)) if on_ready else None,
                           self.check_loading)

    def check_loading(self):
        """Raise why a node waiting for its state could not recover it, if it could not."""
        if self.loading_failure is not None:
            raise self.loading_failure if isinstance(self.loading_failure, errors.KVError) else \
                errors.ServerError(str(self.loading_failure))


def serve_until_signal(start, stop, on_ready=None, check=None):
    """start(), on_ready(), then block until SIGINT or SIGTERM (calling check() every half
    second: what it raises ends the wait), and stop() in any case; SIGHUP reopens the log
    file (after logrotate moved it). The signal handlers are put back after. Main thread."""
    stopping = threading.Event()

    def on_stop(signum, _):
        log.logger.warning("received %s, shutting down", signal.Signals(signum).name)
        stopping.set()

    def on_hup(*_):
        try:
            log.reopen()
            log.logger.info("log file reopened (SIGHUP)")
        except errors.KVError:
            pass  # the old file keeps the log, and says why the new one could not be opened

    old = {s: signal.signal(s, on_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    old[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hup)
    try:
        start()
        if on_ready:
            on_ready()
        while not stopping.wait(0.5):
            if check:
                check()
    finally:
        stop()
        for s, h in old.items():
            signal.signal(s, h)
