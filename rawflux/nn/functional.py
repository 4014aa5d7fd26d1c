"""Tensor-parallel linear layers as functions over device arrays (torch tensors or CuPy arrays),
forward and backward, with no autograd and no torch import: rawflux.nn's torch modules are these
functions inside torch.autograd.Function, and another framework can wrap them the same way.

Notation (rank r of W; a linear layer is y = x @ w^T + b with w of shape (out, in)):

  column parallel  w_r = rows r*out/W.. of w: (out/W, in), bias b_r: (out/W,)
    sequence parallel  x_r (m/W, in), this rank's rows   ->  y_r = AllGather(x) @ w_r^T + b_r: (m, out/W)
                       backward: dx_r = ReduceScatter(dy_r @ w_r) (gemm_rs with w_r as its "kn" b: no
                       transposed copy); dw_r = dy_r^T @ AllGather(x); db_r = sum of dy_r's rows
    no sequence par.   x (m, in) on every rank          ->  y_r = x @ w_r^T + b_r
                       backward: dx = AllReduce(dy_r @ w_r)
  row parallel     w_r = columns r*in/W.. of w: (out, in/W), bias b: (out,) on every rank
    sequence parallel  x_r (m, in/W)                    ->  y_r = rows r*m/W.. of sum_q x_q @ w_q^T + b: (m/W, out)
                       backward: dx_r = AllGather(dy) @ w_r (ag_gemm, "kn"); dw_r = AllGather(dy)^T @ x_r
                       and db = sum of AllGather(dy)'s rows, from the gathered dy that call returns
    no sequence par.   (decode)                         ->  y = AllReduce(x_r @ w_r^T) + b: (m, out) on every rank
                       backward: dx_r = dy @ w_r, dw_r = dy^T @ x_r, db = sum of dy's rows

Rows are gathered rank-major: AllGather(x) = [x_0; x_1; ...]. Without sequence parallelism the
partial products are reduced in fp32 and rounded once (a decode step's m is small: the bytes do
not matter, the roundings would): rawflux.gemm_ar with fp32 partials, one kernel, or with ``pg``
the GEMM and torch.distributed's all-reduce. Weight and bias gradients are plain matmuls and sums in the
arrays' own framework. Every function issues its work on the caller's stream (torch's current
stream for torch tensors) and never waits for the device.
"""
from __future__ import annotations

from ..ops._collective import resolve_group
from . import _ops

__all__ = ["column_parallel_linear", "column_parallel_linear_backward", "row_parallel_linear", "row_parallel_linear_backward"]


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _cast(x, like_dtype):
    return x.to(like_dtype) if _is_torch(x) else x.astype(like_dtype, copy=False)


def _empty(like, shape):
    if _is_torch(like):
        return like.new_empty(shape)
    import importlib

    xp = importlib.import_module(type(like).__module__.split(".")[0])
    return xp.empty(shape, dtype=like.dtype)


def _check(fn: str, x, weight) -> None:
    if len(x.shape) != 2 or len(weight.shape) != 2:
        raise ValueError(f"{fn}: x and weight must be 2-D, got shapes {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"{fn}: x is {tuple(x.shape)} but weight is {tuple(weight.shape)}: x's columns must equal "
                         "weight's (the layer's local in_features)")


def _reduced(part, group, dtype, bias=None, pg=None):
    """AllReduce of an fp32 partial, plus bias, rounded once to ``dtype``."""
    _ops.all_reduce(part, group, pg=pg)
    if bias is not None:
        part += _cast(bias, part.dtype)
    return _cast(part, dtype)


