// Compile-time tile configuration and run-time parameters of the sm_90a GEMM engine.
//
// C (m x n) = A (m x k, row-major) * B^T, B stored (n, k) row-major ("nk": K-major for wgmma) or
// (k, n) row-major ("kn": MN-major, the wgmma transpose bit). 16-bit inputs, fp32 accumulation.
#pragma once
#include "rawflux/ptx/types.cuh"

namespace rawflux {

// Element-type tags (template arguments; rawflux/ops/gemm.py spells the same numbers).
enum : int { kTypeBF16 = 0, kTypeF16 = 1, kTypeF32 = 2 };
// B layouts.
enum : int { kLayoutNK = 0, kLayoutKN = 1 };

// Run-time parameters shared by every policy. Host packing: rawflux/ops/gemm.py (_PARAMS_FMT);
// keep the two in the same order.
struct GemmParams {
  i32 m, n, k;
  i32 tiles_m, tiles_n;  // ceil(m / BM), ceil(n / BN)
  i32 k_blocks;          // ceil(k / BK)
  i32 splits;            // split-K factor (1 = none); every split owns >= 1 k block
  i32 kb_per_split;      // k blocks per split (the last one may own fewer)
  i32 group;             // raster group width, in cluster tiles (>= 1)
  i32 raster_n;          // 0: groups of `group` tile-rows walked down n; 1: groups of tile-columns walked down m
  i32 seg_count;         // row-block rotation: m is cut in seg_count equal segments ...
  i32 seg_start;         // ... and tile rows are visited from segment seg_start on, wrapping around
  i32 sk_tiles;          // stream-K (StreamKSched only): the last sk_tiles cluster tiles of the raster order
                         // are cut into equal runs of k blocks, one run per cluster of the grid; 0 = none.
                         // splits is then the most runs any tile is cut into (the workspace's slot depth).
  i32 a_box_rows;        // rows of A's TMA box: kBoxARows, or fewer when m is smaller (the host rounds m up
                         // to 8): rows past it are not loaded, where a full box would zero-fill them (slow).
                         // 0 = kBoxARows. The stage's rows past it hold stale data; their results are never stored.
  i32 a_tail_rows;       // rows of the tail map's box (the kernel's tmap_a_tail), loaded instead of the full box by
                         // a ragged last tile row when m spans more than one box (its rows rounded up to 8), and
                         // zero-filled by a cluster's idle CTA (a tile wholly past m; 8 rows when no row is ragged).
                         // 0 = no tail map (tmap_a_tail is tmap_a); always 0 with A multicast (kClusterN > 1).
  i32 tail_splits;       // split tail (StreamKSched only, with sk_tiles > 0): the last sk_tiles cluster tiles are cut
                         // into tail_splits pieces of ceil(k_blocks / tail_splits) k blocks each, at the same k
                         // offsets in every tile, instead of stream-K's equal runs; 0 = stream-K runs.
  i32 narrow_from;       // narrow columns (NarrowSched<N> only): tile columns from this one on are N wide, those
                         // before it BN; tiles_n counts both (scheduler.cuh). 0 with every other scheduler.
  i32 pad;
  u64 workspace;         // split-K / stream-K: fp32 partial tiles (see splitk_fixup in mainloop_sm90.cuh)
  u64 counters;          // split-K / stream-K: one u32 arrival counter per (slot, consumer warpgroup), zero between calls
  i64 timeout_ns;        // bound on every pipeline wait (a stall traps instead of hanging)
};

#ifndef RAWFLUX_WGMMA_N_MAX
#define RAWFLUX_WGMMA_N_MAX 256
#endif
#ifndef RAWFLUX_ORDERED_ISSUE
#define RAWFLUX_ORDERED_ISSUE 1
#endif
// 1: with RAWFLUX_WAIT0=0 only, the two consumer warpgroups take turns issuing their per-stage
// wgmma groups (named barriers; see the main loop). Measured 2026-11-29 (session 4): +8 points of
// cuBLAS in the bare wgmma loop, +2 in full; RAWFLUX_WAIT0 (session 8) does better without barriers.
constexpr bool kOrderedIssue = RAWFLUX_ORDERED_ISSUE != 0;
#ifndef RAWFLUX_WAIT0
#define RAWFLUX_WAIT0 1
#endif
// 1 (default since session 8): each consumer warpgroup waits for its own stage's wgmma group right
// after issuing it (wgmma.wait_group 0) and releases that stage at once, with no turn barriers.
// The warpgroups stagger themselves: a group queues behind the other warpgroup's, and each
// warpgroup reissues while the other's group runs. 0: one group in flight per warpgroup and
// ordered issue (RAWFLUX_ORDERED_ISSUE). Measured 2026-11-29 (benchmarks/results/
// gemm-variants-2026-11-29-s8): 0.911 -> 0.949 of cuBLAS (median, 9 points m >= 1024), bare loop
// 0.958 -> 0.985.
constexpr bool kWait0 = RAWFLUX_WAIT0 != 0;
#ifndef RAWFLUX_TMA_STORE_BUFS
#define RAWFLUX_TMA_STORE_BUFS 2
#endif
// Most staging buffers per consumer warpgroup for the TmaStore epilogue (policies.cuh); 0 stores
// C from registers as LocalStore does (A/B). The host mirrors it (ops.gemm.epilogue_scratch_bytes
// reads the define from RAWFLUX_NVRTC_DEFINES).
constexpr int kTmaStoreBufsMax = RAWFLUX_TMA_STORE_BUFS;
#ifndef RAWFLUX_DESC_STEP
#define RAWFLUX_DESC_STEP 1
#endif
// 1 (default since session 8): a k16 step's wgmma descriptors are the stage's step-0 descriptors
// plus the step's offset in the address field (32 bytes = 2 for a K-major operand), so each
// descriptor is built once per stage instead of once per step (docs/gemm-notes.md, session 7).
// The same descriptors either way: shared addresses stay below 2^18 bytes, so the 14-bit field
// never carries (tests/cpu check every address). Measured with RAWFLUX_WAIT0: 0.949 -> 0.956.
constexpr bool kDescStep = RAWFLUX_DESC_STEP != 0;
#ifndef RAWFLUX_LOOP_ADDR
#define RAWFLUX_LOOP_ADDR 39
#endif
// The consumers' k-loop turnaround (wgmma wait -> release -> full-barrier poll -> descriptors ->
// next wgmma), a bit mask; 39 (= 32 + 4 + 2 + 1) by default since session 12, 0 is the loop before
// it (docs/gemm-notes.md, sessions 11-12). Measured on the H200 in one process per mode, against
// cuBLAS in the same run (benchmarks/results/gemm-variants-2026-11-29-s12, r1): median ratio at
// m >= 1024 0.959 -> 0.980 (19 of 20 points up), at m <= 512 0.959 -> 0.982; modes 5 and 7 alone
// (no unrolling) gain nothing. Output bits are the same in every mode.
//   1: the full / empty barriers' addresses as 32-bit shared offsets from one base computed once,
//      instead of a 64-bit generic &full[stage] converted on every k block;
//   2: the consumer warpgroup index broadcast from lane 0 (__shfl_sync), so ptxas knows it is
//      warp-uniform and keeps the addresses derived from it in uniform registers;
//   4: each stage's wgmma descriptors as the ring's stage-0 descriptors plus the stage's offset
//      in 16-byte units (desc_add), instead of rebuilt from the stage's address;
//   8: the release's empty-barrier address as in 1;
//  32 (with RAWFLUX_WAIT0): the k loop unrolled over whole rounds of the ring, the stage a
//      constant in each copy, so that its barrier address and descriptors are immediates on
//      uniform registers (no R2UR); k blocks before stage 0 comes round and after the last whole
//      round take the generic loop.
constexpr int kLoopAddr = RAWFLUX_LOOP_ADDR;
#ifndef RAWFLUX_PROBE
#define RAWFLUX_PROBE 0
#endif
// Development probes (results are garbage; for timing attribution only), a bit mask:
//   1: the epilogue's stores are skipped at run time (still compiled, so no wgmma is dead code);
//   2: the producer issues no loads and marks each stage full at once (the consumers' wgmma
//      rate on stale shared memory, without the operand feed);
//   4: TmaStore skips its stmatrix writes into the staging boxes (the TMA stores still run);
//   8: TmaStore skips its TMA stores (the staging writes still run);
//  16: TmaStore skips the proxy fence between its staging writes and the TMA store (compile time);
//  32: TmaStore skips the warpgroup barriers around a box's staging (compile time).
// Session 18 (docs/gemm-notes.md) timed each part of the epilogue with them in the trace build.
// The stage ring (with 2, the static tile order, kWait0; compile time; session 19 split the ring's
// cost per k block with them):
//  64: no ring at all: the producer idles, the consumers neither wait for stages nor release them;
// 128: the producer never waits for released stages (with 2: it marks every phase full at once);
//      only with 256, else a consumer could wait for a phase parity that already went past;
// 256: the consumers do not wait for full stages (they still release them);
// 512: the producer does not mark stages full (with 2 and 256: it only waits for the releases).
// 1024 / 2048 (with 512, 256 and 2): the producer does not wait for releases either; per k block it
//      sleeps 1 us (1024) or spins 1000 cycles (2048), touching no barrier (an active producer).
// 4096 / 8192 (likewise): per k block the producer polls a barrier 8 times, 100 ns apart, whatever
//      it finds: the stage's full barrier, which nothing arrives on then (4096), or its empty
//      barrier, which the consumers arrive on (8192).
// 16384 / 32768 (with 64): no ring, but per k block the producer polls a barrier nothing arrives on
//      for 1000 cycles, 100 ns apart (16384) or back to back (32768).
// 65536 / 131072: the stream-K fix-up's partial stores (65536) or, in banded stream-K, the summing
//      piece's reads (131072) are skipped (the counts and waits still run).
constexpr int kProbe = RAWFLUX_PROBE;
static_assert((kProbe & 128) == 0 || (kProbe & 256) != 0, "RAWFLUX_PROBE 128 needs 256");
static_assert((kProbe & (1024 | 2048 | 4096 | 8192)) == 0 || (kProbe & (512 | 256 | 2)) == (512 | 256 | 2), "RAWFLUX_PROBE 1024 / 2048 / 4096 / 8192 need 512, 256 and 2");
#ifndef RAWFLUX_CODE_PAD
#define RAWFLUX_CODE_PAD 0
#endif
// Development probe (session 20): about this many bytes of never-executed SASS (16-byte stores
// behind a run-time test that is always false) at the head of the producer's branch, which ptxas
// lays out after the consumers' code: it moves the producer's loop this far from the consumers' k
// loop without changing either (instruction-cache placement: 8-32 KB changed nothing). 0
// (default): nothing.
constexpr int kCodePad = RAWFLUX_CODE_PAD;

#ifndef RAWFLUX_EPI_DEFER
#define RAWFLUX_EPI_DEFER 1
#endif
// 1 (default since session 15; docs/gemm-notes.md): a deferred C box. In the plain GEMM's and
// AG-GEMM's 16-bit epilogue (TmaStore), a consumer warpgroup stores all but the last 64-column box
// of its fragment at the tile's end, packs the last one into 16 registers and goes on to the next
// tile; the box is staged and stored between the wgmma issue and wait of that tile's first k block,
// while the tensor pipe runs, where it waited with the pipe idle for the store that last read its
// staging buffer. Only where TmaStore::defer_boxes says ptxas has room beside the accumulators
// (128x256 with a cluster, 128x192, 64x256, 64x128). Measured on the H200 (three A/B runs, m
// 1024-8192 on the five bar shapes; benchmarks/results/gemm-variants-2026-11-30-s15): median ratio
// to cuBLAS +0.3 to +0.5 points, output bits unchanged; two deferred boxes spill, and boxes stored
// from registers instead of staged gained nothing. 0: every box at the tile's end.
constexpr bool kEpiDefer = RAWFLUX_EPI_DEFER != 0;

#ifndef RAWFLUX_REFILL
#define RAWFLUX_REFILL 1
#endif
// 1 (default since session 23; docs/gemm-notes.md): the consumers refill the stage ring. The
// producer loads only a work unit's first kStages k blocks; from then on the last consumer warp to
// finish with a stage (a count per stage in shared memory, one atomic add per warp) loads the k
// block kStages ahead into it, right after it issues its next wgmma group. Where no producer
// watches the releases the k loop of 128x256 runs at 1025.5 cycles per k block against 1038.9
// (benchmarks/gemm_kloop.py, session 22): a producer that waits on the releases slows every
// consumer warpgroup's wgmma group by ~7.5 cycles, whatever primitive it waits with. Session 23:
// 1024.6 (no cluster) and 1025.6 (2x1 pair) against 1039, output bits unchanged; median ratio to
// cuBLAS +0.6 points at m >= 1024. Taken by the wide tiles (128 x 224 and up), without multicast
// or in the 2x1 pair, where the prologue allows it (gemm_kernel's kRefill); 0: the producer loads
// every k block.
constexpr bool kRefillOn = RAWFLUX_REFILL != 0;

#ifndef RAWFLUX_DYN_SCHED
#define RAWFLUX_DYN_SCHED 0
#endif
// 1 (development; docs/gemm-notes.md, session 14): the plain GEMM's data-parallel tiles are
// handed out at run time. Each cluster takes its first tile by its id, then the next from a global
// ticket counter (GemmParams::counters[0]) as it finishes one, so a slow CTA takes fewer tiles
// instead of ending the launch late. The cluster leader's producer draws the ticket and hands it
// to the peer CTA's producer; each producer hands it to its consumers through a ticket ring in
// shared memory, read after the full barrier of the tile's first stage. The last cluster out
// resets the counters to zero.
constexpr bool kDynSched = RAWFLUX_DYN_SCHED != 0;

#ifndef RAWFLUX_TRACE
#define RAWFLUX_TRACE 0
#endif
// 1: per-CTA start-up / main-loop / exit timestamps in the module global rawflux_trace
// (gemm/trace.cuh, benchmarks/gemm_trace.py); development only.
constexpr bool kTrace = RAWFLUX_TRACE != 0;
#ifndef RAWFLUX_TRACE_BLOCK_WAITS
#define RAWFLUX_TRACE_BLOCK_WAITS 1
#endif
// With RAWFLUX_TRACE: 1 sums the producer's and the first consumer warpgroup's barrier waits per
// k block (a timer read per k block in the producer thread and in every consumer thread, and a
// global add); 0 leaves them out, so that the trace's per-tile loop cycles are the k loop's own.
// Session 19 measured the sums at about 50 cycles per k block of 128x256 (1039 -> 1086-1092), more
// than the gaps they were used to explain.
constexpr bool kTraceBlockWaits = kTrace && RAWFLUX_TRACE_BLOCK_WAITS != 0;
#ifndef RAWFLUX_TRACE_PHASE
#define RAWFLUX_TRACE_PHASE 0
#endif
// With RAWFLUX_TRACE: 1 stamps (%clock) three points of every k block in the first thread of each
// of the first two consumer warpgroups, in the first kPhaseCtas CTAs (gemm/trace.cuh,
// benchmarks/gemm_phase.py): full wait returned, group issued, group completed. Session 22 used it
// to tell a slower tensor pipe from an idle one. It costs: one stamp ~30 cycles per k block of
// 128x256, all three ~90 (compare variants under the same build only).
constexpr bool kTracePhase = kTrace && RAWFLUX_TRACE_PHASE != 0;

// Fewest equal n chunks of a warpgroup's kWN columns with each chunk at most RAWFLUX_WGMMA_N_MAX
// (and 256) wide and a multiple of `unit` (16 for K-major B, 64 for the kn layout's column chunks).
constexpr int wgmma_chunks(int wn, int unit) {
  const int cap = RAWFLUX_WGMMA_N_MAX < 256 ? RAWFLUX_WGMMA_N_MAX : 256;
  for (int c = 1; c <= wn / unit; ++c) {
    if (wn % c == 0 && (wn / c) % unit == 0 && wn / c <= (cap < unit ? unit : cap)) return c;
  }
  return 1;
}

template <int BM_, int BN_, int BK_, int kStages_, int kClusterM_, int kClusterN_, int kConsumers_, int kIn_, int kOut_,
          int kBLayout_, int kClusterK_ = 1>
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
  // (ksplit_exchange in mainloop_sm90.cuh). They share no operand, so nothing is multicast.
  static constexpr int kClusterK = kClusterK_;
  static constexpr int kClusterSize = kClusterM_ * kClusterN_ * kClusterK_;
  static constexpr int kMcastSize = kClusterM_ * kClusterN_;  // CTAs that fill (and release) each other's stages
  static constexpr int kConsumers = kConsumers_;  // consumer warpgroups (1 or 2)
  static constexpr int kIn = kIn_;
  static constexpr int kOut = kOut_;
  static constexpr int kBLayout = kBLayout_;
  static constexpr bool kInF16 = kIn_ == kTypeF16;

