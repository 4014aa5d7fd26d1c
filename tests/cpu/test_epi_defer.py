"""The deferred C box (RAWFLUX_EPI_DEFER, on by default; gemm/mainloop_sm90.cuh, TmaStore in
gemm/policies.cuh), on the CPU:

- which tiles defer a box (TmaStore::defer_boxes, mirrored here from the rule in policies.cuh) and
  that those variants compile without spills or serialized wgmma (check_kernels covers all of
  them; these are the large-m picks and the one where ptxas could not fit it);
- the switch changes exactly the deferring kernels: with RAWFLUX_EPI_DEFER=0 their code differs,
  and the kernels that do not defer (f32 C, 128x256 without a cluster, 128x320, and since the
  consumer refill the plain GEMM's 128x256 pair: tests/cpu/test_refill.py) keep the same code;
- the box packing is the stmatrix order store() always used (a Python model of the fragment).
"""
from __future__ import annotations

import struct

import pytest

from rawflux import tune
from rawflux.check_kernels import _WGMMA_SERIALIZED
from rawflux.jit import compile_cubin, kernel_source
from rawflux.ops import gemm as g
from rawflux.runtime import DType


def _code(cubin: bytes) -> bytes:
    """The machine code of a cubin: its .text sections (the rest carries build strings)."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    secs = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_off = secs[shstrndx][4]
    out = b""
    for name, _, _, _, off, size in secs:
        end = cubin.index(b"\0", names_off + name)
        if cubin[names_off + name:end].startswith(b".text"):
            out += cubin[off:off + size]
    assert out, "no .text section"
    return out


def _compile(t, out=DType.BF16, layout="nk"):
    name = g.kernel_name(t, DType.BF16, out, layout, sched=g.PLAIN_SCHED, epilogue=g.plain_epilogue(out))
    r = compile_cubin(kernel_source("gemm.cu"), arch="sm_90a", name_expressions=(name,), filename="gemm.cu")
    return r, r.resources[r.lowered[name]]


def _defers(t, out=DType.BF16, refill: bool = True) -> bool:
    """gemm_kernel's kDeferBoxes > 0: TmaStore::defer_boxes<Cfg>() (staging room, at most 128
    accumulators, no k-split pair, 128 accumulators only in a 2-CTA cluster: ptxas spills elsewhere),
    except where 128 accumulators meet the consumer refill (the plain GEMM's 128x256 pair;
    refill=False: AG-GEMM's prologue, which takes no refill)."""
    staged = g.epilogue_scratch_bytes(t, g.plain_epilogue(out), out) > 0
    acc = t.wn // 2
    wide = t.bm * t.bn >= 128 * 224 and (t.cluster_size == 1 or (t.cluster_m, t.cluster_n, t.cluster_k) == (2, 1, 1))
    return staged and acc <= 128 and t.cluster_k == 1 and not (acc == 128 and (t.cluster_size != 2 or (refill and wide)))


def _tile(tag):
    return tune.parse_tag(tag + "/k1/g8m/p0").tile


def test_which_tiles_defer():
    assert _defers(_tile("128x192x64s5c2x1w2")) and _defers(_tile("64x256x64s5c1w2"))
    assert not _defers(_tile("128x256x64s4c2x1w2"))  # the plain GEMM's pair: the consumer refill instead
    assert _defers(_tile("128x256x64s4c2x1w2"), refill=False)  # AG-GEMM's pair keeps it
    assert not _defers(_tile("128x256x64s4c1w2"))  # 20 bytes of spills with it
    assert not _defers(_tile("128x320x64s4c2x1w2"))  # no staging room, 160 accumulators
    assert not _defers(_tile("128x256x64s4c2x1w2"), DType.F32)  # LocalStore
    assert not any(_defers(t) for t in tune.KSPLIT_TILES)


@pytest.mark.parametrize("tag", ["128x256x64s4c2x1w2", "128x192x64s5c2x1w2", "128x256x64s4c1w2"])
def test_large_m_variants_compile_clean(tag):
    t = _tile(tag)
    for out, layout in ((DType.BF16, "nk"), (DType.F16, "kn")):
        r, res = _compile(t, out, layout)
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0 and res["stack"] == 0, (tag, out, layout, res)
        assert _WGMMA_SERIALIZED not in r.log


def test_switch_changes_only_the_deferring_kernels(monkeypatch):
    cases = [(_tile("128x192x64s5c2x1w2"), DType.BF16), (_tile("128x256x64s4c2x1w2"), DType.BF16),
             (_tile("128x256x64s4c2x1w2"), DType.F32),
             (_tile("128x256x64s4c1w2"), DType.BF16), (_tile("128x320x64s4c2x1w2"), DType.BF16)]
    on = [_code(_compile(t, out)[0].cubin) for t, out in cases]
    monkeypatch.setenv("RAWFLUX_NVRTC_DEFINES", "RAWFLUX_EPI_DEFER=0")
    off = [_code(_compile(t, out)[0].cubin) for t, out in cases]
    for (t, out), a, b in zip(cases, on, off):
        assert (a != b) == _defers(t, out), (t.tag(), out)


def test_box_packing_is_stmatrix_order():
    """pack_box hands stmatrix, for box c, matrix group q and register j, pack2(acc[32 c + 8 q + 2 j],
    acc[... + 1]): the pairs of n8 block jb = 8 c + 2 q + j / 2 (acc[4 jb + 2 (j % 2)]), as the
    fragment layout (ptx/wgmma.cuh) puts 8 columns per n8 block, rows r and r + 8 in its two pairs;
    every accumulator of a 128-register fragment lands in exactly one box."""
    acc_regs = 128
    seen = []
    for c in range(acc_regs // 32):
        v = [(32 * c + 2 * i, 32 * c + 2 * i + 1) for i in range(16)]  # pack_box
        for q in range(4):
            for j in range(4):
                jb = 8 * c + 2 * q + j // 2
                assert v[4 * q + j] == (4 * jb + 2 * (j % 2), 4 * jb + 2 * (j % 2) + 1)
        seen += [x for pair in v for x in pair]
    assert sorted(seen) == list(range(acc_regs))
