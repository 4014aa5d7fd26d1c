// Call-metadata kernels shared by the fused collectives (rawflux/ops/_collective.py): publish this
// rank's record of a call, and compare every peer's record with it (fused/ag_meta.cuh).
#pragma once

#include "rawflux/fused/ag_meta.cuh"

namespace rawflux {

// grid 1, block 32: thread 0 writes the record (ahead: barriers still to come before the check).
__global__ void __launch_bounds__(32) meta_publish_kernel(const GroupCtrl* g, u32* own_meta, u32 op, MetaFields f,
                                                          u32 ahead) {
  if (threadIdx.x == 0) meta_publish(g, own_meta, op, f, ahead);
}

// grid 1, block 64 (>= world, kMaxWorld): after the call's last barrier.
__global__ void __launch_bounds__(64) meta_check_kernel(const GroupCtrl* g, const u64* meta_peers, u32 op) {
  meta_check_cta(g, meta_peers, op);
}

}  // namespace rawflux
