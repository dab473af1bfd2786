"""kvstore.Client: redis-py's client plus kvstore's own statistics."""
import redis


def _parse_pollers(info):
    pollers = []
    for key in sorted(k for k in info if k.startswith("poller") and k[6:].isdigit()):
        v = info[key]
        if isinstance(v, str):  # redis-py leaves "a=1,b=2" unparsed in some versions
            v = dict(kv.split("=", 1) for kv in v.split(","))
        pollers.append({k: int(x) for k, x in v.items()})
    return pollers


class Client(redis.Redis):
    """A redis.Redis connected to kvstore (default 127.0.0.1:6380)."""

    def __init__(self, host="127.0.0.1", port=6380, **kwargs):
        super().__init__(host=host, port=port, **kwargs)

    def kvstore_stats(self):
        """Server counters as a dict: commands, clients, memory, and per-poller syscalls."""
        info = self.info("everything")
        pollers = _parse_pollers(info)
        keys = ("total_commands_processed", "connected_clients", "used_memory", "maxmemory",
                "total_connections_received", "rejected_connections", "keyspace_hits",
                "keyspace_misses", "oom_rejections", "expired_keys", "used_cpu_sys", "used_cpu_user",
                "total_epoll_wait_calls", "total_epoll_ctl_calls", "total_read_calls",
                "total_write_calls", "poll_policy", "pollers", "kvstore_version", "tcp_port",
                "udp_rx_packets", "udp_tx_packets", "udp_requests", "udp_dropped_not_ours", "udp_tx_failed",
                "udp_bad_frames", "udp_held_for_log", "udp_stalled", "udp_busy_us", "udp_port", "udp_workers")  # --arch udp/dpdk
        out = {k: info[k] for k in keys if k in info}
        out["poller_stats"] = pollers
        return out
