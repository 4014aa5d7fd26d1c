"""The box-wise epilogue with deferred boxes (RAWFLUX_EPI_DEFER, gemm/mainloop_sm90.cuh + TmaStore
in gemm/policies.cuh), on the CPU: the measured settings compile with the spills they are known to
have (none where it could land) and no serialized wgmma, the switch changes only the plain GEMM's
16-bit TmaStore kernels (it really is compiled in: their code differs from the default's), and the
box packing is the mapping TmaStore::store and the register path use (a Python model of the
fragment layout).
"""
from __future__ import annotations

import struct

import pytest

from rawflux import tune
from rawflux.check_kernels import _WGMMA_SERIALIZED
from rawflux.jit import compile_cubin, kernel_source
from rawflux.ops import gemm as g
from rawflux.runtime import DType

# The large-m picks with staging room (128x320 has none and 160 accumulators: never box-wise).
# 128x256 without a cluster spills 20 bytes with a deferred box (docs/gemm-notes.md, session 15).
TAGS = ["128x256x64s4c2x1w2", "128x192x64s5c2x1w2"]


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


def _compile(tag, out=DType.BF16, layout="nk"):
    t = tune.parse_tag(tag + "/k1/g8m/p0").tile
    name = g.kernel_name(t, DType.BF16, out, layout, sched=g.PLAIN_SCHED, epilogue=g.plain_epilogue(out))
    r = compile_cubin(kernel_source("gemm.cu"), arch="sm_90a", name_expressions=(name,), filename="gemm.cu")
    return r, r.resources[r.lowered[name]]


# (deferred boxes, boxes stored from registers) measured in session 15, and the spill bytes ptxas
# leaves in 128x256 (held boxes beside 128 accumulators): one deferred box fits; with two, or one
# beside two register-stored boxes (their 64-bit row pointers), it spills.
SETTINGS = {(1, 0): 0, (0, 2): 0, (0, 4): 0, (1, 2): 16}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("tag", TAGS)
def test_boxwise_variants_compile(tag, setting, monkeypatch):
    defer, direct = setting
    monkeypatch.setenv("RAWFLUX_NVRTC_DEFINES",
                       f"RAWFLUX_EPI_DEFER=1 RAWFLUX_EPI_DEFER_BOXES={defer} RAWFLUX_EPI_DIRECT_BOXES={direct}")
    for out, layout in ((DType.BF16, "nk"), (DType.F16, "kn")):
        r, res = _compile(tag, out, layout)
        most = SETTINGS[setting] if "128x256" in tag else 0
        assert res["spill_stores"] <= most and res["spill_loads"] <= most and res["stack"] <= most, (tag, out, layout, res)
        assert _WGMMA_SERIALIZED not in r.log


def test_defer_is_compiled_in_only_where_it_applies(monkeypatch):
    def cubins():
        return {
            "tma": _code(_compile("128x256x64s4c2x1w2")[0].cubin),  # TmaStore, 128 accumulators
            "f32": _code(_compile("128x256x64s4c2x1w2", DType.F32)[0].cubin),  # LocalStore: not deferred
        }

    base = cubins()
    monkeypatch.setenv("RAWFLUX_NVRTC_DEFINES", "RAWFLUX_EPI_DEFER=1")
    on = cubins()
    assert on["tma"] != base["tma"]
    assert on["f32"] == base["f32"]


def test_box_packing_covers_the_fragment_once():
    """pack_box (a staged box) hands stmatrix the pairs store() packs: box c, matrix group q, register j
    is pack2(acc[32 c + 8 q + 2 j], acc[... + 1]), i.e. TmaStore::store's acc[4 jb + 2 j] with
    jb = 8 c + 2 q; and every accumulator of a 128-register fragment lands in exactly one box."""
    acc_regs = 128
    seen = []
    for c in range(acc_regs // 32):
        v = [(32 * c + 2 * i, 32 * c + 2 * i + 1) for i in range(16)]  # pack_box, a staged box
        for q in range(4):
            jb = 8 * c + 2 * q
            want = [(4 * jb + 2 * j, 4 * jb + 2 * j + 1) for j in range(4)]  # store()
            assert v[4 * q:4 * q + 4] == want
        seen += [x for pair in v for x in pair]
    assert sorted(seen) == list(range(acc_regs))
    # a box stored from registers: box c takes n8-block quads g = 2c, 2c + 1, as store_rows_16's columns 8 (4 g + q)
    cols = sorted(64 * c + 8 * (4 * h + q) for c in range(acc_regs // 32) for h in range(2) for q in range(4))
    assert cols == sorted(8 * (4 * gq + q) for gq in range(acc_regs // 16) for q in range(4))
