"""The server's log (ext/core/log.c, kvstore/log.py): real `kvstore serve` processes with
--log-file and --log-level; every line in Redis's format, each event an operator needs
producing its line (start/stop with the configuration, maxclients refusals, failed AUTH
rate-limited, replay progress and result after kill -9, peer lost/back/caught up, writers
stalled for memory), level filtering, and SIGHUP reopening the file after logrotate's rename."""
import os
import re
import signal
import socket
import subprocess
import sys

from kvstore import Node

from helpers.conn import Raw, client
from helpers.pair import Pair, wait_for
from helpers.servers import free_port

# <pid>:M 24 Nov 2026 10:00:00.123 * message  (Redis's serverLogRaw; . debug, - verbose, * notice, # warning)
LINE = re.compile(r"^(\d+):M (\d{2}) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) (\d{4}) "
                  r"(\d{2}):(\d{2}):(\d{2})\.(\d{3}) ([.\-*#]) (.+)$")
LEVEL_CHARS = {"debug": ".", "verbose": "-", "notice": "*", "warning": "#"}


def log_lines(path):
    """[(pid, level char, message)] of the log file; every line must be in the format."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        assert m, f"log line not in Redis's format: {line!r}\n--- whole log:\n{text}"
        out.append((int(m.group(1)), m.group(9), m.group(10)))
    return out


def find(path, pattern, level=None):
    """The messages matching pattern (a regex), optionally only at a level char."""
    rx = re.compile(pattern)
    return [msg for _, lc, msg in log_lines(path) if rx.search(msg) and (level is None or lc == level)]


def wait_logged(path, pattern, timeout=15.0, level=None):
    return wait_for(f"a log line matching {pattern!r} in {path}", lambda: find(path, pattern, level), timeout)


def node(tmp_path, name="n", **settings):
    settings.setdefault("threads", 1)
    settings.setdefault("log_file", str(tmp_path / f"{name}.log"))
    return Node(port=0, data_dir=str(tmp_path / name), log_path=str(tmp_path / f"{name}.stderr"), **settings)


def test_banner_configuration_and_stop_are_log_lines(tmp_path):
    n = node(tmp_path, durability="disk", requirepass="s3cret-pass")
    log = n.settings["log_file"]
    with n:
        c = client(n.port, password="s3cret-pass")
        assert c.set("k", "v")
        c.close()
    lines = log_lines(log)
    assert {pid for pid, _, _ in lines} == {lines[0][0]}, "one process wrote the log"
    msgs = [m for _, _, m in lines]
    assert any(re.match(r"kvstore \d+\.\d+\.\d+ starting, pid %d$" % lines[0][0], m) for m in msgs), msgs
    conf = find(log, r"^configuration: ")
    assert len(conf) == 1, msgs
    # the whole effective configuration on one line, the password hidden
    for key in ("bind=", "port=", "threads=1", "durability=\"disk\"", "maxclients=", "log_level=\"notice\"",
                "log_file="):
        assert key in conf[0], (key, conf[0])
    assert "s3cret-pass" not in open(log).read() and 'requirepass="(set)"' in conf[0]
    assert find(log, r"^durability disk: a write is acknowledged once its log record is synced")
    assert find(log, r"^ready to accept connections on 127\.0\.0\.1:%d " % n.port)
    assert find(log, r"^no log found: starting empty$")
    # stopped with SIGTERM: the signal, the shutdown steps, the end
    assert find(log, r"^received SIGTERM, shutting down$", level="#")
    assert find(log, r"^log closed: written and synced up to LSN \d+$")
    assert msgs[-1] == "kvstore stopped", msgs[-3:]
    # with a log file, stderr carries no log lines
    assert not any(LINE.match(x) for x in open(n.log_path).read().splitlines())


def test_durability_none_warns_and_warning_level_filters(tmp_path):
    n = node(tmp_path, durability="none", log_level="warning")
    with n:
        c = client(n.port)
        c.set("k", "v")
        c.close()
    lines = log_lines(n.settings["log_file"])
    assert lines and {lc for _, lc, _ in lines} == {"#"}, lines  # notice lines filtered out
    msgs = [m for _, _, m in lines]
    assert any("durability none: NOTHING WRITTEN WILL SURVIVE A RESTART" in m for m in msgs), msgs
    assert not any(m.startswith(("configuration:", "ready to accept")) for m in msgs), msgs


def test_debug_level_shows_the_flushers_sweeps_and_notice_does_not(tmp_path):
    found = {}
    for level in ("debug", "notice"):
        n = node(tmp_path, name=level, durability="disk", log_level=level, flush_interval_ms=50)
        with n:
            c = client(n.port)
            c.set("k", "v")
            if level == "debug":
                wait_logged(n.settings["log_file"], r"^data file sweep: \d+ keys in ", level=".")
            else:  # the same write and sweeps happen, and nothing below notice comes out
                wait_for("a sweep", lambda: c.info("persistence")["datafile_sweeps"] >= 1, timeout=10)
            c.close()
        found[level] = {lc for _, lc, _ in log_lines(n.settings["log_file"])}
    assert "." in found["debug"] and "*" in found["debug"]
    assert found["notice"] <= {"*", "#"}, found


def test_maxclients_refusal_is_logged_with_the_address(tmp_path):
    n = node(tmp_path, maxclients=2)
    with n:
        held = [Raw(n.port) for _ in range(2)]
        for r in held:
            assert r.call("PING") == b"PONG"
        r3 = Raw(n.port)
        out, _ = r3.read_until_close(timeout=5)
        assert out.startswith(b"-ERR max number of clients reached"), out
        local = r3.sock.getsockname()[1]
        r3.close()
        line = wait_logged(n.settings["log_file"], r"^refused connection from 127\.0\.0\.1:\d+: maxclients \(2\) "
                                                   r"reached", level="#")
        assert any(f":{local}:" in m for m in line), line
        for r in held:
            r.close()


def test_failed_auth_is_logged_rate_limited_without_the_password(tmp_path):
    n = node(tmp_path, requirepass="right-one")
    attempts = 60
    with n:
        r = Raw(n.port)
        local = r.sock.getsockname()[1]
        for i in range(attempts):
            if i and i % 4 == 0:  # the 5th failure in a row closes the connection: a new one
                r.close()
                r = Raw(n.port)
            assert r.call("AUTH", f"wrong-{i}")[1].startswith(b"WRONGPASS")
        assert r.call("AUTH", "right-one") == b"OK"  # a success is not a failure line
        r.close()
        log = n.settings["log_file"]
        lines = wait_logged(log, r"^AUTH failed for client 127\.0\.0\.1:%d " % local, level="#")
    lines = find(log, r"^AUTH failed for client ")
    # at most 5 a 10 s window: a loaded machine may spread the attempts over a few windows,
    # never over `attempts` of them
    assert 1 <= len(lines) < attempts // 2, lines
    assert any("suppressed" in m for m in lines), lines
    text = open(log).read()
    assert "wrong-" not in text and "right-one" not in text


def test_sighup_reopens_the_log_file_after_a_rename(tmp_path):
    n = node(tmp_path, requirepass="pw")
    log = n.settings["log_file"]
    with n:
        wait_logged(log, r"^ready to accept connections")
        os.rename(log, log + ".1")  # what logrotate does
        os.kill(n.pid, signal.SIGHUP)
        wait_logged(log, r"^log file reopened \(SIGHUP\)$")
        r = Raw(n.port)
        assert r.call("AUTH", "nope")[1].startswith(b"WRONGPASS")
        r.close()
        wait_logged(log, r"^AUTH failed for client ")
    old = [m for _, _, m in log_lines(log + ".1")]
    assert any(m.startswith("ready to accept connections") for m in old)
    assert not any(m.startswith("AUTH failed") for m in old), old  # new lines went to the new file
    assert [m for _, _, m in log_lines(log)][-1] == "kvstore stopped"
    assert n.proc is None or n.proc.poll() is not None


def test_replay_after_kill9_logs_progress_and_result(tmp_path):
    settings = dict(durability="disk", data_file=False, log_segment_size="64kb", log_level="verbose")
    n = node(tmp_path, **settings)
    n.start()
    bench = subprocess.run([sys.executable, "-m", "kvstore.cli", "bench", "-p", str(n.port), "-n", "20000",
                            "-c", "4", "-P", "16", "-r", "5000", "--json"], capture_output=True, text=True,
                           timeout=120)
    assert bench.returncode == 0, bench.stderr
    c = client(n.port)
    keys = c.dbsize()
    c.close()
    n.kill()  # kill -9: the log alone has the writes
    n.start()
    try:
        log = n.settings["log_file"]
        starts = find(log, r"^replaying the log in .*: (\d+) segment\(s\), after LSN 0$")
        assert starts, log_lines(log)
        segments = int(re.search(r": (\d+) segment", starts[-1]).group(1))
        assert segments > 1
        progress = find(log, r"^replaying the log: [\d]+ records so far, segment \d+ of %d done" % segments)
        assert len(progress) >= segments, progress  # verbose: one per segment
        result = find(log, r"^recovered ([\d,]+) records \(LSN 1\.\.\d+\) from %d log segment" % segments)
        assert result and int(re.search(r"recovered ([\d,]+)", result[-1]).group(1).replace(",", "")) >= 20000
        c = client(n.port)
        assert c.dbsize() == keys  # every acknowledged write came back
        c.close()
    finally:
        n.stop()


def test_peer_lost_back_and_caught_up_are_logged(tmp_path):
    p = Pair(tmp_path)
    p.extra = dict(log_level="notice")
    try:
        p.start_both()
        p.wait_in_sync("a")
        a = p.nodes["a"]
        log = a.log_path  # the pair's nodes log to stderr, kept in this file
        peer = re.escape(p.addr("b"))
        wait_logged(log, r"^replicating the log to peer %s " % peer)
        wait_logged(log, r"^peer %s connected: catching it up$" % peer)
        wait_logged(log, r"^peer %s caught up: writes acknowledged from its memory again$" % peer)
        c = client(a.port)
        c.set("before", "1")
        p.kill("b")
        c.set("while-b-is-down", "1")  # acknowledged from A's own disk
        wait_logged(log, r"^peer %s lost \(.*\): falling back to disk mode" % peer, level="#")
        p.start("b")
        wait_logged(log, r"^peer %s back: catching it up$" % peer, timeout=30)
        c.set("after", "1")
        wait_for("two caught-up lines", lambda: len(find(log, r"^peer %s caught up" % peer)) >= 2, timeout=30)
        c.close()
    finally:
        p.close()


def test_writers_stalled_for_memory_are_logged(tmp_path):
    """A slow disk (each log sync 300 ms longer, the fault switch of kvstore.durability.Log)
    under a 256 KiB memory bound: writes outrun what the flusher may clean (only what the
    log holds), writers wait for room, and the log says so, then that it is over."""
    class SlowDiskNode(Node):
        def command(self):
            return ["env", "KVSTORE_FAULT_SYNC_DELAY_US=300000"] + super().command()

    log = str(tmp_path / "kv.log")
    n = SlowDiskNode(port=0, data_dir=str(tmp_path / "d"), log_path=str(tmp_path / "stderr"), threads=1,
                     durability="disk", max_memory="256kb", log_file=log)
    with n:
        bench = subprocess.Popen([sys.executable, "-m", "kvstore.cli", "bench", "-p", str(n.port), "--duration", "20",
                                  "-c", "20", "-P", "8", "-d", "2000", "-r", "200000"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_logged(log, r"^writers have been waiting for memory for \d+\.\d s \(\d+ bytes used, "
                             r"max-memory 262144\): the flusher is behind$", timeout=30, level="#")
        finally:
            bench.kill()
            bench.wait()
        wait_logged(log, r"^writers no longer wait for memory \(after \d+\.\d s\)$", timeout=30)


def test_out_of_file_descriptors_is_logged_and_the_server_keeps_serving(tmp_path):
    """A server whose open-file limit cannot be raised (hard limit 96; as root CAP_SYS_RESOURCE
    dropped, or it would raise it) lowers maxclients to fit with Redis's log lines, refuses the
    connections past it with Redis's error and serves the rest."""
    port, log = free_port(), str(tmp_path / "fd.log")
    nocap = ["setpriv", "--inh-caps", "-sys_resource", "--bounding-set", "-sys_resource"] if os.geteuid() == 0 else []
    p = subprocess.Popen(nocap + ["prlimit", "--nofile=96:96", sys.executable, "-m", "kvstore.cli", "serve", "--port", str(port),
                          "--durability", "none", "--threads", "1", "--log-file", log],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    socks = []
    try:
        wait_logged(log, r"^ready to accept connections")
        assert find(log, r"Current maximum open files is 96\. maxclients has been reduced to \d+ to compensate "
                         r"for low ulimit\.", level="#")
        for _ in range(120):  # more than the server has descriptors for
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            socks.append(s)
        wait_logged(log, r"^refused connection from 127\.0\.0\.1:\d+: maxclients \(\d+\) reached", level="#")
        ok = 0
        for s in socks:  # the connections it accepted still work
            try:
                s.sendall(b"PING\r\n")
                ok += s.recv(16) == b"+PONG\r\n"
            except OSError:
                pass
        assert 10 < ok < 120
    finally:
        for s in socks:
            s.close()
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
