// GEMM-ReduceScatter (rawflux/ops/gemm_rs.py builds the name expressions): one kernel per call,
//   rawflux::gemm_kernel<GemmCfg<...>, RsSched, NoWait, RsEpilogue<kPart>>
// the engine with the owners-interleaved tile order (fused/rs_sched.cuh) and the epilogue that
// sends remote tiles to their owners and reduces the own ones (fused/rs_epilogue.cuh).
// World 1 needs neither: the op calls the plain GEMM (kernels/gemm.cu) straight into out.
#pragma once
#include "rawflux/fused/rs_epilogue.cuh"
#include "rawflux/gemm/kernel.cuh"
