"""Clusters of up to 4 CTAs for the plain GEMM (tune.PROBE_TILES: 2x2 and 4x1), on the CPU.

A Python model of GemmCfg's cluster rank layout (gemm/config.cuh: rank = rm + kClusterM * rn, the
multicast masks, the writer CTAs each consumer warp releases a stage to, the empty barrier's count),
checked against the CUDA helpers by NVRTC static_asserts and then walked: every CTA's stage gets
each row of the A and B tiles it computes on exactly once, every empty barrier gets exactly its
count of arrivals per stage, and the cluster tiles cover every tile of a grid once. Also: the probe
tiles compile without spills, their tags round-trip, the time model never sees them, and the host
plans them (boxes, grid, the cap on co-scheduled clusters)."""
from __future__ import annotations

import random

import pytest

from rawflux import tune
from rawflux.jit import compile_cubin
from rawflux.ops import gemm as g
from rawflux.runtime import DType
from tests.cpu.sched_port import cluster_place
from tests.cpu import test_gemm_compile as gemm_compile  # (a module: its tests are not collected twice)
from tests.cpu.test_stream_k import check_cover

SHAPES = [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1)]  # (kClusterM, kClusterN) the kernel compiles
CONSUMERS = 2
ROW = tune.BK * 2  # bytes of one k row of a tile


# ------------------------------------------------------------------------------------------------
# the model (ported from GemmCfg, checked against it below)


def mask_a(rm: int, cm: int, cn: int) -> int:
    """Ranks A's slice of the CTA at rm goes to: the CTAs of the same rm."""
    return sum(1 << (rm + cm * j) for j in range(cn))


def mask_b(rn: int, cm: int, cn: int) -> int:
    """Ranks B's slice of the CTA at rn goes to: the CTAs of the same rn."""
    return sum(1 << (i + cm * rn) for i in range(cm))


def writer(lane: int, rank: int, cm: int, cn: int) -> int:
    """The CTA whose empty barrier consumer lane `lane` of CTA `rank` arrives on (GemmCfg::writer)."""
    if cm == 1 or cn == 1:
        return lane
    rm, rn = cluster_place(rank, cm, cn)
    if lane < cm:
        return lane + cm * rn
    return rm + cm * ((rn + lane - (cm - 1)) % cn)


def n_writers(cm: int, cn: int) -> int:
    return cm + cn - 1


def empty_init(cm: int, cn: int) -> int:
    """mbar_init count of a CTA's empty barriers (gemm_kernel): every consumer warp of its writers."""
    return CONSUMERS * 4 * n_writers(cm, cn)


def boxes(bm: int, bn: int, cm: int, cn: int, layout: str) -> tuple[int, int]:
    """(kBoxARows, kBoxBRows): A's slice is bm / cn rows of m, B's bn / cm rows of n (nk) or
    BK / cm rows of k (kn, per 64-column chunk)."""
    return bm // cn, (bn // cm if layout == "nk" else tune.BK // cm)


def stage_tx(bm: int, bn: int, cm: int, cn: int, a_rows: int) -> int:
    """The producer's expect_tx (gemm_kernel): kStageBytes less the rows each of A's slices lacks."""
    box_a = bm // cn
    return (bm + bn) * ROW - (box_a - a_rows) * cn * ROW


# ------------------------------------------------------------------------------------------------
# the model against the CUDA helpers


def _cfg(cm: int, cn: int, layout: str = "nk", bm: int = 128, bn: int = 256) -> str:
    return f"rawflux::GemmCfg<{bm},{bn},64,4,{cm},{cn},{CONSUMERS},0,0,{0 if layout == 'nk' else 1}>"


