// The GEMM engine's configuration: the compile-time tile (GemmCfg, the template the host and the
// tuner choose) and the run-time parameters of one launch (GemmParams).
//
// C (m x n) = A (m x k, row-major) * B^T, B stored (n, k) row-major ("nk": K-major for wgmma) or
// (k, n) row-major ("kn": MN-major, the wgmma transpose bit). 16-bit inputs, fp32 accumulation.
#pragma once
#include "rawflux/ptx/types.cuh"

namespace rawflux {

// Element-type tags (template arguments; rawflux/engine/abi.py spells the same numbers).
enum : int { kTypeBF16 = 0, kTypeF16 = 1, kTypeF32 = 2 };
// B layouts.
enum : int { kLayoutNK = 0, kLayoutKN = 1 };

// Run-time parameters shared by every policy. Host packing: rawflux/engine/abi.py (GEMM_PARAMS);
// keep the two in the same order.
struct GemmParams {
  i32 m, n, k;
  i32 tiles_m, tiles_n;  // ceil(m / BM), and the tile columns (ceil(n / BN), more with narrow columns)
  i32 k_blocks;          // ceil(k / BK)
  i32 splits;            // split-K factor (1 = none); every split owns >= 1 k block. Stream-K: the most
                         // pieces any tile is cut into (the workspace's slot depth)
  i32 kb_per_split;      // k blocks per split (the last one may own fewer)
  i32 group;             // raster group width, in cluster tiles (>= 1)
  i32 raster_n;          // 0: groups of `group` tile-rows walked down n; 1: groups of tile-columns walked down m
  i32 seg_count;         // row-block rotation: m is cut in seg_count equal segments ...
  i32 seg_start;         // ... and tile rows are visited from segment seg_start on, wrapping around
  i32 sk_tiles;          // StreamKSched: the last sk_tiles cluster tiles of the raster order are cut in k
                         // (how: tail_splits); 0 = none
  i32 a_box_rows;        // rows of A's TMA box: kBoxARows, or fewer when m is smaller (the host rounds m up
                         // to 8): rows past it are not loaded, where a full box would zero-fill them (slow).
                         // 0 = kBoxARows. The stage's rows past it hold stale data; their results are never stored.
  i32 a_tail_rows;       // rows of the tail map's box (tmap_a_tail), loaded instead of the full box by a ragged
                         // last tile row when m spans more than one box (its rows rounded up to 8), and
                         // zero-filled by a cluster's idle CTA (a tile wholly past m; 8 rows when no row is ragged).
                         // 0 = no tail map (tmap_a_tail is tmap_a); always 0 with A multicast (kClusterN > 1).
  i32 tail_splits;       // StreamKSched with sk_tiles > 0: 0 = stream-K's equal runs; s > 0 = the split tail
                         // (each tile cut into s pieces at the same k offsets); -b < 0 = banded stream-K
                         // (bands of b clusters); scheduler/stream_k.cuh
  i32 narrow_from;       // NarrowSched<N>: tile columns from this one on are N wide, those before it BN. 0 otherwise.
  i32 own_delay;         // RsSched (fused/rs_sched.cuh): positions an owner's own tiles move later. 0 otherwise.
  u64 workspace;         // split modes: fp32 partial tiles (gemm/fixup.cuh)
  u64 counters;          // split modes: two u32 arrival counts per (slot, consumer warpgroup), zero between calls
  i64 timeout_ns;        // bound on every pipeline wait (a stall traps instead of hanging)
};

// Fewest equal n chunks of a warpgroup's kWN columns with each chunk at most 256 wide (one wgmma)
// and a multiple of `unit` (16 for K-major B, 64 for the kn layout's column chunks).
constexpr int wgmma_chunks(int wn, int unit) {
  const int cap = 256;
  for (int c = 1; c <= wn / unit; ++c) {
    if (wn % c == 0 && (wn / c) % unit == 0 && wn / c <= (cap < unit ? unit : cap)) return c;
  }
  return 1;
}

// The compile-time configuration of one engine variant. The tile and cluster shape, then three
// pipeline choices the host makes per variant (rawflux/engine/abi.py, kernel_options):
//   kRefill      the consumers refill the stage ring: the producer loads only a work unit's first
//                kStages k blocks, and the last consumer warp done with a stage loads the block
//                kStages on into it (no producer waits on the releases; gemm/mainloop.cuh);
//   kDeferBoxes  C boxes of a tile's fragment held in registers and stored during the next tile's
//                first k block, while the tensor pipe runs (TmaStore only; gemm/epilogue/tile.cuh);
//   kStoreBufs   TmaStore's shared-memory staging buffers per consumer warpgroup (0: C is stored
//                from registers).
template <int BM_, int BN_, int BK_, int kStages_, int kClusterM_, int kClusterN_, int kConsumers_, int kIn_, int kOut_,
          int kBLayout_, int kClusterK_, bool kRefill_, int kDeferBoxes_, int kStoreBufs_>
struct GemmCfg {
  static constexpr int kBM = BM_;
  static constexpr int kBN = BN_;
  static constexpr int kBK = BK_;
  static constexpr int kStages = kStages_;
  static constexpr int kClusterM = kClusterM_;  // CTAs of a cluster along m: they share (multicast) the B tile
  static constexpr int kClusterN = kClusterN_;  // CTAs of a cluster along n: they share the A tile
  // kClusterK_ = 2 (k-split cluster): the two CTAs of a cluster compute the same tile, each one
  // half of k (split at ceil(k blocks / 2), as split-K k2); each then hands one warpgroup's fp32
  // fragment to the other through distributed shared memory and stores the other warpgroup's rows
  // (ksplit_exchange in gemm/fixup.cuh). They share no operand, so nothing is multicast.
  static constexpr int kClusterK = kClusterK_;
  static constexpr int kClusterSize = kClusterM_ * kClusterN_ * kClusterK_;
  static constexpr int kMcastSize = kClusterM_ * kClusterN_;  // CTAs that fill (and release) each other's stages
  static constexpr int kConsumers = kConsumers_;  // consumer warpgroups (1 or 2)
  static constexpr int kIn = kIn_;
  static constexpr int kOut = kOut_;
  static constexpr int kBLayout = kBLayout_;
  static constexpr bool kInF16 = kIn_ == kTypeF16;
  static constexpr bool kRefill = kRefill_;
  static constexpr int kDeferBoxes = kDeferBoxes_;
  static constexpr int kStoreBufs = kStoreBufs_;

