"""CPU checks of the GEMM engine: every registered variant compiles for sm_90a with NVRTC, with no
register spills and no stack frame; the configuration logic only ever picks compiled variants."""
from __future__ import annotations

import random

import pytest

import rawflux  # noqa: F401  (the op modules register their variants)
from rawflux import engine as g
from rawflux import tune
from rawflux.check_kernels import _WGMMA_SERIALIZED
from rawflux.jit import compile_cubin, kernel_source, variants
from rawflux.runtime import DType

GEMM_VARIANTS = [v for v in variants() if v.relpath == "gemm.cu"]


def test_variants_registered():
    # every tile (and the k-split ones) x {bf16, f16} x {16-bit out, f32 out} x layouts it supports
    expect = sum(2 * 2 * sum(t.supports(l) for l in ("nk", "kn")) for t in (*tune.TILES, *tune.KSPLIT_TILES))
    expect += 2 * len(tune.NARROW_WIDTHS) * len(tune.NARROW_TILES)  # narrow columns: bf16 / f16, nk, 16-bit C
    assert len(GEMM_VARIANTS) == expect
    assert all(v.archs == ("sm_90a",) for v in GEMM_VARIANTS)


@pytest.mark.parametrize("v", GEMM_VARIANTS, ids=lambda v: v.name_expr.split("GemmCfg<")[1].split(">")[0])
def test_variant_compiles_without_spills(v):
    r = compile_cubin(kernel_source(v.relpath), arch="sm_90a", name_expressions=(v.name_expr,), filename=v.relpath)
    res = r.resources[r.lowered[v.name_expr]]
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0, res
    assert res["stack"] == 0, res
    assert res["registers"] <= 168, res  # 384 threads, 1 CTA per SM: the cap at entry (setmaxnreg moves it later)
    assert "C7508" not in r.log, "ptxas ignored setmaxnreg"
    # C7512 / C7519 and kin: ptxas made every wgmma wait for the previous one (registers, or a
    # commit / wait under a branch it cannot prove uniform): a silent 2-4x slowdown.
    assert _WGMMA_SERIALIZED not in r.log, [l for l in r.log.splitlines() if "serialized" in l]


def test_smem_fits_and_stages():
    for t in tune.TILES:
        assert t.smem_bytes <= tune.SMEM_PER_CTA
        assert t.stages >= 4, t


_GEMM_PARAM_FIELDS = ("m", "n", "k", "tiles_m", "tiles_n", "k_blocks", "splits", "kb_per_split", "group", "raster_n",
                      "seg_count", "seg_start", "sk_tiles", "a_box_rows", "a_tail_rows", "tail_splits", "narrow_from", "own_delay", "workspace",
                      "counters", "timeout_ns")


