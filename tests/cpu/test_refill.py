"""The consumer refill (RAWFLUX_REFILL, on by default; gemm/mainloop_sm90.cuh, kRefill), on the CPU:

- which kernels take it (mirrored here from gemm_kernel's kRefill): the wide tiles (a k block of
  at least 128 x 224) without multicast or in the 2x1 pair, under a prologue that allows it (the
  plain GEMM and GEMM-ReduceScatter; not AG-GEMM, whose chunk wait orders only the producer's loads);
- the switch changes exactly those kernels: with RAWFLUX_REFILL=0 their code differs and the others
  keep theirs;
- they compile without spills or serialized wgmma (check_kernels covers every variant; these are
  the large-m picks, both layouts, and the k-split pair);
- the shared memory the host reserves holds the release counts (GemmCfg::kBarrierBytes).

The GPU side: output bits equal to RAWFLUX_REFILL=0 over 84 configurations (tiles, both layouts,
ragged m, split-K, stream-K, several tiles per CTA) and the k-loop rates are in docs/gemm-notes.md
(session 23); tests/gpu/test_gemm.py checks every tile against float64.
"""
from __future__ import annotations

import pytest

from rawflux import tune
from rawflux.check_kernels import _WGMMA_SERIALIZED
from rawflux.jit import compile_cubin, kernel_source
from rawflux.ops import gemm as g
from rawflux.runtime import DType

from .test_epi_defer import _code


def _tile(tag):
    return tune.parse_tag(tag + "/k1/g8m/p0").tile


def _refills(t, prologue: str = "rawflux::NoWait") -> bool:
    """gemm_kernel's kRefill for a default build (wait_group 0, no probe, static tile order)."""
    wide = t.bm * t.bn >= 128 * 224
    shape_ok = t.cluster_m * t.cluster_n == 1 or (t.cluster_m, t.cluster_n) == (2, 1)
    return wide and shape_ok and prologue != "rawflux::AgWait"


def _compile(t, out=DType.BF16, layout="nk", *, file="gemm.cu", sched=g.PLAIN_SCHED, prologue="rawflux::NoWait", epilogue=None):
    name = g.kernel_name(t, DType.BF16, out, layout, sched=sched, prologue=prologue, epilogue=epilogue or g.plain_epilogue(out))
    r = compile_cubin(kernel_source(file), arch="sm_90a", name_expressions=(name,), filename=file)
    return r, r.resources[r.lowered[name]]


def test_which_kernels_refill():
    assert _refills(_tile("128x256x64s4c2x1w2")) and _refills(_tile("128x256x64s4c1w2"))
    assert _refills(_tile("128x320x64s4c2x1w2")) and _refills(_tile("128x224x64s5c2x1w2"))
    assert _refills(_tile("128x256x64s4c1k2w2"))  # a k-split pair: no multicast, each CTA its own k half
    # narrow tiles: a k block too short to cover the refill's one-block delay where they run
    assert not any(_refills(_tile(tag)) for tag in ("128x192x64s5c2x1w2", "128x96x64s8c1w2", "64x256x64s5c1w2", "64x128x64s8c1w2"))
    assert not _refills(_tile("128x256x64s4c2x1w2"), "rawflux::AgWait")


def test_switch_changes_only_the_refilling_kernels(monkeypatch):
    ag = dict(file="ag_gemm.cu", sched=g.FUSED_SCHED, prologue="rawflux::AgWait", epilogue="rawflux::TmaStore")
    cases = [(_tile("128x256x64s4c2x1w2"), {}), (_tile("128x256x64s4c1w2"), {}), (_tile("128x192x64s5c2x1w2"), {}),
             (_tile("128x256x64s4c2x1w2"), ag)]
    on = [_code(_compile(t, **kw)[0].cubin) for t, kw in cases]
    monkeypatch.setenv("RAWFLUX_NVRTC_DEFINES", "RAWFLUX_REFILL=0")
    off = [_code(_compile(t, **kw)[0].cubin) for t, kw in cases]
    for (t, kw), a, b in zip(cases, on, off):
        assert (a != b) == _refills(t, kw.get("prologue", "rawflux::NoWait")), (t.tag(), kw)


@pytest.mark.parametrize("tag", ["128x256x64s4c2x1w2", "128x320x64s4c2x1w2", "128x256x64s4c1k2w2"])
def test_refilling_variants_compile_clean(tag):
    t = _tile(tag)
    for out, layout in ((DType.BF16, "nk"), (DType.F16, "kn")):
        if not t.supports(layout):
            continue
        r, res = _compile(t, out, layout)
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0 and res["stack"] == 0, (tag, out, layout, res)
        assert _WGMMA_SERIALIZED not in r.log


def test_shared_memory_holds_the_counts():
    """After the 1024-aligned ring: full[] and empty[] (8 bytes per stage each), the k-split pair's
    two barriers, then one u32 release count per stage, all inside TileConfig.smem_bytes (whose 1024
    bytes of slack the alignment may take) and before any epilogue scratch (kScratchOffset = ring +
    1024)."""
    for t in (*tune.TILES, *tune.KSPLIT_TILES):
        ring = t.stages * (t.bm + t.bn) * tune.BK * 2
        counts_end = 16 * t.stages + 16 + 4 * t.stages
        assert t.smem_bytes == 1024 + ring + counts_end <= tune.SMEM_PER_CTA, t.tag()
        assert counts_end <= 1024
        for out in (DType.BF16, DType.F32):
            assert g.launch_smem_bytes(t, g.plain_epilogue(out), out) >= t.smem_bytes
