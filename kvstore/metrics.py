"""The Prometheus endpoint (`--metrics-port`): an HTTP server of prometheus_client's, in the
control plane, whose collector reads the C counters when scraped (INFO's text through
srv_info, the log's sync histogram through wal_get_stats) and turns them into Prometheus's
text format. Nothing here runs on a request's path: a scrape costs one INFO rendering.
Threads: scrapes run on the HTTP server's threads; the reading callable they get
(Server._read_counters) guards the C objects against a server stopping meanwhile."""
import errno
import re

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import start_http_server
from prometheus_client.utils import floatToGoString

from kvstore import errors

# ---- INFO's text

# Fields whose value is a list of k=v pairs, as Redis writes them (cmdstat_get:calls=3,usec=5,...).
_PAIRS_FIELD = re.compile(r"^(cmdstat_|errorstat_|latency_percentiles_usec_)|^(db|poller)\d+$")
_INT = re.compile(r"^-?\d+$")
_FLOAT = re.compile(r"^-?\d+\.\d*(?:e[-+]?\d+)?$")
MAX_INFO_LINES = 100_000  # bounds of the parser (INFO's text is ours, but read as input)
MAX_PAIRS = 64


def _number(text):
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    return text


def parse_info(text):
    """INFO's text as redis-py's info() returns it: {field: value}, numbers as int or float;
    Redis's k=v lists (cmdstat_<cmd>, errorstat_<code>, latency_percentiles_usec_<cmd>,
    db<n>, poller<n>) as dicts. Section headers ("# Stats") and blank lines are skipped; a
    value is everything after the first ':' (an error text may hold ':', ',' and '=')."""
    out = {}
    for line in text.splitlines()[:MAX_INFO_LINES]:
        if not line or line.startswith("#") or ":" not in line:
            continue
        field, value = line.split(":", 1)
        if _PAIRS_FIELD.match(field):
            pairs = [p.partition("=") for p in value.split(",", MAX_PAIRS)[:MAX_PAIRS]]
            if all(eq for _, eq, _ in pairs):
                out[field] = {k: _number(v) for k, _, v in pairs}
                continue
        out[field] = _number(value)
    return out


# ---- what is exported

COUNTER, GAUGE = "counter", "gauge"

