// The sm_90a GEMM engine: persistent, warp-specialized, TMA -> shared-memory ring -> wgmma.
//
//   gemm_kernel<Cfg, Sched, Prologue, Epilogue>
//     Cfg       GemmCfg (gemm/config.cuh): tile, cluster, pipeline choices
//     Sched     TileSched | StreamKSched | NarrowSched<w> (gemm/scheduler/) | RsSched (fused/rs_sched.cuh): the CTA's work units
//     Prologue  NoWait | AgWait (fused/ag_gemm.cuh): what the producer waits for before loading A
//     Epilogue  LocalStore | TmaStore (gemm/epilogue/) | RsEpilogue<p> (fused/rs_epilogue.cuh): where C goes
//
//   warpgroup 0, the producer (gemm/producer.cuh): one thread issues the TMA loads of each stage;
//     its warps 1..3 run the epilogue's side roles (GEMM-RS: the own tiles' flag waits, the flag
//     releases), if it has any.
//   warpgroups 1..kConsumers, the consumers (below; 232 registers requested, ptxas allocates within
//     the launch's 168 unless the accumulators alone need more): per work unit and k block a
//     warpgroup waits for the full stage, issues its 4 k16 steps of wgmma (one wgmma per step, two
//     side by side along n when its N exceeds 256), waits for that group and hands the stage back at
//     once, so the two warpgroups' groups alternate on the tensor pipe, each reissuing while the
//     other's runs. With the consumer refill (Cfg::kRefill) the hand-back is a count per stage and
//     the warp that completes it loads the block kStages on into the stage. After a unit's last k
//     block: the epilogue's extra blocks if it has any (Epilogue::kExtraBlocks: GEMM-RS adds an own tile's
//     partials, a stage each), the k-split exchange or split-K fix-up (gemm/fixup.cuh), then the epilogue policy, with
//     Cfg::kDeferBoxes boxes held for the next tile's first k block (TmaStore only).
//   The consumer role is written in the kernel body: as a function of its own, NVVM optimizes it
//   before inlining it, and the SASS of the split-K, k-split and deferred-box variants changes
//   (instruction order; docs/decisions.md).
//
// Shared memory (1024-aligned): A[kStages][BM x 64], B[kStages][BN x 64 | 64 x BN], then the
// full[kStages] and empty[kStages] mbarriers, the k-split pair's two, and the release counts
// (u32[kStages]), then (from the next 1024-byte boundary) the epilogue's scratch. Tiles use the
// 128-byte swizzle of the TMA maps.
//   A (K-major): row r of the tile at r * 128 B.   wgmma desc: SBO = 1024 (8 rows), +32 B per k16.
//   B nk (K-major): same, rows are n.
//   B kn (MN-major): per 64 columns of n a chunk of BK rows (k) x 128 B; chunks 64 * 128 B apart.
//     wgmma desc (transposed B): LBO = chunk stride, SBO = 1024 (8 k rows), +16 rows per k16.
//
// Launch: grid = persistent CTAs (a multiple of the cluster size, cluster dims set by the launch),
// block = Cfg::kThreads, dynamic shared memory = the host's launch_smem_bytes (rawflux/engine).
#pragma once
#include "rawflux/gemm/config.cuh"
#include "rawflux/gemm/fixup.cuh"
#include "rawflux/gemm/load.cuh"
#include "rawflux/gemm/policies.cuh"
#include "rawflux/gemm/producer.cuh"
#include "rawflux/gemm/scheduler/narrow.cuh"
#include "rawflux/gemm/scheduler/stream_k.cuh"
#include "rawflux/gemm/scheduler/tile.cuh"
#include "rawflux/ptx/mbarrier.cuh"
#include "rawflux/ptx/tma.cuh"
#include "rawflux/ptx/warpgroup.cuh"
#include "rawflux/ptx/wgmma.cuh"

