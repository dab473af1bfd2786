"""The notebooks (one per reproduced paper) run from top to bottom at their small
scale, so they cannot rot: each calls the experiment code and draws its plots."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two cells of ~1 min each here, several times that beside a CPU hog
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("KVSTORE_NOTEBOOK_SCALE", "small")
    monkeypatch.setenv("KVSTORE_RESULTS", str(tmp_path))  # never over the committed results
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, f"{path.name} drew no plot"
    assert list(tmp_path.glob("*.csv")), f"{path.name} wrote no CSV"


def test_every_reproduced_paper_has_a_notebook():
    names = {p.name.split("_")[0] for p in NOTEBOOKS}
    assert {"000", "002"} <= names


def test_notebooks_are_committed_with_outputs():
    """Each experiment cell keeps the plot of the run it was committed with (readable
    without running anything)."""
    nbformat = pytest.importorskip("nbformat")
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        runs = [c for c in nb.cells if c.cell_type == "code" and "notebook_run(" in c.source]
        assert runs, f"{path.name} runs no experiment"
        for c in runs:
            assert any("image/png" in o.get("data", {}) for o in c.outputs), \
                f"{path.name}: a cell has no plot: execute and save it (see notebooks/README.md)"
