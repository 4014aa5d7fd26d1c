"""The pipeline options of each engine variant, GemmCfg's kRefill / kDeferBoxes / kStoreBufs
(gemm/config.cuh), on the CPU:

- the host's rule (engine.kernel_options) gives each tile the options measured best on the H200
  (docs/decisions.md): the consumer refill for the wide tiles without multicast or in the 2x1 pair,
  never under AG-GEMM's prologue; a deferred box where ptxas has room; staging buffers that fit;
- the options are real template parameters: flipping one changes the variant's machine code and
  still compiles clean (what a tuner may choose), and an option the kernel cannot run is refused by
  the host before any compile and by the kernel's static_asserts;
- the box packing is the stmatrix order TmaStore's store always used (a Python model of the fragment);
- the shared memory the host reserves holds the refill's release counts.

Every default variant is compiled by rawflux.check_kernels; its SASS is the one the kernel had
before the options became template parameters (benchmarks/tools/sass_snapshot.py).
"""
from __future__ import annotations

import struct

import pytest

import rawflux  # noqa: F401  (the op modules register their variants)
from rawflux import engine, tune
from rawflux.check_kernels import _WGMMA_SERIALIZED
from rawflux.engine import KernelOptions
from rawflux.jit import CompileError, compile_cubin, kernel_source
from rawflux.runtime import DType

AG = "rawflux::AgWait"


def _tile(tag):
    return tune.parse_tag(tag + "/k1/g8m/p0").tile


def _opts(tag, out=DType.BF16, prologue=engine.NOWAIT):
    t = _tile(tag)
    return engine.kernel_options(t, prologue, engine.plain_epilogue(out), out)


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


def _compile(tag, options=None, out=DType.BF16, layout="nk"):
    t = _tile(tag)
    name = engine.kernel_name(t, DType.BF16, out, layout, sched=engine.PLAIN_SCHED, epilogue=engine.plain_epilogue(out),
                              options=options)
    r = compile_cubin(kernel_source("gemm.cu"), arch="sm_90a", name_expressions=(name,), filename="gemm.cu")
    return r, r.resources[r.lowered[name]]


def test_which_kernels_refill():
    for tag in ("128x256x64s4c2x1w2", "128x256x64s4c1w2", "128x320x64s4c2x1w2", "128x224x64s5c2x1w2", "128x256x64s4c1k2w2"):
        assert _opts(tag).refill, tag
    # narrower tiles: a k block too short to cover the refill's one-block delay where they run
    for tag in ("128x192x64s5c2x1w2", "128x96x64s8c1w2", "64x256x64s5c1w2", "64x128x64s8c1w2"):
        assert not _opts(tag).refill, tag
    assert not _opts("128x256x64s4c2x1w2", prologue=AG).refill  # its chunk wait orders only the producer's loads


def test_which_tiles_defer():
    assert _opts("128x192x64s5c2x1w2").defer_boxes == 1 and _opts("64x256x64s5c1w2").defer_boxes == 1
    assert _opts("128x256x64s4c2x1w2").defer_boxes == 0  # the plain GEMM's pair: the refill instead (both spill)
    assert _opts("128x256x64s4c2x1w2", prologue=AG).defer_boxes == 1  # AG-GEMM's pair keeps it
    assert _opts("128x256x64s4c1w2").defer_boxes == 0  # 20 bytes of spills with it
    assert _opts("128x320x64s4c2x1w2").defer_boxes == 0  # no staging room, 160 accumulators
    assert _opts("128x256x64s4c2x1w2", DType.F32).defer_boxes == 0  # LocalStore
    assert all(engine.kernel_options(t, engine.NOWAIT, engine.TMA_STORE_EPI, DType.BF16).defer_boxes == 0 for t in tune.KSPLIT_TILES)
    # narrow columns wait for each wgmma group in their own branch: AG-GEMM's narrow pair drops its box
    pair = _tile("128x256x64s4c2x1w2")
    assert engine.kernel_options(pair, AG, engine.TMA_STORE_EPI, DType.BF16, narrow=True) == KernelOptions(False, 0, 2)
    assert engine.kernel_options(pair, engine.NOWAIT, engine.TMA_STORE_EPI, DType.BF16, narrow=True) == _opts("128x256x64s4c2x1w2")
    for w in tune.NARROW_WIDTHS:
        name = engine.kernel_name(pair, DType.BF16, DType.BF16, "nk", sched=engine.narrow_sched(w), prologue=AG,
                                  epilogue=engine.TMA_STORE_EPI)
        assert f"GemmCfg<128,256,64,4,2,1,2,0,0,0,1,0,0,2>, rawflux::NarrowSched<{w}>" in name, name


