"""The heuristic: the candidate configurations for a problem and the one the time model picks,
with the limits (in waves and tile rows) inside which each decomposition was measured to pay."""
from __future__ import annotations

import math
from dataclasses import replace

from .configs import (BAND_TILES, BK, DP, KSPLIT_TILES, NARROW_TILES, STREAM_K, Decomp, GemmConfig, TileConfig, _cdiv,
                      ksplit_fits, tiles_for)
from .model import DeviceInfo, estimate_us
from .plans import band_height, cluster_tiles, narrow_plan, sk_plan

# Pieces per tile the tuner tries for the split tail (sk_plan).
TAIL_SPLITS = (2, 3, 4, 5, 6)
# The heuristic cuts a tail only after this many data-parallel waves: the range it was measured to
# win in (the 5 picks it won had 11-54 waves; TAIL_ROUND_S). Shorter problems get it from the
# measured tuner.
TAIL_MIN_WAVES = 8
# Banded stream-K won from 6 waves on (+0.8 to +2.4 % at 1024x28672x8192 and the m = 4096-8192
# points) and lost below 6 at every bar point but one (2048x8192x28672, +1.2 %). Without the
# fix-up's traffic bands still ran 0.5-7 % slower than the data-parallel grid at m = 1024-2048
# where they should save 3 % (unexplained).
BAND_MIN_WAVES = 6
# Narrow columns are not offered against bands or split tails, which measured as fast or faster
# from 6 waves on.
NARROW_MAX_WAVES = 6
NARROW_MIN_ROWS = 4  # pair rows: measured at 4-8 (m = 1024-2048); at m = 256 the 128x224 pair, measured, stays


def band_config(m: int, n: int, k: int, t: TileConfig, dev: DeviceInfo) -> GemmConfig | None:
    """Banded stream-K on tile t as the heuristic would run it (its raster: along the longer side;
    the band: that raster's group column), or None where its plan cannot cut tiles."""
    raster_n = _cdiv(m, t.bm) > _cdiv(n, t.bn)
    cfg = GemmConfig(t, STREAM_K, 8, raster_n)
    band = band_height(m, n, cfg)
    if t not in BAND_TILES or band < 2:
        return None
    cfg = replace(cfg, decomp=Decomp("band", band))
    if not sk_plan(m, n, k, cfg, dev.sms).band:
        return None
    return cfg


def narrow_config(m: int, n: int, t: TileConfig, dev: DeviceInfo) -> GemmConfig | None:
    """Narrow columns on tile t as the heuristic would run them (its raster: along the longer side),
    with the plan's width, or None where no plan beats the data-parallel grid."""
    cfg = GemmConfig(t, DP, 8, _cdiv(m, t.bm) > _cdiv(n, t.bn))
    plan = narrow_plan(m, n, cfg, dev.sms)
    return None if plan is None else replace(cfg, decomp=Decomp("narrow", plan.width))


def candidates(m: int, n: int, k: int, b_layout: str, dev: DeviceInfo, out_bytes: int = 2) -> list[GemmConfig]:
    out = []
    for t in tiles_for(b_layout):
        if t.cluster_size > dev.sms:
            continue
        tm, tn = _cdiv(m, t.bm), _cdiv(n, t.bn)
        tiles = tm * tn
        max_split = 1
        if tiles < 2 * dev.sms:
            max_split = min(16, _cdiv(k, BK) // 4 or 1)
        for s in range(1, max_split + 1):
            for raster_n in (False, True):
                out.append(GemmConfig(t, Decomp.split_k(s), 8, raster_n))
        if t.stream_k_ok and sk_plan(m, n, k, GemmConfig(t, STREAM_K), dev.sms).sk_tiles:
            for raster_n in (False, True):
                out.append(GemmConfig(t, STREAM_K, 8, raster_n))
            for s in TAIL_SPLITS:  # the split tail where its pieces fill their rounds
                sp = sk_plan(m, n, k, GemmConfig(t, Decomp("tail", s)), dev.sms)
                if sp.tail == s and _cdiv(sp.pieces, sp.clusters) < s:
                    for raster_n in (False, True):
                        out.append(GemmConfig(t, Decomp("tail", s), 8, raster_n))
            bc = band_config(m, n, k, t, dev)
            if bc is not None:
                out.append(bc)
        if (t in NARROW_TILES and b_layout == "nk" and out_bytes == 2 and tm >= NARROW_MIN_ROWS * t.cluster_m
                and tiles < NARROW_MAX_WAVES * max(1, dev.sms // t.cluster_size) * t.cluster_size):
            nc = narrow_config(m, n, t, dev)
            if nc is not None:
                out.append(nc)
    for t in KSPLIT_TILES:
        # Not for m <= bm / 2: at m = 64 the 128-row pair ran at 0.75 of cuBLAS where 64x128 k2 ran at 0.89
        # (the model does not see the empty rows' tensor time).
        if t.supports(b_layout) and 2 * m > t.bm and ksplit_fits(m, n, k, t, dev.sms):
            for raster_n in (False, True):
                out.append(GemmConfig(t, DP, 8, raster_n))
    return out


def heuristic(m: int, n: int, k: int, b_layout: str, dev: DeviceInfo, out_bytes: int = 2) -> GemmConfig:
    """Best configuration by the time model. Ties go to fewer splits (less workspace traffic).
    Stream-K is left to the measured tuner: on an H200 sweep it was slower than the best split-K or
    data-parallel configuration at 29 of 30 points and equal at the 30th (the model does not see its
    loss of L2 reuse: clusters at different k offsets of tiles that share operands; docs/decisions.md).
    The split tail (k-aligned pieces of the partial wave's tiles) is the heuristic's to pick, by the
    model with TAIL_ROUND_S."""
    best, best_t = None, math.inf
    cands = candidates(m, n, k, b_layout, dev, out_bytes)
    # Bands compete only where the pick is not a split tail: off the bar grid (1536x28672x8192) a band
    # measured 4 % slower than the split tail there; on it they tied (4096-8192 x 28672).
    for bands in (False, True):
        if bands and best is not None and best.tail:
            break
        for cfg in cands:
            if bool(cfg.band) != bands or (cfg.raster_n and not cfg.band and not cfg.narrow) or (cfg.stream_k and not cfg.tail and not cfg.band):
                continue
            waves = cluster_tiles(m, n, cfg.tile) // max(1, dev.sms // cfg.tile.cluster_size)
            if (cfg.tail and waves < TAIL_MIN_WAVES) or (cfg.band and waves < BAND_MIN_WAVES):
                continue
            t = estimate_us(m, n, k, cfg, dev, out_bytes) * (1.0 + 0.01 * (cfg.splits - 1))
            if t < best_t - 1e-9:
                best, best_t = cfg, t
    assert best is not None
    if best.band or best.narrow:  # band_config / narrow_config chose the raster their plan is for
        return best
    # Walk along the longer dimension inside a group: a wave then spans few tile-rows of the
    # shorter one, so both operands' slices of the wave fit in L2.
    tm, tn = _cdiv(m, best.tile.bm), _cdiv(n, best.tile.bn)
    return replace(best, raster_n=tm > tn)
