"""Stream-K on the CPU: a Python port of the kernel's scheduler (gemm/scheduler/tile.cuh, TileSchedT)
walked for every cluster of the grid must cover every (tile, k block) exactly once, number each
tile's pieces 0..splits-1 in k order, give each stream-K tile its own fix-up slot, and stay within
the plan the host sizes the workspace by (tune.sk_plan). Also the host side: params, grid, tags,
the time model's candidates, and the fused ops never asking for it."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from rawflux import engine as g
from rawflux import tune
from rawflux.runtime import DType
from tests.cpu.sched_port import raster

SK_TILES = [t for t in tune.TILES if t.stream_k_ok]


def _cdiv(a, b):
    return -(-a // b)


def walk(m, n, k, cfg: tune.GemmConfig, sms: int):
    """Every work piece the kernel's clusters produce: (cluster, tile_m, tile_n, kb_begin, kb_end,
    split, splits, slot) for each CTA of the cluster, ported line by line from TileSchedT::next."""
    t = cfg.tile
    p = g.GEMM_PARAMS.unpack(g.gemm_params(cfg, m, n, k, sms=sms, timeout_ns=1))
    (pm, pn, pk, tiles_m, tiles_n, k_blocks, splits, kb_per_split, group, raster_n, seg_count, seg_start, sk_tiles,
     _a_box, _a_tail, tail, _narrow_from, _pad, _ws, _ctr, _to) = p
    grid = g.grid_size(cfg, m, n, k, sms)
    G = grid // t.cluster_size
    ctm, ctn = _cdiv(tiles_m, t.cluster_m), _cdiv(tiles_n, t.cluster_n)
    ctiles = ctm * ctn
    dp_tiles = ctiles - sk_tiles
    out = []
    for cid in range(G):
        unit = cid
        while True:
            sk_piece = False
            if 0 <= unit < dp_tiles * (1 if sk_tiles > 0 else splits):
                split = unit // dp_tiles
                cu = unit - split * dp_tiles
                nsplit = 1 if sk_tiles > 0 else splits
                kb0 = split * kb_per_split
                kb1 = min(k_blocks, kb0 + kb_per_split)
                unit += G
            elif sk_tiles > 0 and tail < 0:  # banded stream-K: b-cluster bands side by side on stacks of b tiles
                b, iters = -tail, sk_tiles * k_blocks
                assert G * iters < 1 << 31  # the kernel's u32 arithmetic
                line, H = iters // b, G // b
                E = (H * iters + G - 1) // G
                pos = 0 if unit >= 0 else -1 - unit
                if cid < H * b:
                    h, j = divmod(cid, b)
                    x, end = h * E // H + pos, (h + 1) * E // H
                else:
                    L = G - H * b
                    if E >= line:
                        break
                    pas = pos // (line - E)
                    if pas >= b // L:
                        break
                    j, x, end = cid - H * b + pas * L, E + pos - pas * (line - E), line
                if x >= end:
                    break
                c = x // k_blocks
                kb0 = x - c * k_blocks
                kb1 = min(k_blocks, kb0 + end - x)
                c0 = c * k_blocks
                first = ((c0 + 1) * H - 1) // E
                bands = (min(c0 + k_blocks, E) * H - 1) // E - first + 1 if c0 < E else 0
                split = h - first if cid < H * b else bands
                nsplit = bands + (1 if c0 + k_blocks > E else 0)
                cu = dp_tiles + c * b + j
                unit = -1 - (pos + kb1 - kb0)
                sk_piece = True
            elif sk_tiles > 0 and tail > 0:  # split tail: piece j of tail tile t is unit dp_tiles + j * sk_tiles + t
                v = unit - dp_tiles
                if v >= sk_tiles * tail:
                    break
                split, nsplit = v // sk_tiles, tail
                per = _cdiv(k_blocks, tail)
                cu = dp_tiles + v - split * sk_tiles
                kb0 = split * per
                kb1 = min(k_blocks, kb0 + per)
                unit += G
                sk_piece = True
            else:
                if sk_tiles == 0:
                    break
                iters = sk_tiles * k_blocks
                assert G * iters < 1 << 31  # the kernel's u32 arithmetic
                if unit >= 0:
                    gg = unit % G
                    it = gg * iters // G
                else:
                    it = -1 - unit
                    gg = (it * G - 1) // iters
                end = (gg + 1) * iters // G
                if it >= end:
                    break
                tt = it // k_blocks
                kb0 = it - tt * k_blocks
                kb1 = min(k_blocks, kb0 + (end - it))
                first = ((tt * k_blocks + 1) * G - 1) // iters
                last = ((tt + 1) * k_blocks * G - 1) // iters
                split, nsplit = gg - first, last - first + 1
                cu = dp_tiles + tt
                unit = -1 - (it + kb1 - kb0)
                sk_piece = True
                assert gg == cid
            cm, cn = raster(cu, ctm, ctn, group, bool(raster_n))
            if seg_count > 1:  # the row rotation (GemmConfig.rotate: the fused AllGather's own chunk first)
                cm = (cm + seg_start * (pm // seg_count) // (t.bm * t.cluster_m) % ctm) % ctm
            for rank in range(t.cluster_size):
                tm = cm * t.cluster_m + (rank if t.cluster_m > 1 else 0)
                tn = cn * t.cluster_n + (rank if t.cluster_n > 1 else 0)
                slot = (cu - dp_tiles) * t.cluster_size + rank if sk_piece else tm * tiles_n + tn
                out.append((cid, tm, tn, kb0, kb1, split, nsplit, slot))
    return out, p


def check_cover(m, n, k, cfg, sms):
    t = cfg.tile
    pieces, p = walk(m, n, k, cfg, sms)
    k_blocks, depth, sk_tiles = p[5], p[6], p[12]
    tiles_m, tiles_n = _cdiv(m, t.bm), _cdiv(n, t.bn)
    by_tile = {}
    for cid, tm, tn, kb0, kb1, split, nsplit, slot in pieces:
        assert kb0 < kb1, "an empty piece"
        if tm < tiles_m and tn < tiles_n:
            by_tile.setdefault((tm, tn), []).append((kb0, kb1, split, nsplit, slot))
    assert len(by_tile) == tiles_m * tiles_n
    slots = {}
    for tile, ps in by_tile.items():
        ps.sort()
        assert ps[0][0] == 0 and ps[-1][1] == k_blocks, (tile, ps)
        assert all(a[1] == b[0] for a, b in zip(ps, ps[1:])), f"tile {tile}: k blocks covered twice or not at all: {ps}"
        assert [x[2] for x in ps] == list(range(len(ps))), f"tile {tile}: pieces not numbered in k order: {ps}"
        assert all(x[3] == len(ps) for x in ps), f"tile {tile}: piece count disagrees: {ps}"
        assert len(ps) <= max(1, depth)
        assert len({x[4] for x in ps}) == 1
        if len(ps) > 1:
            slots.setdefault(ps[0][4], tile)
            assert slots[ps[0][4]] == tile, "two split tiles share a fix-up slot"
            bound = sk_tiles * t.cluster_size if cfg.stream_k else tiles_m * tiles_n
            assert 0 <= ps[0][4] < bound
    return p


def _random_covers(seed, max_m, max_n8, tails, mode="tail"):
    """check_cover on 300 random problems, grids and stream-K configs (`mode`, tail or band, drawn
    from `tails`); returns how many of them cut a tile."""
    rng = random.Random(seed)
    cut = 0
    for _ in range(300):
        t = rng.choice(SK_TILES)
        sms = rng.choice([132, 114, 78, 16, 7, 2])
        m, n, k = rng.randint(1, max_m), 8 * rng.randint(1, max_n8), 8 * rng.randint(1, 2000)
        v = rng.choice(tails)
        cfg = tune.GemmConfig(t, tune.Decomp(mode, v) if v else tune.STREAM_K, group=rng.choice([1, 3, 8]), raster_n=rng.random() < 0.5,
                              ctas=rng.choice([0, 0, 5, 40]))
        if t.cluster_size > min(cfg.ctas or sms, sms):
            continue
        p = check_cover(m, n, k, cfg, sms)
        cut += p[12] > 0
    return cut


def test_stream_k_covers_every_iteration_once():
    assert _random_covers(1, 3000, 800, [0]) > 150  # most draws really cut tiles (the rest have whole waves only)


def test_split_k_still_covers():
    rng = random.Random(2)
    for _ in range(100):
        t = rng.choice(list(tune.TILES))
        m, n, k = rng.randint(1, 2000), 8 * rng.randint(1, 600), 8 * rng.randint(1, 1500)
        cfg = tune.GemmConfig(t, tune.Decomp.split_k(rng.randint(1, 6)), group=rng.choice([1, 8]), raster_n=rng.random() < 0.5)
        check_cover(m, n, k, cfg, 132)


def test_sk_plan_shapes():
    t = next(t for t in SK_TILES if (t.bm, t.bn, t.cluster_m) == (128, 128, 1))
    # m = 128, n = 6144: 48 tiles on 132 SMs, all cut, 192 k blocks each: ~2.75 runs per tile.
    sp = tune.sk_plan(128, 6144, 12288, tune.GemmConfig(t, tune.STREAM_K), 132)
    assert (sp.clusters, sp.sk_tiles, sp.k_blocks) == (132, 48, 192) and sp.max_pieces in (3, 4)
    # Whole waves only: nothing to cut.
    assert tune.sk_plan(256, 128 * 66, 4096, tune.GemmConfig(t, tune.STREAM_K), 132).sk_tiles == 0
    # W full waves + R: the last full wave and the partial one are cut (G + R tiles).
    sp = tune.sk_plan(128 * 3, 128 * 100, 4096, tune.GemmConfig(t, tune.STREAM_K), 132)
    assert sp.sk_tiles == 132 + (300 - 264) and sp.clusters == 132
    # Fewer iterations than SMs: the grid shrinks so every cluster owns one.
    sp = tune.sk_plan(100, 256, 64, tune.GemmConfig(t, tune.STREAM_K), 132)
    assert sp.sk_tiles == 2 and sp.clusters == 2 and g.grid_size(tune.GemmConfig(t, tune.STREAM_K), 100, 256, 64, 132) == 2
    # Too many iterations for the kernel's 32-bit arithmetic: data-parallel instead.
    assert tune.sk_plan(128, 128 * 100, 8 * 2**22, tune.GemmConfig(t, tune.STREAM_K), 132).sk_tiles == 0


def test_params_and_tags():
    t = next(t for t in SK_TILES if t.cluster_m == 2)
    cfg = tune.GemmConfig(t, tune.STREAM_K)
    assert tune.parse_tag(cfg.tag()) == cfg and "/sk/" in cfg.tag()
    assert tune.GemmConfig.from_json(cfg.to_json()) == cfg
    assert tune.GemmConfig.from_json({k: v for k, v in tune.GemmConfig(t).to_json().items() if k != "stream_k"}) == tune.GemmConfig(t)
    sp = tune.sk_plan(256, 6144, 12288, cfg, 132)
    p = g.GEMM_PARAMS.unpack(g.gemm_params(cfg, 256, 6144, 12288, sms=132, timeout_ns=5))
    assert p[6] == sp.max_pieces and p[7] == p[5] == 192 and p[12] == sp.sk_tiles > 0 and p[20] == 5
    assert g.grid_size(cfg, 256, 6144, 12288, 132) == sp.clusters * 2
    assert g.GEMM_PARAMS.unpack(g.gemm_params(tune.GemmConfig(t, tune.Decomp.split_k(3)), 256, 6144, 12288, sms=132))[12] == 0


def test_bad_stream_k_configs_are_refused_before_any_launch():
    wide = next(t for t in tune.TILES if not t.stream_k_ok)
    t = SK_TILES[0]
    common = dict(b_layout="nk", out_dtype=DType.BF16, epilogue="rawflux::TmaStore", sms=132)
    with pytest.raises(ValueError, match="stream-K takes"):
        g.check_config(tune.GemmConfig(wide, tune.STREAM_K), 256, 1024, 1024, sched=g.PLAIN_SCHED, **common)
    g.check_config(tune.GemmConfig(t, tune.STREAM_K), 256, 1024, 1024, sched=g.PLAIN_SCHED, **common)
    with pytest.raises(ValueError, match="does not split k"):
        g.check_config(tune.GemmConfig(t, tune.STREAM_K), 256, 1024, 1024, sched=g.FUSED_SCHED, **common)
    with pytest.raises(ValueError, match="does not split k"):
        g.check_config(tune.GemmConfig(t, tune.Decomp.split_k(2)), 256, 1024, 1024, sched=g.FUSED_SCHED, **common)
    # split-K with stream-K, a one-piece tail or band: not representable
    for kind, n in (("split_k", 1), ("tail", 1), ("band", 1), ("stream_k", 2), ("dp", 3), ("narrow", 0), ("sk", 0)):
        with pytest.raises(ValueError):
            tune.Decomp(kind, n)


def test_candidates_offer_stream_k_only_where_it_cuts():
    dev = tune.DeviceInfo(sms=132, cc=(9, 0), l2_bytes=60 << 20)
    cands = tune.candidates(128, 6144, 12288, "nk", dev)
    sk = [c for c in cands if c.stream_k]
    assert sk and all(c.tile.stream_k_ok and c.splits == 1 for c in sk)
    for c in sk:
        assert tune.estimate_us(128, 6144, 12288, c, dev) > 0
    # 66 x 2 tiles of 128 x 256 (cluster 2): whole waves, no stream-K candidate for that tile.
    t = next(t for t in SK_TILES if (t.bm, t.bn, t.cluster_m) == (128, 256, 2))
    assert not any(c.stream_k and c.tile == t for c in tune.candidates(256, 256 * 66, 4096, "nk", dev))


def test_fused_ops_never_stream_k():
    from rawflux.ops import gemm_rs as rs

    t = SK_TILES[0]
    dev = tune.DeviceInfo(sms=132, cc=(9, 0), l2_bytes=60 << 20)
    plan = rs.plan_call(1024, n=1024, k=4096, dtype=DType.BF16,
                        b_layout="nk", partials="bf16", rank=0, world=2, dev=dev, ctas=120, tiles_cap=4096,
                        config=tune.GemmConfig(t, tune.STREAM_K))
    assert not plan.cfg.stream_k and plan.cfg.splits == 1


def test_split_tail_covers_every_iteration_once():
    assert _random_covers(3, 5000, 1200, [2, 3, 4, 5, 6, 7]) > 150


def test_split_tail_rounds_share_k_offsets():
    """A round of the grid (G consecutive tail units) holds at most two piece indices, so its
    clusters run at most two k offsets (the L2 reuse stream-K's runs lose)."""
    t = next(t for t in SK_TILES if (t.bm, t.bn, t.cluster_m) == (128, 256, 2))
    m, n, k = 4096, 12288, 6144  # 768 pair tiles on 66 clusters: 11 waves + 42
    cfg = tune.GemmConfig(t, tune.Decomp("tail", 3))
    sp = tune.sk_plan(m, n, k, cfg, 132)
    assert (sp.clusters, sp.sk_tiles, sp.tail, sp.max_pieces, sp.k_blocks) == (66, 42, 3, 3, 96)
    pieces, p = walk(m, n, k, cfg, 132)
    assert p[12] == 42 and p[15] == 3 and p[6] == 3 and p[7] == 96
    per_cluster = {}
    for cid, tm, tn, kb0, kb1, split, nsplit, slot in pieces:
        per_cluster.setdefault(cid, []).append((kb0, kb1, nsplit))
    rounds = {}
    for cid, units in per_cluster.items():
        whole = [u for u in units if u[2] == 1]
        tail_units = [u for u in units if u[2] == 3][::2]  # one entry per CTA of the pair
        assert len(whole) == 2 * 11 and all(u[:2] == (0, 96) for u in whole)
        assert len(tail_units) == (2 if cid < 60 else 1)  # 126 pieces on 66 clusters
        for r, u in enumerate(tail_units):
            rounds.setdefault(r, set()).add(u[:2])
    assert rounds == {0: {(0, 32), (32, 64)}, 1: {(32, 64), (64, 96)}}
    # Whole waves only, or one piece per tile: data-parallel.
    assert tune.sk_plan(256 * 66, 256, 4096, cfg, 132).sk_tiles == 0
    assert tune.sk_plan(4096, 12288, 64, cfg, 132).sk_tiles == 0
    with pytest.raises(ValueError):
        replace(cfg, decomp=tune.Decomp("tail", 1))


def test_split_tail_tags_and_params():
    t = next(t for t in SK_TILES if t.cluster_m == 2)
    cfg = tune.GemmConfig(t, tune.Decomp("tail", 4))
    assert "/t4/" in cfg.tag() and tune.parse_tag(cfg.tag()) == cfg
    assert tune.GemmConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError):
        tune.parse_tag(cfg.tag().replace("/t4/", "/t1/"))
    sp = tune.sk_plan(4096, 8192, 8192, cfg, 132)  # 512 pair tiles: 7 waves + 50, cut in 4
    p = g.GEMM_PARAMS.unpack(g.gemm_params(cfg, 4096, 8192, 8192, sms=132, timeout_ns=5))
    assert p[12] == sp.sk_tiles == 50 and p[15] == 4 and p[6] == 4 and p[7] == p[5] == 128
    assert g.grid_size(cfg, 4096, 8192, 8192, 132) == 132
    # The tuner is offered a split tail only where its pieces fill fewer rounds than the tile's.
    dev = tune.DeviceInfo(sms=132, cc=(9, 0), l2_bytes=50 << 20)
    tails = {c.tail for c in tune.candidates(4096, 12288, 6144, "nk", dev) if c.tail and c.tile == t}
    assert 3 in tails and 2 not in tails