def test_staging_buffers():
    assert _opts("128x256x64s4c2x1w2").store_bufs == 2
    assert _opts("128x320x64s4c2x1w2").store_bufs == 0  # the ring fills shared memory
    assert _opts("128x224x64s5c2x1w2").store_bufs == 0  # 224 columns are not whole 64-column boxes
    assert _opts("128x256x64s4c2x1w2", DType.F32).store_bufs == 0
    for t in (*tune.TILES, *tune.KSPLIT_TILES):
        for out in (DType.BF16, DType.F32):
            o = engine.kernel_options(t, engine.NOWAIT, engine.plain_epilogue(out), out)
            engine.check_options(o, t, engine.NOWAIT, engine.plain_epilogue(out), out)  # the rule only makes valid options


def test_options_are_template_parameters_a_tuner_may_flip():
    """Refill off on the plain 128x256 pair, the deferred box off on the 128x192 pair: other code,
    still clean (no spill, no serialized wgmma)."""
    pytest.importorskip("cuda.bindings.nvrtc")
    for tag, flip in (("128x256x64s4c2x1w2", lambda o: KernelOptions(False, o.defer_boxes, o.store_bufs)),
                      ("128x192x64s5c2x1w2", lambda o: KernelOptions(o.refill, 0, o.store_bufs))):
        base = _opts(tag)
        r0, _ = _compile(tag)
        r1, res = _compile(tag, flip(base))
        assert _code(r0.cubin) != _code(r1.cubin), tag
        assert res["spill_stores"] == 0 and res["stack"] == 0 and _WGMMA_SERIALIZED not in r1.log, (tag, res)


def test_invalid_options_are_refused_by_host_and_kernel():
    pair = _tile("128x256x64s4c2x1w2")
    with pytest.raises(ValueError, match="refill"):
        engine.check_options(KernelOptions(True, 0, 2), pair, AG, engine.TMA_STORE_EPI, DType.BF16)
    with pytest.raises(ValueError, match="staging buffers"):
        engine.check_options(KernelOptions(False, 0, 2), pair, engine.NOWAIT, engine.LOCAL_STORE_EPI, DType.F32)
    with pytest.raises(ValueError, match="do not fit"):
        engine.check_options(KernelOptions(False, 0, 1), _tile("128x128x64s7c1w2"), engine.NOWAIT, engine.TMA_STORE_EPI,
                             DType.BF16)  # seven stages fill shared memory
    with pytest.raises(ValueError, match="deferred boxes"):
        engine.check_options(KernelOptions(False, 1, 0), pair, engine.NOWAIT, engine.TMA_STORE_EPI, DType.BF16)
    with pytest.raises(ValueError, match="narrow columns"):
        engine.check_options(KernelOptions(False, 1, 2), pair, AG, engine.TMA_STORE_EPI, DType.BF16, narrow=True)
    pytest.importorskip("cuda.bindings.nvrtc")
    with pytest.raises(CompileError, match="deferred boxes are staged boxes"):
        _compile("128x256x64s4c2x1w2", KernelOptions(True, 1, 0))


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
            assert engine.launch_smem_bytes(t, engine.plain_epilogue(out), out) >= t.smem_bytes
