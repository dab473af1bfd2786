"""The block device's settings (kvstore.config.BlockdevConfig): declared once, they are the
`kvstore blockdev serve` options, the TOML [blockdev] table's keys, kvstore.BlockDevice's
keywords and the struct nbd_config fields; bad values are refused with what is accepted."""
import dataclasses

import pytest
from click.testing import CliRunner

from cli.blockdev import RENAME, serve
from kvstore import BlockDevice, ConfigError
from kvstore.config import BlockdevConfig, ServerConfig, parse_disk_size, redact
from kvstore.blockdev import SHARED_TLS

SETTINGS = BlockdevConfig.settings()
NBD_CONFIG_FIELDS = {"bind", "port", "unix_path", "export_name", "description", "size", "block_size", "threads",
                     "conns_per_thread", "busy_poll_us", "read_only", "max_clients", "backend", "key_prefix",
                     "tls", "tls_cert_file", "tls_key_file", "tls_ca_cert_file", "tls_psk_file", "tls_auth_clients",
                     "allow_plain_remote"}  # ext/frontend/nbd.h


@pytest.mark.parametrize("text, size", [("4G", 4 << 30), ("4g", 4 << 30), ("512M", 512 << 20), ("4GiB", 4 << 30),
                                        ("1T", 1 << 40), ("64k", 64 << 10), ("8192", 8192), (4096, 4096),
                                        (" 2 G ", 2 << 30), ("3MB", 3 << 20)])
def test_disk_sizes_are_powers_of_1024(text, size):
    assert parse_disk_size(text) == size


@pytest.mark.parametrize("text", ["4X", "G", "-1", "1.5G", True, "", None])
def test_bad_disk_size_says_what_is_accepted(text):
    with pytest.raises(ConfigError, match=r"size: expected a size in bytes or with a binary unit .* '4G'"):
        parse_disk_size(text)


def test_defaults_follow_the_contract():
    c = BlockdevConfig(size="1G").validate()
    v = c.c_values()
    assert set(v) == NBD_CONFIG_FIELDS
    assert v == dict(v, bind="127.0.0.1", port=10809, unix_path="", export_name="kvstore", size=1 << 30,
                     block_size=4096, conns_per_thread=1, busy_poll_us=50, read_only=0, backend="embedded", key_prefix="nbd:kvstore:",
                     tls=0, allow_plain_remote=0)  # TLS off; protected: no plain listener beyond loopback
    assert v["threads"] >= 1  # 0 = one per core
    assert BlockdevConfig(size="1G", export="disk2").validate().c_values()["key_prefix"] == "nbd:disk2:"


def test_unix_alone_means_no_tcp_listener_and_both_may_be_given():
    assert BlockdevConfig(size="1M", unix="/tmp/s").validate().c_values()["port"] == -1
    v = BlockdevConfig(size="1M", unix="/tmp/s", listen="127.0.0.1:0").validate().c_values()
    assert (v["bind"], v["port"], v["unix_path"]) == ("127.0.0.1", 0, "/tmp/s")


@pytest.mark.parametrize("settings, message", [
    (dict(), "size: the device's size is required"),
    (dict(size=5000), r"size: must be a multiple of the block size \(4096\), got 5000 \(round it to 4096\)"),
    (dict(size="1G", block_size=3000), "block_size: expected a power of two from 512 to 1048576, got 3000"),
    (dict(size="1G", block_size=256), "block_size: expected a power of two from 512 to 1048576, got 256"),
    (dict(size="1G", backend="mysql://x"), r"backend: expected embedded, kvstore://\[:PASSWORD@\]HOST:PORT"),
    (dict(size="1G", backend="redis://"), "backend: expected embedded"),
    (dict(size="1G", listen="localhost:1"), "listen: expected IPV4:PORT such as 127.0.0.1:10809"),
    (dict(size="1G", listen="127.0.0.1:70000"), "listen: expected IPV4:PORT"),
    (dict(size="1G", threads=65), "threads: expected an integer from 0 .* to 64, got 65"),
    (dict(size="1G", connections_per_thread=0), "connections_per_thread: expected an integer from 1 to 16"),
    (dict(size="1G", busy_poll_us=1001), "busy_poll_us: expected microseconds from 0 .off. to 1000, got 1001"),
    (dict(size="1G", busy_poll_us=-1), "busy_poll_us: expected microseconds from 0 .off. to 1000, got -1"),
    (dict(size="1G", unix="/" + "x" * 120), "unix: a socket path is at most 107 bytes"),
    (dict(size="1G", read_only="yes"), "read_only: expected true or false"),
])
def test_bad_settings_are_refused_with_what_is_accepted(settings, message):
    with pytest.raises(ConfigError, match=message):
        BlockdevConfig(**settings).validate()


