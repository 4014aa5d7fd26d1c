"""The time model: the device's attributes (DeviceInfo, device_info) and a rough time per launch of
a configuration (estimate_us), with the constants fit on H200 timings."""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from .configs import BK, DP, TILES, Decomp, GemmConfig, TileConfig, _cdiv, ksplit_base
from .plans import SkPlan, a_box_rows, cluster_tiles, narrow_plan, sk_pieces, sk_plan, split_plan


@dataclass(frozen=True)
class DeviceInfo:
    sms: int
    cc: tuple[int, int]
    l2_bytes: int
    name: str = ""

    # Leads measured on an H200 (docs/decisions.md): these only rank candidates.
    @property
    def tflops_per_sm(self) -> float:
        return 5.5  # 128x256 mainloop, ~720 TF/s over 132 SMs

    @property
    def sm_pull_bytes_per_s(self) -> float:
        # What one SM's TMA pipeline pulls (L2 -> shared memory), fit by the regret of the pick
        # (PULL_SCALE for the tiles that pull more or less).
        return 70e9

    @property
    def fixup_bytes_per_s(self) -> float:
        # one SM's split-K partial traffic, fit with the constants below on the sweeps and A/B runs
        return 20e9

    @property
    def dram_bytes_per_s(self) -> float:
        return 3.4e12  # streaming reads with every SM pulling (cuBLAS reaches ~3.35 TB/s at m = 64)


_dev_lock = threading.Lock()
_dev_cache: dict[int, DeviceInfo] = {}


def device_info(device_id: int) -> DeviceInfo:
    """Multiprocessor count, compute capability and L2 size read off the device (never a table of
    GPU names). Under MPS with an SM cap, MULTIPROCESSOR_COUNT already reports the capped count."""
    with _dev_lock:
        hit = _dev_cache.get(device_id)
        if hit is not None:
            return hit
    import cupy

    attrs = cupy.cuda.runtime.getDeviceProperties(device_id)
    info = DeviceInfo(
        sms=int(attrs["multiProcessorCount"]),
        cc=(int(attrs["major"]), int(attrs["minor"])),
        l2_bytes=int(attrs.get("l2CacheSize", 50 << 20)),
        name=attrs["name"].decode() if isinstance(attrs.get("name"), bytes) else str(attrs.get("name", "")),
    )
    with _dev_lock:
        _dev_cache[device_id] = info
    return info


# The model's constants are fit by the regret of the pick (grid search; a least-squares fit of all
# times moved 49 of 65 picks, 22 of them slower), on every config timed in the tile sweeps and the
# A/B runs of the picks a change moved. tests/cpu/test_model_regret.py guards the fit on
# benchmarks/tools/gemm_timings.json; docs/decisions.md, "Tile choice and time model".
#
# A tile's pull rate relative to sm_pull_bytes_per_s: 64x256 moves 5.2 MB per CTA in 50 us at m = 192,
# 8192x8192 (~100 GB/s; its 40 KB stages keep more bytes in flight per TMA issue). 64x96's 20 KB
# stages keep fewer: ~50 GB/s per CTA where 64x128 pulls ~60 (m = 1-64, 6144x12288). 128x96's 8
# stages of 28 KB: ~95 GB/s per CTA in one wave of 128 (m = 256, 6144x12288), 1.2 by the regret scan.
PULL_SCALE: dict[tuple[int, int], float] = {(64, 256): 1.25, (64, 96): 0.85, (128, 96): 1.2}
# The part of a wave's shorter bound (SM time or DRAM time) that adds to its longer one: with 0 the
# configs at the DRAM floor tie and the pick among them is arbitrary.
DRAM_SM_OVERLAP = 0.3
# What a row of A past m costs the pull, against a loaded row: the TMA unit zero-fills it, and that
# is slower than loading (128x128 at m = 192, 8192x8192: >= 64 us, against 49 us at m = 256). Only
# with A multicast (cluster_n > 1), which no compiled tile has: a problem smaller than one A box
# loads m rows (a_box_rows), a ragged last tile row its own rows (a_tail_rows).
OOB_FILL_COST = 1.5
# The same for B's rows past n in the last tile column (its box is never cut). Fit lower than A's:
# 1.5 moved m = 640 picks off 128x192 (28672 = 149.3 x 192) to tiles measured 8-16 % slower.
B_OOB_FILL_COST = 1.1
# A k-split cluster is timed as split-K k2 on the same tile without a cluster, times KSPLIT_RATE.
# On the H200 it ran 0.93-0.98x the time of split-K k2 at all seven points measured (m 128-256),
# with the same bits; but with 0.97 the model picks the 128x256 pair at m = 192, n = 8192,
# k = 28672, measured 1.35x the best there.
KSPLIT_RATE = 1.00
# What a split-tail round costs beyond its k blocks and the partials' bytes (H200: the picks with
# 2-6 pieces timed at the 20 bar points). Without it the model ran 2.7 % fast on the tail's time
# (rms 3 %) and would cut tiles at m = 1024 where that measured 2.4 % slower; with 20 us the
# heuristic cuts them at 5 of the 20 points, each measured 0.6-1.7 % faster than the data-parallel
# pick (m >= 4096, the large shapes).
TAIL_ROUND_S = 20e-6
# Banded stream-K against the data-parallel pick of the same tile (H200, the 20 bar points): it cost
# 13-19 us per launch more than the k blocks it saves (the fix-up: every cluster writes one fp32
# partial and reads one back, and runs a third unit) at 16 of the 20 points, 25-58 us at four with
# long k and no data-parallel wave. BAND_FIX_S is that cost in the model; where bands pay:
# BAND_MIN_WAVES (heuristic.py).
BAND_FIX_S = 16e-6
# Narrow columns measured (two runs) 0.3-1.3 % faster than the data-parallel pair at
# 1024x12288x6144, 2048 x {12288x6144, 8192x8192}, and 2-4 % at 2048x8192x28672: about the busiest
# cluster's saving less NARROW_COST.
NARROW_COST = 0.008


