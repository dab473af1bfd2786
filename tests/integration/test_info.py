"""INFO (ext/cmd/info.c) from a served node: its sections, their headers and order, the
fields of each, section selection (one, several, all/default/everything, unknown), RESP3,
the mode-dependent lines (log_*, datafile_*, log_peer_*, udp_*) and CONFIG RESETSTAT.
The exact text today is pinned here: it is the reference for a redesign of info.c."""
import os
import re

import pytest

from helpers.conn import Raw
from helpers.resp import info_dict

pytestmark = pytest.mark.timeout(60)


def _raw_info(port, *sections):
    """INFO's text as sent (redis-py would parse it into a dict)."""
    with Raw(port) as r:
        return r.call("INFO", *sections)


INFO_FIELDS = {
    "server": ["redis_version", "process_id", "tcp_port", "uptime_in_seconds", "poll_policy",
               "accept_mode", "pollers"],
    "clients": ["connected_clients", "maxclients", "blocked_clients"],
    "memory": ["used_memory", "used_memory_human", "maxmemory", "maxmemory_policy"],
    "persistence": ["loading", "durability"],
    "replication": ["role"],
    "stats": ["total_connections_received", "total_commands_processed", "instantaneous_ops_per_sec",
              "rejected_connections", "expired_keys", "keyspace_hits", "keyspace_misses",
              "total_error_replies_protocol", "total_error_replies"],
    "pollers": ["poller0", "poller1", "total_epoll_wait_calls", "total_epoll_ctl_calls",
                "total_read_calls", "total_write_calls"],
    "cpu": ["used_cpu_sys", "used_cpu_user"],
    "errorstats": [],
    "cluster": ["cluster_enabled"],
    "keyspace": ["db0"],
}


def test_info_sections(c, kv):
    c.set("somekey", "1")
    raw = _raw_info(kv.port)
    info = info_dict(raw)
    assert info["__sections__"] == list(INFO_FIELDS)
    for sec, keys in INFO_FIELDS.items():
        for k in keys:
            assert k in info, (sec, k)
    assert int(info["process_id"]) == kv.pid
    assert int(info["tcp_port"]) == kv.port
    assert int(info["pollers"]) == 2
    assert int(info["maxmemory"]) == 256 * 1024 * 1024
    assert info["db0"].startswith("keys=1,")
    # per-poller syscall counters, and the totals are their sums (same snapshot)
    per = []
    for i in range(2):
        d = dict(kv_.split("=") for kv_ in info[f"poller{i}"].split(","))
        assert set(d) >= {"clients", "commands", "epoll_wait", "epoll_ctl", "read", "write"}
        per.append({k: int(v) for k, v in d.items()})
    for total, field in (("total_epoll_wait_calls", "epoll_wait"), ("total_epoll_ctl_calls", "epoll_ctl"),
                         ("total_read_calls", "read"), ("total_write_calls", "write")):
        assert int(info[total]) == sum(p[field] for p in per), total
    assert int(info["total_read_calls"]) > 0 and int(info["total_write_calls"]) > 0


def test_info_single_sections(c):
    for sec in INFO_FIELDS:
        d = c.info(sec)
        if sec == "keyspace":
            assert d == {}  # empty keyspace: no db0 line
            continue
        for k in INFO_FIELDS[sec]:
            assert k in d, (sec, k)
    assert "used_memory" in c.info("MEMORY")  # section names are case-insensitive
    every = c.info("everything")
    assert "used_cpu_sys" in every and "connected_clients" in every


def test_info_counters_move(c):
    before = c.info("stats")
    c.get("nokey")
    c.set("k", "v")
    c.get("k")
    after = c.info("stats")
    assert after["total_commands_processed"] >= before["total_commands_processed"] + 3
    assert after["keyspace_misses"] >= before["keyspace_misses"] + 1
    assert after["keyspace_hits"] >= before["keyspace_hits"] + 1


# ------------------------------------------------------------------ the text of today's INFO, exactly

SECTIONS = ["Server", "Clients", "Memory", "Persistence", "Replication", "Stats", "Pollers", "Cpu", "Errorstats",
            "Cluster", "Keyspace"]
