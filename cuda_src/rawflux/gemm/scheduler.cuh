// Persistent tile scheduler: maps a CTA's sequence of linear work indices to tiles.
//
// Work unit u (0 <= u < units) -> split = u / cluster_tiles, cluster tile = u % cluster_tiles.
// Cluster tiles are (kClusterM x kClusterN) CTA tiles; each CTA of the cluster takes its own tile
// of it, and all CTAs of a cluster walk the same units (they share operand loads by multicast).
// Cluster tiles are visited in grouped ("swizzled") order so the operands of the tiles in flight
// stay in L2: `group` tile-rows side by side, walked along n (or tile-columns along m).
// Row-block rotation (for the fused collectives): tile rows start at segment `seg_start` of
// `seg_count` equal row segments and wrap around; seg_count = 1 is the plain order.
#pragma once
#include "rawflux/gemm/config.cuh"
#include "rawflux/ptx/mbarrier.cuh"

namespace rawflux {

struct WorkTile {
  i32 tile_m, tile_n;      // this CTA's tile (may lie past m or n for the odd CTA of a cluster)
  i32 kb_begin, kb_end;    // k blocks of this unit
  i32 split;               // split index (0 when splits == 1)
  i32 tile_linear;         // tile_m * tiles_n + tile_n (split-K bookkeeping)
};

template <class Cfg>
struct TileSchedT {
  // Only the cursor lives in registers; the rest is recomputed from the (constant-bank) params and
  // the grid's special registers on each call, which keeps the consumer warpgroups' register budget
  // for the accumulators and the producer within its 40 (a stride kept in a register was spilled).
  i32 unit;
  u32 cta_rank;

  RAWFLUX_DEVICE TileSchedT(const GemmParams&, i32 cluster_id, i32 rank) : unit(cluster_id), cta_rank((u32)rank) {}

  // Units advance by the number of clusters in the grid (CTAs without clusters).
  static RAWFLUX_DEVICE i32 stride() { return Cfg::kClusterSize > 1 ? (i32)ptx::cluster_count_x() : (i32)ptx::grid_dim_x(); }

  RAWFLUX_DEVICE bool next(const GemmParams& p, WorkTile& w) {
    const i32 ctiles_m = (p.tiles_m + Cfg::kClusterM - 1) / Cfg::kClusterM;
    const i32 ctiles_n = (p.tiles_n + Cfg::kClusterN - 1) / Cfg::kClusterN;
    const i32 ctiles = ctiles_m * ctiles_n;
    if (unit >= ctiles * p.splits) return false;
    const i32 split = unit / ctiles;
    const i32 cu = unit - split * ctiles;
    i32 cm, cn;
    if (!p.raster_n) {
      const i32 per_group = p.group * ctiles_n;
      const i32 g = cu / per_group;
      const i32 first = g * p.group;
      const i32 gsize = min(ctiles_m - first, p.group);
      const i32 r = cu - g * per_group;
      cm = first + r % gsize;
      cn = r / gsize;
    } else {
      const i32 per_group = p.group * ctiles_m;
      const i32 g = cu / per_group;
      const i32 first = g * p.group;
      const i32 gsize = min(ctiles_n - first, p.group);
      const i32 r = cu - g * per_group;
      cn = first + r % gsize;
      cm = r / gsize;
    }
    if (p.seg_count > 1) {
      const i32 seg_rows = p.m / p.seg_count;
      const i32 shift = (i32)(((i64)p.seg_start * seg_rows) / (Cfg::kBM * Cfg::kClusterM)) % ctiles_m;
      cm += shift;
      if (cm >= ctiles_m) cm -= ctiles_m;
    }
    w.tile_m = cm * Cfg::kClusterM + (Cfg::kClusterM > 1 ? (i32)cta_rank : 0);
    w.tile_n = cn * Cfg::kClusterN + (Cfg::kClusterN > 1 ? (i32)cta_rank : 0);
    w.split = split;
    w.kb_begin = split * p.kb_per_split;
    w.kb_end = min(p.k_blocks, w.kb_begin + p.kb_per_split);
    w.tile_linear = w.tile_m * p.tiles_n + w.tile_n;
    unit += stride();
    return true;
  }
};

// The scheduler policy named in gemm_kernel's template arguments.
struct TileSched {
  template <class Cfg>
  using type = TileSchedT<Cfg>;
};

}  // namespace rawflux
