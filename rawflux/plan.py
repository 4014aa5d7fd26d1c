"""The fused ops' tile orders on the CPU: GEMM-RS's link loads and wait graph, AG-GEMM's chunk waits; a predicted time.

    python -m rawflux.plan gemm_rs --world 8 --m 4096 --n 8192 --k 1024 [--tile TAG] [--link-gbps 370]
        [--delay D] [--sms 132 | --sms 132,120,...] [--dtype bf16] [--partials bf16|fp32] [--json]

The tile is the op's pick (ops.gemm_rs.choose_config on an H200's DeviceInfo, for the smallest
grid when --sms lists one count per rank) or --tile. The model (rawflux/tune/rs_order.py's order):
  * a wave is G consecutive positions of a rank (G = its clusters); the ranks run in lockstep, a
    wave lasting tune.estimate_us of the padded problem (W * rows_per_owner * bm rows) / waves;
  * a remote cluster tile puts its real (clipped) partial bytes on the link rank -> owner; the link
    load of a wave is its bytes / wave time / link bandwidth. The port load sums a rank's links
    (egress) or an owner's (ingress): through an NVSwitch the links of one GPU share its port;
  * link time: per link, a wave's bytes leave once the wave ends, first in first out;
    predicted = max(GEMM time, link time) + LAUNCH_US; the drain is the link time past the GEMM's;
  * wait graph: (a) every own tile's peer tiles sit at earlier positions on every peer; (b) an
    event simulation of every resident cluster (mainloop 1 unit; a remote tile's flag is released at
    the start of the same cluster's next epilogue or at its end; an own tile releases its pending
    flag, then waits for its W - 1 peer flags) runs to the end without a deadlock.
Exit status 1 where the wait graph is not acyclic (or an own tile waits for a later position), 2 on
bad arguments.

    python -m rawflux.plan ag_gemm --world 8 --m 4096 --n 6144 --k 12288 [--tile TAG] [--link-gbps 370]
        [--sms 132] [--rank 0] [--dtype bf16] [--json]

n is this rank's n (n_local), k the full k. The configuration is the fused call's (ops.ag_gemm.
fused_config, on every SM: the copy engine takes none) of the plain GEMM's heuristic pick on an
H200's DeviceInfo (no tuning store; --tile replaces the pick's tile). The model (rawflux/tune/
ag_order.py's order and arrivals):
  * a unit (one cluster tile, data-parallel) takes T_gemm_fused / waves, T_gemm_fused being
    tune.estimate_us of the fused configuration; cluster c runs units c, c + G, ... back to back, a
    unit starting once its cluster is free and the latest chunk its rows touch has landed;
  * chunk rank + s lands at s x T_chunk (m/W x k bytes over one link; push and pull alike), the own
    chunk at 0; T_gather = (W - 1) T_chunk;
  * before the GEMM: the copy of the own rows that share a tile with a peer's (push: the rest is
    read in place; ops.ag_gemm.edge_rows), read and write at DRAM rate, and LAUNCH_US for the call's
    start and the GEMM's launch (no barrier); predicted = that + the last cluster's end. T_gemm_best is the plain pick's own time
    (rawflux.gemm on the gathered A), for the ratio against an unfused lower bound.
  * with S > 1 k-slabs, ag_order.slab_flag_us: a fixed cost per extra flag a unit waits for.
Limits: no link contention or latency; every unit equally long (no slower
first wave, no L2 effects of the rotation); one rank (--rank), not the slowest of the group.
Chunks go in k-slabs as the op picks them for the device (ops.ag_gemm.slab_count; an eager "ce"
call may take fewer, its host's issue time counted: ce_issue_us); --slabs S models S instead.
The last line names the path copy="auto" gives the call (ops.ag_gemm.pick_copy; field "copy").
Exit status 2 on bad arguments.

    python -m rawflux.plan gemm_ar --world 8 --n 8192 --k 1024 [--ms 1,16,128,512] [--link-gbps 370]
        [--hop-us 2.5] [--nccl-us 12] [--nccl-busbw 200] [--json]

The decode GEMM + AllReduce (its kernel, rawflux/ops/gemm_ar.py, runs one-shot): out (m, n) =
sum_q a_q @ b_q^T on every rank, k this rank's share. Per strategy, after the GEMM (tune.estimate_us of the plain pick; at
decode one wave, so little of the communication overlaps it): one-shot, every rank pushes its
16-bit partial of every tile to every peer and reduces all W in a fixed order ((W - 1) m n 2 bytes
out of each rank, one flag hop); two-shot, each tile's partial goes to its owner, which reduces
and pushes the result to every peer (2 (W - 1) / W m n 2 bytes, two hops); the baseline, cuBLAS
then NCCL's all-reduce (a fixed latency plus 2 (W - 1) / W m n 2 bytes at its bus bandwidth). A
rank's egress shares one port of --link-gbps; a hop is a flag's release to its acquire. Every
constant is an estimate to be replaced by the H200's measurement.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import deque
from dataclasses import asdict, dataclass, replace

from . import tune
from .ops.ag_gemm import DTYPES as AG_DTYPES
from .ops.ag_gemm import _check_nk, ce_issue_us, default_copy_sms, edge_rows, fused_config, pick_copy, slab_count, sm_issue_us
from .ops.gemm_rs import PARTIALS, choose_config, rs_tiles
from .runtime import DType
from .tune import ag_order
from .tune.rs_order import per_owner_tiles, rows_per_owner, rs_order

LAUNCH_US = 5.0  # a launch and the kernel's start (call record push), a rough lead
H200_SMS = 132


def h200(sms: int = H200_SMS) -> tune.DeviceInfo:
    return tune.DeviceInfo(sms, (9, 0), 50 << 20, "H200 (model)")


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


# ------------------------------------------------------------------------------------------------
# orders and the wait graph


def orders(world: int, per_owner: int, delays) -> list[list[tuple[int, int]]]:
    """Every rank's positions (rs_order), delays one per rank."""
    return [rs_order(r, world, per_owner, delays[r]) for r in range(world)]