namespace rawflux {

template <class Cfg, class Sched, class Prologue, class Epilogue>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    gemm_kernel(const __grid_constant__ TensorMap tmap_a, const __grid_constant__ TensorMap tmap_b, const GemmParams p,
                const __grid_constant__ typename Prologue::Params pro, const __grid_constant__ typename Epilogue::Params epi,
                const __grid_constant__ TensorMap tmap_a_tail) {
  using SchedT = typename Sched::template type<Cfg>;
  constexpr int kStages = Cfg::kStages;
  constexpr bool kCluster = Cfg::kClusterSize > 1;
  static_assert(!Cfg::kRefill || Prologue::kConsumerRefill, "the consumer refill needs a prologue whose wait orders every thread's loads");
  static_assert(Cfg::kDeferBoxes == 0 || Epilogue::kDeferrable, "deferred boxes need an epilogue with TmaStore's boxes");
  // The barriers sit where they sit without scratch, so the pointers the roles keep are the same
  // for any epilogue.
  extern __shared__ u8 smem_raw[];
  u8* smem = smem_raw + ((1024u - (ptx::smem_u32(smem_raw) & 1023u)) & 1023u);
  u8* smem_a = smem;
  u8* smem_b = smem + kStages * Cfg::kStageABytes;
  u64* full = reinterpret_cast<u64*>(smem + kStages * Cfg::kStageBytes);
  u64* empty = full + kStages;
  u64* ksplit_bar = empty + kStages;  // k-split cluster only: ring_free, xfer_full (ksplit_exchange)
  u32* released = reinterpret_cast<u32*>(ksplit_bar + 2);  // the refill's releases of stage s so far (kReleasers per use)

  // Special registers are read again inside each role, after setmaxnreg: a value live across the
  // register-count change would be spilled.
  const u32 wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    ptx::tma_prefetch_desc(&tmap_a);
    ptx::tma_prefetch_desc(&tmap_b);
    ptx::tma_prefetch_desc(&tmap_a_tail);  // tmap_a again when there is no tail box
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      ptx::mbar_init(&full[s], 1);                                        // the local producer's arrive (+ bytes)
      ptx::mbar_init(&empty[s], Cfg::kConsumers * 4 * Cfg::kMcastSize);  // every consumer warp of the CTAs sharing the stage
    }
    if constexpr (Cfg::kClusterK > 1) {
      ptx::mbar_init(&ksplit_bar[0], Cfg::kConsumers * 128);  // ring_free: the partner's consumer threads
      ptx::mbar_init(&ksplit_bar[1], 128);                    // xfer_full: the partner's sending warpgroup
    }
    if constexpr (Cfg::kRefill) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) released[s] = 0u;  // seen by every role after the barrier below
    }
    Epilogue::template init<Cfg>(epi, ptx::smem_u32(smem) + kScratchOffset<Cfg>);  // its shared state, before the barrier below
    ptx::fence_mbar_init();
  }
  if constexpr (kCluster) {
    ptx::cluster_sync();
  } else {
    __syncthreads();
  }

  if (wg == 0) {
    ptx::setmaxnreg_dec<Prologue::kSlabWait ? Cfg::kProducerRegsSlab : Cfg::kProducerRegs>();
    if (threadIdx.x == 0) {
      produce<Cfg, SchedT, Prologue, Epilogue>(smem_raw, tmap_a, tmap_b, tmap_a_tail, p, pro, epi);
    } else if (threadIdx.x >= 32) {
      Epilogue::template side<Cfg, SchedT>(epi, p, ptx::smem_u32(smem) + kScratchOffset<Cfg>);  // the epilogue's own roles, if any
    }
    __syncwarp();
  } else {
    // ---------------------------------------------------------------- consumers
    ptx::setmaxnreg_inc<Prologue::kSlabWait ? Cfg::kConsumerRegsSlab : Cfg::kConsumerRegs>();
    constexpr bool kRefill = Cfg::kRefill;
    constexpr bool kPairM = Cfg::kClusterM == 2 && Cfg::kClusterN == 1;
    constexpr u32 kReleasers = 4 * Cfg::kConsumers * Cfg::kMcastSize;
    const u32 tid = threadIdx.x % 128;
    // Broadcast from lane 0, so that ptxas sees a warp-uniform value and keeps the addresses derived
    // from it in uniform registers.
    const u32 consumer = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0) - 1;
    const u32 cta_rank = kCluster ? ptx::cluster_ctarank() : 0u;
    const i32 cluster_id = kCluster ? (i32)ptx::cluster_id_x() : (i32)blockIdx.x;
    const u32 wm = consumer / Cfg::kWgN, wn = consumer % Cfg::kWgN;
    const u32 lane = tid % 32;
    SchedT sched(p, cluster_id, (i32)cta_rank);
    WorkTile w;
    u32 stage = 0, phase = 0;
    u32 ksplit_tiles = 0;  // k-split cluster: tiles this CTA took (one at most)
    float acc[Cfg::kAccRegs];
