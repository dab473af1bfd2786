"""Server settings, each declared once: a ServerConfig field whose metadata (help, type,
default, choices or bounds, command-line form, C config field) is the single source of
the `kvstore serve` options, the TOML checks, validate()'s messages and the C config.
Cross-field rules (remote needs a peer, udp/dpdk limits) are explicit code in validate()."""
import dataclasses
import json
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


IDLE_CLIENT_BYTES = 20 << 10  # a connected, idle client: its 16 KiB read buffer and its state


def clients_memory_bound(value, max_memory, maxclients=10000):
    """maxmemory-clients in bytes and as given ("" = the default: 10% of max_memory, or of the
    machine's RAM when max_memory is 0, and at least 64 MiB more than maxclients idle clients
    hold, so that idle clients are never evicted). Returns (bytes, percent or -1)."""
    text = str(value).strip()
    if text == "":
        base = max_memory or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return max(base // 10, (64 << 20) + maxclients * IDLE_CLIENT_BYTES), -1
    if text.endswith("%"):
        digits = text[:-1].strip()
        if not digits.isdigit() or not 0 < int(digits) <= 100:
            raise ConfigError(f"maxmemory_clients: expected a percentage from 1% to 100%, got {value!r}")
        base = max_memory or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return base * int(digits) // 100, int(digits)
    try:
        return parse_size(value if isinstance(value, int) else text, "maxmemory_clients"), -1
    except ConfigError:
        raise ConfigError("maxmemory_clients: expected a size such as 256mb, a percentage such as 10%, or 0 "
                          f"(no bound), got {value!r}") from None


def parse_output_limit(value):
    """'normal HARD SOFT SECONDS' (Redis's client-output-buffer-limit for normal clients) as the
    string C parses again: 'HARD SOFT SECONDS' in bytes and seconds."""
    words = str(value).split()
    if len(words) != 4 or words[0].lower() != "normal":
        raise ConfigError("client_output_buffer_limit: expected 'normal HARD SOFT SECONDS', e.g. "
                          f"'normal 32mb 8mb 60' (0 = no limit); got {value!r}")
    hard = parse_size(words[1], "client_output_buffer_limit hard")
    soft = parse_size(words[2], "client_output_buffer_limit soft")
    if not words[3].isdigit():
        raise ConfigError(f"client_output_buffer_limit: SECONDS must be a whole number, got {words[3]!r}")
    return f"{hard} {soft} {int(words[3])}"


def parse_address(text, what):
    """(host, port) from 'IPV4:PORT', or a ConfigError naming `what` and the form expected."""
    host, _, port = str(text).rpartition(":")
    parts = host.split(".")
    if not (len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts) and port.isdigit()
            and 0 < int(port) < 65536):
        raise ConfigError(f"{what}: expected IPV4:PORT such as 127.0.0.1:7380, got {text!r}")
    return host, int(port)


DURABILITY_MODES = ("none", "disk", "remote")
ARCHS = ("poller", "threadpool", "udp", "dpdk")
LOG_LEVELS = ("debug", "verbose", "notice", "warning")  # Redis's; the index is ext/core/log.h's level

SIZE, IPV4, PATH = "size", "ipv4", "path"  # types beyond int, str, bool
DISK_SIZE = "disk size"  # a block device's size: bytes or K/M/G/T, powers of 1024 (parse_disk_size)


def setting(default, help, type=None, *, choices=None, min=None, max=None, accepts=None, shown=True,
            cli="option", c=None, to_c=None):
    """A ServerConfig field and everything said about it.

    help: the option's help text (also the TOML key's meaning).
    type: int, str, bool, SIZE (bytes or '64mb', Redis units), DISK_SIZE (bytes or '4G', powers of
          1024), IPV4 or PATH (a directory);
          by default the default's type.
    choices / min / max: the values accepted; accepts: how a refusal says what is accepted
          ("expected <accepts>, got ..."), by default worded from type, choices and bounds.
    shown: the "[default: ...]" of --help: True = the default, a string = that text,
          None = nothing shown.
    cli: "option" (--name VALUE), "flag" (--name, on only), "switch" (--name/--no-name) or None
          (not a command-line option, nor a TOML key).
    c: the struct kv_config field filled from it (None: not passed to C);
    to_c(value, config): the value C gets, if not the setting itself (strings become char *)."""
    if type is None:
        type = {bool: bool, int: int, str: str}[default.__class__]
    return dataclasses.field(default=default, metadata=dict(
        help=help, type=type, choices=choices, min=min, max=max, accepts=accepts or _accepts(type, choices, min, max),
        shown=shown, cli=cli, c=c, to_c=to_c))


def _one_of(choices):
    q = [repr(x) for x in choices]
    return ", ".join(q[:-1]) + " or " + q[-1] if len(q) > 1 else q[0]


def _accepts(type, choices, lo, hi):
    if choices:
        return _one_of(choices)
    if type is bool:
        return "true or false"
    if type is IPV4:
        return "an IPv4 address such as 127.0.0.1"
    if type is SIZE:
        return f"at least {lo} bytes" if lo else "a size"
    if type is DISK_SIZE:
        return "a size in bytes or with a binary unit, such as 1073741824, '512M' or '4G'"
    if type is int:
        if lo is not None and hi is not None:
            return f"an integer from {lo} to {hi}"
        return f"an integer >= {lo}" if lo is not None else "an integer"
    return "a string"