  // Consumer warpgroups tile the CTA tile as kWgM x kWgN blocks of 64 x kWN.
  static constexpr int kWgM = BM_ / 64;
  static constexpr int kWgN = kConsumers_ / kWgM;
  static constexpr int kWN = BN_ / kWgN;
  static constexpr int kAccRegs = kWN / 2;  // fp32 accumulators per consumer thread
  // A warpgroup's fragment is issued as kWgmmaChunks wgmma per k16 step, side by side along n,
  // each on its slice of acc: one wgmma covers at most N = 256 (BN 320 = 2 x 160).
  static constexpr int kWgmmaChunks = wgmma_chunks(kWN, kBLayout_ == kLayoutKN ? 64 : 16);
  static constexpr int kWgmmaN = kWN / kWgmmaChunks;

  static constexpr int kThreads = 128 * (1 + kConsumers_);
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = kConsumers_ == 2 ? 232 : 240;
  // With a prologue that waits between k blocks (Prologue::kSlabWait: AG-GEMM's k-slabs) the
  // producer holds its k loop's state across the waits: 16 registers more for it, taken from two
  // consumer warpgroups (8 each), which still fit.
  static constexpr int kProducerRegsSlab = 56;
  static constexpr int kConsumerRegsSlab = kConsumers_ == 2 ? 224 : 240;

  static constexpr int kElem = 2;                         // input bytes per element
  static constexpr int kRowBytes = kBK * kElem;           // one 128-byte swizzle row
  static constexpr int kStageABytes = BM_ * kRowBytes;    // A tile: BM rows (m) of BK
  static constexpr int kStageBBytes = BN_ * kRowBytes;    // B tile: BN rows (n) of BK, or BK rows (k) of BN
  static constexpr int kStageBytes = kStageABytes + kStageBBytes;
  // full[] and empty[], the k-split pair's two barriers (their place kept for every tile), then the
  // consumer refill's release counts (u32 per stage).
  static constexpr int kBarrierBytes = 2 * kStages_ * 8 + 16 + 4 * kStages_;
  // +1024: the dynamic shared window is only 16-byte aligned; tiles need 1024 (swizzle atom).
  static constexpr int kSmemBytes = 1024 + kStages_ * kStageBytes + kBarrierBytes;

  // TMA boxes. Along a cluster dimension each CTA loads a slice of the shared operand and
  // multicasts it, so a box covers 1/cluster of the tile.
  static constexpr int kBoxARows = BM_ / kClusterN_;                           // A: {BK, rows}
  static constexpr int kBoxBRows = kBLayout_ == kLayoutNK ? BN_ / kClusterM_  // nk B: {BK, rows of n}
                                                          : kBK / kClusterM_;  // kn B: {64 of n, rows of k}
  static constexpr int kBChunks = kBLayout_ == kLayoutNK ? 1 : BN_ / 64;       // kn: one box per 64 columns
  static constexpr int kChunkBytes = kBK * 128;                               // kn: 64 n x BK k

