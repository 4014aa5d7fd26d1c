// Tensor Memory Accelerator (sm_90): 2-D tiled bulk copies global -> shared, completing bytes on an
// mbarrier, optionally multicast to several CTAs of a cluster.
#pragma once
#include "rawflux/ptx/types.cuh"
#include "rawflux/ptx/mbarrier.cuh"

namespace rawflux {

// The driver's CUtensorMap: 128 opaque bytes, 64-byte aligned, built on the host by
// cuTensorMapEncodeTiled and passed by value as a __grid_constant__ kernel parameter.
struct alignas(64) TensorMap {
  u64 opaque[16];
};
static_assert(sizeof(TensorMap) == 128, "CUtensorMap is 128 bytes");

namespace ptx {

// Pulls the descriptor into the TMA unit's cache before the first copy uses it.
RAWFLUX_DEVICE void tma_prefetch_desc(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}

// Box at (c0 = inner coordinate, c1 = outer) -> dst in this CTA; bytes complete on bar.
RAWFLUX_DEVICE void tma_load_2d(void* dst, const TensorMap* map, u64* bar, i32 c0, i32 c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<u64>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// Same box, written to the same shared offset in every CTA of `cta_mask`, completing bytes on the
// barrier at bar's offset in each of them.
RAWFLUX_DEVICE void tma_load_2d_multicast(void* dst, const TensorMap* map, u64* bar, i32 c0, i32 c1, u16 cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<u64>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}

// Shared -> global: the box at (c0 = inner, c1 = outer) from shared address src_smem in this CTA,
// clipped at the tensor's bounds, in this thread's bulk async-group.
RAWFLUX_DEVICE void tma_store_2d(const TensorMap* map, u32 src_smem, i32 c0, i32 c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(reinterpret_cast<u64>(map)),
               "r"(src_smem), "r"(c0), "r"(c1)
               : "memory");
}

// Closes this thread's bulk async-group of the stores issued since the last commit.
RAWFLUX_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's bulk groups still read their shared source.
template <int kPending>
RAWFLUX_DEVICE void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Waits until all of this thread's bulk groups are complete (their global writes performed).
RAWFLUX_DEVICE void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Orders this thread's generic-proxy shared-memory writes before later async-proxy (TMA) reads.
RAWFLUX_DEVICE void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Four 8x8 b16 matrices to shared memory: lane l gives row l % 8 of matrix l / 8 at `row_addr`;
// register i holds this lane's pair (row l / 4, columns 2 (l % 4), +1) of matrix i (the mma
// accumulator layout of one n8 block, packed to 16 bits).
RAWFLUX_DEVICE void stmatrix_x4(u32 row_addr, u32 r0, u32 r1, u32 r2, u32 r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(row_addr), "r"(r0), "r"(r1), "r"(r2),
               "r"(r3)
               : "memory");
}

// 3-D box at (c0, c1, c2) -> dst in this CTA (no multicast); bytes complete on bar.
RAWFLUX_DEVICE void tma_load_3d(void* dst, const TensorMap* map, u64* bar, i32 c0, i32 c1, i32 c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<u64>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// The inverse of stmatrix_x4 with the same lane addresses: four 8x8 b16 matrices into registers.
RAWFLUX_DEVICE void ldmatrix_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

// Shared -> global: a 3-D box at (c0, c1, c2), clipped at the tensor's bounds, in this thread's bulk async-group.
RAWFLUX_DEVICE void tma_store_3d(const TensorMap* map, u32 src_smem, i32 c0, i32 c1, i32 c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(reinterpret_cast<u64>(map)),
               "r"(src_smem), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}

}  // namespace ptx
}  // namespace rawflux