@dataclasses.dataclass
class ServerConfig:
    """Every setting of `kvstore serve`, in the order of its --help."""
    bind: str = setting(
        "127.0.0.1", "IPv4 address to listen on.", IPV4, c="bind")
    port: int = setting(
        6380, "TCP port (0 = any free port; -1 = none: TLS only, with --tls-port).", min=-1, max=65535,
        accepts="a port from 0 to 65535 (0 = any free port), or -1 (no plain port, with --tls-port)", c="port",
        to_c=lambda v, cfg: max(v, 0))
    threads: int = setting(
        0, "Poller threads (0 = one per core).", min=0, max=1024,
        accepts="an integer from 0 (one per core) to 1024", c="threads", to_c=lambda v, cfg: cfg.effective_threads)
    max_memory: int = setting(
        0, "Memory bound for the table: bytes or a size with Redis's units, e.g. 512mb, 4gb (1024-based) or "
           "500m (1000-based); 0 = unbounded. Writes past it get -OOM; nothing is evicted.", SIZE, shown=None)
    maxclients: int = setting(
        10000, "Maximum client connections.", min=1, accepts="a positive integer", c="maxclients")
    requirepass: str = setting(
        "", "Password clients must AUTH with.", shown=None, c="requirepass")
    accept: str = setting(
        "reuseport", "reuseport: one SO_REUSEPORT listener per poller; handoff: poller 0 accepts and hands "
                     "connections round-robin.", choices=("reuseport", "handoff"),
        c="accept")
    arch: str = setting(
        "poller", "Request handling: poller = one non-blocking epoll poller per core; threadpool = a pool of "
                  "--threads workers (default 32), each serving one request at a time with blocking calls (read, "
                  "run, wait for the log, reply): paper 000's baseline; udp = a UDP front end on kernel sockets "
                  "(--udp-workers threads, recvmmsg/sendmmsg, on --bind:--udp-port); dpdk = the same UDP front end "
                  "bypassing the kernel (DPDK lcores on an AF_XDP port, --dpdk-iface). UDP: one RESP request per "
                  "datagram after an 8-byte id header, same durability and data file, no AUTH; --threads TCP "
                  "pollers (default 1) beside it for the control path.", choices=ARCHS,
        c="arch")
    udp_port: int = setting(
        6380, "arch udp/dpdk: UDP port of the front end (udp: 0 = any free port).", min=0, max=65535,
        accepts="a UDP port from 0 to 65535 (0 = any free port)", c="udp_port")
    udp_workers: int = setting(
        1, "arch udp/dpdk: UDP worker threads (dpdk: lcores, one RX/TX queue pair each).", min=1, max=63,
        c="udp_workers")
    pull_cache_slots: int = setting(
        0, "arch udp: slots of the pull cache's first level (paper 004), an XDP program on the interface of "
           "--bind answering UDP pulls of recently sealed stream batches before the kernel's network stack "
           "(each slot one batch, 1.5 KiB); 0 = off: the engine answers every pull. Needs root (or CAP_BPF and "
           "CAP_NET_ADMIN), --bind one interface's IPv4 address, and a build with clang and libbpf-dev.",
        min=0, max=1 << 20, accepts="a slot count from 0 (off) to 1048576", c="pull_cache_slots")
    dpdk_iface: str = setting(
        "", "arch dpdk: interface for DPDK's AF_XDP port (e.g. one end of a veth pair; turn its TX checksum "
            "offload off).", shown=None, c="dpdk_iface")
    dpdk_eal_args: str = setting(
        "", "arch dpdk: extra DPDK EAL arguments, space separated.", shown=None,
        accepts="a string of space-separated EAL arguments", c="dpdk_eal_args")
    network_only: bool = setting(
        False, "Benchmark switch (paper 000's N row): SET answers +OK without touching the table. Nothing is "
               "stored.", shown=None, cli="flag", c="network_only")
    poll_policy: str = setting(
        "direct", "EPOLLOUT policy: direct writes replies at the end of each poll round (EPOLLOUT only after a "
                  "short write); strict registers EPOLLOUT for every reply and removes it when sent; flexpoll "
                  "(paper 002) writes on EPOLLOUT like strict but keeps it registered while replies come often.",
        choices=("direct", "strict", "flexpoll"), c="poll_policy")
    data_dir: str = setting(
        "data", "Directory for this node's files; the durability log is <data-dir>/log.", PATH, shown="./data")
    durability: str = setting(
        "disk", "disk (the default): a write is acknowledged once its log record is on disk (group commit: one "
                "write + one fdatasync for every record gathered meanwhile), so nothing acknowledged is lost by a "
                "crash or a restart. none: memory only, an explicit opt-in: every key is gone when the server "
                "stops. remote: acknowledged once the record is in this node's memory and in its peer's (--peer); "
                "the local log is written in large batches; if the peer is lost (--peer-timeout-ms) writes are "
                "synced to the local disk instead. The log is replayed at start.", choices=DURABILITY_MODES,
        c="durability")
    peer: str = setting(
        "", "remote mode: HOST:PORT of the peer's log receiver (the peer's --repl-port).", shown=None)
    repl_port: int = setting(
        -1, "Run a log receiver on this port, storing a peer's log so that it survives the loss of that machine "
            "(0 = any free port).", min=-1, max=65535, accepts="-1 (off) or a port from 0 to 65535", shown="off")
    ship_interval_us: int = setting(
        100, "remote: ship gathered log records at most every N µs, once the previous batch is acknowledged "
             "(or after 10 intervals without its ack).", min=1)
    max_batch_records: int = setting(
        65536, "remote: at most N records per shipped batch.", min=1)
    peer_timeout_ms: int = setting(
        1000, "remote: an ack overdue this long means the peer is lost: fall back to disk mode until it is back "
              "and caught up.", min=10)
    disk_log_interval_ms: int = setting(
        1000, "remote: write and sync the local log every N ms (or every 16 MiB).", min=1)
    peer_startup_wait_ms: int = setting(
        10000, "remote: at start, the node compares its log with the peer's copy (which may reach further: the "
               "local log lags); wait this long for the peer, then refuse to start.", min=0)
    # None until validate(): on with durability disk/remote, off with none
    data_file: bool = setting(
        None, "Keep the BOSC data file <data-dir>/data.kvd. With it memory is bounded by --max-memory (when full, "
              "writes wait for the flusher instead of failing; evicted keys are read back from their block) and "
              "log segments are deleted once flushed.", bool,
        shown="on with --durability disk/remote; off with none, where it makes a cache that spills to disk, "
              "not durable", cli="switch")
    data_buckets: int = setting(
        0, "Buckets (home blocks of 4 KiB, two copies each, sparse until written) of a new data file; an existing "
           "file keeps its own. 0: one per 4 KiB of --max-memory, at least 65,536 (chains of about one block "
           "with the file a few times memory: most records per block written).", min=0, max=1 << 30,
        shown="auto")
    flush_interval_ms: int = setting(
        5000, "The flusher sweeps the dirty blocks at least this often (sooner when memory is nearly full): the "
              "longer, the more updates each block write carries.", min=1)
    dirty_queue: str = setting(
        "ldu", "The data file's dirty-key queue: ldu (lock-less, paper 003) or locked (a mutex-protected list, "
               "kept to measure LDU against).", choices=("ldu", "locked"))
    log_segment_size: int = setting(
        64 * 1024 * 1024, "Start a new log segment past this size (Redis units); with a data file, segments "
                          "wholly below the flushed LSN are deleted (disk mode).", SIZE, min=4096, shown="64mb")
    tcp_backlog: int = setting(
        511, "listen() backlog: connections the kernel queues before they are accepted.", min=1, c="tcp_backlog")
    # ---- logging
    log_level: str = setting(
        "notice", "The least important lines written: notice = start, stop, configuration, peer lost/back/caught "
                  "up, recovery and its progress, writer stalls, refused clients, failed AUTH; verbose adds each "
                  "log segment replayed; debug adds every flusher sweep; warning = problems only.",
        choices=LOG_LEVELS)
    log_file: str = setting(
        "", "Append the log to this file instead of stderr; SIGHUP reopens it (for logrotate).", shown="stderr")
    # ---- metrics
    metrics_port: int = setting(
        -1, "Serve Prometheus metrics (text format) over HTTP at http://<metrics-bind>:<port>/metrics; read from "
            "the server's counters when scraped, never on a request's path (0 = any free port).", min=-1,
        max=65535, accepts="-1 (off) or a port from 0 to 65535 (0 = any free port)", shown="off")
    metrics_bind: str = setting(
        "127.0.0.1", "IPv4 address the metrics endpoint listens on (it has no authentication: 0.0.0.0 exposes it "
                     "on every interface).", IPV4)
    # ---- slow log and latency monitor
    slowlog_log_slower_than: int = setting(
        10000, "SLOWLOG keeps requests that took at least this many microseconds to run (0: every request, "
        "-1: none), as Redis's slowlog-log-slower-than; CONFIG SET changes it at run time.",
        min=-1, accepts="an integer of microseconds, -1 or more", c="slowlog_log_slower_than")
    slowlog_max_len: int = setting(
        128, "SLOWLOG keeps the newest this many entries (each at most 32 arguments of 128 bytes), as Redis's "
        "slowlog-max-len; CONFIG SET changes it at run time.", min=0, max=10000,
        accepts="an integer from 0 to 10000", c="slowlog_max_len")
    latency_monitor_threshold: int = setting(
        100, "LATENCY records an event (log-sync, flusher-sweep, command) that took at least this many "
        "milliseconds (0: off). Redis's default is off; kvstore's is 100 ms because its events are few (one per "
        "log sync or sweep, not per request) and a sync or sweep that slow delays every held reply.",
        min=0, max=2**31 - 1, accepts="an integer of milliseconds, 0 (off) or more", c="latency_monitor_threshold")
    # ---- replication link: authentication, bind (repl)
    repl_secret_file: str = setting(
        "", "File holding the secret both nodes of a pair share: every replication connection (log shipping, "
            "--from-peer, recover --from-peer) starts with both ends proving they hold it (HMAC-SHA256 "
            "challenge-response), and every frame after carries a MAC. Required with --durability remote or "
            "--repl-port. Make one with `head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE` and copy it "
            "to the peer; refused if group or others may read it.", shown=None)
    repl_bind: str = setting(
        "127.0.0.1", "IPv4 address the log receiver (--repl-port) listens on. A pair on two machines needs an "
                     "address its peer can reach, e.g. 0.0.0.0 or the machine's own; the link is authenticated "
                     "(--repl-secret-file), not encrypted unless --repl-tls.", IPV4)
    repl_tls: bool = setting(
        False, "Run every replication connection (log shipping, --from-peer, recover --from-peer) inside mutual "
               "TLS: each end presents --tls-cert-file/--tls-key-file and verifies the other's certificate "
               "against --tls-ca-cert-file (the RESP port's TLS files; --tls-port is not needed). The secret's "
               "handshake and per-frame MACs still run inside it. Both nodes of a pair must set it.",
        shown=None, cli="flag")
    # ---- TLS (tls)
    tls_port: int = setting(
        -1, "Also serve RESP over TLS on this port (0 = any free port), as Redis's tls-port; needs "
            "--tls-cert-file and --tls-key-file (and --tls-ca-cert-file unless --tls-auth-clients no). "
            "redis-cli --tls --cacert CA and redis-py ssl=True connect to it.", min=-1, max=65535,
        accepts="-1 (off) or a port from 0 to 65535 (0 = any free port)", shown="off", c="tls_port")
    tls_cert_file: str = setting(
        "", "PEM file with the server's certificate (and chain) for --tls-port.", shown=None, c="tls_cert_file")
    tls_key_file: str = setting(
        "", "PEM file with the private key of --tls-cert-file (keep it mode 600).", shown=None, c="tls_key_file")
    tls_ca_cert_file: str = setting(
        "", "PEM file with the CA certificate(s) a client's certificate must chain to (--tls-auth-clients "
            "yes or optional).", shown=None, c="tls_ca_cert_file")
    tls_only: bool = setting(
        False, "derived: --port -1 (no plain port, TLS only)", cli=None, c="tls_only",
        to_c=lambda v, cfg: cfg.port < 0)
    tls_auth_clients: str = setting(
        "yes", "TLS clients must present a certificate signed by --tls-ca-cert-file (yes, Redis 7's default), "
               "may present one, checked if they do (optional), or are not asked for one (no). Password "
               "authentication (--requirepass) applies on top.", choices=("yes", "no", "optional"),
        c="tls_auth_clients")
    # ---- node identity and empty starts (identity)
    init: bool = setting(
        False, "remote: create a brand-new node when the data dir holds no state. Without it a node with no state "
               "is taken for one that lost its disk: it waits for its peer and recovers its log (and identity) from "
               "it, refusing keyspace commands with -LOADING meanwhile. --init still asks the peer and refuses if "
               "the peer holds a log of this pair's node; a node that has state ignores it.",
        shown=None, cli="flag")
    node_id: str = setting(
        "", "This node's identity (32 hex digits), which names its log at the peer: kept in <data-dir>/node-id; "
            "given here it survives a lost disk (a node started with it and no local state recovers that node's "
            "log from the peer). Default: the data dir's, else the peer's copy, else a new one (--init).",
        shown=None, accepts="32 hexadecimal digits (16 bytes), e.g. the content of <data-dir>/node-id")
    # ---- client limits: timeouts, file descriptors (limits)
    client_timeout_ms: int = setting(
        1000, "arch threadpool: the longest a worker waits for a client in the middle of a request — for the rest "
              "of a request it has begun (read) or for room to send its reply (write) — before it closes the "
              "connection (counted in INFO stats client_timeout_disconnections). Each wait restarts when bytes "
              "move, so a slow but steady client is served; a stalled one holds a worker at most this long. "
              "0 = wait forever (one stalled client per worker freezes the pool). The pollers never wait on a "
              "client and ignore it.", min=0, max=3600000,
        accepts="an integer of milliseconds from 0 (wait forever) to 3600000", c="client_timeout_ms")
    # ---- client memory (clientmem)
    maxmemory_clients: str = setting(
        "", "Bound on the memory of all client connections together (input buffers, argument arrays, output "
            "buffers), as Redis 7's maxmemory-clients: when their sum passes it, the clients using the most memory "
            "are closed first, and no reply is built past it (a client whose one reply would pass it is closed "
            "instead). A size (256mb, 1gb), a percentage of --max-memory (10%; of the machine's RAM when "
            "--max-memory is 0) or 0 (no bound). Default: 10% of --max-memory (of RAM when it is 0), and at "
            "least 64mb plus 20kb per --maxclients: every allowed client may sit idle with its read buffer "
            "without being evicted, a few may send or read large bulks, and there is a bound even when the "
            "table has none.", shown="10% (at least 64mb + 20kb x maxclients)",
        accepts="a size such as 256mb, a percentage such as 10%, or 0 (no bound)",
        c="maxmemory_clients", to_c=lambda v, cfg: "%d %d" % clients_memory_bound(v, cfg.max_memory, cfg.maxclients))
    client_output_buffer_limit: str = setting(
        "normal 0 0 0", "Output buffer limits of normal clients, as Redis's client-output-buffer-limit: "
                        "'normal HARD SOFT SECONDS' (sizes in bytes or with Redis's units): a client whose unsent "
                        "replies pass HARD, or stay above SOFT for SECONDS, is closed; 0 = no such limit (the "
                        "default, as Redis; maxmemory-clients still bounds every client).",
        accepts="'normal HARD SOFT SECONDS', e.g. 'normal 32mb 8mb 60'",
        c="cobl_normal", to_c=lambda v, cfg: parse_output_limit(v))
    # ---- disk errors (diskfull)
    # ---- data-file integrity (integrity)
    # ---- issue 14b (io)
    datafile_io: str = setting(
        "buffered", "How the data file's sweep reads and writes its runs of blocks: buffered (pread/pwritev "
                    "through the page cache), direct (O_DIRECT from aligned buffers, no page cache copy), uring "
                    "(io_uring: a write batch's runs in one submission, the next run read while the current one "
                    "is applied) or uring-direct (both). Loads of evicted keys stay buffered in every mode. "
                    "buffered measured fastest on ext4 in a VM (`kvstore experiment run kv_datafile_io`); a mode "
                    "the file system or kernel cannot do falls back to buffered with a warning.",
        choices=("buffered", "direct", "uring", "uring-direct"))
    # ---- issue 14b (chunk)
    sweep_chunk_pct: int = setting(
        2, "A sweep of the data file syncs, records and settles its keys a chunk of buckets at a time, each chunk "
           "about this percent of --max-memory: a writer waiting for room waits for one chunk (then clean keys are "
           "evicted), not for the whole sweep. Each chunk costs two syncs; the flushed LSN (log truncation) moves "
           "once per sweep. 0: the whole sweep is one chunk.", min=0, max=100)
    # ---- MQTT (frontend/mqtt.h)
    mqtt_port: int = setting(
        -1, "Also serve MQTT 3.1.1 on this port (0 = any free port; 1883 is MQTT's), on the same pollers as "
            "RESP. A message published to topic T is appended to the stream <--mqtt-topic-prefix>T (fields "
            "payload, qos, retain, client, at); a QoS 1 PUBACK (QoS 2 PUBREC) leaves once the log holds it, as "
            "a RESP reply does in --durability disk/remote. Subscribers read the streams' tails, so an XADD to "
            "mqtt:a/b reaches MQTT subscribers of a/b too. --requirepass, if set, is the password CONNECT must "
            "carry (any user name).", min=-1, max=65535,
        accepts="-1 (off) or a port from 0 to 65535 (0 = any free port)", shown="off", c="mqtt_port")
    mqtt_topic_prefix: str = setting(
        "mqtt:", "The stream key of MQTT topic T is this prefix followed by T.", c="mqtt_topic_prefix")
    mqtt_retained_key: str = setting(
        "mqtt-retained", "The hash that keeps the retained messages (durably, as every write): field the topic, "
                         "value its QoS as one byte, then the payload. Read back after a restart.",
        c="mqtt_retained_key")
    mqtt_session_prefix: str = setting(
        "mqtt-session:", "A persistent session (clean session 0) is kept in the string key of this prefix followed "
                         "by the client id: its subscriptions, how far its client acknowledged each topic, and the "
                         "QoS 2 messages it sent that are not yet released; read back when the client reconnects "
                         "after a restart.", c="mqtt_session_prefix")
    mqtt_users: str = setting(
        "", "A password file for MQTT clients, as mosquitto_passwd writes it (user:$7$...; `mosquitto_passwd -c "
            "FILE USER`): CONNECT must carry a user name in it and that user's password, else CONNACK 4 (wrong) or "
            "5 (none given). Without it, --requirepass (if set) is the password, with any user name.",
        shown=None, c="mqtt_users")
    mqtt_max_packet: int = setting(
        1 << 20, "The largest MQTT packet accepted, in bytes (fixed header included); a larger one closes its "
                 "connection with a log line. MQTT's own bound is 256 MB.", min=2, max=268435460,
        c="mqtt_max_packet")
    mqtt_max_inflight: int = setting(
        20, "QoS 1 and 2 messages sent to one subscriber and not yet acknowledged (Mosquitto's "
            "max_inflight_messages): more wait in their streams until it acknowledges.", min=1, max=65535,
        c="mqtt_max_inflight")
    mqtt_max_queued: int = setting(
        1000, "A session's queue: messages written to the topics it subscribes to and not yet sent to it "
              "(Mosquitto's max_queued_messages). Past it, messages it takes at QoS 0 are dropped, oldest first, "
              "and counted (INFO mqtt_dropped_queue_full); a QoS 1/2 publisher to its topics is slowed: its "
              "PUBACKs (PUBRECs) are withheld, so a client with an in-flight window waits, until the queue is "
              "down to half. A session that is away slows no one (its messages wait in their streams). 0: no "
              "bound.", min=0, c="mqtt_max_queued")
    mqtt_max_sessions: int = setting(
        100000, "MQTT sessions at once (connected, and persistent ones of clients away); a CONNECT past it is "
                "refused with CONNACK 3 (server unavailable).", min=1, c="mqtt_max_sessions")
    mqtt_stream_maxlen: int = setting(
        0, "Keep about this many of the newest messages in each topic's stream (XADD MAXLEN ~); 0 keeps every "
           "message (trim with XTRIM, or bound the node with --max-memory and a data file).", min=0,
        c="mqtt_stream_maxlen")
    # ---- cluster (cmd/cluster.c)
    cluster_enabled: bool = setting(
        False, "Serve as a node of a cluster that Redis Cluster clients use (redis-cli -c, redis-py "
               "RedisCluster): a keyed command is served only for a slot this node owns in the slot map the "
               "control plane sets (CLUSTER SETMAP), else -MOVED/-ASK to the owner, -CROSSSLOT for keys of "
               "several slots, -CLUSTERDOWN while the slot has no owner or the node's lease (CLUSTER LEASE) has "
               "run out.", shown=None, cli="flag", c="cluster_enabled")
    cluster_etcd: str = setting(
        "", "etcd's client URL (http://HOST:PORT): the node's agent registers it there under a lease it renews, "
            "gives the node its fence from each renewal (CLUSTER LEASE), and pushes every slot map the cluster's "
            "controller writes (CLUSTER SETMAP). Needs --cluster-enabled.", shown=None)
    cluster_name: str = setting(
        "kvstore", "The cluster this node belongs to: its keys in etcd are under /kvstore/clusters/<name>/.")
    cluster_lease_ttl: int = setting(
        2, "Seconds of the node's etcd lease (renewed every third of it). The node serves keys until a quarter "
           "of it before the lease can expire; the controller moves its slots only after it has.", min=1,
        max=60)
    cluster_announce: str = setting(
        "", "The address clients are sent to for this node's slots (-MOVED/-ASK, CLUSTER SLOTS); default: --bind "
            "(127.0.0.1 when it is 0.0.0.0).", shown=None)
    config_file: str = setting(
        "", "the TOML file the settings came from (INFO shows it)", shown=None, cli=None, c="config_file")

    @classmethod
    def settings(cls):
        """The fields that are settings (command-line options and TOML keys), in --help order."""
        return [f for f in dataclasses.fields(cls) if f.metadata["cli"]]

    def validate(self):
        """Check every setting (raising ConfigError that names it and says what is accepted),
        turn sizes into bytes and fill data_file's default. Returns self."""
        if self.data_file is None:
            self.data_file = self.durability != "none"
        for f in dataclasses.fields(self):
            setattr(self, f.name, check(f, getattr(self, f.name)))
        clients_memory_bound(self.maxmemory_clients, self.max_memory, self.maxclients)  # raise now, not at start
        parse_output_limit(self.client_output_buffer_limit)
        # rules between settings
        if self.durability == "remote":
            if not self.peer:
                raise ConfigError("durability remote needs --peer HOST:PORT (the peer's --repl-port)")
            self.peer_address()
        if (self.durability == "remote" or self.repl_port >= 0) and not self.repl_secret_file:
            raise ConfigError(
                "repl_secret_file: the replication link (durability remote, repl_port) needs a secret shared by "
                "both nodes: make one with `head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE`, copy it to "
                "the peer and pass --repl-secret-file FILE to both")
        if self.repl_tls and (self.durability == "remote" or self.repl_port >= 0):
            check_repl_tls_files(self.tls_cert_file, self.tls_key_file, self.tls_ca_cert_file)
        if self.arch in ("udp", "dpdk"):
            self._validate_udp()
        if self.cluster_etcd:
            if not self.cluster_enabled:
                raise ConfigError("cluster_etcd: the agent keeps a cluster node's slot map: it needs --cluster-enabled")
            if not re.fullmatch(r"http://[^/:\s]+:\d{1,5}/?", self.cluster_etcd):
                raise ConfigError(f"cluster_etcd: expected etcd's client URL, http://HOST:PORT, got {self.cluster_etcd!r}")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.cluster_name):
            raise ConfigError(f"cluster_name: expected 1 to 64 letters, digits, '_', '.' or '-', got "
                              f"{self.cluster_name!r}")
        if self.pull_cache_slots and self.arch != "udp":
            raise ConfigError(f"pull_cache_slots: the pull cache serves the kernel-socket UDP front end: it needs "
                              f"--arch udp, got --arch {self.arch}")
        if self.pull_cache_slots and self.bind in ("0.0.0.0", ""):
            raise ConfigError("pull_cache_slots: the pull cache attaches to one interface: --bind must be that "
                              "interface's IPv4 address (e.g. 127.0.0.1 for lo), not 0.0.0.0")
        if self.node_id and not re.fullmatch(r"[0-9a-fA-F]{32}", self.node_id):
            accepts = self.__dataclass_fields__["node_id"].metadata["accepts"]
            raise ConfigError(f"node_id: expected {accepts}, got {self.node_id!r}")
        if self.mqtt_port >= 0 and self.arch == "threadpool":
            raise ConfigError("mqtt_port: not supported with --arch threadpool; MQTT runs on the pollers "
                              "(--arch poller, udp or dpdk)")
        if self.mqtt_port > 0 and self.mqtt_port in (self.port, self.tls_port):
            raise ConfigError(f"mqtt_port: must differ from the RESP ports, got {self.mqtt_port}")
        if self.mqtt_users and not (os.path.isfile(self.mqtt_users) and os.access(self.mqtt_users, os.R_OK)):
            raise ConfigError(f"mqtt_users: {self.mqtt_users!r} is not a readable file")
        if self.mqtt_port >= 0 and not self.mqtt_topic_prefix:
            raise ConfigError("mqtt_topic_prefix: must not be empty (every key would be a topic)")
        if self.tls_port >= 0:
            self._validate_tls()
        elif self.port < 0:
            raise ConfigError("port: -1 (no plain port) needs --tls-port; without it, expected a port from 0 to "
                              "65535 (0 = any free port)")
        return self

    def _validate_tls(self):
        if self.arch == "threadpool":
            raise ConfigError("tls_port: not supported with --arch threadpool (its workers make blocking plain reads "
                              "and writes); use --arch poller (the default) for TLS")
        if self.tls_port != 0 and self.tls_port == self.port:
            raise ConfigError(f"tls_port: must differ from port ({self.port}): one port serves plain RESP, the "
                              "other TLS")
        needed = ("tls_cert_file", "tls_key_file") + (("tls_ca_cert_file",) if self.tls_auth_clients != "no" else ())
        for name in needed:
            path = getattr(self, name)
            if not path:
                extra = " (or --tls-auth-clients no)" if name == "tls_ca_cert_file" else ""
                raise ConfigError(f"{name}: --tls-port needs --{name.replace('_', '-')} FILE (PEM){extra}")
            if not os.path.isfile(path) or not os.access(path, os.R_OK):
                raise ConfigError(f"{name}: {path!r} is not a readable file")

    def _validate_udp(self):
        if self.arch == "dpdk" and self.udp_port == 0:
            raise ConfigError(f"udp_port: expected a UDP port from 1 to 65535, got {self.udp_port!r}")
        if self.requirepass:
            raise ConfigError(f"arch {self.arch}: requirepass is not supported: the UDP front end has no AUTH "
                              "(anyone who can send it a datagram could write)")
        if self.arch == "dpdk" and (not self.dpdk_iface or len(self.dpdk_iface) > 15):
            raise ConfigError(f"dpdk_iface: arch dpdk needs a network interface name (at most 15 characters), "
                              f"e.g. --dpdk-iface veth0; got {self.dpdk_iface!r}")

    def c_values(self):
        """{struct kv_config field: value} of the settings C takes (strings still str)."""
        return _c_values(self)

    def peer_address(self):
        return parse_address(self.peer, "peer")

    @property
    def effective_threads(self):
        if self.arch == "threadpool":
            return self.threads or 32
        if self.arch in ("udp", "dpdk"):  # the TCP pollers are only the control path: leave the cores to UDP
            return self.threads or 1
        return self.threads or os.cpu_count() or 1

    def to_toml(self):
        """The effective settings as a TOML file `load` reads back (`kvstore serve --check-config`
        prints it): one `key = value` line per setting, sizes in bytes; a password is left out."""
        lines = [f"# kvstore {'settings from ' + self.config_file if self.config_file else 'default settings'}"
                 " with the command line's overrides", "[server]"]
        for f in self.settings():
            value = getattr(self, f.name)
            if f.name == "requirepass" and value:  # output that may land in a CI log keeps no password
                lines.append("# requirepass is set (not shown)")
            else:
                lines.append(f"{f.name} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"

    @classmethod
    def load(cls, path=None, **overrides):
        """Defaults, then the TOML file (if any), then overrides (None values ignored)."""
        values = {}
        if path:
            data = _toml_table(path, "server")
            known = [f.name for f in cls.settings()]
            for k, v in data.items():
                key = k.replace("-", "_")
                if key not in known:
                    raise ConfigError(f"config file {path}: unknown setting {k!r}; known: " + ", ".join(sorted(known)))
                values[key] = v
            values["config_file"] = os.path.abspath(path)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values).validate()


