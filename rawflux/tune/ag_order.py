"""AllGather-GEMM's tile order and chunk arrivals, as pure integer functions (rawflux.plan ag_gemm
and tests/cpu run them over the shape grid; no CUDA, no op import).

The fused GEMM on rank r of W is TileSchedT's data-parallel order (gemm/scheduler/tile.cuh) with
the fused ops' row rotation: cluster tile cu -> (cm, cn) by the grouped raster (plans.raster), then
cm moves up by the tile rows before rank r's segment, shift = ceil(r * m / W / (BM * cluster_m)), mod
the cluster rows. Cluster c of G runs units c, c + G, c + 2G, ...; a unit's rows are its cluster
row's, clipped at m, and it waits for every chunk (m / W rows, chunk q = rank q's shard) they touch
(AgWait in fused/ag_gemm.cuh; ops.ag_gemm.chunk_span is the same rule).

Arrivals (push or pull, copy engine): chunk (r + s) mod W lands at s x one chunk's link time, the
own chunk is there at 0 (ops.ag_gemm.arrival_order).

K-slabs: each chunk is sent as S slabs of k / S columns, slab-major (every peer's slab 0, then
every peer's slab 1, ...), with a flag per (chunk, slab); a unit's mainloop reads k in order, so it
needs slab j only j / S of its time after it starts (slab_need_us). pick_slabs chooses S for a call
(ops.ag_gemm runs it).

Limits: every unit takes the same time (a wave of the model's GEMM time) and reads k at one rate; a
chunk (slab) lands whole at once (the flag follows the data); the link runs at one rate with no
contention, latency or per-copy cost.
"""
from __future__ import annotations

from dataclasses import dataclass

from .configs import TileConfig
from .plans import raster

__all__ = ["AgSim", "ag_units", "arrival_step", "arrival_us", "chunk_span", "cluster_rows", "ctiles", "rotation", "row_shift",
           "pick_slabs", "simulate", "simulate_slabs", "slab_arrival_us", "slab_flag_us", "slab_need_us", "unit_need_us", "unit_span",
           "SLAB_CHOICES", "SLAB_FLAG_US", "SLAB_GAIN"]

SLAB_CHOICES = (1, 2, 4, 8)  # k-slabs per chunk a call may use (kAgMaxSlabs = 8 in fused/ag_gemm.cuh)
SLAB_GAIN = 0.97  # S > 1 only where the model's GEMM ends this much earlier than with whole chunks
# Device us a unit pays per extra flag wait, (S - 1) per peer chunk its rows touch: the acquire and
# the producer's stall at each slab. Emulated link, H100, W = 8 qkv m = 64 (every unit on 7 peer
# chunks): S = 2 / 4 / 8 cost 0.8 / 2.4 / 8.7 us over whole chunks.
SLAB_FLAG_US = 0.15


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def ctiles(m: int, n: int, tile: TileConfig) -> tuple[int, int]:
    """(cluster rows, cluster columns) of an (m, n) output (TileSchedT's ctiles_m, ctiles_n)."""
    return _cdiv(_cdiv(m, tile.bm), tile.cluster_m), _cdiv(_cdiv(n, tile.bn), tile.cluster_n)


