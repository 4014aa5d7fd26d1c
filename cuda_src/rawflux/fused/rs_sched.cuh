// GEMM-ReduceScatter's tile order (gemm_kernel's Sched argument): owners interleaved, own tiles one
// wave late.
//
// Rows are tiled per owner: rank o owns rows [o m_loc, (o + 1) m_loc) (m_loc = m / W), cut into
// tile rows of BM from o m_loc on, padded to whole clusters, so that no tile straddles two owners
// (its boxes then go to one owner, clipped at its slot's m_loc rows). Tile row tile_m = o * Lp + l
// (Lp = GemmParams::tiles_m / W tile rows per owner) starts at row o m_loc + l BM.
//
// Position u of the T cluster tiles of each owner (j = 0..T-1 in grouped raster order within the
// owner) on rank r (GemmParams::seg_start; W = seg_count):
//   * the remote tiles in round robin over the peers r + 1, r + 2, ..., r + W - 1: remote index i
//     goes to owner (r + 1 + i mod (W - 1)) mod W, its tile j = i / (W - 1). At every moment each
//     rank sends to a different owner (the offset owner - r is the same on every rank), so every
//     link carries an even share and no owner takes two sources at once;
//   * own tile j where the round robin would put it (after the remote tiles j of every peer) plus
//     D = GemmParams::own_delay positions (one wave, the grid's clusters), so that when it reaches
//     its epilogue the peers' partials of it have arrived: f_j = (j + 1) W - 1 + D while that
//     leaves the remote tiles in front of it, and the rest at the end, in order.
// An own tile waits only for peer tiles at earlier positions, and every CTA walks its positions in
// increasing order, so the waits are acyclic whenever every CTA is resident (rawflux/plan.py
// checks it for W = 2..8 over the shape grid; tests/cpu/test_rs_order.py runs it).
#pragma once
#include "rawflux/gemm/scheduler/tile.cuh"

namespace rawflux {

struct RsPosition {
  i32 owner;
  i32 j;  // the owner's cluster tile, in grouped raster order
};

// Owner and tile of position u (0 <= u < W T) on rank r; rawflux/ops/gemm_rs.py rs_position mirrors it.
RAWFLUX_DEVICE RsPosition rs_position(i32 u, i32 r, i32 world, i32 per_owner, i32 delay) {
  if (world == 1) return {r, u};
  const i32 remote = (world - 1) * per_owner;
  // own tiles interleaved: those with a full set of remote tiles and the delay in front of them
  const i32 interleaved = remote >= delay ? min(per_owner, (remote - delay) / (world - 1)) : 0;
  if (u >= remote + interleaved) return {r, u - remote};
  const i32 x = u + 1 - delay;
  if (x > 0 && x % world == 0 && x / world - 1 < interleaved) return {r, x / world - 1};
  const i32 own_before = u >= delay ? min(interleaved, (u - delay) / world) : 0;
  const i32 i = u - own_before;
  const i32 peer = i % (world - 1);
  return {(r + 1 + peer) % world, i / (world - 1)};
}

template <class Cfg>
struct RsSchedT {
  static_assert(Cfg::kClusterK == 1, "a k-split cluster computes one tile in two halves: not a GEMM-RS tile");
  static constexpr int kNarrowN = 0;
  static constexpr bool kStreamK = false;

  i32 unit;
  u32 cta_rank;

  RAWFLUX_DEVICE RsSchedT(const GemmParams&, i32 cluster_id, i32 rank) : unit(cluster_id), cta_rank((u32)rank) {}

  static RAWFLUX_DEVICE i32 col0(const GemmParams&, i32 tile_n) { return tile_n * Cfg::kBN; }

  // Tile rows per owner (a multiple of kClusterM).
  static RAWFLUX_DEVICE i32 rows_per_owner(const GemmParams& p) { return p.tiles_m / p.seg_count; }

  static constexpr bool kOwnerRows = true;  // tile rows start at their owner's rows
  static RAWFLUX_DEVICE i32 a_row(const GemmParams& p, i32 tile_m) {
    const i32 lp = rows_per_owner(p);
    const i32 owner = tile_m / lp;
    return owner * (p.m / p.seg_count) + (tile_m - owner * lp) * Cfg::kBM;
  }

  RAWFLUX_DEVICE bool next(const GemmParams& p, WorkTile& w) {
    const i32 world = p.seg_count;
    const i32 crows = rows_per_owner(p) / Cfg::kClusterM;  // cluster rows per owner
    const i32 ccols = (p.tiles_n + Cfg::kClusterN - 1) / Cfg::kClusterN;
    const i32 per_owner = crows * ccols;
    if (unit >= world * per_owner) return false;
    const RsPosition pos = rs_position(unit, p.seg_start, world, per_owner, p.own_delay);
    // grouped raster inside the owner: `group` cluster rows side by side, walked along n
    const i32 per_group = p.group * ccols;
    const i32 g = pos.j / per_group;
    const i32 first = g * p.group;
    const i32 gsize = min(crows - first, p.group);
    const i32 rr = pos.j - g * per_group;
    const i32 cm = first + rr % gsize, cn = rr / gsize;
    w.tile_m = pos.owner * rows_per_owner(p) + cm * Cfg::kClusterM + (Cfg::kClusterM > 1 ? (i32)cta_rank : 0);
    w.tile_n = cn * Cfg::kClusterN + (Cfg::kClusterN > 1 ? (i32)cta_rank : 0);
    w.kb_begin = 0;
    w.kb_end = p.k_blocks;
    w.split = 0;
    w.splits = 1;
    w.slot = 0;
    unit += sched_stride<Cfg>();
    return true;
  }
};

struct RsSched {
  static constexpr int kFixupChunk = 4;
  template <class Cfg>
  using type = RsSchedT<Cfg>;
};

}  // namespace rawflux
