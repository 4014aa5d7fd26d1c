"""RAWFLUX_LOOP_ADDR (config.cuh, mainloop_sm90.cuh; 39 by default since session 12): the
consumers' k-loop addresses computed as offsets from values computed once. What the switch's bits
compute must equal what the loop at 0 (the loop before them) computes, for every compiled tile and
every stage, and the modes kept for A/B must compile without spills (the default's every variant is
compiled by rawflux.check_kernels)."""
from __future__ import annotations

import pytest

from rawflux import tune
from rawflux.jit import compile_cubin, kernel_source, variants

from tests.cpu.test_gemm_compile import _desc_step, _smem_desc

ROW = 128  # bytes of one 64-element k row (BK * 2)


def _desc_add(desc: int, units: int) -> int:
    """ptx::desc_add (ptx/wgmma.cuh)."""
    return (desc & 0xFFFFFFFF00000000) | (((desc & 0xFFFFFFFF) + units) & 0xFFFFFFFF)


def _rings():
    """(tile, b_layout, stages, A stage bytes, B stage bytes, ring base) of every compiled tile."""
    for t in (*tune.TILES, *tune.KSPLIT_TILES):
        for layout in ("nk", "kn"):
            if t.supports(layout):
                yield t, layout, t.stages, t.bm * ROW, t.bn * ROW


@pytest.mark.parametrize("base", [0, 16, 1024, 4096 + 16])  # the dynamic window's 1024-aligned ring start, as the kernel aligns it
def test_stage_descriptors_by_offset_equal_the_rebuilt_ones(base):
    base = (base + 1023) // 1024 * 1024
    for t, layout, stages, a_stage, b_stage in _rings():
        wg_n = t.consumers // (t.bm // 64)
        wn = t.bn // wg_n
        chunk = 64 * ROW  # kn: one 64-column chunk of BK rows
        for consumer in range(t.consumers):
            wm, wnn = consumer // wg_n, consumer % wg_n
            a0 = base + wm * 64 * ROW
            b0 = base + stages * a_stage + (wnn * wn * ROW if layout == "nk" else wnn * (wn // 64) * chunk)
            lbo = 16 if layout == "nk" else chunk
            da_ring, db_ring = _smem_desc(a0, 16, 1024), _smem_desc(b0, lbo, 1024)
            for s in range(stages):
                for kk in range(4):
                    # the loop at 0: the stage's address, its descriptor, then desc_step per k16 step
                    da = _desc_step(_smem_desc(a0 + s * a_stage, 16, 1024), kk * 32)
                    assert _desc_add(da_ring, s * (a_stage // 16) + kk * 2) == da, (t.tag(), layout, s, kk)
                    kstep = kk * 32 if layout == "nk" else kk * 16 * 128
                    db = _desc_step(_smem_desc(b0 + s * b_stage, lbo, 1024), kstep)
                    assert _desc_add(db_ring, s * (b_stage // 16) + kstep // 16) == db, (t.tag(), layout, s, kk)
            assert a_stage % 16 == 0 and b_stage % 16 == 0


def test_barrier_base_from_the_ring():
    """bar_addr0 = a_base0 - a_off + kStages * kStageBytes is full[0]: the barriers follow the stage
    ring (mainloop_sm90.cuh's shared layout), whatever the consumer's A offset."""
    for t, _, stages, a_stage, b_stage in _rings():
        ring = 4096
        full0 = ring + stages * (a_stage + b_stage)
        for wm in range(t.bm // 64):
            a_off = wm * 64 * ROW
            assert (ring + a_off) - a_off + stages * (a_stage + b_stage) == full0


@pytest.mark.parametrize("mode", ["0", "5", "7", "12", "37"])
def test_clean_modes_compile_without_spills(mode):
    """Modes 0, 5, 7, 12 and 37 compile every GEMM variant clean (checked by hand for all 224 in session 11);
    here a plain, an ag_gemm and a gemm_rs variant of the 2x1-cluster tiles, where ptxas is tightest."""
    pytest.importorskip("cuda.bindings.nvrtc")
    names = ("GemmCfg<128,256,64,4,2,1,2,0,0,0>, rawflux::StreamKSched, rawflux::NoWait, rawflux::TmaStore",
             "GemmCfg<128,224,64,5,2,1,2,0,0,0>, rawflux::TileSched, rawflux::AgWait, rawflux::TmaStore",
             "GemmCfg<128,320,64,4,2,1,2,0,2,0>, rawflux::TileSched, rawflux::NoWait, rawflux::ScatterStore<2>")
    for name in names:
        v = next(v for v in variants() if name in v.name_expr)
        res = compile_cubin(kernel_source(v.relpath), arch="sm_90a", name_expressions=(v.name_expr,), filename=v.relpath,
                            extra_options=tuple(v.extra_options) + (f"-DRAWFLUX_LOOP_ADDR={mode}",))
        r = res.resources[res.lowered[v.name_expr]]
        assert r["spill_stores"] == 0 and r["stack"] == 0 and "C7512" not in res.log, (mode, name, r)


def _generic(nkb: int, stage: int, phase: int, stages: int):
    """The generic k loop's (stage, parity, i) sequence, and the ring position after it."""
    seq = []
    for i in range(nkb):
        seq.append((stage, phase, i))
        stage += 1
        if stage == stages:
            stage, phase = 0, phase ^ 1
    return seq, (stage, phase)


def _rounds(nkb: int, stage: int, phase: int, stages: int):
    """RAWFLUX_LOOP_ADDR & 32 (mainloop_sm90.cuh): the generic loop until stage 0 comes round,
    whole rounds with constant stages, then the generic loop for the rest."""
    seq, i = [], 0
    while i < nkb and stage != 0:
        seq.append((stage, phase, i))
        i += 1
        stage += 1
        if stage == stages:
            stage, phase = 0, phase ^ 1
    while i + stages <= nkb:
        seq.extend((s, phase, i + s) for s in range(stages))
        i += stages
        phase ^= 1
    while i < nkb:
        seq.append((stage, phase, i))
        i += 1
        stage += 1
        if stage == stages:
            stage, phase = 0, phase ^ 1
    return seq, (stage, phase)


def test_unrolled_rounds_visit_the_ring_as_the_generic_loop():
    """Bit 32 must wait on the same (stage, parity) for every k block and leave the ring where the
    generic loop leaves it, for every ring depth compiled, every start and tile length; several
    tiles in a row carry the position over."""
    depths = sorted({t.stages for t in (*tune.TILES, *tune.KSPLIT_TILES)})
    for stages in depths:
        for stage in range(stages):
            for phase in (0, 1):
                for nkb in range(0, 3 * stages + 2):
                    assert _rounds(nkb, stage, phase, stages) == _generic(nkb, stage, phase, stages), (stages, stage, phase, nkb)
        pos_a = pos_b = (0, 0)
        for nkb in (5, 1, 2 * stages, 3, stages + 1, 0, 7):
            a, pos_a = _generic(nkb, *pos_a, stages)
            b, pos_b = _rounds(nkb, *pos_b, stages)
            assert a == b and pos_a == pos_b
