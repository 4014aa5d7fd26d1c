"""Sessions 19-22's instruments for the k loop's cost per k block compile as they must: the ring probes
(RAWFLUX_PROBE 64 ... 32768, config.cuh), RAWFLUX_CODE_PAD, and the trace build without its per-k-block wait
sums (RAWFLUX_TRACE_BLOCK_WAITS=0) and with the phase stamps (RAWFLUX_TRACE_PHASE) on the 128x256 tile they were used on, without spills or
serialized wgmma; probe 128 alone is refused at compile time; benchmarks/wgmma_peak.py's kernels
compile clean; benchmarks/gemm_kloop.py's compile pass. The GPU half (what they measured) is in
docs/gemm-notes.md, sessions 19 and 20."""
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
        # session 20: an active producer that touches no barrier, one that polls a dead or the live
        # barrier, no ring with a polling producer, and the code-placement pad
        ("-DRAWFLUX_TRACE=1", "-DRAWFLUX_TRACE_BLOCK_WAITS=0", "-DRAWFLUX_PROBE=1795"),
        ("-DRAWFLUX_TRACE=1", "-DRAWFLUX_TRACE_BLOCK_WAITS=0", "-DRAWFLUX_PROBE=2819"),
        ("-DRAWFLUX_TRACE=1", "-DRAWFLUX_TRACE_BLOCK_WAITS=0", "-DRAWFLUX_PROBE=4867"),
        ("-DRAWFLUX_TRACE=1", "-DRAWFLUX_TRACE_BLOCK_WAITS=0", "-DRAWFLUX_PROBE=8963"),
        ("-DRAWFLUX_TRACE=1", "-DRAWFLUX_TRACE_BLOCK_WAITS=0", "-DRAWFLUX_PROBE=16451"),
        ("-DRAWFLUX_TRACE=1", "-DRAWFLUX_TRACE_BLOCK_WAITS=0", "-DRAWFLUX_PROBE=32835"),
        ("-DRAWFLUX_TRACE=1", "-DRAWFLUX_TRACE_BLOCK_WAITS=0", "-DRAWFLUX_PROBE=3", "-DRAWFLUX_CODE_PAD=8192"),
        ("-DRAWFLUX_CODE_PAD=8192",),
        # session 22: the per-block phase stamps of both consumer warpgroups
        ("-DRAWFLUX_TRACE=1", "-DRAWFLUX_TRACE_BLOCK_WAITS=0", "-DRAWFLUX_TRACE_PHASE=1"),
        ("-DRAWFLUX_TRACE=1", "-DRAWFLUX_TRACE_BLOCK_WAITS=0", "-DRAWFLUX_TRACE_PHASE=1", "-DRAWFLUX_PROBE=771"),
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


def test_active_producer_probes_need_the_waits_only_ring():
    """1024 / 2048 / 4096 / 8192 replace the producer's waits: only where it neither waits for data
    nor marks stages full (512, 256, 2), else the consumers would wait forever."""
    pytest.importorskip("cuda.bindings.nvrtc")
    with pytest.raises(CompileError, match="need 512, 256 and 2"):
        compile_cubin(kernel_source("gemm.cu"), arch="sm_90a", name_expressions=(_name(),), filename="gemm.cu",
                      extra_options=("-DRAWFLUX_PROBE=1027",))


def test_code_pad_moves_only_the_producer():
    """RAWFLUX_CODE_PAD emits its never-executed stores (the cubin grows by at least the pad: 16 bytes
    of SASS each, plus their metadata) without changing the kernel's registers."""
    pytest.importorskip("cuda.bindings.nvrtc")
    name = _name()
    sizes = {}
    for pad in (0, 4096):
        res = compile_cubin(kernel_source("gemm.cu"), arch="sm_90a", name_expressions=(name,), filename="gemm.cu",
                            extra_options=(f"-DRAWFLUX_CODE_PAD={pad}",))
        sizes[pad] = (len(res.cubin), res.resources[res.lowered[name]]["registers"])
    assert sizes[0][1] == sizes[4096][1]
    assert sizes[4096][0] - sizes[0][0] >= 4096, sizes


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