  static_assert(kBK * kElem == 128, "BK is one 128-byte swizzle row of 16-bit elements (64)");
  static_assert(BM_ == 64 || BM_ == 128, "BM is 64 or 128 (one m64 wgmma row block per consumer warpgroup)");
  static_assert(kConsumers_ == 1 || kConsumers_ == 2, "1 or 2 consumer warpgroups");
  static_assert(kWgM >= 1 && kWgM <= kConsumers_ && kWgN * kWgM == kConsumers_, "consumer warpgroup grid");
  static_assert(kWN % 16 == 0 && kWN >= 16 && kWN <= 512, "N per warpgroup: multiple of 16 in 16..512");
  static_assert(kWgmmaN % 16 == 0 && kWgmmaN <= 256, "wgmma N per instruction: multiple of 16 up to 256");
  static_assert(kWgmmaChunks * kWgmmaN == kWN, "n chunks tile the warpgroup's columns");
  static_assert(kWgmmaChunks == 1 || ((kWgmmaN * 128) % 1024 == 0), "a second wgmma chunk starts on a swizzle atom");
  static_assert(kBLayout_ == kLayoutNK || (BN_ % 64 == 0 && kWN % 64 == 0 && kWgmmaN % 64 == 0),
                "kn layout: BN and per-warpgroup N multiples of 64, chunks whole 64-column boxes");
  static_assert(kClusterM_ == 1 || kClusterN_ == 1, "cluster along m or along n, not both");
  static_assert(kClusterSize == 1 || kClusterSize == 2, "cluster size 1 or 2");
  static_assert(kClusterK_ == 1 || (kClusterK_ == 2 && kClusterM_ == 1 && kClusterN_ == 1), "a k-split cluster is 2 CTAs along k only");
  static_assert(kClusterK_ == 1 || kConsumers_ * kAccRegs * 128 * 4 <= kStages_ * kStageBytes,
                "a k-split cluster passes the fragments through the stage ring: they must fit in it");
  static_assert(kBoxARows <= 256 && kBoxBRows <= 256, "a TMA box spans at most 256 rows");
  static_assert(kBoxARows % 8 == 0 && (kBLayout_ == kLayoutKN || kBoxBRows % 8 == 0),
                "multicast slices start on a 1024-byte swizzle atom");
  static_assert(kBLayout_ == kLayoutNK || kBoxBRows % 8 == 0, "kn multicast slice: k rows multiple of 8");
  static_assert(kIn_ == kTypeBF16 || kIn_ == kTypeF16, "16-bit float inputs");
  static_assert(kOut_ == kTypeBF16 || kOut_ == kTypeF16 || kOut_ == kTypeF32, "output bf16, f16 or f32");
  static_assert(kSmemBytes <= 232448, "shared memory per CTA on sm_90 is 227 KB");
  static_assert(!kRefill_ || kMcastSize == 1 || (kClusterM_ == 2 && kClusterN_ == 1),
                "the consumer refill loads for one CTA or for the 2x1 pair that shares B");
  static_assert(kDeferBoxes_ == 0 || (kStoreBufs_ > 0 && kDeferBoxes_ <= kWN / 64 && kClusterK_ == 1),
                "deferred boxes are staged boxes of the fragment; a k-split cluster has no next tile");
  static_assert(kStoreBufs_ >= 0 && (kStoreBufs_ == 0 || (kOut_ != kTypeF32 && kWN % 64 == 0 && (kWN / 64) % kStoreBufs_ == 0)),
                "staging buffers: 16-bit C in whole 64-column boxes, whole rounds of buffers per fragment");
};

// Named barrier ids: 0 is __syncthreads'; 1 spans the consumer warpgroups (an epilogue's
// tile_done hook); 2 + c is consumer warpgroup c alone (split-K fix-up, TmaStore's staging).
enum : u32 { kConsumerBarrier = 1, kWarpgroupBarrierBase = 2 };

// An epilogue's shared scratch starts at this offset from the 1024-aligned shared base (past the
// stage ring and its barriers), and the kernel's dynamic shared memory is then
// kScratchOffset + scratch + 1024 (alignment slack). rawflux/engine mirrors both.
template <class Cfg>
constexpr int kScratchOffset = Cfg::kStages * Cfg::kStageBytes + 1024;
template <class Cfg>
constexpr int kScratchFree = 232448 - 1024 - kScratchOffset<Cfg>;

}  // namespace rawflux