def _pull_rate(t: TileConfig, dev: DeviceInfo) -> float:
    """Bytes per second one SM pulls for tile t (sm_pull_bytes_per_s, scaled by PULL_SCALE)."""
    return dev.sm_pull_bytes_per_s * PULL_SCALE.get((t.bm, t.bn), 1.0)


def _a_pull_rows(m: int, t: TileConfig) -> float:
    """Rows of A one CTA's box pulls per k block, in loaded-row units, for the slowest tile row."""
    box = t.bm // t.cluster_n
    if m < box:
        return float(a_box_rows(t, m))
    if t.cluster_n == 1:
        return float(box)  # a ragged last row loads its own rows (a_tail_rows): a whole row is the slowest
    tail = m - (_cdiv(m, t.bm) - 1) * t.bm  # valid rows of the last tile row
    oob = max(0, box - tail) if tail < t.bm else 0
    return box - oob + OOB_FILL_COST * oob


def _b_pull_rows(n: int, t: TileConfig) -> float:
    """Rows of B one CTA's box pulls per k block, in loaded-row units, for the slowest CTA of the
    last tile column: B's box is not cut, so the rows past n there are zero-filled."""
    box = t.bn // t.cluster_m  # each CTA of an m-cluster loads one slice and multicasts it
    tail = n - (_cdiv(n, t.bn) - 1) * t.bn  # valid rows of the last tile column
    worst = 0.0
    for j in range(t.cluster_m):
        valid = min(box, max(0, tail - j * box))
        worst = max(worst, valid + B_OOB_FILL_COST * (box - valid))
    return worst


