// Entry points of rawflux.dist: the group barrier, and the self-test kernels rawflux.dist.selftest
// uses to prove that symmetric buffers and the barrier's ordering work across processes.
#pragma once

#include "rawflux/comm/barrier.cuh"
#include "rawflux/comm/signal.cuh"

namespace rawflux {

enum : int { kBarrierMaxThreads = 64 };  // one thread per rank (kMaxWorld), one CTA

// Group barrier: launch with grid 1, block min(64, 32 * ceil(world / 32)). Its only argument is
// a pointer, so a captured graph replays it correctly (the epoch lives in device memory).
__global__ void __launch_bounds__(kBarrierMaxThreads) barrier_kernel(const GroupCtrl* g) {
  group_barrier_cta(g);
}

// The value rank `src` writes at word i of its slot in rank `dst`'s buffer (a 32-bit mix, so a
// misplaced or stale word is never mistaken for a right one).
RAWFLUX_DEVICE u32 selftest_pattern(u32 seed, u32 src, u32 dst, u32 i) {
  u32 h = seed ^ (src * 0x9E3779B1u) ^ (dst * 0x85EBCA77u) ^ (i * 0xC2B2AE3Du);
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  h *= 0x297A2D39u;
  h ^= h >> 15;
  return h;
}

// Rank `rank` writes its slot (slot_words u32 words at rank * slot_words) of every rank's buffer
// through the peer table.
__global__ void selftest_fill_kernel(const u64* peers, u32 slot_words, i32 rank, i32 world, u32 seed) {
  const u32 stride = gridDim.x * blockDim.x;
  for (i32 q = 0; q < world; ++q) {
    u32* dst = peer_ptr<u32>(peers, q, 4ull * static_cast<u64>(rank) * slot_words);
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < slot_words; i += stride)
      dst[i] = selftest_pattern(seed, static_cast<u32>(rank), static_cast<u32>(q), i);
  }
}

// Count words of this rank's buffer that differ from what every rank should have written.
__global__ void selftest_verify_kernel(const u32* buf, u32 slot_words, i32 rank, i32 world, u32 seed,
                                       u32* mismatches) {
  const u32 stride = gridDim.x * blockDim.x;
  u32 bad = 0;
  for (i32 src = 0; src < world; ++src)
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < slot_words; i += stride)
      bad += buf[static_cast<u64>(src) * slot_words + i] !=
             selftest_pattern(seed, static_cast<u32>(src), static_cast<u32>(rank), i);
  if (bad) atomicAdd(mismatches, bad);
}

// Exercise the generic bounded wait (the one fused kernels use): the CTA waits until
// *flag >= target, as if `peer` had to signal flag `index` of self-test call `call_id`.
__global__ void selftest_wait_kernel(const GroupCtrl* g, const u32* flag, u32 target, i32 peer, i32 index,
                                     u32 call_id) {
  const WaitCtx c = make_wait_ctx(g, kOpSelfTest, call_id);
  cta_wait_flag_geq(flag, target, c, peer, index);
}

}  // namespace rawflux