# Plain INFO fields, one metric each: (field, metric name, type, help). A field absent
# from INFO (no log, no data file, no peer, an older server) is left out. CPU, resident
# memory and open files come from prometheus_client's process collector (process_*).
FIELDS = [
    ("uptime_in_seconds", "kvstore_uptime_seconds", GAUGE, "Seconds since the server started."),
    ("connected_clients", "kvstore_connected_clients", GAUGE, "Client connections open now."),
    ("maxclients", "kvstore_max_clients", GAUGE, "Connections allowed at once (maxclients)."),
    ("blocked_clients", "kvstore_blocked_clients", GAUGE, "Clients waiting in a blocking command."),
    ("total_connections_received", "kvstore_connections_received_total", COUNTER, "Client connections accepted."),
    ("rejected_connections", "kvstore_connections_rejected_total", COUNTER,
     "Client connections refused because maxclients were connected."),
    ("total_commands_processed", "kvstore_commands_processed_total", COUNTER, "Commands run, all commands."),
    ("total_error_replies", "kvstore_error_replies_total", COUNTER, "Error replies sent, all commands."),
    ("total_error_replies_protocol", "kvstore_protocol_errors_total", COUNTER,
     "Malformed requests (protocol errors)."),
    ("total_net_input_bytes", "kvstore_net_input_bytes_total", COUNTER, "Bytes read from clients."),
    ("total_net_output_bytes", "kvstore_net_output_bytes_total", COUNTER, "Bytes written to clients."),
    ("keyspace_hits", "kvstore_keyspace_hits_total", COUNTER, "Key lookups by reads that found the key."),
    ("keyspace_misses", "kvstore_keyspace_misses_total", COUNTER, "Key lookups by reads that did not."),
    ("expired_keys", "kvstore_expired_keys_total", COUNTER, "Keys deleted because their time to live passed."),
    ("oom_rejections", "kvstore_oom_rejections_total", COUNTER, "Writes refused with -OOM (max-memory reached)."),
    ("used_memory", "kvstore_memory_used_bytes", GAUGE, "Bytes the table holds (keys, values, overhead)."),
    ("maxmemory", "kvstore_memory_max_bytes", GAUGE, "The table's memory bound (max-memory); 0 = unbounded."),
    ("memory_keys", "kvstore_memory_keys", GAUGE, "Keys whose entry is in memory (data file mode)."),
    ("datafile_keys", "kvstore_datafile_keys", GAUGE, "Keys in the data file (data file mode)."),
    # the log (durability disk/remote)
    ("log_appended_lsn", "kvstore_log_appended_lsn", GAUGE, "LSN of the last record appended to the log."),
    ("log_durable_lsn", "kvstore_log_durable_lsn", GAUGE,
     "Highest LSN durable (synced here, or acknowledged by the peer in remote mode)."),
    ("log_records", "kvstore_log_records_total", COUNTER, "Records written to the log files."),
    ("log_bytes", "kvstore_log_written_bytes_total", COUNTER, "Bytes written to the log files."),
    ("log_groups", "kvstore_log_groups_total", COUNTER, "Group commits (one write() of gathered records)."),
    ("log_syncs", "kvstore_log_syncs_total", COUNTER, "fdatasync calls of the log."),
    ("log_failed", "kvstore_log_failed", GAUGE, "1 once an I/O error stopped the log (writes then fail)."),
    ("log_segments", "kvstore_log_segments_total", COUNTER, "Log segments started since the server started."),
    ("log_segments_prepared", "kvstore_log_segments_prepared_total", COUNTER,
     "Of them, segments prepared ahead as zeros and written in place (each sync flushes data alone)."),
    ("log_write_errors", "kvstore_log_write_errors_total", COUNTER,
     "Failed attempts to write or sync the log (a full or failing disk); each is retried."),
    # the data file
    ("datafile_flushed_lsn", "kvstore_datafile_flushed_lsn", GAUGE, "LSN up to which the data file holds the log."),
    ("datafile_sweeps", "kvstore_datafile_sweeps_total", COUNTER, "Sweeps of the flusher over the dirty blocks."),
    ("datafile_records_written", "kvstore_datafile_records_written_total", COUNTER,
     "Key records written to data file blocks."),
    ("datafile_blocks_written", "kvstore_datafile_blocks_written_total", COUNTER, "4 KiB blocks written."),
    ("datafile_blocks_read", "kvstore_datafile_blocks_read_total", COUNTER,
     "4 KiB blocks read (sweeps read in windows: blocks read ahead and not used count too)."),
    ("datafile_loads", "kvstore_datafile_loads_total", COUNTER, "Keys read back into memory from the data file."),
    ("datafile_evicted_keys", "kvstore_datafile_evicted_keys_total", COUNTER,
     "Keys dropped from memory (kept in the data file)."),
    ("datafile_log_segments_deleted", "kvstore_datafile_log_segments_deleted_total", COUNTER,
     "Log segments deleted once the data file held them."),
    ("datafile_failed", "kvstore_datafile_failed", GAUGE, "1 once an I/O error stopped the flusher."),
    ("datafile_bytes_written", "kvstore_datafile_written_bytes_total", COUNTER, "Bytes the flusher wrote."),
    ("datafile_bytes_read", "kvstore_datafile_read_bytes_total", COUNTER,
     "Bytes read from the data file by read calls (not the kernel's read-ahead)."),
    ("datafile_write_calls", "kvstore_datafile_write_calls_total", COUNTER, "Write system calls on the data file."),
    ("datafile_read_calls", "kvstore_datafile_read_calls_total", COUNTER, "Read system calls on the data file."),
    ("datafile_sweep_seconds", "kvstore_datafile_sweep_seconds_total", COUNTER, "Time the flusher spent sweeping."),
    ("datafile_io_seconds", "kvstore_datafile_io_seconds_total", COUNTER,
     "Of the sweep time, its reads, writes and syncs of the data file."),
    ("datafile_sweep_cpu_seconds", "kvstore_datafile_sweep_cpu_seconds_total", COUNTER,
     "CPU time of the flusher thread (sweeps, evictions, expiry passes)."),
    # ---- issue 14b (chunk)
    ("datafile_sweep_chunks", "kvstore_datafile_sweep_chunks_total", COUNTER,
     "Chunks of a sweep synced and settled before the sweep's end (their keys evictable at once)."),
    ("datafile_chunk_evicted_keys", "kvstore_datafile_chunk_evicted_keys_total", COUNTER,
     "Keys evicted right after a chunk of a sweep settled, for writers waiting for room."),
    ("datafile_batch_segments", "kvstore_datafile_batch_segments", GAUGE,
     "Segment files of the batch store (stream batches the data file's records refer to)."),
    ("datafile_batch_file_bytes", "kvstore_datafile_batch_file_bytes", GAUGE, "Bytes in the batch store's segments."),
    ("datafile_batch_live_bytes", "kvstore_datafile_batch_live_bytes", GAUGE,
     "Of those, the bytes of batches the data file's records refer to (the rest goes with its segment)."),
    ("datafile_batches_written", "kvstore_datafile_batches_written_total", COUNTER,
     "Sealed stream batches written to the batch store (each once, unless changed by XDEL or a trim)."),
    ("datafile_batch_reads", "kvstore_datafile_batch_reads_total", COUNTER,
     "Stream batches read back from the batch store."),
    ("datafile_batches_evicted", "kvstore_datafile_batches_evicted_total", COUNTER,
     "Sealed stream batches that left memory (their streams stayed: only old batches go)."),
    ("datafile_batches_loaded", "kvstore_datafile_batches_loaded_total", COUNTER,
     "Stream batches read back into memory because a command needed them."),
    ("datafile_write_errors", "kvstore_datafile_write_errors_total", COUNTER,
     "Sweeps of the data file that failed writing or syncing (a full or failing disk); each is retried."),
    # remote mode: this node's log at its peer
    ("log_peer_connected", "kvstore_peer_connected", GAUGE, "1 while the log sender is connected to the peer."),
    ("log_peer_degraded", "kvstore_peer_degraded", GAUGE,
     "1 while the peer is lost and writes are synced to the local disk instead."),
    ("log_peer_sent_lsn", "kvstore_peer_sent_lsn", GAUGE, "Last LSN shipped to the peer."),
    ("log_peer_acked_lsn", "kvstore_peer_acked_lsn", GAUGE, "Last LSN the peer acknowledged holding."),
    ("log_peer_records", "kvstore_peer_records_total", COUNTER, "Log records shipped to the peer."),
    ("log_peer_bytes", "kvstore_peer_sent_bytes_total", COUNTER, "Log bytes shipped to the peer."),
    ("log_peer_connects", "kvstore_peer_connects_total", COUNTER, "Connections made to the peer."),
    ("log_peer_disconnects", "kvstore_peer_disconnects_total", COUNTER, "Connections to the peer lost."),
    ("log_peer_catchup_records", "kvstore_peer_catchup_records_total", COUNTER,
     "Records shipped from the log files to catch the peer up."),
    # this node's receiver of its peer's log
    ("log_receiver_peers", "kvstore_receiver_peers", GAUGE, "Peers connected to this node's log receiver."),
    ("log_receiver_held_lsn", "kvstore_receiver_held_lsn", GAUGE, "Last LSN of the peer's log held here."),
    ("log_receiver_records", "kvstore_receiver_records_total", COUNTER, "Peer log records received."),
    ("log_receiver_syncs", "kvstore_receiver_syncs_total", COUNTER, "Syncs of the peer's log to disk."),
]

