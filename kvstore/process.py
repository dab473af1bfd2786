"""kvstore.process.Process: a server process started for a test or a measurement and stopped
after it. Readiness is a line on the child's stdout (a regex) or a TCP port that accepts,
always under a real deadline: the stdout pipe is polled, never read with a blocking call, so
a child that hangs without printing cannot stall the caller. Used from one thread."""
import os
import re
import selectors
import signal
import socket
import subprocess
import tempfile
import threading
import time

from kvstore.errors import ServerError


class Process:
    """Run argv as a child process; start() returns once it is ready.

    ready_line: a regex (bytes or str pattern) that a line of the child's stdout must match
        (then .match holds the re.Match, e.g. for a port the child prints);
    port: or a TCP port on host that must accept a connection (the child's stdout then goes
        to the log file too);
    netns: run inside this network namespace (`ip netns exec NS argv...`; needs root);
    log_path: the file that keeps the child's stderr (default: a new temporary file);
    name: how messages call the process (default: argv[0]); env, cwd: as subprocess.Popen.

    With ready_line, what the child prints on stdout after the ready line is read and
    dropped (so that a chatty child never blocks on a full pipe)."""

    def __init__(self, argv, *, ready_line=None, port=None, host="127.0.0.1", netns=None, log_path=None,
                 name=None, env=None, cwd=None):
        if (ready_line is None) == (port is None):
            raise ValueError("give exactly one of ready_line (a regex for stdout) or port (a TCP port to probe)")
        self.argv = [str(a) for a in argv]
        if isinstance(ready_line, str):
            ready_line = ready_line.encode()
        self.ready_line = re.compile(ready_line) if isinstance(ready_line, bytes) else ready_line
        self.port, self.host, self.netns = port, host, netns
        self.log_path = log_path
        self.name = name or os.path.basename(self.argv[0])
        self.env, self.cwd = env, cwd
        self.proc = None  # the subprocess.Popen while running (None once stopped)
        self.match = None  # ready_line's match in the current run
        self.returncode = None  # exit code of the last run, once stopped
        self.ready = False
        self._log = None
        self._drain = None

    def command(self):
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        return prefix + self.argv

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout=15.0):
        """launch() and wait_ready(timeout). Returns self."""
        return self.launch().wait_ready(timeout)

    def launch(self):
        """Start the child without waiting for it to be ready (see wait_ready): processes that
        need each other at start can be launched together. Returns self."""
        if self.proc is not None:
            return self
        if self.log_path is None:
            fd, self.log_path = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")
            os.close(fd)
        self._log = open(self.log_path, "wb")
        self.match = None
        self.returncode = None
        self.ready = False
        stdout = subprocess.PIPE if self.ready_line is not None else self._log
        try:
            # stdin from /dev/null: a server never reads ours, and some (nbdkit) refuse to
            # start when it is closed, as it is under some CI runners
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=stdout, stderr=self._log,
                                         env=self.env, cwd=self.cwd)
        except OSError as e:
            self._log.close()
            raise ServerError(f"cannot start {self.name}: {self.command()[0]}: {e.strerror}", e.errno) from None
        return self

    def wait_ready(self, timeout=15.0):
        """Wait until the child is ready, at most timeout seconds. If it exits first or the
        deadline passes, stop it and raise ServerError with the end of its log."""
        if self.ready:
            return self
        wait = self._wait_line if self.ready_line is not None else self._wait_port
        why = wait(time.monotonic() + timeout, f"{timeout:g} s")
        if why is None:
            self.ready = True
            return self
        rc = self.stop(timeout=5.0)
        tail = self.log()[-2000:].strip()
        raise ServerError(f"{self.name} did not start ({why}" + (f", exit code {rc}" if rc is not None else "")
                          + ")" + (f": {tail}" if tail else ""))

    def _wait_line(self, deadline, within):
        """None once a stdout line matches ready_line, else why not."""
        fd = self.proc.stdout.fileno()
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return f"no ready line within {within}"
                if not sel.select(left):
                    continue
                chunk = os.read(fd, 65536)  # ready: returns at once
                if not chunk:
                    try:
                        self.proc.wait(1)
                        return "it exited"
                    except subprocess.TimeoutExpired:
                        return "it closed its stdout"
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    m = self.ready_line.search(line)
                    if m:
                        self.match = m
                        self._drain = threading.Thread(target=self._drop_stdout, name=f"{self.name}-stdout",
                                                       daemon=True)
                        self._drain.start()
                        return None

    def _drop_stdout(self):
        f = self.proc.stdout  # this thread owns it from now on, and closes it
        try:
            while f.read1(65536):
                pass
        except (OSError, ValueError):
            pass
        finally:
            f.close()

    def _wait_port(self, deadline, within):
        """None once host:port accepts a connection, else why not."""
        while True:
            if self.proc.poll() is not None:
                return "it exited"
            left = deadline - time.monotonic()
            if left <= 0:
                return f"nothing accepted on {self.host}:{self.port} within {within}"
            try:
                with socket.create_connection((self.host, self.port), timeout=min(left, 0.5)):
                    return None
            except OSError:
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def log(self):
        """The log file's text (the child's stderr; with port, its stdout too)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except (OSError, TypeError):
            return ""

    def stop(self, timeout=10.0, sig=signal.SIGTERM):
        """Send sig (SIGTERM), wait up to timeout seconds, then SIGKILL. Returns the exit code
        (negative: the signal that ended it), or None if nothing was started."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.returncode = self.proc.returncode
        if self._drain is not None:
            self._drain.join(1.0)  # EOF once the child is gone (unless a grandchild holds stdout)
            self._drain = None
        elif self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
        self.proc = None
        self.ready = False
        return self.returncode

    def kill(self):
        """SIGKILL, as a crash would. Returns the exit code."""
        return self.stop(timeout=5.0, sig=signal.SIGKILL)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
