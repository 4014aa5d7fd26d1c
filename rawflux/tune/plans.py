"""Work plans: how a launch of a GemmConfig on (m, n, k) cuts its work among the grid, as the
kernel's schedulers (cuda_src/rawflux/gemm/scheduler/) compute it: split-K, stream-K and its split
tail and bands, narrow columns, the raster order, A's TMA boxes, and the launch's WorkPlan."""
from __future__ import annotations

from dataclasses import dataclass

from .configs import BK, NARROW_TILES, NARROW_WIDTHS, GemmConfig, TileConfig, _cdiv


def split_plan(k: int, splits: int) -> tuple[int, int, int]:
    """(k_blocks, kb_per_split, effective splits): every split owns at least one k block."""
    kb = _cdiv(k, BK)
    splits = max(1, min(splits, kb))
    per = _cdiv(kb, splits)
    return kb, per, _cdiv(kb, per)


@dataclass(frozen=True)
class SkPlan:
    """Stream-K launch plan (cuda_src/rawflux/gemm/scheduler/stream_k.cuh, StreamKSched)."""

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
    """(line, H, L, E) of banded stream-K, the kernel's integer formulas (TileSchedT::next in
    gemm/scheduler/tile.cuh): the line has sk_tiles / band stacks x k blocks, H = G / band full
    bands cut its first E = ceil(H I / G) iterations, and the L = G - H band clusters left over run
    [E, line) once per pass of L rows."""
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
    """TileSchedT's grouped order (gemm/scheduler/tile.cuh): cluster tile cu of ctm x ctn ->
    (cluster row, cluster column). `group` tile-rows side by side walked along n, or with raster_n
    `group` tile-columns walked along m (the kernel's two branches, one with the dimensions
    swapped)."""
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


def a_box_rows(t: TileConfig, m: int) -> int:
    """Rows of A's TMA box (GemmParams::a_box_rows, ops.gemm): the tile's slice, or m rounded up to
    8 when m is smaller. Rows past m would be zero-filled by the TMA unit, which costs more than
    loading them (with a whole box, 64x128 at m = 1, 8192x8192 ran 27 % slower than at m = 64);
    their results are never stored, so the stage's stale rows may stand in."""
    return min(t.bm // t.cluster_n, _cdiv(m, 8) * 8)


def a_tail_rows(t: TileConfig, m: int) -> int:
    """Rows of A's tail box (GemmParams::a_tail_rows, the kernel's tmap_a_tail), which a tile row
    short of a box loads instead of a full box whose rows past m the TMA unit would zero-fill
    (m = 192 on 128x96 ran 83 us with the full box, 66 with the tail box):
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


# ---------------------------------------------------------------------------------------------
# The work plan of one launch: what the scheduler's parameters and the grid are for a config and a
# shape, computed once per (config, shape) by the engine's launch plan.


@dataclass(frozen=True)
class WorkPlan:
    """A launch of a config on (m, n, k): its grid and the scheduler's run-time parameters
    (GemmParams in cuda_src/rawflux/gemm/config.cuh)."""

    clusters: int  # clusters in the grid (CTAs / cluster size)
    k_blocks: int
    kb_per_split: int  # k blocks per split (split-K, k-split clusters); k_blocks with stream-K
    splits: int  # most pieces a tile is cut into: the workspace's depth per slot (1: no fix-up)
    tiles_n: int  # tile columns (more than ceil(n / bn) with narrow columns)
    sk_tiles: int = 0  # stream-K: the cluster tiles cut in k
    tail_splits: int = 0  # stream-K: 0 equal runs, s > 0 the split tail, -b bands of b clusters
    narrow_from: int = 0  # narrow columns: the first narrow tile column
    slots: int = 0  # fix-up slots (CTA tiles with partials); 0 without a fix-up


def work_plan(m: int, n: int, k: int, cfg: GemmConfig, sms: int) -> WorkPlan:
    """The grid and scheduler parameters of cfg on (m, n, k) on `sms` SMs. Raises where the config
    cannot run the shape (no narrow-column plan beats the data-parallel grid)."""
    t = cfg.tile
    kb, per, splits = split_plan(k, cfg.splits)
    if t.cluster_k > 1:  # the k halves of a k-split cluster: split where split-K k2 splits
        _, per, _ = split_plan(k, t.cluster_k)
    tiles_n, narrow_from = _cdiv(n, t.bn), 0
    ctiles = cluster_tiles(m, n, t)
    if cfg.narrow:
        npl = narrow_plan(m, n, cfg, sms)
        if npl is None:
            raise ValueError(f"config {cfg.tag()}: no narrow-column plan of width {cfg.narrow} for m = {m}, n = {n} beats the "
                             f"data-parallel grid")
        tiles_n, narrow_from = npl.columns, npl.narrow_from
        ctiles = cluster_tiles(m, 1, t) * npl.columns
    if cfg.stream_k:
        sp = sk_plan(m, n, k, cfg, sms)
        slots = sp.sk_tiles * t.cluster_size if sp.max_pieces > 1 else 0  # per CTA tile of the stream-K tiles
        return WorkPlan(sp.clusters, sp.k_blocks, sp.k_blocks, sp.max_pieces, tiles_n, sp.sk_tiles, sp.tail or -sp.band, 0, slots)
    ctas = min(cfg.ctas or sms, sms)
    clusters = max(1, min(ctas // t.cluster_size, ctiles * splits))
    slots = _cdiv(m, t.bm) * _cdiv(n, t.bn) if splits > 1 else 0  # split-K: one fix-up slot per CTA tile
    return WorkPlan(clusters, kb, per, splits, tiles_n, 0, 0, narrow_from, slots)
