"""Servers under test and their surroundings: kvstore Nodes on a fresh data dir, a real
redis-server as the reference, free ports, the file-descriptor limit, a process's RSS and the
ports it listens on."""
import os
import resource
import shutil
import signal
import socket
import tempfile

import pytest

from kvstore import Node
from kvstore.cluster import etcd_command
from kvstore.errors import ServerError
from kvstore.process import Process

PASSWORD = "pw"


def free_port():
    """A TCP port that was free a moment ago (for servers that cannot bind port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_nofile(want):
    """Raise this process's RLIMIT_NOFILE soft limit to at least `want` if allowed.
    Children (servers started afterwards) inherit it. Returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def listening_ports(pid):
    """TCP ports the process pid listens on (its socket inodes matched in /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for row in f.readlines()[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def rss_bytes(pid):
    """Resident set size of a process, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class RedisServer:
    """A real redis-server on 127.0.0.1 (no files kept, one database); start() -> self."""

    def __init__(self, *extra):
        self.binary = shutil.which("redis-server")
        self.extra = list(extra)
        self.proc = None  # kvstore.process.Process while running
        self.port = None
        self.dir = None

    def start(self, timeout=15.0):
        self.dir = tempfile.mkdtemp(prefix="redis-ref-")
        why = None
        for _ in range(5):  # the free port may be taken in between: retry
            self.port = free_port()
            argv = [self.binary, "--port", self.port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                    "--databases", "1", "--dir", self.dir, "--daemonize", "no", "--logfile", ""] + self.extra
            self.proc = Process(argv, port=self.port, log_path=os.path.join(self.dir, "redis.log"),
                                name="redis-server")
            try:
                self.proc.start(timeout)
                return self
            except ServerError as e:
                why = e
        raise RuntimeError(f"redis-server did not start: {why}")

    def stop(self):
        if self.proc:
            self.proc.stop()
            self.proc = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def need(binary):
    """Skip the test when a tool it drives is not installed."""
    if shutil.which(binary) is None:
        pytest.skip(f"{binary} is not installed (make deps installs it: APT_PACKAGES in the Makefile)")


def start_node(**settings):
    """A started kvstore Node on port 0 and a fresh temporary data dir. Durability none unless
    the settings say otherwise: these servers check the protocol and the commands (no fsync per
    write, and --max-memory answers -OOM instead of waiting for a data file's flusher);
    `kvstore serve`'s own default is disk."""
    settings.setdefault("durability", "none")
    n = Node(port=0, data_dir=tempfile.mkdtemp(prefix="kvstore-test-"), **settings)
    n.start(timeout=60)  # (a loaded machine: only a failure waits this long)
    return n


def stop_node(n):
    """Stop a start_node() Node and remove its data dir; the server's exit code."""
    rc = n.stop(timeout=60)
    shutil.rmtree(n.data_dir, ignore_errors=True)
    return rc


class EtcdServer:
    """A real etcd (Debian's etcd-server) on 127.0.0.1, its data in a temporary directory;
    start() -> self, .url its client URL; run as `kvstore cluster up` runs its own (etcd_command)."""

    def __init__(self):
        self.proc = None
        self.dir = None
        self.url = None

    def start(self, timeout=30.0):
        self.dir = tempfile.mkdtemp(prefix="etcd-test-")
        why = None
        for _ in range(5):  # the free ports may be taken in between: retry
            client, peer = free_port(), free_port()
            self.url = f"http://127.0.0.1:{client}"
            argv = etcd_command("test", os.path.join(self.dir, "data"), self.url, f"http://127.0.0.1:{peer}")
            argv += ["--log-level", "warn"]
            self.proc = Process(argv, port=client, log_path=os.path.join(self.dir, "etcd.log"), name="etcd")
            try:
                self.proc.start(timeout)
                return self
            except ServerError as e:
                why = e
                shutil.rmtree(os.path.join(self.dir, "data"), ignore_errors=True)
        raise RuntimeError(f"etcd did not start: {why}")

    def pause(self):
        """SIGSTOP: etcd alive but answering nothing (a partition as its clients see it)."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self):
        if self.proc:
            self.resume()
            self.proc.stop()
            self.proc = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