# Redis's cmdstat_<cmd> pairs: (pair, metric name, help, scale)
COMMAND_PAIRS = [
    ("calls", "kvstore_commands_total", "Calls of the command (INFO commandstats).", 1),
    ("usec", "kvstore_commands_duration_seconds_total", "Time spent running the command.", 1e-6),
    ("rejected_calls", "kvstore_commands_rejected_calls_total",
     "Calls refused before running (arity, authentication, out of memory...).", 1),
    ("failed_calls", "kvstore_commands_failed_calls_total", "Calls that ran and replied with an error.", 1),
]

# The pollers' poller<n> pairs: (pair, metric name, type, help)
POLLER_PAIRS = [
    ("epoll_wait", "kvstore_poller_epoll_wait_calls_total", COUNTER, "epoll_wait calls of the poller thread."),
    ("epoll_ctl", "kvstore_poller_epoll_ctl_calls_total", COUNTER, "epoll_ctl calls of the poller thread."),
    ("read", "kvstore_poller_read_calls_total", COUNTER, "read calls of the poller thread."),
    ("write", "kvstore_poller_write_calls_total", COUNTER, "write calls of the poller thread."),
    ("commands", "kvstore_poller_commands_total", COUNTER, "Commands the poller thread ran."),
    ("clients", "kvstore_poller_clients", GAUGE, "Client connections the poller thread serves."),
]

BUILD_LABELS = ("kvstore_version", "redis_version", "arch", "poll_policy", "durability")


def _family(kind, name, help, labels=()):
    if kind == COUNTER:
        return CounterMetricFamily(name, help, labels=labels)
    return GaugeMetricFamily(name, help, labels=labels)


