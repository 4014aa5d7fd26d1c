"""k-split clusters (tune.KSPLIT_TILES, GemmCfg's kClusterK): the scheduler port gives every tile
to exactly one cluster, its two CTAs the two k halves split where split-K k2 splits; the host plans
one tile per cluster and rejects what the kernel cannot run, before any launch; the variants
compile without spills and their shared memory matches; the model offers them only where they
run, and the fused ops never get one. (The GPU checks: tests/gpu/test_gemm.py, gemm_sanitize.py.)"""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

import rawflux  # noqa: F401  (the op modules register their variants)
from rawflux import engine as g
from rawflux import tune
from rawflux.jit import compile_cubin, kernel_source
from rawflux.runtime import DType
from tests.cpu.sched_port import raster


def _cdiv(a, b):
    return -(-a // b)


def walk(m, n, k, cfg, sms):
    """(cluster, rank, tile_m, tile_n, kb_begin, kb_end) of every CTA, ported from TileSchedT::next
    (data-parallel path, splits = 1, plus the kClusterK override of the k range)."""
    t = cfg.tile
    p = g.GEMM_PARAMS.unpack(g.gemm_params(cfg, m, n, k, sms=sms, timeout_ns=1))
    _, _, _, tiles_m, tiles_n, k_blocks, splits, per, group, raster_n = p[:10]
    assert splits == 1
    grid = g.grid_size(cfg, m, n, k, sms)
    clusters = grid // t.cluster_size
    out = []
    for cid in range(clusters):
        unit = cid
        while unit < tiles_m * tiles_n:
            cm, cn = raster(unit, tiles_m, tiles_n, group, bool(raster_n))
            for rank in range(2):
                kb0 = rank * per
                out.append((cid, rank, cm, cn, kb0, min(k_blocks, kb0 + per)))
            unit += clusters
    return out, k_blocks


@pytest.mark.parametrize("seed", range(20))
def test_every_tile_once_in_two_k_halves(seed):
    rng = random.Random(seed)
    t = rng.choice(tune.KSPLIT_TILES)
    sms = 132
    while True:
        m, n, k = rng.randint(1, 600), 8 * rng.randint(1, 400), 8 * rng.randint(16, 2000)
        if 2 * _cdiv(m, t.bm) * _cdiv(n, t.bn) <= sms:
            break
    cfg = tune.GemmConfig(t, group=rng.choice((1, 3, 8)), raster_n=rng.random() < 0.5)
    pieces, kb = walk(m, n, k, cfg, sms)
    _, per_k2, _ = tune.split_plan(k, 2)
    tiles = {}
    for cid, rank, tm, tn, kb0, kb1 in pieces:
        tiles.setdefault((tm, tn), []).append((cid, rank, kb0, kb1))
    assert len(tiles) == _cdiv(m, t.bm) * _cdiv(n, t.bn)
    per_cluster = {}
    for tile, ps in tiles.items():
        ps.sort(key=lambda x: x[1])
        assert [x[1] for x in ps] == [0, 1] and ps[0][0] == ps[1][0], f"tile {tile}: not the two CTAs of one cluster: {ps}"
        assert ps[0][2] == 0 and ps[0][3] == ps[1][2] == per_k2 and ps[1][3] == kb, f"tile {tile}: k halves {ps}"
        assert ps[0][2] < ps[0][3] and ps[1][2] < ps[1][3], "an empty k half"
        per_cluster[ps[0][0]] = per_cluster.get(ps[0][0], 0) + 1
    assert set(per_cluster.values()) == {1}, "a cluster took more than one tile (its ring would be overwritten)"


def _cfg_args(name: str) -> list[int]:
    return [int(x) for x in name.split("GemmCfg<", 1)[1].split(">", 1)[0].split(",")]


def test_host_checks_and_names():
    t = tune.KSPLIT_TILES[0]
    assert t not in tune.TILES and not t.stream_k_ok and t.cluster_size == 2
    cfg = tune.GemmConfig(t)
    assert tune.parse_tag(cfg.tag()) == cfg and "c1k2" in cfg.tag()
    name = g.kernel_name(t, DType.BF16, DType.BF16, "nk", sched=g.PLAIN_SCHED, epilogue=g.plain_epilogue(DType.BF16))
    assert _cfg_args(name)[10] == 2  # GemmCfg's kClusterK
    for tt in tune.TILES:  # the compiled tiles keep their names and tags
        assert tt.cluster_k == 1 and "k" not in tt.tag().split("c", 1)[1].split("w")[0]
        assert _cfg_args(g.kernel_name(tt, DType.BF16, DType.BF16, "nk"))[10] == 1
    # one tile per cluster: 2 x tiles CTAs at most the grid
    assert g.grid_size(cfg, 128, 8192, 8192, 132) == 2 * 64


@pytest.mark.parametrize("case, match", [
    ((128, 8192 * 2, 8192, tune.GemmConfig(tune.KSPLIT_TILES[0])), "takes one tile"),
    ((128, 4096, 64, tune.GemmConfig(tune.KSPLIT_TILES[0])), "at least 2 k blocks"),
    ((128, 4096, 8192, tune.GemmConfig(tune.KSPLIT_TILES[0], tune.Decomp.split_k(2))), "splits = 1"),
])
def test_plan_rejects_what_the_kernel_cannot_run(case, match):
    m, n, k, cfg = case
    with pytest.raises(ValueError, match=match):
        g.check_config(cfg, m, n, k, sched=g.PLAIN_SCHED, b_layout="nk", out_dtype=DType.BF16, epilogue="rawflux::TmaStore",
                       sms=132)


def test_variants_compile_without_spills_and_smem_matches():
    pytest.importorskip("cuda.bindings.nvrtc")
    lines = ['#include "rawflux/gemm/policies.cuh"', "namespace rawflux {"]
    for t in tune.KSPLIT_TILES:
        for od in (DType.BF16, DType.F32):
            epi = g.plain_epilogue(od)
            name = g.kernel_name(t, DType.BF16, od, "nk", sched=g.PLAIN_SCHED, epilogue=epi)
            res = compile_cubin(kernel_source("gemm.cu"), arch="sm_90a", name_expressions=(name,), filename="gemm.cu")
            r = res.resources[res.lowered[name]]
            assert r["spill_stores"] == 0 and r["stack"] == 0 and "serialized" not in res.log, (name, r)
            cfg = name.split("<", 1)[1].rsplit(f", {g.PLAIN_SCHED}", 1)[0]
            lines.append(f'static_assert({cfg}::kSmemBytes == {t.smem_bytes}, "{t.tag()} smem");')
            lines.append(f'static_assert({epi}::scratch_bytes<{cfg}>() == {g.epilogue_scratch_bytes(t, epi, od)}, "{t.tag()} scratch");')
    lines += ["}  // namespace rawflux", "__global__ void ksplit_probe() {}"]
    compile_cubin("\n".join(lines) + "\n", arch="sm_90a")


H200 = tune.DeviceInfo(132, (9, 0), 60 << 20, "fake")


def test_model_offers_ksplit_only_where_it_runs():
    # Where it measured faster than split-K k2 on the same tile, the model picks it ...
    # (not at 8192x8192: 64x128 without split runs faster there)
    for n, k in ((6144, 12288),):
        pick = tune.heuristic(128, n, k, "nk", H200)
        assert pick.tile in tune.KSPLIT_TILES and pick.splits == 1 and not pick.stream_k, (n, k, pick.tag())
    # ... never where it cannot run or where half its rows would be empty, and it is timed as
    # split-K k2 on its base tile, scaled.
    rng = random.Random(7)
    for _ in range(400):
        m, n, k = rng.choice((1, 7, 64, 100, 128, 200, 256, 512, 4096)), 8 * rng.randint(1, 4000), 8 * rng.randint(1, 4000)
        sms = rng.choice((16, 66, 132))
        dev = tune.DeviceInfo(sms, (9, 0), 60 << 20, "fake")
        for cfg in tune.candidates(m, n, k, "nk", dev):
            if cfg.tile.cluster_k > 1:
                assert tune.ksplit_fits(m, n, k, cfg.tile, sms) and 2 * m > cfg.tile.bm, (m, n, k, sms, cfg.tag())
                base = tune.GemmConfig(tune.ksplit_base(cfg.tile), tune.Decomp.split_k(2), cfg.group, cfg.raster_n)
                assert tune.estimate_us(m, n, k, cfg, dev) == pytest.approx(tune.KSPLIT_RATE * tune.estimate_us(m, n, k, base, dev))
        pick = tune.heuristic(m, n, k, "nk", dev)
        if pick.tile.cluster_k > 1:
            assert g.grid_size(pick, m, n, k, sms) == 2 * _cdiv(m, pick.tile.bm) * _cdiv(n, pick.tile.bn)
    assert all(tune.heuristic(64, n, k, "nk", H200).tile.cluster_k == 1 for n, k in ((6144, 12288), (8192, 28672)))


def test_ag_gemm_maps_a_ksplit_pick_to_its_base_tile(monkeypatch):
    from rawflux.ops import ag_gemm as ag

    pick = tune.heuristic(128, 6144, 12288, "nk", H200)
    assert pick.tile.cluster_k > 1
    monkeypatch.setattr(g, "pick_config", lambda *a, **kw: pick)
    op = object.__new__(ag.AGGemm)  # only what config() reads
    monkeypatch.setattr(tune, "device_info", lambda *a: H200)
    op._cfgs, op._forced, op.world, op.rank = {}, {}, 1, 0  # world 1: no stored tuning to agree on
    op.n, op.k, op.dtype, op.b_layout, op.out_dtype, op.device_id = 6144, 12288, DType.BF16, "nk", DType.BF16, 0
    op.sms, op.paths, op.ce_reserved_sms = 132, ("ce",), 0
    cfg = op.config(128)
    # the pair's tile without the pair, its k halves as split-K 2 where the model has that paying
    assert cfg.tile == tune.ksplit_base(pick.tile) and cfg.tile in tune.TILES and cfg.splits in (1, 2)
    dp = replace(cfg, decomp=tune.DP)
    assert (cfg.splits == 2) == (tune.estimate_us(128, 6144, 12288, replace(cfg, decomp=tune.Decomp.split_k(2)), H200)
                                 < tune.estimate_us(128, 6144, 12288, dp, H200))
