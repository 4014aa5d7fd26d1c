// Plain GEMM entry: rawflux::gemm_kernel<GemmCfg<...>, TileSched, NoWait, LocalStore>, instantiated by
// NVRTC from the name expression rawflux/ops/gemm.py builds (one cubin per configuration).
#pragma once
#include "rawflux/gemm/mainloop_sm90.cuh"
#include "rawflux/gemm/policies.cuh"