FIELDS = {  # every field of each section, in order, in the default mode (--arch poller, 2 pollers, no log)
    "Server": ["kvstore_version", "redis_version", "redis_mode", "os", "arch_bits", "multiplexing_api", "arch",
               "poll_policy", "accept_mode", "pollers", "process_id", "tcp_port", "uptime_in_seconds",
               "config_file"],
    "Clients": ["connected_clients", "maxclients", "client_recent_max_input_buffer", "client_recent_max_output_buffer",
                "blocked_clients"],
    "Memory": ["used_memory", "used_memory_human", "maxmemory", "maxmemory_human", "maxmemory_policy",
               "table_buckets", "table_rehashing_shards", "mem_allocator", "mem_clients_slaves", "mem_clients_normal",
               "maxmemory_clients"],
    "Persistence": ["loading", "durability", "aof_enabled", "rdb_changes_since_last_save"],
    "Replication": ["role", "connected_slaves"],
    "Stats": ["total_connections_received", "total_commands_processed", "instantaneous_ops_per_sec",
              "total_net_input_bytes", "total_net_output_bytes", "rejected_connections", "expired_keys",
              "evicted_keys", "keyspace_hits", "keyspace_misses", "oom_rejections", "total_error_replies_protocol",
              "evicted_clients", "client_query_buffer_limit_disconnections",
              "client_output_buffer_limit_disconnections", "total_error_replies", "acl_access_denied_auth",
              "client_timeout_disconnections"],
    "Pollers": ["poller0", "poller1", "total_epoll_wait_calls", "total_epoll_ctl_calls", "total_read_calls",
                "total_write_calls"],
    "Cpu": ["used_cpu_sys", "used_cpu_user"],
    "Errorstats": [],  # (a fresh server: no error replied yet)
    "Cluster": ["cluster_enabled"],
    "Keyspace": ["db0"],
}
LOG_FIELDS = ["log_appended_lsn", "log_durable_lsn", "log_groups", "log_records", "log_bytes",
              "log_max_group_records", "log_syncs", "log_sync_avg_us", "log_sync_max_us", "log_failed",
              "log_segments", "log_segments_prepared"]
DATAFILE_FIELDS = ["datafile_buckets", "datafile_keys", "memory_keys", "datafile_flushed_lsn", "datafile_sweeps",
                   "datafile_records_written", "datafile_blocks_written", "datafile_blocks_read",
                   "datafile_deferred", "datafile_loads", "datafile_evicted_keys", "datafile_log_segments_deleted",
                   "datafile_failed", "datafile_error", "datafile_bytes_written", "datafile_bytes_read",
                   "datafile_write_calls", "datafile_read_calls", "datafile_sweep_seconds", "datafile_io_seconds",
                   "datafile_sweep_cpu_seconds",
                   "datafile_sweep_chunks", "datafile_chunk_evicted_keys",  # issue 14b (chunk)
                   "datafile_batch_segments", "datafile_batch_file_bytes", "datafile_batch_live_bytes",
                   "datafile_batches_written", "datafile_batch_reads", "datafile_batches_evicted",
                   "datafile_batches_loaded"]
DISK_LOG_FIELDS = ["aof_last_write_status", "log_write_status", "log_write_error", "log_write_errors"]
DISK_DATAFILE_FIELDS = ["datafile_write_status", "datafile_write_error", "datafile_write_errors"]
PEER_FIELDS = ["log_peer_connected", "log_peer_degraded", "log_peer_acked_lsn", "log_peer_sent_lsn",
               "log_peer_batches", "log_peer_records", "log_peer_bytes", "log_peer_connects",
               "log_peer_disconnects", "log_peer_catchup_records", "log_peer_auth_failures", "log_peer_last_error",
               "log_receiver_port", "log_receiver_peers", "log_receiver_held_lsn", "log_receiver_batches",
               "log_receiver_records", "log_receiver_syncs", "log_receiver_fetches", "log_receiver_auth_failures"]
UDP_SERVER_FIELDS = ["udp_port", "udp_workers"]
UDP_STATS_FIELDS = ["udp_rx_packets", "udp_tx_packets", "udp_requests", "udp_dropped_not_ours", "udp_tx_failed",
                    "udp_bad_frames", "udp_held_for_log", "udp_stalled", "udp_busy_us"]


def parse(text):
    """INFO text -> [(section, [(field, value)])]: "# Name" starts a section, "field:value"
    lines follow, empty lines separate sections; every line ends in CRLF."""
    if isinstance(text, bytes):
        text = text.decode()
    assert text == "" or text.endswith("\r\n"), repr(text[-40:])
    out = []
    for line in text.split("\r\n")[:-1]:
        if line.startswith("# "):
            out.append((line[2:], []))
        elif line:
            k, sep, v = line.partition(":")
            assert sep and out, repr(line)
            out[-1][1].append((k, v))
    return out


def layout(text):
    """[(section, [field names])] of an INFO text."""
    return [(sec, [k for k, _ in fields]) for sec, fields in parse(text)]


def values(text):
    return {k: v for _, fields in parse(text) for k, v in fields}


def raw(port, *args):
    with Raw(port) as r:
        return r.call(*args)


@pytest.fixture
def fresh(kv_node_factory):
    """A 2-poller node holding one key, as FIELDS describes."""
    n = kv_node_factory(threads=2)
    assert raw(n.port, "SET", "k", "v") == b"OK"
    return n


