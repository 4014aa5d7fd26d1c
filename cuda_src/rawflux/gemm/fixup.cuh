// The fix-ups that sum a tile cut in k: splitk_fixup (split-K, stream-K, the split tail, banded
// stream-K: pieces of a tile in other CTAs, through an fp32 workspace in global memory) and
// ksplit_exchange (a k-split cluster: the two k halves of one tile, through distributed shared
// memory). Both sum in split-K's order, so every split mode gives the same bits for the same cut.
#pragma once
#include "rawflux/gemm/config.cuh"
#include "rawflux/gemm/scheduler/tile.cuh"
#include "rawflux/ptx/global.cuh"
#include "rawflux/ptx/mbarrier.cuh"
#include "rawflux/ptx/sync.cuh"
#include "rawflux/ptx/tma.cuh"

namespace rawflux {

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
    for (int i = 0; i < kVec; ++i) {
      ptx::st_cg_v4f(mine + i * 512, acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
    }
  }
  if (!last) {
    fence_acq_rel_gpu();  // release: this thread's partial stores before the stored count below
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
  fence_acq_rel_gpu();  // acquire: the partials thread 0 saw stored, before this thread's reads
  // Chunk by chunk, a piece's kChunk float4 loads issued together.
  if (w.split == 0) {
#pragma unroll
    for (int i0 = 0; i0 < kVec; i0 += kChunk) {
#pragma unroll
      for (int j = 0; j < 4 * kChunk; ++j) acc[4 * i0 + j] = 0.f + acc[4 * i0 + j];  // 0 + p0, as below (-0 -> +0)
      const float* src = part + i0 * 512 + part_floats;
#pragma unroll 1
      for (i32 s = 1; s < w.splits; ++s, src += part_floats) {
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
    for (i32 s = 0; s < w.splits; ++s, src += part_floats) {
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

}  // namespace rawflux