def _labelled(info, pattern, pairs):
    """Families of labelled samples from the k=v fields whose name matches pattern (its group
    1 is the label's value): pairs are (pair, name, kind, help, scale, label name)."""
    out = []
    for pair, name, kind, help, scale, label in pairs:
        fam = _family(kind, name, help, [label])
        for field, value in info.items():
            m = pattern.match(field)
            if m and isinstance(value, dict) and isinstance(value.get(pair), (int, float)):
                fam.add_metric([m.group(1)], value[pair] * scale)
        if fam.samples:
            out.append(fam)
    return out


class Collector:
    """The metrics of one server, read when scraped. read() returns None while the server is
    not running, else {"info": parse_info(INFO everything), "sync": None or (bounds in
    seconds, per-bucket counts with one more than bounds, sum of seconds)}."""

    def __init__(self, read):
        self.read = read

    def collect(self):
        snap = self.read()
        if snap is None:
            return
        info = snap["info"]
        build = GaugeMetricFamily("kvstore_build_info", "The server's version and settings (value 1).",
                                  labels=BUILD_LABELS)
        build.add_metric([str(info.get(k, "")) for k in BUILD_LABELS], 1)
        yield build
        for field, name, kind, help in FIELDS:
            v = info.get(field)
            if isinstance(v, (int, float)):
                fam = _family(kind, name, help)
                fam.add_metric([], v)
                yield fam
        yield from self._keys(info)
        for field, name in (("log_write_status", "kvstore_log_write_error"),
                            ("datafile_write_status", "kvstore_datafile_write_error")):
            if field in info:  # ok|err: 1 while the disk refuses the file and writes are refused
                yield GaugeMetricFamily(name, "1 while the disk refuses this file (writes are refused meanwhile; "
                                        "retried until it can be written).", value=int(info[field] == "err"))
        if isinstance(info.get("log_peer_acked_lsn"), int) and isinstance(info.get("log_appended_lsn"), int):
            yield GaugeMetricFamily("kvstore_peer_lag_lsn", "Records appended to the log and not yet acknowledged "
                                    "by the peer (appended LSN - acknowledged LSN).",
                                    value=max(0, info["log_appended_lsn"] - info["log_peer_acked_lsn"]))
        # Per command (INFO commandstats) and per error code (INFO errorstats), if the server
        # has those sections: without them only the totals above are exported.
        yield from _labelled(info, re.compile(r"^cmdstat_(.+)$"),
                             [(p, n, COUNTER, h, s, "cmd") for p, n, h, s in COMMAND_PAIRS])
        yield from _labelled(info, re.compile(r"^errorstat_(.+)$"),
                             [("count", "kvstore_errors_total", COUNTER, "Error replies by error code "
                               "(INFO errorstats).", 1, "err")])
        yield from _labelled(info, re.compile(r"^poller(\d+)$"),
                             [(p, n, k, h, 1, "poller") for p, n, k, h in POLLER_PAIRS])
        if snap.get("sync"):
            yield self._sync_histogram(*snap["sync"])

    @staticmethod
    def _keys(info):
        db0 = info.get("db0") if isinstance(info.get("db0"), dict) else {}  # no db0 line: no keys
        yield GaugeMetricFamily("kvstore_keys", "Keys in the store.", value=db0.get("keys", 0))
        yield GaugeMetricFamily("kvstore_keys_with_expiry", "Keys that have a time to live.",
                                value=db0.get("expires", 0))

    @staticmethod
    def _sync_histogram(bounds, counts, total_seconds):
        cum, buckets = 0, []
        for le, n in zip(list(bounds) + [float("inf")], counts):
            cum += n
            buckets.append((floatToGoString(le), cum))
        h = HistogramMetricFamily("kvstore_log_sync_duration_seconds",
                                  "Time of the log's fdatasync calls (group commits).")
        h.add_metric([], buckets, sum_value=total_seconds)
        return h


class Endpoint:
    """A running metrics HTTP server (prometheus_client's, on its own registry)."""

    def __init__(self, bind, port, read):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(Collector(read))
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, resident memory, fds
        try:
            self._httpd, self._thread = start_http_server(port, addr=bind, registry=self.registry)
        except OSError as e:
            why = ("the address is in use (another process listens there): choose another --metrics-port, "
                   "or 0 for any free port" if e.errno == errno.EADDRINUSE else e.strerror or str(e))
            raise errors.ServerError(f"metrics_port {port}: cannot serve metrics on {bind}:{port}: {why}",
                                     e.errno) from None

    @property
    def port(self):
        return self._httpd.server_address[1]

    def close(self):
        """Stop serving: no scrape starts after this returns (one in flight may still finish)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)