def test_every_section_with_its_header_and_fields_in_order(fresh):
    assert layout(raw(fresh.port, "INFO")) == [(s, FIELDS[s]) for s in SECTIONS]


def test_sections_are_separated_by_one_empty_line(fresh):
    text = raw(fresh.port, "INFO").decode()
    blocks = text.split("\r\n\r\n")
    assert [b.split("\r\n", 1)[0] for b in blocks] == [f"# {s}" for s in SECTIONS]
    assert text.endswith("avg_ttl=0\r\n")  # the last section, like every other, ends its last line
    assert re.search(rb"\r\nmaxmemory_clients:\d+\r\n$", raw(fresh.port, "INFO", "memory"))


def test_default_all_and_everything_are_every_section(fresh):
    want = [(s, FIELDS[s]) for s in SECTIONS]
    for arg in ("default", "Default"):
        assert layout(raw(fresh.port, "INFO", arg)) == want, arg
    # as Redis: "all" and "everything" add commandstats and latencystats (whose lines
    # are the commands run so far), which "default" leaves out
    every = SECTIONS[:-3] + ["Commandstats", "Errorstats", "Latencystats", "Cluster", "Keyspace"]
    for arg in ("all", "everything", "ALL", "Everything"):
        got = layout(raw(fresh.port, "INFO", arg))
        assert [s for s, _ in got] == every, arg
        assert [x for x in got if x[0] not in ("Commandstats", "Latencystats")] == want, arg


@pytest.mark.parametrize("section", SECTIONS)
def test_one_section_alone(fresh, section):
    assert layout(raw(fresh.port, "INFO", section.lower())) == [(section, FIELDS[section])]
    assert layout(raw(fresh.port, "INFO", section.upper())) == [(section, FIELDS[section])]


def test_several_sections_come_in_info_order_each_once(fresh):
    text = raw(fresh.port, "INFO", "cpu", "MEMORY", "nosuch", "Cpu", "server")
    assert layout(text) == [("Server", FIELDS["Server"]), ("Memory", FIELDS["Memory"]), ("Cpu", FIELDS["Cpu"])]


def test_unknown_section_is_an_empty_reply(fresh):
    with Raw(fresh.port) as r:
        assert r.send(b"*2\r\n$4\r\nINFO\r\n$6\r\nnosuch\r\n").reply() == b"$0\r\n\r\n"
        assert r.send(b"*2\r\n$4\r\nINFO\r\n$6\r\nnosuch\r\n").reply() == b"$0\r\n\r\n"  # connection still fine


def test_resp3_info_is_a_verbatim_string(fresh):
    with Raw(fresh.port) as r:
        assert isinstance(r.call("HELLO", "3"), dict)
        reply = r.send(b"*2\r\n$4\r\nINFO\r\n$6\r\nmemory\r\n").reply()
        header, body = reply.split(b"\r\n", 1)
        assert header.startswith(b"=") and body.startswith(b"txt:# Memory\r\n") and body.endswith(b"\r\n\r\n")
        assert b"\r\nmem_allocator:libc\r\n" in body
        assert int(header[1:]) == len(body) - 2  # the length counts "txt:" and the text
        assert layout(body[4:-2]) == [("Memory", FIELDS["Memory"])]
        assert r.send(b"*2\r\n$4\r\nINFO\r\n$6\r\nnosuch\r\n").reply() == b"=4\r\ntxt:\r\n"


def test_server_section_values(fresh):
    v = values(raw(fresh.port, "INFO", "server"))
    assert v["arch"] == "poller" and v["pollers"] == "2" and v["multiplexing_api"] == "epoll"
    assert v["poll_policy"] == "direct" and v["accept_mode"] == "reuseport"
    assert int(v["process_id"]) == fresh.pid and int(v["tcp_port"]) == fresh.port
    assert v["redis_mode"] == "standalone" and v["arch_bits"] == "64" and v["config_file"] == ""


def test_keyspace_counts_keys_and_expires(kv_node_factory):
    n = kv_node_factory()
    assert parse(raw(n.port, "INFO", "keyspace")) == [("Keyspace", [])]  # no keys: no db0 line
    with Raw(n.port) as r:
        for i in range(5):
            assert r.call("SET", f"k{i}", "v") == b"OK"
        assert r.call("SET", "ttl", "v", "EX", "1000") == b"OK"
        db0 = values(r.call("INFO", "keyspace"))["db0"]
        assert db0.startswith("keys=6,expires=1,avg_ttl="), db0
        assert r.call("DEL", "k0", "ttl") == 2
        assert values(r.call("INFO", "keyspace"))["db0"] == "keys=4,expires=0,avg_ttl=0"