def column_parallel_linear(x, weight, bias=None, group=None, *, sequence_parallel=True, keep_gathered=False, max_m=None):
    """Forward of a column-parallel linear layer (see the module docstring). Returns (y, kept):
    ``kept`` is the gathered input (m, in) to hand to the backward when keep_gathered (a copy of
    its own; x itself at world 1 or without sequence parallelism), else None."""
    g = resolve_group(group)
    _check("column_parallel_linear", x, weight)
    if not sequence_parallel:
        return _ops.gemm(x, weight, bias=bias), (x if keep_gathered else None)
    if keep_gathered and g.world > 1:
        kept = _empty(x, (x.shape[0] * g.world, x.shape[1]))
        return _ops.ag_gemm(x, weight, g, bias=bias, gathered_out=kept, return_gathered=True, max_m=max_m)
    return _ops.ag_gemm(x, weight, g, bias=bias, max_m=max_m), (x if keep_gathered else None)


def column_parallel_linear_backward(grad_out, x, weight, group=None, *, gathered=None, sequence_parallel=True,
                                    needs=(True, True, True), max_m=None, partials=None, pg=None):
    """(dx, dw, db) of column_parallel_linear; an entry is None where ``needs`` (input, weight,
    bias) says False. grad_out (m, out/W) dense row-major; ``gathered``: the forward's kept input,
    else the input is gathered again (sequence parallel) through ag_gemm."""
    g = resolve_group(group)
    need_x, need_w, need_b = needs
    dx = dw = db = None
    if need_w:
        full = x if not sequence_parallel else (gathered if gathered is not None else _ops.gather(x, g, max_m=max_m))
        dw = grad_out.T @ full  # before any other gather: a gathered view lives until the next one
    if need_b:
        db = grad_out.sum(0)
    if need_x:
        if sequence_parallel:
            dx = _ops.gemm_rs(grad_out, weight, g, b_layout="kn", partials=partials, max_m=max_m)
        elif g.world == 1:
            dx = _ops.gemm(grad_out, weight, b_layout="kn")
        elif pg is None:
            dx = _ops.gemm_ar(grad_out, weight, g, b_layout="kn", max_m=max_m)
        else:
            dx = _reduced(_ops.gemm(grad_out, weight, b_layout="kn", out_dtype="f32"), g, grad_out.dtype, pg=pg)
    return dx, dw, db


def row_parallel_linear(x, weight, bias=None, group=None, *, sequence_parallel=True, max_m=None, partials=None, pg=None):
    """Forward of a row-parallel linear layer (see the module docstring): (m/W, out) with
    sequence parallelism, else (m, out) on every rank (GEMM + all-reduce)."""
    g = resolve_group(group)
    _check("row_parallel_linear", x, weight)
    if sequence_parallel:
        if x.shape[0] % g.world:
            raise ValueError(f"row_parallel_linear: x has m = {x.shape[0]} rows, not divisible by the world size W = {g.world}: "
                             "with sequence parallelism each rank gets m/W rows of the output")
        return _ops.gemm_rs(x, weight, g, bias=bias, partials=partials, max_m=max_m)
    if g.world == 1:
        return _ops.gemm(x, weight, bias=bias)
    if pg is None:
        return _ops.gemm_ar(x, weight, g, bias=bias, max_m=max_m)
    return _reduced(_ops.gemm(x, weight, out_dtype="f32"), g, x.dtype, bias, pg=pg)


def row_parallel_linear_backward(grad_out, x, weight, group=None, *, sequence_parallel=True, needs=(True, True, True),
                                 max_m=None):
    """(dx, dw, db) of row_parallel_linear; None where ``needs`` says False. grad_out: (m/W, out)
    with sequence parallelism, else (m, out), dense row-major."""
    g = resolve_group(group)
    need_x, need_w, need_b = needs
    dx = dw = db = None
    if not sequence_parallel:
        full = grad_out
        if need_x:
            dx = _ops.gemm(grad_out, weight, b_layout="kn")
    elif need_x:
        dx, full = _ops.ag_gemm(grad_out, weight, g, b_layout="kn", return_gathered=True, max_m=max_m)
    elif need_w or need_b:
        full = _ops.gather(grad_out, g, max_m=max_m)
    # ``full`` may be the gather's own buffer: both uses come before any other call of that op
    if need_w:
        dw = full.T @ x
    if need_b:
        db = full.sum(0)
    return dx, dw, db
