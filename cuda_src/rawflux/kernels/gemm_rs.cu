// GEMM-ReduceScatter entries (rawflux/ops/gemm_rs.py builds the name expressions):
//   rawflux::gemm_kernel<GemmCfg<...>, TileSched, NoWait, ScatterStore<kPart>>   the engine, whose
//       epilogue scatters each finished tile into its owners' partial buffers and flags it;
//   rawflux::rs_reduce_kernel<kPart, kOut>                                      the owner's reduction.
// World 1 needs neither: the op calls the plain GEMM (kernels/gemm.cu) straight into out.
#pragma once
#include "rawflux/fused/rs_reduce.cuh"
#include "rawflux/fused/rs_scatter.cuh"
#include "rawflux/gemm/kernel.cuh"
