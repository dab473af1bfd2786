"""--arch dpdk: the kernel-bypass UDP front end, served by a real node on one end of a veth
pair (AF_XDP) and driven from the namespace at the other end by kernel UDP sockets: a small
Python client that checks every reply byte for byte (udp_client.py), and `kvstore bench --udp
--check`; in memory only and with disk durability, the data file and a small memory, then
kill -9. Skipped only where it cannot run: not root, kvstore built without libdpdk, no AF_XDP.
Also the UDP front ends' settings (both archs)."""
import json
import os
import socket
import subprocess
import sys

import pytest

from helpers import udp_client
from kvstore import Node, Server
from kvstore import server as server_mod
from kvstore.config import ServerConfig
from kvstore.errors import ConfigError

UDP_PORT = 6390
INDEX = 213  # 198.18.213.0/30, veths kv213h / kv213n: apart from the other tests' hosts


def _why_not():
    if os.geteuid() != 0:
        return "needs root (network namespaces, AF_XDP)"
    if not server_mod.have_dpdk():
        return "kvstore was built without DPDK (libdpdk-dev not found at build time)"
    try:
        socket.socket(44, socket.SOCK_RAW).close()  # AF_XDP
    except OSError as e:
        return f"AF_XDP sockets unavailable in this kernel: {e}"
    from kvstore import netns
    ok, why = netns.available()
    return "" if ok else why


needs_dpdk = pytest.mark.skipif(bool(_why_not()), reason=_why_not() or "runs")


@pytest.fixture
def bypass_host():
    from kvstore import netns
    host = netns.TestHost("kvdpdk213", index=INDEX)
    host.create()
    try:
        # Without this every reply built from an offloaded frame is dropped for a bad checksum.
        host.tx_checksum_offload_off()
        # The kernel-bypass end answers no ARP: the client side needs a static neighbour.
        host.set_neighbour(host.local_addr, host.mac())
        yield host
    finally:
        host.close()


@pytest.mark.root
@needs_dpdk
@pytest.mark.parametrize("durability", ["none", "disk"])
def test_udp_set_get_every_reply_checked(bypass_host, tmp_path, durability):
    """Every reply checked, with the node in memory only, and as deployed for durability:
    disk mode, the data file, memory far below the data (replies wait for the log,
    requests wait for the flusher and the loader). Then kill -9: every key is back."""
    host = bypass_host
    settings = dict(arch="dpdk", dpdk_iface=host.host_if, udp_port=UDP_PORT, udp_workers=1,
                    durability=durability)
    if durability == "disk":
        settings.update(data_file=True, max_memory="128kb", flush_interval_ms=100)
    node = Node(port=0, data_dir=tmp_path / "node", **settings)
    with node:
        st = udp_client.check(lambda cmd, **kw: host.run(*cmd, **kw), node, host.local_addr, UDP_PORT)
        if durability == "none":
            rc = node.stop()
            assert rc == 0, node.log()[-2000:]
            return
        assert st["udp_held_for_log"] > 0 and st["udp_stalled"] > 0, st
        node.kill()
    # the same directory served by TCP pollers: what the lcores acknowledged is there
    with Node(port=0, data_dir=tmp_path / "node", durability="disk") as again:
        with again.client(socket_timeout=10) as c:
            keys = [f"dk:{i:06d}" for i in range(3000)]
            assert c.mget(keys) == [b"value-%d-" % i + b"x" * (i % 50) for i in range(3000)]



def _bench(host, *args, timeout_ms):
    r = host.run(sys.executable, "-m", "kvstore.cli", "bench", "--udp", "--host", host.local_addr, "-p",
                 str(UDP_PORT), "-t", "1", "--ratio", "1:0", "-d", "85", "--timeout-ms", str(timeout_ms), "--json",
                 *args, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)
    assert b["errors"] == 0, b
    return b


@pytest.mark.root
@needs_dpdk
def test_two_thousand_held_replies_in_flight_keep_the_port_receiving(bypass_host, tmp_path):
    """2,000 datagrams in flight (125 sockets x 16) while every reply waits for the log
    (disk mode) holds ~1,000 mbufs at a time, past the lcore's mempool cache: allocation
    walks the whole pool. Any mbuf outside the AF_XDP umem then costs a fill-ring slot for
    good, and once the 2,048 are gone the port receives nothing more (the README's dpdk
    stall). Every request is answered (a veth may lose a few datagrams, not more), and a
    small load afterwards is answered in full: the port still receives."""
    host = bypass_host
    node = Node(port=0, data_dir=tmp_path / "node", arch="dpdk", dpdk_iface=host.host_if, udp_port=UDP_PORT,
                udp_workers=1, durability="disk")
    n = 100_000
    with node:
        b = _bench(host, "-c", "125", "-P", "16", "-n", str(n), "-r", "50000", "--duration", "30", timeout_ms=1000)
        assert b["requests"] >= n - n // 100 and b["timeouts"] <= n // 100, b
        after = _bench(host, "-c", "2", "-P", "1", "-n", "200", "-r", "100", "--duration", "30", timeout_ms=5000)
        assert after["requests"] == 200 and after["timeouts"] == 0, after
        st = node.stats()
        assert st["udp_held_for_log"] >= n - n // 100, st
        assert node.stop() == 0, node.log()[-2000:]


def test_udp_front_end_settings_are_checked():
    with pytest.raises(ConfigError, match=r"dpdk_iface: arch dpdk needs a network interface name"):
        ServerConfig(arch="dpdk").validate()
    for arch in ("udp", "dpdk"):
        with pytest.raises(ConfigError, match=r"udp_workers: expected an integer from 1 to 63, got 0"):
            ServerConfig(arch=arch, dpdk_iface="veth0", udp_workers=0).validate()
        with pytest.raises(ConfigError, match=rf"arch {arch}: requirepass is not supported: the UDP front end has "
                                              r"no AUTH"):
            ServerConfig(arch=arch, dpdk_iface="veth0", requirepass="pw").validate()
    with pytest.raises(ConfigError, match=r"udp_port: expected a UDP port from 1 to 65535, got 0"):
        ServerConfig(arch="dpdk", dpdk_iface="veth0", udp_port=0).validate()
    with pytest.raises(ConfigError, match=r"udp_port: expected a UDP port from 0 to 65535 \(0 = any free port\), "
                                          r"got 70000"):
        ServerConfig(arch="udp", udp_port=70000).validate()
    cfg = ServerConfig(arch="dpdk", dpdk_iface="veth0", durability="disk", data_file=True).validate()
    assert cfg.effective_threads == 1 and cfg.udp_workers == 1 and cfg.udp_port == 6380


def test_dpdk_cli_message_when_built_without(monkeypatch):
    monkeypatch.setattr(server_mod, "have_dpdk", lambda: False)
    with pytest.raises(ConfigError, match=r"^kvstore was built without DPDK \(libdpdk-dev not found at build time\)$"):
        Server(port=0, arch="dpdk", dpdk_iface="veth0", durability="none").start()


def test_udp_bench_rejects_what_it_cannot_do():
    from kvstore import bench
    from kvstore.errors import ConfigError as CE
    with pytest.raises(CE, match=r"value size: expected 1..1400 bytes over UDP"):
        bench.run(port=9, udp=True, requests=1, value_size=2000)
    with pytest.raises(CE, match=r"password: the UDP path has no AUTH"):
        bench.run(port=9, udp=True, requests=1, password="x")


def test_cli_serve_udp_front_end_error():
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", "serve", "--arch", "udp", "--requirepass", "pw",
                        "--port", "0"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "arch udp: requirepass is not supported: the UDP front end has no AUTH" in r.stderr
