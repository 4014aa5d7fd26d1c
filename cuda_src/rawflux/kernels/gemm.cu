// Plain GEMM entry: rawflux::gemm_kernel<GemmCfg<...>, StreamKSched | NarrowSched<w>, NoWait,
// TmaStore | LocalStore>, instantiated by NVRTC from the name expression rawflux/engine builds
// (one cubin per configuration).
#pragma once
#include "rawflux/gemm/kernel.cuh"
