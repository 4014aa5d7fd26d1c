"""Narrow columns on the CPU (Decomp narrow, tune.narrow_plan, NarrowSched in gemm/scheduler/narrow.cuh):
the kernel's column map, ported, must cover [0, n) with columns that neither overlap nor start past
n; every tile of the last wave must be a narrow one; the busiest cluster's columns, counted here
from the ported tile order, must be the plan's and below the data-parallel grid's. Also params,
tags, refusals before launch, and the fused ops never asking for it."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

import rawflux  # noqa: F401  (the op modules register their variants)
from rawflux import engine as g
from rawflux import tune
from rawflux.runtime import DType
from tests.cpu.sched_port import raster


def _pair():
    return tune.NARROW_TILES[0]


def _cdiv(a, b):
    return -(-a // b)


def col0(tile_n: int, narrow_from: int, bn: int, width: int) -> int:
    """TileSchedT::col0 (gemm/scheduler/tile.cuh), ported."""
    return tile_n * bn if tile_n < narrow_from else narrow_from * bn + (tile_n - narrow_from) * width


def check_plan(m, n, cfg, sms):
    """Asserts the plan's invariants from the params the kernel gets; returns the plan (or None)."""
    t = cfg.tile
    plan = tune.narrow_plan(m, n, cfg, sms)
    if plan is None:
        return None
    cfg = replace(cfg, decomp=tune.Decomp("narrow", plan.width))
    p = g.GEMM_PARAMS.unpack(g.gemm_params(cfg, m, n, 256, sms=sms, timeout_ns=1))
    tiles_m, tiles_n, narrow_from = p[3], p[4], p[16]
    assert (tiles_n, narrow_from) == (plan.columns, plan.narrow_from)
    assert p[12] == 0 and p[6] == 1  # data-parallel: no stream-K tiles, no split
    # The columns tile [0, n): each starts where the last ended, none starts at or past n.
    starts = [col0(j, narrow_from, t.bn, plan.width) for j in range(tiles_n)]
    widths = [t.bn if j < narrow_from else plan.width for j in range(tiles_n)]
    assert starts[0] == 0 and all(starts[j] + widths[j] == starts[j + 1] for j in range(tiles_n - 1))
    assert starts[-1] < n <= starts[-1] + widths[-1]
    assert plan.width in tune.NARROW_WIDTHS and t.bn - 64 < plan.width < t.bn
    # The ported tile order: cluster c runs units c, c + G, ...; the last wave's tiles are narrow.
    rows = _cdiv(tiles_m, t.cluster_m)
    G = g.grid_size(cfg, m, n, 256, sms) // t.cluster_size
    units = rows * tiles_n
    waves = _cdiv(units, G)
    assert waves == _cdiv(rows * _cdiv(n, t.bn), G)  # the data-parallel grid's wave count
    load = [0] * G
    for u in range(units):
        _, cn = raster(u, rows, tiles_n, cfg.group, cfg.raster_n)
        load[u % G] += widths[cn]
        if u >= (waves - 1) * G:
            assert cn >= narrow_from, f"unit {u} of the last wave is in wide column {cn}"
    assert max(load) == plan.load < plan.dp_load == waves * t.bn
    return plan


def test_bar_shapes_plans():
    """The bar's shapes on the H200's 66 pairs: the busiest cluster 1.6-2.8 % lighter, n = 6144 none."""
    expect = {(1024, 12288): (752, 768, 240), (2048, 8192): (1000, 1024, 232),
              (2048, 12288): (1504, 1536, 224), (4096, 8192): (2000, 2048, 232), (1024, 28672): (1744, 1792, 208)}
    for (m, n), (load, dp, width) in expect.items():
        plan = check_plan(m, n, tune.GemmConfig(_pair()), 132)
        assert (plan.load, plan.dp_load, plan.width) == (load, dp, width), (m, n, plan)
    for m in (2048, 4096, 8192):
        assert tune.narrow_plan(m, 6144, tune.GemmConfig(_pair()), 132) is None  # 24 columns already fill the slots
    # 1024x8192 would need 248 (1.6 % less), which measured slower than the data-parallel pair
    assert tune.narrow_plan(1024, 8192, tune.GemmConfig(_pair()), 132) is None
    assert tune.narrow_plan(8192, 8192, tune.GemmConfig(_pair()), 132).load == 4000


def test_random_plans_keep_their_invariants():
    rng = random.Random(5)
    found = 0
    for _ in range(400):
        m = rng.choice([rng.randrange(1, 9000), 256 * rng.randrange(1, 33)])
        n = 8 * rng.randrange(1, 4000)
        cfg = tune.GemmConfig(_pair(), group=rng.choice([1, 2, 4, 8, 16]), raster_n=rng.random() < 0.5,
                              ctas=rng.choice([0, 0, 20, 34, 64, 100]))
        found += check_plan(m, n, cfg, rng.choice([132, 114, 78])) is not None
    assert found > 60


