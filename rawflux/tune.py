"""GEMM configurations: the compiled tile shapes, a heuristic that picks one per problem from the
device's attributes, and an optional measured tuner whose results persist as JSON in the cache
folder (RAWFLUX_TUNE, see rawflux/env.py).

A configuration has a compile-time part (TileConfig: tile shape, pipeline depth, cluster, consumer
warpgroups; one cubin each per dtype/layout/output type) and run-time parts (split-K factor, raster
order, number of persistent CTAs).
"""
from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from . import env

SMEM_PER_CTA = 232448  # sm_90 opt-in limit of dynamic shared memory per block (227 KB)
BK = 64


@dataclass(frozen=True)
class TileConfig:
    """Compile-time part: GemmCfg<bm, bn, 64, stages, cluster_m, cluster_n, consumers, ...>."""

    bm: int
    bn: int
    stages: int
    cluster_m: int = 1
    cluster_n: int = 1
    consumers: int = 2
    cluster_k: int = 1  # 2: a k-split cluster (GemmCfg's kClusterK; KSPLIT_TILES)

    @property
    def cluster_size(self) -> int:
        return self.cluster_m * self.cluster_n * self.cluster_k

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def smem_bytes(self) -> int:
        # + the k-split pair's two barriers and the consumer refill's release counts (GemmCfg::kBarrierBytes)
        return smem_bytes(self.bm, self.bn, self.stages) + 16 + 4 * self.stages

    @property
    def wn(self) -> int:
        """Columns per consumer warpgroup."""
        wg_m = self.bm // 64
        return self.bn // (self.consumers // wg_m)

    @property
    def stream_k_ok(self) -> bool:
        """Stream-K is compiled where a warpgroup's fragment is one wgmma wide (N <= 256); the
        128 x 320 tile's scheduler spilled with it (gemm/scheduler.cuh)."""
        return self.wn <= 256 and self.cluster_k == 1

    def supports(self, b_layout: str) -> bool:
        # kn: B's shared tile is 64-column chunks and one wgmma spans a warpgroup's columns (<= 256)
        return b_layout == "nk" or (self.bn % 64 == 0 and self.wn % 64 == 0 and self.wn <= 256)

    def tag(self) -> str:
        c = f"c{self.cluster_m}x{self.cluster_n}" if self.cluster_m * self.cluster_n > 1 else "c1"
        if self.cluster_k > 1:
            c += f"k{self.cluster_k}"
        return f"{self.bm}x{self.bn}x{BK}s{self.stages}{c}w{self.consumers}"


@dataclass(frozen=True)
class GemmConfig:
    """A full launch configuration: tile + run-time choices."""

    tile: TileConfig
    splits: int = 1  # split-K factor (fp32 workspace, last split reduces); 1 with stream_k
    group: int = 8  # raster group width in cluster tiles
    raster_n: bool = False  # False: groups of tile-rows walked along n
    ctas: int = 0  # persistent CTAs (0: every SM)
    stream_k: bool = False  # the tiles past the last full wave cut into equal k runs per cluster (sk_plan)
    # With stream_k: 0, stream-K's equal runs; >= 2, the split tail instead: the tiles of the partial
    # last wave cut into `tail` pieces at the same k offsets (sk_plan).
    tail: int = 0
    # With stream_k: >= 2, banded stream-K instead: stacks of `band` consecutive tiles of the raster
    # order (a tile column of a group: they share B) cut into runs that `band` clusters take side by
    # side, at the same k blocks (sk_plan).
    band: int = 0
    # >= 1 (without splits or stream_k): narrow columns, data-parallel: the tile columns of the
    # last wave's tiles `narrow` wide instead of bn, and more columns, so that the busiest cluster's
    # work comes closer to the mean (narrow_plan).
    narrow: int = 0

    def tag(self) -> str:
        sk = f"t{self.tail}" if self.tail else (f"b{self.band}" if self.band else "sk")
        ks = sk if self.stream_k else (f"n{self.narrow}" if self.narrow else f"k{self.splits}")
        return f"{self.tile.tag()}/{ks}/g{self.group}{'n' if self.raster_n else 'm'}/p{self.ctas}"

    def to_json(self) -> dict:
        return {"tile": asdict(self.tile), "splits": self.splits, "group": self.group, "raster_n": self.raster_n, "ctas": self.ctas,
                "stream_k": self.stream_k, "tail": self.tail, "band": self.band, "narrow": self.narrow}

    @staticmethod
    def from_json(d: dict) -> "GemmConfig":
        return GemmConfig(TileConfig(**d["tile"]), int(d["splits"]), int(d["group"]), bool(d["raster_n"]), int(d.get("ctas", 0)),
                          bool(d.get("stream_k", False)), int(d.get("tail", 0)), int(d.get("band", 0)), int(d.get("narrow", 0)))


