"""A's TMA box cut to m (GemmParams::a_box_rows, 2026-11-30) and what the time model charges for
rows of A past m."""
from __future__ import annotations

from rawflux import engine as g
from rawflux import tune


def test_a_box_rows():
    for t in (*tune.TILES, *tune.KSPLIT_TILES):
        box = t.bm // t.cluster_n
        for m in (1, 7, 8, 9, 31, 63, 64, 65, 127, 128, 129, 300, 4096):
            rows = tune.a_box_rows(t, m)
            assert rows % 8 == 0 and 8 <= rows <= box and rows <= 256, (t.tag(), m, rows)
            assert rows == (box if m >= box else -(-m // 8) * 8), (t.tag(), m, rows)


def test_a_tail_rows():
    """The tail box: a ragged last tile row's rows rounded up to 8 where m spans more than one tile
    row; else 8 rows for a 2x1 cluster's idle CTA (odd tile rows); never with A multicast."""
    probe = tune.TileConfig(128, 128, 4, cluster_n=2)  # A multicast: no compiled tile has it
    for t in (*tune.TILES, *tune.KSPLIT_TILES, probe):
        for m in (1, 7, 63, 64, 65, 127, 128, 129, 135, 136, 137, 192, 255, 256, 300, 384, 4096, 4097, 8191):
            rows = tune.a_tail_rows(t, m)
            tiles = -(-m // t.bm)
            tail = m - (tiles - 1) * t.bm
            if t.cluster_n > 1:
                assert rows == 0, (t.tag(), m, rows)
            elif tiles > 1 and tail < t.bm:
                assert rows == -(-tail // 8) * 8 and 8 <= rows <= t.bm and rows >= tail, (t.tag(), m, rows)
            elif tiles % t.cluster_m:
                assert rows == 8, (t.tag(), m, rows)
            else:
                assert rows == 0, (t.tag(), m, rows)
    pair = next(t for t in tune.TILES if (t.bm, t.bn, t.cluster_m) == (128, 256, 2))
    assert [tune.a_tail_rows(pair, m) for m in (64, 128, 256, 384, 300, 1000)] == [8, 8, 0, 8, 48, 104]


def test_gemm_params_carry_a_box_rows():
    names = ("m", "n", "k", "tiles_m", "tiles_n", "k_blocks", "splits", "kb_per_split", "group", "raster_n",
             "seg_count", "seg_start", "sk_tiles", "a_box_rows", "a_tail_rows")
    for tag, m in (("64x128x64s8c1w2/k2/g8m/p0", 5), ("128x256x64s4c2x1w2/k1/g8m/p0", 77), ("128x256x64s4c2x1w2/k1/g8m/p0", 4096),
                   ("128x256x64s4c2x1w2/k1/g8m/p0", 4097), ("64x96x64s8c1w2/k2/g8m/p0", 100)):
        cfg = tune.parse_tag(tag)
        p = dict(zip(names, g.GEMM_PARAMS.unpack(g.gemm_params(cfg, m, 1024, 512, sms=132, timeout_ns=1))))
        assert p["a_box_rows"] == tune.a_box_rows(cfg.tile, m) and p["m"] == m
        assert p["a_tail_rows"] == tune.a_tail_rows(cfg.tile, m)
    assert dict(zip(names, g.GEMM_PARAMS.unpack(g.gemm_params(tune.parse_tag("64x96x64s8c1w2/k2/g8m/p0"), 100, 1024, 512, sms=132))))[
        "a_tail_rows"] == 40


def test_model_charges_loaded_rows_only():
    """A ragged last tile row loads its own rows (a_tail_rows), so the slowest tile row pulls a whole
    box; rows past m cost the pull only with A multicast (OOB_FILL_COST), where the box is split."""
    t = next(x for x in tune.TILES if (x.bm, x.bn, x.cluster_size) == (128, 128, 1))
    assert tune._a_pull_rows(1, t) == 8.0  # cut box: only m rows (rounded to 8) are pulled
    assert tune._a_pull_rows(256, t) == 128.0  # whole tile rows
    assert tune._a_pull_rows(192, t) == 128.0  # the tail row loads 64 rows; the first row is the slowest
    probe = tune.TileConfig(128, 128, 4, cluster_n=2)
    assert tune._a_pull_rows(192, probe) == 64 + tune.OOB_FILL_COST * 0  # the tail row's two 64-row slices: one whole
    assert tune._a_pull_rows(160, probe) == 32 + tune.OOB_FILL_COST * 32
