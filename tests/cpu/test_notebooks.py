"""Every notebook runs top to bottom without a GPU (nbclient, kernel python3), its GPU cells saying in
one line that they skipped, and is committed without outputs; notebooks/run_as_script.py runs one
without Jupyter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIGURES = {"01_quickstart.ipynb": 1, "02_overlap_explained.ipynb": 3, "03_performance_report.ipynb": 3,
           "04_tensor_parallel.ipynb": 2}  # figures each draws without a GPU
NOTEBOOKS = sorted(FIGURES)

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
    assert images >= FIGURES[name], f"{name} drew {images} figures"
    text = ["".join(o.get("text", "")) for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    for out in text:  # a skipped GPU cell says so in one line, and nothing else
        if out.startswith("no GPU"):
            assert out.count("\n") <= 1, f"{name}: a skipped cell printed more than one line: {out!r}"


def test_every_notebook_is_listed_and_described():
    assert sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb")) == NOTEBOOKS
    readme = (ROOT / "notebooks" / "README.md").read_text()
    assert all(name in readme for name in NOTEBOOKS)


def _run_script(path, tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", MPLBACKEND="agg",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, str(ROOT / "notebooks" / "run_as_script.py"), str(path), "--figures", str(tmp_path / "figs")],
                          capture_output=True, text=True, env=env, timeout=300)


def test_run_as_script_runs_cells_in_order_and_names_the_failing_one(tmp_path):
    cells = ["%matplotlib inline\nfrom IPython.display import display\nx = 1", "print('x is', x)\nx += 1",
             "raise RuntimeError(f'stop at x={x}')", "print('never')"]
    nb = {"cells": [{"cell_type": "markdown", "source": "# t", "metadata": {}}]
          + [{"cell_type": "code", "source": c, "metadata": {}, "outputs": [], "execution_count": None} for c in cells],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "t.ipynb"
    path.write_text(json.dumps(nb))
    r = _run_script(path, tmp_path)
    assert r.returncode == 1 and "x is 1" in r.stdout and "never" not in r.stdout
    assert "stop at x=2" in r.stderr and "code cell 3 failed" in r.stderr


def test_quickstart_runs_as_a_plain_script(tmp_path):
    pytest.importorskip("matplotlib", reason="the notebook draws with matplotlib (pip install matplotlib)")
    r = _run_script(ROOT / "notebooks" / "01_quickstart.ipynb", tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "no GPU: skipped the CUDA graph" in r.stdout and "TypeError: a has dtype f32" in r.stdout
    assert len(list((tmp_path / "figs").glob("*.png"))) >= FIGURES["01_quickstart.ipynb"]