def parse_tag(tag: str) -> GemmConfig:
    """The GemmConfig a tag names (GemmConfig.tag(), e.g. '128x256x64s4c2x1w2/k1/g8m/p0', or
    '.../sk/...' for stream-K, '.../t3/...' for the split tail, '.../b4/...' for banded stream-K,
    '.../n240/...' for narrow columns); the tile must be one rawflux compiles."""
    import re

    mt = re.fullmatch(r"(\d+)x(\d+)x64s(\d+)c(?:(\d+)x(\d+)|1)(?:k(\d))?w(\d)/(?:k(\d+)|(sk)|t(\d+)|b(\d+)|n(\d+))/g(\d+)([mn])/p(\d+)",
                      tag.strip())
    if mt is None:
        raise ValueError(f"not a gemm config tag: {tag!r} (expected e.g. '128x256x64s4c2x1w2/k1/g8m/p0', '.../sk/g8m/p0' "
                         f"'.../t3/g8m/p0', '.../b4/g8m/p0' or '.../n240/g8m/p0')")
    bm, bn, st, cm, cn, ck, w, k, sk, tl, bd, nw, g, r, p = mt.groups()
    if tl is not None and int(tl) < 2:
        raise ValueError(f"gemm config tag {tag!r}: a split tail cuts each tile in at least 2 pieces")
    if bd is not None and int(bd) < 2:
        raise ValueError(f"gemm config tag {tag!r}: a band of banded stream-K is at least 2 clusters")
    tile = TileConfig(int(bm), int(bn), int(st), int(cm or 1), int(cn or 1), int(w), int(ck or 1))
    if tile not in TILES and tile not in KSPLIT_TILES:
        raise ValueError(f"tile {tile.tag()} is not compiled by rawflux (tiles: {', '.join(t.tag() for t in (*TILES, *KSPLIT_TILES))})")
    if nw is not None and int(nw) not in NARROW_WIDTHS:
        raise ValueError(f"gemm config tag {tag!r}: narrow columns are {', '.join(map(str, NARROW_WIDTHS))} wide")
    return GemmConfig(tile, 1 if (sk or tl or bd or nw) else int(k), int(g), r == "n", int(p), bool(sk or tl or bd), int(tl or 0),
                      int(bd or 0), int(nw or 0))


def smem_bytes(bm: int, bn: int, stages: int) -> int:
    return 1024 + stages * (bm + bn) * BK * 2 + 2 * stages * 8


def max_stages(bm: int, bn: int, cap: int = 8) -> int:
    s = cap
    while s > 2 and smem_bytes(bm, bn, s) > SMEM_PER_CTA:
        s -= 1
    return s


def _tile(bm, bn, cluster_m=1, cluster_n=1, consumers=2, cluster_k=1) -> TileConfig:
    return TileConfig(bm, bn, max_stages(bm, bn), cluster_m, cluster_n, consumers, cluster_k)


