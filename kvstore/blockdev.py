"""kvstore.BlockDevice: a block device over the key-value store, served by NBD (paper 001).

Python only configures, starts and stops the C server (ext/frontend/nbd.h) and reads its
counters; the C threads serve every request. Two shapes: "embedded" is a kvstore.Server
whose engine also runs the NBD front end (kv_config.nbd set: the blocks live in this
process's table, durable as its durability mode says, RESP served beside it); a network
backend (kvstore://, redis://, memcached://) is an NBD server alone (nbd_create with no
engine) whose threads talk to that server.
"""
import dataclasses
import threading

from kvstore import errors
from kvstore._cstruct import as_dict
from kvstore._native import ffi, lib
from kvstore.config import BlockdevConfig, ServerConfig, redact
from kvstore.server import Server, serve_until_signal

_BLOCKDEV_FIELDS = {f.name for f in dataclasses.fields(BlockdevConfig)}
# Settings both declare (the node's TLS certificate settings, kvstore.config._node_setting)
SHARED_TLS = ("tls_cert_file", "tls_key_file", "tls_ca_cert_file", "tls_auth_clients")
_SERVER_FIELDS = {f.name for f in dataclasses.fields(ServerConfig)}


def c_nbd_config(config):
    """(cdata struct nbd_config * filled from a validated BlockdevConfig, keep-alive list
    of the strings it points to: the list must outlive the cdata)."""
    cfg, keep = ffi.new("struct nbd_config *"), []
    for name, value in config.c_values().items():
        if isinstance(value, str):
            keep.append(ffi.new("char[]", value.encode()))
            value = keep[-1]
        setattr(cfg, name, value)
    return cfg, keep


def stats_view(raw, block_size):
    """The counters of struct nbd_stats ({name: int}) with what they mean per I/O added, as
    INFO blockdev computes them: ios (NBD reads + writes + trims + zeroes; flushes apart),
    kv_requests (GET + PUT + DEL; SYNCs apart), kv_requests_per_io and queue_depth (the mean
    of in-flight requests, sampled by the threads; 0 before any sample)."""
    d = dict(raw)
    d["ios"] = sum(d.get(k, 0) for k in ("reads", "writes", "trims", "zeroes"))
    d["kv_requests"] = sum(d.get(k, 0) for k in ("kv_gets", "kv_puts", "kv_dels"))
    d["kv_requests_per_io"] = d["kv_requests"] / d["ios"] if d["ios"] else 0.0
    samples = d.get("inflight_samples", 0)
    d["queue_depth"] = d.get("inflight_sum", 0) / samples if samples else 0.0
    d["block_size"] = block_size
    return d


