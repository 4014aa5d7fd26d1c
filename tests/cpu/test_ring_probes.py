"""Session 19's instruments for the k loop's cost per k block compile as they must: the ring probes
(RAWFLUX_PROBE 64 / 128 / 256 / 512, config.cuh) and the trace build without its per-k-block wait
sums (RAWFLUX_TRACE_BLOCK_WAITS=0) on the 128x256 tile they were used on, without spills or
serialized wgmma; probe 128 alone is refused at compile time; benchmarks/wgmma_peak.py's kernels
compile clean. The GPU half (what they measured) is in docs/gemm-notes.md, session 19."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rawflux import tune
from rawflux.jit import CompileError, compile_cubin, kernel_source
from rawflux.ops import gemm as g
from rawflux.runtime import DType

ROOT = Path(__file__).resolve().parents[2]


def _name():
    t = next(t for t in tune.TILES if (t.bm, t.bn, t.cluster_m, t.cluster_k) == (128, 256, 2, 1))
    return g.kernel_name(t, DType.BF16, DType.BF16, "nk", sched=g.PLAIN_SCHED, epilogue=g.plain_epilogue(DType.BF16))


@pytest.mark.parametrize(
    "defines",
    [
        ("-DRAWFLUX_TRACE=1", "-DRAWFLUX_TRACE_BLOCK_WAITS=0"),
        ("-DRAWFLUX_TRACE=1", "-DRAWFLUX_TRACE_BLOCK_WAITS=0", "-DRAWFLUX_PROBE=67"),
        ("-DRAWFLUX_TRACE=1", "-DRAWFLUX_TRACE_BLOCK_WAITS=0", "-DRAWFLUX_PROBE=387"),
        ("-DRAWFLUX_TRACE=1", "-DRAWFLUX_TRACE_BLOCK_WAITS=0", "-DRAWFLUX_PROBE=771"),
    ],
)
def test_ring_probe_builds_compile_clean(defines):
    pytest.importorskip("cuda.bindings.nvrtc")
    name = _name()
    res = compile_cubin(kernel_source("gemm.cu"), arch="sm_90a", name_expressions=(name,), filename="gemm.cu", extra_options=defines)
    r = res.resources[res.lowered[name]]
    assert r["spill_stores"] == 0 and r["stack"] == 0, (defines, r)
    assert "serialized" not in res.log and "C75" not in res.log, (defines, res.log)


def test_probe_128_needs_256():
    """Without 256 the consumers would wait for parities the producer's phases already passed."""
    pytest.importorskip("cuda.bindings.nvrtc")
    with pytest.raises(CompileError, match="PROBE 128 needs 256"):
        compile_cubin(kernel_source("gemm.cu"), arch="sm_90a", name_expressions=(_name(),), filename="gemm.cu",
                      extra_options=("-DRAWFLUX_PROBE=131",))


def test_wgmma_peak_kernels_compile_clean():
    pytest.importorskip("cuda.bindings.nvrtc")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import wgmma_peak

    names = tuple("wgmma_peak<%s>" % ",".join(map(str, v)) for v in wgmma_peak.VARIANTS.values())
    res = compile_cubin(wgmma_peak.SRC, arch="sm_90a", name_expressions=names, filename="wgmma_peak.cu")
    for n in names:
        r = res.resources[res.lowered[n]]
        assert r["spill_stores"] == 0 and r["stack"] == 0, (n, r)
    assert "serialized" not in res.log and "C75" not in res.log, res.log


def test_kloop_tool_shapes_and_slope():
    """benchmarks/gemm_kloop.py: one tile per SM (cluster rows even), the least-squares slope, and the
    line it parses from gemm_trace.py."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gemm_kloop

    assert gemm_kloop.one_tile_per_sm(128, 256, 2, 132) == (1536, 2816)  # 12 x 11 tiles, session 19's shape
    m, n = gemm_kloop.one_tile_per_sm(128, 192, 1, 132)
    assert (m // 128) * (n // 192) == 132
    with pytest.raises(ValueError):
        gemm_kloop.one_tile_per_sm(128, 256, 2, 131)
    assert gemm_kloop.slope([256, 1024], [266731.0, 1064687.0]) == pytest.approx(1039.0, abs=0.1)
    assert gemm_kloop.slope([64, 128, 256], [1024.0 * b + 7 for b in (64, 128, 256)]) == pytest.approx(1024.0)
    line = "   per tile (median CTA, SM cycles): loop 133378  epilogue 2193 (1.62 %)"
    assert gemm_kloop.LOOP.search(line).group(1) == "133378"