def _layout_asserts(expect=None) -> str:
    """static_asserts: GemmCfg's rank layout, masks, writers and boxes equal the model's, for every
    cluster shape and rank (lane). `expect` overrides the model (a test that the asserts bite)."""
    lines = ['#include "rawflux/gemm/config.cuh"', "namespace rawflux {"]
    for cm, cn in SHAPES:
        c = _cfg(cm, cn)
        lines.append(f'static_assert({c}::kWriters == {n_writers(cm, cn)}, "kWriters {cm}x{cn}");')
        for layout in ("nk", "kn"):
            ba, bb = boxes(128, 256, cm, cn, layout)
            lines.append(f'static_assert({_cfg(cm, cn, layout)}::kBoxARows == {ba} && {_cfg(cm, cn, layout)}::kBoxBRows == {bb}, '
                         f'"boxes {cm}x{cn} {layout}");')
        for r in range(cm * cn):
            rm, rn = cluster_place(r, cm, cn)
            vals = {"rank_m": rm, "rank_n": rn, "mask_a": mask_a(rm, cm, cn), "mask_b": mask_b(rn, cm, cn)}
            vals.update({f"writer{l}": writer(l, r, cm, cn) for l in range(n_writers(cm, cn))})
            if expect:
                vals.update(expect.get((cm, cn, r), {}))
            lines.append(f'static_assert({c}::rank_m({r}u) == {vals["rank_m"]}u && {c}::rank_n({r}u) == {vals["rank_n"]}u, '
                         f'"place {cm}x{cn} rank {r}");')
            lines.append(f'static_assert({c}::mask_a({c}::rank_m({r}u)) == {vals["mask_a"]} && '
                         f'{c}::mask_b({c}::rank_n({r}u)) == {vals["mask_b"]}, "masks {cm}x{cn} rank {r}");')
            for l in range(n_writers(cm, cn)):
                lines.append(f'static_assert({c}::writer({l}u, {r}u) == {vals[f"writer{l}"]}u, "writer {cm}x{cn} rank {r} lane {l}");')
    lines += ["}  // namespace rawflux", "__global__ void cluster_layout_probe() {}"]
    return "\n".join(lines) + "\n"


def test_cuda_rank_layout_matches_the_model():
    pytest.importorskip("cuda.bindings.nvrtc")
    compile_cubin(_layout_asserts(), arch="sm_90a")
    # The asserts bite: a 2x2 writer set with the diagonal CTA in it, a 4x1 mask short of one rank.
    with pytest.raises(Exception, match="writer 2x2 rank 0 lane 2"):
        compile_cubin(_layout_asserts({(2, 2, 0): {"writer2": 3}}), arch="sm_90a")
    with pytest.raises(Exception, match="masks 4x1 rank 1"):
        compile_cubin(_layout_asserts({(4, 1, 1): {"mask_b": 7}}), arch="sm_90a")


@pytest.mark.parametrize("cm, cn", [(1, 4), (4, 2), (2, 4), (3, 1)])
def test_other_cluster_shapes_do_not_compile(cm, cn):
    pytest.importorskip("cuda.bindings.nvrtc")
    src = ('#include "rawflux/gemm/config.cuh"\nnamespace rawflux {\n'
           f"static_assert({_cfg(cm, cn, bn=128)}::kSmemBytes > 0, \"instantiate\");\n}}\n__global__ void probe() {{}}\n")
    with pytest.raises(Exception, match="multicast cluster"):
        compile_cubin(src, arch="sm_90a")


# ------------------------------------------------------------------------------------------------
# the model walked


