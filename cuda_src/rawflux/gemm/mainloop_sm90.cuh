// The sm_90a GEMM engine: persistent, warp-specialized, TMA -> shared-memory ring -> wgmma.
//
//   warpgroup 0 (producer, 40 registers): one thread waits for a free stage, arms its full
//     barrier with the stage's byte count and issues the TMA loads of A and B (multicast to the
//     cluster peer for the shared operand). With the consumer refill (kRefill, the wide tiles) it
//     loads only each work unit's first kStages k blocks, waiting on the stages' release counts.
//   warpgroups 1..kConsumers (232 registers requested; ptxas allocates within the launch's 168
//     unless the accumulators alone need more: 128x320's SASS reaches R214, 128x256's stays under
//     168 and spills before it goes past): wait for a full stage, issue 4 k16 steps of wgmma on it (one wgmma per step,
//     two side by side along n when the warpgroup's N exceeds 256), wait for that group and
//     release the stage to the producer(s) of the cluster (kWait0; the warpgroups' groups then
//     alternate on the tensor pipe), or with kRefill add to its release count(s), the warp that
//     completes a count loading the block kStages on after its next commit; after the last k block, split-K fix-up if any, then
//     Epilogue::store (with a deferred C box, TmaStore::defer_boxes: all boxes but the last, which
//     is stored during the next tile's first k block, while that block's wgmma group runs).
//
// Shared memory (1024-aligned): A[kStages][BM x 64], B[kStages][BN x 64 | 64 x BN], then the
// full[kStages] and empty[kStages] mbarriers, the k-split pair's two, and the release counts
// (u32[kStages], kRefill). Tiles use the 128-byte swizzle of the TMA maps.
//   A (K-major): row r of the tile at r * 128 B.   wgmma desc: SBO = 1024 (8 rows), +32 B per k16.
//   B nk (K-major): same, rows are n.
//   B kn (MN-major): per 64 columns of n a chunk of BK rows (k) x 128 B; chunks 64 * 128 B apart.
//     wgmma desc (transposed B): LBO = chunk stride, SBO = 1024 (8 k rows), +16 rows per k16.
#pragma once
#include "rawflux/gemm/config.cuh"
#include "rawflux/gemm/epilogue.cuh"
#include "rawflux/gemm/policies.cuh"
#include "rawflux/gemm/scheduler.cuh"
#include "rawflux/gemm/trace.cuh"
#include "rawflux/ptx/mbarrier.cuh"
#include "rawflux/ptx/sync.cuh"
#include "rawflux/ptx/tma.cuh"
#include "rawflux/ptx/wgmma.cuh"

