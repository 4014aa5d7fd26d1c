// Prologue and epilogue policies of the GEMM engine (gemm_kernel's Prologue / Epilogue template
// arguments). The fused collectives add their own here-shaped policies; the mainloop stays one.
//
// Prologue contract:
//   struct P {
//     struct Params { ... };   // by-value kernel parameter (trivially copyable)
//     // Producer thread (one per CTA), before it issues the TMA loads of A for a work unit:
//     // rows [m0, m0 + rows) of A are about to be read. Return when they may be read.
//     static __device__ void wait(const Params&, const GemmParams&, i32 tile_m, i32 m0, i32 rows);
//     // true: consumer warps may load a unit's later k blocks (the consumer refill, config.cuh),
//     // so wait must order every thread's later loads of those rows, not only the producer's
//     static constexpr bool kConsumerRefill;
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
//     template <class Cfg> static constexpr int scratch_bytes();   // shared memory it needs (tc.scratch)
//     template <class Cfg> static __device__ void finish(const Params&, u32 tid);  // every consumer
//                            // thread, once, after its last tile (drain asynchronous stores)
//   };
// Params is a __grid_constant__ kernel parameter: a TensorMap member is usable by TMA in place.
#pragma once
#include "rawflux/gemm/epilogue.cuh"
#include "rawflux/ptx/tma.cuh"

namespace rawflux {

// An epilogue's scratch starts at this offset from the 1024-aligned shared base (past the stage
// ring and its barriers), and the kernel's dynamic shared memory is then
// kScratchOffset + scratch + 1024 (alignment slack). rawflux/ops/gemm.py mirrors both.
template <class Cfg>
constexpr int kScratchOffset = Cfg::kStages * Cfg::kStageBytes + 1024;
template <class Cfg>
constexpr int kScratchFree = 232448 - 1024 - kScratchOffset<Cfg>;

// Named barrier ids: 0 is __syncthreads'; 1 spans the consumer warpgroups (tile_done hook);
// 2 + c is consumer warpgroup c alone (split-K fix-up).
// 4 + c: consumer warpgroup c's turn to issue (ordered issue).
enum : u32 { kConsumerBarrier = 1, kWarpgroupBarrierBase = 2, kIssueBarrierBase = 4 };

// Plain GEMM: A is ready before the launch.
struct NoWait {
  struct Params {
    i32 unused;
  };
  static constexpr bool kConsumerRefill = true;  // nothing to order
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

  template <class Cfg>
  static constexpr int scratch_bytes() { return 0; }

  template <class Cfg>
  static RAWFLUX_DEVICE void finish(const Params&, u32) {}
};

// Plain GEMM, 16-bit C through shared memory and TMA stores: each consumer warpgroup writes its
// 64 x kWN fragment in 64-column boxes (stmatrix into a 128-byte-swizzled staging buffer, then one
// bulk tensor store per box, clipped at C's bounds by the tensor map) and goes back to the main loop
// while the TMA engine drains the boxes. kBufs staging buffers per warpgroup, as many as the shared
// memory left over by the stage ring allows; with none (a ring that fills shared memory), the
// fragment is stored from registers as LocalStore does.
struct TmaStore {
  struct Params {
    TensorMap tmap_c;  // C: 16-bit, (m, n) row-major, boxes of 64 rows x 64 columns, 128-byte swizzle
    u64 c;             // C base pointer and row stride (elements), for the register path
    i64 ldc;
    u64 bias;          // (n,) bias or 0
    i32 bias_kind;     // epi::kBiasNone / kBiasIn16 / kBiasF32
    i32 pad;
  };
  static constexpr bool kTileBarrier = false;
  static constexpr int kBoxBytes = 64 * 128;  // 64 rows x 64 16-bit columns

  template <class Cfg>
  static constexpr int bufs() {
    if (Cfg::kOut == kTypeF32 || Cfg::kWN % 64 != 0) return 0;
    constexpr int kFree = kScratchFree<Cfg>;
    constexpr int kRoom = kFree / (kBoxBytes * Cfg::kConsumers);  // boxes per warpgroup that fit
    constexpr int kFit = kRoom < Cfg::kWN / 64 ? kRoom : Cfg::kWN / 64;  // more than a fragment's boxes is no use
    return kFit < kTmaStoreBufsMax ? kFit : kTmaStoreBufsMax;
  }

  template <class Cfg>
  static constexpr int scratch_bytes() { return bufs<Cfg>() * kBoxBytes * Cfg::kConsumers; }

