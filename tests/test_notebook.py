"""notebooks/explore_results.ipynb: committed without outputs, and it runs (nbclient, a kernel on
this interpreter) on the committed example, drawing the per-position and speedup figures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "explore_results.ipynb"
EXAMPLE = ROOT / "reports" / "example" / "results.json"


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert all(not c.metadata.get("execution") for c in nb.cells)


@pytest.fixture
def kernel_on_this_python(tmp_path, monkeypatch) -> str:
    """A kernelspec that starts ipykernel with this interpreter (the installed `python3` spec runs
    whatever `python` is first on PATH)."""
    import json

    from ipykernel.kernelspec import install

    path = Path(install(kernel_name="draftfit-test", prefix=str(tmp_path)))
    assert json.loads((path / "kernel.json").read_text())["argv"][0] == sys.executable
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))
    return "draftfit-test"


def test_notebook_runs_on_the_example(kernel_on_this_python, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("DRAFTFIT_RESULTS", str(EXAMPLE))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, kernel_name=kernel_on_this_python, timeout=300,
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 3  # marginal, conditional, speedup
    text = "".join(o.get("text", "") for o in outputs) + "".join(o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "configurations of" in text and "position" in text and "concurrency" in text
