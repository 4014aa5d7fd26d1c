"""A's TMA box cut to m (GemmParams::a_box_rows, session 13) and what the time model charges for
rows of A past m."""
from __future__ import annotations

from rawflux import tune
from rawflux.ops import gemm as g


def test_a_box_rows():
    for t in (*tune.TILES, *tune.KSPLIT_TILES):
        box = t.bm // t.cluster_n
        for m in (1, 7, 8, 9, 31, 63, 64, 65, 127, 128, 129, 300, 4096):
            rows = g.a_box_rows(t, m)
            assert rows % 8 == 0 and 8 <= rows <= box and rows <= 256, (t.tag(), m, rows)
            assert rows == (box if m >= box else -(-m // 8) * 8), (t.tag(), m, rows)


def test_gemm_params_carry_a_box_rows():
    names = ("m", "n", "k", "tiles_m", "tiles_n", "k_blocks", "splits", "kb_per_split", "group", "raster_n",
             "seg_count", "seg_start", "sk_tiles", "a_box_rows")
    for tag, m in (("64x128x64s8c1w2/k2/g8m/p0", 5), ("128x256x64s4c2x1w2/k1/g8m/p0", 77), ("128x256x64s4c2x1w2/k1/g8m/p0", 4096)):
        cfg = tune.parse_tag(tag)
        p = dict(zip(names, g.GEMM_PARAMS.unpack(g.gemm_params(cfg, m, 1024, 512, timeout_ns=1))))
        assert p["a_box_rows"] == g.a_box_rows(cfg.tile, m) and p["m"] == m


def test_model_charges_zero_filled_rows():
    t = next(x for x in tune.TILES if (x.bm, x.bn, x.cluster_size) == (128, 128, 1))
    assert tune._a_pull_rows(1, t) == 8.0  # cut box: only m rows (rounded to 8) are pulled
    assert tune._a_pull_rows(256, t) == 128.0  # whole tile rows
    # m = 192: the last tile row has 64 rows of A and 64 zero-filled ones, dearer than loaded rows
    assert tune._a_pull_rows(192, t) == 64 + tune.OOB_FILL_COST * 64 > 128
    dev = tune.DeviceInfo(132, (9, 0), 60 << 20, "h200")
    cfg = tune.GemmConfig(t)
    assert tune.estimate_us(192, 8192, 8192, cfg, dev) > tune.estimate_us(256, 8192, 8192, cfg, dev)
