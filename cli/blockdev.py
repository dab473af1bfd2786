"""`kvstore blockdev serve`: a block device over the key-value store, served by NBD (a thin
layer over kvstore.BlockDevice; the settings are kvstore.config's BlockdevConfig and, for
the embedded backend, ServerConfig)."""
import logging
import os
import sys

import click

import kvstore
from kvstore import log
from kvstore.blockdev import SHARED_TLS, BlockDevice
from kvstore.cli.main import _durability_line, _fail_logged, main, setting_options
from kvstore.config import SIZE, BlockdevConfig, ServerConfig, parse_size, redact
from kvstore.errors import ConfigError, KVError

# The engine's settings in this command: `threads` is the block device's (NBD workers), so
# the engine's RESP pollers are --server-threads here.
RENAME = {"threads": "server_threads"}
RENAME_BACK = {v: k for k, v in RENAME.items()}
# Engine settings that also mean something without the embedded engine: where the log goes.
ANY_BACKEND = ("log_level", "log_file")
# The certificate settings (kvstore.blockdev.SHARED_TLS) are the block device's (--tls): one
# option each; with the embedded engine they serve its --tls-port as well.


class _EngineSettings:
    """ServerConfig's options without the ones BlockdevConfig declares too."""
    @staticmethod
    def settings():
        return [f for f in ServerConfig.settings() if f.name not in SHARED_TLS]


@click.group()
def blockdev():
    """A block device whose blocks are key-value pairs, served over NBD (paper 001).

    Any NBD client works with it: nbdinfo, nbdcopy, nbdsh, qemu-img, fio's nbd engine,
    nbdfuse (then losetup, mkfs, mount)."""


@blockdev.command()
@click.option("-c", "--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML config file: the block device's settings in a [blockdev] table (size = \"4G\", backend = "
                   "..., keys as the long options), the engine's in [server]; options given on the command line "
                   "override it.")
@setting_options(BlockdevConfig)
@setting_options(_EngineSettings, rename=RENAME, help_prefix=lambda name: "" if name in ANY_BACKEND else "[embedded] ")
def serve(config_file, **opts):
    """Serve a block device over NBD until Ctrl-C or SIGTERM.

    Each block (--block-size bytes, 4 KiB by default) is one key, PREFIX + the block number
    (nbd:kvstore:0, nbd:kvstore:1, ...); a block never written, trimmed or zeroed is no key at all
    and reads as zeros. Once listening, one line per listener goes to stdout:

    \b
      kvstore blockdev listening on nbd://127.0.0.1:10809/kvstore
      kvstore blockdev listening on nbd+unix:///kvstore?socket=PATH

    \b
    Examples:
      kvstore blockdev serve --size 4G --durability disk --data-dir /srv/blk
      kvstore blockdev serve --size 4G --backend memcached://127.0.0.1:11211 --unix /tmp/kv.sock
      nbdfuse /mnt/kv/disk nbd://127.0.0.1:10809/kvstore &  losetup -f --show /mnt/kv/disk

    With --backend embedded (the default) the engine runs in this process: its settings are the
    [embedded] options below, as `kvstore serve` takes them (--server-threads is serve's
    --threads), and it serves RESP on --bind:--port too (redis-cli INFO blockdev). A FLUSH (or a write
    with FUA) returns once every write before it is durable as --durability says. With a kvstore
    node in disk or remote mode the same holds there; Redis and memcached keep blocks in memory
    only: FLUSH returns at once and promises nothing across their restart."""
    names = {f.name for f in BlockdevConfig.settings()}
    own = {k: v for k, v in opts.items() if k in names}
    engine = {RENAME_BACK.get(k, k): v for k, v in opts.items() if k not in names}
    cfg = scfg = None
    try:
        cfg = BlockdevConfig.load(config_file, **own)
        embedded = cfg.backend_scheme == "embedded"
        given = [k for k, v in engine.items() if v is not None and k not in ANY_BACKEND]
        if not embedded and given:
            flag = "--" + RENAME.get(given[0], given[0]).replace("_", "-")
            raise ConfigError(f"{flag}: the engine's settings apply to --backend embedded only; {redact(cfg.backend)} "
                              "is configured where it runs")
        for field in ServerConfig.settings():  # sizes parsed here, so that a refusal names the flag
            if field.metadata["type"] is SIZE and engine.get(field.name) is not None:
                engine[field.name] = parse_size(engine[field.name], "--" + field.name.replace("_", "-"))
        if embedded:
            engine.update({k: getattr(cfg, k) for k in SHARED_TLS if own.get(k) is not None})
            scfg = ServerConfig.load(config_file, **engine)
        else:
            scfg = ServerConfig.load(None, **{k: engine[k] for k in ANY_BACKEND})
        log.configure(scfg.log_level, scfg.log_file)
        log.logger.info("kvstore %s block device starting, pid %d", kvstore.__version__, os.getpid())
        log.logger.info("block device: %s", " ".join(f"{f.name}={redact(str(getattr(cfg, f.name)))!r}"
                                                     for f in BlockdevConfig.settings()))
        if embedded:
            os.makedirs(scfg.data_dir, exist_ok=True)
            dev = BlockDevice(config=cfg, server_config=scfg)
        else:
            dev = BlockDevice(config=cfg)
    except (KVError, OSError) as e:
        _fail_logged(scfg, e)
    _serve_forever(dev, cfg, scfg)


main.add_command(blockdev)


def _flush_line(cfg, scfg):
    """(logging level, text): what an NBD FLUSH means with this backend."""
    scheme = cfg.backend_scheme
    if scheme == "embedded":
        level, text = _durability_line(scfg)
        return level, f"FLUSH and FUA wait for the engine's durability: {text}"
    if scheme == "kvstore":
        return logging.INFO, ("FLUSH and FUA: the kvstore node holds each write's reply until it is durable in "
                              "its durability mode (disk, remote); in mode none nothing survives its restart")
    return logging.WARNING, (f"FLUSH and FUA return at once: {scheme} keeps blocks in memory only, so a flushed "
                             f"block does not survive a restart of {scheme}"
                             + (" (and memcached may evict blocks unless run with -M)" if scheme == "memcached"
                                else ""))


def _serve_forever(dev, cfg, scfg):
    def ready(dev):
        level, text = _flush_line(cfg, scfg)
        log.logger.log(level, "%s", text)
        where = (f"{cfg.size} bytes in blocks of {cfg.block_size}, backend {redact(cfg.backend)}, "
                 f"{cfg.effective_threads} threads, key prefix {cfg.effective_key_prefix!r}"
                 + (", read-only" if cfg.read_only else ""))
        if dev.server is not None:
            where += f", RESP on {scfg.bind}:{dev.server.port}"
        log.logger.info("block device ready: %s", where)
        # stdout: the lines scripts and tests wait for (the log may be in a file)
        for uri in dev.uris:
            click.echo(f"kvstore blockdev listening on {uri}")
        sys.stdout.flush()

    try:
        dev.serve_forever(on_ready=ready)
    except KVError as e:
        _fail_logged(scfg, e)
    log.logger.info("block device stopped")
