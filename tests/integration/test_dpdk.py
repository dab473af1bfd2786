"""--arch dpdk: the kernel-bypass UDP front end, served by a real node on one end of a veth
pair (AF_XDP) and driven from the namespace at the other end by kernel UDP sockets: a small
Python client that checks every reply byte for byte, and `kvstore bench --udp --check`.
Skipped only where it cannot run: not root, kvstore built without libdpdk, no AF_XDP."""
import json
import os
import socket
import subprocess
import sys

import pytest

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
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        return "pyroute2 is not installed"
    return ""


needs_dpdk = pytest.mark.skipif(bool(_why_not()), reason=_why_not() or "runs")

# Run inside the namespace: SET then GET of each key, a window of requests in flight,
# every reply matched by id and compared with the exact bytes expected.
CLIENT = r'''
import json, socket, struct, sys, time
host, port, n, window = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((host, port))
s.settimeout(0.5)
reqs = []
for i in range(n):
    k, v = b"dk:%06d" % i, b"value-%d-" % i + b"x" * (i % 50)
    reqs.append((b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v), b"+OK\r\n"))
for i in range(n):
    k, v = b"dk:%06d" % i, b"value-%d-" % i + b"x" * (i % 50)
    reqs.append((b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k), b"$%d\r\n%s\r\n" % (len(v), v)))
reqs.append((b"*2\r\n$3\r\nGET\r\n", None))  # malformed: an error reply with the ERROR flag
ok, bad, lost, pending, nxt = 0, [], 0, {}, 0
deadline = time.monotonic() + 60
def send(i):
    s.send(struct.pack(">IHH", i, 0, 0) + reqs[i][0])
    pending[i] = (time.monotonic(), 0)
while (nxt < len(reqs) or pending) and time.monotonic() < deadline:
    while nxt < len(reqs) and len(pending) < window and (nxt < n or not any(j < n for j in pending)):
        send(nxt); nxt += 1   # every SET answered before the first GET goes out
    try:
        r = s.recv(4096)
    except socket.timeout:
        for i, (t, tries) in list(pending.items()):  # a lost datagram: resend (idempotent here)
            if tries >= 3:
                del pending[i]; lost += 1
            else:
                send(i); pending[i] = (time.monotonic(), tries + 1)
        continue
    rid, seq, flags = struct.unpack(">IHH", r[:8])
    if rid not in pending:
        continue
    del pending[rid]
    want = reqs[rid][1]
    if want is None:
        good = flags == 3 and r[8:] == b"-ERR invalid request: incomplete RESP request in datagram\r\n"
    else:
        good = flags == 1 and seq == 0 and r[8:] == want
    if good:
        ok += 1
    elif len(bad) < 5:
        bad.append([rid, flags, repr(r[8:80])])
    else:
        bad.append(rid)
# odd datagrams: too short and flagged ones are dropped; the others get exact error replies
s.send(b"abc")
s.send(struct.pack(">IHH", 900001, 0, 1) + b"*1\r\n$4\r\nPING\r\n")
big = b"v" * 1400
s.send(struct.pack(">IHH", 900005, 0, 0) + b"*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$1400\r\n" + big + b"\r\n")
while struct.unpack(">I", s.recv(4096)[:4])[0] != 900005:  # the SET first, then a reply too large
    pass
s.send(struct.pack(">IHH", 900002, 0, 0) + b"*3\r\n$4\r\nMGET\r\n$3\r\nbig\r\n$3\r\nbig\r\n")
s.send(struct.pack(">IHH", 900003, 0, 0) + b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n")
s.send(struct.pack(">IHH", 900004, 0, 0) + b"*1\r\n$4\r\nPING\r\n")
odd, end = {}, time.monotonic() + 1.0
while time.monotonic() < end:
    try:
        r = s.recv(4096)
    except socket.timeout:
        break
    rid, seq, flags = struct.unpack(">IHH", r[:8])
    if rid >= 900000:
        odd[rid] = [flags, r[8:].decode()]
        if len(odd) == 3:
            break
print(json.dumps({"ok": ok, "bad": bad, "lost": lost, "unsent": len(reqs) - nxt, "total": len(reqs), "odd": odd}))
'''


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
def test_udp_set_get_every_reply_checked(bypass_host, tmp_path):
    host = bypass_host
    node = Node(port=0, data_dir=tmp_path / "node", arch="dpdk", dpdk_iface=host.host_if, dpdk_port=UDP_PORT,
                dpdk_lcores=1)
    with node:
        script = tmp_path / "udp_client.py"
        script.write_text(CLIENT)
        n = 3000
        r = host.run(sys.executable, str(script), host.local_addr, str(UDP_PORT), str(n), "32",
                     capture_output=True, text=True, timeout=90)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert res["bad"] == [] and res["unsent"] == 0, res
        assert res["lost"] == 0, res
        assert res["ok"] == res["total"] == 2 * n + 1
        odd = {int(k): v for k, v in res["odd"].items()}
        assert set(odd) == {900002, 900003, 900004}, odd  # 900001 (flagged) is dropped, unanswered
        assert odd[900002][0] == 3 and odd[900002][1].startswith("-ERR reply too large for a UDP datagram ("), odd
        assert odd[900003] == [3, "-ERR invalid request: more than one request in datagram\r\n"]
        assert odd[900004] == [1, "+PONG\r\n"]

        # the same table through the TCP control path
        with node.client(socket_timeout=5) as c:
            assert c.get("dk:000007") == b"value-7-" + b"x" * 7
            st = c.info("stats")
        assert st["udp_requests"] == 2 * n + 3 and st["udp_bad_frames"] == 2, st  # + SET, MGET, PING; "abc", flagged
        # the load generator's UDP mode, every reply verified
        bench = host.run(sys.executable, "-m", "kvstore.cli", "bench", "--udp", "--host", host.local_addr,
                         "-p", str(UDP_PORT), "-t", "1", "-c", "4", "-P", "8", "-n", "20000", "--ratio", "1:1",
                         "-r", "2000", "-d", "64", "--check", "--json", capture_output=True, text=True, timeout=90)
        assert bench.returncode == 0, bench.stderr
        b = json.loads(bench.stdout)
        assert b["errors"] == 0, b
        assert b["requests"] + b["timeouts"] == 20000
        assert b["timeouts"] <= 20, b  # a veth on a loaded machine may lose a few datagrams, not more
        assert b["sets"] > 0 and b["hits"] > 0
        rc = node.stop()
    assert rc == 0, node.log()[-2000:]