# Every tile shape rawflux compiles (each x {bf16, f16} x {16-bit, f32 out} x {nk, kn} where valid),
# with its steady-state mainloop rate relative to 128x256 without cluster (~720 TF/s on an H200,
# measured 2026-11-29 by benchmarks/gemm.py --sweep). They only rank candidates for the heuristic;
# the measured tuner (RAWFLUX_TUNE=on) decides on real timings.
TILES: dict[TileConfig, float] = {
    # Rates refit on measured data (benchmarks/gemm.py --tiles, bf16, 25 points m 512..8192 on the
    # five shapes): with these the model picks the fastest of 128x192 / 128x256 / 128x320 (cluster
    # 2x1) and 128x256 (no cluster) within 1 % at 25 of 25 points. History: 128x256 1.04 / 1.00
    # before ordered issue, 1.05 / 1.01 after it (session 4); 128x320 1.06 until
    # the TmaStore epilogue (session 5), which the tiles with staging room (128x256, 128x192) use
    # and 128x320 (shared memory full) does not.
    _tile(128, 256, cluster_m=2): 1.05,
    _tile(128, 256): 1.01,
    _tile(128, 192, cluster_m=2): 1.02,
    _tile(128, 192): 0.98,
    # 128x128: 0.77 -> 0.90 (session 13): at m = 256, 8192x8192 it ran 49.3 us (r3), 0.99 of
    # 128x256's per-SM flop rate; pulled by its bytes (below) it still loses at large m.
    _tile(128, 128): 0.90,
    # 128x96 (session 11): at m = 128 its tiles fill the grid where 128-column tiles leave SMs idle
    # (n = 12288: 128 tiles, not 96), and its k-split pair fills 128 SMs at n = 6144 (128x128's:
    # 96). Measured at m = 128: 0.92-0.97 of cuBLAS against 0.885-0.92 for 128x128 (no cluster, and
    # the k-split pair). cuBLAS itself runs a 96-column tile there. With rate 0.70 the model picks
    # it at those two points of the bar grid, and at 8 of 24 smaller shapes swept off the grid (6
    # faster than the previous pick, 2 slower: m = 192; benchmarks/results/gemm-variants-2026-11-29-s11).
    # 0.70 -> 0.80, with PULL_SCALE 1.2 (session 17): one wave of 128x96 CTAs (m = 256, 6144x12288;
    # m = 384, 12288x6144) runs near 128x256's flop rate and pulls ~95 GB/s per SM; the old rate put
    # the 2x1 pair with split-K there, measured 5-15 % slower (gemm-variants-2026-11-30-s17).
    _tile(128, 96): 0.80,
    # 128x224 (cluster 2x1, session 9): where n = 28672 is cut in 128 columns of tiles, its waves
    # quantize best at small m (m = 512: 512 tiles, 3.9 waves, against 2.7 for 128x320). Measured
    # there: 0.944-0.950 of cuBLAS at m = 512 (128x320: 0.909-0.912) and 1.03-1.05 at m = 256
    # (128x256: 0.95-0.96); on the other shapes it loses (0.56-0.87). With rate 1.00 the model picks
    # it at m = 256 and 512 with n = 28672 only. Its C is stored from registers: 224 columns are not
    # whole 64-column TMA boxes.
    _tile(128, 224, cluster_m=2): 1.00,
    # 64x256: 0.70 -> 1.00 (session 13): since session 12's k loop it runs at 128x256's per-SM flop
    # rate where its bytes let it (m = 192, 8192x8192: 50.4 us; m = 320: 72 us where the old pick,
    # 128x192 2x1, ran 120 us). Its pull rate is PULL_SCALE's.
    _tile(64, 256): 1.00,
    _tile(64, 128): 0.62,
    # 64x96 (session 14): at m <= 64 more CTAs stream B than with 64x128 (n = 12288: 128 tiles, not
    # 96 with 36 SMs idle): m = 64, 12288x6144 42.0 us against 45.2 (cuBLAS 42.7). Each CTA pulls
    # slower than 64x128's (PULL_SCALE), so where 64x128 already fills the SMs or 64x96's last tile
    # column is ragged (8192x8192) it loses. Rate as 64x128's (the sweep could not tell them apart).
    _tile(64, 96): 0.62,
    # 128 x 320: two m64n160 wgmma per k16 step per warpgroup (the tile cuBLAS picks for large
    # problems, 2026-11-29 ncu): 7 % more MACs per byte staged than 128 x 256, but wider column
    # tiles quantize worse, and no shared memory is left for TmaStore's staging; since session 5
    # the model picks it only where the waves favour it strongly (m = 512, n = 28672). Session 8
    # (each warpgroup waits for its own stage's group, RAWFLUX_WAIT0): 128x320 runs at 128x256's
    # rate, refit 1.02 -> 1.05 on 20 points m 1024..8192; the picks are within 0.4 % of the
    # fastest of four timed tiles at every point (it now wins at n = 28672, m >= 2048).
    _tile(128, 320, cluster_m=2): 1.05,
}


# k-split clusters (docs/gemm-notes.md, sessions 9-10): the two CTAs of a cluster take the two k
# halves of one tile and swap half their fp32 fragments through distributed shared memory, each
# then storing half the tile, instead of split-K's partials through L2 and a counter. Compiled for
# the plain GEMM only. Each needs one tile per cluster (2 x tiles CTAs at most the grid) and at
# least 2 k blocks (ksplit_fits). The model times one as split-K k2 on the same tile without a
# cluster, times KSPLIT_RATE: on the H200 (session 10) it ran 0.93-0.98x the time of split-K k2
# at all seven points measured (m 128-256), with the same bits.
# 1.00 since session 13's model (with 0.97 it picks the 128x256 pair at m = 192, n = 8192,
# k = 28672, measured 1.35x the best there, r3).
KSPLIT_RATE = 1.00
KSPLIT_TILES: tuple[TileConfig, ...] = (
    _tile(128, 128, cluster_k=2),
    _tile(128, 256, cluster_k=2),
    _tile(128, 96, cluster_k=2),
)


def tiles_for(b_layout: str) -> list[TileConfig]:
    return [t for t in TILES if t.supports(b_layout)]


def ksplit_fits(m: int, n: int, k: int, t: TileConfig, ctas: int) -> bool:
    """Whether k-split tile t can run (m, n, k) on a grid of `ctas` CTAs: one tile per cluster and a
    k block for each CTA of the pair."""
    return 2 * _cdiv(m, t.bm) * _cdiv(n, t.bn) <= ctas and _cdiv(k, BK) >= 2


def ksplit_base(t: TileConfig) -> TileConfig:
    """The compiled tile without a cluster that k-split tile t splits like split-K k2."""
    return next(x for x in TILES if (x.bm, x.bn, x.cluster_size, x.consumers) == (t.bm, t.bn, 1, t.consumers))


