// AllGather-GEMM entries (rawflux/ops/ag_gemm.py):
//   rawflux::gemm_kernel<GemmCfg<...>, TileSched, AgWait, LocalStore>   the GEMM, waiting per chunk
//   rawflux::ag_local_kernel   own shard -> own gathered rows, + the call's metadata record
//   rawflux::ag_copy_kernel    the SM copy path (push or pull), bounded grid
// and the metadata check shared with the other fused ops (kernels/ag_meta.cu).
#pragma once

#include "rawflux/fused/ag_gemm.cuh"
#include "rawflux/gemm/kernel.cuh"

namespace rawflux {

// Any grid (the host sizes it to the shard), block 256.
__global__ void __launch_bounds__(256) ag_local_kernel(const AgLocalArgs a, const MetaFields f) { ag_local_body(a, f); }

// grid = the SMs set aside for copying (the GEMM gets the rest), block 512.
__global__ void __launch_bounds__(512) ag_copy_kernel(const AgCopyArgs a) { ag_copy_body(a); }

}  // namespace rawflux
