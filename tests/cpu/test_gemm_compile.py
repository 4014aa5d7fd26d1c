"""CPU checks of the GEMM engine: every registered variant compiles for sm_90a with NVRTC, with no
register spills and no stack frame; the configuration logic only ever picks compiled variants."""
from __future__ import annotations

import random

import pytest

from rawflux import tune
from rawflux.jit import compile_cubin, kernel_source, variants
from rawflux.ops import gemm as g
from rawflux.runtime import DType

GEMM_VARIANTS = [v for v in variants() if v.relpath == "gemm.cu"]


def test_variants_registered():
    # every tile x {bf16, f16} x {16-bit out, f32 out} x layouts it supports
    expect = sum(2 * 2 * sum(t.supports(l) for l in ("nk", "kn")) for t in tune.TILES)
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


def test_smem_fits_and_stages():
    for t in tune.TILES:
        assert t.smem_bytes <= tune.SMEM_PER_CTA
        assert t.stages >= 4, t


def test_params_layout():
    assert g.GEMM_PARAMS.size == 72  # sizeof(GemmParams) in config.cuh
    assert len(g.local_store_params(0x1000, 64)) == 32  # sizeof(LocalStore::Params)


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


def test_kernel_name_matches_registry():
    t = next(iter(tune.TILES))
    name = g.kernel_name(t, DType.BF16, DType.BF16, "nk")
    assert any(v.name_expr == name for v in GEMM_VARIANTS)


def test_config_tags_round_trip():
    for t in tune.TILES:
        for cfg in (tune.GemmConfig(t), tune.GemmConfig(t, splits=3, group=4, raster_n=True, ctas=120)):
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