def _c_values(cfg):
    """{C field: value} of a settings dataclass's fields declared with c= (strings still str)."""
    out = {}
    for f in dataclasses.fields(cfg):
        m, v = f.metadata, getattr(cfg, f.name)
        if m["c"]:
            out[m["c"]] = m["to_c"](v, cfg) if m["to_c"] else v
    return out


def _read_toml(path):
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: invalid TOML: {e}") from None


# The tables of a config file besides [server]; keys outside any table are the server's.
OTHER_TABLES = ("blockdev",)


def _toml_table(path, table):
    """The settings of one table of the TOML file at path: [server] also takes the keys
    outside any table (files written before tables existed)."""
    data = _read_toml(path)
    if table == "server" and "server" not in data:
        return {k: v for k, v in data.items() if k not in OTHER_TABLES}
    section = data.get(table, {})
    if not isinstance(section, dict):
        raise ConfigError(f"config file {path}: {table} must be a table ([{table}]), got {section!r}")
    return section


def check(field, value):
    """value checked against field's declaration; sizes come back in bytes.
    Raises ConfigError "<name>: expected <what is accepted>, got <value>"."""
    m, name = field.metadata, field.name
    t = m["type"]
    if t is SIZE:
        value = parse_size(value, name)
    elif t is DISK_SIZE:
        value = parse_disk_size(value, name)
    ok = {bool: lambda v: isinstance(v, bool),
          int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          SIZE: lambda v: True,
          DISK_SIZE: lambda v: True,
          IPV4: _is_ipv4}.get(t, lambda v: isinstance(v, str))(value)
    ok = ok and (m["choices"] is None or value in m["choices"])
    ok = ok and (m["min"] is None or value >= m["min"]) and (m["max"] is None or value <= m["max"])
    if not ok:
        raise ConfigError(f"{name}: expected {m['accepts']}, got {value!r}")
    return value