def test_kloop_compile_pass(monkeypatch, capsys):
    """--jobs: every variant's kernel is built first (one short run each at the smallest k, at most
    `jobs` at a time), then the timed runs go one by one, each with its own defines."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import subprocess

    import gemm_kloop

    started, timed = [], []

    class FakePopen:
        def __init__(self, cmd, env, **kw):
            started.append((cmd[cmd.index("--cases") + 1], env["RAWFLUX_NVRTC_DEFINES"]))

        def wait(self, timeout=None):
            return 0

    def fake_run(cmd, env, **kw):
        timed.append(env["RAWFLUX_NVRTC_DEFINES"])
        ks = [int(c.split(",")[2]) for c in cmd[cmd.index("--cases") + 1].split(";")]
        out = "".join(f"   per tile (median CTA, SM cycles): loop {1039 * k // 64 + 5000}  epilogue 1\n" for k in ks)
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(gemm_kloop.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(gemm_kloop.subprocess, "run", fake_run)
    assert gemm_kloop.main(["--sms", "132", "--jobs", "2", "--variants", "a|;b|RAWFLUX_PROBE=3;c|RAWFLUX_PROBE=387"]) == 0
    assert [d for _, d in started] == ["", "RAWFLUX_PROBE=3", "RAWFLUX_PROBE=387"]
    assert all(c == "1536,2816,16384,128x256x64s4c2x1w2/k1/g8m/p0" for c, _ in started)
    assert timed == ["", "RAWFLUX_PROBE=3", "RAWFLUX_PROBE=387"]
    out = capsys.readouterr().out
    assert out.count("1039.0") == 3, out


def _phase_stamps(nkb, group, turn, skew=0):
    """Synthetic RAWFLUX_TRACE_PHASE stamps: warpgroups 1 and 0 take turns on the pipe, each group
    `group` cycles long; a warpgroup is ready `turn` cycles after its previous completion and issues
    40 cycles later (warpgroup 0 `skew` cycles later still)."""
    import numpy as np

    from gemm_phase import BLOCKS, DONE, ISSUED, KINDS, READY

    st = np.zeros((16, 2, KINDS, BLOCKS), dtype=np.int64)
    t = 10_000
    free = t
    prev_done = {0: t - 2 * group, 1: t - group}
    for i in range(nkb):
        for wg in (1, 0):
            ready = prev_done[wg] + turn + (skew if wg == 0 else 0)
            issued = ready + 40
            start = max(issued, free)
            done = start + group
            st[:, wg, READY, i], st[:, wg, ISSUED, i], st[:, wg, DONE, i] = ready, issued, done
            prev_done[wg] = free = done
    st[:, :, :, :nkb] = (st[:, :, :, :nkb] + (1 << 32) - 15_000) % (1 << 32)  # the SM clock wraps: the analysis must not care
    st[3] = 0  # a CTA past the recorded ones: left out
    return st


def test_phase_analysis():
    """benchmarks/gemm_phase.py's reading of the stamps: a busy pipe (the next group issued before the
    previous ends) has no bubble and exec = the group's time; a late issue shows as a bubble."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import numpy as np
    from gemm_phase import analyse

    busy = analyse(_phase_stamps(200, group=520, turn=150), nkb=200, skip=10)
    assert np.all(busy["exec"] == 520) and not busy["bubble_hi"].any() and not busy["bubble_lo"].any()
    assert np.all(busy["period"] == 1040) and np.all(busy["d"] == -520)
    assert np.all(busy["turn0"] == 150) and np.all(busy["issue1"] == 40)
    late = analyse(_phase_stamps(200, group=520, turn=150, skew=400), nkb=200, skip=10)
    assert late["bubble_hi"].max() == 70 and late["bubble_lo"].max() == 30  # 150 + 400 + 40 - 520, 150 + 400 - 520
    assert np.all(late["exec"] == 520)
    assert np.all(late["period"] == 1040 + 70)
    empty = analyse(np.zeros((16, 2, 3, 2048), dtype=np.uint32), nkb=200, skip=10)
    assert empty["period"].size == 0


def test_phase_snapshot_counts():
    """--snapshot: how far each warpgroup got, counted from the stamps present."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import numpy as np
    from gemm_phase import BLOCKS, DONE, ISSUED, KINDS, READY, last_blocks

    st = np.zeros((16, 2, KINDS, BLOCKS), dtype=np.uint32)
    st[0, 0, READY, :10] = st[0, 0, ISSUED, :10] = st[0, 0, DONE, :9] = 7
    st[0, 1, READY, :12] = st[0, 1, ISSUED, :11] = st[0, 1, DONE, :11] = 9
    assert last_blocks(st, 64) == [(0, 0, 10, 10, 9), (0, 1, 12, 11, 11)]
