"""Server settings: defaults, TOML file, validation with messages that say what is accepted."""
import dataclasses
import os
import re
import tomllib

from kvstore.errors import ConfigError

_SIZE = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$", re.IGNORECASE)
# Redis's units (k/m/g: powers of 1000; kb/mb/gb: powers of 1024), plus the explicit kib/mib/gib.
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1024, "kib": 1024, "m": 1000**2, "mb": 1024**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1024**3, "gib": 1024**3, "t": 1000**4, "tb": 1024**4,
          "tib": 1024**4}


def parse_size(value, what="size"):
    """Bytes from an int or a string such as '64mb', '1gb', '512k' — Redis's units:
    k/m/g are powers of 1000, kb/mb/gb (and kib/mib/gib) powers of 1024."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a size such as 1048576, '64mb' or '1gb', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{what}: must not be negative, got {value}")
        return value
    m = _SIZE.match(str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"{what}: expected a size such as 1048576, '64mb' or '1gb' "
                          f"(units b, k, kb, m, mb, g, gb, as Redis), got {value!r}")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def parse_address(text, what):
    """(host, port) from 'IPV4:PORT', or a ConfigError naming `what` and the form expected."""
    host, _, port = str(text).rpartition(":")
    parts = host.split(".")
    if not (len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts) and port.isdigit()
            and 0 < int(port) < 65536):
        raise ConfigError(f"{what}: expected IPV4:PORT such as 127.0.0.1:7380, got {text!r}")
    return host, int(port)


DURABILITY_MODES = ("none", "disk", "remote")


@dataclasses.dataclass
class ServerConfig:
    bind: str = "127.0.0.1"
    port: int = 6380
    threads: int = 0             # pollers (0 = one per core), or threadpool workers (0 = 32)
    arch: str = "poller"         # poller | threadpool | udp | dpdk
    max_memory: int = 0          # bytes, 0 = unbounded
    maxclients: int = 10000
    requirepass: str = ""
    accept: str = "reuseport"    # or "handoff"
    poll_policy: str = "direct"  # or "strict"
    data_dir: str = "data"
    durability: str = "none"     # none | disk | remote
    peer: str = ""               # remote: the peer's log receiver, HOST:PORT
    repl_port: int = -1          # this node's log receiver port (-1 = off, 0 = any free port)
    ship_interval_us: int = 100  # remote: ship gathered log records this often
    max_batch_records: int = 65536
    peer_timeout_ms: int = 1000  # remote: an ack overdue this long = peer lost -> disk mode
    disk_log_interval_ms: int = 1000  # remote: the local log is written+synced this often
    peer_startup_wait_ms: int = 10000  # remote: how long start waits to compare logs with the peer
    data_file: bool = None       # BOSC data file: on with disk/remote, off with none unless asked
    data_buckets: int = 65536    # home blocks of a new data file (4 KiB each, sparse)
    flush_interval_ms: int = 5000  # the flusher sweeps at least this often while keys are dirty
    log_segment_size: int = 64 * 1024 * 1024  # a new log segment past this size
    dirty_queue: str = "ldu"     # the flusher's queue: ldu (lock-less) or locked (a mutex, to compare)
    network_only: bool = False   # benchmark switch: SET answers +OK without touching the table
    tcp_backlog: int = 511
    udp_port: int = 6380         # arch udp/dpdk: UDP port of the front end (udp: 0 = any free port)
    udp_workers: int = 1         # arch udp/dpdk: UDP worker threads (dpdk: lcores, one RX/TX queue pair each)
    dpdk_iface: str = ""         # arch dpdk: interface of the AF_XDP port (one end of a veth pair, a NIC)
    dpdk_eal_args: str = ""      # arch dpdk: extra DPDK EAL arguments, space separated
    config_file: str = ""

    FIELDS_HELP = {
        "bind": "IPv4 address to listen on",
        "port": "TCP port, 0-65535 (0 = any free port)",
        "threads": "poller threads (0 = one per core), or with arch threadpool the workers (0 = 32)",
        "arch": "request handling: poller (per-core epoll pollers, non-blocking), threadpool (a pool of "
                "workers, each serving one request at a time with blocking calls: paper 000's baseline), udp "
                "(UDP front end on kernel sockets, recvmmsg/sendmmsg) or dpdk (the same UDP front end on "
                "dpdk_iface, DPDK lcores bypassing the kernel); with udp and dpdk, TCP is still served by pollers",
        "udp_port": "arch udp/dpdk: UDP port of the front end (udp: 0 = any free port)",
        "udp_workers": "arch udp/dpdk: UDP worker threads; with dpdk, lcores each polling one RX/TX queue pair "
                       "(the interface needs as many queues)",
        "dpdk_iface": "arch dpdk: network interface for DPDK's AF_XDP port (e.g. one end of a veth pair)",
        "dpdk_eal_args": "arch dpdk: extra DPDK EAL arguments, space separated (kvstore already passes "
                         "--no-huge --no-pci -m 256 --no-telemetry --file-prefix --lcores --vdev)",
        "network_only": "benchmark switch (paper 000's N row): SET answers +OK without touching the table, "
                        "nothing is stored",
        "max_memory": "memory bound, bytes or '64mb'/'1gb' (Redis units), 0 = unbounded",
        "maxclients": "maximum simultaneous client connections",
        "requirepass": "password clients must AUTH with ('' = none)",
        "accept": "how connections reach pollers: reuseport or handoff",
        "poll_policy": "epoll EPOLLOUT policy: direct (write at the end of each round), strict (EPOLLOUT "
                       "per reply) or flexpoll (EPOLLOUT kept, edge-triggered, while replies come often, paper 002)",
        "data_dir": "directory for the node's files (the log lives in <data_dir>/log)",
        "durability": "none (memory only), disk (acknowledge after the log is fdatasync'ed) or remote "
                      "(acknowledge once the peer's memory holds the log record too)",
        "peer": "remote mode: HOST:PORT of the peer's log receiver (its --repl-port)",
        "repl_port": "port of this node's log receiver, storing a peer's log (-1 = off, 0 = any)",
        "ship_interval_us": "remote mode: ship gathered log records every this many microseconds",
        "max_batch_records": "remote mode: at most this many records per shipped batch",
        "peer_timeout_ms": "remote mode: an ack overdue this long means the peer is lost",
        "disk_log_interval_ms": "remote mode: the local log is written and synced this often",
        "peer_startup_wait_ms": "remote mode: at start, wait this long for the peer to compare logs",
        "data_file": "keep a BOSC data file (<data_dir>/data.kvd): memory bounded by max_memory (full memory "
                     "makes writes wait for the flusher), log segments deleted once flushed. Default: on with "
                     "disk and remote; with none only when asked (a cache that spills to disk: what the last "
                     "sweep wrote is kept, nothing is durable)",
        "data_buckets": "home blocks (4 KiB) of a new data file; keys per block ~ keys / data_buckets",
        "flush_interval_ms": "the data-file flusher sweeps at least this often while keys are dirty",
        "dirty_queue": "the data file's dirty-key queue: ldu (lock-less, paper 003) or locked (a mutex-protected "
                       "list, kept to measure LDU against)",
        "log_segment_size": "start a new log segment past this size (bytes or '64mb'); with a data file, "
                            "segments wholly below the flushed LSN are deleted",
        "tcp_backlog": "listen() backlog",
    }

    def validate(self):
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port: expected an integer from 0 to 65535, got {self.port!r}")
        if not isinstance(self.threads, int) or not 0 <= self.threads <= 1024:
            raise ConfigError(f"threads: expected an integer from 0 (one per core) to 1024, got {self.threads!r}")
        if not isinstance(self.maxclients, int) or self.maxclients < 1:
            raise ConfigError(f"maxclients: expected a positive integer, got {self.maxclients!r}")
        self.max_memory = parse_size(self.max_memory, "max_memory")
        self.log_segment_size = parse_size(self.log_segment_size, "log_segment_size")
        if self.log_segment_size < 4096:
            raise ConfigError(f"log_segment_size: expected at least 4096 bytes, got {self.log_segment_size}")
        if self.accept not in ("reuseport", "handoff"):
            raise ConfigError(f"accept: expected 'reuseport' or 'handoff', got {self.accept!r}")
        if self.durability not in DURABILITY_MODES:
            raise ConfigError(f"durability: expected one of {', '.join(DURABILITY_MODES)}, got {self.durability!r}")
        if self.durability == "remote":
            if not self.peer:
                raise ConfigError("durability remote needs --peer HOST:PORT (the peer's --repl-port)")
            self.peer_address()
        for name, lo in (("ship_interval_us", 1), ("max_batch_records", 1), ("peer_timeout_ms", 10),
                         ("disk_log_interval_ms", 1), ("peer_startup_wait_ms", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or v < lo:
                raise ConfigError(f"{name}: expected an integer >= {lo}, got {v!r}")
        if self.data_file is None:
            self.data_file = self.durability != "none"
        if not isinstance(self.data_file, bool):
            raise ConfigError(f"data_file: expected true or false, got {self.data_file!r}")
        if not isinstance(self.data_buckets, int) or not 1 <= self.data_buckets <= 1 << 30:
            raise ConfigError(f"data_buckets: expected an integer from 1 to {1 << 30}, got {self.data_buckets!r}")
        if not isinstance(self.flush_interval_ms, int) or self.flush_interval_ms < 1:
            raise ConfigError(f"flush_interval_ms: expected an integer >= 1, got {self.flush_interval_ms!r}")
        if not isinstance(self.repl_port, int) or not -1 <= self.repl_port <= 65535:
            raise ConfigError(f"repl_port: expected -1 (off) or a port from 0 to 65535, got {self.repl_port!r}")
        if self.arch not in ("poller", "threadpool", "udp", "dpdk"):
            raise ConfigError(f"arch: expected 'poller', 'threadpool', 'udp' or 'dpdk', got {self.arch!r}")
        if self.arch in ("udp", "dpdk"):
            self._validate_udp()
        if not isinstance(self.network_only, bool):
            raise ConfigError(f"network_only: expected true or false, got {self.network_only!r}")
        if self.dirty_queue not in ("ldu", "locked"):
            raise ConfigError(f"dirty_queue: expected 'ldu' or 'locked', got {self.dirty_queue!r}")
        if self.poll_policy not in ("direct", "strict", "flexpoll"):
            raise ConfigError(f"poll_policy: expected 'direct', 'strict' or 'flexpoll', got {self.poll_policy!r}")
        if not isinstance(self.requirepass, str):
            raise ConfigError("requirepass: expected a string")
        parts = str(self.bind).split(".")
        if len(parts) != 4 or not all(p.isdigit() and int(p) < 256 for p in parts):
            raise ConfigError(f"bind: expected an IPv4 address such as 127.0.0.1, got {self.bind!r}")
        return self

    def _validate_udp(self):
        if not isinstance(self.udp_workers, int) or not 1 <= self.udp_workers <= 63:
            raise ConfigError(f"udp_workers: expected an integer from 1 to 63, got {self.udp_workers!r}")
        low = 0 if self.arch == "udp" else 1
        if not isinstance(self.udp_port, int) or not low <= self.udp_port <= 65535:
            raise ConfigError(f"udp_port: expected a UDP port from {low} to 65535"
                              + (" (0 = any free port)" if low == 0 else "") + f", got {self.udp_port!r}")
        if self.requirepass:
            raise ConfigError(f"arch {self.arch}: requirepass is not supported: the UDP front end has no AUTH "
                              "(anyone who can send it a datagram could write)")
        if self.arch == "dpdk" and (not self.dpdk_iface or not isinstance(self.dpdk_iface, str)
                                    or len(self.dpdk_iface) > 15):
            raise ConfigError(f"dpdk_iface: arch dpdk needs a network interface name (at most 15 characters), "
                              f"e.g. --dpdk-iface veth0; got {self.dpdk_iface!r}")
        if not isinstance(self.dpdk_eal_args, str):
            raise ConfigError("dpdk_eal_args: expected a string of space-separated EAL arguments")

    def peer_address(self):
        return parse_address(self.peer, "peer")

    @property
    def effective_threads(self):
        if self.arch == "threadpool":
            return self.threads or 32
        if self.arch in ("udp", "dpdk"):  # the TCP pollers are only the control path: leave the cores to UDP
            return self.threads or 1
        return self.threads or os.cpu_count() or 1

    @classmethod
    def load(cls, path=None, **overrides):
        """Defaults, then the TOML file (if any), then overrides (None values ignored)."""
        values = {}
        if path:
            try:
                with open(path, "rb") as f:
                    data = tomllib.load(f)
            except FileNotFoundError:
                raise ConfigError(f"config file {path}: no such file") from None
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"config file {path}: invalid TOML: {e}") from None
            data = data.get("server", data)
            known = {f.name for f in dataclasses.fields(cls)}
            for k, v in data.items():
                key = k.replace("-", "_")
                if key not in known or key == "config_file":
                    raise ConfigError(f"config file {path}: unknown setting {k!r}; known: "
                                      + ", ".join(sorted(cls.FIELDS_HELP)))
                values[key] = v
            values["config_file"] = os.path.abspath(path)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values).validate()
