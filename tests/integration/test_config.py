"""`kvstore serve` configuration: TOML file, command-line overrides, rejected values
with helpful messages, and the --max-memory bound (OOM, nothing lost, DEL frees)."""
import re
import signal
import socket
import subprocess
import sys

import pytest
import redis

from helpers.conn import Raw, client
from helpers.resp import resp_cmd
from helpers.servers import PASSWORD, RedisServer, free_port, need

pytestmark = pytest.mark.timeout(60)

SERVE = [sys.executable, "-m", "kvstore.cli", "serve"]
READY = re.compile(rb"listening on ([0-9.]+):(\d+)")
OOM = "OOM command not allowed when used memory > 'maxmemory'."
OOM_PY = "command not allowed when used memory > 'maxmemory'."  # redis-py drops the "OOM " code


class Served:
    """`kvstore serve ARGS` as a child process, without kvstore.Node (which always
    passes --port, and so would hide the config file's port)."""

    def __init__(self, args, tmp_path):
        self.args = SERVE + ["--data-dir", str(tmp_path / "data")] + list(args)
        self.proc = None
        self.port = None

    def __enter__(self):
        self.err = open(self.args[self.args.index("--data-dir") + 1] + ".stderr", "wb")
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.err)
        line = self.proc.stdout.readline()  # the CLI prints the ready line when serving
        m = READY.search(line)
        if not m:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"kvstore serve did not start: {line!r}")
        self.port = int(m.group(2))
        self.line = line.decode()
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.err.close()


def serve_fails(args, tmp_path):
    """Run `kvstore serve` expecting it to refuse: (exit code, stderr text)."""
    r = subprocess.run(SERVE + ["--data-dir", str(tmp_path / "data")] + list(args),
                       capture_output=True, timeout=30)
    assert READY.search(r.stdout) is None, f"started anyway: {r.stdout!r}"
    return r.returncode, r.stderr.decode()


def info(port, password=None):
    with client(port, password=password) as c:
        return c.info("everything")


# ------------------------------------------------------------------ file and overrides

