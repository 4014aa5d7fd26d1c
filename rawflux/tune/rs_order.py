"""GEMM-ReduceScatter's tile order, as pure integer functions (fused/rs_sched.cuh computes the
same on the device; rawflux.plan and tests/cpu run them over the shape grid).

Rows are tiled per owner (rank o owns rows [o m_loc, (o + 1) m_loc)), in tile rows of BM padded to
whole clusters. Each owner has ``per_owner`` cluster tiles j = 0..T-1 (grouped raster inside the
owner). On rank r, position u of the W T positions holds:
  * remote tiles in round robin over the peers r + 1, ..., r + W - 1 (remote index i: owner
    (r + 1 + i mod (W - 1)) mod W, tile i // (W - 1));
  * own tile j at (j + 1) W - 1 + delay while that leaves the remote tiles in front of it, the rest
    at the end in order. ``delay`` is one wave: the grid's clusters.
"""
from __future__ import annotations

from .configs import TileConfig


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def rows_per_owner(m_loc: int, tile: TileConfig) -> int:
    """Tile rows of one owner's m_loc rows, padded to whole clusters along m."""
    return _cdiv(_cdiv(m_loc, tile.bm), tile.cluster_m) * tile.cluster_m


def per_owner_tiles(m_loc: int, n: int, tile: TileConfig) -> int:
    """Cluster tiles of one owner (T)."""
    return rows_per_owner(m_loc, tile) // tile.cluster_m * _cdiv(_cdiv(n, tile.bn), tile.cluster_n)


def a_tail_rows(tile: TileConfig, m: int, world: int) -> int:
    """Rows of A's tail box (GemmParams::a_tail_rows) for the per-owner tiling. The kernel loads
    the tail box instead of the full one where fewer than a box of rows remain before m (and m
    exceeds a box, gemm/load.cuh a_tail_box): with owner rows that is an owner's last tile row
    near m, which needs that owner's rows of it, m_loc - (L - 1) BM (the same for every owner), or
    a padding row (never stored). The plain tiling's tail (tune.a_tail_rows) counts from row 0
    and can be shorter."""
    if tile.cluster_n > 1:
        return 0  # A multicast: the box is split between the CTAs, no tail map
    m_loc = m // world
    last = m_loc - (_cdiv(m_loc, tile.bm) - 1) * tile.bm
    if m > tile.bm and last < tile.bm:
        return _cdiv(last, 8) * 8
    return 8 if rows_per_owner(m_loc, tile) > _cdiv(m_loc, tile.bm) else 0


def interleaved_own(world: int, per_owner: int, delay: int) -> int:
    """Own tiles placed among the remote ones (the rest close the order)."""
    remote = (world - 1) * per_owner
    return min(per_owner, (remote - delay) // (world - 1)) if remote >= delay else 0


def rs_position(u: int, r: int, world: int, per_owner: int, delay: int) -> tuple[int, int]:
    """(owner, j) at position u on rank r: rs_position in fused/rs_sched.cuh."""
    if world == 1:
        return r, u
    remote = (world - 1) * per_owner
    inter = interleaved_own(world, per_owner, delay)
    if u >= remote + inter:
        return r, u - remote
    x = u + 1 - delay
    if x > 0 and x % world == 0 and x // world - 1 < inter:
        return r, x // world - 1
    own_before = min(inter, (u - delay) // world) if u >= delay else 0
    i = u - own_before
    return (r + 1 + i % (world - 1)) % world, i // (world - 1)


def rs_order(r: int, world: int, per_owner: int, delay: int) -> list[tuple[int, int]]:
    """Every position of rank r, in order."""
    return [rs_position(u, r, world, per_owner, delay) for u in range(world * per_owner)]


def rs_order_reference(r: int, world: int, per_owner: int, delay: int) -> list[tuple[int, int]]:
    """The same order built by construction (the definition the closed form must match)."""
    remote = [((r + 1 + i % (world - 1)) % world, i // (world - 1)) for i in range((world - 1) * per_owner)]
    out: list[tuple[int, int]] = []
    own = 0
    for i, t in enumerate(remote):
        out.append(t)
        # own tile j goes after remote index (j + 1)(W - 1) - 1 + delay
        while own < per_owner and (own + 1) * (world - 1) - 1 + delay == i:
            out.append((r, own))
            own += 1
    out.extend((r, j) for j in range(own, per_owner))
    return out
