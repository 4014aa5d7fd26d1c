"""GEMM configurations: the compiled tiles (TileConfig and the tile tables), the decompositions a
launch cuts its work by (Decomp), full launch configurations (GemmConfig) and their tags."""
from __future__ import annotations

from dataclasses import asdict, dataclass

SMEM_PER_CTA = 232448  # sm_90 opt-in limit of dynamic shared memory per block (227 KB)
BK = 64


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
        128 x 320 tile's scheduler spilled with it (gemm/scheduler/stream_k.cuh)."""
        return self.wn <= 256 and self.cluster_k == 1

    def supports(self, b_layout: str) -> bool:
        # kn: B's shared tile is 64-column chunks and one wgmma spans a warpgroup's columns (<= 256)
        return b_layout == "nk" or (self.bn % 64 == 0 and self.wn % 64 == 0 and self.wn <= 256)

    def tag(self) -> str:
        c = f"c{self.cluster_m}x{self.cluster_n}" if self.cluster_m * self.cluster_n > 1 else "c1"
        if self.cluster_k > 1:
            c += f"k{self.cluster_k}"
        return f"{self.bm}x{self.bn}x{BK}s{self.stages}{c}w{self.consumers}"


_DECOMP_TAGS = {"dp": "k1", "split_k": "k", "stream_k": "sk", "tail": "t", "band": "b", "narrow": "n"}


@dataclass(frozen=True)
class Decomp:
    """How a launch cuts the work among the grid (GemmConfig.decomp); ``n`` is the kind's parameter.

    ========  ===================================================================  =====
    kind      what runs                                                            tag
    ========  ===================================================================  =====
    dp        data-parallel: whole tiles, whole k (n = 0)                          k1
    split_k   every tile's k cut in n >= 2 splits, summed by the last (fp32)       k{n}
    stream_k  the tiles past the last full wave cut into equal k runs per cluster  sk
    tail      the partial wave's tiles cut in n >= 2 pieces at fixed k offsets     t{n}
    band      banded stream-K: bands of n >= 2 clusters run stacks side by side    b{n}
    narrow    data-parallel, the last wave's tile columns n wide (narrow_plan)     n{n}
    ========  ===================================================================  =====

    stream_k, tail and band run StreamKSched's stream-K plan (sk_plan), narrow NarrowSched<n>.
    """

    kind: str = "dp"
    n: int = 0

    def __post_init__(self):
        if self.kind not in _DECOMP_TAGS:
            raise ValueError(f"decomposition kind {self.kind!r} is not one of {', '.join(_DECOMP_TAGS)}")
        if self.kind in ("dp", "stream_k") and self.n != 0:
            raise ValueError(f"decomposition {self.kind!r} takes no parameter (n = {self.n})")
        if self.kind in ("split_k", "tail", "band") and self.n < 2:
            raise ValueError(f"decomposition {self.kind!r} cuts in at least 2, got {self.n}")
        if self.kind == "narrow" and self.n < 8:
            raise ValueError(f"narrow columns need a width >= 8, got {self.n}")

    @staticmethod
    def split_k(splits: int) -> "Decomp":
        """k cut in `splits` (1: data-parallel)."""
        return Decomp("split_k", splits) if splits > 1 else DP

    def tag(self) -> str:
        return "k1" if self.kind == "dp" else ("sk" if self.kind == "stream_k" else f"{_DECOMP_TAGS[self.kind]}{self.n}")


DP = Decomp()
STREAM_K = Decomp("stream_k")


@dataclass(frozen=True)
class GemmConfig:
    """A full launch configuration: the tile (compile time) and the run-time choices."""

    tile: TileConfig
    decomp: Decomp = DP
    group: int = 8  # raster group width in cluster tiles
    raster_n: bool = False  # False: groups of tile-rows walked along n
    ctas: int = 0  # persistent CTAs (0: every SM)
    rotate: int = 0  # cluster tile rows the order starts at, wrapping (the fused AllGather's own chunk first); 0: the plain order

    # Read-only views of the decomposition, as the model and the launch plan ask for them.
    @property
    def splits(self) -> int:
        """k splits of split-K (1 otherwise)."""
        return self.decomp.n if self.decomp.kind == "split_k" else 1

    @property
    def stream_k(self) -> bool:
        """Whether the launch runs a stream-K plan (stream_k, tail or band)."""
        return self.decomp.kind in ("stream_k", "tail", "band")

    @property
    def tail(self) -> int:
        return self.decomp.n if self.decomp.kind == "tail" else 0

    @property
    def band(self) -> int:
        return self.decomp.n if self.decomp.kind == "band" else 0

    @property
    def narrow(self) -> int:
        return self.decomp.n if self.decomp.kind == "narrow" else 0

    def tag(self) -> str:
        rot = f"/r{self.rotate}" if self.rotate else ""
        return f"{self.tile.tag()}/{self.decomp.tag()}/g{self.group}{'n' if self.raster_n else 'm'}/p{self.ctas}{rot}"

    def to_json(self) -> dict:
        d = {"tile": asdict(self.tile), "decomp": self.decomp.tag(), "group": self.group, "raster_n": self.raster_n,
             "ctas": self.ctas}
        if self.rotate:
            d["rotate"] = self.rotate
        return d

    @staticmethod
    def from_json(d: dict) -> "GemmConfig":
        if "decomp" in d:
            decomp = _parse_decomp(str(d["decomp"]))
        else:  # tuner tables written before the decomposition was one field
            st, tl, bd, nw = bool(d.get("stream_k")), int(d.get("tail", 0)), int(d.get("band", 0)), int(d.get("narrow", 0))
            if st:
                decomp = Decomp("tail", tl) if tl else (Decomp("band", bd) if bd else STREAM_K)
            else:
                decomp = Decomp("narrow", nw) if nw else Decomp.split_k(int(d.get("splits", 1)))
        return GemmConfig(TileConfig(**d["tile"]), decomp, int(d["group"]), bool(d["raster_n"]), int(d.get("ctas", 0)),
                          int(d.get("rotate", 0)))