  template <class Cfg>
  static RAWFLUX_DEVICE void store(const Params& ep, const GemmParams& p, float (&acc)[Cfg::kAccRegs], const TileCoord& tc) {
    add_bias<Cfg>(ep, p, acc, tc);
    if constexpr (bufs<Cfg>() == 0) {
      epi::store_fragment<Cfg::kOut>(reinterpret_cast<void*>(ep.c), ep.ldc, acc, tc.row0, tc.col0, p.m, p.n, tc.tid);
    } else {
      static_for<0, Cfg::kWN / 64>([&](auto box) {
        u32 v[kBoxRegs];
        pack_box<Cfg, decltype(box)::value>(acc, v);
        store_box<Cfg, decltype(box)::value>(ep, p, v, tc.row0, tc.col0, tc.tid, tc.consumer, tc.scratch);
      });
    }
  }

  // A narrow column's tile (NarrowSched<kN>, scheduler.cuh): columns [0, kN) of the fragment, as
  // the boxes before the last and, for the last, the 64 columns that end at kN (staged from the
  // fragment's columns kN - 64 .. kN - 1 and stored there: they overlap the box before with the
  // same values, and nothing past kN, the next column's, is written).
  template <class Cfg, int kN>
  static RAWFLUX_DEVICE void store_narrow(const Params& ep, const GemmParams& p, float (&acc)[Cfg::kAccRegs], const TileCoord& tc) {
    constexpr int kFull = Cfg::kWN / 64 - 1;  // boxes stored as they are
    static_assert(bufs<Cfg>() > 0 && Cfg::kWN % 64 == 0 && kN % 8 == 0 && kN > 64 * kFull && kN < Cfg::kWN,
                  "a narrow tile drops part of the fragment's last box only");
    add_bias<Cfg>(ep, p, acc, tc);
    static_for<0, kFull>([&](auto box) {
      u32 v[kBoxRegs];
      pack_box<Cfg, decltype(box)::value>(acc, v);
      store_box<Cfg, decltype(box)::value>(ep, p, v, tc.row0, tc.col0, tc.tid, tc.consumer, tc.scratch);
    });
    u32 v[kBoxRegs];
    pack_cols<Cfg, kN - 64>(acc, v);
    // store_box puts box kFull at col0 + 64 kFull (and stages it in that box's buffer, keeping the rotation)
    store_box<Cfg, kFull>(ep, p, v, tc.row0, tc.col0 + (kN - 64) - 64 * kFull, tc.tid, tc.consumer, tc.scratch);
  }

  template <class Cfg>
  static RAWFLUX_DEVICE void tile_done(const Params&, const GemmParams&, const TileCoord&) {}

  template <class Cfg>
  static RAWFLUX_DEVICE void add_bias(const Params& ep, const GemmParams& p, float (&acc)[Cfg::kAccRegs], const TileCoord& tc) {
    if (ep.bias_kind != epi::kBiasNone) {
      epi::add_bias<Cfg::kInF16>(acc, reinterpret_cast<const void*>(ep.bias), ep.bias_kind, tc.col0, p.n, tc.tid);
    }
  }

  // ---- Boxes. store() packs and stores the fragment's 64-column boxes in order (pack_box,
  // store_box). With kEpiDefer the gemm kernel does the same for all but the last defer_boxes(),
  // which it packs into registers and stores while the next tile's first k blocks run.
  static constexpr int kBoxRegs = 16;  // a 64 x 64 box of 16-bit C over 128 threads: 16 packed pairs each

  // Boxes of a fragment the kernel defers (0: none, and the kernel calls store()). Staged boxes
  // only; 128 accumulators leave room for one, and only in the 2-CTA cluster (the measured one)
  // of the default build: ptxas spills with it in 128x256 without a cluster (20 bytes), with the
  // development builds' extra registers (RAWFLUX_TRACE, RAWFLUX_DYN_SCHED: 8) and in session 15's
  // 2x2 probe (8).
  template <class Cfg>
  static constexpr int defer_boxes() {
    if constexpr (!kEpiDefer || !kWait0 || bufs<Cfg>() == 0 || Cfg::kAccRegs > 128 || Cfg::kClusterK > 1 ||
                  (Cfg::kAccRegs == 128 && (Cfg::kClusterSize != 2 || kTrace || kDynSched))) {
      return 0;
    } else {
      return 1;
    }
  }

  // Box kBox (columns 64 kBox .. 64 kBox + 63 of the fragment) of acc, packed to 16-bit pairs in
  // stmatrix order: register 4 q + j is the pair of n8 block 8 kBox + 2 q + j / 2, rows j % 2.
  template <class Cfg, int kBox>
  static RAWFLUX_DEVICE void pack_box(const float (&acc)[Cfg::kAccRegs], u32 (&v)[kBoxRegs]) {
    pack_cols<Cfg, 64 * kBox>(acc, v);
  }

