"""benchmarks/tools/gemm_compare.py: per-point ratios of benchmarks/gemm.py runs against the faster
cuBLAS of the same run, and each run's median difference to the first."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gemm_compare", ROOT / "benchmarks" / "tools" / "gemm_compare.py")
gc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gc)


def _row(impl, m, tflops, dtype="bf16", config=None):
    return {"impl": impl, "m": m, "n": 8192, "k": 8192, "dtype": dtype, "tflops": tflops, "config": config}


def test_ratio_is_against_the_faster_cublas_of_the_same_run():
    rows = [_row("torch.matmul", 1024, 800.0), _row("cupy.matmul", 1024, 750.0), _row("rawflux", 1024, 720.0, config="t"),
            _row("torch.matmul", 2048, 700.0), _row("cupy.matmul", 2048, 760.0), _row("rawflux", 2048, 760.0),
            _row("rawflux-tuned", 2048, 800.0),  # another impl: not the rawflux row
            _row("rawflux", 4096, 500.0)]  # no cuBLAS row at this point: left out, not divided by zero
    r = gc.ratios(rows)
    assert r == {("bf16", 1024, 8192, 8192): (0.9, "t"), ("bf16", 2048, 8192, 8192): (1.0, "")}
    assert gc.ratios(rows, impl="rawflux-tuned") == {("bf16", 2048, 8192, 8192): (800.0 / 760.0, "")}


def test_dtypes_are_separate_points():
    rows = [_row("torch.matmul", 64, 100.0, "bf16"), _row("rawflux", 64, 90.0, "bf16"),
            _row("torch.matmul", 64, 200.0, "f16"), _row("rawflux", 64, 100.0, "f16")]
    assert gc.ratios(rows) == {("bf16", 64, 8192, 8192): (0.9, ""), ("f16", 64, 8192, 8192): (0.5, "")}


def test_summary_against_the_first_run():
    a = {("bf16", m, 1, 1): (0.90 + 0.01 * i, "") for i, m in enumerate((1, 2, 3, 4))}
    b = {p: (v + (0.02 if p[1] != 4 else -0.01), "") for p, (v, _) in a.items()}
    b[("bf16", 9, 1, 1)] = (0.5, "")  # only in b: in its median, not in the differences
    table, summary = gc.compare({"a": a, "b": b})
    assert len(table) == 1 + 5 and "-" in table[-1]
    assert summary[0] == "a: 4 points, median 0.915, lowest 0.900"
    assert "b: 5 points" in summary[1] and "on 4 common points: median +0.020, 3 above / 1 below" in summary[1]


def test_cli_errors(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert gc.main([str(bad)]) == 2
    assert "cannot read a gemm.py result" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gc.main([str(bad), str(bad), "--labels", "a"])
    with pytest.raises(SystemExit):
        gc.main([str(bad), str(bad), "--labels", "a,a"])