def _parse_decomp(tag: str) -> Decomp:
    import re

    mt = re.fullmatch(r"k(\d+)|(sk)|t(\d+)|b(\d+)|n(\d+)", tag)
    if mt is None:
        raise ValueError(f"not a decomposition tag: {tag!r} (k<splits>, sk, t<pieces>, b<clusters> or n<width>)")
    k, sk, tl, bd, nw = mt.groups()
    if sk:
        return STREAM_K
    if tl is not None:
        return Decomp("tail", int(tl))
    if bd is not None:
        return Decomp("band", int(bd))
    if nw is not None:
        return Decomp("narrow", int(nw))
    return Decomp.split_k(int(k))


def parse_tag(tag: str) -> GemmConfig:
    """The GemmConfig a tag names (GemmConfig.tag(), e.g. '128x256x64s4c2x1w2/k1/g8m/p0', or
    '.../sk/...' for stream-K, '.../t3/...' for the split tail, '.../b4/...' for banded stream-K,
    '.../n240/...' for narrow columns, '.../p0/r3' for an order starting at cluster tile row 3); the
    tile must be one rawflux compiles."""
    import re

    mt = re.fullmatch(r"(\d+)x(\d+)x64s(\d+)c(?:(\d+)x(\d+)|1)(?:k(\d))?w(\d)/([a-z0-9]+)/g(\d+)([mn])/p(\d+)(?:/r(\d+))?", tag.strip())
    if mt is None:
        raise ValueError(f"not a gemm config tag: {tag!r} (expected e.g. '128x256x64s4c2x1w2/k1/g8m/p0', '.../sk/g8m/p0' "
                         f"'.../t3/g8m/p0', '.../b4/g8m/p0' or '.../n240/g8m/p0')")
    bm, bn, st, cm, cn, ck, w, dc, g, r, p, rot = mt.groups()
    try:
        decomp = _parse_decomp(dc)
    except ValueError as e:
        raise ValueError(f"gemm config tag {tag!r}: {e}") from None
    tile = TileConfig(int(bm), int(bn), int(st), int(cm or 1), int(cn or 1), int(w), int(ck or 1))
    if tile not in TILES and tile not in KSPLIT_TILES:
        raise ValueError(f"tile {tile.tag()} is not compiled by rawflux (tiles: {', '.join(t.tag() for t in (*TILES, *KSPLIT_TILES))})")
    if decomp.kind == "narrow" and decomp.n not in NARROW_WIDTHS:
        raise ValueError(f"gemm config tag {tag!r}: narrow columns are {', '.join(map(str, NARROW_WIDTHS))} wide")
    return GemmConfig(tile, decomp, int(g), r == "n", int(p), int(rot or 0))


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
# measured by benchmarks/gemm.py --sweep). They only rank candidates for the heuristic; the measured
# tuner (RAWFLUX_TUNE=on) decides on real timings. Measurements: docs/decisions.md, "Tile choice and
# time model".
TILES: dict[TileConfig, float] = {
    # Rates fit on measured data (benchmarks/gemm.py --tiles, bf16, 25 points m 512..8192 on the
    # five shapes): with these the model picks the fastest of 128x192 / 128x256 / 128x320 (cluster
    # 2x1) and 128x256 (no cluster) within 1 % at 25 of 25 points.
    _tile(128, 256, cluster_m=2): 1.05,
    _tile(128, 256): 1.01,
    _tile(128, 192, cluster_m=2): 1.02,
    _tile(128, 192): 0.98,
    # 128x128: at m = 256, 8192x8192 it ran 49.3 us, 0.99 of 128x256's per-SM flop rate; pulled by
    # its bytes (below) it still loses at large m.
    _tile(128, 128): 0.90,
    # 128x96: at m = 128 its tiles fill the grid where 128-column tiles leave SMs idle (n = 12288:
    # 128 tiles, not 96), and its k-split pair fills 128 SMs at n = 6144 (128x128's: 96). Measured
    # at m = 128: 0.92-0.97 of cuBLAS against 0.885-0.92 for 128x128 (no cluster, and the k-split
    # pair); cuBLAS itself runs a 96-column tile there. 0.80 with PULL_SCALE 1.2: one wave of 128x96
    # CTAs (m = 256, 6144x12288; m = 384, 12288x6144) runs near 128x256's flop rate and pulls ~95 GB/s
    # per SM; at 0.70 the model put the 2x1 pair with split-K there, measured 5-15 % slower.
    _tile(128, 96): 0.80,
    # 128x224 (cluster 2x1): where n = 28672 is cut in 128 columns of tiles, its waves quantize best
    # at small m (m = 512: 512 tiles, 3.9 waves, against 2.7 for 128x320). Measured there:
    # 0.944-0.950 of cuBLAS at m = 512 (128x320: 0.909-0.912) and 1.03-1.05 at m = 256 (128x256:
    # 0.95-0.96); on the other shapes it loses (0.56-0.87). With rate 1.00 the model picks it at
    # m = 256 and 512 with n = 28672 only. Its C is stored from registers: 224 columns are not
    # whole 64-column TMA boxes.
    _tile(128, 224, cluster_m=2): 1.00,
    # 64x256: runs at 128x256's per-SM flop rate where its bytes let it (m = 192, 8192x8192:
    # 50.4 us; m = 320: 72 us where 128x192 2x1, its pick at rate 0.70, ran 120 us). Its pull rate
    # is PULL_SCALE's.
    _tile(64, 256): 1.00,
    _tile(64, 128): 0.62,
    # 64x96: at m <= 64 more CTAs stream B than with 64x128 (n = 12288: 128 tiles, not 96 with 36
    # SMs idle): m = 64, 12288x6144 42.0 us against 45.2 (cuBLAS 42.7). Each CTA pulls slower than
    # 64x128's (PULL_SCALE), so where 64x128 already fills the SMs or 64x96's last tile column is
    # ragged (8192x8192) it loses. Rate as 64x128's (the sweep could not tell them apart).
    _tile(64, 96): 0.62,
    # 128 x 320: two m64n160 wgmma per k16 step per warpgroup (the tile cuBLAS picks for large
    # problems, per ncu): 7 % more MACs per byte staged than 128 x 256, but wider column tiles
    # quantize worse, and no shared memory is left for TmaStore's staging. With each warpgroup
    # waiting for its own stage's group it runs at 128x256's rate: 1.05, fit on 20 points
    # m 1024..8192, puts the picks within 0.4 % of the fastest of four timed tiles at every point
    # (it wins at n = 28672, m >= 2048).
    _tile(128, 320, cluster_m=2): 1.05,
}


