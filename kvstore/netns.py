"""Test hosts in network namespaces: a namespace joined to this host by a veth pair,
both ends addressed in 198.18.0.0/15 (the benchmarking range, RFC 2544), so that
traffic between kvstore nodes crosses a (virtual) network instead of loopback.
The only module that touches pyroute2. Needs root (CAP_NET_ADMIN).

    with netns.TestHost("kvpeer", index=0) as host:     # host.addr, host.local_addr
        node = Node(netns=host.name, bind=host.addr, ...)
"""
import concurrent.futures
import errno
import os
import subprocess


def _off_loop(fn):
    """Run fn in a thread of its own: pyroute2's synchronous API drives an asyncio loop,
    which fails inside a running one (a Jupyter kernel, an asyncio program)."""
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(fn).result()


def available():
    """(True, "") if namespaces can be made here, else (False, why)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        return False, "pyroute2 is not installed (pip install pyroute2)"
    return True, ""


class TestHost:
    """Namespace `name` with veth kv<index>h (this side, 198.18.<index>.1/30) and kv<index>n
    (inside, 198.18.<index>.2/30), both up, lo up inside. Removed on close: deleting the
    namespace deletes the pair."""

    def __init__(self, name, index=0):
        if not 0 <= index < 256:
            raise ValueError(f"index: expected 0..255, got {index}")
        self.name = name
        self.index = index
        self.local_addr = f"198.18.{index}.1"
        self.addr = f"198.18.{index}.2"
        self.host_if, self.ns_if = f"kv{index}h", f"kv{index}n"
        self._up = False

    def __enter__(self):
        return self.create()

    def __exit__(self, *exc):
        self.close()

    def create(self):
        return _off_loop(self._create)

    def close(self):
        _off_loop(self._close)

    def _create(self):
        from pyroute2 import IPRoute, NetNS, netns
        self._close()  # a leftover of a killed run
        netns.create(self.name)
        self._up = True
        try:
            with IPRoute() as ipr:
                ipr.link("add", ifname=self.host_if, kind="veth", peer=self.ns_if)
                peer = ipr.link_lookup(ifname=self.ns_if)[0]
                ipr.link("set", index=peer, net_ns_fd=self.name)
                mine = ipr.link_lookup(ifname=self.host_if)[0]
                ipr.addr("add", index=mine, address=self.local_addr, prefixlen=30)
                ipr.link("set", index=mine, state="up")
            with NetNS(self.name) as ns:
                idx = ns.link_lookup(ifname=self.ns_if)[0]
                ns.addr("add", index=idx, address=self.addr, prefixlen=30)
                ns.link("set", index=idx, state="up")
                ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
        except BaseException:
            self._close()
            raise
        return self

    def mac(self, inside=False):
        """MAC address of this side's veth end (or of the namespace's, inside=True)."""
        return _off_loop(lambda: self._mac(inside))

    def _mac(self, inside):
        from pyroute2 import IPRoute, NetNS
        with (NetNS(self.name) if inside else IPRoute()) as ipr:
            link = ipr.get_links(ifname=self.ns_if if inside else self.host_if)[0]
            return link.get_attr("IFLA_ADDRESS")

    def set_neighbour(self, addr, lladdr, inside=True):
        """Static (permanent) neighbour entry addr -> lladdr on the namespace's veth end (or
        this side's): needed towards a kernel-bypass peer, which does not answer ARP."""
        def go():
            from pyroute2 import IPRoute, NetNS
            with (NetNS(self.name) if inside else IPRoute()) as ipr:
                idx = ipr.link_lookup(ifname=self.ns_if if inside else self.host_if)[0]
                ipr.neigh("replace", dst=addr, lladdr=lladdr, ifindex=idx, state="permanent")
        _off_loop(go)

    def tx_checksum_offload_off(self):
        """`ethtool -K <if> tx off` on both veth ends. Frames a veth sends with TX checksum
        offload carry a partial checksum that an AF_XDP reader sees as is: a reply built from
        them (or any frame relayed by XDP) reaches the kernel with a bad UDP checksum and is
        dropped. Raises OSError if ethtool is missing or fails."""
        for cmd in (["ethtool", "-K", self.host_if, "tx", "off"],
                    self.exec_prefix() + ["ethtool", "-K", self.ns_if, "tx", "off"]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise OSError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")

    def exec_prefix(self):
        """Prefix for a command run inside the namespace (ip netns exec keeps the pid)."""
        return ["ip", "netns", "exec", self.name]

    def run(self, *cmd, **kw):
        return subprocess.run(self.exec_prefix() + list(cmd), **kw)

    def _close(self):
        from pyroute2 import IPRoute, netns
        if self.name in netns.listnetns():
            netns.remove(self.name)
        from pyroute2.netlink.exceptions import NetlinkError
        with IPRoute() as ipr:  # the host side, if the namespace was already gone
            for idx in ipr.link_lookup(ifname=self.host_if):
                try:
                    ipr.link("del", index=idx)
                except NetlinkError as e:
                    if e.code != errno.ENODEV:  # the namespace's removal took the pair meanwhile
                        raise
        self._up = False
