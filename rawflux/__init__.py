"""rawflux: tensor-parallel AllGather-GEMM and GEMM-ReduceScatter fused into one kernel (FLUX).

The public API lives here; see README.md. Integration in progress: exports are added as the
layers land.
"""
from ._version import __version__
from . import env
from . import baseline  # noqa: F401  (rawflux.baseline.ag_gemm / gemm_rs: the non-overlapped NCCL + cuBLAS reference)

__all__ = ["__version__", "env"]
from .ops.ag_gemm import AGGemm, ag_gemm  # noqa: F401,E402  (fused AllGather-GEMM: op object + functional form)
from .ops.gemm_rs import GemmRS, gemm_rs  # noqa: F401,E402  (fused GEMM-ReduceScatter: op object + functional form)
from .ops.gemm import gemm  # noqa: F401,E402  (rawflux.gemm: the sm_90a GEMM engine, C = A @ B^T or A @ B)
