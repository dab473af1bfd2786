"""KV servers for the block device's network backends (tests/integration/test_nbd_backends*.py):
redis-server, memcached or a kvstore node on a port picked once, so that a test can kill one
and start it again where the backend reconnects."""
import os
import shutil
import signal
import socket
import tempfile

from kvstore import Node
from kvstore.process import Process

from helpers.servers import free_port, need


class KVServer:
    """redis-server, memcached or a kvstore node on a fixed port, so that it can be
    killed and started again where the backend reconnects."""

    def __init__(self, kind, *, password=None, durability="none"):
        self.kind, self.password, self.durability = kind, password, durability
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix=f"nbd-{kind}-")
        self.proc = self.node = None

    @property
    def url(self):
        auth = f":{self.password}@" if self.password else ""
        return f"{self.kind}://{auth}127.0.0.1:{self.port}"

    @property
    def pid(self):
        return self.node.pid if self.node else self.proc.pid

    def start(self):
        if self.kind == "kvstore":
            settings = {"requirepass": self.password} if self.password else {}
            self.node = Node(port=self.port, data_dir=self.dir, durability=self.durability, threads=1,
                             **settings).start(timeout=60)
            return self
        if self.kind == "redis":
            need("redis-server")
            argv = ["redis-server", "--port", self.port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                    "--dir", self.dir, "--daemonize", "no", "--logfile", ""]
            if self.password:
                argv += ["--requirepass", self.password]
        else:
            need("memcached")
            argv = ["memcached", "-p", self.port, "-U", "0", "-l", "127.0.0.1", "-t", "1", "-M", "-m", "1024"]
            if os.geteuid() == 0:
                argv += ["-u", "root"]
        self.proc = Process(argv, port=self.port, log_path=os.path.join(self.dir, "server.log")).start(15)
        return self

    def stop(self, sig=signal.SIGTERM):
        if self.node:
            self.node.stop(timeout=30, sig=sig)
            self.node = None
        if self.proc:
            self.proc.stop(timeout=10, sig=sig)
            self.proc = None

    def set_raw(self, key, value):
        """Store value under key with a plain client (a value the backend did not write)."""
        with socket.create_connection(("127.0.0.1", self.port), 10) as s:
            if self.kind == "memcached":
                s.sendall(b"ms %s %d\r\n%s\r\n" % (key, len(value), value))
            else:
                auth = b"AUTH %s\r\n" % self.password.encode() if self.password else b""
                s.sendall(auth + b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, len(value), value))
            want = b"HD\r\n" if self.kind == "memcached" else b"+OK\r\n" * (2 if self.password else 1)
            got = b""
            while len(got) < len(want):
                got += s.recv(100)
            assert got == want, got

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
