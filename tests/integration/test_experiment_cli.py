"""`kvstore experiment list/run/plot`, run as the installed command: the registry lists
every experiment, a quick run writes its CSV and PNG outside results/, plot redraws a
PNG from a CSV, an unknown name is refused with the known names."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore import experiments
from kvstore.experiments import common

ROOT = Path(__file__).resolve().parent.parent.parent
RESULTS = ROOT / "results"
CHEAP = "p003_ldu_rw_ratio"  # a C benchmark of a few 100 ms runs: the fastest experiment
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def kvstore(*args, env=None, timeout=240):
    e = {k: v for k, v in os.environ.items() if k != "KVSTORE_RESULTS"}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "kvstore.cli", "experiment", *args], capture_output=True,
                          text=True, timeout=timeout, env=e)


def snapshot(d):
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*")}


def test_list_shows_every_experiment():
    r = kvstore("list")
    assert r.returncode == 0, r.stderr
    lines = {ln.split()[0]: ln.split()[1] for ln in r.stdout.splitlines()}
    assert lines == {e.name: e.paper for e in experiments.EXPERIMENTS}
    assert len(experiments.EXPERIMENTS) == len(list(ROOT.glob("experiments/[pk]*_*.py")))


@pytest.mark.parametrize("e", experiments.EXPERIMENTS, ids=lambda e: e.name)
def test_every_experiment_has_the_interface(e):
    mod = e.module()
    assert mod.NAME == e.name and (ROOT / "experiments" / f"{e.name}.py").exists()
    for f in ("add_args", "measure", "draw", "main"):
        assert callable(getattr(mod, f)), f"{e.name} has no {f}"
    args = common.parse_args(mod, list(mod.QUICK))  # the quick arguments are the experiment's own
    assert args.csv.endswith(f"{e.name}.csv") and args.png.endswith(f"{e.name}.png")


@pytest.mark.skipif(not shutil.which("gcc"), reason="gcc builds the LDU benchmark")
def test_quick_run_writes_csv_and_png_outside_results(tmp_path):
    before = snapshot(RESULTS)
    r = kvstore("run", CHEAP, "--quick", env={"TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    out = list(tmp_path.glob(f"kv-{CHEAP}-*"))
    assert len(out) == 1, r.stderr
    assert f"results go to {out[0]}" in r.stderr
    rows = common.read_csv(out[0] / f"{CHEAP}.csv")
    assert {r["read_pct"] for r in rows} == {"50", "1"}  # QUICK's ratios, not the full run's four
    assert (out[0] / f"{CHEAP}.png").read_bytes().startswith(PNG_MAGIC)
    assert snapshot(RESULTS) == before, "a quick run touched results/"


@pytest.mark.skipif(not shutil.which("gcc"), reason="gcc builds the LDU benchmark")
def test_quick_run_honours_kvstore_results_and_passes_options_on(tmp_path):
    r = kvstore("run", CHEAP, "--quick", "--tag", "t", "--ratios", "10", env={"KVSTORE_RESULTS": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rows = common.read_csv(tmp_path / f"{CHEAP}_t.csv")
    assert {r["read_pct"] for r in rows} == {"10"}  # options after NAME override QUICK's
    assert (tmp_path / f"{CHEAP}_t.png").read_bytes().startswith(PNG_MAGIC)


def test_plot_redraws_the_png_from_the_csv(tmp_path):
    shutil.copy(RESULTS / f"{CHEAP}.csv", tmp_path)
    r = kvstore("plot", CHEAP, env={"KVSTORE_RESULTS": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / f"{CHEAP}.png").read_bytes().startswith(PNG_MAGIC)
    assert f"wrote {tmp_path / CHEAP}.png" in r.stderr


def test_plot_without_a_csv_says_so(tmp_path):
    r = kvstore("plot", CHEAP, env={"KVSTORE_RESULTS": str(tmp_path)})
    assert r.returncode != 0
    assert f"no {tmp_path / CHEAP}.csv to plot" in r.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("verb", ["run", "plot"])
def test_unknown_name_is_refused_with_the_known_names(verb, tmp_path):
    r = kvstore(verb, "table1_archs", env={"KVSTORE_RESULTS": str(tmp_path)})
    assert r.returncode == 2
    assert "unknown experiment 'table1_archs'; known: " in r.stderr
    for e in experiments.EXPERIMENTS:
        assert e.name in r.stderr
    assert not list(tmp_path.iterdir())
