// LocalStore: C = acc (+ bias), converted to the output type and stored from registers to a
// row-major C (row stride ldc). The plain GEMM's epilogue for f32 C.
#pragma once
#include "rawflux/gemm/epilogue/fragment.cuh"

namespace rawflux {

struct LocalStore {
  struct Params {
    u64 c;          // C base pointer
    u64 bias;       // (n,) bias or 0
    i64 ldc;        // C row stride in elements
    i32 bias_kind;  // epi::kBiasNone / kBiasIn16 (same type as A, B) / kBiasF32
    i32 pad;
  };
  static constexpr bool kTileBarrier = false;
  static constexpr bool kExtraBlocks = false;  // no blocks of its own through the ring
  static constexpr bool kDeferrable = false;

  template <class Cfg>
  static RAWFLUX_DEVICE void store(const Params& ep, const GemmParams& p, float (&acc)[Cfg::kAccRegs], const TileCoord& tc) {
    if (ep.bias_kind != epi::kBiasNone) {
      epi::add_bias<Cfg::kInF16>(acc, reinterpret_cast<const void*>(ep.bias), ep.bias_kind, tc.col0, p.n, tc.tid);
    }
    epi::store_fragment<Cfg::kOut>(reinterpret_cast<void*>(ep.c), ep.ldc, acc, tc.row0, tc.col0, p.m, p.n, tc.tid);
  }

  template <class Cfg>
  static RAWFLUX_DEVICE void tile_done(const Params&, const GemmParams&, const TileCoord&) {}

  template <class Cfg>
  static constexpr int scratch_bytes() { return 0; }

  template <class Cfg>
  static RAWFLUX_DEVICE void init(const Params&, u32) {}

  template <class Cfg, class SchedT>
  static RAWFLUX_DEVICE void side(const Params&, const GemmParams&, u32) {}

  template <class Cfg>
  static RAWFLUX_DEVICE void finish(const Params&, u32, u32, u32) {}
};

}  // namespace rawflux
