// NarrowSched<kN>: narrow columns (the plain GEMM, data-parallel). The tile columns from
// GemmParams::narrow_from on are kN wide instead of BN (tiles_n counts both), so that the last
// wave's tiles are shorter and every cluster's work comes out closer to the mean. The host chooses
// the columns so that each cluster's last-wave tile is a narrow one (rawflux/tune/plans.py, narrow_plan).
// A narrow tile's wgmma is m64n{kN}, and its epilogue stores the first kN columns
// (TmaStore::store_narrow).
#pragma once
#include "rawflux/gemm/scheduler/stream_k.cuh"

namespace rawflux {

template <int kN>
struct NarrowSched {
  static constexpr int kFixupChunk = 8;
  template <class Cfg>
  using type = TileSchedT<Cfg, true, kN>;
};

}  // namespace rawflux
