"""The consumers' k-loop addressing (gemm/kernel.cuh), checked against the straightforward
computation it replaces: every stage's wgmma descriptors as the ring's stage-0 descriptors plus the
stage's offset (ptx::desc_add), full[0]'s address from the ring's base, and the k loop unrolled over
whole rounds of the ring visiting the same (stage, parity) for every k block as a plain loop, for
every compiled tile and ring depth."""
from __future__ import annotations

import pytest

from rawflux import tune

ROW = 128  # bytes of one 64-element k row (BK * 2)


def _smem_desc(addr: int, lbo: int, sbo: int) -> int:
    """ptx::smem_desc (ptx/wgmma.cuh), bit for bit."""
    return ((addr & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16) | (((sbo & 0x3FFFF) >> 4) << 32) | (1 << 62)


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
                    # the descriptor built from the k16 step's own shared address
                    da = _smem_desc(a0 + s * a_stage + kk * 32, 16, 1024)
                    assert _desc_add(da_ring, s * (a_stage // 16) + kk * 2) == da, (t.tag(), layout, s, kk)
                    kstep = kk * 32 if layout == "nk" else kk * 16 * 128
                    db = _smem_desc(b0 + s * b_stage + kstep, lbo, 1024)
                    assert _desc_add(db_ring, s * (b_stage // 16) + kstep // 16) == db, (t.tag(), layout, s, kk)
            assert a_stage % 16 == 0 and b_stage % 16 == 0


def test_barrier_base_from_the_ring():
    """bar_addr0 = a_base0 - a_off + kStages * kStageBytes is full[0]: the barriers follow the stage
    ring (gemm/kernel.cuh's shared layout), whatever the consumer's A offset."""
    for t, _, stages, a_stage, b_stage in _rings():
        ring = 4096
        full0 = ring + stages * (a_stage + b_stage)
        for wm in range(t.bm // 64):
            a_off = wm * 64 * ROW
            assert (ring + a_off) - a_off + stages * (a_stage + b_stage) == full0


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
    """The kernel's k loop: the generic loop until stage 0 comes round,
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
    """The unrolled rounds must wait on the same (stage, parity) for every k block and leave the ring where the
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