@dataclass(frozen=True)
class DeviceInfo:
    sms: int
    cc: tuple[int, int]
    l2_bytes: int
    name: str = ""

    # Leads measured on an H200 (DESIGN.md, docs/gemm-notes.md): these only rank candidates.
    @property
    def tflops_per_sm(self) -> float:
        return 5.5  # 128x256 mainloop, ~720 TF/s over 132 SMs

    @property
    def sm_pull_bytes_per_s(self) -> float:
        # What one SM's TMA pipeline pulls (L2 -> shared memory): ~55-65 GB/s with the k loop before
        # session 12, 70 GB/s fit in session 13 (PULL_SCALE for the tiles that pull more).
        return 70e9

    @property
    def fixup_bytes_per_s(self) -> float:
        # one SM's split-K partial traffic (fit to the sweeps of 2026-11-29 session 5; 16 GB/s until
        # session 14's refit)
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


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_plan(k: int, splits: int) -> tuple[int, int, int]:
    """(k_blocks, kb_per_split, effective splits): every split owns at least one k block."""
    kb = _cdiv(k, BK)
    splits = max(1, min(splits, kb))
    per = _cdiv(kb, splits)
    return kb, per, _cdiv(kb, per)


@dataclass(frozen=True)
class SkPlan:
    """Stream-K launch plan (cuda_src/rawflux/gemm/scheduler.cuh, StreamKSched)."""

    clusters: int  # G: clusters in the grid, one k run of the stream-K line each
    sk_tiles: int  # cluster tiles cut into k runs (the last of the raster order); 0: plain data-parallel
    max_pieces: int  # most runs any tile is cut into: the workspace's depth per slot (GemmParams.splits)
    pieces: int  # pieces in all tiles cut more than once (each writes an fp32 partial)
    k_blocks: int
    tail: int = 0  # split tail (GemmParams::tail_splits): pieces per stream-K tile at fixed k offsets; 0: equal runs
    band: int = 0  # banded stream-K (GemmParams::tail_splits = -band): clusters per band, tiles per stack

    @property
    def iters(self) -> int:
        return self.sk_tiles * self.k_blocks


def cluster_tiles(m: int, n: int, t: TileConfig) -> int:
    return _cdiv(_cdiv(m, t.bm), t.cluster_m) * _cdiv(_cdiv(n, t.bn), t.cluster_n)


def sk_pieces(tile: int, k_blocks: int, clusters: int, iters: int) -> tuple[int, int]:
    """(first owner, pieces) of stream-K tile `tile`: the same integer formulas as the kernel's
    scheduler (owner of iteration x = ((x + 1) * G - 1) // I)."""
    first = ((tile * k_blocks + 1) * clusters - 1) // iters
    last = ((tile + 1) * k_blocks * clusters - 1) // iters
    return first, last - first + 1


def band_shape(sk_tiles: int, k_blocks: int, clusters: int, band: int) -> tuple[int, int, int, int]:
    """(line, H, L, E) of banded stream-K, the kernel's integer formulas (scheduler.cuh): the line
    has sk_tiles / band stacks x k blocks, H = G / band full bands cut its first E = ceil(H I / G)
    iterations, and the L = G - H band clusters left over run [E, line) once per pass of L rows."""
    iters = sk_tiles * k_blocks
    line = iters // band
    h = clusters // band
    return line, h, clusters - h * band, (h * iters + clusters - 1) // clusters


def band_pieces(stack: int, k_blocks: int, clusters: int, sk_tiles: int, band: int) -> tuple[int, int, int]:
    """(first band, bands, pieces) of stack `stack` in banded stream-K, as the kernel counts them:
    the bands' pieces in k order, then one from the clusters left over if the stack reaches E."""
    line, h, _, e = band_shape(sk_tiles, k_blocks, clusters, band)
    c0 = stack * k_blocks
    first = ((c0 + 1) * h - 1) // e
    bands = (min(c0 + k_blocks, e) * h - 1) // e - first + 1 if c0 < e else 0
    return first, bands, bands + (1 if c0 + k_blocks > e else 0)


def band_height(m: int, n: int, cfg: GemmConfig) -> int:
    """The band that fits cfg's raster order: the height of a group's tile column (raster m: the
    tiles sharing B's rows) or the width of a group's tile row (raster n: those sharing A's)."""
    t = cfg.tile
    across = _cdiv(_cdiv(n, t.bn), t.cluster_n) if cfg.raster_n else _cdiv(_cdiv(m, t.bm), t.cluster_m)
    return min(max(1, cfg.group), across)


