// Prologue and epilogue policies of the GEMM engine (gemm_kernel's Prologue / Epilogue template
// arguments), and the engine's own: NoWait, LocalStore, TmaStore. The fused collectives add their
// own of the same shape (fused/); the mainloop stays one.
//
// Prologue contract:
//   struct P {
//     struct Params { ... };   // by-value kernel parameter (trivially copyable)
//     // Producer thread (one per CTA), before it issues the TMA loads of A for a work unit:
//     // rows [m0, m0 + rows) of A are about to be read. Return when they may be read.
//     static __device__ void wait(const Params&, const GemmParams&, i32 tile_m, i32 m0, i32 rows);
//     // true: consumer warps may load a unit's later k blocks (Cfg::kRefill), so wait must order
//     // every thread's later loads of those rows, not only the producer's
//     static constexpr bool kConsumerRefill;
//     // true: A's k blocks arrive in slabs; after wait, the producer calls wait_slabs before
//     // k block kb of a unit whose blocks end at kb_end, and it returns when kb's slab may be
//     // read, with the first block past the slabs known to have landed (loads up to it need no
//     // further wait)
//     static constexpr bool kSlabWait;
//     static __device__ i32 wait_slabs(const Params&, i32 m0, i32 rows, i32 kb, i32 kb_end);
//     // true (with kSlabWait): before the CTA's first unit waits, the producer loads B of its first
//     // b_first(...) k blocks (capped at kStages); b_first returns 0 where nothing is to wait for,
//     // and at most the blocks of kb's slab (wait_slabs for kb covers their A)
//     static constexpr bool kBFirst;
//     static __device__ i32 b_first(const Params&, i32 m0, i32 rows, i32 kb, i32 kb_end);
//     // true: a tile for which own_tile(params, tile0, kBM) holds loads A through the Params'
//     // TensorMap own_map, at row tile0 - own_row0(params) (AllGather-GEMM's own rows in place)
//     static constexpr bool kOwnRows;
//   };
// Epilogue contract:
//   struct E {
//     struct Params { ... };
//     static constexpr bool kTileBarrier;  // true: after every tile's store, all consumer threads
//                                          // meet at named barrier kConsumerBarrier (128 * kConsumers
//                                          // threads) and then call tile_done
//     static constexpr bool kDeferrable;   // true: has TmaStore's box interface (Cfg::kDeferBoxes)
//     static constexpr bool kExtraBlocks;  // true: after a tile's k blocks the producer loads
//                                          // extra_rounds() x BN/64 blocks of its own into the ring
//                                          // (extra_wait, extra_load) and the consumers, after
//                                          // extra_begin, fold each into the accumulators
//                                          // (extra_add): GEMM-RS's partials
//     template <class Cfg> static __device__ void store(const Params&, const GemmParams&,
//                            float (&acc)[Cfg::kAccRegs], const TileCoord&);   // every consumer thread
//     template <class Cfg> static __device__ void tile_done(const Params&, const GemmParams&, const TileCoord&);
//     template <class Cfg> static constexpr int scratch_bytes();   // shared memory it needs (tc.scratch)
//     template <class Cfg> static __device__ void init(const Params&, u32 scratch);   // thread 0, before
//                            // the kernel's start barrier: initialise its shared state
//     template <class Cfg, class SchedT> static __device__ void side(const Params&, const GemmParams&, u32 scratch);
//                            // warps 1..3 of the producer warpgroup (40 registers; threadIdx.x / 32
//                            // says which): roles of its own
//     template <class Cfg> static __device__ void finish(const Params&, u32 tid, u32 consumer, u32 scratch);
//                            // every consumer thread, once, after its last tile (drain asynchronous stores)
//   };
// Both Params are __grid_constant__ kernel parameters: a TensorMap member is usable by TMA in place.
#pragma once
#include "rawflux/gemm/config.cuh"
#include "rawflux/gemm/epilogue/local_store.cuh"
#include "rawflux/gemm/epilogue/tma_store.cuh"

namespace rawflux {

// Plain GEMM: A is ready before the launch.
struct NoWait {
  struct Params {
    i32 unused;
  };
  static constexpr bool kConsumerRefill = true;  // nothing to order
  static constexpr bool kSlabWait = false;
  static constexpr bool kBFirst = false;
  static constexpr bool kOwnRows = false;
  static RAWFLUX_DEVICE void wait(const Params&, const GemmParams&, i32, i32, i32) {}
  static RAWFLUX_DEVICE i32 wait_slabs(const Params&, i32, i32, i32, i32 kb_end) { return kb_end; }
};

}  // namespace rawflux
