"""`kvstore blockdev serve` as a process: the ready lines scripts wait for, a clean stop on
SIGTERM, and start-up failures that say what is wrong (exit 1, nothing left running)."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from helpers.blockdev import READY, SYSTEM_PATH, Backend, Device, have_our_server, nbdsh
from helpers.servers import PASSWORD
from kvstore.process import Process

pytestmark = pytest.mark.timeout(120)

SERVE = [sys.executable, "-m", "kvstore.cli", "blockdev", "serve"]


@pytest.fixture(autouse=True)
def _built():
    if not have_our_server():
        pytest.skip("this tree has no C NBD server yet (ext/frontend/nbd.c)")


def refuse(*args):
    """Run serve with args, expecting a refusal: its stderr."""
    r = subprocess.run(SERVE + [str(a) for a in args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "listening on" not in r.stdout
    return r.stderr


def test_ready_lines_for_both_listeners_and_clean_sigterm(tmp_path):
    sock = str(tmp_path / "nbd.sock")
    dev = Device("kvstore", "8M", "--unix", sock, "--listen", "127.0.0.1:0", "--durability", "none", "--port", 0,
                 "--data-dir", tmp_path / "data", "--export", "disk1", export="disk1", workdir=str(tmp_path))
    dev.start()
    try:
        assert dev.uri.startswith("nbd://127.0.0.1:") and dev.uri.endswith("/disk1")
        nbdsh(dev.uri, "h.pwrite(b'x' * 4096, 0)")
        unix = f"nbd+unix:///disk1?socket={sock}"
        assert nbdsh(unix, "print(bytes(h.pread(1, 0)))").strip() == "b'x'"  # the same device on both
    finally:
        rc = dev.stop()
    assert rc == 0, dev.log()[-2000:]
    assert "block device stopped" in open(os.path.join(tmp_path, "kvstore.log")).read()
    assert not os.path.exists(sock) or not _accepts(sock)


def _accepts(path):
    with socket.socket(socket.AF_UNIX) as s:
        return s.connect_ex(path) == 0


def test_unreachable_backend_is_refused_at_start():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = refuse("--size", "1G", "--listen", "127.0.0.1:0", "--backend", f"redis://127.0.0.1:{port}")
    assert f"Error: cannot connect to redis://127.0.0.1:{port}" in err


def test_wrong_password_is_refused_and_not_shown(tmp_path):
    node = Backend("kvstore", requirepass=PASSWORD).start()
    try:
        err = refuse("--size", "1G", "--listen", "127.0.0.1:0", "--backend",
                     f"kvstore://:wrong-pw@127.0.0.1:{node.port}")
        assert "Error: " in err and "wrong-pw" not in err
        assert "AUTH" in err or "password" in err.lower(), err
    finally:
        node.stop()


def test_nbd_port_in_use_is_refused(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        err = refuse("--size", "1G", "--listen", f"127.0.0.1:{port}", "--durability", "none", "--port", 0,
                     "--data-dir", tmp_path / "data")
    assert f"127.0.0.1:{port}" in err and "in use" in err.lower(), err


def test_sigint_stops_it_too(tmp_path):
    dev = Device("kvstore", "8M", "--durability", "none", "--port", 0, "--data-dir", tmp_path / "data",
                 workdir=str(tmp_path)).start()
    rc = dev.proc.stop(timeout=30, sig=signal.SIGINT)
    dev.proc = None
    assert rc == 0


def test_settings_from_the_toml_file_and_the_command_line(tmp_path):
    """[blockdev] and [server] tables of one file; an option given on the command line wins."""
    conf = tmp_path / "kv.toml"
    conf.write_text(f'[server]\ndurability = "none"\nport = 0\ndata_dir = "{tmp_path / "data"}"\n\n'
                    '[blockdev]\nsize = "24M"\nexport = "fromfile"\nblock_size = 8192\nread_only = true\n'
                    'listen = "127.0.0.1:0"\n')
    p = Process(SERVE + ["-c", str(conf), "--size", "12M"], ready_line=READY, name="kvstore blockdev",
                log_path=str(tmp_path / "serve.log")).start(60)
    try:
        uri = p.match.group(1).decode()
        assert uri.startswith("nbd://127.0.0.1:") and uri.endswith("/fromfile")
        out = nbdsh(uri, "print(h.get_size(), h.is_read_only(), h.get_block_size(nbd.SIZE_PREFERRED))")
        assert out.split() == [str(12 << 20), "True", "8192"]
    finally:
        assert p.stop(timeout=30) == 0


def test_max_connections_closes_the_one_past_it(tmp_path):
    dev = Device("kvstore", "8M", "--max-connections", 1, "--durability", "none", "--port", 0, "--data-dir",
                 tmp_path / "data", workdir=str(tmp_path)).start()
    try:
        out = nbdsh(dev.uri, "\n".join([
            "h2 = nbd.NBD()",
            "try:",
            "    h2.connect_uri(" + repr(dev.uri) + ")",
            "    h2.pread(512, 0)",
            "    print('second served')",
            "except nbd.Error:",
            "    print('second refused')",
            "print(len(h.pread(512, 0)))",  # the first one goes on
        ]))
        assert out.split() == ["second", "refused", "512"], out
    finally:
        dev.stop()


@pytest.mark.parametrize("threads, conns", [(1, 1), (2, 3)])
def test_threads_times_connections_per_thread_reach_the_backend(tmp_path, threads, conns):
    """One connection per NBD thread and per --connections-per-thread, opened at start."""
    from helpers.conn import client
    redis = Backend("redis").start()
    dev = Device("kvstore", "8M", "--backend", redis.url, "--threads", threads, "--connections-per-thread", conns,
                 workdir=str(tmp_path))
    try:
        dev.start()
        with client(redis.port) as c:
            assert c.info("clients")["connected_clients"] - 1 == threads * conns  # - this one
    finally:
        dev.stop()
        redis.stop()


def _cpu_seconds(pid):
    """User + system CPU time of a process so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_busy_poll_stops_when_it_does_not_pay(tmp_path):
    """With the longest window (1 ms), a client slower than the window (a request every ~1.2 ms)
    makes the workers give up polling after a few empty windows: the server's CPU stays well
    below the one core that polling through every gap would take; and with the client connected
    but idle the server takes (almost) no CPU."""
    dev = Device("kvstore", "8M", "--busy-poll-us", 1000, "--threads", 1, "--durability", "none", "--port", 0,
                 "--data-dir", tmp_path / "data", workdir=str(tmp_path)).start()
    code = "\n".join([
        "import sys, time",
        "def cpu():",
        f"    f = open('/proc/{dev.proc.pid}/stat').read().rpartition(')')[2].split()",
        "    return time.monotonic(), (int(f[11]) + int(f[12])) / os.sysconf('SC_CLK_TCK')",
        "import os",
        "w0, c0 = cpu()",
        "for i in range(2000):",
        "    h.pwrite(i.to_bytes(4, 'little') * 1024, (i % 2048) * 4096)",
        "    time.sleep(0.0012)",
        "w1, c1 = cpu()",
        "print(int.from_bytes(h.pread(4, 1999 * 4096), 'little'), c1 - c0, w1 - w0, flush=True)",
        "sys.stdin.readline()",  # idle, connected, until the test has measured
        "print(len(h.pread(4096, 0)))",
    ])
    client = subprocess.Popen(["nbdsh", "-u", dev.uri, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PATH=SYSTEM_PATH))
    try:
        last, paced_cpu, paced_wall = client.stdout.readline().split()
        assert last == "1999"
        assert float(paced_cpu) < 0.5 * float(paced_wall), \
            f"the server took {paced_cpu} s of CPU in {paced_wall} s of requests slower than its window"
        time.sleep(0.2)
        before = _cpu_seconds(dev.proc.pid)
        time.sleep(3)
        idle = _cpu_seconds(dev.proc.pid) - before
        out, _ = client.communicate("go\n", timeout=60)
        assert out.split() == ["4096"] and client.returncode == 0, out
        assert idle < 0.3, f"the server took {idle:.2f} s of CPU in 3 s while its client was idle"
    finally:
        client.kill()
        dev.stop()