  // Consumer warpgroups tile the CTA tile as kWgM x kWgN blocks of 64 x kWN.
  static constexpr int kWgM = BM_ / 64;
  static constexpr int kWgN = kConsumers_ / kWgM;
  static constexpr int kWN = BN_ / kWgN;
  static constexpr int kAccRegs = kWN / 2;  // fp32 accumulators per consumer thread
  // A warpgroup's fragment is issued as kWgmmaChunks wgmma per k16 step, side by side along n,
  // each on its slice of acc: one wgmma covers at most N = 256 (BN 320 = 2 x 160), and
  // RAWFLUX_WGMMA_N_MAX can cap it lower (issue-order experiments, docs/gemm-notes.md).
  static constexpr int kWgmmaChunks = wgmma_chunks(kWN, kBLayout_ == kLayoutKN ? 64 : 16);
  static constexpr int kWgmmaN = kWN / kWgmmaChunks;

  static constexpr int kThreads = 128 * (1 + kConsumers_);
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = kConsumers_ == 2 ? 232 : 240;

  static constexpr int kElem = 2;                         // input bytes per element
  static constexpr int kRowBytes = kBK * kElem;           // one 128-byte swizzle row
  static constexpr int kStageABytes = BM_ * kRowBytes;    // A tile: BM rows (m) of BK
  static constexpr int kStageBBytes = BN_ * kRowBytes;    // B tile: BN rows (n) of BK, or BK rows (k) of BN
  static constexpr int kStageBytes = kStageABytes + kStageBBytes;
  // full[] and empty[], the k-split pair's two barriers (their place kept for every tile), then the
  // consumer refill's release counts (u32 per stage; gemm_kernel).
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
};

}  // namespace rawflux
