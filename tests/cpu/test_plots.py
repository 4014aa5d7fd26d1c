"""rawflux.bench.plots without a GPU: every figure's series equal the fixture's numbers, emulated
runs are titled as such and never share axes with real runs, the schedule draws W owners."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install matplotlib)")

from rawflux.bench import plots  # noqa: E402
from rawflux.bench.report import SCHEMA  # noqa: E402

MS = [64, 128, 256]


def _series(ax) -> dict:
    """label -> (xs, ys) of the labelled (non-guide) lines."""
    return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()
            if not ln.get_label().startswith("_")}


def _gemm_rows():
    rows = []
    for i, m in enumerate(MS):
        for n, k in ((1024, 2048), (4096, 512)):
            base = 100.0 + 10 * i + n / 1024
            rows += [
                {"op": "gemm", "impl": "torch.matmul", "m": m, "n": n, "k": k, "dtype": "bf16", "ms": 1.0, "tflops": base},
                {"op": "gemm", "impl": "cupy.matmul", "m": m, "n": n, "k": k, "dtype": "bf16", "ms": 1.0, "tflops": base + 5},
                {"op": "gemm", "impl": "rawflux", "m": m, "n": n, "k": k, "dtype": "bf16", "ms": 1.0,
                 "tflops": (base + 5) * (0.9 + 0.05 * i)},
                {"op": "gemm", "impl": "rawflux", "m": m, "n": n, "k": k, "dtype": "f16", "ms": 1.0, "tflops": 1.0},
            ]
    return rows


def _tax():
    rows = [{"op": "gemm_rs", "world": w, "shape": s, "m": m, "n": 1024, "k": 512, "dtype": "bf16", "fused_ms": 1.0,
             "gemm_ms": 1.0, "ratio": 1.0 + 0.01 * w + 0.001 * m / 64 + (0.1 if s == "b" else 0.0), "same_tile_gemm_ms": 1.0}
            for w in (2, 4) for s in ("a", "b") for m in MS]
    return {"kind": "fusion-tax", "bar": 1.03, "rows": rows}


IMPLS = (("nccl+cublas", "nonoverlap"), ("torch.matmul", "gemm"), ("nccl_reduce_scatter", "comm"), ("rawflux", "fused"),
         ("torch.symm_mem", "fused"))


def _bench(emulated: bool, world: int = 2) -> dict:
    recs = []
    for i, m in enumerate(MS):
        for j, (impl, role) in enumerate(IMPLS):
            recs.append({"op": "gemm_rs", "impl": impl, "role": role, "label": "tiny", "world": world, "m": m, "n": 1024,
                         "k": 512, "dtype": "bf16", "ms": 0.1 * (i + 1) + 0.01 * j + (1.0 if emulated else 0.0),
                         "tflops": None, "gpu": "NVIDIA H200", "driver": "x", "commit": "abc", "date": "2026-01-01T00:00:00",
                         "emulated": emulated, "ranks_per_gpu": world if emulated else 1})
    recs.append({**recs[0], "op": "barrier", "impl": "group.barrier", "role": "barrier", "label": "barrier", "m": 0, "n": 0,
                 "k": 0})
    return {"schema": SCHEMA, "meta": {"argv": ["x"]}, "records": recs}


def _results(tmp_path):
    (tmp_path / "gemm.json").write_text(json.dumps({"rows": _gemm_rows()}))
    (tmp_path / "fusion-tax.json").write_text(json.dumps(_tax()))
    (tmp_path / "bench-emu-w2.json").write_text(json.dumps(_bench(True)))
    (tmp_path / "bench-w2.json").write_text(json.dumps(_bench(False)))
    return tmp_path


def test_import_rawflux_does_not_import_matplotlib():
    code = "import sys, rawflux, rawflux.bench.plots; sys.exit('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_gemm_figure_draws_the_ratio_per_shape():
    rows = _gemm_rows()
    fig = plots.gemm_figure(rows)
    (ax,) = fig.axes
    got = _series(ax)
    assert set(got) == {"1024 x 2048", "4096 x 512"}  # bf16 only: the f16 rows have no cuBLAS partner
    for (n, k), label in (((1024, 2048), "1024 x 2048"), ((4096, 512), "4096 x 512")):
        want = []
        for m in MS:
            best = max(r["tflops"] for r in rows if r["impl"] in plots.CUBLAS and (r["m"], r["n"], r["k"]) == (m, n, k))
            mine = next(r["tflops"] for r in rows if r["impl"] == "rawflux" and r["dtype"] == "bf16"
                        and (r["m"], r["n"], r["k"]) == (m, n, k))
            want.append(mine / best)
        assert got[label][0] == MS
        assert got[label][1] == pytest.approx(want)
    assert ax.get_xscale() == "log"


def test_fusion_tax_figure_one_subplot_per_world():
    d = _tax()
    fig = plots.fusion_tax_figure(d)
    assert [ax.get_title() for ax in fig.axes] == ["W = 2", "W = 4"]
    for ax, w in zip(fig.axes, (2, 4)):
        got = _series(ax)
        assert set(got) == {"a", "b"}
        for s in ("a", "b"):
            assert got[s][0] == MS
            assert got[s][1] == pytest.approx([r["ratio"] for r in d["rows"] if r["world"] == w and r["shape"] == s])
        bar = [ln for ln in ax.get_lines() if ln.get_label().startswith("_bar")]
        assert len(bar) == 1 and list(bar[0].get_ydata()) == [1.03, 1.03] and bar[0].get_linestyle() == "--"


def test_fusion_tax_figure_per_op_and_the_link_figure(tmp_path):
    d = _tax()
    ag = [r | {"op": "ag_gemm", "ratio": r["ratio"] + 1.0} for r in d["rows"] if r["world"] == 2]
    d = d | {"bar": {"gemm_rs": 1.03, "ag_gemm": 1.02}, "rows": d["rows"] + ag}
    fig = plots.fusion_tax_figure(d, "ag_gemm")
    (ax,) = fig.axes
    assert "AllGather-GEMM" in fig._suptitle.get_text()
    assert _series(ax)["a"][1] == pytest.approx([r["ratio"] for r in ag if r["shape"] == "a"])
    (bar,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("_bar")]
    assert list(bar.get_ydata()) == [1.02, 1.02]
    link = {"kind": "ag-link-emu", "bar": 1.03, "rows": [r | {"link_gbps": 370.0} for r in ag]}
    (tmp_path / "fusion-tax.json").write_text(json.dumps(d))
    (tmp_path / "ag-link-emu.json").write_text(json.dumps(link))
    (tmp_path / "gemm.json").write_text(json.dumps({"rows": _gemm_rows()}))
    titles = [t for t, _ in plots.performance_report(tmp_path)]
    assert any(t.startswith("GEMM-ReduceScatter fusion tax") for t in titles)
    assert any(t.startswith("AllGather-GEMM fusion tax") for t in titles)
    assert any(t.startswith("AllGather-GEMM behind the link emulator") for t in titles)


def test_fused_figures_series_and_emulated_titles(tmp_path):
    real, emu = _bench(False), _bench(True)
    (tmp_path / "r.json").write_text(json.dumps(real))
    (tmp_path / "e.json").write_text(json.dumps(emu))
    figs = plots.fused_figures([tmp_path / "r.json", tmp_path / "e.json"])
    assert len(figs) == 2  # the barrier rows draw nothing
    (t_real, f_real), (t_emu, f_emu) = figs
    assert plots.EMULATED_TITLE == "emulated node (correctness only)"
    assert plots.EMULATED_TITLE in t_emu and plots.EMULATED_TITLE in f_emu._suptitle.get_text()
    assert all(plots.EMULATED_TITLE in ax.get_title() for ax in f_emu.axes if ax.get_visible())
    assert plots.EMULATED_TITLE not in t_real and plots.EMULATED_TITLE not in f_real._suptitle.get_text()
    for fig, d in ((f_real, real), (f_emu, emu)):
        (ax,) = [a for a in fig.axes if a.get_visible()]
        got = _series(ax)
        assert len(got) == len(IMPLS)
        for impl, role in IMPLS:
            (label,) = [lb for lb in got if lb.startswith(impl + " (")]
            assert got[label][0] == MS
            assert got[label][1] == pytest.approx([r["ms"] for r in d["records"] if r["impl"] == impl])
        assert any("torch async-TP" in lb for lb in got) and any("non-overlapped" in lb for lb in got)


def test_a_mixed_file_is_split_never_drawn_together(tmp_path):
    mixed = _bench(False)
    mixed["records"] += [r for r in _bench(True)["records"] if r["op"] != "barrier"]
    figs = plots.fused_figures([mixed])
    assert len(figs) == 2
    emus = [fig.rawflux_emulated for _, fig in figs]
    assert sorted(emus) == [False, True]
    for title, fig in figs:
        ys = [y for ax in fig.axes for ln in ax.get_lines() for y in ln.get_ydata()]
        if fig.rawflux_emulated:
            assert plots.EMULATED_TITLE in title and min(ys) > 1.0  # only the emulated records (ms > 1)
        else:
            assert plots.EMULATED_TITLE not in title and max(ys) < 1.0


def test_performance_report_finds_everything(tmp_path):
    figs = plots.performance_report(_results(tmp_path))
    titles = [t for t, _ in figs]
    assert titles[0].startswith("rawflux.gemm against cuBLAS, bf16")
    assert any("fusion tax" in t for t in titles)
    fused = [t for t in titles if t.startswith("gemm_rs")]
    assert len(fused) == 2 and plots.EMULATED_TITLE in fused[-1] and plots.EMULATED_TITLE not in fused[0]


@pytest.mark.parametrize("world", [2, 4])
def test_schedule_figure_draws_world_owners(world):
    fig = plots.schedule_figure(world, 512, 2048, 1024)
    d = fig.rawflux_data
    p = d["prediction"]
    ax_a, ax_b, ax_c = fig.axes[:3]
    img = ax_a.get_images()[0].get_array()
    owners = {int(v) for v in img.compressed()}
    assert owners == set(range(world))
    assert img.shape == (p.clusters[0], p.waves[0])
    # every owner holds exactly T cluster tiles of rank 0's order
    assert all(int((img == o).sum()) == p.per_owner for o in range(world))
    own = _series(ax_a)["own tile (rank 0)"]
    assert len(own[0]) == p.per_owner and all(img[int(c), int(w)] == 0 for w, c in zip(*own))
    # own tiles are one wave late: none in wave 0 (the delay is the grid's clusters)
    assert min(own[0]) >= 1 or p.waves[0] == 1
    links = _series(ax_b)
    assert {lb for lb in links if lb.startswith("link")} == {f"link 0 -> {o}" for o in range(1, world)}
    mib = 1 / (1 << 20)
    assert links["link 0 -> 1"][1] == pytest.approx([lw[0][1] * mib for lw in p.link_bytes])
    c = _series(ax_c)
    assert c["predicted (+ launch)"][0] == [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert c["predicted (+ launch)"][1] == pytest.approx([x + p.launch_us for x in c["max(T_gemm, T_link)"][1]])
    i = c["predicted (+ launch)"][0].index(512)
    assert c["predicted (+ launch)"][1][i] == pytest.approx(p.predicted_us)


def test_bench_plot_writes_pngs_next_to_the_json(tmp_path):
    pytest.importorskip("matplotlib")
    import shutil
    from pathlib import Path

    from rawflux.bench.cli import plot_run

    src = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "bench-w2-gemm_rs.json"
    shutil.copy(src, tmp_path)
    pngs = plot_run(tmp_path / src.name)
    assert pngs and all(p.parent == tmp_path and p.suffix == ".png" and p.stat().st_size > 10_000 for p in pngs)


def test_host_cost_figure_one_subplot_per_world_and_m(tmp_path):
    recs = [dict(op=op, form=form, world=w, m=m, host_us=us + w + m / 100, bar_us=bar, emulated=w > 1)
            for w in (1, 2) for m in (16, 128)
            for op, form, us, bar in (("torch", "matmul", 14.0, None), ("gemm_rs", "object", 12.0, 15.0), ("ag_gemm", "object", 70.0, 15.0))]
    d = {"kind": "host-cost", "records": recs}
    data = plots.host_cost_data(d)
    assert list(data) == [(1, 16), (1, 128), (2, 16), (2, 128)]
    assert [c for c, _, _ in data[(2, 16)]] == ["torch matmul", "ag_gemm object", "gemm_rs object"]
    fig = plots.host_cost_figure(d)
    assert len(fig.axes) == 4 and "ranks sharing one GPU" in fig._suptitle.get_text()
    bars = fig.axes[2].patches
    assert [b.get_height() for b in bars] == pytest.approx([16.16, 72.16, 14.16])
    assert bars[1].get_facecolor() != bars[2].get_facecolor()  # over its bar vs within it
    (tmp_path / "host-cost.json").write_text(json.dumps(d))
    assert [t for t, _ in plots.performance_report(tmp_path)] == ["Host time per call (host-cost.json)"]