namespace rawflux {
namespace ptx {

template <u32 kRegs>
RAWFLUX_DEVICE void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <u32 kRegs>
RAWFLUX_DEVICE void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

RAWFLUX_DEVICE void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }

RAWFLUX_DEVICE u32 atom_add_acq_rel_gpu(u32* p, u32 v) {
  u32 old;
  asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

RAWFLUX_DEVICE u32 atom_add_relaxed_gpu(u32* p, u32 v) {
  u32 old;
  asm volatile("atom.add.relaxed.gpu.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

RAWFLUX_DEVICE void st_cg_v4f(float* p, float a, float b, float c, float d) {
  asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

RAWFLUX_DEVICE void ld_cg_v4f(const float* p, float& a, float& b, float& c, float& d) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(a), "=f"(b), "=f"(c), "=f"(d) : "l"(p) : "memory");
}

}  // namespace ptx

// float4 of a thread's fragment summed per round trip of the fix-up: the loads of a chunk go out
// together. While chunk c is summed the accumulators of chunks < c hold results and those of
// chunks > c are dead (re-read from the workspace), so the peak is about kAccRegs + 4 x chunk.
constexpr int fixup_chunk(int vec, int most) {
  int c = most;
  if (c > vec) c = vec;
  while (c > 1 && vec % c != 0) --c;
  return c;
}

// Split-K / stream-K fix-up for one consumer warpgroup's fragment. Each piece of a tile (w.split
// of w.splits, in k order) first counts itself in (`arrived`). Every piece but the last to arrive
// stores its fp32 partial to the workspace and counts it stored (`stored`). The last arrival waits
// until the others' partials are stored (they have arrived, so they are running and only have
// their stores left: no wait on a CTA that may not be resident yet), sums all pieces in piece
// order, resets both counts and returns true: it alone runs the epilogue. If it is piece 0 (banded
// stream-K's usual case) its own partial stays in registers and the others are added in place;
// otherwise it stores its own too and sums all from the workspace (in place, a later piece's
// accumulators would be needed beside the running sum: ptxas spilled ~1.2 KB). Either way the sum
// is ((0 + p0) + p1) + ..., so the bits do not depend on which piece arrived last.
// Workspace: per (slot, consumer) and piece (p.splits deep), kRegs/4 float4 per thread,
// thread-interleaved (coalesced 16-byte accesses). Counters: two u32 per (slot, consumer).
template <class Cfg, int kChunkMax>
RAWFLUX_DEVICE bool splitk_fixup(const GemmParams& p, float (&acc)[Cfg::kAccRegs], const WorkTile& w, u32 consumer, u32 tid) {
  constexpr int kVec = Cfg::kAccRegs / 4;
  constexpr int kChunk = fixup_chunk(kVec, kChunkMax);
  float* ws = reinterpret_cast<float*>(p.workspace);
  const i64 slot = (i64)w.slot * Cfg::kConsumers + consumer;
  u32* arrived = reinterpret_cast<u32*>(p.counters) + 2 * slot;  // pieces counted in
  u32* stored = arrived + 1;                                      // pieces whose partial is stored
  const i64 part_floats = (i64)kVec * 128 * 4;
  const float* part = ws + slot * p.splits * part_floats + tid * 4;  // piece 0 of this slot, this thread's first float4
  float* mine = ws + (slot * p.splits + w.split) * part_floats + tid * 4;
  const u32 bar = kWarpgroupBarrierBase + consumer;
  bool last = false;
  if (tid == 0) {
    // relaxed: the arrival count orders no data; the partials are ordered by `stored` below
    last = ptx::atom_add_relaxed_gpu(arrived, 1u) == (u32)(w.splits - 1);
  }
  last = ptx::named_barrier_or(bar, 128, last);
  if (!last || w.split != 0) {
#pragma unroll
    for (int i = 0; i < kVec && !(kProbe & 65536); ++i) {
      ptx::st_cg_v4f(mine + i * 512, acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
    }
  }
  if (!last) {
    ptx::fence_acq_rel_gpu();  // release: this thread's partial stores before the stored count below
    ptx::named_barrier_sync(bar, 128);
    if (tid == 0) ptx::atom_add_acq_rel_gpu(stored, 1u);  // publishes the warpgroup's partial (fences + barrier above)
    return false;
  }
  if (tid == 0) {
    u64 start = 0;
    for (u32 polls = 0; ld_acquire_gpu_u32(stored) < (u32)(w.splits - 1); ++polls) {  // acquire: the others' partials
      if ((polls & 1023) == 1023) {
        const u64 now = ptx::globaltimer_ns();
        if (start == 0) {
          start = now;
        } else if ((i64)(now - start) > p.timeout_ns) {
          asm volatile("trap;");  // rawflux gemm: a split-K / stream-K piece counted in but never stored its partial
        }
      }
    }
    *arrived = 0;  // every piece of this slot has arrived and stored: ready for the next launch
    *stored = 0;
  }
  ptx::named_barrier_sync(bar, 128);
  ptx::fence_acq_rel_gpu();  // acquire: the partials thread 0 saw stored, before this thread's reads
  // Chunk by chunk, a piece's kChunk float4 loads issued together.
  if (w.split == 0) {
#pragma unroll
    for (int i0 = 0; i0 < kVec; i0 += kChunk) {
#pragma unroll
      for (int j = 0; j < 4 * kChunk; ++j) acc[4 * i0 + j] = 0.f + acc[4 * i0 + j];  // 0 + p0, as below (-0 -> +0)
      const float* src = part + i0 * 512 + part_floats;
#pragma unroll 1
      for (i32 s = 1; s < w.splits && !(kProbe & 131072); ++s, src += part_floats) {
        float v[4 * kChunk];
#pragma unroll
        for (int j = 0; j < kChunk; ++j) ptx::ld_cg_v4f(src + j * 512, v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
#pragma unroll
        for (int j = 0; j < 4 * kChunk; ++j) acc[4 * i0 + j] += v[j];
      }
    }
    return true;
  }
#pragma unroll
  for (int i0 = 0; i0 < kVec; i0 += kChunk) {
    float t[4 * kChunk];
#pragma unroll
    for (int j = 0; j < 4 * kChunk; ++j) t[j] = 0.f;
    const float* src = part + i0 * 512;
#pragma unroll 1
    for (i32 s = 0; s < w.splits && !(kProbe & 131072); ++s, src += part_floats) {
      float v[4 * kChunk];
#pragma unroll
      for (int j = 0; j < kChunk; ++j) ptx::ld_cg_v4f(src + j * 512, v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
#pragma unroll
      for (int j = 0; j < 4 * kChunk; ++j) t[j] += v[j];
    }
#pragma unroll
    for (int j = 0; j < 4 * kChunk; ++j) acc[4 * i0 + j] = t[j];
  }
  return true;
}

// k-split cluster (Cfg::kClusterK == 2), after the main loop. The two CTAs hold the same tile's two
// k halves. CTA r keeps warpgroup r's 64 rows and hands its other warpgroup's fragment to the
// partner, into the partner's stage ring (idle by then: one tile per cluster, checked by the host,
// all its loads consumed). Both directions run at once and each CTA stores half the tile. The sum is
// split-K's, (0 + k half 0) + k half 1, so the bits equal split-K k2's.
// ring_free (in each CTA) counts the partner's consumer threads done reading their ring: it gates
// this CTA's sending warpgroup. xfer_full (in each CTA) counts the partner's sending threads done
// writing: it gates this CTA's receiving warpgroup. Each is used for one phase per launch.
// Returns true in the receiving warpgroup, which then stores its rows.
template <class Cfg>
RAWFLUX_DEVICE bool ksplit_exchange(float (&acc)[Cfg::kAccRegs], u64* ksplit_bar, u32 ring_base, u32 cta_rank, u32 consumer,
                                    u32 tid, i64 timeout_ns) {
  static_assert(Cfg::kConsumers == 2, "a k-split cluster splits the tile's rows between its two CTAs: one warpgroup each");
  constexpr int kVec = Cfg::kAccRegs / 4;
  // This thread's float4 i of its warpgroup's fragment: thread-interleaved, conflict-free 16-byte accesses.
  const u32 frag = ring_base + consumer * (u32)(Cfg::kAccRegs * 128 * 4) + tid * 16;
  u64* ring_free = ksplit_bar;
  u64* xfer_full = ksplit_bar + 1;
  const u32 partner = cta_rank ^ 1u;
  // Split-K's order is (0 + k half 0) + k half 1. CTA 0 holds half 0 and adds the zero to it here,
  // in both warpgroups; each receiver then adds the two (addition commutes, bit for bit).
  if (cta_rank == 0) {
#pragma unroll
    for (int i = 0; i < Cfg::kAccRegs; ++i) acc[i] = 0.f + acc[i];
  }
  ptx::fence_proxy_async_smem();  // this CTA's ring traffic in the async proxy (TMA writes, wgmma reads) before the partner's generic writes
  // release.cluster: this thread's ring reads (its wgmma, complete at wait_group 0) before the partner writes there
  ptx::mbar_arrive_release_cluster(ring_free, partner);
  if (consumer == cta_rank) {
    ptx::mbar_wait_acquire_cluster(xfer_full, 0, timeout_ns);  // acquire.cluster: the partner's fragment writes before the reads below
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      float v[4];
      ptx::ld_shared_v4f(frag + i * 128 * 16, v[0], v[1], v[2], v[3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[4 * i + j] += v[j];
    }
    return true;
  }
  ptx::mbar_wait_acquire_cluster(ring_free, 0, timeout_ns);  // acquire.cluster: the partner is done reading its ring
  const u32 remote = ptx::mapa_shared(frag, partner);
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    ptx::st_cluster_v4f(remote + i * 128 * 16, acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
  }
  ptx::mbar_arrive_release_cluster(xfer_full, partner);  // release.cluster: this thread's fragment writes before the partner's reads
  return false;
}

// How a tile's producer loads A's box (gemm_kernel's k loop): the main map, or the tail map of a
// ragged last tile row and of a tile wholly past m (GemmParams::a_tail_rows).
enum : int { kALoadFull = 0, kALoadTail = 1 };

// Whether the tile whose A rows start at m0 loads A through the tail map (kALoadTail): a cluster's
// idle CTA, or a ragged last row where m spans more than one box (within one box, a_box_rows
// already cut the main map's box to m).
template <class Cfg>
RAWFLUX_DEVICE bool a_tail_box(const GemmParams& p, i32 m0) {
  return Cfg::kClusterN == 1 && p.a_tail_rows > 0 && (p.m - m0 <= 0 || (p.m - m0 < Cfg::kBoxARows && p.m > Cfg::kBoxARows));
}

// Bytes a stage receives with A loaded as kAMode: the rows A's box(es) leave out are not counted.
template <class Cfg, int kAMode>
RAWFLUX_DEVICE u32 stage_tx(const GemmParams& p) {
  const i32 a_load = kAMode == kALoadTail ? p.a_tail_rows : p.a_box_rows > 0 ? p.a_box_rows : Cfg::kBoxARows;
  return (u32)(Cfg::kStageBytes - (Cfg::kBoxARows - a_load) * Cfg::kClusterN * Cfg::kRowBytes);
}

// Arms full[stage] for tx bytes and issues k block kb's TMA loads into the stage: A's box at row m0
// (this CTA's slice a_slice of a multicast A), B's box at column n_tile0 (slice b_slice). The
// producer's loads, and the consumers' refill (kRefill).
// The consumer refill of a 2x1 cluster (two CTAs along m share B): CTA `cta`'s loads of k block kb
// into its stage, issued from either CTA. Armed on that CTA's full barrier; A's box (row m0, that
// CTA's) goes to it alone, its half of B to both, as its producer would load them.
template <class Cfg, int kAMode>
RAWFLUX_DEVICE void load_kblock_for(const TensorMap& tmap_a, const TensorMap& tmap_a_tail, const TensorMap& tmap_b, u8* smem_a,
                                    u8* smem_b, u64* full, u32 stage, i32 kb, i32 m0, i32 n_tile0, u32 cta, u32 tx) {
  static_assert(Cfg::kClusterM == 2 && Cfg::kClusterN == 1, "a pair along m");
  ptx::mbar_arrive_expect_tx_cluster(ptx::smem_u32(&full[stage]), cta, tx);
  u8* sa = smem_a + stage * Cfg::kStageABytes;
  ptx::tma_load_2d_multicast(sa, kAMode == kALoadTail ? &tmap_a_tail : &tmap_a, &full[stage], kb * Cfg::kBK, m0, (u16)(1u << cta));
  const i32 b_slice = (i32)cta * Cfg::kBoxBRows;
  u8* sb = smem_b + stage * Cfg::kStageBBytes + b_slice * Cfg::kRowBytes;
  if constexpr (Cfg::kBLayout == kLayoutNK) {
    ptx::tma_load_2d_multicast(sb, &tmap_b, &full[stage], kb * Cfg::kBK, n_tile0 + b_slice, (u16)3u);
  } else {
#pragma unroll
    for (int ch = 0; ch < Cfg::kBChunks; ++ch) {
      ptx::tma_load_2d_multicast(sb + ch * Cfg::kChunkBytes, &tmap_b, &full[stage], n_tile0 + ch * 64, kb * Cfg::kBK + b_slice, (u16)3u);
    }
  }
}

template <class Cfg, int kAMode>
RAWFLUX_DEVICE void load_kblock(const TensorMap& tmap_a, const TensorMap& tmap_a_tail, const TensorMap& tmap_b, u8* smem_a,
                                u8* smem_b, u64* full, u32 stage, i32 kb, i32 m0, i32 n_tile0, i32 a_slice, i32 b_slice, u32 tx) {
  ptx::mbar_arrive_expect_tx(&full[stage], tx);
  u8* sa = smem_a + stage * Cfg::kStageABytes + a_slice * Cfg::kRowBytes;
  if constexpr (Cfg::kClusterN > 1) {
    ptx::tma_load_2d_multicast(sa, &tmap_a, &full[stage], kb * Cfg::kBK, m0, (u16)((1u << Cfg::kClusterSize) - 1));
  } else if constexpr (kAMode == kALoadTail) {
    ptx::tma_load_2d(sa, &tmap_a_tail, &full[stage], kb * Cfg::kBK, m0);
  } else {
    ptx::tma_load_2d(sa, &tmap_a, &full[stage], kb * Cfg::kBK, m0);
  }
  u8* sb = smem_b + stage * Cfg::kStageBBytes + b_slice * Cfg::kRowBytes;
  if constexpr (Cfg::kBLayout == kLayoutNK) {
    const i32 n0 = n_tile0 + b_slice;
    if constexpr (Cfg::kClusterM > 1) {
      ptx::tma_load_2d_multicast(sb, &tmap_b, &full[stage], kb * Cfg::kBK, n0, (u16)((1u << Cfg::kClusterSize) - 1));
    } else {
      ptx::tma_load_2d(sb, &tmap_b, &full[stage], kb * Cfg::kBK, n0);
    }
  } else {
    const i32 k0 = kb * Cfg::kBK + b_slice;
#pragma unroll
    for (int ch = 0; ch < Cfg::kBChunks; ++ch) {
      const i32 n0 = n_tile0 + ch * 64;
      if constexpr (Cfg::kClusterM > 1) {
        ptx::tma_load_2d_multicast(sb + ch * Cfg::kChunkBytes, &tmap_b, &full[stage], n0, k0, (u16)((1u << Cfg::kClusterSize) - 1));
      } else {
        ptx::tma_load_2d(sb + ch * Cfg::kChunkBytes, &tmap_b, &full[stage], n0, k0);
      }
    }
  }
}

template <class Cfg, class Sched, class Prologue, class Epilogue>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    gemm_kernel(const __grid_constant__ TensorMap tmap_a, const __grid_constant__ TensorMap tmap_b, const GemmParams p,
                const typename Prologue::Params pro, const __grid_constant__ typename Epilogue::Params epi,
                const __grid_constant__ TensorMap tmap_a_tail) {
  using SchedT = typename Sched::template type<Cfg>;
  constexpr int kStages = Cfg::kStages;
  constexpr bool kCluster = Cfg::kClusterSize > 1;
  // Shared memory: the stage ring, the barriers, then (from the next 1024-byte boundary) the
  // epilogue's scratch; the barriers sit where they sit without scratch, so the pointers the
  // roles keep are the same as for any epilogue. The host's launch_smem_bytes (rawflux/ops/gemm.py)
  // reserves it; tests/cpu checks the two agree for every tile.
  extern __shared__ u8 smem_raw[];
  u8* smem = smem_raw + ((1024u - (ptx::smem_u32(smem_raw) & 1023u)) & 1023u);
  u8* smem_a = smem;
  u8* smem_b = smem + kStages * Cfg::kStageABytes;
  u64* full = reinterpret_cast<u64*>(smem + kStages * Cfg::kStageBytes);
  u64* empty = full + kStages;
  u64* ksplit_bar = empty + kStages;  // k-split cluster only: ring_free, xfer_full (ksplit_exchange)
  // Dynamic tile order only (kDynSched): the ticket ring, kIdSlots deep, and its hand-over barriers
  // (peer CTAs wait there for the leader's ticket). kIdSlots = kStages + 1: the leader's producer
  // reuses a slot only after the consumers of both CTAs released a stage of a later tile, so every
  // reader of the slot's previous ticket has read it.
  constexpr bool kDyn = SchedT::kDynamic;
  constexpr u32 kIdSlots = kStages + 1;
  u64* id_full = ksplit_bar + 2;  // then the ring: u32 ids[kIdSlots]
  // Consumer refill (config.cuh, RAWFLUX_REFILL): past a work unit's first kStages k blocks, the
  // last consumer warp to release a stage loads the block kStages ahead into it. Every consumer
  // warp of the CTAs that share a stage counts its release into each one's count (a 2x1 cluster:
  // both CTAs', and the warp that completes a CTA's count issues that CTA's loads, from either
  // CTA). With wait_group 0 (a stage is released at once), without probes or the dynamic order
  // (whose ticket ring lies where the counts do), and where the prologue allows it (its wait
  // orders only the producer's own loads).
  // Wide tiles only (a k block of at least 128 x 224, 896 tensor-pipe cycles): the refill issues a
  // stage's loads one k block later than a producer would, which the narrower tiles' shorter
  // blocks do not cover where they run (m <= 1024, memory-bound: 128x96 at m = 256 fell from 0.94
  // to 0.78 of cuBLAS, 128x192 at m = 1024 from 0.99 to 0.97; session 23, docs/gemm-notes.md).
  constexpr bool kPairM = Cfg::kClusterM == 2 && Cfg::kClusterN == 1;
  constexpr bool kRefill = kRefillOn && kWait0 && Cfg::kBM * Cfg::kBN >= 128 * 224 && (Cfg::kMcastSize == 1 || kPairM) && !kDyn &&
                           kProbe == 0 && Prologue::kConsumerRefill;
  constexpr u32 kReleasers = 4 * Cfg::kConsumers * Cfg::kMcastSize;  // consumer warps that release each stage
  u32* released = reinterpret_cast<u32*>(id_full);  // releases of stage s so far (kReleasers per use)

  // Special registers are read again inside each role, after setmaxnreg: a value live across the
  // register-count change would be spilled.
  const u32 wg = threadIdx.x / 128;

  if (kTrace && threadIdx.x == 0) {
    trace_stamp(kTraceEntry);
    trace_sm();
  }
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
    if constexpr (kDyn) {
#pragma unroll
      for (u32 s = 0; s < kIdSlots; ++s) ptx::mbar_init(&id_full[s], 1);  // the leader producer's hand-over
    }
    if constexpr (kRefill) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) released[s] = 0u;  // seen by every role after the barrier below
    }
    ptx::fence_mbar_init();
  }
  if constexpr (kCluster) {
    ptx::cluster_sync();
  } else {
    __syncthreads();
  }
  if (kTrace && threadIdx.x == 0) trace_stamp(kTraceSynced);

  if (wg == 0) {
    // ---------------------------------------------------------------- producer
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) {
      if constexpr (kCodePad > 0) {
        if (p.m < 0) dead_code_pad<kCodePad>(reinterpret_cast<u32*>(p.counters));  // never: the host rejects m < 1
      }
      // The ring's addresses derived afresh here: a pointer kept from before setmaxnreg would be
      // spilled (the producer runs in 40 registers).
      u8* smem = ptx::opaque(smem_raw) + ((1024u - (ptx::smem_u32(smem_raw) & 1023u)) & 1023u);
      u8* smem_a = smem;
      u8* smem_b = smem + kStages * Cfg::kStageABytes;
      u64* full = reinterpret_cast<u64*>(smem + kStages * Cfg::kStageBytes);
      u64* empty = full + kStages;
      u32* released = reinterpret_cast<u32*>(empty + kStages + 2);  // kRefill's counts, after the k-split pair
      const u32 cta_rank = kCluster ? ptx::cluster_ctarank() : 0u;
      const i32 cluster_id = kCluster ? (i32)ptx::cluster_id_x() : (i32)blockIdx.x;
      SchedT sched(p, cluster_id, (i32)cta_rank);
      WorkTile w;
      u32 stage = 0, phase = 0;
      u32 round = 0;  // kRefill: uses of the ring's stages before the current one (phase = round's parity)
      // Dynamic order: on when the host passes the ticket counters to a data-parallel launch.
      const bool dyn = kDyn && p.splits == 1 && p.sk_tiles == 0 && p.counters != 0;
      u32 tickets = 0;  // tiles begun: the ticket ring's cursor
      // The next tile: the static order's, or (dyn) the ticket the cluster leader draws.
      auto fetch = [&]() -> bool {
        if constexpr (kDyn) {
          if (dyn) {
            const u32 slot = tickets % kIdSlots;
            u64* id_full = reinterpret_cast<u64*>(smem + kStages * Cfg::kStageBytes) + 2 * kStages + 2;
            u32* ids = reinterpret_cast<u32*>(id_full + kIdSlots);
            i32 u;
            if (cta_rank == 0) {
              u = tickets == 0 ? cluster_id : SchedT::stride() + (i32)atomicAdd(reinterpret_cast<u32*>(p.counters), 1u);
#pragma unroll
              for (u32 r = 1; r < (u32)Cfg::kClusterSize; ++r) {
                ptx::st_cluster_u32(ptx::mapa_shared(ptx::smem_u32(&ids[slot]), r), (u32)u);
                ptx::mbar_arrive_release_cluster(&id_full[slot], r);  // release.cluster: the ticket stored in CTA r before its producer reads it
              }
              *reinterpret_cast<volatile u32*>(&ids[slot]) = (u32)u;  // read by this CTA's consumers after the full barrier of the tile's first stage (its arrive releases)
            } else {
              ptx::mbar_wait_acquire_cluster(&id_full[slot], (tickets / kIdSlots) & 1u, p.timeout_ns);  // acquire.cluster: the leader's ticket store
              u = (i32)ptx::ld_shared_u32(ptx::smem_u32(&ids[slot]));
            }
            ++tickets;
            sched.unit = u;
          }
        }
        return sched.next(p, w);
      };
      // This CTA's slice of a multicast operand (whole tile when that dimension has no cluster).
      const i32 a_slice = Cfg::kClusterN > 1 ? (i32)cta_rank * Cfg::kBoxARows : 0;
      const i32 b_slice = Cfg::kClusterM > 1 ? (i32)cta_rank * Cfg::kBoxBRows : 0;
      // One tile's k loop. kAMode: how A's box is loaded. kALoadFull: the main map, its box
      // kBoxARows rows, or GemmParams::a_box_rows when m is smaller. kALoadTail: the tail map
      // (a_tail_rows rows), in a ragged last tile row, since the TMA unit's zero fill of rows past m
      // is slower than loading rows (m = 192, 128x96: 83 us against 66), and in a tile wholly past m
      // (a cluster's idle CTA: its rows are all zero-filled, a_tail_rows >= 8 of them instead of a
      // box). The rows a box leaves hold stale data; their results are never stored. A compile-time
      // mode, one loop each: choosing the map inside the loop costs the trace build's producer (40
      // registers) a spill.
      auto k_loop = [&](auto mode) {
        constexpr int kAMode = decltype(mode)::value;
        const i32 m0 = w.tile_m * Cfg::kBM + a_slice;
        const u32 tx = stage_tx<Cfg, kAMode>(p);
        // kRefill: the unit's first kStages blocks; the consumers load the rest.
        const i32 kb_stop = kRefill ? min(w.kb_end, w.kb_begin + kStages) : w.kb_end;
        for (i32 kb = w.kb_begin; kb < kb_stop; ++kb) {
          if constexpr ((kProbe & 64) != 0 && (kProbe & (16384 | 32768)) != 0) {  // probe: no ring, a producer polling a dead barrier
            const long long from = clock64();
            while (clock64() - from < 1000) {
              if (ptx::mbar_test_wait(ptx::smem_u32(&full[stage]), phase)) asm volatile("" ::: "memory");
              if constexpr ((kProbe & 16384) != 0) __nanosleep(100);
            }
          }
          if constexpr ((kProbe & 64) != 0) continue;  // probe: no ring (the consumers neither wait nor release)
          if (kTrace && kb == w.kb_begin) trace_stamp(kTraceProducerReady);
          const u32 wait_from = kTraceBlockWaits ? trace_now32() : 0u;
          if constexpr ((kProbe & 1024) != 0) __nanosleep(1000);  // probe: an active producer that touches no barrier
          if constexpr ((kProbe & (4096 | 8192)) != 0) {  // probe: the producer polls a barrier, whatever its state
            u64* polled = (kProbe & 4096) != 0 ? &full[stage] : &empty[stage];
            for (int j = 0; j < 8; ++j) {
              if (ptx::mbar_test_wait(ptx::smem_u32(polled), phase ^ 1u)) asm volatile("" ::: "memory");
              __nanosleep(100);
            }
          }
          if constexpr ((kProbe & 2048) != 0) {  // probe: a producer that spins, touching no barrier
            const long long from = clock64();
            while (clock64() - from < 1000) {
            }
          }
          if constexpr (kRefill) {
            // every consumer warp released the stage's previous use (round - 1); a count, not a
            // parity: the producer skips the blocks the consumers load and may be rounds ahead
            ptx::wait_count_geq<(Cfg::kMcastSize > 1)>(ptx::smem_u32(&released[stage]), round * kReleasers, p.timeout_ns);
          } else if constexpr ((kProbe & (128 | 1024 | 2048 | 4096 | 8192)) == 0) {
            ptx::mbar_wait(&empty[stage], phase ^ 1u, p.timeout_ns);
          }
          if (kTraceBlockWaits) trace_add_since(kTraceProducerWait, wait_from);
          if constexpr ((kProbe & 2) != 0) {  // probe: no loads, the stage is "full" at once
            if constexpr ((kProbe & 512) == 0) ptx::mbar_arrive(&full[stage]);
            if (++stage == kStages) {
              stage = 0;
              phase ^= 1u;
            }
            continue;
          }
          load_kblock<Cfg, kAMode>(tmap_a, tmap_a_tail, tmap_b, smem_a, smem_b, full, stage, kb, m0, SchedT::col0(p, w.tile_n),
                                   a_slice, b_slice, tx);
          if (kTrace && kb == w.kb_begin) trace_stamp(kTraceFirstLoad);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1u;
            if constexpr (kRefill) ++round;
          }
        }
        if constexpr (kRefill) {  // past the blocks the consumers load
          const u32 skip = (u32)max(0, w.kb_end - kb_stop);
          stage += skip % kStages;
          round += skip / kStages;
          if (stage >= kStages) {
            stage -= kStages;
            ++round;
          }
        }
      };
      while (kDyn ? fetch() : sched.next(p, w)) {
        const i32 m0 = w.tile_m * Cfg::kBM + a_slice;
        // The tail map: a_tail_box, written out (the call, by reference or by value, costs AG-GEMM's
        // producer a spill). Decided before the prologue's wait, so that only a predicate lives
        // across it (a row count kept across AgWait's loop costs the same spill).
        const bool tail = Cfg::kClusterN == 1 && p.a_tail_rows > 0 &&
                          (p.m - m0 <= 0 || (p.m - m0 < Cfg::kBoxARows && p.m > Cfg::kBoxARows));
        Prologue::wait(pro, p, w.tile_m, m0, max(0, min(Cfg::kBoxARows, p.m - m0)));
        if (tail) {
          k_loop(Int<kALoadTail>{});
        } else {
          k_loop(Int<kALoadFull>{});
        }
      }
      if constexpr (kDyn) {
        if (dyn) {
          // The consumers learn of the end from the ticket past the last tile: a stage marked full
          // with no data carries it (their wait on it is the tile's first).
          ptx::mbar_wait(&empty[stage], phase ^ 1u, p.timeout_ns);
          ptx::mbar_arrive(&full[stage]);  // release.cta: the end ticket stored before the consumers read it
          if (cta_rank == 0) {
            u32* counters = reinterpret_cast<u32*>(p.counters);
            __threadfence();  // this cluster's ticket draws before its count of leaders done
            if (atomicAdd(&counters[1], 1u) == (u32)SchedT::stride() - 1u) {
              __threadfence();  // every leader's draws (seen through the done count) before the reset
              counters[0] = 0u;
              counters[1] = 0u;  // zero for the next launch on this stream (kernel boundary orders it)
            }
          }
        }
      }
    }
    __syncwarp();
  } else {
    // ---------------------------------------------------------------- consumers
    ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
    const u32 tid = threadIdx.x % 128;
    // RAWFLUX_LOOP_ADDR & 2: broadcast, so that ptxas sees a warp-uniform value.
    const u32 consumer = ((kLoopAddr & 2) ? __shfl_sync(0xffffffffu, threadIdx.x / 128, 0) : threadIdx.x / 128) - 1;
    const u32 cta_rank = kCluster ? ptx::cluster_ctarank() : 0u;
    const i32 cluster_id = kCluster ? (i32)ptx::cluster_id_x() : (i32)blockIdx.x;
    const u32 wm = consumer / Cfg::kWgN, wn = consumer % Cfg::kWgN;
    const u32 lane = tid % 32;
    SchedT sched(p, cluster_id, (i32)cta_rank);
    WorkTile w;
    u32 stage = 0, phase = 0;
    u32 tickets = 0;
    // The next tile: the static order's, or (dynamic order) the ticket in the ring, read once the
    // tile's first stage is full (the kblock's own wait on that stage then returns at once). The
    // switch and the ring's address are recomputed from the params each time: no register lives
    // across the k loop for them (the 128x320 tile's accumulators leave none).
    auto fetch = [&]() -> bool {
      if constexpr (kDyn) {
        if (p.splits == 1 && p.sk_tiles == 0 && p.counters != 0) {
          const u32 ring = ptx::smem_u32(smem_a) + kStages * Cfg::kStageBytes + 8u * (2 * kStages + 2 + kIdSlots);
          ptx::mbar_wait(&full[stage], phase, p.timeout_ns);  // acquire.cta: the producer's ticket store before its arrive
          sched.unit = (i32)ptx::ld_shared_u32(ring + 4u * (tickets % kIdSlots));
          ++tickets;
        }
      }
      return sched.next(p, w);
    };
    u32 ksplit_tiles = 0;  // k-split cluster: tiles this CTA took (one at most)
    float acc[Cfg::kAccRegs];
#pragma unroll
    for (int i = 0; i < Cfg::kAccRegs; ++i) acc[i] = 0.f;

    const u32 a_off = wm * 64 * Cfg::kRowBytes;
    const u32 b_off = Cfg::kBLayout == kLayoutNK ? wn * Cfg::kWN * Cfg::kRowBytes : wn * (Cfg::kWN / 64) * Cfg::kChunkBytes;
    const u32 a_base0 = ptx::smem_u32(smem_a) + a_off;
    const u32 b_base0 = ptx::smem_u32(smem_b) + b_off;
    // RAWFLUX_LOOP_ADDR & 1: full[0]'s 32-bit shared address, from the ring's (the barriers follow
    // the stages; empty[s] follows full[] at 8 * (kStages + s)).
    const u32 bar_addr0 = a_base0 - a_off + kStages * Cfg::kStageBytes;

    // Hands a consumed stage back to the producer of every CTA that wrote into it.
    auto release = [&](u32 s) {
      if constexpr (Cfg::kMcastSize > 1) {
        if (lane < (u32)Cfg::kMcastSize) {
          if constexpr ((kLoopAddr & 8) != 0) {
            ptx::mbar_arrive_cluster_addr(bar_addr0 + 8u * (kStages + s), lane);
          } else {
            ptx::mbar_arrive_cluster(&empty[s], lane);
          }
        }
      } else {
        if (lane == 0) {
          if constexpr ((kLoopAddr & 8) != 0) {
            ptx::mbar_arrive_addr(bar_addr0 + 8u * (kStages + s));
          } else {
            ptx::mbar_arrive(&empty[s]);
          }
        }
      }
    };

    // RAWFLUX_LOOP_ADDR & 4: stage 0's descriptors; a stage's are these plus its offset (desc_add:
    // shared addresses stay below 2^18, so the 14-bit address field never carries).
    const u64 da_ring = ptx::smem_desc(a_base0, 16, 1024);
    const u64 db_ring = ptx::smem_desc(b_base0, Cfg::kBLayout == kLayoutNK ? 16u : (u32)Cfg::kChunkBytes, 1024);

    // One wgmma: k16 step kk of n chunk c (columns [c * kWgmmaN, (c + 1) * kWgmmaN) of this
    // warpgroup's B slice, accumulator slice c) on the stage at (a_base, b_base). The first k16
    // step of a tile overwrites the accumulators.
    // narrow: a narrow column's tile (NarrowSched), whose wgmma is m64n{SchedT::kNarrowN} (the first
    // kNarrowN / 2 accumulators; the rest are never stored).
    auto mma = [&](int c, int kk, u32 a_base, u32 b_base, bool first_block, auto nt) {
      constexpr int kN = decltype(nt)::value;
      float(&acc_c)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&acc[c * (Cfg::kWgmmaN / 2)]);
      u64 da, db;
      if constexpr ((kLoopAddr & 4) != 0) {  // a_base / b_base: the stage's offsets from the ring's start, in 16-byte units
        da = ptx::desc_add(da_ring, a_base + kk * 2);
        if constexpr (Cfg::kBLayout == kLayoutNK) {
          db = ptx::desc_add(db_ring, b_base + c * Cfg::kWgmmaN * Cfg::kRowBytes / 16 + kk * 2);
        } else {
          db = ptx::desc_add(db_ring, b_base + c * (Cfg::kWgmmaN / 64) * Cfg::kChunkBytes / 16 + kk * 128);
        }
      } else if constexpr (kDescStep) {  // step kk = step 0 + its byte offset / 16 in the address field
        da = ptx::desc_step(ptx::smem_desc(a_base, 16, 1024), kk * 32);
        if constexpr (Cfg::kBLayout == kLayoutNK) {
          db = ptx::desc_step(ptx::smem_desc(b_base + c * Cfg::kWgmmaN * Cfg::kRowBytes, 16, 1024), kk * 32);
        } else {
          db = ptx::desc_step(ptx::smem_desc(b_base + c * (Cfg::kWgmmaN / 64) * Cfg::kChunkBytes, Cfg::kChunkBytes, 1024), kk * 16 * 128);
        }
      } else {
        da = ptx::smem_desc(a_base + kk * 32, 16, 1024);
        if constexpr (Cfg::kBLayout == kLayoutNK) {
          db = ptx::smem_desc(b_base + c * Cfg::kWgmmaN * Cfg::kRowBytes + kk * 32, 16, 1024);
        } else {
          db = ptx::smem_desc(b_base + c * (Cfg::kWgmmaN / 64) * Cfg::kChunkBytes + kk * 16 * 128, Cfg::kChunkBytes, 1024);
        }
      }
      ptx::Wgmma<kN, Cfg::kInF16, Cfg::kBLayout == kLayoutKN ? 1 : 0>::mma(acc_c, da, db, (!first_block || kk > 0) ? 1u : 0u);
    };
    constexpr int kSteps = Cfg::kBK / 16;

    // Issue order. Default (kWait0): each warpgroup waits for its own stage's group right after
    // issuing it, so while one warpgroup waits and reissues, the other's group runs, and the pipe
    // always holds the next group. Without kWait0, ordered issue (kOrderedIssue): the two
    // consumer warpgroups take turns issuing their stage's wgmma group, so the tensor pipe runs
    // one warpgroup's group while the other waits for its previous group and issues its next
    // (issued together, both groups end together and the pipe drains while both reissue).
    // Warpgroup c waits for its turn on barrier kIssueBarrierBase + c; the other arrives there
    // once it has issued.
    constexpr bool kOrdered = kOrderedIssue && !kWait0 && Cfg::kConsumers == 2;
    constexpr u32 kTurnThreads = 128 * Cfg::kConsumers;
    // Turns order wgmma issue only; the data the wgmma read is ordered by the stage barriers.
    auto wait_turn = [&] {
      if (consumer == 0) ptx::named_barrier_sync_c<kIssueBarrierBase, kTurnThreads>();
      else ptx::named_barrier_sync_c<kIssueBarrierBase + 1, kTurnThreads>();
    };
    auto pass_turn = [&] {
      if (consumer == 0) ptx::named_barrier_arrive_c<kIssueBarrierBase + 1, kTurnThreads>();
      else ptx::named_barrier_arrive_c<kIssueBarrierBase, kTurnThreads>();
    };
    if constexpr (kOrdered) {
      if (consumer == 1) pass_turn();  // warpgroup 0 goes first
    }

    // Per-tile phase sums (RAWFLUX_TRACE): a register across the k loop, so only where the
    // accumulators leave room.
    constexpr bool kTracePhases = kTrace && Cfg::kAccRegs <= 128;
    // Deferred C boxes (kEpiDefer, config.cuh): the last kDeferBoxes boxes of the previous tile's
    // fragment, packed to 16 bits, wait in `held` and are stored between the wgmma issue and wait
    // of this tile's first k block, while the tensor pipe runs.
    // 128 accumulators leave ptxas room for a deferred box or the consumer refill, not both (both:
    // 20 to 68 bytes of spills in the 128x256 pair); the refill gains more (docs/gemm-notes.md).
    constexpr int kDeferBoxes = kRefill && Cfg::kAccRegs >= 128 ? 0 : DeferTraits<Epilogue, Cfg>::kBoxes;
    constexpr bool kDefer = kDeferBoxes > 0;
    constexpr int kNowBoxes = Cfg::kWN / 64 - kDeferBoxes;  // stored at the tile's end
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
    while (kDyn ? fetch() : sched.next(p, w)) {
      const i32 nkb = w.kb_end - w.kb_begin;
      // A narrow column's tile (NarrowSched): its wgmma is m64n{kNarrowN}, its C the first kNarrowN columns.
      const bool narrow = SchedT::kNarrowN > 0 && w.tile_n >= p.narrow_from;
      static_assert(SchedT::kNarrowN == 0 || (kWait0 && !kDefer && !kDyn && Cfg::kClusterK == 1),
                    "narrow columns: each wgmma group waited for in its branch; no deferred box, dynamic order or k-split cluster");
      u32 prev_stage = 0;
      // kRefill, lane l < kMcastSize: CTA l's count of the previous block's stage before this
      // warp's add (0 at a unit's start: no refill owed). Read only after the next wgmma commit:
      // the add's round trip (to the peer CTA's count in a pair) overlaps the next block's wait and
      // issue instead of delaying them (a pair that reads it at once: 1065 cycles per k block
      // against 1039 without the refill), and the refill's loads are issued off the turnaround
      // between the warpgroups' groups (issued at once: 1050 cycles, not 1025).
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
            load_kblock_for<Cfg, kAMode>(tmap_a, tmap_a_tail, tmap_b, smem_a, smem_b, full, rs, kb, row * Cfg::kBM, n0, cta,
                                         stage_tx<Cfg, kAMode>(p));
          } else {  // no multicast: A's slice and B's are the whole tile
            load_kblock<Cfg, kAMode>(tmap_a, tmap_a_tail, tmap_b, smem_a, smem_b, full, rs, kb, row * Cfg::kBM, n0, 0, 0,
                                     stage_tx<Cfg, kAMode>(p));
          }
        };
        if (a_tail_box<Cfg>(p, row * Cfg::kBM)) {
          load(Int<kALoadTail>{});
        } else {
          load(Int<kALoadFull>{});
        }
      };
      const u32 tile_from = kTracePhases ? trace_clock32() : 0u;
      if (kTrace && trace_thread(128) && nkb > 0 && (kProbe & (64 | 256)) == 0) {  // stamps outside the k loop: no register there
        trace_stamp(kTraceConsumerReady);
        ptx::mbar_wait(&full[stage], phase, p.timeout_ns);  // the loop's first wait then returns at once
        trace_stamp(kTraceFirstData);
      }
      // One k block on stage st (parity ph): wait for its data, issue its wgmma group, run `hook`
      // (the held C boxes) while the group runs, then (kWait0) wait for the group and release the stage.
      auto kblock = [&](u32 st, u32 ph, i32 i, auto&& hook) {
        // The wait sum costs a register in the k loop: only where the accumulators leave room.
        constexpr bool kTraceWait = kTraceBlockWaits && Cfg::kAccRegs <= 128;
        const u32 wait_from = kTraceWait ? trace_now32() : 0u;
        if constexpr ((kProbe & (64 | 256)) != 0) {  // probe: no wait for the stage's data
        } else if constexpr ((kLoopAddr & 1) != 0) {
          ptx::mbar_wait_addr(bar_addr0 + 8u * st, ph, p.timeout_ns);
        } else {
          ptx::mbar_wait(&full[st], ph, p.timeout_ns);
        }
        if (kTraceWait && threadIdx.x == 128) trace_add_since(kTraceConsumerWait, wait_from);
        // RAWFLUX_LOOP_ADDR & 4: the stage's offsets from the ring's start in 16-byte units (mma
        // adds them to da_ring / db_ring); else its shared addresses.
        const u32 a_base = (kLoopAddr & 4) != 0 ? st * (Cfg::kStageABytes / 16) : a_base0 + st * Cfg::kStageABytes;
        const u32 b_base = (kLoopAddr & 4) != 0 ? st * (Cfg::kStageBBytes / 16) : b_base0 + st * Cfg::kStageBBytes;
        if constexpr (kOrdered) wait_turn();
        if constexpr (kTracePhase) trace_phase(consumer, tid, i, kPhaseReady);
        // The block's wgmma group with N = nt (Int<N>), from its fence to its wait. Narrow columns
        // branch between two N around all of it: where the branches meet no wgmma may be in flight
        // (ptxas serialized every wgmma of the kernel otherwise: C7515 with the wait after the
        // branches, C7519 with a branch or a predicate per wgmma; docs/gemm-notes.md, session 28).
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
          if constexpr (kTracePhase) trace_phase(consumer, tid, i, kPhaseIssued);
          hook();
          if constexpr (kWait0) {
            ptx::wgmma_wait<0>();  // this stage's wgmma group has finished reading it
            if constexpr (kTracePhase) trace_phase(consumer, tid, i, kPhaseDone);
            if constexpr (kRefill) {
              if (lane < (u32)Cfg::kMcastSize) {  // lane l counts into CTA l's count (lane 0 alone without a cluster)
                const u32 count = bar_addr0 + 8u * (2 * kStages + 2) + 4u * st;
                counted = Cfg::kMcastSize > 1 ? ptx::atom_add_relaxed_cluster_shared(ptx::mapa_shared(count, lane), 1u)
                                              : ptx::atom_add_relaxed_cta_shared(count, 1u);
              }
            } else if constexpr ((kProbe & 64) == 0) {
              release(st);
            }
          } else {
            if constexpr (kOrdered) pass_turn();
            if (i > 0) {
              ptx::wgmma_wait<1>();  // the previous stage's wgmma group has finished reading it
              release(prev_stage);
            }
            prev_stage = st;
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
      if constexpr ((kLoopAddr & 32) != 0 && kWait0) {
        // RAWFLUX_LOOP_ADDR & 32: whole rounds of the ring with the stage a constant in each copy of
        // the body (its barrier address and descriptors fold into immediates); the generic loop
        // takes the k blocks before the ring's stage 0 comes round and those after the last round.
        for (; i < nkb && stage != 0; ++i) kblock_next(i, no_hook);
        for (; i + kStages <= nkb; i += kStages) {
#pragma unroll
          for (int s = 0; s < kStages; ++s) kblock((u32)s, phase, i + s, no_hook);
          phase ^= 1u;
        }
      }
      for (; i < nkb; ++i) kblock_next(i, no_hook);
      if constexpr (!kWait0) {
        ptx::wgmma_wait<0>();
        release(prev_stage);
      }
      ptx::reg_fence(acc);
      if (kTrace && trace_thread(128)) trace_stamp(kTraceLoopEnd);
      const u32 epi_from = kTracePhases ? trace_clock32() : 0u;
      if (kTracePhases && trace_thread(128)) trace_add_cycles(kTraceLoopCycles, tile_from, false);

      TileCoord tc;
      tc.tile_m = w.tile_m;
      tc.tile_n = w.tile_n;
      tc.row0 = w.tile_m * Cfg::kBM + (i32)wm * 64;
      tc.col0 = SchedT::col0(p, w.tile_n) + (i32)wn * Cfg::kWN;
      tc.tid = tid;
      tc.consumer = consumer;
      tc.scratch = ptx::smem_u32(smem_a) + kScratchOffset<Cfg>;  // from smem_a: no extra pointer lives across setmaxnreg
      bool do_store = w.tile_m < p.tiles_m && w.tile_n < p.tiles_n && !((kProbe & 1) && p.k_blocks > 0);
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
            Epilogue::template store_box<Cfg, decltype(j)::value>(epi, p, v, tc.row0, tc.col0, tid, consumer, tc.scratch);
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
      if (kTracePhases && trace_thread(128)) trace_add_cycles(kTraceEpiCycles, epi_from, true);
      if constexpr (Epilogue::kTileBarrier) {
        ptx::named_barrier_sync(kConsumerBarrier, 128 * Cfg::kConsumers);
        Epilogue::template tile_done<Cfg>(epi, p, tc);
      }
    }
    if constexpr (kDefer) {
      if (pending) store_held();  // the last tile's held boxes
    }
    Epilogue::template finish<Cfg>(epi, tid);
  }
  // Consumer warpgroup 0's exit: stamped here, past the role branches (inside the consumer branch
  // ptxas spilled the 128x320 tile's accumulators for it).
  if (kTrace && trace_thread(128)) trace_stamp(kTraceExit);
  if constexpr (kOrderedIssue && !kWait0 && Cfg::kConsumers == 2) {
    // Warpgroup 0 consumes warpgroup 1's last hand-over: the turn barriers end balanced. (Here,
    // outside the consumer branch: inside it, ptxas runs out of registers for the 128x320 tile
    // and serializes its wgmma, C7512.)
    if (threadIdx.x / 128 == 1) ptx::named_barrier_sync_c<kIssueBarrierBase, 128 * Cfg::kConsumers>();
  }

  if constexpr (kCluster) {
    // No CTA may exit while its peer can still arrive on its barriers or multicast into it.
    ptx::cluster_sync();
  }
}

}  // namespace rawflux
