"""kvstore.process.Process and Node on top of it: ready line or port probe under a real
deadline, SIGTERM then SIGKILL, exit codes, the log file. Real child processes (python,
redis-server, kvstore serve); nothing mocked."""
import os
import shutil
import signal
import socket
import sys
import tempfile
import time

import pytest

from kvstore import Node, ServerError
from kvstore.process import Process

pytestmark = pytest.mark.timeout(60)

PY = sys.executable


def child(code):
    return [PY, "-c", code]


SILENT = child("import time; time.sleep(60)")  # hangs without printing a line
IGNORES_TERM = child("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                     "print('ready on 4242', flush=True); sys.stderr.write('err line\\n'); sys.stderr.flush(); "
                     "time.sleep(60)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(20)
def test_silent_child_cannot_outlast_the_deadline(tmp_path):
    p = Process(SILENT, ready_line=rb"listening", log_path=tmp_path / "log", name="silent")
    t0 = time.monotonic()
    with pytest.raises(ServerError, match=r"silent did not start \(no ready line within 1 s"):
        p.start(timeout=1)
    assert time.monotonic() - t0 < 8  # 1 s deadline + SIGTERM; far below the child's 60 s
    assert p.proc is None and p.returncode == -signal.SIGTERM


@pytest.mark.timeout(20)
def test_node_start_timeout_enforced_against_a_silent_child(tmp_path):
    """Node.start(timeout=...) used to block in readline() on a child that printed nothing."""
    class Silent(Node):
        def command(self):
            return SILENT

    n = Silent(data_dir=tmp_path)
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="did not start"):
        n.start(timeout=1)
    assert time.monotonic() - t0 < 8
    assert n.proc is None


def test_ready_line_match_and_log(tmp_path):
    p = Process(IGNORES_TERM, ready_line=rb"ready on (\d+)", log_path=tmp_path / "log")
    with p:
        assert p.running and p.match.group(1) == b"4242"
        deadline = time.monotonic() + 30
        while "err line" not in p.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "err line" in p.log()  # stderr goes to the log file
        assert "ready on" not in p.log()  # stdout does not
        p.stop(timeout=0.5)  # it ignores SIGTERM: SIGKILL follows


def test_sigterm_then_sigkill(tmp_path):
    p = Process(IGNORES_TERM, ready_line=rb"ready on", log_path=tmp_path / "log").start(timeout=10)
    t0 = time.monotonic()
    assert p.stop(timeout=1) == -signal.SIGKILL
    assert 0.9 < time.monotonic() - t0 < 8  # waited for SIGTERM first
    assert p.proc is None and p.returncode == -signal.SIGKILL
    assert p.stop() is None  # stopped already


def test_clean_exit_code_on_sigterm(tmp_path):
    code = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); "
            "print('up', flush=True); time.sleep(60)")
    p = Process(child(code), ready_line=rb"^up$", log_path=tmp_path / "log").start(timeout=10)
    assert p.stop(timeout=10) == 7


def test_child_exiting_before_ready_is_reported_with_its_log(tmp_path):
    code = "import sys; sys.stderr.write('cannot bind: no way\\n'); sys.exit(3)"
    p = Process(child(code), ready_line=rb"listening", log_path=tmp_path / "log", name="quitter")
    with pytest.raises(ServerError, match=r"quitter did not start \(it exited, exit code 3\): cannot bind: no way"):
        p.start(timeout=10)


def test_chatty_child_does_not_block_after_ready(tmp_path):
    """After the ready line the child's stdout is drained: 4 MB printed must not fill the pipe."""
    code = ("import sys, time; print('go', flush=True); sys.stdout.write('x' * (4 << 20)); sys.stdout.flush(); "
            "sys.stderr.write('done\\n'); sys.stderr.flush(); time.sleep(60)")
    with Process(child(code), ready_line=rb"go", log_path=tmp_path / "log") as p:
        deadline = time.monotonic() + 20
        while "done" not in p.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "done" in p.log()


def test_missing_binary(tmp_path):
    with pytest.raises(ServerError, match="cannot start nope: no-such-binary-kvstore"):
        Process(["no-such-binary-kvstore"], port=1, name="nope", log_path=tmp_path / "log").start(timeout=1)


def test_needs_one_readiness_test():
    with pytest.raises(ValueError):
        Process(SILENT)
    with pytest.raises(ValueError):
        Process(SILENT, ready_line=b"x", port=1)


@pytest.fixture
def redis_binary():
    path = shutil.which("redis-server")
    if path is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    return path


def test_port_probe_with_redis_server(redis_binary):
    import redis

    d = tempfile.mkdtemp(prefix="kv-proc-redis-")
    try:
        port = free_port()
        p = Process([redis_binary, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                     "--dir", d], port=port, log_path=os.path.join(d, "redis.log"))
        with p:
            with redis.Redis(port=port, socket_timeout=5) as c:
                assert c.ping() and c.set("k", "v") and c.get("k") == b"v"
            assert "Ready to accept connections" in p.log()  # port mode: stdout goes to the log too
        assert p.returncode == 0  # redis-server exits 0 on SIGTERM
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.timeout(20)
def test_port_probe_deadline_on_a_silent_child(tmp_path):
    p = Process(SILENT, port=free_port(), log_path=tmp_path / "log", name="deaf")
    t0 = time.monotonic()
    with pytest.raises(ServerError, match=r"deaf did not start \(nothing accepted on 127\.0\.0\.1:\d+ within 1 s"):
        p.start(timeout=1)
    assert time.monotonic() - t0 < 8


def test_node_on_process(tmp_path):
    with Node(data_dir=tmp_path, threads=1) as n:
        assert n.proc.poll() is None and n.port
        assert n.client().ping()
        assert "listening" not in n.log()
    assert n.proc is None
