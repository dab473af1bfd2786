"""INFO (ext/cmd/info.c) from a served node: its sections, their headers and order, the
fields of each, section selection (one, several, all/default/everything, unknown), RESP3,
the mode-dependent lines (log_*, datafile_*, log_peer_*, udp_*) and CONFIG RESETSTAT.
The exact text today is pinned here: it is the reference for a redesign of info.c."""
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
    "clients": ["connected_clients", "maxclients"],
    "memory": ["used_memory", "used_memory_human", "maxmemory", "maxmemory_policy"],
    "persistence": ["loading", "durability"],
    "replication": ["role"],
    "stats": ["total_connections_received", "total_commands_processed", "instantaneous_ops_per_sec",
              "rejected_connections", "expired_keys", "keyspace_hits", "keyspace_misses",
              "total_error_replies_protocol"],
    "pollers": ["poller0", "poller1", "total_epoll_wait_calls", "total_epoll_ctl_calls",
                "total_read_calls", "total_write_calls"],
    "cpu": ["used_cpu_sys", "used_cpu_user"],
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