class BlockDevice:
    """A block device of `size` bytes whose blocks are key-value pairs, served over NBD.

    >>> with kvstore.BlockDevice(size="1G", durability="none") as dev:
    ...     subprocess.run(["nbdinfo", dev.uri])
    size: bytes or "4G" (powers of 1024). backend: "embedded" (default), "kvstore://HOST:PORT",
    "redis://HOST:PORT[/DB]" or "memcached://HOST:PORT" (kvstore.config.BACKEND_FORMS).
    Other keywords: the block device's settings (kvstore.config.BlockdevConfig: listen,
    unix, export, threads, connections_per_thread, block_size, read_only, key_prefix, ...;
    listen defaults to "127.0.0.1:0" here: any free port, .port says which) and, embedded
    only, the engine's (kvstore.config.ServerConfig: durability, data_dir, max_memory, ...;
    its RESP port defaults to 0 here). None values are left out. Or pass config= (a
    BlockdevConfig) and server_config= (a ServerConfig); store= an existing kvstore.Store
    for the embedded engine.
    """

    def __init__(self, size=None, backend=None, *, config=None, server_config=None, store=None, **settings):
        settings = {k: v for k, v in settings.items() if v is not None}
        if config is not None and (size is not None or backend is not None
                                   or _BLOCKDEV_FIELDS & settings.keys()):
            raise TypeError("give config= or the block device's settings, not both")
        unknown = settings.keys() - _BLOCKDEV_FIELDS - _SERVER_FIELDS
        if unknown:
            raise TypeError(f"BlockDevice: unknown setting(s) {', '.join(sorted(unknown))}; block device settings: "
                            f"{', '.join(f.name for f in BlockdevConfig.settings())}; with backend embedded also "
                            "the engine's (kvstore.config.ServerConfig)")
        own = {k: v for k, v in settings.items() if k in _BLOCKDEV_FIELDS}
        engine = {k: v for k, v in settings.items() if k not in _BLOCKDEV_FIELDS}
        if config is None:
            if "listen" not in own and "unix" not in own:
                own["listen"] = "127.0.0.1:0"
            config = BlockdevConfig(size=size if size is not None else 0,
                                    backend=backend if backend is not None else "embedded", **own)
        self.config = config.validate()
        embedded = self.config.backend_scheme == "embedded"
        if not embedded and (engine or server_config is not None or store is not None):
            given = ", ".join(sorted(engine)) or ("server_config" if server_config is not None else "store")
            raise errors.ConfigError(f"{given}: the engine's settings apply to backend embedded only; "
                                     f"{redact(self.config.backend)} is configured where it runs")
        if embedded and server_config is None:
            engine.setdefault("port", 0)
            # the certificate settings are both's: the engine's --tls-port (if any) uses them too
            engine.update({k: own[k] for k in SHARED_TLS if k in own and k not in engine})
            server_config = ServerConfig(**engine)
        elif embedded and engine:
            raise TypeError("give server_config= or the engine's settings, not both")
        self.server_config = server_config.validate() if embedded else None
        self._store = store
        self.server = None  # embedded: the kvstore.Server that runs the engine and the NBD front end
        self._nbd = None    # network backends: the struct nbd_server * this object created
        self._handle = None  # the running struct nbd_server * (the engine's, or _nbd)
        self._keep = []
        self._port = None
        self._lock = threading.Lock()  # start/stop against stats() from another thread

    # ---- life cycle

    def start(self):
        """Bind the listeners, connect the backend and start the threads (ConfigError /
        ServerError with the C side's message if that fails). Returns self."""
        with self._lock:
            if self.server is not None or self._nbd is not None:
                return self
            if self.config.backend_scheme == "embedded":
                self._start_embedded()
            else:
                self._start_network()
            return self

    def _start_embedded(self):
        nbd, keep = c_nbd_config(self.config)
        server = Server(store=self._store, config=self.server_config, c_extra={"nbd": nbd})
        server.start()
        self.server, self._keep = server, keep
        self._handle = server._nbd_server()
        port = lib.nbd_port(self._handle)
        self._port = port if port >= 0 else None

    def _start_network(self):
        nbd, keep = c_nbd_config(self.config)
        err = ffi.new("char[512]")
        out = ffi.new("struct nbd_server **")
        rc = lib.nbd_create(out, nbd, ffi.NULL, err, 512)
        if rc >= 0:
            rc = lib.nbd_start(out[0], err, 512)
            if rc < 0:
                lib.nbd_destroy(out[0])
        if rc < 0:
            errors.raise_for(rc, ffi.string(err).decode(errors="replace"))
        self._nbd, self._keep = out[0], keep
        self._handle = self._nbd
        port = lib.nbd_port(self._nbd)
        self._port = port if port >= 0 else None

    def stop(self):
        """Stop the threads and close every connection (a client sees its connection end).
        With the embedded engine, its durability is closed too. Idempotent."""
        with self._lock:
            self._handle = None
            if self.server is not None:
                self.server.stop()
                self.server = None
            if self._nbd is not None:
                lib.nbd_stop(self._nbd)
                lib.nbd_destroy(self._nbd)
                self._nbd = None
            self._keep = []

    @property
    def running(self):
        return self.server is not None or self._nbd is not None

    def __enter__(self):
        return self.start()

    def serve_forever(self, on_ready=None):
        """Start, call on_ready(self), block until SIGINT or SIGTERM, stop (main thread;
        as kvstore.Server.serve_forever)."""
        def check():
            if self.server is not None:
                self.server.check_loading()

        serve_until_signal(self.start, self.stop, (lambda: on_ready(self)) if on_ready else None, check)

    def __exit__(self, *exc):
        self.stop()

    # ---- where clients connect

    @property
    def port(self):
        """The NBD TCP port (the one bound for port 0), or None without a TCP listener."""
        return self._port

    @property
    def uris(self):
        """The NBD URIs of the export: TCP first, then the unix socket (if configured)."""
        cfg, out = self.config, []
        s = "s" if cfg.tls == "require" else ""  # nbds: the client starts TLS (it must, then)
        if cfg.effective_listen and self._port is not None:
            out.append(f"nbd{s}://{cfg.effective_listen.rpartition(':')[0]}:{self._port}/{cfg.export}")
        if cfg.unix:
            out.append(f"nbd{s}+unix:///{cfg.export}?socket={cfg.unix}")
        return out

    @property
    def uri(self):
        """The export's NBD URI (nbd://HOST:PORT/EXPORT, or nbd+unix:///EXPORT?socket=PATH
        without a TCP listener), for nbdinfo, nbdcopy, qemu-img, fio --uri, nbdfuse."""
        if not self.running:
            raise errors.ServerError("the block device is not running: start() it first")
        return self.uris[0]

    # ---- counters

    def stats(self):
        """The block device's counters (struct nbd_stats: NBD requests by kind, bytes, KV
        operations, errors, in-flight) plus ios, kv_requests, kv_requests_per_io and
        queue_depth (stats_view). Any thread; ServerError when stopped."""
        with self._lock:
            if self._handle is None:
                raise errors.ServerError("the block device is not running")
            st = ffi.new("struct nbd_stats *")
            lib.nbd_get_stats(self._handle, st)
            return stats_view(as_dict(st), self.config.block_size)
