"""ServerConfig's fields as the one declaration of every setting: the `kvstore serve`
options, the TOML checks and the C config all come from them."""
import dataclasses

import pytest
from click.testing import CliRunner

from cli.main import serve
from kvstore import ConfigError
from kvstore._native import ffi
from kvstore.config import ServerConfig
from kvstore.server import C_CONFIG, c_config

SETTINGS = ServerConfig.settings()
FIELDS = {f.name: f for f in dataclasses.fields(ServerConfig)}


def test_every_setting_is_declared_completely():
    assert len(SETTINGS) >= 25 and "config_file" not in {f.name for f in SETTINGS}
    for f in FIELDS.values():
        m = f.metadata
        assert m["help"].strip(), f.name
        assert m["type"] is not None and m["accepts"], f.name
        assert f.default is not dataclasses.MISSING, f.name
        assert m["cli"] in ("option", "flag", "switch", None), f.name
        if m["choices"]:
            assert f.default in m["choices"], f.name
    ServerConfig().validate()  # the defaults pass their own checks


def test_c_fields_exist_in_the_c_struct():
    c_fields = dict(ffi.typeof(C_CONFIG).fields)
    for f in FIELDS.values():
        if f.metadata["c"]:
            assert f.metadata["c"] in c_fields, f"{f.name} -> {f.metadata['c']}"


def test_serve_options_are_exactly_the_settings():
    params = {p.name: p for p in serve.params}
    assert set(params) == {f.name for f in SETTINGS} | {"config_file", "from_peer", "check_config"}
    assert params["config_file"].opts == ["-c", "--config"]
    for f in SETTINGS:
        p = params[f.name]
        assert p.opts == ["--" + f.name.replace("_", "-")], f.name
        assert p.default is None, f"{f.name}: a default would override the config file"
        if f.metadata["choices"]:
            assert tuple(p.type.choices) == f.metadata["choices"], f.name
    assert params["data_file"].secondary_opts == ["--no-data-file"]
    assert params["network_only"].is_flag and not params["network_only"].secondary_opts


def test_serve_help_shows_help_defaults_and_choices():
    out = CliRunner().invoke(serve, ["--help"], terminal_width=400).output
    flat = " ".join(out.split())
    for f in SETTINGS:
        m = f.metadata
        assert "--" + f.name.replace("_", "-") in out
        assert " ".join(m["help"].split()) in flat, f.name
        if m["shown"] is True:
            assert f"[default: {f.default}]" in flat, f.name
    assert "[default: ./data]" in flat and "[default: off]" in flat and "[default: 64mb]" in flat
    assert "[poller|threadpool|udp|dpdk]" in flat and "[none|disk|remote]" in flat


def write(tmp_path, text):
    p = tmp_path / "kvstore.toml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text,message", [
    ('colour = "blue"\n', r"unknown setting 'colour'; known: .*\bmax_memory\b.*\bport\b"),
    ('config_file = "x"\n', r"unknown setting 'config_file'"),
    ('poll_policy = "fast"\n', r"poll_policy: expected 'direct', 'strict' or 'flexpoll', got 'fast'"),
    ('arch = "gpu"\n', r"arch: expected 'poller', 'threadpool', 'udp' or 'dpdk', got 'gpu'"),
    ('durability = "tape"\n', r"durability: expected 'none', 'disk' or 'remote', got 'tape'"),
    ('port = "six"\n', r"port: expected a port from 0 to 65535 \(0 = any free port\), or -1 \(no plain port, "
                        r"with --tls-port\), got 'six'"),
    ('port = true\n', r"port: expected a port from 0 to 65535 .*, got True"),
    ('threads = 2000\n', r"threads: expected an integer from 0 \(one per core\) to 1024, got 2000"),
    ('maxclients = 0\n', r"maxclients: expected a positive integer, got 0"),
    ('data_file = "yes"\n', r"data_file: expected true or false, got 'yes'"),
    ('peer_timeout_ms = 5\n', r"peer_timeout_ms: expected an integer >= 10, got 5"),
    ('repl_port = -2\n', r"repl_port: expected -1 \(off\) or a port from 0 to 65535, got -2"),
    ('log_segment_size = "1k"\n', r"log_segment_size: expected at least 4096 bytes, got 1000"),
    ('max_memory = "lots"\n', r"max_memory: expected a size such as 1048576, '64mb' or '1gb'"),
    ('requirepass = 5\n', r"requirepass: expected a string"),
    ('bind = "localhost"\n', r"bind: expected an IPv4 address such as 127.0.0.1, got 'localhost'"),
    ('tcp_backlog = 0\n', r"tcp_backlog: expected an integer >= 1, got 0"),
    ('durability = "remote"\n', r"durability remote needs --peer HOST:PORT"),
])
def test_toml_refusals_name_the_key_and_what_is_accepted(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        ServerConfig.load(write(tmp_path, text))


def test_toml_values_sizes_and_dashes(tmp_path):
    cfg = ServerConfig.load(write(tmp_path, '[server]\nmax-memory = "2mb"\nlog_segment_size = "1mib"\n'
                                            'arch = "threadpool"\ndata_file = true\n'), threads=3)
    assert cfg.max_memory == 2 * 1024 * 1024 and cfg.log_segment_size == 1 << 20
    assert cfg.arch == "threadpool" and cfg.threads == 3 and cfg.data_file is True
    assert cfg.config_file.endswith("kvstore.toml")


def test_data_file_default_follows_durability():
    assert ServerConfig(durability="none").validate().data_file is False
    assert ServerConfig(durability="disk").validate().data_file is True
    assert ServerConfig(durability="disk", data_file=False).validate().data_file is False


def c_str(p):
    return ffi.string(p).decode()


def test_c_config_from_the_settings():
    cfg = ServerConfig(bind="127.0.0.2", port=7000, threads=0, arch="threadpool", accept="handoff",
                       poll_policy="strict", requirepass="pw", maxclients=77, tcp_backlog=99,
                       network_only=True, durability="disk", udp_workers=3).validate()
    c, keep = c_config(cfg, version="9.9")
    assert (c_str(c.bind), c.port, c.maxclients, c.tcp_backlog) == ("127.0.0.2", 7000, 77, 99)
    assert c.threads == 32  # threadpool's default worker count: effective_threads
    assert c_str(c.poll_policy) == "strict" and c_str(c.requirepass) == "pw" and c_str(c.durability) == "disk"
    assert c.network_only == 1 and c.udp_workers == 3 and c_str(c.version) == "9.9"
    assert c.wal == ffi.NULL and c.bosc == ffi.NULL  # the durability handles are not settings
    # arch and accept go to C by name (the front-end registry looks them up)
    assert (c_str(c.arch), c_str(c.accept)) == ("threadpool", "handoff")
    udp, _ = c_config(ServerConfig(arch="udp", udp_port=0).validate())
    assert (c_str(udp.arch), c_str(udp.accept), udp.udp_port, udp.threads) == ("udp", "reuseport", 0, 1)
    assert len(keep) >= 6  # the char * values stay alive with the list