def static_violations(ords) -> list[tuple[int, int, int, int, int]]:
    """(rank r, tile j, u_r, peer q, u_q) where own tile (r, j) at u_r has its peer q's tile at u_q >= u_r."""
    world = len(ords)
    pos = [{t: u for u, t in enumerate(o)} for o in ords]
    bad = []
    for r, o in enumerate(ords):
        for u, (owner, j) in enumerate(o):
            if owner == r:
                bad += [(r, j, u, q, pos[q][(r, j)]) for q in range(world) if q != r and pos[q][(r, j)] >= u]
    return bad


@dataclass(frozen=True)
class SimResult:
    deadlock: bool
    time: int  # units (a mainloop is 1) until the last cluster finished (deadlock: of those that did)
    own_wait: int  # units own tiles spent waiting for flags, summed
    max_wait: int  # the longest single wait
    stuck: tuple = ()  # (rank, cluster, position, (owner, j)) of the blocked clusters (first few)


def simulate(ords, clusters) -> SimResult:
    """The event simulation of (b); clusters: G per rank (cluster c walks positions c, c + G, ...)."""
    world = len(ords)
    rel: dict[tuple[int, int, int], int] = {}  # flag (src, owner, j) -> release time
    waiters: dict[tuple[int, int, int], list] = {}
    state = {}  # (r, c) -> [next position, mainloop end, pending flag]
    for r in range(world):
        for c in range(min(clusters[r], len(ords[r]))):
            state[(r, c)] = [c, 1, None]
    work = deque(state)
    own_wait = max_wait = end = 0

    def release(key, t):
        rel[key] = t
        work.extend(waiters.pop(key, ()))

    while work:
        r, c = key = work.popleft()
        st = state[key]
        u, t, pending = st
        n, g, o = len(ords[r]), clusters[r], ords[r]
        while u < n:
            if pending is not None:  # the start of this epilogue releases the previous tile's flag
                release(pending, t)
                pending = None
            owner, j = o[u]
            if owner != r:
                pending, finish = (r, owner, j), t
            else:
                missing = next(((q, r, j) for q in range(world) if q != r and (q, r, j) not in rel), None)
                if missing is not None:
                    waiters.setdefault(missing, []).append(key)
                    break
                finish = max([t] + [rel[(q, r, j)] for q in range(world) if q != r])
                own_wait += finish - t
                max_wait = max(max_wait, finish - t)
            u, t = u + g, finish + 1
        st[:] = [u, t, pending]
        if u >= n:
            if pending is not None:
                release(pending, t - 1)  # the kernel's end
                st[2] = None
            end = max(end, t - 1)
    stuck = [(r, c, st[0], ords[r][st[0]]) for (r, c), st in state.items() if st[0] < len(ords[r])]
    return SimResult(bool(stuck), end, own_wait, max_wait, tuple(stuck[:4]))


@dataclass(frozen=True)
class WaitGraph:
    ok: bool  # static order sound and no deadlock
    static_ok: bool
    violations: int
    sim: SimResult


