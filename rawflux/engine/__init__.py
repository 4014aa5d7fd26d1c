"""The GEMM engine's host side: what every op that launches gemm_kernel uses.

    abi      type codes, parameter layouts, policy names, kernel names and pipeline options
    planning GemmPlan and plan(): one variant on one problem, validated and sized once; pick_config
    launch   tensor maps, epilogue parameters, the lean launch path, the split-K workspace

The plain GEMM (rawflux.ops.gemm) and the fused ops (ops.ag_gemm, ops.gemm_rs) differ only in the
policies and kernel file they plan with.
"""
from .abi import (BIAS_F32, BIAS_IN16, BIAS_NONE, FUSED_SCHED, GEMM_PARAMS, LOCAL_STORE, LOCAL_STORE_EPI, NOWAIT, NOWAIT_PARAMS,
                  PLAIN_SCHED, TMA_STORE_EPI, TMA_STORE_TAIL, KernelOptions, bias_args, check_options, epilogue_scratch_bytes, kernel_name, kernel_options,
                  launch_smem_bytes, local_store_params, narrow_sched, out_dtypes_for, plain_epilogue, register_variants,
                  scratch_offset)
from .launch import LaunchBlock, epilogue_params, launch, tensor_map, tma_store_params, workspace
from .planning import BoundGemm, GemmPlan, check_arch, check_config, gemm_params, grid_size, pack_params, pick_config, plan

__all__ = [
    "BIAS_F32", "BoundGemm", "LaunchBlock", "BIAS_IN16", "BIAS_NONE", "FUSED_SCHED", "GEMM_PARAMS", "GemmPlan", "KernelOptions", "LOCAL_STORE", "LOCAL_STORE_EPI",
    "NOWAIT", "NOWAIT_PARAMS", "PLAIN_SCHED", "TMA_STORE_EPI", "TMA_STORE_TAIL", "bias_args", "check_arch", "check_options", "check_config", "epilogue_params",
    "epilogue_scratch_bytes", "gemm_params", "grid_size", "kernel_name", "kernel_options", "launch", "launch_smem_bytes",
    "local_store_params", "narrow_sched", "out_dtypes_for", "pack_params", "pick_config", "plain_epilogue", "plan",
    "register_variants", "scratch_offset", "tensor_map", "tma_store_params", "workspace",
]