#pragma unroll
    for (int i = 0; i < Cfg::kAccRegs; ++i) acc[i] = 0.f;

    const u32 a_off = wm * 64 * Cfg::kRowBytes;
    const u32 b_off = Cfg::kBLayout == kLayoutNK ? wn * Cfg::kWN * Cfg::kRowBytes : wn * (Cfg::kWN / 64) * Cfg::kChunkBytes;
    const u32 a_base0 = ptx::smem_u32(smem_a) + a_off;
    const u32 b_base0 = ptx::smem_u32(smem_b) + b_off;
    // full[0]'s 32-bit shared address, from the ring's (the barriers follow the stages; empty[s]
    // follows full[] at 8 * (kStages + s)): one base, not a 64-bit pointer converted per k block.
    const u32 bar_addr0 = a_base0 - a_off + kStages * Cfg::kStageBytes;

    // Hands a consumed stage back to the producer of every CTA that wrote into it.
    auto release = [&](u32 s) {
      if constexpr (Cfg::kMcastSize > 1) {
        if (lane < (u32)Cfg::kMcastSize) ptx::mbar_arrive_cluster(&empty[s], lane);
      } else {
        if (lane == 0) ptx::mbar_arrive(&empty[s]);
      }
    };

    // Stage 0's descriptors; a stage's are these plus its offset (desc_add: shared addresses stay
    // below 2^18, so the 14-bit address field never carries).
    const u64 da_ring = ptx::smem_desc(a_base0, 16, 1024);
    const u64 db_ring = ptx::smem_desc(b_base0, Cfg::kBLayout == kLayoutNK ? 16u : (u32)Cfg::kChunkBytes, 1024);

    // One wgmma: k16 step kk of n chunk c (columns [c * kWgmmaN, (c + 1) * kWgmmaN) of this
    // warpgroup's B slice, accumulator slice c) on the stage at offsets (a_base, b_base) from the
    // ring's start, in 16-byte units. The first k16 step of a tile overwrites the accumulators.
    // nt: the wgmma's N, Int<kWgmmaN>, or a narrow column's Int<kNarrowN> (the first kNarrowN / 2
    // accumulators; the rest are never stored).
    auto mma = [&](int c, int kk, u32 a_base, u32 b_base, bool first_block, auto nt) {
      constexpr int kN = decltype(nt)::value;
      float(&acc_c)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&acc[c * (Cfg::kWgmmaN / 2)]);
      u64 da, db;
      da = ptx::desc_add(da_ring, a_base + kk * 2);
      if constexpr (Cfg::kBLayout == kLayoutNK) {
        db = ptx::desc_add(db_ring, b_base + c * Cfg::kWgmmaN * Cfg::kRowBytes / 16 + kk * 2);
      } else {
        db = ptx::desc_add(db_ring, b_base + c * (Cfg::kWgmmaN / 64) * Cfg::kChunkBytes / 16 + kk * 128);
      }
      ptx::Wgmma<kN, Cfg::kInF16, Cfg::kBLayout == kLayoutKN ? 1 : 0>::mma(acc_c, da, db, (!first_block || kk > 0) ? 1u : 0u);
    };
    constexpr int kSteps = Cfg::kBK / 16;

    // Deferred C boxes (Cfg::kDeferBoxes): the last boxes of the previous tile's fragment, packed to
    // 16 bits, wait in `held` and are stored between the wgmma issue and wait of this tile's first k
    // block, while the tensor pipe runs, where they would wait with the pipe idle for the store that
    // last read their staging buffer.
    constexpr int kDeferBoxes = Cfg::kDeferBoxes;
    constexpr bool kDefer = kDeferBoxes > 0;
    constexpr int kNowBoxes = Cfg::kWN / 64 - kDeferBoxes;
    u32 held[kDefer ? kDeferBoxes : 1][TmaStore::kBoxRegs];
    bool pending = false;              // held carries boxes not yet stored
    i32 held_row0 = 0, held_col0 = 0;  // their fragment's origin in C
    auto store_held = [&] {
      if constexpr (kDefer) {
        static_for<0, kDeferBoxes>([&](auto j) {
          Epilogue::template store_box<Cfg, kNowBoxes + decltype(j)::value>(epi, p, held[decltype(j)::value], held_row0, held_col0, tid,
                                                                           consumer, ptx::smem_u32(smem_a) + kScratchOffset<Cfg>);
        });
      }
    };
    while (sched.next(p, w)) {
      const i32 nkb = w.kb_end - w.kb_begin;
      // A narrow column's tile (NarrowSched): its wgmma is m64n{kNarrowN}, its C the first kNarrowN columns.
      const bool narrow = SchedT::kNarrowN > 0 && w.tile_n >= p.narrow_from;
      static_assert(SchedT::kNarrowN == 0 || (!kDefer && Cfg::kClusterK == 1),
                    "narrow columns: each wgmma group waited for in its branch; no deferred box or k-split cluster");
      // kRefill, lane l < kMcastSize: CTA l's count of the previous block's stage before this
      // warp's add (0 at a unit's start: no refill owed). Read only after the next wgmma commit:
      // the add's round trip (to the peer CTA's count in a pair) overlaps the next block's wait and
      // issue instead of delaying them, and the refill's loads are issued off the turnaround
      // between the warpgroups' groups.
      u32 counted = 0;
      // The consumers' refill of CTA cta's stage rs with k block kb, as that CTA's producer would
      // load it (a 2x1 pair: cta's own tile row, its half of B).
      auto refill = [&](u32 rs, i32 rel, u32 cta) {
        const i32 kb = w.kb_begin + rel;
        const i32 n0 = SchedT::col0(p, w.tile_n);
        const i32 row = kPairM ? w.tile_m - (i32)cta_rank + (i32)cta : w.tile_m;  // CTA cta's tile row
        auto load = [&](auto mode) {
          constexpr int kAMode = decltype(mode)::value;
          if constexpr (kPairM) {
            load_kblock_for<Cfg, kAMode>(tmap_a, tmap_a_tail, tmap_b, smem_a, smem_b, full, rs, kb, (SchedT::kOwnerRows ? SchedT::a_row(p, row) : row * Cfg::kBM), n0, cta,
                                         stage_tx<Cfg, kAMode>(p));
          } else {  // no multicast: A's slice and B's are the whole tile
            load_kblock<Cfg, kAMode>(tmap_a, tmap_a_tail, tmap_b, smem_a, smem_b, full, rs, kb, (SchedT::kOwnerRows ? SchedT::a_row(p, row) : row * Cfg::kBM), n0, 0, 0,
                                     stage_tx<Cfg, kAMode>(p));
          }
        };
        if (a_tail_box<Cfg>(p, (SchedT::kOwnerRows ? SchedT::a_row(p, row) : row * Cfg::kBM))) {
          load(Int<kALoadTail>{});
        } else {
          load(Int<kALoadFull>{});
        }
      };
      // One k block on stage st (parity ph): wait for its data, issue its wgmma group, run `hook`
      // (the held C boxes) while the group runs, then wait for the group and release the stage.
      auto kblock = [&](u32 st, u32 ph, i32 i, auto&& hook) {
        ptx::mbar_wait_addr(bar_addr0 + 8u * st, ph, p.timeout_ns);
        const u32 a_base = st * (Cfg::kStageABytes / 16);
        const u32 b_base = st * (Cfg::kStageBBytes / 16);
        // The block's wgmma group with N = nt (Int<N>), from its fence to its wait. Narrow columns
        // branch between two N around all of it: where the branches meet no wgmma may be in flight
        // (ptxas serializes every wgmma of the kernel otherwise: C7515 with the wait after the
        // branches, C7519 with a branch or a predicate per wgmma).
        auto group = [&](auto nt) {
          ptx::wgmma_fence();  // orders the accumulators' earlier register accesses (epilogue, fix-up) before the wgmma below
#pragma unroll
          for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
            for (int c = 0; c < Cfg::kWgmmaChunks; ++c) mma(c, kk, a_base, b_base, i == 0, nt);
          }
          ptx::wgmma_commit();
          if constexpr (kRefill) {
            // this lane completed CTA l's count of the previous block's stage: load the block kStages on
            if (counted % kReleasers == kReleasers - 1 && i - 1 + kStages < nkb) {
              ptx::fence_acq_rel_cta();  // acquire: the other warps' adds (after their reads of the stage) before this lane's refill of it
              refill(st == 0 ? kStages - 1 : st - 1, i - 1 + kStages, lane);
            }
          }
          hook();
          ptx::wgmma_wait<0>();  // this stage's wgmma group has finished reading it
          if constexpr (kRefill) {
            if (lane < (u32)Cfg::kMcastSize) {  // lane l counts into CTA l's count (lane 0 alone without a cluster)
              const u32 count = bar_addr0 + 8u * (2 * kStages + 2) + 4u * st;
              counted = Cfg::kMcastSize > 1 ? ptx::atom_add_relaxed_cluster_shared(ptx::mapa_shared(count, lane), 1u)
                                            : ptx::atom_add_relaxed_cta_shared(count, 1u);
            }
          } else {
            release(st);
          }
        };
        if constexpr (SchedT::kNarrowN > 0) {
          if (narrow) {
            group(Int<SchedT::kNarrowN>{});
          } else {
            group(Int<Cfg::kWgmmaN>{});
          }
        } else {
          group(Int<Cfg::kWgmmaN>{});
        }
      };
      // One k block on the ring's current stage, then on to the next stage (parity flips at the wrap).
      auto kblock_next = [&](i32 i, auto&& hook) {
        kblock(stage, phase, i, hook);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1u;
        }
      };
      auto no_hook = [] {};
      i32 i = 0;
      if constexpr (kDefer) {
        if (pending) {  // the previous tile's held boxes, during this tile's first k block
          if (i < nkb) {
            kblock_next(i, store_held);
            ++i;
          } else {
            store_held();
          }
          pending = false;
        }
      }
      // Whole rounds of the ring with the stage a constant in each copy of the body (its barrier
      // address and descriptors fold into immediates on uniform registers); the generic loop takes
      // the k blocks before the ring's stage 0 comes round and those after the last round.
      for (; i < nkb && stage != 0; ++i) kblock_next(i, no_hook);
      for (; i + kStages <= nkb; i += kStages) {
#pragma unroll
        for (int s = 0; s < kStages; ++s) kblock((u32)s, phase, i + s, no_hook);
        phase ^= 1u;
      }
      for (; i < nkb; ++i) kblock_next(i, no_hook);
      if constexpr (Epilogue::kExtraBlocks) {
        // The epilogue's own blocks (the producer's extra loads): each stage holds one 64-column
        // box of the tile; every warpgroup waits for it, adds its part and hands it back.
        const i32 rounds = Epilogue::template extra_rounds<Cfg, SchedT>(epi, p, w.tile_m);
        if (rounds > 0) Epilogue::template extra_begin<Cfg>(epi, tid, consumer, ptx::smem_u32(smem_a) + kScratchOffset<Cfg>);
        for (i32 r = 0; r < rounds; ++r) {
          static_for<0, Cfg::kBN / 64>([&](auto cb) {
            ptx::mbar_wait_addr(bar_addr0 + 8u * stage, phase, p.timeout_ns);
            Epilogue::template extra_add<Cfg, decltype(cb)::value>(acc, ptx::smem_u32(smem_a) + stage * Cfg::kStageABytes, wm, wn, tid);
            release(stage);
            if (++stage == kStages) {
              stage = 0;
              phase ^= 1u;
            }
          });
        }
      }
      ptx::reg_fence(acc);

      TileCoord tc;
      tc.tile_m = w.tile_m;
      tc.tile_n = w.tile_n;
      tc.row0 = w.tile_m * Cfg::kBM + (i32)wm * 64;
      tc.col0 = SchedT::col0(p, w.tile_n) + (i32)wn * Cfg::kWN;
      tc.tid = tid;
      tc.consumer = consumer;
      tc.scratch = ptx::smem_u32(smem_a) + kScratchOffset<Cfg>;  // from smem_a: no extra pointer lives across setmaxnreg
      bool do_store = w.tile_m < p.tiles_m && w.tile_n < p.tiles_n;
      if constexpr (Cfg::kClusterK > 1) {
        if (ksplit_tiles++ > 0) __trap();  // a k-split cluster reuses its ring for the exchange: one tile per cluster
        do_store = ksplit_exchange<Cfg>(acc, ksplit_bar, ptx::smem_u32(smem_a), cta_rank, consumer, tid, p.timeout_ns) && do_store;
      }
      if (w.splits > 1 && do_store) do_store = splitk_fixup<Cfg, Sched::kFixupChunk>(p, acc, w, consumer, tid);
      if constexpr (kDefer) {
        if (do_store) {
          Epilogue::template add_bias<Cfg>(epi, p, acc, tc);
          static_for<0, kNowBoxes>([&](auto j) {
            u32 v[TmaStore::kBoxRegs];
            Epilogue::template pack_box<Cfg, decltype(j)::value>(acc, v);
            Epilogue::template store_box<Cfg, decltype(j)::value>(epi, p, v, tc.row0, tc.col0, tc.tid, tc.consumer, tc.scratch);
          });
        }
        // Packed on every path, stored or not: held is then redefined before each k loop, so it is
        // dead there (else it lives across the loop on the no-store path and ptxas spills it).
        static_for<0, kDeferBoxes>([&](auto j) { Epilogue::template pack_box<Cfg, kNowBoxes + decltype(j)::value>(acc, held[decltype(j)::value]); });
        pending = do_store;  // stored during the next tile's first k block, or after the loop
        held_row0 = tc.row0;
        held_col0 = tc.col0;
      } else if constexpr (SchedT::kNarrowN > 0) {
        if (do_store) {
          if (narrow) {
            Epilogue::template store_narrow<Cfg, SchedT::kNarrowN>(epi, p, acc, tc);
          } else {
            Epilogue::template store<Cfg>(epi, p, acc, tc);
          }
        }
      } else {
        if (do_store) Epilogue::template store<Cfg>(epi, p, acc, tc);
      }
      if constexpr (Epilogue::kTileBarrier) {
        ptx::named_barrier_sync(kConsumerBarrier, 128 * Cfg::kConsumers);
        Epilogue::template tile_done<Cfg>(epi, p, tc);
      }
    }
    if constexpr (kDefer) {
      if (pending) store_held();  // the last tile's held boxes
    }
    Epilogue::template finish<Cfg>(epi, tid, consumer, ptx::smem_u32(smem_a) + kScratchOffset<Cfg>);
  }

  if constexpr (kCluster) {
    // No CTA may exit while its peer can still arrive on its barriers or multicast into it.
    ptx::cluster_sync();
  }
}

}  // namespace rawflux