def estimate_us(m: int, n: int, k: int, cfg: GemmConfig, dev: DeviceInfo, out_bytes: int = 2) -> float:
    """Rough time model: waves x time per work unit, a unit bounded by its tensor work and by the
    bytes one SM can pull (L2 -> SM), plus split-K's fix-up, the whole against the DRAM time of the
    unique bytes."""
    t = cfg.tile
    if t.cluster_k > 1:  # split-K k2 on the same tile, its fix-up through DSMEM (KSPLIT_RATE)
        return KSPLIT_RATE * estimate_us(m, n, k, GemmConfig(ksplit_base(t), Decomp.split_k(2), cfg.group, cfg.raster_n, cfg.ctas), dev, out_bytes)
    if cfg.stream_k:
        sp = sk_plan(m, n, k, cfg, dev.sms)
        if sp.sk_tiles:
            return _estimate_sk_us(m, n, k, cfg, dev, out_bytes, sp)
        cfg = replace(cfg, decomp=DP)
    if cfg.narrow:  # the data-parallel grid's time, scaled by the busiest cluster's columns
        base = replace(cfg, decomp=DP)
        plan = narrow_plan(m, n, cfg, dev.sms)
        t_dp = estimate_us(m, n, k, base, dev, out_bytes)
        return t_dp if plan is None else t_dp * (plan.load / plan.dp_load + NARROW_COST)
    kb, per, splits = split_plan(k, cfg.splits)
    tm, tn = _cdiv(m, t.bm), _cdiv(n, t.bn)
    ctiles = _cdiv(tm, t.cluster_m) * _cdiv(tn, t.cluster_n)
    units = ctiles * splits
    ctas = min(cfg.ctas or dev.sms, dev.sms)
    slots = max(1, ctas // t.cluster_size)
    rate = dev.tflops_per_sm * 1e12 * TILES.get(t, 0.6)  # flop/s of one SM in the mainloop
    unit_flops = 2.0 * t.bm * t.bn * BK * per
    # Bytes one CTA pulls per unit (multicast slices count once per cluster).
    unit_bytes = (_a_pull_rows(m, t) + _b_pull_rows(n, t)) * BK * 2.0 * per
    t_unit = max(unit_flops / rate, unit_bytes / _pull_rate(t, dev)) + 2e-6  # + fill, epilogue
    if splits > 1:
        # Split-K fix-up, after the unit's main loop and not overlapped with it: the fp32 partial
        # written, and (by the last split) every split's partial read back.
        t_unit += (1 + splits) * t.bm * t.bn * 4.0 / dev.fixup_bytes_per_s
    # DRAM: each operand once (L2 reuse inside a wave), C once, split-K partials written and read.
    nbytes = 2.0 * (m * k + n * k) + out_bytes * m * n
    if splits > 1:
        nbytes += 2.0 * 4 * ctiles * t.cluster_size * t.bm * t.bn * splits
    unit_dram = nbytes / units

    def wave(u: int) -> float:
        # u units at once: each as fast as its SM allows, all together no faster than DRAM, and a
        # share of the shorter bound still shows (DRAM_SM_OVERLAP).
        sm_t, dram_t = t_unit, u * unit_dram / dev.dram_bytes_per_s
        return max(sm_t, dram_t) + DRAM_SM_OVERLAP * min(sm_t, dram_t)

    full, rest = divmod(units, slots)
    # A short last wave costs a whole unit time: wave quantization.
    total = full * wave(slots) + (wave(rest) if rest else 0.0)
    t_fix = 3e-6 if splits > 1 else 0.0
    return (total + t_fix) * 1e6


def _estimate_sk_us(m: int, n: int, k: int, cfg: GemmConfig, dev: DeviceInfo, out_bytes: int, sp: SkPlan) -> float:
    """Stream-K: the data-parallel waves as estimate_us times them, then one stream-K phase in which
    every cluster runs I / G k blocks and its fix-ups (it writes the partials of its first and last
    piece, and the last piece of a tile to arrive reads the others back)."""
    t = cfg.tile
    rate = dev.tflops_per_sm * 1e12 * TILES.get(t, 0.6)
    kb_flops = 2.0 * t.bm * t.bn * BK
    kb_bytes = (t.bm / t.cluster_n + t.bn / t.cluster_m) * BK * 2.0
    t_kb = max(kb_flops / rate, kb_bytes / _pull_rate(t, dev))
    ctiles = cluster_tiles(m, n, t)
    g = sp.clusters
    dp_waves = (ctiles - sp.sk_tiles) // g
    nbytes = 2.0 * (m * k + n * k) + out_bytes * m * n + 2.0 * 4 * sp.pieces * t.cluster_size * t.bm * t.bn
    if sp.band:
        # Banded stream-K: after the data-parallel waves every cluster runs ceil(I / G) k blocks
        # in about three units, writes one partial and reads one back; BAND_FIX_S besides.
        t_dp = dp_waves * (sp.k_blocks * t_kb + 2e-6)
        t_band = _cdiv(sp.iters, g) * t_kb + 3 * 2e-6 + BAND_FIX_S
        return max(t_dp + t_band, nbytes / dev.dram_bytes_per_s) * 1e6
    if sp.tail:
        # Split tail: rounds of whole-grid pieces; a cluster writes one partial per round, and a
        # tile's last piece reads all `tail` partials back; TAIL_ROUND_S per round besides.
        per = _cdiv(sp.k_blocks, sp.tail)
        rounds = _cdiv(sp.pieces, g)
        t_fix = (rounds + sp.tail) * t.bm * t.bn * 4.0 / dev.fixup_bytes_per_s
        t_dp = dp_waves * (sp.k_blocks * t_kb + 2e-6)
        t_tail = rounds * (per * t_kb + 2e-6 + TAIL_ROUND_S) + t_fix
        return max(t_dp + t_tail, nbytes / dev.dram_bytes_per_s) * 1e6
    cut = [sk_pieces(i, sp.k_blocks, g, sp.iters)[1] for i in range(sp.sk_tiles)]
    multi = [c for c in cut if c > 1]
    writes = sp.pieces / g  # partials written per cluster
    reads = (sum(multi) - len(multi)) / max(1, len(multi)) if multi else 0.0  # read by a tile's last piece
    t_fix = (writes + reads) * t.bm * t.bn * 4.0 / dev.fixup_bytes_per_s
    t_dp = dp_waves * (sp.k_blocks * t_kb + 2e-6)
    t_sk = _cdiv(sp.iters, g) * t_kb + 2e-6 + t_fix
    return max(t_dp + t_sk, nbytes / dev.dram_bytes_per_s) * 1e6