def test_toml_blockdev_table_beside_server_table(tmp_path):
    f = tmp_path / "kv.toml"
    f.write_text('[server]\nport = 7000\ndurability = "none"\n\n[blockdev]\nsize = "2G"\nblock-size = 8192\n'
                 'backend = "redis://127.0.0.1:6379/2"\nread_only = true\n')
    b = BlockdevConfig.load(str(f))
    assert (b.size, b.block_size, b.backend, b.read_only) == (2 << 30, 8192, "redis://127.0.0.1:6379/2", True)
    s = ServerConfig.load(str(f))  # [blockdev] is not the server's
    assert (s.port, s.durability) == (7000, "none")
    assert BlockdevConfig.load(str(f), size="1G").size == 1 << 30  # the command line wins
    f.write_text('port = 7001\n[blockdev]\nsize = "1G"\n')  # keys outside a table stay the server's
    assert ServerConfig.load(str(f)).port == 7001 and BlockdevConfig.load(str(f)).size == 1 << 30
    f.write_text('[blockdev]\nsize = "1G"\nbogus = 1\n')
    with pytest.raises(ConfigError, match=r"\[blockdev\]: unknown setting 'bogus'; known: .*backend"):
        BlockdevConfig.load(str(f))


def test_serve_options_are_the_settings_of_both_tables():
    params = {p.name: p for p in serve.params}
    engine = {RENAME.get(f.name, f.name) for f in ServerConfig.settings()}
    assert set(params) == {f.name for f in SETTINGS} | engine | {"config_file"}
    for f in SETTINGS:
        assert params[f.name].opts == ["--" + f.name.replace("_", "-")] and params[f.name].default is None
    assert params["server_threads"].opts == ["--server-threads"]
    assert params["read_only"].is_flag


def test_serve_help_explains_every_option():
    out = CliRunner().invoke(serve, ["--help"], terminal_width=400).output
    flat = " ".join(out.split())
    for f in SETTINGS:
        assert " ".join(f.metadata["help"].split()) in flat, f.name
    assert "kvstore blockdev listening on nbd://127.0.0.1:10809/kvstore" in out
    assert "[embedded] disk (the default)" in flat  # the engine's options, marked
    assert "--log-level [debug|verbose|notice|warning] The least important" in flat  # any backend: unmarked


@pytest.mark.parametrize("args, message", [
    (["--size", "1G", "--backend", "redis://127.0.0.1:1", "--durability", "disk"],
     "--durability: the engine's settings apply to --backend embedded only"),
    (["--size", "1G", "--backend", "memcached://127.0.0.1:1", "--server-threads", "2"],
     "--server-threads: the engine's settings apply"),
    (["--size", "1G", "--block-size", "100"], "block_size: expected a power of two"),
    (["--size", "lots"], "size: expected a size in bytes or with a binary unit"),
    (["--size", "1G", "--max-memory", "lots"], "--max-memory: expected a size"),
])
def test_serve_refuses_bad_options_before_starting(args, message):
    r = CliRunner().invoke(serve, args)
    assert r.exit_code != 0 and message in r.output, r.output


def test_backend_password_is_not_logged():
    assert redact("kvstore://:s3cret@10.0.0.1:6380") == "kvstore://(password)@10.0.0.1:6380"
    assert redact("redis://127.0.0.1:6379/1") == "redis://127.0.0.1:6379/1"


def test_python_api_splits_block_device_and_engine_settings():
    dev = BlockDevice(size="64M", durability="none", max_memory="1gb", export="d1", threads=1)
    assert (dev.config.size, dev.config.export, dev.config.threads) == (64 << 20, "d1", 1)
    assert (dev.server_config.durability, dev.server_config.max_memory, dev.server_config.port) == ("none", 1 << 30, 0)
    assert dev.config.listen == "127.0.0.1:0" and not dev.running
    with pytest.raises(ConfigError, match=r"durability: the engine's settings apply to backend embedded only; "
                                          r"redis://\(password\)@127"):
        BlockDevice(size="64M", backend="redis://:pw@127.0.0.1:6379", durability="none")
    assert BlockDevice(size="64M", export=None, listen=None).config.export == "kvstore"  # None: left out
    with pytest.raises(TypeError, match="unknown setting.*colour"):
        BlockDevice(size="64M", colour="blue")
    with pytest.raises(ConfigError, match="size: the device's size is required"):
        BlockDevice()
    assert {f.name for f in dataclasses.fields(BlockdevConfig)} & {f.name for f in dataclasses.fields(ServerConfig)} \
        == {"threads", "config_file", *SHARED_TLS}  # threads: the engine's is server_threads on the command line;
    # the TLS certificate files: one setting for both (the NBD port's --tls, the engine's --tls-port)