# k-split clusters: the two CTAs of a cluster take the two k halves of one tile and swap half their
# fp32 fragments through distributed shared memory, each then storing half the tile, instead of
# split-K's partials through L2 and a counter (+1.6 to +6.4 points over split-K 2 at m = 128).
# Compiled for the plain GEMM only. Each needs one tile per cluster (2 x tiles CTAs at most the
# grid) and at least 2 k blocks (ksplit_fits). The model times them with KSPLIT_RATE (model.py).
KSPLIT_TILES: tuple[TileConfig, ...] = (
    _tile(128, 128, cluster_k=2),
    _tile(128, 256, cluster_k=2),
    _tile(128, 96, cluster_k=2),
)

# Banded stream-K is offered on the 128x256 pair only: with 128x192 bands lost 1.5-2 % at
# 2048x12288x6144 and 4096x6144x12288 against the 128x256 pair's data-parallel grid.
BAND_TILES = (_tile(128, 256, cluster_m=2),)

# Narrow columns (gemm/scheduler/narrow.cuh, NarrowSched<w>): data-parallel on the 128x256 pair, nk,
# 16-bit C. Every bar shape has 128 j pair tiles, which 66 clusters run in waves whose last is
# 0.82-0.94 full, so the busiest cluster runs W tiles where the mean is 0.97 W (the same for
# cuBLAS). More, narrower columns for the last wave's tiles bring the busiest cluster's columns down
# to within a width step of the mean. The widths compiled: the wgmma N steps past 192 (TmaStore's
# last box is then cut, TmaStore::store_narrow), but 248, which measured 1.2 % slower than the
# data-parallel pair at 1024x8192x8192 where it should save 1.6 %.
NARROW_TILES = (_tile(128, 256, cluster_m=2),)
NARROW_WIDTHS = (208, 216, 224, 232, 240)


def tiles_for(b_layout: str) -> list[TileConfig]:
    return [t for t in TILES if t.supports(b_layout)]


def ksplit_fits(m: int, n: int, k: int, t: TileConfig, ctas: int) -> bool:
    """Whether k-split tile t can run (m, n, k) on a grid of `ctas` CTAs: one tile per cluster and a
    k block for each CTA of the pair."""
    return 2 * _cdiv(m, t.bm) * _cdiv(n, t.bn) <= ctas and _cdiv(k, BK) >= 2


def ksplit_base(t: TileConfig) -> TileConfig:
    """The compiled tile without a cluster that k-split tile t splits like split-K k2."""
    return next(x for x in TILES if (x.bm, x.bn, x.cluster_size, x.consumers) == (t.bm, t.bn, 1, t.consumers))