@pytest.mark.parametrize("prefix", [None, "disk7:"])
def test_block_keys_are_prefix_and_block_number(tmp_path, prefix):
    """Block n is the key PREFIX + n (default nbd:EXPORT:), its value the block's bytes; a block
    written with zeros is no key."""
    from helpers.conn import client
    redis = Backend("redis").start()
    dev = Device("kvstore", "8M", "--backend", redis.url, *(["--key-prefix", prefix] if prefix else []),
                 workdir=str(tmp_path))
    try:
        dev.start()
        nbdsh(dev.uri, "h.pwrite(b'a' * 4096 + b'b' * 100, 5 * 4096); h.pwrite(bytes(4096), 9 * 4096)")
        with client(redis.port, decode_responses=False) as c:
            p = (prefix or "nbd:kvstore:").encode()
            assert sorted(c.keys()) == [p + b"5", p + b"6", p + b"meta"]
            assert c.get(p + b"meta") == b"kvstore-blockdev size=8388608 block_size=4096"
            assert c.get(p + b"5") == b"a" * 4096 and c.get(p + b"6") == b"b" * 100 + bytes(3996)
    finally:
        dev.stop()
        redis.stop()


def test_a_device_served_again_keeps_its_block_size_and_may_only_grow(tmp_path):
    """The device's record (PREFIX meta) is kept with its blocks, in the data directory: served
    again with another block size, or smaller, the device is refused with what the store holds
    (nothing written); larger, it grows and its data stays."""
    data = tmp_path / "data"
    dev = Device("kvstore", "8M", "--durability", "disk", "--data-dir", data, workdir=str(tmp_path))
    try:
        dev.start()
        nbdsh(dev.uri, "h.pwrite(b'k' * 4096, 7 * 4096); h.flush()")
    finally:
        dev.stop()
    base = ["--listen", "127.0.0.1:0", "--durability", "disk", "--data-dir", data]
    err = refuse("--size", "4M", *base)
    assert "the store holds a block device of 8388608 bytes in 4096-byte blocks" in err, err
    assert "past the new end would be out of reach" in err and "--size 8388608 --block-size 4096" in err
    err = refuse("--size", "8M", "--block-size", "512", *base)
    assert "in 512-byte blocks, its blocks would read garbled" in err, err
    dev = Device("kvstore", "16M", "--durability", "disk", "--data-dir", data, workdir=str(tmp_path))
    try:
        dev.start()
        assert nbdsh(dev.uri, "print(h.get_size(), h.pread(4096, 7 * 4096) == b'k' * 4096)").split() == \
            ["16777216", "True"]
    finally:
        dev.stop()
    err = refuse("--size", "8M", *base)  # the record says 16M now
    assert "a block device of 16777216 bytes" in err, err
