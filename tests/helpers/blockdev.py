"""Block devices under test (issue 15) and the real NBD clients that drive them.

  Device            - one NBD server process: ours (`kvstore blockdev serve`, any backend)
                      or nbdkit (memory or file plugin, the reference); .uri from its output
  Backend           - the KV server behind a network backend: a kvstore node, redis-server
                      or memcached, started and stopped here
  nbdsh(uri, code)  - run Python code in nbdsh (libnbd's shell, system Python) against uri
  run(*argv)        - a client command with a deadline; its output on failure
  fuse_loop(uri)    - context manager: the device as a loop block device (nbdfuse + losetup)
  sha256_file, random_image - test data

Every process has a deadline and is stopped by the test that started it (fixtures here
and in the test files). Only loopback addresses; every port the OS picks.
"""
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from helpers.servers import free_port, need, start_node, stop_node
from kvstore.process import Process

READY = re.compile(rb"kvstore blockdev listening on (nbds?(?:\+unix)?://\S+)")  # nbds: --tls require
MiB = 1 << 20


def have_our_server():
    """True once the tree has the C NBD server (ext/frontend/nbd.c): the tests of ours run
    (and fail if the build lacks it); before it landed (issue 15's server branch) they skip."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.exists(os.path.join(root, "ext", "frontend", "nbd.c"))


# nbdsh runs `python3` from PATH and needs the system's (python3-libnbd), not a venv's or pyenv's
SYSTEM_PATH = "/usr/bin:/bin:" + os.environ.get("PATH", "")


def run(*argv, timeout=120, check=True, input=None):
    """Run a client command (argv items str()ed) with a deadline; CompletedProcess (text).
    check: an exit code != 0 fails the test with the command's output."""
    argv = [str(a) for a in argv]
    need(argv[0])
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input,
                           env=dict(os.environ, PATH=SYSTEM_PATH))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(argv)}: no exit within {timeout} s; output: {e.stdout!r} {e.stderr!r}")
    if check and p.returncode != 0:
        pytest.fail(f"{' '.join(argv)}: exit {p.returncode}\nstdout: {p.stdout[-3000:]}\nstderr: {p.stderr[-3000:]}")
    return p


def nbdsh(uri, code, timeout=120, check=True):
    """Run code in nbdsh connected to uri (`h` is the handle; `nbd` the module); its stdout."""
    return run("nbdsh", "-u", uri, "-c", code, timeout=timeout, check=check).stdout


