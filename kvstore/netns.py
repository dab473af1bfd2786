"""Test hosts in network namespaces: a namespace joined to this host by a veth pair,
both ends addressed in 198.18.0.0/15 (the benchmarking range, RFC 2544), so that
traffic between kvstore nodes crosses a (virtual) network instead of loopback.
Driven with iproute2's `ip` command (one short process per step; a netlink library
that forks into the namespace from a threaded process can hang in the child). Needs
root (CAP_NET_ADMIN).

    with netns.TestHost("kvpeer", index=0) as host:     # host.addr, host.local_addr
        node = Node(netns=host.name, bind=host.addr, ...)
"""
import json
import os
import shutil
import subprocess


def available():
    """(True, "") if namespaces can be made here, else (False, why)."""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    if shutil.which("ip") is None:
        return False, "the ip command (iproute2) is not installed"
    return True, ""


def _ip(*args, check=True):
    """Run `ip ARGS`; its stdout. Raises OSError with ip's own message on failure."""
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise OSError(f"ip {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


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
        self._close()  # a leftover of a killed run
        _ip("netns", "add", self.name)
        self._up = True
        try:
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", self.name)
            _ip("addr", "add", f"{self.local_addr}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("-n", self.name, "addr", "add", f"{self.addr}/30", "dev", self.ns_if)
            _ip("-n", self.name, "link", "set", self.ns_if, "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
        except BaseException:
            self._close()
            raise
        return self

    def close(self):
        self._close()

    def _where(self, inside):
        return (["-n", self.name], self.ns_if) if inside else ([], self.host_if)

    def mac(self, inside=False):
        """MAC address of this side's veth end (or of the namespace's, inside=True)."""
        ns, ifname = self._where(inside)
        return json.loads(_ip(*ns, "-j", "link", "show", "dev", ifname))[0]["address"]

    def set_neighbour(self, addr, lladdr, inside=True):
        """Static (permanent) neighbour entry addr -> lladdr on the namespace's veth end (or
        this side's): needed towards a kernel-bypass peer, which does not answer ARP."""
        ns, ifname = self._where(inside)
        _ip(*ns, "neigh", "replace", addr, "lladdr", lladdr, "dev", ifname, "nud", "permanent")

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

    def napi_thread(self, cpu):
        """Move the namespace's veth end's receive processing (its NAPI instance, which exists
        while an XDP program is attached to it) out of softirq into a kernel thread of its own,
        pinned to CPU cpu: everything the namespace's side does with what arrives (XDP, the
        network stack) then runs on that CPU, whoever sent it. Again after each attach (a
        detach deletes the thread). Returns the threads' pids. Raises OSError on failure."""
        r = self.run("sh", "-c", f"echo 1 > /sys/class/net/{self.ns_if}/threaded", capture_output=True, text=True)
        if r.returncode != 0:
            raise OSError(f"threaded NAPI on {self.ns_if}: {r.stderr.strip()} (is an XDP program attached?)")
        pids = []
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
            except (OSError, ValueError):
                continue
            if pid.isdigit() and comm.startswith(f"napi/{self.ns_if}-"):
                os.sched_setaffinity(int(pid), {cpu})
                pids.append(int(pid))
        if not pids:
            raise OSError(f"threaded NAPI on {self.ns_if}: no kernel thread napi/{self.ns_if}-* appeared")
        return pids

    def exec_prefix(self):
        """Prefix for a command run inside the namespace (ip netns exec keeps the pid)."""
        return ["ip", "netns", "exec", self.name]

    def run(self, *cmd, **kw):
        return subprocess.run(self.exec_prefix() + list(cmd), **kw)

    def _close(self):
        if self.name in _ip("netns", "list").split():
            _ip("netns", "del", self.name)
        # The host side, if the namespace was already gone (deleting it takes the pair).
        if _ip("link", "show", "dev", self.host_if, check=False):
            _ip("link", "del", self.host_if, check=False)
        self._up = False


class XdpProgram:
    """One of the pull cache's XDP programs (ext/bpf/pullcache.bpf.c) attached to interface
    ifname of this process's namespace until close() (or the process's end: a BPF link):
    "pass" for the client's end of a veth pair (a veth delivers frames its peer sends back
    with XDP_TX only when its own receive side runs XDP), or "pull_bounce", the pull
    experiment's yardstick (pulls to port sent back at bounce_len bytes of payload;
    "pull_bounce_copy" writes those bytes too). Needs
    root and a build with the programs (clang, libbpf-dev): OSError otherwise."""

    def __init__(self, ifname, program="pass", port=0, bounce_len=0):
        from kvstore._ext import ffi, lib
        self._lib = lib
        err = ffi.new("char[256]")
        self._p = lib.pc_prog_attach(ifname.encode(), program.encode(), port, bounce_len, err, 256)
        if self._p == ffi.NULL:
            raise OSError(f"XDP {program} on {ifname}: {ffi.string(err).decode()}")
        self._null = ffi.NULL

    def bounced(self):
        """Pulls pull_bounce (pull_bounce_copy) sent back so far."""
        return self._lib.pc_prog_bounced(self._p)

    def close(self):
        if self._p != self._null:
            self._lib.pc_prog_detach(self._p)
            self._p = self._null

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
