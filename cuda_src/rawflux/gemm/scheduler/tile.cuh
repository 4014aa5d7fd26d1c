// The persistent tile order every scheduler shares, and TileSched (data-parallel and split-K; the
// fused ops' scheduler, which they run with splits = 1).
//
// A CTA's work units: unit u (0 <= u < units) -> split = u / cluster_tiles, cluster tile =
// u % cluster_tiles; a CTA takes units cluster_id, cluster_id + clusters, ... Cluster tiles are
// (kClusterM x kClusterN) CTA tiles; each CTA of the cluster takes its own tile of it, and all CTAs
// of a cluster walk the same units (they share operand loads by multicast).
// Cluster tiles are visited in grouped ("swizzled") order so the operands of the tiles in flight
// stay in L2: `group` tile-rows side by side, walked along n (or tile-columns along m).
// Row-block rotation (for the fused collectives): tile rows start at segment `seg_start` of
// `seg_count` equal row segments and wrap around; seg_count = 1 is the plain order.
// The units past the data-parallel tiles are StreamKSched's pieces (scheduler/stream_k.cuh).
#pragma once
#include "rawflux/gemm/config.cuh"
#include "rawflux/ptx/mbarrier.cuh"

namespace rawflux {

struct WorkTile {
  i32 tile_m, tile_n;      // this CTA's tile (may lie past m or n for the odd CTA of a cluster)
  i32 kb_begin, kb_end;    // k blocks of this unit
  i32 split, splits;       // piece index of this tile and pieces the tile is cut into (1: no fix-up)
  i32 slot;                // fix-up slot: the workspace / counter index of this CTA tile
};

// Units advance by the number of clusters in the grid (CTAs without clusters).
template <class Cfg>
RAWFLUX_DEVICE i32 sched_stride() {
  return Cfg::kClusterSize > 1 ? (i32)ptx::cluster_count_x() : (i32)ptx::grid_dim_x();
}

// The engine's scheduler: data-parallel / split-K units, then (kStreamKPolicy) StreamKSched's
// pieces (the three cuts of scheduler/stream_k.cuh); kNarrowN > 0: NarrowSched's columns
// (scheduler/narrow.cuh).
template <class Cfg, bool kStreamKPolicy, int kNarrowN_ = 0>
struct TileSchedT {
  static constexpr int kNarrowN = kNarrowN_;
  static_assert(kNarrowN == 0 || (Cfg::kClusterN == 1 && Cfg::kWgN == 1 && Cfg::kWgmmaChunks == 1 && kNarrowN % 8 == 0 &&
                                  kNarrowN > Cfg::kBN - 64 && kNarrowN < Cfg::kBN),
                "narrow columns: one wgmma per warpgroup row, at most one 64-column box narrower than BN");
  // First column of tile column tile_n.
  static RAWFLUX_DEVICE i32 col0(const GemmParams& p, i32 tile_n) {
    if constexpr (kNarrowN > 0) {
      return tile_n < p.narrow_from ? tile_n * Cfg::kBN : p.narrow_from * Cfg::kBN + (tile_n - p.narrow_from) * kNarrowN;
    } else {
      return tile_n * Cfg::kBN;
    }
  }

  // Tile row tile_m starts at row tile_m * BM (kOwnerRows false: the kernel computes that itself;
  // a scheduler whose rows start elsewhere says so and gives a_row).
  static constexpr bool kOwnerRows = false;
  static RAWFLUX_DEVICE i32 a_row(const GemmParams&, i32 tile_m) { return tile_m * Cfg::kBM; }

  // Stream-K is compiled for tiles whose warpgroup fragment is one wgmma wide (N <= 256). With the
  // 128 x 320 tile's 160 accumulators the stream-K arithmetic in the consumers' tile loop spilled
  // (~1.9 KB) and serialized the wgmma (C7512); the host never offers that tile stream-K.
  static constexpr bool kStreamK = kStreamKPolicy && Cfg::kWgmmaChunks == 1 && Cfg::kClusterK == 1;