def write_toml(tmp_path, text, name="kvstore.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_toml_file_sets_port_threads_memory_password(tmp_path):
    port = free_port()
    cfg = write_toml(tmp_path, f'port = {port}\nthreads = 1\nmax_memory = "3mib"\nrequirepass = "{PASSWORD}"\n'
                               f'maxclients = 50\npoll_policy = "strict"\naccept = "handoff"\n')
    with Served(["--config", str(cfg)], tmp_path) as s:
        assert s.port == port
        with Raw(port) as r:
            assert r.send(resp_cmd("PING")).reply() == b"-NOAUTH Authentication required.\r\n"
        i = info(port, password=PASSWORD)
        assert i["tcp_port"] == port
        assert i["pollers"] == 1
        assert i["maxmemory"] == 3 * 1024 * 1024
        assert i["maxclients"] == 50
        assert i["poll_policy"] == "strict" and i["accept_mode"] == "handoff"
        assert i["config_file"] == str(cfg.resolve())
        with client(port, password=PASSWORD, decode_responses=True) as c:
            assert c.config_get("maxmemory") == {"maxmemory": str(3 * 1024 * 1024)}


def test_toml_server_table_and_dashes(tmp_path):
    cfg = write_toml(tmp_path, '[server]\nport = 0\nthreads = 2\nmax-memory = 4000000\n')
    with Served(["-c", str(cfg)], tmp_path) as s:
        i = info(s.port)
        assert i["pollers"] == 2 and i["maxmemory"] == 4_000_000


def test_command_line_overrides_file(tmp_path):
    file_port = free_port()
    cfg = write_toml(tmp_path, f'port = {file_port}\nthreads = 1\nmax_memory = "3mib"\nrequirepass = "filepw"\n')
    with Served(["--config", str(cfg), "--port", "0", "--threads", "2", "--max-memory", "5mib",
                 "--requirepass", "clipw"], tmp_path) as s:
        assert s.port != file_port
        with pytest.raises(redis.AuthenticationError):
            info(s.port, password="filepw")
        i = info(s.port, password="clipw")
        assert i["tcp_port"] == s.port
        assert i["pollers"] == 2
        assert i["maxmemory"] == 5 * 1024 * 1024
    # flags not given keep the file's values
    with Served(["--config", str(cfg), "--port", "0"], tmp_path) as s:
        i = info(s.port, password="filepw")
        assert i["pollers"] == 1 and i["maxmemory"] == 3 * 1024 * 1024


def test_ready_line(tmp_path):
    with Served(["--port", "0", "--threads", "2", "--max-memory", "64mib"], tmp_path) as s:
        assert s.line.startswith(f"kvstore 0.1.0 listening on 127.0.0.1:{s.port} (")
        assert "2 pollers" in s.line


# ------------------------------------------------------------------ rejected settings

BAD = [
    # (args, file text or None, words stderr must contain)
    (["--port", "70000"], None, ["port", "0 to 65535", "70000"]),
    (["--port", "-1"], None, ["port", "0 to 65535"]),
    (["--threads", "-1"], None, ["threads", "1024", "-1"]),
    (["--max-memory", "lots"], None, ["max-memory", "'lots'", "64mb"]),
    (["--max-memory", "-5mb"], None, ["max-memory"]),
    (["--poll-policy", "fast"], None, ["poll-policy", "'fast'", "direct", "strict"]),
    (["--accept", "magic"], None, ["accept", "reuseport", "handoff"]),
    (["--maxclients", "0"], None, ["maxclients", "positive"]),
    (["--bind", "localhost"], None, ["bind", "IPv4"]),
    ([], "port = 70000\n", ["port", "0 to 65535", "70000"]),
    ([], "threads = -1\n", ["threads", "1024"]),
    ([], 'max_memory = "lots"\n', ["max_memory", "'lots'", "1gb"]),
    ([], "colour = \"blue\"\n", ["unknown setting 'colour'", "known:", "max_memory", "port"]),
    ([], 'poll_policy = "fast"\n', ["poll_policy", "'fast'", "direct", "strict"]),
    ([], 'port = "six"\n', ["port", "0 to 65535"]),
    ([], "port = \n", ["invalid TOML"]),
]


@pytest.mark.parametrize("args,file_text,words", BAD,
                         ids=[" ".join(a) or f.strip() for a, f, _ in BAD])
def test_bad_settings_rejected_with_message(tmp_path, args, file_text, words):
    if file_text is not None:
        args = ["--config", str(write_toml(tmp_path, file_text))] + args
    args = args if "--port" in args or file_text and "port" in file_text else args + ["--port", "0"]
    rc, err = serve_fails(args, tmp_path)
    assert rc != 0
    for w in words:
        assert w in err, f"{w!r} not in stderr: {err!r}"
    assert "Traceback" not in err


def test_missing_config_file(tmp_path):
    rc, err = serve_fails(["--config", str(tmp_path / "nope.toml"), "--port", "0"], tmp_path)
    assert rc != 0 and "nope.toml" in err


def test_port_in_use_by_another_program(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc, err = serve_fails(["--port", str(port)], tmp_path)
    assert rc != 0
    assert str(port) in err and "in use" in err


@pytest.mark.timeout(120)
def test_port_in_use_by_another_kvstore(tmp_path, kv_fresh):
    """A second server on the port of a running one must refuse to start (redis-server
    says 'Address already in use'), not silently share the port through SO_REUSEPORT
    and take half of the first server's new connections."""
    (tmp_path / "b").mkdir()
    r = subprocess.Popen(SERVE + ["--data-dir", str(tmp_path / "b" / "data"), "--port", str(kv_fresh.port)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = r.communicate(timeout=60)  # refused in ~1 s; a loaded machine may take far longer
        started = READY.search(out) is not None
    except subprocess.TimeoutExpired:
        started = True  # still running: it is serving on the busy port
        r.send_signal(signal.SIGTERM)
        out, err = r.communicate(timeout=15)
    assert not started, "a second kvstore started on a port already in use"
    assert r.returncode != 0 and b"in use" in err


@pytest.mark.timeout(60)
def test_max_memory_units_as_redis(tmp_path):
    """'2mb' means what it means to redis-server (--maxmemory 2mb -> 2097152)."""
    need("redis-server")
    ref = RedisServer("--maxmemory", "2mb").start()
    try:
        with client(ref.port, decode_responses=True) as c:
            want = c.config_get("maxmemory")["maxmemory"]
    finally:
        ref.stop()
    with Served(["--port", "0", "--max-memory", "2mb"], tmp_path) as s:
        with client(s.port, decode_responses=True) as c:
            assert c.config_get("maxmemory")["maxmemory"] == want


# ------------------------------------------------------------------ --max-memory: OOM

@pytest.mark.timeout(90)
def test_max_memory_oom_keeps_data_and_del_frees(kv_node_factory):
    n = kv_node_factory(max_memory="2mb")
    val = lambda i: (b"%08d" % i) * 128  # 1 KB, distinct per key
    written = []
    with client(n.port) as c:
        limit = int(c.config_get("maxmemory")["maxmemory"])
        assert limit == 2 * 1024 * 1024  # Redis units: mb = 1024 * 1024
        oom = None
        for batch in range(100):  # at most 10,000 writes of 1 KB into 2 MB: must hit OOM
            p = c.pipeline(transaction=False)
            ids = list(range(batch * 100, batch * 100 + 100))
            for i in ids:
                p.set(b"key:%d" % i, val(i))
            for i, r in zip(ids, p.execute(raise_on_error=False)):
                if r is True:  # (a smaller need, e.g. no bucket growth, may still fit after an OOM)
                    written.append(i)
                else:
                    assert isinstance(r, redis.exceptions.OutOfMemoryError), r
                    assert str(r) == OOM_PY
                    oom = oom or r
            if oom:
                break
        assert oom is not None, "2 MB bound never reached with 10 MB written"
        assert len(written) > 500  # 2 MB holds well over 500 values of 1 KB
        # raw bytes of the refusal, exactly as Redis sends it (a value surely past the room left:
        # background rehashing may free a few KB, so a 1 KB write can fit again later)
        room = limit - c.info("memory")["used_memory"]
        with Raw(n.port) as r:
            assert r.send(resp_cmd("SET", "more", "x" * (room + 256 * 1024))).reply() == \
                ("-" + OOM + "\r\n").encode()
        st = c.info("everything")
        assert st["used_memory"] <= st["maxmemory"] == limit
        assert st["oom_rejections"] >= 2
        # nothing written before is lost or damaged
        vals = c.mget([b"key:%d" % i for i in written])
        bad = [i for i, v in zip(written, vals) if v != val(i)]
        assert not bad, f"{len(bad)} of {len(written)} keys lost or changed, e.g. {bad[:5]}"
        assert c.dbsize() == len(written)
        # reads, DEL and other non-growing commands still work when full
        assert c.get(b"key:%d" % written[0]) == val(written[0])
        assert c.strlen(b"key:%d" % written[0]) == 1024
        assert c.exists(b"key:%d" % written[0]) == 1
        with pytest.raises(redis.exceptions.OutOfMemoryError, match=re.escape(OOM_PY)):
            c.append(b"key:%d" % written[0], b"y" * (limit - c.info("memory")["used_memory"] + 256 * 1024))
        assert c.get(b"key:%d" % written[0]) == val(written[0])  # a refused APPEND changed nothing
        with pytest.raises(redis.exceptions.OutOfMemoryError, match=re.escape(OOM_PY)):
            c.mset({b"m1": b"x" * 600_000, b"m2": b"x" * 600_000})
        assert c.exists(b"m1", b"m2") == 0  # a refused MSET applied nothing
        # DEL frees room: writes succeed again
        freed = written[:200]
        assert c.delete(*[b"key:%d" % i for i in freed]) == len(freed)
        after_del = c.info("memory")["used_memory"]
        assert after_del < st["used_memory"]
        for j in range(100):
            assert c.set(b"new:%d" % j, val(j)) is True
        assert c.info("memory")["used_memory"] <= limit
        survivors = written[200:]
        vals = c.mget([b"key:%d" % i for i in survivors])
        assert all(v == val(i) for i, v in zip(survivors, vals))
        # FLUSHALL frees everything
        c.flushall()
        assert c.info("memory")["used_memory"] < after_del
        assert c.set(b"big", b"z" * (limit // 2)) is True


def test_max_memory_value_larger_than_bound(kv_node_factory):
    n = kv_node_factory(max_memory="1mib")
    with client(n.port) as c:
        with pytest.raises(redis.exceptions.OutOfMemoryError, match=re.escape(OOM_PY)):
            c.set("huge", b"x" * (2 * 1024 * 1024))
        assert c.get("huge") is None
        assert c.set("small", "ok") and c.get("small") == b"ok"
        assert c.info("memory")["used_memory"] <= 1024 * 1024


def test_config_set_maxmemory(kv_node_factory):
    n = kv_node_factory()
    with client(n.port) as c:
        assert c.config_set("maxmemory", 300_000) is True
        assert c.config_get("maxmemory") == {"maxmemory": "300000"}
        with pytest.raises(redis.exceptions.OutOfMemoryError, match=re.escape(OOM_PY)):
            for i in range(1000):
                c.set(f"k{i}", b"x" * 1000)
        assert c.info("memory")["used_memory"] <= 300_000
        assert c.config_set("maxmemory", 0) is True
        for i in range(1000):
            c.set(f"k{i}", b"x" * 1000)
        assert c.dbsize() == 1000