def _stage(cm: int, cn: int, bm: int, bn: int, layout: str, a_rows: int, cluster_tile=(0, 0)):
    """One stage of one cluster: what every CTA receives (per operand: (source tile, first row, rows)
    of each slice) and which CTAs wrote into it."""
    box_a, box_b = boxes(bm, bn, cm, cn, layout)
    b_rows = box_b  # B's box is never cut
    size = cm * cn
    got = {x: {"a": [], "b": [], "from": set(), "bytes": 0} for x in range(size)}
    for y in range(size):
        rm, rn = cluster_place(y, cm, cn)
        tile_m, tile_n = cluster_tile[0] * cm + rm, cluster_tile[1] * cn + rn
        a_slice, b_slice = rn * box_a, rm * box_b
        for x in range(size):
            if mask_a(rm, cm, cn) >> x & 1:
                got[x]["a"].append((tile_m, a_slice, a_rows))
                got[x]["from"].add(y)
                got[x]["bytes"] += a_rows * ROW
            if mask_b(rn, cm, cn) >> x & 1:
                got[x]["b"].append((tile_n, b_slice, b_rows))
                got[x]["from"].add(y)
                got[x]["bytes"] += b_rows * ROW * (bn // 64 if layout == "kn" else 1)  # kn: one box per 64 columns
    return got, box_a, box_b


@pytest.mark.parametrize("cm, cn", SHAPES)
@pytest.mark.parametrize("bm, bn", [(128, 256), (128, 192), (128, 320), (64, 128)])
def test_every_stage_gets_its_tiles_once(cm, cn, bm, bn):
    for layout in ("nk", "kn"):
        if layout == "kn" and bn % 64:
            continue
        box_a = bm // cn
        for a_rows in sorted({box_a, 8, min(box_a, 24), min(box_a, 40)}):
            got, box_a, box_b = _stage(cm, cn, bm, bn, layout, a_rows, cluster_tile=(3, 5))
            for x, r in got.items():
                rm, rn = cluster_place(x, cm, cn)
                # A: kClusterN slices of this CTA's tile row, one per place along n, none twice
                assert {s[0] for s in r["a"]} == {3 * cm + rm}, (cm, cn, x)
                assert sorted(s[1] for s in r["a"]) == [j * box_a for j in range(cn)], (cm, cn, x, r["a"])
                rows = [row for _, first, n in r["a"] for row in range(first, first + n)]
                assert len(rows) == len(set(rows)) == cn * a_rows
                # B: kClusterM slices of this CTA's tile column covering the tile's rows once
                assert {s[0] for s in r["b"]} == {5 * cn + rn}, (cm, cn, x)
                rows = sorted(row for _, first, n in r["b"] for row in range(first, first + n))
                assert rows == list(range(bn if layout == "nk" else tune.BK)), (cm, cn, x, layout)
                # the bytes the full barrier expects are the bytes that arrive
                assert r["bytes"] == stage_tx(bm, bn, cm, cn, a_rows), (cm, cn, x, layout, a_rows)
                # the CTAs that wrote into x are the ones x's consumer warps release the stage to
                released = [writer(l, x, cm, cn) for l in range(n_writers(cm, cn))]
                assert len(set(released)) == len(released) and set(released) == r["from"], (cm, cn, x, released, r["from"])


@pytest.mark.parametrize("cm, cn", SHAPES)
def test_empty_barrier_arrivals_equal_its_count(cm, cn):
    size = cm * cn
    arrivals = [0] * size
    for y in range(size):  # every consumer warp of every CTA releases a stage once, lanes 0 .. kWriters - 1
        for _warp in range(CONSUMERS * 4):
            for lane in range(n_writers(cm, cn)):
                arrivals[writer(lane, y, cm, cn)] += 1
    assert arrivals == [empty_init(cm, cn)] * size
    # ... and a producer's writes go only where that barrier's arrivals come from: x writes into y
    # exactly when y releases to x
    for x in range(size):
        rm, rn = cluster_place(x, cm, cn)
        dests = {y for y in range(size) if (mask_a(rm, cm, cn) | mask_b(rn, cm, cn)) >> y & 1}
        releasers = {y for y in range(size) if x in {writer(l, y, cm, cn) for l in range(n_writers(cm, cn))}}
        assert dests == releasers, (cm, cn, x)
    if (cm, cn) == (2, 2):
        assert n_writers(cm, cn) == 3 and 3 not in {writer(l, 0, cm, cn) for l in range(3)}  # not the diagonal CTA


@pytest.mark.parametrize("cm, cn", SHAPES)
def test_cluster_tiles_cover_every_tile_once(cm, cn):
    for tiles_m in range(1, 10):
        for tiles_n in range(1, 10):
            ctm, ctn = -(-tiles_m // cm), -(-tiles_n // cn)
            seen, idle = {}, 0
            for cmi in range(ctm):
                for cni in range(ctn):
                    for rank in range(cm * cn):
                        rm, rn = cluster_place(rank, cm, cn)
                        tile = (cmi * cm + rm, cni * cn + rn)
                        if tile[0] < tiles_m and tile[1] < tiles_n:
                            seen[tile] = seen.get(tile, 0) + 1
                        else:
                            idle += 1  # past m or n (ragged): loads and releases, stores nothing
            assert seen == {(i, j): 1 for i in range(tiles_m) for j in range(tiles_n)}
            assert idle == ctm * ctn * cm * cn - tiles_m * tiles_n


def test_probe_tiles_scheduler_port_covers_every_k_block_once():
    """The scheduler's port (test_stream_k.walk, with the rank layout) on the probe tiles: data
    parallel, split-K and stream-K, ragged m and n, grids of whole 4-CTA clusters."""
    rng = random.Random(4)
    seen_sk = 0
    for i in range(150):
        t = rng.choice(tune.PROBE_TILES)
        sms = rng.choice([132, 120, 16, 4])
        m, n, k = rng.randint(1, 3000), 8 * rng.randint(1, 800), 8 * rng.randint(1, 1500)
        stream_k = i % 3 == 2 and t.stream_k_ok
        cfg = tune.GemmConfig(t, splits=1 if stream_k else rng.randint(1, 4), group=rng.choice([1, 3, 8]),
                              raster_n=rng.random() < 0.5, stream_k=stream_k)
        assert g.grid_size(cfg, m, n, k, sms) % 4 == 0 and g.grid_size(cfg, m, n, k, sms) <= sms // 4 * 4
        p = check_cover(m, n, k, cfg, sms)
        seen_sk += p[12] > 0
    assert seen_sk > 10


# ------------------------------------------------------------------------------------------------
# the probe tiles on the host


def test_probe_tiles_are_only_reachable_by_tag():
    assert {(t.bm, t.bn, t.cluster_m, t.cluster_n) for t in tune.PROBE_TILES} >= {(128, 256, 2, 2), (128, 256, 4, 1)}
    dev = tune.DeviceInfo(132, (9, 0), 50 << 20)
    for t in tune.PROBE_TILES:
        assert t.cluster_size == 4 and t.cluster_k == 1 and t.stages == tune.max_stages(t.bm, t.bn) >= 4
        assert t not in tune.TILES and t not in tune.tiles_for("nk") and t not in tune.tiles_for("kn")
        assert tune.is_compiled(t) and t in tune.compiled_tiles()
        for cfg in (tune.GemmConfig(t), tune.GemmConfig(t, splits=3, group=4, raster_n=True, ctas=120)):
            assert tune.parse_tag(cfg.tag()) == cfg
        assert tune.parse_tag(f"{t.tag()}/k1/g8m/p0").tile == t  # benchmarks/gemm.py --tiles appends that
    assert tune.parse_tag("128x256x64s4c2x2w2/k1/g8m/p0").tile == tune.TileConfig(128, 256, 4, 2, 2)
    assert tune.parse_tag("128x256x64s4c4x1w2/k1/g8m/p0").tile == tune.TileConfig(128, 256, 4, 4, 1)
    with pytest.raises(ValueError, match="not compiled by rawflux"):
        tune.parse_tag("128x256x64s4c1x4w2/k1/g8m/p0")
    for m, n, k in ((4096, 8192, 8192), (8192, 28672, 8192), (1024, 6144, 12288), (64, 8192, 8192)):
        for layout in ("nk", "kn"):
            assert all(c.tile not in tune.PROBE_TILES for c in tune.candidates(m, n, k, layout, dev))
            assert tune.heuristic(m, n, k, layout, dev).tile in tune.TILES


def test_probe_variants_registered_for_every_supported_layout():
    probe = {f"GemmCfg<{t.bm},{t.bn},64,{t.stages},{t.cluster_m},{t.cluster_n},": t for t in tune.PROBE_TILES}
    got = {}
    for v in gemm_compile.GEMM_VARIANTS:
        for key, t in probe.items():
            if key in v.name_expr:
                assert "StreamKSched" in v.name_expr  # the plain GEMM only
                got.setdefault(t, []).append(v)
    for t in tune.PROBE_TILES:
        assert len(got.get(t, [])) == 2 * 2 * sum(t.supports(l) for l in ("nk", "kn")), t.tag()


_PROBE_VARIANTS = [v for v in gemm_compile.GEMM_VARIANTS
                   if any(f"GemmCfg<{t.bm},{t.bn},64,{t.stages},{t.cluster_m},{t.cluster_n}," in v.name_expr for t in tune.PROBE_TILES)]


@pytest.mark.parametrize("v", _PROBE_VARIANTS, ids=lambda v: v.name_expr.split("GemmCfg<")[1].split(">")[0])
def test_probe_variant_compiles_without_spills(v):
    gemm_compile.test_variant_compiles_without_spills(v)


class _FakeKernel:
    handle = 0x1234

    def set_max_dynamic_smem(self, nbytes):
        pass


def test_grid_capped_at_co_scheduled_clusters(monkeypatch):
    t22 = next(t for t in tune.PROBE_TILES if (t.bn, t.cluster_m, t.cluster_n) == (256, 2, 2))
    t21 = next(t for t in tune.TILES if (t.bm, t.bn, t.cluster_m) == (128, 256, 2))
    # no GPU here: the driver cannot be asked, no cap beyond whole clusters
    assert g.max_active_clusters(_FakeKernel(), 384, 4, 200000) == 0
    assert g.cluster_sms(_FakeKernel(), t22, 200000, 132) == 132
    monkeypatch.setattr(g, "max_active_clusters", lambda kern, threads, cluster, smem, sms: 30)
    assert g.cluster_sms(_FakeKernel(), t22, 200000, 132) == 120
    assert g.cluster_sms(_FakeKernel(), t21, 200000, 132) == 132  # the 2-CTA tiles keep their grid
    monkeypatch.setattr(g, "_check_arch", lambda dev: tune.DeviceInfo(132, (9, 0), 50 << 20, "fake"))
    monkeypatch.setattr(g, "get_kernel", lambda *a, **kw: _FakeKernel())
    monkeypatch.setattr(g, "_plans", {})
    t41 = next(t for t in tune.PROBE_TILES if (t.bn, t.cluster_m) == (256, 4))
    for t, layout, box_a, box_b in ((t22, "nk", (64, 64), (128, 64)), (t41, "nk", (128, 64), (64, 64)),
                                    (t22, "kn", (64, 64), (32, 64)), (t41, "kn", (128, 64), (16, 64))):
        plan = g._plan(tune.GemmConfig(t), 8192, 8192, 8192, DType.BF16, layout, DType.BF16, 0, 0, "gemm.cu", g.PLAIN_SCHED,
                       "rawflux::NoWait", "rawflux::TmaStore", 1, 0)
        assert (plan.grid, plan.cluster, plan.box_a, plan.box_b) == (120, 4, box_a, box_b), t.tag()
    # a small m cuts each of A's slices, not the 2x2's box count
    plan = g._plan(tune.GemmConfig(t22), 20, 8192, 8192, DType.BF16, "nk", DType.BF16, 0, 0, "gemm.cu", g.PLAIN_SCHED,
                   "rawflux::NoWait", "rawflux::TmaStore", 1, 0)
    assert plan.box_a == (24, 64) and g.GEMM_PARAMS.unpack(plan.params)[13] == 24
    # stream-K plans its runs on the capped grid (the kernel's G is the launch's cluster count)
    cfg = tune.GemmConfig(t22, stream_k=True)
    plan_args = (DType.BF16, "nk", DType.BF16, 0, 0, "gemm.cu", g.PLAIN_SCHED, "rawflux::NoWait", "rawflux::TmaStore", 1, 0)
    monkeypatch.setattr(g, "_workspace", lambda *a: (0x1000, 0x2000))
    plan = g._plan(cfg, 1000, 6144, 4096, *plan_args)
    sp = tune.sk_plan(1000, 6144, 4096, cfg, 120)
    assert plan.grid == sp.clusters * 4 <= 120 and g.GEMM_PARAMS.unpack(plan.params)[12] == sp.sk_tiles


# ------------------------------------------------------------------------------------------------
# the dynamic tile order (RAWFLUX_DYN_SCHED, development): compiled for 4x1, not for 2x2


def test_dyn_order_only_where_every_cta_releases_the_leader(monkeypatch):
    monkeypatch.setenv("RAWFLUX_NVRTC_DEFINES", "RAWFLUX_DYN_SCHED=1")
    for t in tune.PROBE_TILES:
        # 4x1: every CTA writes into the leader's stages (the 2-CTA argument holds); 2x2: the diagonal does not
        assert g._dyn_order(t) == (t.stream_k_ok and (t.cluster_m == 1 or t.cluster_n == 1)), t.tag()
    assert any(g._dyn_order(t) for t in tune.PROBE_TILES)


def test_dyn_ticket_protocol_with_4_ctas():
    """test_dyn_sched's step machines with 4 CTAs per cluster that all release each other's stages
    (the 4x1 cluster: B multicast to all four, A loaded by each)."""
    from tests.cpu.test_dyn_sched import _run

    for seed in range(120):
        rng = random.Random(seed)
        _run(seed, clusters=rng.randint(1, 2), csize=4, stages=rng.randint(2, 4), kb=rng.randint(1, 3), units=rng.randint(0, 10))


def test_dyn_4x1_compiles_clean(monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc")
    monkeypatch.setenv("RAWFLUX_NVRTC_DEFINES", "RAWFLUX_DYN_SCHED=1")
    from rawflux.check_kernels import _WGMMA_SERIALIZED
    from rawflux.jit import kernel_source

    t = tune.parse_tag("128x256x64s4c4x1w2/k1/g8m/p0").tile
    name = g.kernel_name(t, DType.BF16, DType.BF16, "nk", sched=g.PLAIN_SCHED, epilogue=g.plain_epilogue(DType.BF16))
    r = compile_cubin(kernel_source("gemm.cu"), arch="sm_90a", name_expressions=(name,), filename="gemm.cu")
    res = r.resources[r.lowered[name]]
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0 and res["stack"] == 0, res
    assert _WGMMA_SERIALIZED not in r.log
