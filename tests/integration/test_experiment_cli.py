"""`kvstore experiment list/run/plot`, run as the installed command: the registry lists
every experiment; a run writes its CSV and PNG into a fresh ./kvstore-results/NAME-<time>
(or --out DIR, or $KVSTORE_RESULTS), never into results/ unless --update-results; plot
redraws a PNG from a CSV; --help shows every default; an unknown name is refused with the
known names."""
import argparse
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


def kvstore(*args, env=None, cwd=None, timeout=240):
    e = {k: v for k, v in os.environ.items() if k != "KVSTORE_RESULTS"}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "kvstore.cli", "experiment", *args], capture_output=True,
                          text=True, timeout=timeout, env=e, cwd=cwd)


def snapshot(d):
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*")}


def test_list_shows_every_experiment():
    r = kvstore("list")
    assert r.returncode == 0, r.stderr
    lines = {ln.split()[0]: ln.split()[1] for ln in r.stdout.splitlines()}
    assert lines == {e.name: e.paper for e in experiments.EXPERIMENTS}
    assert len(experiments.EXPERIMENTS) == len(list(ROOT.glob("experiments/[pk]*_*.py")))


@pytest.fixture
def no_env_out(monkeypatch):
    monkeypatch.delenv("KVSTORE_RESULTS", raising=False)


@pytest.mark.parametrize("e", experiments.EXPERIMENTS, ids=lambda e: e.name)
def test_every_experiment_has_the_interface(e, no_env_out, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mod = e.module()
    assert mod.NAME == e.name and (ROOT / "experiments" / f"{e.name}.py").exists()
    for f in ("add_args", "measure", "draw", "main"):
        assert callable(getattr(mod, f)), f"{e.name} has no {f}"
    args = common.parse_args(mod, list(mod.QUICK))  # the quick arguments are the experiment's own
    assert args.csv.endswith(f"{e.name}.csv") and args.png.endswith(f"{e.name}.png")
    assert Path(args.out).parent == Path("kvstore-results") and Path(args.out).name.startswith(e.name + "-")
    assert not list(tmp_path.iterdir()), "parsing the arguments created files"


@pytest.mark.parametrize("e", experiments.EXPERIMENTS, ids=lambda e: e.name)
def test_help_shows_every_default(e):
    ap = common.parser(e.module())
    text = ap.format_help()
    assert "--out DIR" in text and "--update-results" in text and "kvstore-results" in text
    for a in ap._actions:
        if a.default not in (None, False, "", argparse.SUPPRESS):
            assert "default" in a.help, f"{e.name} {a.option_strings}: no default in its help"


@pytest.mark.skipif(not shutil.which("gcc"), reason="gcc builds the LDU benchmark")
def test_quick_run_writes_into_a_fresh_directory_not_results(tmp_path):
    before = snapshot(RESULTS)
    r = kvstore("run", CHEAP, "--quick", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = list((tmp_path / "kvstore-results").glob(f"{CHEAP}-*"))
    assert len(out) == 1, r.stderr
    assert f"results go to kvstore-results/{out[0].name}" in r.stderr
    rows = common.read_csv(out[0] / f"{CHEAP}.csv")
    assert {r["read_pct"] for r in rows} == {"50", "1"}  # QUICK's ratios, not the full run's four
    assert (out[0] / f"{CHEAP}.png").read_bytes().startswith(PNG_MAGIC)
    assert snapshot(RESULTS) == before, "a quick run touched results/"


@pytest.mark.skipif(not shutil.which("gcc"), reason="gcc builds the LDU benchmark")
def test_quick_run_honours_out_and_passes_options_on(tmp_path):
    r = kvstore("run", CHEAP, "--quick", "--tag", "t", "--ratios", "10", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = common.read_csv(tmp_path / "o" / f"{CHEAP}_t.csv")
    assert {r["read_pct"] for r in rows} == {"10"}  # options after NAME override QUICK's
    assert (tmp_path / "o" / f"{CHEAP}_t.png").read_bytes().startswith(PNG_MAGIC)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


def test_kvstore_results_is_the_default_out(tmp_path):
    shutil.copy(RESULTS / f"{CHEAP}.csv", tmp_path)
    r = kvstore("plot", CHEAP, env={"KVSTORE_RESULTS": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / f"{CHEAP}.png").read_bytes().startswith(PNG_MAGIC)


def test_update_results_means_the_repository_results(no_env_out):
    mod = experiments.find(CHEAP).module()
    args = common.parse_args(mod, ["--update-results", "--tag", "x"])
    assert Path(args.out) == RESULTS and Path(args.csv) == RESULTS / f"{CHEAP}_x.csv"


def test_quick_with_update_results_is_refused(tmp_path):
    before = snapshot(RESULTS)
    r = kvstore("run", CHEAP, "--quick", "--update-results", cwd=tmp_path)
    assert r.returncode == 2
    assert "would replace the full-scale results in results/" in r.stderr
    assert snapshot(RESULTS) == before and not list(tmp_path.iterdir())


def test_out_and_update_results_exclude_each_other(tmp_path):
    r = kvstore("run", CHEAP, "--out", str(tmp_path), "--update-results", cwd=tmp_path)
    assert r.returncode == 2 and "not allowed with argument" in r.stderr
    assert not list(tmp_path.iterdir())


def test_resume_needs_the_run_to_continue(no_env_out, capsys):
    mod = experiments.find("p002_flexpoll").module()
    with pytest.raises(SystemExit) as e:
        common.parse_args(mod, ["--resume"])
    assert e.value.code == 2
    assert "--resume and --rerun continue an earlier run: give its --out DIR" in capsys.readouterr().err


def test_plot_redraws_the_png_from_the_csv_in_out(tmp_path):
    shutil.copy(RESULTS / f"{CHEAP}.csv", tmp_path)
    r = kvstore("plot", CHEAP, "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / f"{CHEAP}.png").read_bytes().startswith(PNG_MAGIC)
    assert f"wrote {tmp_path / CHEAP}.png" in r.stderr


def test_plot_by_default_reads_the_committed_csv_and_writes_elsewhere(tmp_path):
    before = snapshot(RESULTS)
    r = kvstore("plot", CHEAP, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    pngs = list((tmp_path / "kvstore-results").glob(f"{CHEAP}-*/{CHEAP}.png"))
    assert len(pngs) == 1 and pngs[0].read_bytes().startswith(PNG_MAGIC), r.stderr
    assert snapshot(RESULTS) == before, "plot touched results/"


def test_plot_without_a_csv_says_so(tmp_path):
    r = kvstore("plot", CHEAP, "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode != 0
    assert f"no {tmp_path / 'o' / CHEAP}.csv to plot" in r.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("verb", ["run", "plot"])
def test_unknown_name_is_refused_with_the_known_names(verb, tmp_path):
    r = kvstore(verb, "table1_archs", cwd=tmp_path)
    assert r.returncode == 2
    assert "unknown experiment 'table1_archs'; known: " in r.stderr
    for e in experiments.EXPERIMENTS:
        assert e.name in r.stderr
    assert not list(tmp_path.iterdir())
