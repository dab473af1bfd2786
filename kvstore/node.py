"""kvstore.Node: a kvstore server process started, watched and stopped from Python."""
import os
import re
import signal
import sys
import tempfile

from kvstore.client import Client
from kvstore.errors import ServerError
from kvstore.process import Process

_READY = re.compile(rb"listening on ([0-9.]+):(\d+)")
_UDP = re.compile(rb"udp port (\d+)")
_TLS = re.compile(rb"tls port (\d+)")
_MQTT = re.compile(rb"mqtt port (\d+)")


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
        self.tls_port = None  # --tls-port: the TLS port, learnt at start
        self.mqtt_port = None  # --mqtt-port: the MQTT port, learnt at start
        self.data_dir = data_dir
        self.settings = settings
        self.log_path = log_path
        self._process = None

    def command(self):
        """argv of `kvstore serve` with this node's settings (run inside netns if set)."""
        args = [sys.executable, "-m", "kvstore.cli", "serve", "--bind", self.bind, "--port", str(self.requested_port)]
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
        """Start the server and wait until it listens (at most timeout seconds, then
        ServerError with the end of its log)."""
        return self.launch().wait_ready(timeout)

    def launch(self):
        """Start the server process without waiting (see wait_ready): nodes that need each
        other at start, like a remote-durability pair comparing logs, start together."""
        if self._process is not None:
            return self
        self.port = None  # learnt anew from this run's ready line
        if self.data_dir is None:
            self.data_dir = tempfile.mkdtemp(prefix="kvstore-node-")
        os.makedirs(self.data_dir, exist_ok=True)
        self.log_path = self.log_path or os.path.join(self.data_dir, "server.log")
        self._process = Process(self.command(), ready_line=_READY, netns=self.netns, log_path=self.log_path,
                                name="kvstore serve").launch()
        return self

    def wait_ready(self, timeout=15.0):
        if self.port is not None:
            return self
        try:
            self._process.wait_ready(timeout)
        except ServerError:
            self._process = None  # stopped by wait_ready
            raise
        m = self._process.match
        self.port = int(m.group(2))
        u = _UDP.search(m.string)
        self.udp_port = int(u.group(1)) if u else None
        t = _TLS.search(m.string)
        self.tls_port = int(t.group(1)) if t else None
        q = _MQTT.search(m.string)
        self.mqtt_port = int(q.group(1)) if q else None
        return self

    def log(self):
        """The server's stderr so far (kept in log_path, default <data_dir>/server.log)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except (OSError, TypeError):
            return ""

    @property
    def proc(self):
        """The subprocess.Popen of the running server, or None."""
        return self._process.proc if self._process else None

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
        if self._process is None:
            return None
        rc = self._process.stop(timeout, sig)
        self._process = None
        return rc

    def kill(self):
        """SIGKILL, as a crash would."""
        return self.stop(timeout=5.0, sig=signal.SIGKILL)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