def test_params_layout():
    assert g.GEMM_PARAMS.size == 96  # sizeof(GemmParams) in config.cuh
    assert len(g.local_store_params(0x1000, 64)) == 32  # sizeof(LocalStore::Params)
    pytest.importorskip("cuda.bindings.nvrtc")
    sizes = {"i": 4, "Q": 8, "q": 8}
    codes = "".join(c * int(n or 1) for n, c in __import__("re").findall(r"(\d*)([iQq])", g.GEMM_PARAMS.format))
    assert len(codes) == len(_GEMM_PARAM_FIELDS)
    lines = ['#include "rawflux/gemm/config.cuh"', "namespace rawflux {",
             f'static_assert(sizeof(GemmParams) == {g.GEMM_PARAMS.size}, "GemmParams size");']
    off = 0
    for name, code in zip(_GEMM_PARAM_FIELDS, codes):
        off = -(-off // sizes[code]) * sizes[code]
        lines.append(f'static_assert(__builtin_offsetof(GemmParams, {name}) == {off}, "GemmParams.{name}");')
        off += sizes[code]
    lines += ["}  // namespace rawflux", "__global__ void params_probe() {}"]
    compile_cubin("\n".join(lines) + "\n", arch="sm_90a")


def test_heuristic_picks_compiled_variants():
    rng = random.Random(0)
    for sms in (132, 114, 78, 32, 14):
        dev = tune.DeviceInfo(sms=sms, cc=(9, 0), l2_bytes=50 << 20)
        for _ in range(200):
            m, n, k = rng.randint(1, 20000), 8 * rng.randint(1, 4096), 8 * rng.randint(1, 4096)
            for layout in ("nk", "kn"):
                cfg = tune.heuristic(m, n, k, layout, dev)
                assert cfg.tile in tune.TILES and cfg.tile.supports(layout)
                kb, per, splits = tune.split_plan(k, cfg.splits)
                assert (splits - 1) * per < kb <= splits * per  # every split owns >= 1 k block
                grid = g.grid_size(cfg, m, n, k, sms)
                assert 1 <= grid <= sms and grid % cfg.tile.cluster_size == 0


def test_model_charges_the_split_k_fix_up():
    """Split-K's fix-up (fp32 partials out and back, after the main loop) costs time per unit: at
    m = 256, n = k = 8192 on an H200 the unsplit 128x128 tile measured 62 us and 128x256 (cluster
    2x1) split in two 72 us (benchmarks/tools/gemm_timings.json),
    and the model must rank them so; splitting still wins where a k1 grid is a fraction of a wave."""
    dev = tune.DeviceInfo(sms=132, cc=(9, 0), l2_bytes=60 << 20)
    big = next(t for t in tune.TILES if (t.bm, t.bn, t.cluster_m) == (128, 256, 2))
    small = next(t for t in tune.TILES if (t.bm, t.bn) == (128, 128))
    assert tune.estimate_us(256, 8192, 8192, tune.GemmConfig(small), dev) < tune.estimate_us(256, 8192, 8192, tune.GemmConfig(big, tune.Decomp.split_k(2)), dev)
    one = tune.estimate_us(256, 8192, 8192, tune.GemmConfig(big), dev)
    two = tune.estimate_us(256, 8192, 8192, tune.GemmConfig(big, tune.Decomp.split_k(2)), dev)
    assert two > 0.5 * one + (1 + 2) * big.bm * big.bn * 4.0 / dev.fixup_bytes_per_s * 1e6 * 0.99
    pick = tune.heuristic(64, 8192, 28672, "nk", dev)
    assert pick.splits > 1 or pick.stream_k  # 64 x 8192: a k1 grid fills half the SMs


def test_kernel_name_matches_registry():
    t = next(iter(tune.TILES))
    for od in (DType.BF16, DType.F32):
        name = g.kernel_name(t, DType.BF16, od, "nk", sched=g.PLAIN_SCHED, epilogue=g.plain_epilogue(od))
        assert any(v.name_expr == name for v in GEMM_VARIANTS)
    assert g.plain_epilogue(DType.BF16) == "rawflux::TmaStore" and g.plain_epilogue(DType.F32) == "rawflux::LocalStore"


def test_tma_store_scratch_and_params():
    """TmaStore's staging buffers (the host's kernel_options / scratch_offset, TmaStore::bufs / kScratchOffset in the kernel) fit
    the 227 KB with the tile's ring, and its params are the 192-byte struct with the map first."""
    for t in tune.TILES:
        for od in (DType.BF16, DType.F16, DType.F32):
            scratch = g.epilogue_scratch_bytes(t, g.plain_epilogue(od), od)
            smem = g.launch_smem_bytes(t, g.plain_epilogue(od), od)
            assert scratch % (64 * 128 * t.consumers) == 0 and smem <= tune.SMEM_PER_CTA
            assert (scratch == 0) == (smem == t.smem_bytes)
            if od == DType.F32:
                assert scratch == 0
    big = next(t for t in tune.TILES if (t.bm, t.bn, t.cluster_m) == (128, 256, 2))
    assert g.epilogue_scratch_bytes(big, "rawflux::TmaStore", DType.BF16) == 2 * 2 * 8192  # two boxes per warpgroup
    assert g.epilogue_scratch_bytes(big, "rawflux::LocalStore", DType.BF16) == 0
    wide = next(t for t in tune.TILES if t.bn == 320)
    assert g.epilogue_scratch_bytes(wide, "rawflux::TmaStore", DType.BF16) == 0  # the ring fills shared memory
    # The map itself needs the driver (GPU tests); the fields after it: c, ldc, bias, bias_kind, pad.
    assert g.TMA_STORE_TAIL.size == 32 and 128 + g.TMA_STORE_TAIL.size + 32 == 192


def test_config_tags_round_trip():
    for t in tune.TILES:
        for cfg in (tune.GemmConfig(t), tune.GemmConfig(t, tune.Decomp.split_k(3), group=4, raster_n=True, ctas=120),
                    tune.GemmConfig(t, tune.STREAM_K, group=2), tune.GemmConfig(t, tune.Decomp("tail", 3)),
                    tune.GemmConfig(t, tune.Decomp("band", 4))):
            assert tune.parse_tag(cfg.tag()) == cfg
    with pytest.raises(ValueError, match="not a gemm config tag"):
        tune.parse_tag("128x256/k1")
    with pytest.raises(ValueError, match="not compiled by rawflux"):
        tune.parse_tag("128x64x64s4c1w2/k1/g8m/p0")


def test_wide_tile_is_nk_only_and_two_wgmma_per_step():
    wide = [t for t in tune.TILES if t.wn > 256]
    assert wide, "the 128 x 320 tile (two m64n160 wgmma per k16 step) is compiled"
    for t in wide:
        assert t.supports("nk") and not t.supports("kn")  # kn B chunks are 64 columns: 160 does not split them
        assert t.bn // t.cluster_m <= 256  # the TMA box of B (one CTA's multicast slice) spans <= 256 rows
    sass_hint = [v for v in GEMM_VARIANTS if "GemmCfg<128,320," in v.name_expr]
    assert len(sass_hint) == 4  # bf16/f16 x 16-bit/f32 out, nk only


def _epilogue_layout_asserts() -> str:
    """NVRTC static_asserts: the host's packing of LocalStore / TmaStore params matches the structs."""
    tail = ("c", "ldc", "bias", "bias_kind", "pad")  # g.TMA_STORE_TAIL, after the 128-byte map
    sizes = {"Q": 8, "q": 8, "i": 4}
    lines = ['#include "rawflux/gemm/policies.cuh"', "namespace rawflux {",
             'static_assert(sizeof(TmaStore::Params) == 192 && alignof(TmaStore::Params) == 64, "TmaStore size");',
             'static_assert(__builtin_offsetof(TmaStore::Params, tmap_c) == 0, "TmaStore.tmap_c");',
             f'static_assert(sizeof(LocalStore::Params) == {g.LOCAL_STORE.size}, "LocalStore size");']
    off = 128
    for name, code in zip(tail, g.TMA_STORE_TAIL.format.lstrip("<")):
        lines.append(f'static_assert(__builtin_offsetof(TmaStore::Params, {name}) == {off}, "TmaStore.{name}");')
        off += sizes[code]
    off = 0
    for name, code in zip(("c", "bias", "ldc", "bias_kind", "pad"), g.LOCAL_STORE.format.lstrip("<")):
        lines.append(f'static_assert(__builtin_offsetof(LocalStore::Params, {name}) == {off}, "LocalStore.{name}");')
        off += sizes[code]
    lines += ["}  // namespace rawflux", "__global__ void epilogue_layout_probe() {}"]
    return "\n".join(lines) + "\n"


def test_epilogue_param_structs_match_cuda():
    pytest.importorskip("cuda.bindings.nvrtc")
    compile_cubin(_epilogue_layout_asserts(), arch="sm_90a")
    broken = _epilogue_layout_asserts().replace("TmaStore::Params, bias) == 144", "TmaStore::Params, bias) == 152")
    assert broken != _epilogue_layout_asserts()
    with pytest.raises(Exception, match="TmaStore.bias"):
        compile_cubin(broken, arch="sm_90a")


def _scratch_asserts() -> str:
    """NVRTC static_asserts: the shared memory the host reserves for the epilogue's scratch
    (engine.epilogue_scratch_bytes, launch_smem_bytes) is what the kernel's policy uses, for every
    compiled tile and output type (a kernel using more than the launch reserved would write past it)."""
    lines = ['#include "rawflux/gemm/policies.cuh"', "namespace rawflux {"]
    for t in tune.TILES:
        for dt in (DType.BF16, DType.F16):
            for od in g.out_dtypes_for(dt):
                epi = g.plain_epilogue(od)
                cfg = g.kernel_name(t, dt, od, "nk", epilogue=epi).split("<", 1)[1].rsplit(f", {g.FUSED_SCHED}", 1)[0]
                want = g.epilogue_scratch_bytes(t, epi, od)
                lines.append(f'static_assert({epi}::scratch_bytes<{cfg}>() == {want}, "{t.tag()} {od.tag} scratch");')
                lines.append(f'static_assert(kScratchOffset<{cfg}> + {want} + 1024 <= {tune.SMEM_PER_CTA}, "{t.tag()} fits");')
                if want:
                    lines.append(f'static_assert(kScratchOffset<{cfg}> + {want} + 1024 == {g.launch_smem_bytes(t, epi, od)}, '
                                 f'"{t.tag()} {od.tag} launch smem");')
    lines += ["}  // namespace rawflux", "__global__ void scratch_probe() {}"]
    return "\n".join(lines) + "\n"


def test_epilogue_scratch_matches_host():
    pytest.importorskip("cuda.bindings.nvrtc")
    src = _scratch_asserts()
    compile_cubin(src, arch="sm_90a")
    broken = src.replace("() == 32768", "() == 16384", 1)
    assert broken != src
    with pytest.raises(Exception, match="scratch"):
        compile_cubin(broken, arch="sm_90a")
