"""notebooks/02 and 03 run top to bottom without a GPU (nbclient, kernel python3), and are committed
without outputs."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ["02_overlap_explained.ipynb", "03_performance_report.ipynb"]

try:
    import ipykernel  # noqa: F401
    import nbclient
    import nbformat
except ImportError as e:  # pragma: no cover - CI without the notebook extras
    _MISSING = f"notebook tests need nbclient, nbformat and ipykernel (pip install nbclient nbformat ipykernel): {e}"
else:
    _MISSING = None


@pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_clean(name):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{name}: clear the outputs before committing"


@pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_without_gpu(name, monkeypatch):
    pytest.importorskip("matplotlib", reason="the notebooks draw with matplotlib (pip install matplotlib)")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU: the notebooks must not need one
    monkeypatch.setenv("MPLBACKEND", "agg")
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{name} failed:\n{e}")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("output_type") == "error"]
    assert not errors, errors
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert images >= 3, f"{name} drew {images} figures"
