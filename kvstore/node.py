"""kvstore.Node: a kvstore server process started, watched and stopped from Python."""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from kvstore.client import Client
from kvstore.errors import ServerError

_READY = re.compile(rb"listening on ([0-9.]+):(\d+)")
_UDP = re.compile(rb"udp port (\d+)")


class Node:
    """Run `kvstore serve` as a child process.

    >>> with Node(port=0) as n:          # 0: any free port
    ...     n.client().set("k", "v")
    Settings are `kvstore serve` options with underscores (max_memory="64mb", threads=2, ...).
    """

    def __init__(self, bind="127.0.0.1", port=0, data_dir=None, log_path=None, netns=None, **settings):
        self.bind = bind
        self.netns = netns  # run inside this network namespace (kvstore.netns.TestHost.name)
        self.requested_port = port
        self.port = None
        self.udp_port = None  # arch udp/dpdk: the UDP front end's port, learnt at start
        self.data_dir = data_dir
        self.settings = settings
        self.log_path = log_path
        self.proc = None
        self._log = None

    def command(self):
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        args = prefix + [sys.executable, "-m", "kvstore.cli", "serve", "--bind", self.bind,
                "--port", str(self.requested_port)]
        if self.data_dir:
            args += ["--data-dir", str(self.data_dir)]
        for k, v in self.settings.items():
            if v is None:
                continue
            flag = "--" + k.replace("_", "-")
            if isinstance(v, bool):  # on/off switches: --data-file / --no-data-file
                args.append(flag if v else "--no-" + k.replace("_", "-"))
            else:
                args += [flag, str(v)]
        return args

    def start(self, timeout=15.0):
        """Start the server and wait until it listens."""
        return self.launch().wait_ready(timeout)

    def launch(self):
        """Start the server process without waiting (see wait_ready): nodes that need each
        other at start, like a remote-durability pair comparing logs, start together."""
        if self.proc:
            return self
        self.port = None  # learnt anew from this run's ready line
        if self.data_dir is None:
            self.data_dir = tempfile.mkdtemp(prefix="kvstore-node-")
        os.makedirs(self.data_dir, exist_ok=True)
        self.log_path = self.log_path or os.path.join(self.data_dir, "server.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=self._log)
        return self

    def wait_ready(self, timeout=15.0):
        if self.port is not None:
            return self
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = _READY.search(line)
            if m:
                self.port = int(m.group(2))
                u = _UDP.search(line)
                self.udp_port = int(u.group(1)) if u else None
                break
        if self.port is None:
            self.stop()
            raise ServerError(f"kvstore serve did not start: {self.log()[-2000:].strip() or line!r}")
        return self

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def client(self, **kwargs):
        return Client(host=self.bind, port=self.port, **kwargs)

    def health(self, timeout=1.0):
        """True if the process runs and answers PING."""
        if not self.proc or self.proc.poll() is not None:
            return False
        try:
            with self.client(socket_timeout=timeout, password=self.settings.get("requirepass")) as c:
                return c.ping()
        except Exception:
            return False

    def stats(self):
        with self.client(password=self.settings.get("requirepass")) as c:
            return c.kvstore_stats()

    def stop(self, timeout=10.0, sig=signal.SIGTERM):
        """Stop the server (SIGTERM, then SIGKILL after timeout). Returns its exit code."""
        if not self.proc:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode
        if self.proc.stdout:
            self.proc.stdout.close()
        if self._log:
            self._log.close()
        self.proc = None
        return rc

    def kill(self):
        """SIGKILL, as a crash would."""
        return self.stop(timeout=5.0, sig=signal.SIGKILL)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
