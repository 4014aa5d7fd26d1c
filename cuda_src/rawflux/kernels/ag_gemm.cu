// AllGather-GEMM entries (rawflux/ops/ag_gemm.py):
//   rawflux::gemm_kernel<GemmCfg<...>, StreamKSched | NarrowSched<w> (B (n, k)) | TileSched (B (k, n)),
//                        AgWait, TmaStore | LocalStore>   the GEMM, waiting per chunk or k-slab
//   rawflux::ag_local_kernel   the call's start: epoch, call record, own rows, arrival (copy-engine
//                              path: then the peers' arrivals and records)
//   rawflux::ag_copy_kernel    the SM copy path (push or pull), bounded grid
#pragma once

#include "rawflux/fused/ag_gemm.cuh"
#include "rawflux/gemm/kernel.cuh"

namespace rawflux {

// Any grid (the host sizes it to the shard), block 256.
__global__ void __launch_bounds__(256) ag_local_kernel(const AgLocalArgs a, const __grid_constant__ CallRecord rec) { ag_local_body(a, rec); }

// grid = the SMs set aside for copying (the GEMM gets the rest), block 512.
__global__ void __launch_bounds__(512) ag_copy_kernel(const AgCopyArgs a) { ag_copy_body(a); }

}  // namespace rawflux
