"""Run the C RESP server in this process over a Store. Python only starts and stops it
(settings into the C config, durability opened before and closed after); the C threads
serve every request."""
import resource
import signal
import threading

from kvstore import __version__, errors, log
from kvstore._cstruct import as_dict, split_prefix
from kvstore._native import ffi, lib
from kvstore.config import ServerConfig
from kvstore.durability import Durability
from kvstore.store import Store

# The C struct that Server.start fills from the settings' metadata (ServerConfig.c_values).
C_CONFIG = "struct kv_config"


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

    def __init__(self, store=None, config=None, from_peer=None, **settings):
        self.config = (config or ServerConfig(**settings)).validate()
        self.from_peer = from_peer  # "HOST:PORT": fetch this node's log from its peer before recovery
        self.store = store if store is not None else Store(max_memory=self.config.max_memory)
        self._srv = None
        self._keep = []
        self._durability = None
        self._warnings = []

    def _raise_fd_limit(self):
        """Like Redis: make room for maxclients connections (+ a margin for our own fds).
        Returns a warning line if the limit stays too low, else None."""
        need = self.config.maxclients + 64
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft >= need:
            return None
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
        if target < need:
            return (f"warning: open-file limit {target} is below maxclients + 64 = {need}; "
                    f"connections beyond ~{target - 64} will be refused by accept()")
        return None

    def start(self):
        if self._srv is not None:
            return self
        c = self.config
        if c.arch == "dpdk" and not have_dpdk():
            raise errors.ConfigError("kvstore was built without DPDK (libdpdk-dev not found at build time)")
        log.configure(c.log_level, c.log_file)  # first: what start-up finds goes to the configured log
        self._warnings = [w for w in (self._raise_fd_limit(),) if w]
        for w in self._warnings:
            log.logger.warning("%s", w)
        self._durability = Durability(self.store, c, self.from_peer).open()
        cfg, self._keep = c_config(c, version=__version__, **self._durability.c_handles())
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
        return self

    def startup_report(self):
        """What start-up did and found, one line each: fd-limit warning, log fetched from
        the peer, LOCAL-COMPLETE start, log receiver port, data file and recovery summaries."""
        return self._warnings + (self._durability.report() if self._durability else [])

    @property
    def durability(self):
        """The running server's kvstore.durability.Durability (its log, data file, sender,
        receiver and their stats()), or None when stopped."""
        return self._durability

    @property
    def port(self):
        return lib.srv_port(self._srv) if self._srv is not None else self.config.port

    @property
    def udp_port(self):
        """arch udp/dpdk: the UDP front end's port (the one bound when udp_port was 0)."""
        return lib.srv_udp_port(self._srv) if self._srv is not None else self.config.udp_port

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
        stop = threading.Event()

        def on_stop(signum, _):
            log.logger.warning("received %s, shutting down", signal.Signals(signum).name)
            stop.set()

        def on_hup(*_):
            try:
                log.reopen()
                log.logger.info("log file reopened (SIGHUP)")
            except errors.KVError:
                pass  # the old file keeps the log, and says why the new one could not be opened

        old = {s: signal.signal(s, on_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        old[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hup)
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
