"""rawflux: tensor-parallel AllGather-GEMM, GEMM-ReduceScatter and GEMM + AllReduce fused into one kernel (FLUX).

    import rawflux
    group = rawflux.init()                                  # TP group over MPI.COMM_WORLD
    c = rawflux.gemm(a, w)                                  # a @ w.T on the sm_90a engine
    c = rawflux.ag_gemm(a_shard, w_shard, group)            # AllGather(a) @ w_shard.T
    c = rawflux.gemm_rs(a, w_shard, group)                  # this rank's rows of sum_q a_q @ w_q.T
    c = rawflux.gemm_ar(a, w_shard, group)                  # sum_q a_q @ w_q.T on every rank (decode)
    c = rawflux.baseline.ag_gemm(a_shard, w_shard, group)   # the non-overlapped reference
    mlp = rawflux.nn.TPMLP.from_llama(llama_mlp, group)     # TP layers (torch modules need torch)

Layers (imports run one way): this module -> nn -> ops -> engine -> tune -> dist / runtime -> jit -> cuda_src.
See README.md and docs/ARCHITECTURE.md.
"""
from ._version import __version__
from . import env
from .dist import CallMismatch, CollectiveTimeout, DistError, Group, current_group, finalize, init
from .jit.faults import KernelFault
from .runtime import CudaUnavailable
from .ops.gemm import gemm
from .ops.ag_gemm import AGGemm, ag_gemm
from .ops.gemm_rs import GemmRS, gemm_rs
from .ops.gemm_ar import GemmAR, gemm_ar
from . import baseline
from . import nn  # imports no framework: its torch modules load on first use

__all__ = [
    "AGGemm", "CallMismatch", "CollectiveTimeout", "CudaUnavailable", "DistError", "GemmAR", "GemmRS", "Group", "KernelFault", "__version__", "ag_gemm",
    "baseline", "current_group", "env", "finalize", "gemm", "gemm_ar", "gemm_rs", "init", "nn",
]