def test_dpdk_rejects_durability_and_data_file():
    with pytest.raises(ConfigError, match=r"arch dpdk: durability disk is not supported"):
        ServerConfig(arch="dpdk", dpdk_iface="veth0", durability="disk").validate()
    with pytest.raises(ConfigError, match=r"arch dpdk: durability remote is not supported"):
        ServerConfig(arch="dpdk", dpdk_iface="veth0", durability="remote", peer="127.0.0.1:7000").validate()
    with pytest.raises(ConfigError, match=r"arch dpdk: a data file is not supported"):
        ServerConfig(arch="dpdk", dpdk_iface="veth0", data_file=True).validate()
    with pytest.raises(ConfigError, match=r"dpdk_iface: arch dpdk needs a network interface name"):
        ServerConfig(arch="dpdk").validate()
    with pytest.raises(ConfigError, match=r"dpdk_lcores: expected an integer from 1 to 63"):
        ServerConfig(arch="dpdk", dpdk_iface="veth0", dpdk_lcores=0).validate()
    assert ServerConfig(arch="dpdk", dpdk_iface="veth0").validate().effective_threads == 1


def test_dpdk_cli_message_when_built_without(monkeypatch):
    monkeypatch.setattr(server_mod, "have_dpdk", lambda: False)
    with pytest.raises(ConfigError, match=r"^kvstore was built without DPDK \(libdpdk-dev not found at build time\)$"):
        Server(port=0, arch="dpdk", dpdk_iface="veth0").start()


def test_udp_bench_rejects_what_it_cannot_do():
    from kvstore import bench
    from kvstore.errors import ConfigError as CE
    with pytest.raises(CE, match=r"value size: expected 1..1400 bytes over UDP"):
        bench.run(port=9, udp=True, requests=1, value_size=2000)
    with pytest.raises(CE, match=r"password: the UDP path has no AUTH"):
        bench.run(port=9, udp=True, requests=1, password="x")


def test_cli_serve_dpdk_durability_error():
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", "serve", "--arch", "dpdk", "--dpdk-iface", "veth0",
                        "--durability", "disk", "--port", "0"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "arch dpdk: durability disk is not supported" in r.stderr
