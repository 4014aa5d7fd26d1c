"""rawflux.nn: tensor-parallel layers over the fused ops (Megatron-style, with sequence parallelism).

    import rawflux, rawflux.nn as tp
    group = rawflux.init(tp_comm)                                  # one node's TP group
    up = tp.ColumnParallelLinear(4096, 14336, bias=False, group=group, dtype=torch.bfloat16, device="cuda")
    down = tp.RowParallelLinear(14336, 4096, bias=False, group=group, dtype=torch.bfloat16, device="cuda")
    y = down(torch.relu(up(x_shard)))                              # x_shard: this rank's rows of the sequence
    mlp = tp.TPMLP.from_llama(hf_llama_mlp, group)                 # gate+up fused, SiLU-mul, down
    proj = tp.TPAttentionProjections.from_llama(hf_llama_attn, group)
    tp.shard_linear(linear, group, style="column" | "row")         # a TP layer from a full nn.Linear
    tp.parallelize_llama_mlp(hf_mlp, group); tp.parallelize_llama_attention(hf_attn, group)   # in place

Column parallel: forward = rawflux.ag_gemm of the sequence shard, input gradient = rawflux.gemm_rs;
row parallel: forward = rawflux.gemm_rs, input gradient = rawflux.ag_gemm (layouts and the weight
and bias gradients: rawflux.nn.functional). Without sequence parallelism (decode): GEMM, and an
all-reduce where the layer's sum crosses ranks.

Two levels: the array functions (rawflux.nn.functional: column_parallel_linear, ..._backward,
row_parallel_linear, ..._backward) take torch tensors or CuPy arrays and import no framework; the
torch modules and autograd Functions (rawflux.nn.modules) load on first use and need torch.
Layers compose with torch.distributed data parallelism across TP groups: build the TP group from
a node-local sub-communicator (rawflux.dist.tp_split) and wrap the model in DDP over the DP group.

Imports run one way: rawflux (api) -> nn -> ops; nothing below imports nn.
"""
from __future__ import annotations

from . import functional
from ._ops import clear_cache
from .functional import column_parallel_linear, column_parallel_linear_backward, row_parallel_linear, row_parallel_linear_backward

_TORCH = ("ColumnParallelLinear", "RowParallelLinear", "TPMLP", "TPAttentionProjections", "shard_linear", "parallelize_llama_mlp",
          "parallelize_llama_attention")

__all__ = ["clear_cache", "column_parallel_linear", "column_parallel_linear_backward", "functional", "row_parallel_linear",
           "row_parallel_linear_backward", *_TORCH]


def __getattr__(name: str):
    if name in _TORCH:
        import importlib

        try:
            modules = importlib.import_module(__name__ + ".modules")
        except ImportError as e:
            raise ImportError(f"rawflux.nn.{name} needs torch ({e}); the array functions in rawflux.nn.functional do not") from e
        return getattr(modules, name)
    raise AttributeError(f"module 'rawflux.nn' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_TORCH))