def test_config_resetstat_zeroes_the_syscall_counters(kv_node_factory):
    """CONFIG RESETSTAT zeroes each poller's epoll_wait/epoll_ctl/read/write counts (and
    so the totals), and the command and keyspace totals count from it, as Redis's do."""
    n = kv_node_factory(threads=1)
    with Raw(n.port) as r:
        for _ in range(50):
            assert r.call("GET", "missing") is None
        before = values(r.call("INFO"))
        assert int(before["total_read_calls"]) >= 1 and int(before["total_epoll_wait_calls"]) >= 1
        assert r.call("CONFIG", "RESETSTAT") == b"OK"
        after = values(r.call("INFO"))
    # what the pollers count after the reset is at most the round of CONFIG RESETSTAT's reply
    # and the one of this INFO (a cron tick may add an epoll_wait, never a read)
    assert int(after["total_read_calls"]) <= 2 and int(after["total_write_calls"]) <= 2, after
    assert int(after["total_epoll_ctl_calls"]) <= 2, after
    for f in ("total_epoll_wait_calls", "total_read_calls", "total_write_calls"):
        assert int(after[f]) < int(before[f]) or int(before[f]) <= 2, (f, before[f], after[f])
    p0 = dict(kv.split("=") for kv in after["poller0"].split(","))
    assert [p0[k] for k in ("read", "write")] == [after["total_read_calls"], after["total_write_calls"]]
    assert int(before["total_commands_processed"]) >= 50 and int(after["total_commands_processed"]) <= 2
    assert int(before["keyspace_misses"]) == 50 and int(after["keyspace_misses"]) == 0


def test_persistence_in_disk_mode_has_the_log_lines(kv_node_factory):
    n = kv_node_factory(durability="disk", data_file=False)
    with Raw(n.port) as r:
        for i in range(3):
            assert r.call("SET", f"k{i}", "v") == b"OK"
        text = r.call("INFO", "persistence")
    assert layout(text) == [("Persistence", FIELDS["Persistence"] + LOG_FIELDS + DISK_LOG_FIELDS)]
    v = values(text)
    assert v["durability"] == "disk" and v["log_failed"] == "0"
    assert v["log_appended_lsn"] == v["log_durable_lsn"] == v["log_records"] == "3"  # acked: durable


def test_persistence_with_a_data_file_has_the_datafile_lines(kv_node_factory):
    n = kv_node_factory(durability="disk", data_file=True)
    with Raw(n.port) as r:
        assert r.call("SET", "k", "v") == b"OK"
        text = r.call("INFO", "persistence")
    assert layout(text) == [("Persistence", FIELDS["Persistence"] + LOG_FIELDS + DATAFILE_FIELDS + DISK_LOG_FIELDS
                             + DISK_DATAFILE_FIELDS)]
    v = values(text)
    assert v["datafile_failed"] == "0" and v["datafile_error"] == ""
    assert v["aof_last_write_status"] == v["log_write_status"] == v["datafile_write_status"] == "ok"


def test_replication_in_remote_mode_has_the_peer_lines(tmp_path):
    from helpers.pair import Pair  # two nodes, each the other's log peer
    p = Pair(tmp_path)
    try:
        p.start_both()
        text = raw(p.nodes["a"].port, "INFO", "persistence", "replication")
    finally:
        p.close()
    assert layout(text) == [("Persistence", FIELDS["Persistence"] + LOG_FIELDS + DATAFILE_FIELDS + DISK_LOG_FIELDS
                             + DISK_DATAFILE_FIELDS + ["node_id"]),
                            ("Replication", FIELDS["Replication"] + PEER_FIELDS)]
    v = values(text)
    assert v["durability"] == "remote" and int(v["log_receiver_port"]) == p.rport["a"]
    assert v["node_id"] == open(os.path.join(p.dirs["a"], "node-id")).read().strip()


def test_udp_front_end_adds_its_lines(kv_node_factory):
    n = kv_node_factory(arch="udp", udp_port=0, udp_workers=2)
    text = raw(n.port, "INFO")
    fields = dict(layout(text))
    assert list(fields) == SECTIONS
    assert fields["Server"] == FIELDS["Server"] + UDP_SERVER_FIELDS
    assert fields["Stats"] == FIELDS["Stats"] + UDP_STATS_FIELDS
    v = values(text)
    assert v["arch"] == "udp" and int(v["udp_port"]) == n.udp_port and v["udp_workers"] == "2"


def test_threadpool_lists_one_line_per_worker(kv_node_factory):
    n = kv_node_factory(arch="threadpool", threads=3)
    fields = dict(layout(raw(n.port, "INFO", "server", "pollers")))
    assert fields["Server"] == FIELDS["Server"]
    assert fields["Pollers"] == ["poller0", "poller1", "poller2"] + FIELDS["Pollers"][2:]
