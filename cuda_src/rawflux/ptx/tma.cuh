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

}  // namespace ptx
}  // namespace rawflux