def wait_graph_ok(world: int, per_owner: int, clusters, delays=None, ords=None) -> WaitGraph:
    """(a) and (b) over all ranks; clusters and delays per rank (delays default: clusters), or ords."""
    if ords is None:
        ords = orders(world, per_owner, delays if delays is not None else clusters)
    every = sorted((o, j) for o in range(world) for j in range(per_owner))
    for r, o in enumerate(ords):
        if sorted(o) != every:
            raise ValueError(f"rank {r}'s order is not a permutation of the {world} x {per_owner} cluster tiles")
    bad = static_violations(ords)
    sim = simulate(ords, clusters)
    return WaitGraph(not bad and not sim.deadlock, not bad, len(bad), sim)


# ------------------------------------------------------------------------------------------------
# link loads


def tile_bytes(j: int, tile: tune.TileConfig, m_loc: int, n: int, group: int, part_bytes: int) -> int:
    """Partial bytes cluster tile j of an owner sends (grouped raster as RsSchedT::next; clipped at
    the owner's m_loc rows and at n)."""
    crows = rows_per_owner(m_loc, tile) // tile.cluster_m
    ccols = _cdiv(_cdiv(n, tile.bn), tile.cluster_n)
    per_group = group * ccols
    g = j // per_group
    gsize = min(crows - g * group, group)
    rr = j - g * per_group
    cm, cn = g * group + rr % gsize, rr // gsize
    rows = sum(max(0, min(tile.bm, m_loc - (cm * tile.cluster_m + i) * tile.bm)) for i in range(tile.cluster_m))
    cols = sum(max(0, min(tile.bn, n - (cn * tile.cluster_n + i) * tile.bn)) for i in range(tile.cluster_n))
    return rows * cols * part_bytes