def _band_plan(ctiles: int, kb: int, g: int, band: int) -> SkPlan:
    """Banded stream-K's plan: the data-parallel waves before the last whose tiles end on a stack
    boundary run whole tiles; the rest is cut in bands. Data-parallel where it cannot run: no
    partial wave, tiles not a whole number of stacks, a band wider than the grid, leftover clusters
    that do not divide a stack, or the kernel's u32 bound (G x I < 2^31)."""
    full, rem = divmod(ctiles, g)
    fallback = SkPlan(min(g, ctiles), 0, 1, 0, kb)
    left = g % band
    if rem == 0 or ctiles % band or band > g or (left and band % left):
        return fallback
    waves = max((w for w in range(max(0, full - 1) + 1) if w * g % band == 0), default=0)
    sk = ctiles - waves * g
    if g * sk * kb >= 1 << 31:
        return fallback
    line, _, left, e = band_shape(sk, kb, g, band)
    if left and e >= line:  # the leftover clusters would have nothing to run
        return fallback
    cuts = [band_pieces(s, kb, g, sk, band)[2] for s in range(sk // band)]
    return SkPlan(g, sk, max(cuts), band * sum(c for c in cuts if c > 1), kb, band=band)


def sk_plan(m: int, n: int, k: int, cfg: GemmConfig, sms: int) -> SkPlan:
    """Which tiles run stream-K and how the grid cuts them. With W full waves and a partial one of
    R tiles (G clusters), the last full wave and the partial one (G + R tiles) are cut into G equal
    k runs, so every cluster ends at the same time; with no partial wave there is nothing to even
    out (sk_tiles = 0). The kernel's unsigned arithmetic needs G * I < 2^31 (I = sk_tiles x k
    blocks); beyond that the plan falls back to data-parallel.

    The split tail (cfg.tail = s >= 2) cuts only the R tiles of the partial wave, each into s pieces
    of ceil(k blocks / s) (fewer pieces where k has fewer blocks), piece j of every tail tile at the
    same k offset; the grid takes the R x s pieces piece index by piece index, so the clusters of a
    round load the same k range of neighbouring tiles, as data-parallel waves do (stream-K's runs
    start at scattered offsets and lose that L2 reuse). It pays where R x s pieces fill their rounds:
    ceil(R s / G) / s < 1 (R / G = 0.64: s = 3 takes the last wave in 2/3 of its time)."""
    t = cfg.tile
    kb = _cdiv(k, BK)
    ctiles = cluster_tiles(m, n, t)
    g = max(1, min(cfg.ctas or sms, sms) // t.cluster_size)
    full, rem = divmod(ctiles, g)
    if cfg.tail:
        if cfg.tail < 2:
            raise ValueError(f"config {cfg.tag()}: a split tail cuts each tile in at least 2 pieces")
        _, _, s = split_plan(k, cfg.tail)
        if rem == 0 or full == 0 or s < 2:  # no partial wave, no data-parallel one (split-K's case), or one piece
            return SkPlan(min(g, ctiles), 0, 1, 0, kb)
        return SkPlan(g, rem, s, rem * s, kb, tail=s)
    if cfg.band:
        return _band_plan(ctiles, kb, g, cfg.band)
    sk = 0 if rem == 0 else (ctiles if full == 0 else g + rem)
    if sk:
        g = min(g, sk * kb)  # every cluster owns >= 1 iteration (only when the tiles are fewer than G)
        if g * sk * kb >= 1 << 31:
            sk = 0
    if not sk:
        return SkPlan(min(g, ctiles), 0, 1, 0, kb)
    iters = sk * kb
    most, pieces = 1, 0
    for tile in range(sk):
        _, c = sk_pieces(tile, kb, g, iters)
        most = max(most, c)
        if c > 1:
            pieces += c
    return SkPlan(g, sk, most, pieces, kb)


# Session 13's refit of the model (docs/gemm-notes.md, session 13): scored on every config timed in
# session 12's sweeps (r3-r5) and session 13's A/B of moved picks, by the regret of the pick.
#
# A tile's pull rate relative to sm_pull_bytes_per_s: 64x256 moves 5.2 MB per CTA in 50 us at m = 192,
# 8192x8192 (~100 GB/s; its 40 KB stages keep more bytes in flight per TMA issue). 64x96's 20 KB
# stages keep fewer: ~50 GB/s per CTA where 64x128 pulls ~60 (m = 1-64, 6144x12288, session 14).
# Session 14 refit PULL_SCALE (64x96), DRAM_SM_OVERLAP (0.2 before), B_OOB_FILL_COST and the
# fix-up rate on its sweeps and A/B (docs/gemm-notes.md, session 14). 128x96's 8 stages of 28 KB:
# ~95 GB/s per CTA in one wave of 128 (m = 256, 6144x12288, session 17), 1.2 by the regret scan.
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


def _pull_rate(t: TileConfig, dev: DeviceInfo) -> float:
    """Bytes per second one SM pulls for tile t (sm_pull_bytes_per_s, scaled by PULL_SCALE)."""
    return dev.sm_pull_bytes_per_s * PULL_SCALE.get((t.bm, t.bn), 1.0)


def a_box_rows(t: TileConfig, m: int) -> int:
    """Rows of A's TMA box (GemmParams::a_box_rows, ops.gemm): the tile's slice, or m rounded up to
    8 when m is smaller. Rows past m would be zero-filled by the TMA unit, which costs more than
    loading them (session 13: 64x128 at m = 1, 8192x8192 ran 27 % slower than at m = 64); their
    results are never stored, so the stage's stale rows may stand in."""
    return min(t.bm // t.cluster_n, _cdiv(m, 8) * 8)


def a_tail_rows(t: TileConfig, m: int) -> int:
    """Rows of A's tail box (GemmParams::a_tail_rows, the kernel's tmap_a_tail), which a tile row
    short of a box loads instead of a full box whose rows past m the TMA unit would zero-fill
    (session 17: m = 192 on 128x96 ran 83 us with the full box, 66 with the tail box):
    - a ragged last tile row where m spans more than one box: its rows, rounded up to 8;
    - else, with clusters along m and an odd count of tile rows, the cluster's idle CTA (its tile
      wholly past m) zero-fills 8 rows instead of a box;
    - else 0 (no tail map). Also 0 with A multicast (cluster_n > 1: the box is split between CTAs)."""
    if t.cluster_n > 1:
        return 0
    tiles = _cdiv(m, t.bm)
    tail = m - (tiles - 1) * t.bm
    if m > t.bm and tail < t.bm:
        return _cdiv(tail, 8) * 8
    return 8 if tiles % t.cluster_m else 0


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
        return KSPLIT_RATE * estimate_us(m, n, k, GemmConfig(ksplit_base(t), 2, cfg.group, cfg.raster_n, cfg.ctas), dev, out_bytes)
    if cfg.stream_k:
        sp = sk_plan(m, n, k, cfg, dev.sms)
        if sp.sk_tiles:
            return _estimate_sk_us(m, n, k, cfg, dev, out_bytes, sp)
        cfg = replace(cfg, stream_k=False, splits=1, tail=0, band=0)
    if cfg.narrow:  # the data-parallel grid's time, scaled by the busiest cluster's columns
        base = replace(cfg, narrow=0)
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


# Pieces per tile the tuner tries for the split tail (sk_plan).
TAIL_SPLITS = (2, 3, 4, 5, 6)
# What a split-tail round costs beyond its k blocks and the partials' bytes (session 26, H200: the
# picks with 2-6 pieces timed at the 20 bar points, benchmarks/results/gemm-variants-2026-11-30-s26).
# Without it the model ran 2.7 % fast on the tail's time (rms 3 %) and would cut tiles at m = 1024
# where that measured 2.4 % slower; with 20 us the heuristic cuts them at 5 of the 20 points, each
# measured 0.6-1.7 % faster than the data-parallel pick (m >= 4096, the large shapes).
TAIL_ROUND_S = 20e-6
# The heuristic cuts a tail only after this many data-parallel waves: the range session 26 measured
# it in (the 5 picks had 11-54 waves). Shorter problems get it from the measured tuner.
TAIL_MIN_WAVES = 8


# Banded stream-K (session 27, H200; benchmarks/results/gemm-variants-2026-11-30-s27): against the
# data-parallel pick of the same tile it cost 13-19 us per launch more than the k blocks it saves
# (the fix-up: every cluster writes one fp32 partial and reads one back, and runs a third unit) at
# 16 of the 20 bar points, 25-58 us at four with long k and no data-parallel wave. It won from 6
# waves on (+0.8 to +2.4 % at 1024x28672x8192 and the m = 4096-8192 points) and lost below 6 at
# every point but one (2048x8192x28672, +1.2 %): the heuristic cuts bands from BAND_MIN_WAVES on.
# Without the fix-up's traffic (RAWFLUX_PROBE 65536 | 131072) bands still ran 0.5-7 % slower than
# the data-parallel grid at m = 1024-2048 where they should save 3 % (not understood yet). Only the
# 128x256 pair is offered bands: with 128x192 they lost 1.5-2 % at 2048x12288x6144 and
# 4096x6144x12288 against the 128x256 pair's data-parallel grid.
BAND_FIX_S = 16e-6
BAND_MIN_WAVES = 6
BAND_TILES = (_tile(128, 256, cluster_m=2),)


def band_config(m: int, n: int, k: int, t: TileConfig, dev: DeviceInfo) -> GemmConfig | None:
    """Banded stream-K on tile t as the heuristic would run it (its raster: along the longer side;
    the band: that raster's group column), or None where its plan cannot cut tiles."""
    raster_n = _cdiv(m, t.bm) > _cdiv(n, t.bn)
    cfg = GemmConfig(t, 1, 8, raster_n, stream_k=True)
    cfg = replace(cfg, band=band_height(m, n, cfg))
    if t not in BAND_TILES or cfg.band < 2 or not sk_plan(m, n, k, cfg, dev.sms).band:
        return None
    return cfg


# Narrow columns (scheduler.cuh, NarrowSched<w>): data-parallel on the 128x256 pair, nk, 16-bit C. Every
# bar shape has 128 j pair tiles, which 66 clusters run in waves whose last is 0.82-0.94 full, so the
# busiest cluster runs W tiles where the mean is 0.97 W (the same for cuBLAS). More, narrower
# columns for the last wave's tiles bring the busiest cluster's columns down to within a width step
# of the mean. The widths compiled: the wgmma N steps past 192 (TmaStore's last box is then cut,
# TmaStore::store_narrow), but 248, which measured 1.2 % slower than the data-parallel pair at
# 1024x8192x8192 where it should save 1.6 % (session 28).
# Measured (session 28, two runs): 0.3-1.3 % faster than the data-parallel pair at 1024x12288x6144,
# 2048 x {12288x6144, 8192x8192}, and 2-4 % at 2048x8192x28672: about the busiest cluster's saving
# less NARROW_COST. Not against bands or split tails, which measured as fast or faster from 6 waves
# on (NARROW_MAX_WAVES): the heuristic offers narrow columns below that only.
NARROW_TILES = (_tile(128, 256, cluster_m=2),)
NARROW_WIDTHS = (208, 216, 224, 232, 240)
NARROW_COST = 0.008
NARROW_MAX_WAVES = 6
NARROW_MIN_ROWS = 4  # pair rows: measured at 4-8 (m = 1024-2048); at m = 256 the 128x224 pair, measured, stays


@dataclass(frozen=True)
class NarrowPlan:
    """Narrow columns: `columns` tile columns, those from `narrow_from` on `width` wide, the others
    the tile's bn; the busiest cluster's columns (summed over its tiles), and the data-parallel
    grid's."""

    columns: int
    narrow_from: int
    width: int
    load: int
    dp_load: int


def raster(cu: int, ctm: int, ctn: int, group: int, raster_n: bool = False) -> tuple[int, int]:
    """TileSchedT's grouped order (scheduler.cuh): cluster tile cu of ctm x ctn -> (cluster row,
    cluster column). `group` tile-rows side by side walked along n, or with raster_n `group`
    tile-columns walked along m (the kernel's two branches, one with the dimensions swapped)."""
    rows, cols = (ctn, ctm) if raster_n else (ctm, ctn)
    per_group = group * cols
    g = cu // per_group
    first = g * group
    gsize = min(rows - first, group)
    r = cu - g * per_group
    major, minor = first + r % gsize, r // gsize
    return (minor, major) if raster_n else (major, minor)


def narrow_plan(m: int, n: int, cfg: GemmConfig, sms: int) -> NarrowPlan | None:
    """The narrow-column plan with the least-loaded busiest cluster, or None where none beats the
    data-parallel grid. Cluster c runs units c, c + G, ... (TileSchedT), each its column's width;
    the columns of the last wave's units (and every later column) are narrow, the wave count stays
    the data-parallel grid's, and every column starts before n. The narrow width is cfg.narrow, or
    with cfg.narrow = 0 the least compiled one that covers n."""
    t = cfg.tile
    if t not in NARROW_TILES or cfg.splits != 1 or cfg.stream_k:
        return None
    widths = (cfg.narrow,) if cfg.narrow else NARROW_WIDTHS
    g = max(1, min(cfg.ctas or sms, sms) // t.cluster_size)
    rows, cols0 = _cdiv(_cdiv(m, t.bm), t.cluster_m), _cdiv(n, t.bn)
    waves = _cdiv(rows * cols0, g)
    if waves < 2 or rows * cols0 % g == 0:
        return None
    group = max(1, cfg.group)
    dp_load = waves * t.bn
    best = None
    for cols in range(cols0 + 1, waves * g // rows + 1):
        units = rows * cols
        first = min(raster(u, rows, cols, group, cfg.raster_n)[1] for u in range((waves - 1) * g, units))
        wide = first * t.bn
        if wide >= n:
            continue
        need = _cdiv(n - wide, cols - first)
        width = min((x for x in widths if x >= need), default=0)
        if not width or wide + (cols - first - 1) * width >= n:  # too wide for the columns, or one starts past n
            continue
        load = [0] * g
        for u in range(units):
            load[u % g] += t.bn if raster(u, rows, cols, group, cfg.raster_n)[1] < first else width
        if max(load) < dp_load and (best is None or max(load) < best.load):
            best = NarrowPlan(cols, first, width, max(load), dp_load)
    return best


def narrow_config(m: int, n: int, t: TileConfig, dev: DeviceInfo) -> GemmConfig | None:
    """Narrow columns on tile t as the heuristic would run them (its raster: along the longer side),
    with the plan's width, or None where no plan beats the data-parallel grid."""
    cfg = GemmConfig(t, 1, 8, _cdiv(m, t.bm) > _cdiv(n, t.bn))
    plan = narrow_plan(m, n, cfg, dev.sms)
    return None if plan is None else replace(cfg, narrow=plan.width)


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
                out.append(GemmConfig(t, s, 8, raster_n))
        if t.stream_k_ok and sk_plan(m, n, k, GemmConfig(t, stream_k=True), dev.sms).sk_tiles:
            for raster_n in (False, True):
                out.append(GemmConfig(t, 1, 8, raster_n, stream_k=True))
            for s in TAIL_SPLITS:  # the split tail where its pieces fill their rounds
                sp = sk_plan(m, n, k, GemmConfig(t, stream_k=True, tail=s), dev.sms)
                if sp.tail == s and _cdiv(sp.pieces, sp.clusters) < s:
                    for raster_n in (False, True):
                        out.append(GemmConfig(t, 1, 8, raster_n, stream_k=True, tail=s))
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
        # (session 10; the model does not see the empty rows' tensor time).
        if t.supports(b_layout) and 2 * m > t.bm and ksplit_fits(m, n, k, t, dev.sms):
            for raster_n in (False, True):
                out.append(GemmConfig(t, 1, 8, raster_n))
    return out


def heuristic(m: int, n: int, k: int, b_layout: str, dev: DeviceInfo, out_bytes: int = 2) -> GemmConfig:
    """Best configuration by the time model. Ties go to fewer splits (less workspace traffic).
    Stream-K is left to the measured tuner: on the H200 sweep of 2026-11-29 (session 6) it was
    slower than the best split-K or data-parallel configuration at 29 of 30 points and equal at
    the 30th (the model does not see its loss of L2 reuse: clusters at different k offsets of
    tiles that share operands; benchmarks/results/gemm-variants-2026-11-29-s6/README.md). The split
    tail (k-aligned pieces of the partial wave's tiles) is the heuristic's to pick, by the model
    with TAIL_ROUND_S."""
    best, best_t = None, math.inf
    cands = candidates(m, n, k, b_layout, dev, out_bytes)
    # Bands compete only where the pick is not a split tail: off the bar grid (1536x28672x8192, session
    # 27) a band measured 4 % slower than the split tail there; on it they tied (4096-8192 x 28672).
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


# ---------------------------------------------------------------------------------------------
# Measured tuner: results keyed on (m, n, k, dtype, layout, out dtype, SMs, cc), persisted in
# <cache dir>/gemm_tune.json. 'cached' reads them; 'on' also tunes unseen problems on first use.


def tune_key(m, n, k, dtype: str, b_layout: str, out_dtype: str, dev: DeviceInfo) -> str:
    return f"{m},{n},{k},{dtype},{b_layout},{out_dtype},sm{dev.sms},cc{dev.cc[0]}{dev.cc[1]}"


_tune_lock = threading.Lock()
_tune_table: dict[str, dict] | None = None


def _tune_path() -> Path:
    return env.cache_dir() / "gemm_tune.json"


def _load_table() -> dict[str, dict]:
    global _tune_table
    with _tune_lock:
        if _tune_table is None:
            try:
                _tune_table = json.loads(_tune_path().read_text())
            except (OSError, ValueError):
                _tune_table = {}
        return _tune_table


def lookup(key: str) -> GemmConfig | None:
    if env.tune_mode() == "off":
        return None
    hit = _load_table().get(key)
    if hit is None:
        return None
    try:
        cfg = GemmConfig.from_json(hit["config"])
    except (KeyError, TypeError, ValueError):
        return None
    return cfg if cfg.tile in TILES else None


def store(key: str, cfg: GemmConfig, us: float) -> None:
    table = _load_table()
    with _tune_lock:
        table[key] = {"config": cfg.to_json(), "us": us}
        path = _tune_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache folder: the result lives for this process only


def tune(m, n, k, b_layout: str, dev: DeviceInfo, time_us, *, top: int = 10, out_bytes: int = 2) -> tuple[GemmConfig, float]:
    """Times the `top` best candidates of the model with `time_us(cfg) -> microseconds` (the op
    supplies it: tune sits below ops), plus the model's two best stream-K candidates (the model
    flatters stream-K, so they never take a place from the others), and returns the fastest with
    its time."""
    ranked = sorted(candidates(m, n, k, b_layout, dev, out_bytes), key=lambda c: estimate_us(m, n, k, c, dev, out_bytes))
    seen, trials = set(), []
    for c in ranked:  # split tails and bands compete here; stream-K's runs get their own two places below
        if c in seen or (c.stream_k and not c.tail and not c.band):
            continue
        seen.add(c)
        trials.append(c)
        if len(trials) >= top:
            break
    for c in [c for c in ranked if c.stream_k and not c.tail and not c.band][:2]:
        seen.add(c)
        trials.append(c)
    h = heuristic(m, n, k, b_layout, dev, out_bytes)
    if h not in seen:
        trials.append(h)
    best, best_us = None, math.inf
    for c in trials:
        us = time_us(c)
        if us < best_us:
            best, best_us = c, us
    return best, best_us