def test_band_covers_every_iteration_once():
    assert _random_covers(4, 6000, 1200, [2, 3, 4, 6, 8], mode="band") > 40  # others: no whole stacks, or no partial wave


def _pair():
    return next(t for t in SK_TILES if (t.bm, t.bn, t.cluster_m) == (128, 256, 2))


def test_band_members_run_side_by_side():
    """Banded stream-K at 4096x8192x8192 (512 pair tiles, 66 clusters, bands of 8): the 8
    members of a band run the same k blocks of one tile column at each step; every cluster runs
    the same number of k blocks within the leftover's rounding; and a tile's piece 0 is always its
    cluster's last unit, so it usually arrives last and sums with its own partial in registers
    (splitk_fixup's cheap path)."""
    t = _pair()
    m, n, k = 4096, 8192, 8192
    cfg = tune.GemmConfig(t, tune.Decomp("band", 8))
    sp = tune.sk_plan(m, n, k, cfg, 132)
    # 4 data-parallel waves (264 = 33 columns of 8), then 248 tiles (31 stacks) in 8 bands + 2 left
    assert (sp.clusters, sp.sk_tiles, sp.band, sp.max_pieces, sp.k_blocks) == (66, 248, 8, 2, 128)
    line, h, left, e = tune.band_shape(sp.sk_tiles, sp.k_blocks, sp.clusters, sp.band)
    assert (line, h, left) == (31 * 128, 8, 2) and e == -(-8 * 248 * 128 // 66)
    pieces, p = walk(m, n, k, cfg, 132)
    assert p[15] == -8 and p[12] == 248
    units = {}
    for cid, tm, tn, kb0, kb1, split, nsplit, slot in pieces:
        if tm % 2 == 0:  # one CTA of each pair
            units.setdefault(cid, []).append((tm, tn, kb0, kb1, split, nsplit))
    work = {cid: sum(u[3] - u[2] for u in us) for cid, us in units.items()}
    assert max(work.values()) - min(work.values()) <= 4 and min(work.values()) >= 4 * 128
    for band in range(8):
        members = [units[band * 8 + j][4:] for j in range(8)]  # after 4 data-parallel tiles each
        assert all(len(u) == len(members[0]) for u in members)
        for step in zip(*members):
            assert len({(u[1], u[2], u[3]) for u in step}) == 1  # one tile column, the same k blocks
            assert sorted(u[0] // 2 for u in step) == list(range(step[0][0] // 16 * 8, step[0][0] // 16 * 8 + 8))
    for cid, us in units.items():
        for i, u in enumerate(us):
            if u[5] > 1 and u[4] == 0:
                assert i == len(us) - 1, f"cluster {cid}: piece 0 of a cut tile is not its last unit"


def test_band_plan_limits():
    t = _pair()
    cfg = tune.GemmConfig(t, tune.Decomp("band", 4))
    # m = 1024: one partial wave only (128 tiles): every tile is in the line; 2 clusters left over.
    sp = tune.sk_plan(1024, 8192, 8192, cfg, 132)
    assert (sp.sk_tiles, sp.band) == (128, 4)
    # Whole waves only, tiles not a whole number of stacks, a band wider than the grid, leftover
    # clusters that do not divide a stack: data-parallel.
    assert tune.sk_plan(256 * 66, 256, 4096, cfg, 132).sk_tiles == 0
    assert tune.sk_plan(768, 7936, 8192, cfg, 132).sk_tiles == 0  # 3 x 31 tiles
    assert tune.sk_plan(1024, 8192, 8192, replace(cfg, ctas=6), 132).sk_tiles == 0  # G = 3 < 4
    assert tune.sk_plan(1024, 8192, 8192, replace(cfg, decomp=tune.Decomp("band", 8), ctas=22), 132).sk_tiles == 0  # 11 = 8 + 3; 3 does not divide 8
    assert tune.sk_plan(1024, 8192, 8192, replace(cfg, decomp=tune.Decomp("band", 8), ctas=20), 132).sk_tiles == 128 - 80  # 10 = 8 + 2 (4 passes); 8 whole waves
    with pytest.raises(ValueError, match="at least 2"):
        tune.parse_tag(cfg.tag().replace("/b4/", "/b1/"))


def test_band_tags_params_and_refusals():
    t = _pair()
    cfg = tune.GemmConfig(t, tune.Decomp("band", 8))
    assert "/b8/" in cfg.tag() and tune.parse_tag(cfg.tag()) == cfg
    assert tune.GemmConfig.from_json(cfg.to_json()) == cfg
    sp = tune.sk_plan(4096, 8192, 8192, cfg, 132)
    p = g.GEMM_PARAMS.unpack(g.gemm_params(cfg, 4096, 8192, 8192, sms=132, timeout_ns=5))
    assert p[12] == sp.sk_tiles == 248 and p[15] == -8 and p[6] == sp.max_pieces == 2 and p[7] == p[5] == 128
    assert g.grid_size(cfg, 4096, 8192, 8192, 132) == 132
    with pytest.raises(ValueError, match="at least 2"):
        tune.Decomp("band", 1)
    with pytest.raises(ValueError, match="does not split k"):
        g.check_config(cfg, 4096, 8192, 8192, sched=g.FUSED_SCHED, b_layout="nk", out_dtype=DType.BF16, epilogue="rawflux::TmaStore",
                       sms=132)


def test_heuristic_cuts_bands_from_six_waves_on_the_pair():
    dev = tune.DeviceInfo(sms=132, cc=(9, 0), l2_bytes=50 << 20)
    picks = {(m, n, k): tune.heuristic(m, n, k, "nk", dev) for m in (1024, 2048, 4096, 8192)
             for n, k in ((6144, 12288), (12288, 6144), (8192, 8192), (28672, 8192), (8192, 28672))}
    for (m, n, k), c in picks.items():
        waves = tune.cluster_tiles(m, n, c.tile) // 66
        assert not c.band or (c.tile in tune.BAND_TILES and waves >= tune.BAND_MIN_WAVES), c.tag()
        if c.band:
            assert c.band == tune.band_height(m, n, c) and tune.sk_plan(m, n, k, c, 132).band == c.band
    assert picks[(4096, 8192, 8192)].band == 8 and picks[(8192, 8192, 8192)].band == 8
    assert not picks[(1024, 8192, 8192)].band and not picks[(2048, 8192, 8192)].band
    # The model: bands save the partial wave's k blocks and pay BAND_FIX_S.
    dp, bc = tune.GemmConfig(_pair()), tune.band_config(4096, 8192, 8192, _pair(), dev)
    assert tune.estimate_us(4096, 8192, 8192, bc, dev) < tune.estimate_us(4096, 8192, 8192, dp, dev)
    assert tune.band_config(4096, 8192, 8192, next(t for t in SK_TILES if t not in tune.BAND_TILES), dev) is None


def test_fused_ops_never_band():
    from rawflux.ops import gemm_rs as rs

    dev = tune.DeviceInfo(sms=132, cc=(9, 0), l2_bytes=60 << 20)
    plan = rs.plan_call(4096, n=8192, k=8192, dtype=DType.BF16, b_layout="nk", partials="bf16", rank=0, world=2, dev=dev,
                        ctas=120, tiles_cap=4096, config=tune.GemmConfig(_pair(), tune.Decomp("band", 8)))
    assert not plan.cfg.stream_k and not plan.cfg.band


# ------------------------------------------------------------------------------------------------
# the order's rotation (GemmConfig.rotate), which the fused AllGather runs every decomposition with


def test_rotation_relabels_tile_rows_only():
    """A rotated config's pieces are the plain order's with cluster tile row cm moved to
    (cm + rotate) mod rows: every decomposition still covers each (tile, k block) once, and the
    pieces of a tile (its k ranges, numbering, slot) move with its row. So rawflux.gemm given the
    fused op's config (rotation included) cuts every tile as the fused GEMM does: bitwise equal."""
    pair = _pair()
    cases = [(pair, tune.Decomp("tail", 3), 2048, 12288, 12288), (pair, tune.Decomp("band", 8), 2048, 28672, 8192),
             (pair, tune.STREAM_K, 1024, 6144, 8192), (SK_TILES[-1], tune.Decomp.split_k(3), 384, 1280, 8192),
             (pair, tune.Decomp("narrow", 208), 1024, 7168, 8192)]
    for t, decomp, m, n, k in cases:
        plain = tune.GemmConfig(t, decomp, 8)
        rows = _cdiv(_cdiv(m, t.bm), t.cluster_m)
        base, _ = walk(m, n, k, plain, 132)
        for rotate in (1, rows // 2, rows - 1):
            cfg = replace(plain, rotate=rotate)
            p = check_cover(m, n, k, cfg, 132)
            assert p[10:12] == (m, rotate * t.bm * t.cluster_m)
            got, _ = walk(m, n, k, cfg, 132)
            moved = [(c, (tm // t.cluster_m + rotate) % rows * t.cluster_m + tm % t.cluster_m, tn, *rest) for c, tm, tn, *rest in base]
            key = lambda x: (x[1], x[2], x[3])
            # a stream-K piece's slot is its own (unmoved); a CTA tile's (split-K, whole tiles) moves with it
            strip = lambda x: x[:7] if x[6] == 1 or cfg.splits > 1 else x  # noqa: E731
            assert sorted(map(strip, got), key=key) == sorted(map(strip, moved), key=key), (cfg.tag(), rotate)


def test_rotation_tags_params_and_refusals():
    t = _pair()
    cfg = tune.GemmConfig(t, tune.Decomp("tail", 3), 4, False, 0, 5)
    assert cfg.tag().endswith("/p0/r5") and tune.parse_tag(cfg.tag()) == cfg
    assert tune.GemmConfig.from_json(cfg.to_json()) == cfg and cfg.to_json()["rotate"] == 5
    assert "rotate" not in tune.GemmConfig(t).to_json() and not tune.GemmConfig(t).tag().endswith("/r0")
    common = dict(sched=g.PLAIN_SCHED, b_layout="nk", out_dtype=DType.BF16, epilogue="rawflux::TmaStore", sms=132)
    g.check_config(cfg, 2048, 12288, 12288, **common)  # 8 cluster rows: 5 is one
    with pytest.raises(ValueError, match="rotation"):
        g.check_config(cfg, 1024, 12288, 12288, **common)  # 4 cluster rows
    with pytest.raises(ValueError, match="rotates its order itself"):
        g.pack_params(cfg, 2048, 12288, 12288, tune.work_plan(2048, 12288, 12288, cfg, 132), seg_count=2048, seg_start=256)