def sha256_file(path, length=None):
    h, left = hashlib.sha256(), length
    with open(path, "rb") as f:
        while left is None or left > 0:
            chunk = f.read(MiB if left is None else min(MiB, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


def random_image(path, size, seed=1):
    """A file of `size` bytes: random extents of random length (some unaligned) between runs
    of zeros left as holes (so nbdcopy sends zero/trim requests for them too)."""
    import random
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.truncate(size)
        pos = 0
        while pos < size:
            pos += rng.choice((0, 4096, 65536, 3 * MiB)) + rng.randrange(0, 4096)
            n = min(size - pos, rng.choice((512, 4096, 100_000, MiB, 2 * MiB)))
            if n > 0:
                f.seek(pos)
                f.write(rng.randbytes(n))
                pos += n
    return path


class Backend:
    """The KV server behind a network backend. kind: "kvstore" (a kvstore node, settings as
    kvstore serve's, e.g. durability="disk"), "redis" or "memcached". .url for --backend."""

    def __init__(self, kind, **settings):
        self.kind, self.settings = kind, settings
        self.node = self.proc = None
        self.port = None
        self.dir = None

    def start(self):
        if self.kind == "kvstore":
            if self.node is None:
                self.node = start_node(threads=1, **self.settings)
            else:  # restart on the same data dir and port (after kill())
                self.node.requested_port = self.port
                self.node.start(timeout=60)
            self.port = self.node.port
        else:
            need({"redis": "redis-server"}.get(self.kind, self.kind))
            self.port = self.port or free_port()
            self.dir = self.dir or tempfile.mkdtemp(prefix=f"blk-{self.kind}-")
            if self.kind == "redis":
                argv = ["redis-server", "--port", self.port, "--bind", "127.0.0.1", "--save", "", "--appendonly",
                        "no", "--dir", self.dir, "--daemonize", "no"]
            else:  # -M: refuse writes when full rather than evict blocks
                argv = ["memcached", "-p", self.port, "-U", "0", "-l", "127.0.0.1", "-t", "1", "-m", "1024", "-M"]
                argv += ["-u", "root"] if os.geteuid() == 0 else []
            self.proc = Process(argv, port=self.port, name=self.kind,
                                log_path=os.path.join(self.dir, "server.log")).start(30)
        return self

    @property
    def url(self):
        return f"{self.kind}://127.0.0.1:{self.port}"

    def kill(self):
        """SIGKILL, as a crash would (start() brings it back on the same port and data)."""
        if self.node is not None:
            self.node.kill()
        elif self.proc is not None:
            self.proc.kill()

    def stop(self):
        if self.node is not None:
            stop_node(self.node) if self.node.proc else shutil.rmtree(self.node.data_dir, ignore_errors=True)
            self.node = None
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class Device:
    """One NBD server process. kind: "nbdkit" (`nbdkit memory SIZE`, the reference),
    "nbdkit-file" (`nbdkit file PATH`: FLUSH = fdatasync, the durability reference) or
    "kvstore" (`kvstore blockdev serve`, args its options: --backend, --durability, ...; TCP on a
    free port unless args has --unix).
    start() -> self; .uri; kill() / start() again keeps the port and the files."""

    def __init__(self, kind, size, *args, workdir=None, export="kvstore"):
        self.kind, self.size, self.args, self.export = kind, size, [str(a) for a in args], export
        self.workdir = workdir or tempfile.mkdtemp(prefix="blk-dev-")
        self.port = None
        self.proc = None
        self.uri = None

    def _argv(self):
        if self.kind == "kvstore":
            tcp = [] if "--unix" in self.args else ["--listen", "127.0.0.1:0"]  # the port: from its line
            return [sys.executable, "-m", "kvstore.cli", "blockdev", "serve", "--size", self.size, *tcp,
                    "--export", self.export] + self.args
        need("nbdkit")
        plugin = ["memory", self.size] if self.kind == "nbdkit" else \
            ["file", os.path.join(self.workdir, "disk.img"), "cache=none"]
        flags = [a for a in self.args if a.startswith("-")]  # nbdkit's options; KEY=VALUE after the plugin
        params = [a for a in self.args if not a.startswith("-")]
        return ["nbdkit", "-f", "--exit-with-parent", "-i", "127.0.0.1", "-p", self.port, "-e", self.export,
                *flags, *plugin, *params]

    def start(self, timeout=60):
        if self.kind == "kvstore" and not have_our_server():
            pytest.skip("this tree has no C NBD server yet (ext/frontend/nbd.c: issue 15's server branch)")
        if self.kind == "nbdkit-file" and not os.path.exists(os.path.join(self.workdir, "disk.img")):
            with open(os.path.join(self.workdir, "disk.img"), "wb") as f:
                f.truncate(_bytes(self.size))
        self.port = self.port or free_port()
        log = os.path.join(self.workdir, f"{self.kind}.log")
        if self.kind == "kvstore":
            self.proc = Process(self._argv(), ready_line=READY, log_path=log, name="kvstore blockdev")
            self.proc.start(timeout)
            self.uri = self.proc.match.group(1).decode()
        else:
            self.proc = Process(self._argv(), port=self.port, log_path=log, name="nbdkit").start(timeout)
            self.uri = f"nbd://127.0.0.1:{self.port}/{self.export}"
        return self

    def log(self):
        return self.proc.log() if self.proc else ""

    def kill(self):
        if self.proc:
            self.proc.kill()
            self.proc = None

    def stop(self):
        """SIGTERM (then SIGKILL); the exit code."""
        rc = None
        if self.proc:
            rc = self.proc.stop(timeout=30)
            self.proc = None
        return rc

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _bytes(size):
    from kvstore.config import parse_disk_size
    return parse_disk_size(size)


@contextlib.contextmanager
def fuse_loop(uri, workdir, connections=1):
    """The NBD export as a block device: nbdfuse presents it as a file, losetup makes that a
    loop device (direct I/O: no second page cache). Yields /dev/loopN; detached and
    unmounted after. Needs root (CI runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("needs root for losetup (CI runs as root)")
    for tool in ("nbdfuse", "losetup", "fusermount3"):
        need(tool)
    mnt = os.path.join(workdir, "fuse")
    os.makedirs(mnt, exist_ok=True)
    pidfile = os.path.join(workdir, "nbdfuse.pid")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pidfile)
    errlog = open(os.path.join(workdir, "nbdfuse.log"), "wb")
    fuse = subprocess.Popen(["nbdfuse", "-C", str(connections), "-P", pidfile, os.path.join(mnt, "disk"), uri],
                            stdin=subprocess.DEVNULL, stdout=errlog, stderr=errlog)
    loop = None
    try:
        deadline = time.monotonic() + 30
        while not (os.path.exists(pidfile) and os.path.getsize(pidfile)):
            if fuse.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"nbdfuse did not mount {uri}: {open(errlog.name).read()[-2000:]}")
            time.sleep(0.05)
        loop = run("losetup", "--find", "--show", "--direct-io=on", os.path.join(mnt, "disk")).stdout.strip()
        yield loop
    finally:
        if loop:
            subprocess.run(["losetup", "-d", loop], capture_output=True, timeout=60)
        subprocess.run(["fusermount3", "-u", mnt], capture_output=True, timeout=60)
        try:
            fuse.wait(30)
        except subprocess.TimeoutExpired:
            fuse.kill()
            fuse.wait()
        errlog.close()


@contextlib.contextmanager
def mounted(dev, mountpoint):
    os.makedirs(mountpoint, exist_ok=True)
    run("mount", dev, mountpoint)
    try:
        yield mountpoint
    finally:
        if subprocess.run(["umount", mountpoint], capture_output=True, timeout=120).returncode:
            subprocess.run(["umount", "-l", mountpoint], capture_output=True, timeout=60)
