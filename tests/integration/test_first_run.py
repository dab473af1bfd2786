"""A new user's first run: `kvstore serve` keeps what it acknowledged across a restart (and a
kill -9) without being told to (durability disk is the default; none is an explicit opt-in),
and `kvstore serve --check-config` checks settings without serving."""
import socket
import subprocess
import sys

import pytest

from kvstore import Node
from kvstore.config import ServerConfig

SERVE = [sys.executable, "-m", "kvstore.cli", "serve"]
pytestmark = pytest.mark.timeout(120)


def test_the_default_is_disk_and_survives_kill_9(tmp_path):
    keys = {f"sensor:{i}": f"{i}.5" for i in range(200)}
    with Node(port=0, threads=1, data_dir=tmp_path) as n:
        c = n.client(decode_responses=True)
        c.mset(keys)
        assert c.info("persistence")["durability"] == "disk"
        n.kill()  # every acknowledged write is on disk already
    with Node(port=0, threads=1, data_dir=tmp_path) as n:
        c = n.client(decode_responses=True)
        assert c.dbsize() == len(keys)
        assert c.mget(list(keys)) == list(keys.values())


def test_durability_none_keeps_nothing(tmp_path):
    with Node(port=0, threads=1, data_dir=tmp_path, durability="none") as n:
        n.client().set("k", "v")
    with Node(port=0, threads=1, data_dir=tmp_path, durability="none") as n:
        assert n.client().dbsize() == 0


def check_config(*args, cwd):
    return subprocess.run(SERVE + ["--check-config", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_check_config_prints_the_effective_settings_and_touches_nothing(tmp_path):
    with socket.socket() as held:  # a port in use: --check-config does not bind
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        r = check_config("--port", port, "--max-memory", "2mb", "--requirepass", "pw-not-shown-3f9", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for want in (f"port = {port}", "max_memory = 2097152", 'durability = "disk"', "data_file = true",
                 'data_dir = "data"', "# requirepass is set (not shown)"):
        assert want in lines, want
    assert "pw-not-shown-3f9" not in r.stdout
    assert list(tmp_path.iterdir()) == []  # no data dir made


def test_check_config_output_loads_back(tmp_path):
    (tmp_path / "in.toml").write_text('[server]\nthreads = 3\nlog_segment_size = "1mib"\narch = "threadpool"\n')
    first = check_config("-c", "in.toml", "--durability", "none", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (tmp_path / "out.toml").write_text(first.stdout)
    again = check_config("-c", "out.toml", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[1:] == first.stdout.splitlines()[1:]  # all but the "from <file>" line
    cfg = ServerConfig.load(tmp_path / "out.toml")
    assert (cfg.threads, cfg.log_segment_size, cfg.arch, cfg.durability, cfg.data_file) == \
        (3, 1 << 20, "threadpool", "none", False)


@pytest.mark.parametrize("args, error", [
    (["-c", "bad.toml"], "config file bad.toml: unknown setting 'prot'; known: "),
    (["--durability", "remote"], "durability remote needs --peer HOST:PORT"),
    (["--max-memory", "lots"], "--max-memory: expected a size such as 1048576, '64mb' or '1gb'"),
])
def test_check_config_refuses_with_the_error(tmp_path, args, error):
    (tmp_path / "bad.toml").write_text("prot = 7000\n")
    r = check_config(*args, cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == ""
    assert error in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]