def rotation(m: int, world: int, rank: int, tile: TileConfig) -> tuple[int, int]:
    """(seg_count, seg_start) of the fused GEMM's row rotation: rank's order starts at the first
    cluster row wholly inside its own chunk, so a row shared with chunk rank - 1 (the last to land)
    comes last, not first. TileSchedT moves cluster rows up by seg_start * (m / seg_count) // rows
    (rounding down), so it gets one-row segments (seg_count = m) and that row as seg_start."""
    rows = tile.bm * tile.cluster_m
    return m, _cdiv(rank * (m // world), rows) * rows


def row_shift(m: int, world: int, rank: int, tile: TileConfig) -> int:
    """Cluster rows the rotation moves rank's order up by: TileSchedT's formula on rotation()."""
    seg_count, seg_start = rotation(m, world, rank, tile)
    return seg_start * (m // seg_count) // (tile.bm * tile.cluster_m) % ctiles(m, 1, tile)[0]


def ag_units(m: int, n: int, world: int, rank: int, tile: TileConfig, group: int, raster_n: bool = False) -> list[tuple[int, int]]:
    """(cluster row, cluster column) of every unit, in unit order, on rank (data-parallel: one
    unit per cluster tile)."""
    ctm, ctn = ctiles(m, n, tile)
    shift = row_shift(m, world, rank, tile) if world > 1 else 0
    out = []
    for cu in range(ctm * ctn):
        cm, cn = raster(cu, ctm, ctn, group, raster_n)
        out.append(((cm + shift) % ctm, cn))
    return out


def cluster_rows(cm: int, tile: TileConfig, m: int) -> tuple[int, int]:
    """Rows [first, end) of A (and of the output) cluster row cm covers, clipped at m."""
    rows = tile.bm * tile.cluster_m
    return cm * rows, min(m, (cm + 1) * rows)


def chunk_span(m0: int, rows: int, m_local: int) -> tuple[int, int]:
    """Chunks (first, last) that rows [m0, m0 + rows) of the gathered A touch; (0, -1) for none
    (AgWait's rule, fused/ag_gemm.cuh)."""
    if rows <= 0:
        return (0, -1)
    return (m0 // m_local, (m0 + rows - 1) // m_local)


def unit_span(cm: int, tile: TileConfig, m: int, world: int) -> tuple[int, int]:
    """Chunks (first, last) cluster row cm reads."""
    r0, r1 = cluster_rows(cm, tile, m)
    first, last = chunk_span(r0, r1 - r0, m // world)
    return first, min(last, world - 1)


def arrival_step(chunk: int, rank: int, world: int) -> int:
    """Step at which chunk lands on rank: 0 for the own chunk, s for chunk rank + s."""
    return (chunk - rank) % world


def arrival_us(world: int, rank: int, m_local: int, k: int, itemsize: int, gbps: float) -> list[float]:
    """When each chunk (indexed by chunk) is in rank's gathered buffer, in us after the GEMM starts:
    one chunk's m_local x k bytes per step over a link of gbps GB/s (bytes / (GB/s) = ns)."""
    t_chunk = m_local * k * itemsize / gbps * 1e-3
    return [arrival_step(q, rank, world) * t_chunk for q in range(world)]


def unit_need_us(units, tile: TileConfig, m: int, world: int, arrivals) -> list[float]:
    """Per unit: the arrival of the latest chunk it reads."""
    spans = {}
    out = []
    for cm, _ in units:
        if cm not in spans:
            first, last = unit_span(cm, tile, m, world)
            spans[cm] = max(arrivals[q] for q in range(first, last + 1))
        out.append(spans[cm])
    return out


def slab_arrival_us(world: int, rank: int, m_local: int, k: int, itemsize: int, gbps: float, slabs: int) -> list[list[float]]:
    """[chunk][slab]: when slab j of chunk q is in rank's gathered buffer, slabs sent slab-major
    over the link (one slab is m_local x k / slabs elements); the own chunk at 0. One slab is
    arrival_us."""
    t_slab = m_local * k / slabs * itemsize / gbps * 1e-3
    out = []
    for q in range(world):
        s = arrival_step(q, rank, world)
        out.append([0.0 if s == 0 else (j * (world - 1) + s) * t_slab for j in range(slabs)])
    return out


def cut_tiles_wait_us(units, sk_tiles: int, tile: TileConfig, m: int, world: int, chunk_arrivals, t_cut: float) -> float:
    """How long the k-cut tiles of a stream-K plan (the last sk_tiles of ``units``) wait past
    ``t_cut``, when every cluster starts its share of them: the latest arrival (us,
    chunk_arrivals[q] per chunk) among the chunks they read, less t_cut. Stream-K hands each
    cluster a slice of the cut tiles' line, so a slice on a late chunk waits at its start where a
    data-parallel wave would have reached that chunk later."""
    late = 0.0
    for cm, _ in units[len(units) - sk_tiles:]:
        first, last = unit_span(cm, tile, m, world)
        late = max(late, max(chunk_arrivals[q] for q in range(first, last + 1)))
    return max(0.0, late - t_cut)


def slab_need_us(units, tile: TileConfig, m: int, world: int, slab_arrivals, unit_us: float) -> list[float]:
    """Per unit: the earliest start at which none of its k-slabs arrives after its mainloop reaches
    it, max over slabs j of (latest arrival of slab j among its chunks - j / S of the unit's time);
    simulate() takes it as the unit's need."""
    slabs = len(slab_arrivals[0])
    spans = {}
    out = []
    for cm, _ in units:
        if cm not in spans:
            first, last = unit_span(cm, tile, m, world)
            spans[cm] = max(max(slab_arrivals[q][j] for q in range(first, last + 1)) - j * unit_us / slabs for j in range(slabs))
        out.append(spans[cm])
    return out


def slab_flag_us(units, tile: TileConfig, m: int, world: int, rank: int, slabs: int, clusters: int) -> float:
    """The device time S k-slabs add over whole chunks: SLAB_FLAG_US per extra flag a unit waits
    for ((S - 1) per peer chunk its rows touch), summed over each cluster's units (c, c + G, ...),
    the most loaded cluster's sum."""
    return SLAB_FLAG_US * (slabs - 1) * _peer_waits(units, tile, m, world, rank, clusters) if slabs > 1 else 0.0


def _peer_waits(units, tile: TileConfig, m: int, world: int, rank: int, clusters: int) -> int:
    """The most loaded cluster's peer-chunk waits: per unit, the peer chunks its rows touch,
    summed over each cluster's units (c, c + G, ...)."""
    peers = {}
    per_cluster = [0] * max(1, min(clusters, len(units)))
    for u, (cm, _) in enumerate(units):
        if cm not in peers:
            first, last = unit_span(cm, tile, m, world)
            peers[cm] = max(0, last - first + 1 - (first <= rank <= last))
        per_cluster[u % len(per_cluster)] += peers[cm]
    return max(per_cluster)


@dataclass(frozen=True)
class AgSim:
    free: list  # per unit: when its cluster finished the unit before (0 for the first)
    start: list  # per unit: max(free, the latest chunk it needs)
    end: list  # per unit: start + the unit's time
    gemm_end: float  # the last cluster's end
    need: list  # per unit: the earliest start its chunks (slabs) allow, as simulate() took it

    def wait(self, u: int) -> float:
        return self.start[u] - self.free[u]


def simulate(need, clusters: int, unit_us: float) -> AgSim:
    """Each of the G clusters runs its units (c, c + G, ...) one after another, a unit starting once
    its cluster is free and its chunks have landed."""
    free, start, end = [0.0] * len(need), [0.0] * len(need), [0.0] * len(need)
    for c in range(min(clusters, len(need))):
        t = 0.0
        for u in range(c, len(need), clusters):
            free[u] = t
            start[u] = max(t, need[u])
            t = end[u] = start[u] + unit_us
    return AgSim(free, start, end, max(end, default=0.0), list(need))


def simulate_slabs(units, tile: TileConfig, m: int, k: int, world: int, rank: int, itemsize: int, gbps: float, slabs: int,
                   clusters: int, unit_us: float) -> AgSim:
    """simulate() of rank's units with chunks sent in ``slabs`` k-slabs (1: whole chunks, where
    slab_need_us is unit_need_us of arrival_us)."""
    if slabs == 1:
        need = unit_need_us(units, tile, m, world, arrival_us(world, rank, m // world, k, itemsize, gbps))
    else:
        need = slab_need_us(units, tile, m, world, slab_arrival_us(world, rank, m // world, k, itemsize, gbps, slabs), unit_us)
    return simulate(need, clusters, unit_us)


def pick_slabs(units, tile: TileConfig, m: int, k: int, world: int, itemsize: int, gbps: float, clusters: int, unit_us: float,
               bk: int = 64, issue_us=None) -> int:
    """k-slabs per chunk for a call: the fewest S of SLAB_CHOICES (k split into whole bk-column
    blocks) whose time is within 1 % of the best, and 1 unless that time is SLAB_GAIN of whole
    chunks' or less. A call's time is its simulated GEMM end, or with ``issue_us`` (S -> the host's
    us to issue one call: the copy-engine path's driver calls grow with S) the longer of the two,
    as back-to-back calls run. Each S also pays slab_flag_us of device time. Rank 0's view:
    every rank's arrivals are the same pattern rotated, and the call record compares S."""
    waits = _peer_waits(units, tile, m, world, 0, clusters)
    ends = {s: simulate_slabs(units, tile, m, k, world, 0, itemsize, gbps, s, clusters, unit_us).gemm_end
            + SLAB_FLAG_US * (s - 1) * waits for s in SLAB_CHOICES if k % (s * bk) == 0}
    if issue_us is not None:
        ends = {x: max(t, issue_us(x)) for x, t in ends.items()}
    best = min(ends.values())
    s = min(x for x, t in ends.items() if t <= best * 1.01)
    return s if ends[s] <= SLAB_GAIN * ends[1] else 1