  // The 64 columns of acc from column kCol (a multiple of 8: n8 block kCol / 8 on), packed as pack_box.
  template <class Cfg, int kCol>
  static RAWFLUX_DEVICE void pack_cols(const float (&acc)[Cfg::kAccRegs], u32 (&v)[kBoxRegs]) {
    static_assert(kCol % 8 == 0 && kCol + 64 <= Cfg::kWN, "whole n8 blocks of the fragment");
#pragma unroll
    for (int i = 0; i < kBoxRegs; ++i) v[i] = ptx::pack2<Cfg::kOut == kTypeF16>(acc[kCol / 2 + 2 * i], acc[kCol / 2 + 2 * i + 1]);
  }

  // Stages packed box kBox of the fragment at (row0, col0) in buffer kBox % kBufs (stmatrix, the
  // 128-byte swizzle of the tensor map) and issues its TMA store (clipped at C's bounds). Every
  // thread of the warpgroup calls it (named barriers), boxes in order: a buffer is reused kBufs
  // boxes later, maybe in the next tile, once the store that read it is done.
  template <class Cfg, int kBox>
  static RAWFLUX_DEVICE void store_box(const Params& ep, const GemmParams& p, const u32 (&v)[kBoxRegs], i32 row0, i32 col0, u32 tid,
                                       u32 consumer, u32 scratch) {
    constexpr int kBufs = bufs<Cfg>();
    static_assert(kBufs > 0 && (Cfg::kWN / 64) % kBufs == 0,
                  "box b stages in buffer b % kBufs: whole rounds per fragment, so the next tile continues the rotation");
    const u32 bar = kWarpgroupBarrierBase + consumer;
    const u32 warp = tid / 32, lane = tid % 32;
    // This lane's stmatrix row: matrix lane / 8 of each x4 (upper / lower 8 rows of the warp's 16,
    // then the next n8 block), row lane % 8 of it.
    const u32 half = (lane / 8) % 2, next_block = lane / 16;
    const u32 row = 16 * warp + 8 * half + lane % 8;  // in the warpgroup's 64-row fragment
    const u32 box_addr = scratch + consumer * kBufs * kBoxBytes + (u32)((kBox % kBufs) * kBoxBytes);
    // Probes 4 / 8 (config.cuh): decided at run time, so the compiler keeps what they skip.
    const bool skip_stsm = (kProbe & 4) != 0 && p.k_blocks > 0;
    const bool skip_tma = (kProbe & 8) != 0 && p.k_blocks > 0;
    // Probes 16 / 32 at compile time: the stores that follow keep the fragment live.
    constexpr bool skip_fence = (kProbe & 16) != 0;
    constexpr bool skip_bar = (kProbe & 32) != 0;
    // The store that last read this buffer is done reading it: thread 0 issued it, the barrier
    // tells the others.
    if (tid == 0) ptx::bulk_wait_read<kBufs - 1>();
    if (!skip_bar) ptx::named_barrier_sync(bar, 128);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (skip_stsm) break;
      const u32 unit = (u32)(2 * q) + next_block;  // 16-byte unit in the box's 128-byte row
      ptx::stmatrix_x4(box_addr + row * 128 + ((unit ^ (row & 7u)) << 4), v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    }
    if (!skip_fence) ptx::fence_proxy_async_smem();  // this thread's stmatrix writes before the TMA store reads them
    if (!skip_bar) ptx::named_barrier_sync(bar, 128);
    if (tid == 0 && !skip_tma) {
      ptx::tma_store_2d(&ep.tmap_c, box_addr, col0 + 64 * kBox, row0);
      ptx::bulk_commit();
    }
  }

  template <class Cfg>
  static RAWFLUX_DEVICE void finish(const Params&, u32 tid) {
    if constexpr (bufs<Cfg>() > 0) {
      if (tid == 0) ptx::bulk_wait_all();  // C's boxes written before the CTA ends
    }
  }
};

// Boxes the gemm kernel defers for an epilogue policy (kEpiDefer): TmaStore's, none for the others.
template <class E, class Cfg>
struct DeferTraits {
  static constexpr int kBoxes = 0;
};
template <class Cfg>
struct DeferTraits<TmaStore, Cfg> {
  static constexpr int kBoxes = TmaStore::defer_boxes<Cfg>();
};

}  // namespace rawflux