  // Only the cursor lives in registers; the rest is recomputed from the (constant-bank) params and
  // the grid's special registers on each call, which keeps the consumer warpgroups' register budget
  // for the accumulators and the producer within its 40 (a stride kept in a register was spilled).
  i32 unit;  // >= 0: the next data-parallel / split-K unit; < 0: stream-K, -1 - the next iteration
  u32 cta_rank;

  RAWFLUX_DEVICE TileSchedT(const GemmParams& p, i32 cluster_id, i32 rank) : unit(cluster_id), cta_rank((u32)rank) {
    if (!kStreamK && p.sk_tiles != 0) __trap();  // the host never asks this variant for stream-K: tiles would go missing
  }

  static RAWFLUX_DEVICE i32 stride() { return sched_stride<Cfg>(); }

  RAWFLUX_DEVICE bool next(const GemmParams& p, WorkTile& w) {
    const i32 ctiles_m = (p.tiles_m + Cfg::kClusterM - 1) / Cfg::kClusterM;
    const i32 ctiles_n = (p.tiles_n + Cfg::kClusterN - 1) / Cfg::kClusterN;
    const i32 ctiles = ctiles_m * ctiles_n;
    const i32 sk_tiles = kStreamK ? p.sk_tiles : 0;
    const i32 dp_tiles = ctiles - sk_tiles;
    i32 cu;
    bool sk_piece = false;
    if (unit >= 0 && unit < dp_tiles * (sk_tiles > 0 ? 1 : p.splits)) {
      const i32 split = unit / dp_tiles;
      cu = unit - split * dp_tiles;
      w.split = split;
      w.splits = sk_tiles > 0 ? 1 : p.splits;
      w.kb_begin = split * p.kb_per_split;
      w.kb_end = min(p.k_blocks, w.kb_begin + p.kb_per_split);
      unit += stride();
    } else {
      if constexpr (!kStreamK) {
        return false;
      } else {
        if (sk_tiles == 0) return false;
        if (p.tail_splits > 0) {
          // Split tail: piece j of tail tile t is unit dp_tiles + j * sk_tiles + t, so a round of
          // the grid takes the same k range of neighbouring tiles (they share operand rows in L2).
          const i32 v = unit - dp_tiles;
          if (v >= sk_tiles * p.tail_splits) return false;
          const i32 split = v / sk_tiles;
          const i32 per = (p.k_blocks + p.tail_splits - 1) / p.tail_splits;
          cu = dp_tiles + (v - split * sk_tiles);
          w.split = split;
          w.splits = p.tail_splits;
          w.kb_begin = split * per;
          w.kb_end = min(p.k_blocks, w.kb_begin + per);
          unit += stride();
        } else if (p.tail_splits < 0) {
          // Banded stream-K: stacks of b = -tail_splits consecutive tiles form a line of stacks x k
          // blocks. b clusters make a band; the H = G / b bands cut the line's first E iterations in
          // equal runs, band h [h E / H, (h + 1) E / H), member j taking row j of each stack, so a
          // column's clusters load the same k block at the same time. The L = G - H b clusters left
          // over (L divides b; the host checks) run the line's end [E, line) once per pass of L rows;
          // E = ceil(H I / G) evens the two out. A tile's pieces are the bands' in k order, then the
          // leftover's.
          const u32 G = (u32)stride();
          const u32 b = (u32)(-p.tail_splits);
          const u32 K = (u32)p.k_blocks;
          const u32 iters = (u32)sk_tiles * K;  // I: tile iterations; the line has I / b
          const u32 line = iters / b;
          const u32 H = G / b;
          const u32 E = (H * iters + G - 1) / G;  // the bands' end of the line
          const u32 g = Cfg::kClusterSize > 1 ? ptx::cluster_id_x() : (u32)blockIdx.x;
          const u32 pos = unit >= 0 ? 0u : (u32)(-1 - unit);  // iterations this cluster has run
          u32 x, end, j, h = 0;
          if (g < H * b) {
            h = g / b;
            j = g - h * b;
            x = h * E / H + pos;
            end = (h + 1) * E / H;
          } else {
            const u32 L = G - H * b;
            if (E >= line) return false;
            const u32 pass = pos / (line - E);
            if (pass >= b / L) return false;
            j = g - H * b + pass * L;
            x = E + (pos - pass * (line - E));
            end = line;
          }
          if (x >= end) return false;
          const u32 c = x / K;
          const u32 kb0 = x - c * K;
          const u32 kb1 = min(K, kb0 + (end - x));
          const u32 c0 = c * K;
          // Band owning line iteration y < E: the largest h with h E / H <= y, ((y + 1) H - 1) / E.
          const u32 first = ((c0 + 1) * H - 1) / E;
          const u32 bands = c0 < E ? (min(c0 + K, E) * H - 1) / E - first + 1 : 0u;
          w.split = (i32)(g < H * b ? h - first : bands);
          w.splits = (i32)(bands + (c0 + K > E ? 1u : 0u));
          w.kb_begin = (i32)kb0;
          w.kb_end = (i32)kb1;
          cu = dp_tiles + (i32)(c * b + j);
          unit = -1 - (i32)(pos + kb1 - kb0);
        } else {
          const u32 G = (u32)stride();
          const u32 K = (u32)p.k_blocks;
          const u32 iters = (u32)sk_tiles * K;
          u32 it, g;
          if (unit >= 0) {  // first stream-K call: unit = cluster_id + j * G
            g = (u32)unit % G;
            it = g * iters / G;
          } else {  // iteration it - 1 was this cluster's: its owner is this cluster
            it = (u32)(-1 - unit);
            g = (it * G - 1) / iters;
          }
          const u32 end = (g + 1) * iters / G;
          if (it >= end) return false;
          const u32 t = it / K;
          const u32 kb0 = it - t * K;
          const u32 kb1 = min(K, kb0 + (end - it));
          // Owner of iteration x: the largest g with g * I / G <= x, i.e. ((x + 1) * G - 1) / I.
          const u32 first = ((t * K + 1) * G - 1) / iters;
          const u32 last = ((t + 1) * K * G - 1) / iters;
          w.split = (i32)(g - first);
          w.splits = (i32)(last - first + 1);
          w.kb_begin = (i32)kb0;
          w.kb_end = (i32)kb1;
          cu = dp_tiles + (i32)t;
          unit = -1 - (i32)(it + kb1 - kb0);
        }
        sk_piece = true;
      }
    }
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
    if constexpr (Cfg::kClusterK > 1) {  // k-split cluster: both CTAs take the tile, CTA r its k half r
      w.kb_begin = (i32)cta_rank * p.kb_per_split;
      w.kb_end = min(p.k_blocks, w.kb_begin + p.kb_per_split);
    }
    w.tile_m = cm * Cfg::kClusterM + (Cfg::kClusterM > 1 ? (i32)cta_rank : 0);
    w.tile_n = cn * Cfg::kClusterN + (Cfg::kClusterN > 1 ? (i32)cta_rank : 0);
    // Split-K slots are CTA tiles; stream-K slots count only the stream-K tiles (a smaller workspace).
    w.slot = sk_piece ? (cu - dp_tiles) * Cfg::kClusterSize + (i32)cta_rank : w.tile_m * p.tiles_n + w.tile_n;
    return true;
  }
};

// Scheduler policies name gemm_kernel's Sched argument; `type<Cfg>` is the scheduler itself.
// kFixupChunk: float4 of a partial the fix-up's sum loads per round trip. TileSched's ops
// (GEMM-RS, GEMM + AllReduce, AG-GEMM with B (k, n)) never split, yet their variants keep the
// fix-up compiled, with chunks of 4: compiled out, or with chunks of 8, ptxas spilled 16 B in the
// 40-register producer of the AgWait 128x192 / 128x256 cluster variants (register allocation
// there is that fragile).
struct TileSched {
  static constexpr int kFixupChunk = 4;
  template <class Cfg>
  using type = TileSchedT<Cfg, false>;
};

}  // namespace rawflux
