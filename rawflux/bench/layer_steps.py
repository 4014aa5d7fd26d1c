"""The layer op's steps in torch (rawflux.bench.layer times them): one block, three ways of running
its tensor-parallel linear layers, and the error the correctness guard measures.

The block, on this rank's rows x (sequence parallel) or the whole batch x (decode):

    q, k, v = qkv(x)                        column parallel (this rank's heads)
    h = x + o(mix(q, k, v))                 row parallel; mix stands in for attention
    gate, up = gate_up(h)                   column parallel (gate and up in one weight)
    y = h + down(silu(gate) * up)           row parallel

mix(q, k, v) = q + k * v, broadcast over the query heads of each KV head: elementwise, of the
o_proj input's shape, and every projection gets a gradient. What is timed is the linear layers
and their communication, not attention.

Ways (``build``):
  rawflux         rawflux.nn's TPAttentionProjections and TPMLP (fused ag_gemm / gemm_rs; without
                  sequence parallelism rawflux.gemm, the row layers' partials all-reduced in fp32)
  nonoverlap      Megatron-style layers, each collective then its GEMM (or the GEMM then its
                  collective), one after the other on one stream: rawflux.baseline's ag_gemm /
                  gemm_rs (NCCL + cuBLAS; the ipc backend where ranks share a GPU); without
                  sequence parallelism a GEMM and an all-reduce in the input dtype
  torch_async_tp  torch SymmetricMemory's fused_all_gather_matmul / fused_matmul_reduce_scatter
                  in the same places (sequence parallel only)
Every way holds the gathered input of a column layer from its forward for the weight gradient
(async-TP's op returns it anyway), so all three move the same bytes. Megatron's own backward
overlaps the re-gather and the reduce-scatter with independent GEMMs; the reference here overlaps
nothing, which is what "non-overlapped" means. The three share the rawflux modules' weight tensors.

The collectives are reached through this module's names (base_ag_gemm, base_gemm_rs, all_reduce,
symm_ag, symm_rs), so the CPU tests play them with references.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as TF

WAYS = ("rawflux", "nonoverlap", "torch_async_tp")


# --------------------------------------------------------------------------------------------
# the collectives + GEMMs below the reference and async-TP layers


def base_ag_gemm(x, w, group, layout, gathered=None):
    from .. import baseline

    return baseline.ag_gemm(x, w, group, b_layout=layout, gathered_out=gathered)


def base_gemm_rs(x, w, group, layout):
    from .. import baseline

    return baseline.gemm_rs(x, w, group, b_layout=layout)


def all_reduce(t, group):
    from ..nn import _ops  # NCCL on the group's communicator, or the symmetric buffers where NCCL refuses

    return _ops.all_reduce(t, group)


def symm_ag(a, b, name):
    """(gathered a, gathered a @ b)."""
    full, (out,) = torch.ops.symm_mem.fused_all_gather_matmul(a, [b], 0, name)
    return full, out


def symm_rs(a, b, name):
    return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, name)


def _on(t):
    """CuPy's current device is per thread, and autograd runs a CUDA backward on a thread of its
    own: the baseline's CuPy and NCCL calls there must see t's device."""
    if not t.is_cuda:
        return contextlib.nullcontext()
    import cupy

    return cupy.cuda.Device(t.device.index)


# --------------------------------------------------------------------------------------------
# the reference (Megatron-style, non-overlapped) layers


class _ColSP(torch.autograd.Function):
    """Column parallel, sequence parallel: all-gather x, then x_full @ w^T."""

    @staticmethod
    def forward(ctx, x, w, group, keep):
        gathered = x.new_empty((x.shape[0] * group.world, x.shape[1])) if keep else None
        y = base_ag_gemm(x, w, group, "nk", gathered)
        ctx.group = group
        ctx.save_for_backward(gathered, w)
        return y

    @staticmethod
    def backward(ctx, dy):
        full, w = ctx.saved_tensors
        dy = dy.contiguous()
        with _on(dy):
            dx = base_gemm_rs(dy, w, ctx.group, "kn") if ctx.needs_input_grad[0] else None
        return dx, dy.t() @ full if full is not None else None, None, None


class _RowSP(torch.autograd.Function):
    """Row parallel, sequence parallel: x @ w^T, then reduce-scatter."""

    @staticmethod
    def forward(ctx, x, w, group):
        ctx.group = group
        ctx.save_for_backward(x, w)
        return base_gemm_rs(x, w, group, "nk")

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dy = dy.contiguous()
        full = dy.new_empty((dy.shape[0] * ctx.group.world, dy.shape[1]))
        with _on(dy):
            dx = base_ag_gemm(dy, w, ctx.group, "kn", full)
        return dx, full.t() @ x, None


class _ColAR(torch.autograd.Function):
    """Column parallel without sequence parallelism: x @ w^T; the input gradient all-reduced."""

    @staticmethod
    def forward(ctx, x, w, group):
        ctx.group = group
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        with _on(dy):
            dx = all_reduce((dy @ w).contiguous(), ctx.group)
        return dx, dy.t() @ x, None


class _RowAR(torch.autograd.Function):
    """Row parallel without sequence parallelism: x @ w^T, then all-reduce."""

    @staticmethod
    def forward(ctx, x, w, group):
        ctx.save_for_backward(x, w)
        return all_reduce((x @ w.t()).contiguous(), group)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return dy @ w, dy.t() @ x, None


# --------------------------------------------------------------------------------------------
# torch async-TP layers


class _ColSymm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, name):
        full, y = symm_ag(x.contiguous(), w.t(), name)
        ctx.name = name
        ctx.save_for_backward(full, w)
        return y

    @staticmethod
    def backward(ctx, dy):
        full, w = ctx.saved_tensors
        dy = dy.contiguous()
        return symm_rs(dy, w, ctx.name), dy.t() @ full, None


class _RowSymm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, name):
        ctx.name = name
        ctx.save_for_backward(x, w)
        return symm_rs(x.contiguous(), w.t(), ctx.name)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        full, dx = symm_ag(dy.contiguous(), w, ctx.name)
        return dx, full.t() @ x, None


# --------------------------------------------------------------------------------------------
# the block


def mix(q, k, v, head_dim: int):
    """q + k * v over each KV head's query heads: (rows, heads * head_dim), like attention's output."""
    rows, kv = q.shape[0], k.shape[1] // head_dim
    return (q.reshape(rows, kv, -1, head_dim) + (k * v).reshape(rows, kv, 1, head_dim)).reshape(rows, -1)


def weights(proj, mlp) -> list:
    """The block's four weight shards, in the order the training step's gradients come back."""
    return [proj.qkv.weight, proj.out.weight, mlp.gate_up.weight, mlp.down.weight]


def build(way: str, proj, mlp, group, *, sequence_parallel: bool = True, symm_name=None):
    """block(x) -> y for one way, over the weights of rawflux.nn modules ``proj``
    (TPAttentionProjections) and ``mlp`` (TPMLP) built with the same sequence_parallel."""
    if way not in WAYS:
        raise ValueError(f"way {way!r}: one of {WAYS}")
    if way == "torch_async_tp" and not sequence_parallel:
        raise ValueError("torch async-TP fuses AllGather-matmul and matmul-ReduceScatter: sequence parallel only")
    hd = proj.head_dim
    if way == "rawflux":
        def block(x):
            h = x + proj(x, lambda q, k, v: mix(q, k, v, hd))
            return h + mlp(h)

        return block
    w_qkv, w_o, w_gu, w_down = weights(proj, mlp)
    if way == "nonoverlap":
        if sequence_parallel:
            def col(x, w):
                return _ColSP.apply(x, w, group, torch.is_grad_enabled() and w.requires_grad)

            def row(x, w):
                return _RowSP.apply(x, w, group)
        else:
            def col(x, w):
                return _ColAR.apply(x, w, group)

            def row(x, w):
                return _RowAR.apply(x, w, group)
    else:
        def col(x, w):
            return _ColSymm.apply(x, w, symm_name)

        def row(x, w):
            return _RowSymm.apply(x, w, symm_name)
    split = [proj.q_local, proj.kv_local, proj.kv_local]

    def block(x):
        q, k, v = col(x, w_qkv).split(split, dim=-1)
        h = x + row(mix(q, k, v, hd), w_o)
        gate, up = col(h, w_gu).chunk(2, dim=-1)
        return h + row(TF.silu(gate) * up, w_down)

    return block


def step_fn(block, train: bool, xs, dys, params):
    """step(i) -> (y,) forward only, or (y, dx, dW...) forward + backward on input set i. The
    training step returns gradients instead of accumulating them in .grad."""
    if train:
        def step(i):
            y = block(xs[i])
            return (y, *torch.autograd.grad(y, [xs[i], *params], dys[i]))
    else:
        def step(i):
            with torch.no_grad():
                return (block(xs[i]),)
    return step


OUTPUTS = ("output", "dx", "dW qkv", "dW o", "dW gate_up", "dW down")


def rel_errors(got, ref) -> dict:
    """{name: |got - ref| / |ref|} (Frobenius, fp32) of two steps' results (NaN where any is)."""
    out = {}
    for name, g, r in zip(OUTPUTS, got, ref):
        g, r = g.detach().float(), r.detach().float()
        num, den = float(torch.linalg.vector_norm(g - r)), float(torch.linalg.vector_norm(r))
        out[name] = num / den if den > 0 else num
    return out