def test_tags_params_and_refusals():
    cfg = tune.narrow_config(1024, 12288, _pair(), tune.DeviceInfo(sms=132, cc=(9, 0), l2_bytes=50 << 20))
    assert cfg.narrow == 240 and "/n240/" in cfg.tag() and tune.parse_tag(cfg.tag()) == cfg
    assert tune.GemmConfig.from_json(cfg.to_json()) == cfg
    for bad in ("128x256x64s4c2x1w2/n250/g8m/p0", "128x256x64s4c2x1w2/n248/g8m/p0"):
        with pytest.raises(ValueError, match="narrow columns are"):
            tune.parse_tag(bad)
    assert g.grid_size(cfg, 1024, 12288, 8192, 132) == 132
    with pytest.raises(ValueError, match="no narrow-column plan"):  # one wave: nothing to even out
        g.gemm_params(cfg, 256, 8192, 8192, sms=132)
    common = dict(b_layout="nk", out_dtype=DType.BF16, epilogue="rawflux::TmaStore")
    other = next(t for t in tune.TILES if t not in tune.NARROW_TILES)
    g.check_config(cfg, 1024, 12288, 8192, sched=g.PLAIN_SCHED, sms=132, **common)
    for bad, kw, sched in ((replace(cfg, tile=other), common, g.PLAIN_SCHED),
                           (cfg, dict(common, b_layout="kn"), g.PLAIN_SCHED),
                           (cfg, dict(common, out_dtype=DType.F32, epilogue="rawflux::LocalStore"), g.PLAIN_SCHED)):
        with pytest.raises(ValueError, match="narrow columns are for the plain GEMM"):
            g.check_config(bad, 1024, 12288, 8192, sched=sched, sms=132, **kw)
    with pytest.raises(ValueError, match="does not split k"):  # the fused ops' scheduler
        g.check_config(cfg, 1024, 12288, 8192, sched=g.FUSED_SCHED, sms=132, **common)


def test_narrow_variants_registered():
    from rawflux.jit import variants

    names = {v.name_expr for v in variants()}
    for w in tune.NARROW_WIDTHS:
        for dt in (DType.BF16, DType.F16):
            assert g.kernel_name(_pair(), dt, dt, "nk", sched=g.narrow_sched(w), epilogue="rawflux::TmaStore") in names


def test_heuristic_takes_narrow_columns_below_six_waves():
    dev = tune.DeviceInfo(sms=132, cc=(9, 0), l2_bytes=50 << 20)
    picks = {(m, n, k): tune.heuristic(m, n, k, "nk", dev) for m in (64, 128, 256, 512, 1024, 2048, 4096, 8192)
             for n, k in ((6144, 12288), (12288, 6144), (8192, 8192), (28672, 8192), (8192, 28672))}
    narrow = {key: c.narrow for key, c in picks.items() if c.narrow}
    assert narrow == {(1024, 12288, 6144): 240, (2048, 12288, 6144): 224, (2048, 8192, 8192): 232, (2048, 8192, 28672): 232}
    for (m, n, k), c in picks.items():
        if c.narrow:
            assert check_plan(m, n, c, 132).width == c.narrow
    # Not for f32 C (narrow tiles store through TmaStore's 16-bit boxes), nor B as (k, n).
    assert not any(tune.heuristic(m, n, k, "nk", dev, 4).narrow or tune.heuristic(m, n, k, "kn", dev).narrow for (m, n, k) in narrow)
    # The model: the data-parallel time scaled by the busiest cluster's columns, plus NARROW_COST.
    c = picks[(2048, 8192, 8192)]
    t_dp = tune.estimate_us(2048, 8192, 8192, replace(c, decomp=tune.DP), dev)
    assert tune.estimate_us(2048, 8192, 8192, c, dev) == pytest.approx(t_dp * (1000 / 1024 + tune.NARROW_COST))


def test_fused_ops_never_narrow():
    from rawflux.ops import gemm_rs as rs

    dev = tune.DeviceInfo(sms=132, cc=(9, 0), l2_bytes=60 << 20)
    plan = rs.plan_call(4096, n=8192, k=8192, dtype=DType.BF16, b_layout="nk", partials="bf16", rank=0, world=2, dev=dev,
                        ctas=120, tiles_cap=4096, config=tune.GemmConfig(_pair(), tune.Decomp("narrow", 232)))
    assert not plan.cfg.narrow
