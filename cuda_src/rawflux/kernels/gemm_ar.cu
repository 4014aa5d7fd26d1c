// GEMM + AllReduce (rawflux/ops/gemm_ar.py builds the name expressions): one kernel per call,
//   rawflux::gemm_kernel<GemmCfg<...>, TileSched, NoWait, ArEpilogue<kPart>>
// the engine with the data-parallel tile order and the one-shot epilogue that sends every tile's
// partial to every peer and sums the W partials in a fixed order (fused/ar_epilogue.cuh).
// World 1 needs neither: the op calls the plain GEMM (kernels/gemm.cu) straight into out.
#pragma once
#include "rawflux/fused/ar_epilogue.cuh"
#include "rawflux/gemm/kernel.cuh"
