// TmaStore: 16-bit C through shared memory and TMA stores (the plain GEMM's and AllGather-GEMM's
// epilogue for 16-bit C). Each consumer warpgroup writes its 64 x kWN fragment in 64-column boxes
// (stmatrix into a 128-byte-swizzled staging buffer, then one bulk tensor store per box, clipped at
// C's bounds by the tensor map) and goes back to the main loop while the TMA engine drains the
// boxes. Cfg::kStoreBufs staging buffers per warpgroup; with none (a ring that fills shared
// memory), the fragment is stored from registers as LocalStore does.
#pragma once
#include "rawflux/gemm/epilogue/fragment.cuh"
#include "rawflux/ptx/mbarrier.cuh"
#include "rawflux/ptx/tma.cuh"

namespace rawflux {

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
  static constexpr bool kExtraBlocks = false;  // no blocks of its own through the ring
  static constexpr bool kDeferrable = true;  // the kernel may hold boxes for the next tile's first k block (Cfg::kDeferBoxes)
  static constexpr int kBoxBytes = 64 * 128;  // 64 rows x 64 16-bit columns

  // Staging buffers per consumer warpgroup: the config's (the host sizes them to the shared memory
  // the stage ring leaves, rawflux/engine/abi.py kernel_options).
  template <class Cfg>
  static constexpr int bufs() {
    static_assert(Cfg::kStoreBufs * kBoxBytes * Cfg::kConsumers <= kScratchFree<Cfg>, "TmaStore's staging buffers fit beside the ring");
    return Cfg::kStoreBufs;
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

  // A narrow column's tile (NarrowSched<kN>, gemm/scheduler/narrow.cuh): columns [0, kN) of the fragment, as
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
  // store_box). With Cfg::kDeferBoxes the kernel does the same for all but the last boxes, which
  // it packs into registers and stores while the next tile's first k block runs.
  static constexpr int kBoxRegs = 16;  // a 64 x 64 box of 16-bit C over 128 threads: 16 packed pairs each

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
    // The store that last read this buffer is done reading it: thread 0 issued it, the barrier
    // tells the others.
    if (tid == 0) ptx::bulk_wait_read<kBufs - 1>();
    ptx::named_barrier_sync(bar, 128);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const u32 unit = (u32)(2 * q) + next_block;  // 16-byte unit in the box's 128-byte row
      ptx::stmatrix_x4(box_addr + row * 128 + ((unit ^ (row & 7u)) << 4), v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    }
    ptx::fence_proxy_async_smem();  // this thread's stmatrix writes before the TMA store reads them
    ptx::named_barrier_sync(bar, 128);
    if (tid == 0) {
      ptx::tma_store_2d(&ep.tmap_c, box_addr, col0 + 64 * kBox, row0);
      ptx::bulk_commit();
    }
  }

  template <class Cfg>
  static RAWFLUX_DEVICE void init(const Params&, u32) {}

  template <class Cfg, class SchedT>
  static RAWFLUX_DEVICE void side(const Params&, const GemmParams&, u32) {}

  template <class Cfg>
  static RAWFLUX_DEVICE void finish(const Params&, u32 tid, u32, u32) {
    if constexpr (bufs<Cfg>() > 0) {
      if (tid == 0) ptx::bulk_wait_all();  // C's boxes written before the CTA ends
    }
  }
};

}  // namespace rawflux