def link_loads(ords, clusters, tile: tune.TileConfig, m_loc: int, n: int, part_bytes: int, group: int = 8):
    """bytes[w][src][dst]: what link src -> dst carries in wave w (positions w G_src .. (w + 1) G_src - 1)."""
    world = len(ords)
    waves = max(_cdiv(len(o), clusters[r]) for r, o in enumerate(ords))
    out = [[[0] * world for _ in range(world)] for _ in range(waves)]
    for r, o in enumerate(ords):
        for u, (owner, j) in enumerate(o):
            if owner != r:
                out[u // clusters[r]][r][owner] += tile_bytes(j, tile, m_loc, n, group, part_bytes)
    return out


# ------------------------------------------------------------------------------------------------
# the prediction


@dataclass(frozen=True)
class Prediction:
    tile: str
    world: int
    m: int
    n: int
    k: int
    per_owner: int  # T
    clusters: list  # G per rank
    delays: list  # D per rank
    waves: list  # per rank
    wave_us: list  # per rank
    link_gbps: float
    link_bytes: list  # [wave][src][dst]
    wave_link_load: list  # per wave: the busiest link's bytes / wave time / bandwidth
    wave_port_load: list  # per wave: the busiest port's (a rank's egress or an owner's ingress)
    peak_link_load: float
    peak_port_load: float  # a rank's egress or an owner's ingress summed over its links
    t_gemm_us: float
    t_link_us: float  # the last partial landed (first in first out per link)
    drain_us: float  # t_link past t_gemm
    launch_us: float
    predicted_us: float
    wait_graph: WaitGraph

    def to_json(self) -> dict:
        return asdict(self)


def predict(world: int, m: int, n: int, k: int, *, tile=None, link_gbps: float = 370.0, delay=None, sms=H200_SMS,
            dtype: str = "bf16", partials: str | None = None, b_layout: str = "nk") -> Prediction:
    """The model for one call shape; sms an int or one count per rank; tile a TileConfig, a tag, or None (the op's pick)."""
    if m % world:
        raise ValueError(f"m={m} is not a multiple of the world size {world}")
    sms = [int(sms)] * world if isinstance(sms, int) else [int(s) for s in sms]
    if len(sms) != world:
        raise ValueError(f"--sms lists {len(sms)} counts for a world of {world}")
    partials = partials or DType.from_any(dtype).tag
    if partials not in ("fp32", DType.from_any(dtype).tag):
        raise ValueError(f"partials={partials!r}: use {DType.from_any(dtype).tag!r} (the output's type) or 'fp32'")
    part_bytes = PARTIALS[partials][1]
    small = min(sms)
    if tile is None:
        t = choose_config(m, n, k, b_layout, h200(small), ctas=small, world=world, part_bytes=part_bytes).tile
    else:
        t = _parse_tile(tile, b_layout) if isinstance(tile, str) else tile
    m_loc = m // world
    per_owner = per_owner_tiles(m_loc, n, t)
    clusters = [max(1, min(s // t.cluster_size, world * per_owner)) for s in sms]
    delays = list(clusters) if delay is None else [int(delay)] * world
    if min(delays) < 0:
        raise ValueError(f"own delay {delay} < 0: rs_position is defined for delays >= 0")
    ords = orders(world, per_owner, delays)
    loads = link_loads(ords, clusters, t, m_loc, n, part_bytes)
    m_eff = world * rows_per_owner(m_loc, t) * t.bm
    waves = [_cdiv(world * per_owner, g) for g in clusters]
    gemm_us = [tune.estimate_us(m_eff, n, k, tune.GemmConfig(t, tune.DP, 8, False, s), h200(s), out_bytes=part_bytes)
               for s in sms]
    wave_us = [gemm_us[r] / waves[r] for r in range(world)]
    bw = link_gbps * 1e3  # bytes per us
    link_load, port_load = [], []
    busy = [[0.0] * world for _ in range(world)]  # per link: when its queue empties (us)
    for w, lw in enumerate(loads):
        for r in range(world):
            for o in range(world):
                if lw[r][o]:
                    busy[r][o] = max(busy[r][o], (w + 1) * wave_us[r]) + lw[r][o] / bw
        link_load.append(max(lw[r][o] / wave_us[r] for r in range(world) for o in range(world)) / bw)
        egress = max(sum(lw[r]) / wave_us[r] for r in range(world))
        ingress = max(sum(lw[r][o] for r in range(world)) for o in range(world)) / min(wave_us)
        port_load.append(max(egress, ingress) / bw)
    t_gemm = max(gemm_us)
    t_link = max(max(row) for row in busy)
    wg = wait_graph_ok(world, per_owner, clusters, ords=ords)
    return Prediction(t.tag(), world, m, n, k, per_owner, clusters, delays, waves, wave_us, link_gbps, loads, link_load,
                      port_load, max(link_load), max(port_load), t_gemm, t_link, max(0.0, t_link - t_gemm), LAUNCH_US,
                      max(t_gemm, t_link) + LAUNCH_US, wg)


def _parse_tile(tag: str, b_layout: str) -> tune.TileConfig:
    """A GEMM-RS tile by its TileConfig tag, or by a GemmConfig tag (tune.parse_tag) of one."""
    tile = tune.parse_tag(tag).tile if "/" in tag else None
    for t in rs_tiles(b_layout):
        if t == tile or t.tag() == tag:
            return t
    raise ValueError(f"tile {tag!r} is not a GEMM-RS tile (use one of {', '.join(t.tag() for t in rs_tiles(b_layout))})")


# ------------------------------------------------------------------------------------------------
# AllGather-GEMM: the tile order against the chunk arrivals


@dataclass(frozen=True)
class AgPrediction:
    tile: str
    config: str  # the fused call's GemmConfig tag
    base: str  # the configuration it was adapted from (the heuristic's pick, --tile's tile in it)
    best: str  # the heuristic's pick: rawflux.gemm alone on the gathered A
    world: int
    rank: int
    m: int
    n: int  # this rank's n
    k: int
    m_local: int
    sms: int
    clusters: int  # G
    ctiles_m: int
    ctiles_n: int
    group: int  # raster group (cluster rows walked along n)
    shift: int  # cluster rows the rotation moves this rank's order up by
    units: int
    waves: int
    unit_us: float
    link_gbps: float
    chunk_us: float  # T_chunk: one chunk over the link
    arrival_us: list  # per chunk
    wave_units: list  # per wave: units in it
    wave_steps: list  # per wave: the arrival steps of the chunks its units read
    wave_need_us: list  # per wave: the latest arrival its units need
    wave_wait_us: list  # per wave: the longest wait of a unit for its chunks after its cluster was free
    wait_us: float  # the waves' waits summed
    t_gemm_fused_us: float
    t_gemm_best_us: float
    t_gather_us: float
    copy_us: float  # the own shard's edge rows -> own rows of the gathered buffer
    launch_us: float  # the call's start + the GEMM's launch
    fixed_us: float
    gemm_end_us: float  # after the GEMM starts
    predicted_us: float
    ratio_fused: float  # predicted / max(T_gemm_fused, T_gather)
    ratio_best: float  # predicted / max(T_gemm_best, T_gather)
    slabs: int = 1  # k-slabs per chunk (ag_order's K-slabs; 1: whole chunks)
    flags_us: float = 0.0  # the slabs' extra flag waits (ag_order.slab_flag_us), in predicted_us
    copy: str = "ce"  # the path copy="auto" gives this call (ops.ag_gemm.pick_copy); the model times "ce"
    t_gemm_sm_us: float = 0.0  # the plain pick beside the "sm" path's copy kernel (its SMs taken), for that pick

    def to_json(self) -> dict:
        return asdict(self)


def predict_ag(world: int, m: int, n: int, k: int, *, tile=None, link_gbps: float = 370.0, sms: int = H200_SMS,
               rank: int = 0, dtype: str = "bf16", slabs: int | None = None) -> AgPrediction:
    """The AG-GEMM model for one call shape on one rank; tile a TileConfig, a tag, or None (the pick's);
    slabs: k-slabs per chunk (tune/ag_order.py); None: the op's pick (ops.ag_gemm.slab_count)."""
    if world < 2:
        raise ValueError(f"world={world}: the fused op gathers from at least 2 ranks (world 1 runs rawflux.gemm)")
    if m < world or m % world:
        raise ValueError(f"m={m} is not a positive multiple of the world size {world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank={rank} is not in 0..{world - 1}")
    _check_nk(n, k)
    if not link_gbps > 0:
        raise ValueError(f"link bandwidth {link_gbps} GB/s is not positive")
    dt = DType.from_any(dtype)
    if dt not in AG_DTYPES:
        raise ValueError(f"dtype {dtype!r}: ag_gemm takes bf16 or f16")
    if slabs is not None and (slabs < 1 or k % (slabs * tune.BK)):
        raise ValueError(f"slabs={slabs}: k = {k} must split into that many whole {tune.BK}-column k blocks")
    dev = h200(int(sms))
    item = dt.itemsize  # the output is in the input's type
    best = tune.heuristic(m, n, k, "nk", dev, item)
    base = best if tile is None else replace(best, tile=_ag_tile(tile) if isinstance(tile, str) else tile)
    cfg = fused_config(base, m, world, dev.sms, rank=rank, n=n, k=k, dev=dev, out_bytes=item)  # the copy engine reserves no SM between GPUs
    t = cfg.tile
    if t.cluster_size > dev.sms:
        raise ValueError(f"tile {t.tag()} needs clusters of {t.cluster_size} CTAs, more than the {dev.sms} SMs")
    if slabs is None:
        slabs = slab_count(cfg, m, n, k, world, dev, dt.itemsize, link_gbps)
    m_loc = m // world
    order = ag_order.ag_units(m, n, world, rank, t, cfg.group, cfg.raster_n)
    g = dev.sms // t.cluster_size  # as estimate_us's slots
    waves = _cdiv(len(order), g)
    t_fused = tune.estimate_us(m, n, k, cfg, dev, item)
    t_best = tune.estimate_us(m, n, k, best, dev, item)
    arr = ag_order.arrival_us(world, rank, m_loc, k, item, link_gbps)
    t_chunk = arr[(rank + 1) % world]
    t_gather = (world - 1) * t_chunk
    unit_us = t_fused / waves
    sim = ag_order.simulate_slabs(order, t, m, k, world, rank, item, link_gbps, slabs, g, unit_us)
    need = sim.need
    w_units, w_steps, w_need, w_wait = [], [], [], []
    for w in range(waves):
        us = range(w * g, min((w + 1) * g, len(order)))
        steps = set()
        for cm in {order[u][0] for u in us}:
            first, last = ag_order.unit_span(cm, t, m, world)
            steps.update(ag_order.arrival_step(q, rank, world) for q in range(first, last + 1))
        w_units.append(len(us))
        w_steps.append(sorted(steps))
        w_need.append(max(need[u] for u in us))
        w_wait.append(max(sim.wait(u) for u in us))
    head, tail = edge_rows(m_loc, rank, t.bm)
    copy_us = 2 * (head + m_loc - tail) * k * item / dev.dram_bytes_per_s * 1e6  # read the shard's edge rows, write them
    fixed = copy_us + LAUNCH_US
    flags = ag_order.slab_flag_us(order, t, m, world, rank, slabs, g)
    predicted = fixed + sim.gemm_end + flags
    ctm, ctn = ag_order.ctiles(m, n, t)
    t_sm = tune.estimate_us(m, n, k, replace(best, ctas=dev.sms - default_copy_sms(dev.sms)), dev, item)
    path = pick_copy(t_best, t_sm, world)
    return AgPrediction(t.tag(), cfg.tag(), base.tag(), best.tag(), world, rank, m, n, k, m_loc, dev.sms, g, ctm, ctn,
                        cfg.group, ag_order.row_shift(m, world, rank, t), len(order), waves, unit_us, link_gbps, t_chunk, arr,
                        w_units, w_steps, w_need, w_wait, sum(w_wait), t_fused, t_best, t_gather, copy_us, LAUNCH_US,
                        fixed, sim.gemm_end, predicted, predicted / max(t_fused, t_gather),
                        predicted / max(t_best, t_gather), slabs, flags, path, t_sm)


# ------------------------------------------------------------------------------------------------
# GEMM + AllReduce (decode): one-shot against two-shot against cuBLAS + NCCL

AR_HOP_US = 2.5  # a flag released on one GPU, acquired on another (the device barrier: 2.9-3.1 us over NVLink, two hops)
AR_NCCL_US = 12.0  # NCCL all-reduce's small-message time, an estimate until measured on the H200
AR_NCCL_BUSBW = 200.0  # GB/s: NCCL's bus bandwidth (docs/decisions.md: 150-290 for AG / RS)


@dataclass(frozen=True)
class ArPoint:
    m: int
    t_gemm_us: float
    one_shot_us: float
    two_shot_us: float
    nccl_us: float  # cuBLAS + NCCL all-reduce
    pick: str  # "one_shot" or "two_shot"

    def to_json(self) -> dict:
        return asdict(self)


def predict_ar(world: int, m: int, n: int, k: int, *, link_gbps: float = 370.0, hop_us: float = AR_HOP_US,
               nccl_us: float = AR_NCCL_US, nccl_busbw: float = AR_NCCL_BUSBW, sms: int = H200_SMS) -> ArPoint:
    """The decode GEMM + AllReduce model for one m (module docstring)."""
    if world < 2:
        raise ValueError(f"world={world}: an all-reduce needs at least 2 ranks")
    if m < 1:
        raise ValueError(f"m={m} must be positive")
    _check_nk(n, k)
    if min(link_gbps, nccl_busbw) <= 0 or min(hop_us, nccl_us) < 0:
        raise ValueError("link and NCCL bandwidths must be positive, latencies not negative")
    dev = h200(int(sms))
    cfg = tune.heuristic(m, n, k, "nk", dev, 2)
    t_gemm = tune.estimate_us(m, n, k, cfg, dev, 2)
    out_bytes = m * n * 2
    us = lambda nbytes, gbps: nbytes / gbps * 1e-3  # noqa: E731  bytes over GB/s, in us
    reduce_us = lambda parts, share: (parts + 1) * out_bytes * share / dev.dram_bytes_per_s * 1e6  # noqa: E731
    one = t_gemm + us((world - 1) * out_bytes, link_gbps) + hop_us + reduce_us(world, 1.0)
    two = t_gemm + 2 * us((world - 1) * out_bytes / world, link_gbps) + 2 * hop_us + reduce_us(world, 1.0 / world)
    nccl = t_gemm + nccl_us + us(2 * (world - 1) * out_bytes / world, nccl_busbw)
    return ArPoint(m, t_gemm, one, two, nccl, "one_shot" if one <= two else "two_shot")


def _report_ar(world: int, n: int, k: int, pts) -> str:
    lines = [f"gemm_ar W={world} n={n} k={k} (this rank's k): us per call, the model's estimates",
             f"{'m':>5s} {'GEMM':>8s} {'one-shot':>9s} {'two-shot':>9s} {'cuBLAS+NCCL':>12s}  pick"]
    for p in pts:
        lines.append(f"{p.m:5d} {p.t_gemm_us:8.1f} {p.one_shot_us:9.1f} {p.two_shot_us:9.1f} {p.nccl_us:12.1f}  {p.pick}")
    return "\n".join(lines)


def _ag_tile(tag: str) -> tune.TileConfig:
    """An AG-GEMM tile by its TileConfig tag, or by a GemmConfig tag of one (a k-split pair runs
    as its tile without the pair: fused_config)."""
    tiles = [t for t in (*tune.TILES, *tune.KSPLIT_TILES) if t.supports("nk")]
    tile = tune.parse_tag(tag).tile if "/" in tag else None
    for t in tiles:
        if t == tile or t.tag() == tag:
            return t
    raise ValueError(f"tile {tag!r} is not an AG-GEMM tile (use one of {', '.join(t.tag() for t in tiles)})")


# ------------------------------------------------------------------------------------------------
# command line


def _report(p: Prediction) -> str:
    mb = 1 / (1 << 20)
    world = p.world
    lines = [
        f"gemm_rs W={world} m={p.m} n={p.n} k={p.k}: tile {p.tile}, T={p.per_owner} cluster tiles per owner, "
        f"G={_one(p.clusters)}, D={_one(p.delays)}, waves={_one(p.waves)}, wave {_one([round(x, 2) for x in p.wave_us])} us",
        "per wave: MiB on link src -> src+d, the largest over src, d = 1.." + str(world - 1) + "; link load; port load",
    ]
    for w, lw in enumerate(p.link_bytes):
        by_d = [max(lw[r][(r + d) % world] for r in range(world)) for d in range(1, world)]
        lines.append(f"  wave {w:3d}: " + " ".join(f"{b * mb:6.2f}" for b in by_d)
                     + f"   link {p.wave_link_load[w]:5.2f}  port {p.wave_port_load[w]:5.2f}")
    s = p.wait_graph.sim
    lines += [
        f"peak link load {p.peak_link_load:.3f}, peak port load {p.peak_port_load:.3f} (of {p.link_gbps:g} GB/s)",
        f"T_gemm {p.t_gemm_us:.1f} us, T_link {p.t_link_us:.1f} us (drain past the GEMM {p.drain_us:.1f} us), "
        f"+ launch {p.launch_us:.1f} us: predicted {p.predicted_us:.1f} us",
        f"wait graph: {'acyclic' if p.wait_graph.ok else 'NOT ACYCLIC'} (static: {p.wait_graph.violations} own tiles wait "
        f"for a later position; simulation: {'DEADLOCK ' + str(s.stuck) if s.deadlock else 'no deadlock'}, "
        f"{s.time} units, own tiles waited {s.own_wait} units, longest {s.max_wait})",
    ]
    return "\n".join(lines)


def _report_ag(p: AgPrediction) -> str:
    lines = [
        f"ag_gemm W={p.world} rank {p.rank} m={p.m} n={p.n} k={p.k}: tile {p.tile}, config {p.config} (plain pick {p.best}), "
        f"G={p.clusters}, {p.units} units ({p.ctiles_m} x {p.ctiles_n} cluster tiles, group {p.group}, shift {p.shift}), "
        f"waves={p.waves}, unit {p.unit_us:.2f} us",
        f"chunk {p.m_local} rows: {p.chunk_us:.2f} us per step at {p.link_gbps:g} GB/s (chunk rank + s lands at step s)"
        + (f"; {p.slabs} k-slabs per chunk, sent slab-major (a unit needs slab j only j / {p.slabs} of its time in)" if p.slabs > 1 else ""),
        "per wave: units, the chunks they read (arrival steps), the latest arrival they need, the exposed wait",
    ]
    for w in range(p.waves):
        lines.append(f"  wave {w:3d}: {p.wave_units[w]:4d} units  steps {_steps(p.wave_steps[w]):9s}"
                     f"  need {p.wave_need_us[w]:8.1f} us  wait {p.wave_wait_us[w]:7.2f} us")
    lines += [
        f"exposed wait {p.wait_us:.1f} us summed over the waves",
        f"T_gemm_fused {p.t_gemm_fused_us:.1f} us, T_gemm_best {p.t_gemm_best_us:.1f} us, T_gather {p.t_gather_us:.1f} us",
        f"fixed {p.fixed_us:.1f} us (own edge rows {p.copy_us:.1f} us + start and launch {p.launch_us:.1f} us) "
        f"+ GEMM end {p.gemm_end_us:.1f} us" + (f" + slab flags {p.flags_us:.1f} us" if p.flags_us else "")
        + f": predicted {p.predicted_us:.1f} us",
        f"predicted / max(T_gemm_fused, T_gather) = {p.ratio_fused:.3f}, predicted / max(T_gemm_best, T_gather) = {p.ratio_best:.3f}",
        f"copy=\"auto\" takes \"{p.copy}\" here: a call lasts max(host, GEMM), \"ce\" max({ce_issue_us(p.world, 1):.0f}, {p.t_gemm_best_us:.1f}) us, "
        f"\"sm\" max({sm_issue_us():.0f}, {p.t_gemm_sm_us:.1f}) us (the lines above model \"ce\")",
    ]
    return "\n".join(lines)


def _steps(steps) -> str:
    """Arrival steps as runs: [0, 1, 2, 5] -> '0-2,5'."""
    runs: list[list[int]] = []
    for s in steps:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def _one(v):
    return v[0] if len(set(v)) == 1 else v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rawflux.plan", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="op", required=True)
    g = sub.add_parser("gemm_rs", help="GEMM-ReduceScatter's tile order: link loads, time, wait graph")
    g.add_argument("--world", type=int, required=True)
    g.add_argument("--m", type=int, required=True)
    g.add_argument("--n", type=int, required=True)
    g.add_argument("--k", type=int, required=True, help="this rank's k (the model's k / W)")
    g.add_argument("--tile", default=None, help="a GEMM-RS tile tag (default: the op's pick)")
    g.add_argument("--link-gbps", type=float, default=370.0)
    g.add_argument("--delay", type=int, default=None, help="own_delay (default: the grid's clusters G)")
    g.add_argument("--sms", default=str(H200_SMS), help="SMs per rank: one count, or one per rank (comma separated)")
    g.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    g.add_argument("--partials", default=None, choices=tuple(PARTIALS))
    g.add_argument("--json", action="store_true")
    g = sub.add_parser("ag_gemm", help="AllGather-GEMM's tile order against the chunk arrivals: waits, time")
    g.add_argument("--world", type=int, required=True)
    g.add_argument("--m", type=int, required=True, help="every rank's rows (m / W per shard)")
    g.add_argument("--n", type=int, required=True, help="this rank's n (n_local)")
    g.add_argument("--k", type=int, required=True, help="the full k")
    g.add_argument("--tile", default=None, help="a tile tag (default: the plain GEMM's pick's)")
    g.add_argument("--link-gbps", type=float, default=370.0)
    g.add_argument("--sms", type=int, default=H200_SMS)
    g.add_argument("--rank", type=int, default=0)
    g.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    g.add_argument("--slabs", type=int, default=None, help="model chunks sent as S k-slabs (default: the op's pick; 1: whole chunks)")
    g.add_argument("--json", action="store_true")
    g = sub.add_parser("gemm_ar", help="decode GEMM + AllReduce: one-shot against two-shot against cuBLAS + NCCL (a model)")
    g.add_argument("--world", type=int, required=True)
    g.add_argument("--ms", default="1,2,4,8,16,32,64,128,256,512")
    g.add_argument("--n", type=int, required=True)
    g.add_argument("--k", type=int, required=True, help="this rank's k (the model's k / W)")
    g.add_argument("--link-gbps", type=float, default=370.0)
    g.add_argument("--hop-us", type=float, default=AR_HOP_US)
    g.add_argument("--nccl-us", type=float, default=AR_NCCL_US)
    g.add_argument("--nccl-busbw", type=float, default=AR_NCCL_BUSBW)
    g.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.op == "ag_gemm":
        return _main_ag(a)
    if a.op == "gemm_ar":
        return _main_ar(a)
    sms = [int(s) for s in a.sms.split(",")]
    try:
        p = predict(a.world, a.m, a.n, a.k, tile=a.tile, link_gbps=a.link_gbps, delay=a.delay,
                    sms=sms[0] if len(sms) == 1 else sms, dtype=a.dtype, partials=a.partials)
    except ValueError as e:
        print(f"rawflux.plan: {e}", file=sys.stderr)
        return 2
    print(json.dumps(p.to_json()) if a.json else _report(p))
    return 0 if p.wait_graph.ok else 1


def _main_ag(a) -> int:
    try:
        p = predict_ag(a.world, a.m, a.n, a.k, tile=a.tile, link_gbps=a.link_gbps, sms=a.sms, rank=a.rank, dtype=a.dtype,
                       slabs=a.slabs)
    except ValueError as e:
        print(f"rawflux.plan: {e}", file=sys.stderr)
        return 2
    print(json.dumps(p.to_json()) if a.json else _report_ag(p))
    return 0


def _main_ar(a) -> int:
    try:
        ms = [int(x) for x in a.ms.split(",") if x.strip()]
        pts = [predict_ar(a.world, m, a.n, a.k, link_gbps=a.link_gbps, hop_us=a.hop_us, nccl_us=a.nccl_us, nccl_busbw=a.nccl_busbw)
               for m in ms]
    except ValueError as e:
        print(f"rawflux.plan: {e}", file=sys.stderr)
        return 2
    print(json.dumps([p.to_json() for p in pts]) if a.json else _report_ar(a.world, a.n, a.k, pts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
