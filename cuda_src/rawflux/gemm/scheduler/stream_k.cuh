// StreamKSched: the plain GEMM's scheduler. After the data-parallel tiles, the last p.sk_tiles
// tiles of the raster order (the partial last wave) are cut in k, in one of three ways
// (GemmParams::tail_splits); the pieces of a tile are numbered in k order (w.split of w.splits)
// and summed in that order by splitk_fixup (gemm/fixup.cuh), so the bits do not depend on which
// piece finishes last. The host's mirror is rawflux/tune/plans.py (sk_plan, band_shape).
//
//   stream-K (tail_splits = 0): the (tile, k block) iterations of the cut tiles form one line of
//     sk_tiles * k_blocks, cut into G equal runs (G = clusters in the grid); cluster g owns
//     [g I / G, (g + 1) I / G). A run crossing tile boundaries yields one piece per tile. The
//     host keeps G <= I (no empty run) and G * I < 2^31 (u32 math).
//   split tail (tail_splits = s > 0): each cut tile in s pieces of ceil(k_blocks / s) k blocks,
//     piece index major (unit dp_tiles + j * sk_tiles + t is piece j of tile t), so a round of the
//     grid reads neighbouring tiles at the same k offsets, as a data-parallel wave does.
//   banded stream-K (tail_splits = -b < 0): stream-K's equal runs over a line of stacks (b
//     consecutive tiles of the order: a group's tile column, which shares B's rows, or its tile
//     row under raster_n) that b clusters (a band) run side by side, each on its own row of the
//     stack, so the clusters sharing an operand load the same k block together. Clusters left over
//     by G = H b + L run the line's end once per pass of L rows. Piece 0 of a cut tile is always
//     its cluster's last unit, so it usually arrives last and sums with its own partial in
//     registers.
//
// The pieces are computed in TileSchedT::next (scheduler/tile.cuh), in the same function as the
// data-parallel units: as a function of their own, the SASS of every StreamKSched variant changes
// (block order).
#pragma once
#include "rawflux/gemm/scheduler/tile.cuh"

namespace rawflux {

struct StreamKSched {
  static constexpr int kFixupChunk = 8;
  template <class Cfg>
  using type = TileSchedT<Cfg, true>;
};

}  // namespace rawflux