def _toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    # a TOML basic string: JSON's escapes are TOML's, and non-ASCII text may stay as it is
    return json.dumps(str(value), ensure_ascii=False)


def _is_ipv4(text):
    parts = str(text).split(".") if isinstance(text, str) else []
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)


def check_repl_tls_files(cert, key, ca):
    """--repl-tls needs all three PEM files (mutual TLS: each node presents a certificate and
    verifies its peer's): ConfigError naming the one missing or unreadable."""
    for name, path in (("tls_cert_file", cert), ("tls_key_file", key), ("tls_ca_cert_file", ca)):
        if not path:
            raise ConfigError(f"{name}: --repl-tls needs --{name.replace('_', '-')} FILE (PEM): both ends of the "
                              "replication link present a certificate (--tls-cert-file, --tls-key-file) and "
                              "verify the other's against --tls-ca-cert-file")
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise ConfigError(f"{name}: {path!r} is not a readable file (needed by --repl-tls)")


# ---- issue 15 (py)
# The block device's settings (`kvstore blockdev serve`, TOML table [blockdev],
# kvstore.BlockDevice): the same declarations as ServerConfig's; c= names the struct
# nbd_config field (ext/frontend/nbd.h) filled from each.

_DISK = re.compile(r"^\s*(\d+)\s*([kmgtp]?)(i?b)?\s*$", re.IGNORECASE)
BACKEND_SCHEMES = ("kvstore", "redis", "memcached")
BACKEND_FORMS = ("embedded, kvstore://[:PASSWORD@]HOST:PORT, redis://[:PASSWORD@]HOST:PORT[/DB] or "
                 "memcached://HOST:PORT")
