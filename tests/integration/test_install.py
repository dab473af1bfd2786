"""How kvstore is installed and started (the Makefile): `import kvstore`, `python -m kvstore.cli`
and the `kvstore` script get this checkout's built package from any directory, the clone's
parent (where the clone is a folder named kvstore) included; `make run` passes PORT,
DATA_DIR and ARGS to `kvstore serve`."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = Path(sys.executable).parent / "kvstore"  # the venv's console script


def run(argv, cwd, timeout=60):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    return subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env)


@pytest.fixture
def parent_dir(tmp_path):
    """A directory holding a folder named kvstore that is the repository (as the clone's
    parent directory is when the clone is named kvstore)."""
    (tmp_path / "kvstore").symlink_to(ROOT, target_is_directory=True)
    return tmp_path


IMPORT = ("import kvstore, kvstore.cli.main, kvstore.experiments; "
          "s = kvstore.Store(); s.set(b'k', b'v'); assert s.get(b'k') == b'v'; print(kvstore.__file__)")


@pytest.mark.parametrize("where", ["parent", "root", "elsewhere"])
def test_import_gets_the_built_package(where, parent_dir, tmp_path_factory):
    cwd = {"parent": parent_dir, "root": ROOT, "elsewhere": tmp_path_factory.mktemp("elsewhere")}[where]
    r = run([sys.executable, "-c", IMPORT], cwd)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).resolve() == ROOT / "kvstore" / "__init__.py"


def test_the_command_works_from_the_parent_dir(parent_dir):
    for argv in ([sys.executable, "-m", "kvstore.cli", "--version"], [SCRIPT, "--version"]):
        r = run(argv, parent_dir)
        assert r.returncode == 0 and "kvstore, version" in r.stdout, (argv, r.stderr)
    r = run([SCRIPT, "serve", "--check-config", "--port", "7000"], parent_dir)
    assert r.returncode == 0 and "port = 7000" in r.stdout, r.stderr


def make_n(*args):
    """`make -n ARGS` in the repository: the commands make would run, none run (recursive
    makes dry-run too)."""
    r = subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_make_run_passes_port_data_dir_and_args():
    serve = [ln for ln in make_n("run") if "kvstore serve" in ln]
    assert serve == [".venv/bin/kvstore serve --port 6380 --data-dir data "], serve
    serve = [ln for ln in make_n("run", "PORT=7000", "DATA_DIR=/tmp/kv", "ARGS=--durability none --threads 2")
             if "kvstore serve" in ln]
    assert serve == [".venv/bin/kvstore serve --port 7000 --data-dir /tmp/kv --durability none --threads 2"], serve


def test_make_run_installs_serve_time_packages_only():
    """What `make run` may apt-get install: no reference servers, DPDK or promtool (those are
    `make test`'s)."""
    r = subprocess.run(["make", "-pn", "run"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    run_apt = next(ln for ln in r.stdout.splitlines() if ln.startswith("RUN_APT :="))
    test_apt = next(ln for ln in r.stdout.splitlines() if ln.startswith("TEST_APT :="))
    for heavy in ("redis-server", "memcached", "libdpdk-dev", "prometheus"):
        assert heavy not in run_apt.split() and heavy in test_apt.split(), heavy
