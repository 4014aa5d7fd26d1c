"""GEMM-ReduceScatter's tile order on the CPU: link loads, a predicted time and the wait-graph check.

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
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import deque
from dataclasses import asdict, dataclass

from . import tune
from .ops.gemm_rs import PARTIALS, choose_config, rs_tiles
from .runtime import DType
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
    a = ap.parse_args(argv)
    sms = [int(s) for s in a.sms.split(",")]
    try:
        p = predict(a.world, a.m, a.n, a.k, tile=a.tile, link_gbps=a.link_gbps, delay=a.delay,
                    sms=sms[0] if len(sms) == 1 else sms, dtype=a.dtype, partials=a.partials)
    except ValueError as e:
        print(f"rawflux.plan: {e}", file=sys.stderr)
        return 2
    print(json.dumps(p.to_json()) if a.json else _report(p))
    return 0 if p.wait_graph.ok else 1


if __name__ == "__main__":
    sys.exit(main())
