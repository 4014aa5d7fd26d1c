// Prologue and epilogue policies of the GEMM engine (gemm_kernel's Prologue / Epilogue template
// arguments). The fused collectives add their own here-shaped policies; the mainloop stays one.
//
// Prologue contract:
//   struct P {
//     struct Params { ... };   // by-value kernel parameter (trivially copyable)
//     // Producer thread (one per CTA), before it issues the TMA loads of A for a work unit:
//     // rows [m0, m0 + rows) of A are about to be read. Return when they may be read.
//     static __device__ void wait(const Params&, const GemmParams&, i32 tile_m, i32 m0, i32 rows);
//   };
// Epilogue contract:
//   struct E {
//     struct Params { ... };
//     static constexpr bool kTileBarrier;  // true: after every tile's store, all consumer threads
//                                          // meet at named barrier kConsumerBarrier (128 * kConsumers
//                                          // threads) and then call tile_done
//     template <class Cfg> static __device__ void store(const Params&, const GemmParams&,
//                            float (&acc)[Cfg::kAccRegs], const TileCoord&);   // every consumer thread
//     template <class Cfg> static __device__ void tile_done(const Params&, const GemmParams&, const TileCoord&);
//   };
#pragma once
#include "rawflux/gemm/epilogue.cuh"

namespace rawflux {

// Named barrier ids: 0 is __syncthreads'; 1 spans the consumer warpgroups (tile_done hook);
// 2 + c is consumer warpgroup c alone (split-K fix-up).
// 4 + c: consumer warpgroup c's turn to issue (ordered issue).
enum : u32 { kConsumerBarrier = 1, kWarpgroupBarrierBase = 2, kIssueBarrierBase = 4 };

// Plain GEMM: A is ready before the launch.
struct NoWait {
  struct Params {
    i32 unused;
  };
  static RAWFLUX_DEVICE void wait(const Params&, const GemmParams&, i32, i32, i32) {}
};

// Plain GEMM: C = acc (+ bias), converted to the output type, stored to C (row stride ldc).
struct LocalStore {
  struct Params {
    u64 c;          // C base pointer
    u64 bias;       // (n,) bias or 0
    i64 ldc;        // C row stride in elements
    i32 bias_kind;  // epi::kBiasNone / kBiasIn16 (same type as A, B) / kBiasF32
    i32 pad;
  };
  static constexpr bool kTileBarrier = false;

  template <class Cfg>
  static RAWFLUX_DEVICE void store(const Params& ep, const GemmParams& p, float (&acc)[Cfg::kAccRegs], const TileCoord& tc) {
    if (ep.bias_kind != epi::kBiasNone) {
      epi::add_bias<Cfg::kInF16>(acc, reinterpret_cast<const void*>(ep.bias), ep.bias_kind, tc.col0, p.n, tc.tid);
    }
    epi::store_fragment<Cfg::kOut>(reinterpret_cast<void*>(ep.c), ep.ldc, acc, tc.row0, tc.col0, p.m, p.n, tc.tid);
  }

  template <class Cfg>
  static RAWFLUX_DEVICE void tile_done(const Params&, const GemmParams&, const TileCoord&) {}
};

}  // namespace rawflux