NBD_PORT = 10809  # the NBD port IANA assigned
NBD_TLS_MODES = ("off", "on", "require")  # struct nbd_config.tls's values, in order


def parse_disk_size(value, what="size"):
    """Bytes from an int or a string such as '4G', '512M', '1T' or '4GiB': a disk's units,
    powers of 1024 as qemu-img, nbdkit and truncate(1) read them (not Redis's 1000-based
    k/m/g of the memory settings)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = _DISK.match(str(value)) if isinstance(value, str) else None
    if not m:
        raise ConfigError(f"{what}: expected a size in bytes or with a binary unit (K, M, G, T: powers of 1024), "
                          f"such as 1073741824, '512M' or '4G', got {value!r}")
    return int(m.group(1)) << (10 * " kmgtp".index((m.group(2) or " ").lower()))


def parse_listen(text, what="listen"):
    """(host, port) from 'IPV4:PORT' (port 0: any free port)."""
    host, _, port = str(text).rpartition(":")
    if not (_is_ipv4(host) and port.isdigit() and int(port) < 65536):
        raise ConfigError(f"{what}: expected IPV4:PORT such as 127.0.0.1:{NBD_PORT} (port 0: any free port), "
                          f"got {text!r}")
    return host, int(port)


def backend_scheme(url):
    """'embedded' or the scheme of a network backend's URL; ConfigError naming what is
    accepted otherwise (the C side checks the rest: host, port, password, database)."""
    if url == "embedded":
        return url
    scheme, sep, rest = str(url).partition("://")
    if not sep or scheme not in BACKEND_SCHEMES or not rest:
        raise ConfigError(f"backend: expected {BACKEND_FORMS}, got {url!r}")
    return scheme


def redact(url):
    """A backend URL with its password (scheme://:PASSWORD@HOST) hidden, for logs and messages."""
    scheme, sep, rest = str(url).partition("://")
    if sep and "@" in rest:
        return f"{scheme}://(password)@{rest.rpartition('@')[2]}"
    return url


def _node_setting(name, help):
    """A ServerConfig setting declared again, as it is, for the block device (help: other
    words, or None for the node's)."""
    f = ServerConfig.__dataclass_fields__[name]
    return dataclasses.field(default=f.default, metadata={**f.metadata, "help": help or f.metadata["help"]})


@dataclasses.dataclass
class BlockdevConfig:
    """Every setting of the block device (`kvstore blockdev serve`), in the order of its --help."""
    size: int = setting(
        0, "Device size in bytes or with a binary unit: K, M, G, T (powers of 1024, as qemu-img and nbdkit), "
           "e.g. 4G. A multiple of --block-size. Required.", DISK_SIZE, shown=None)
    backend: str = setting(
        "embedded", "Where the blocks live: embedded (this process's own engine: no network, durability as "
                    "--durability says), kvstore://[:PASSWORD@]HOST:PORT (a kvstore node; in disk or remote mode a "
                    "FLUSH returns once the blocks are durable there), redis://[:PASSWORD@]HOST:PORT[/DB] or "
                    "memcached://HOST:PORT (a FLUSH returns at once: these keep blocks in memory only; run "
                    "memcached with -M so that it refuses rather than evicts).",
        accepts=BACKEND_FORMS)
    listen: str = setting(
        "", f"IPV4:PORT of the NBD TCP listener (port 0: any free port; the ready line says which). Default "
            f"127.0.0.1:{NBD_PORT}, or none when --unix is given (give both for both).",
        shown=f"127.0.0.1:{NBD_PORT}", accepts=f"IPV4:PORT such as 127.0.0.1:{NBD_PORT}")
    unix: str = setting(
        "", "Also (or, without --listen, only) listen on this unix socket path: nbd+unix:///EXPORT?socket=PATH. "
            "Faster than TCP on one machine.", shown=None, accepts="a socket path", c="unix_path")
    export: str = setting(
        "kvstore", "The export's name (a client asking for \"\" gets it too).", c="export_name")
    description: str = setting(
        "", "Text clients see as the export's description (nbdinfo shows it).", shown=None, c="description")
    threads: int = setting(
        0, "NBD worker threads, each with its own epoll loop, its client connections and its own connections "
           "to the backend (0 = one per core).", min=0, max=64,
        accepts="an integer from 0 (one per core) to 64", c="threads",
        to_c=lambda v, cfg: cfg.effective_threads)
    connections_per_thread: int = setting(
        1, "Network backends: connections of each worker thread to the backend; a block's requests always "
           "use the same one.", min=1, max=16, c="conns_per_thread")
    busy_poll_us: int = setting(
        50, "After serving requests, a worker polls its sockets this many microseconds before sleeping (0 = "
            "never): at queue depth 1 the next request comes sooner than a sleep and wake-up, which is most of "
            "the latency. Each empty poll yields the core to any other thread that wants it (a client or backend "
            "on the same machine), and polling stops after a few windows that found nothing, so an idle device "
            "costs no CPU.", min=0, max=1000,
        accepts="microseconds from 0 (off) to 1000", c="busy_poll_us")
    block_size: int = setting(
        4096, "Bytes per block, the value of one key: a power of two from 512 to 1M (1048576). Clients are told "
              "it is the preferred I/O size; smaller or unaligned writes read-modify-write the blocks at the edges.",
        min=512, max=1 << 20, accepts="a power of two from 512 to 1048576", c="block_size")
    read_only: bool = setting(
        False, "Serve the export read-only (writes, trims and zeroes get EPERM).", shown=None, cli="flag",
        c="read_only", to_c=lambda v, cfg: int(v))
    key_prefix: str = setting(
        "", "Prefix of every block's key (the key is the prefix + the block number in decimal). Two devices on "
            "one backend need different prefixes.", shown="nbd:EXPORT:", accepts="a string",
        c="key_prefix", to_c=lambda v, cfg: cfg.effective_key_prefix)
    max_connections: int = setting(
        256, "NBD client connections served at once; more are closed at accept.", min=1, max=65536,
        c="max_clients")
    # ---- issue 15 (tls)
    # Authentication of the NBD port: TLS through NBD_OPT_STARTTLS (nbds:// URLs), x509 or
    # pre-shared keys; the certificate settings are the node's own names (kvstore serve
    # --tls-*), and with --backend embedded they serve its --tls-port too.
    tls: str = setting(
        "off", "TLS on the NBD listeners (NBD_OPT_STARTTLS, as nbdkit's --tls): off; on = offered, plain "
               "clients still served; require = nothing but STARTTLS before TLS (plain clients are refused "
               "with NBD_REP_ERR_TLS_REQD). Clients connect with nbds://HOST:PORT/EXPORT (libnbd: "
               "?tls-certificates=DIR of ca-cert.pem, client-cert.pem and client-key.pem).", choices=NBD_TLS_MODES, c="tls",
        to_c=lambda v, cfg: NBD_TLS_MODES.index(v))
    tls_cert_file: str = _node_setting("tls_cert_file", "PEM file with the server's certificate (and chain) for "
                                                        "--tls on|require.")
    tls_key_file: str = _node_setting("tls_key_file", None)
    tls_ca_cert_file: str = _node_setting("tls_ca_cert_file", None)
    tls_auth_clients: str = _node_setting(
        "tls_auth_clients", "TLS clients must present a certificate signed by --tls-ca-cert-file: yes (a client "
                            "without one gets nothing: no size, no data), optional (checked if sent) or no (TLS "
                            "encrypts, anyone may connect).")
    tls_psk_file: str = setting(
        "", "Pre-shared keys instead of certificates: a file of IDENTITY:HEXKEY lines, as `psktool -u NAME -p "
            "FILE` writes it and nbdkit's --tls-psk reads it (keep it mode 600); libnbd: "
            "?tls-psk-file=FILE&tls-username=NAME. Not with --tls-cert-file.",
        shown=None, c="tls_psk_file")
    protected_mode: bool = setting(
        True, "Refuse to start with a TCP listener on an address other than loopback unless --tls require "
              "(anyone reaching it could read and write the device). --no-protected-mode allows it.",
        cli="switch", c="allow_plain_remote", to_c=lambda v, cfg: int(not v))
    config_file: str = setting(
        "", "the TOML file the settings came from", shown=None, cli=None)

    @classmethod
    def settings(cls):
        return [f for f in dataclasses.fields(cls) if f.metadata["cli"]]

    @property
    def effective_threads(self):
        return self.threads or os.cpu_count() or 1

    @property
    def effective_key_prefix(self):
        return self.key_prefix or f"nbd:{self.export}:"

    @property
    def effective_listen(self):
        """The TCP listener's "HOST:PORT", or "" for none (--unix alone)."""
        if self.listen:
            return self.listen
        return "" if self.unix else f"127.0.0.1:{NBD_PORT}"

    @property
    def backend_scheme(self):
        return backend_scheme(self.backend)

    def validate(self):
        """Check every setting (ConfigError naming it and what is accepted); sizes into bytes.
        Returns self."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, check(f, getattr(self, f.name)))
        if not self.size:
            raise ConfigError("size: the device's size is required, e.g. --size 4G (or size = \"4G\" in [blockdev])")
        if self.block_size & (self.block_size - 1):
            raise ConfigError(f"block_size: expected a power of two from 512 to 1048576, got {self.block_size}")
        if self.size % self.block_size:
            raise ConfigError(f"size: must be a multiple of the block size ({self.block_size}), got {self.size} "
                              f"(round it to {self.size // self.block_size * self.block_size or self.block_size})")
        if self.listen:
            parse_listen(self.listen)
        if len(self.unix.encode()) > 107:  # sockaddr_un.sun_path holds 108 bytes with its NUL
            raise ConfigError(f"unix: a socket path is at most 107 bytes, got {len(self.unix.encode())}: {self.unix!r}")
        if len(self.export.encode()) > 4096:  # the NBD protocol's bound on names
            raise ConfigError("export: at most 4096 bytes")
        backend_scheme(self.backend)
        self._validate_tls()
        return self

    def _validate_tls(self):
        """--tls's files and the protected mode, checked before anything binds (the C side
        checks them again, and loads the files)."""
        if self.tls != "off":
            if self.tls_psk_file and self.tls_cert_file:
                raise ConfigError("tls_psk_file: give --tls-psk-file or --tls-cert-file, not both")
            if not self.tls_psk_file:
                needed = ("tls_cert_file", "tls_key_file") + (("tls_ca_cert_file",)
                                                             if self.tls_auth_clients != "no" else ())
                for name in needed:
                    if not getattr(self, name):
                        extra = " (or --tls-auth-clients no)" if name == "tls_ca_cert_file" else ""
                        raise ConfigError(f"{name}: --tls {self.tls} needs --{name.replace('_', '-')} FILE (PEM)"
                                          f"{extra}, or --tls-psk-file FILE")
        host = self.effective_listen.rpartition(":")[0] if self.effective_listen else ""
        if host and not host.startswith("127.") and self.tls != "require" and self.protected_mode:
            raise ConfigError(f"listen: {host} is not a loopback address and --tls is {self.tls}: anyone who reaches "
                              f"it could read and write the device. Use --tls require (with --tls-cert-file, "
                              f"--tls-key-file and --tls-ca-cert-file, or --tls-psk-file), or allow it with "
                              f"--no-protected-mode")

    def c_values(self):
        """{struct nbd_config field: value} (strings still str), the listener included."""
        out = _c_values(self)
        host, port = parse_listen(self.effective_listen) if self.effective_listen else ("127.0.0.1", -1)
        out.update(bind=host, port=port, size=self.size, backend=self.backend)
        return out

    @classmethod
    def load(cls, path=None, **overrides):
        """Defaults, then the TOML file's [blockdev] table (if any), then overrides (None ignored)."""
        values = {}
        if path:
            known = [f.name for f in cls.settings()]
            for k, v in _toml_table(path, "blockdev").items():
                key = k.replace("-", "_")
                if key not in known:
                    raise ConfigError(f"config file {path}: [blockdev]: unknown setting {k!r}; known: "
                                      + ", ".join(sorted(known)))
                values[key] = v
            values["config_file"] = os.path.abspath(path)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values).validate()

    def to_toml(self):
        """The effective settings as a [blockdev] table (sizes in bytes)."""
        return "[blockdev]\n" + "".join(f"{f.name} = {_toml_value(getattr(self, f.name))}\n"
                                        for f in self.settings())
