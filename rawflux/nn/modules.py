"""torch modules over rawflux.nn.functional: column- and row-parallel linear layers with their
autograd Functions, a Llama MLP block, attention projections, and helpers that shard an existing
torch.nn.Linear or a Hugging Face LlamaMLP / LlamaAttention-shaped module.

Each layer holds this rank's shard of the full weight (see rawflux.nn.functional for the
layouts). The autograd Functions run on torch's current stream, make no host synchronisation and
allocate only through torch's caching allocator, so a forward + backward step can be captured in
a CUDA graph once a step at the largest m has run (the fused op objects are sized then; pass
``max_m`` to size them once for every m up to it). Inputs may have leading dimensions: every
dimension but the last counts as rows, and with sequence parallelism the first one is the
sharded one (a column layer's output has W times as many, a row layer's W times fewer).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as TF

from ..ops._collective import resolve_group
from . import _ops
from . import functional as F

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "TPMLP", "TPAttentionProjections", "shard_linear",
           "parallelize_llama_mlp", "parallelize_llama_attention"]


# --------------------------------------------------------------------------------------------
# shape rules


def split_dim(owner: str, name: str, size: int, world: int) -> int:
    """size / W, or a ValueError naming the dimension and W."""
    if size % world:
        raise ValueError(f"{owner}: {name} = {size} is not divisible by the world size W = {world}: each rank holds "
                         f"{name} / W of it")
    return size // world


def _rows8(owner: str, what: str, size: int) -> None:
    if size % 8:
        raise ValueError(f"{owner}: {what} = {size} must be a multiple of 8: the fused kernels move 16-byte rows")


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A row-major tensor whose data starts 16-byte aligned (what the kernels' loads need)."""
    t = t.contiguous()
    return t.clone() if t.data_ptr() % 16 else t


class _Shared:
    """Holds what a copy of a layer must share, not copy (the group, a process group): deepcopy of
    a model (an EMA copy, a checkpoint helper) keeps the one communicator."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __deepcopy__(self, memo):
        return self


@dataclass(frozen=True)
class _Cfg:
    group: object
    sequence_parallel: bool
    keep_gathered: bool
    max_m: int | None
    partials: str | None
    pg: object


# --------------------------------------------------------------------------------------------
# autograd


def _device(t: torch.Tensor):
    """CuPy's current device is per thread, and the autograd engine runs a CUDA backward on a
    thread of its own (where it is device 0): the ops' CuPy calls must see t's device."""
    if not t.is_cuda:
        return contextlib.nullcontext()
    import cupy

    return cupy.cuda.Device(t.device.index)


class _ColumnFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, cfg: _Cfg):
        nx, nw, nb = ctx.needs_input_grad[:3]
        with _device(x):
            y, kept = F.column_parallel_linear(x, weight, bias, cfg.group, sequence_parallel=cfg.sequence_parallel,
                                               keep_gathered=cfg.keep_gathered, max_m=cfg.max_m)
            if cfg.sequence_parallel and (nx or nw):
                _ops.reserve(x, cfg.group, x.shape[0] * cfg.group.world, max_m=cfg.max_m,
                             rs=(weight.shape[1], weight.shape[0], "kn", cfg.partials) if nx else None,
                             gather_k=x.shape[1] if nw and kept is None else None)
            elif nx and cfg.pg is None and cfg.group.world > 1:  # the backward's GEMM + AllReduce of dx
                _ops.reserve(x, cfg.group, x.shape[0], max_m=cfg.max_m, ar=(weight.shape[1], weight.shape[0], "kn"))
        ctx.cfg, ctx.has_bias = cfg, bias is not None
        ctx.save_for_backward(x, weight, kept)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, kept = ctx.saved_tensors
        cfg = ctx.cfg
        nx, nw, nb = ctx.needs_input_grad[:3]
        with _device(grad_out):
            dx, dw, db = F.column_parallel_linear_backward(
                _dense(grad_out), x, weight, cfg.group, gathered=kept, sequence_parallel=cfg.sequence_parallel,
                needs=(nx, nw, nb and ctx.has_bias), max_m=cfg.max_m, partials=cfg.partials, pg=cfg.pg)
        return dx, dw, db, None


class _RowFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, cfg: _Cfg):
        nx, nw, nb = ctx.needs_input_grad[:3]
        with _device(x):
            y = F.row_parallel_linear(x, weight, bias, cfg.group, sequence_parallel=cfg.sequence_parallel, max_m=cfg.max_m,
                                      partials=cfg.partials, pg=cfg.pg)
            if cfg.sequence_parallel and (nx or nw or (nb and bias is not None)):
                _ops.reserve(x, cfg.group, x.shape[0], max_m=cfg.max_m, ag=(weight.shape[1], weight.shape[0], "kn") if nx else None,
                             gather_k=None if nx else weight.shape[0])
        ctx.cfg, ctx.has_bias = cfg, bias is not None
        ctx.save_for_backward(x, weight)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        cfg = ctx.cfg
        nx, nw, nb = ctx.needs_input_grad[:3]
        with _device(grad_out):
            dx, dw, db = F.row_parallel_linear_backward(_dense(grad_out), x, weight, cfg.group,
                                                        sequence_parallel=cfg.sequence_parallel,
                                                        needs=(nx, nw, nb and ctx.has_bias), max_m=cfg.max_m)
        return dx, dw, db, None


# --------------------------------------------------------------------------------------------
# layers


class _ParallelLinear(torch.nn.Module):
    OWNER = ""

    def __init__(self, in_features: int, out_features: int, w_shape, b_size: int, bias: bool, group, sequence_parallel: bool,
                 keep_gathered: bool, max_m, partials, pg, device, dtype):
        super().__init__()
        self._group, self._pg = _Shared(group), _Shared(pg)
        self.world, self.rank = group.world, group.rank
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.sequence_parallel, self.keep_gathered = bool(sequence_parallel), bool(keep_gathered)
        self.max_m, self.partials = max_m, partials
        kw = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(w_shape, **kw))
        self.bias = torch.nn.Parameter(torch.empty(b_size, **kw)) if bias else None
        self.reset_parameters()

    @property
    def group(self):
        return self._group.value

    @property
    def pg(self):
        return self._pg.value

    def reset_parameters(self) -> None:
        """torch.nn.Linear's weight distribution (uniform, bound 1/sqrt(full in_features)) on this
        shard; bias zero (the same on every rank, which a replicated bias needs)."""
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.zero_()

    def _cfg(self, keep: bool) -> _Cfg:
        return _Cfg(self.group, self.sequence_parallel, keep, self.max_m, self.partials, self.pg)

    def _rows(self, x: torch.Tensor, features: int) -> torch.Tensor:
        if x.shape[-1:] != (features,):
            raise ValueError(f"{self.OWNER}: the input's last dimension is {tuple(x.shape)[-1:]}, expected {features} "
                             f"(this rank's in_features)")
        if self.sequence_parallel and x.dim() < 2:
            raise ValueError(f"{self.OWNER}: with sequence parallelism the input needs a row dimension, got shape {tuple(x.shape)}")
        return _dense(x.reshape(-1, features))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"rank={self.rank}/{self.world}, sequence_parallel={self.sequence_parallel}")


class ColumnParallelLinear(_ParallelLinear):
    """y = x @ W^T + b with W split by output features: this rank holds rows r*out/W.. of W, its
    output is the matching out/W columns. With sequence parallelism (default) the input is this
    rank's rows of the sequence and the layer gathers them (rawflux.ag_gemm); without it, every rank
    passes the whole input (decode).

    keep_gathered: keep the gathered input from the forward for the weight gradient (m x in per
    layer held until the backward) instead of gathering it again there.
    max_m: the most rows (all ranks together) any call has; sizes the fused ops once.
    partials: gemm_rs's partial type in the backward ("fp32": twice the bytes, one rounding fewer).
    pg: a torch.distributed process group of the TP ranks for the all-reduce without sequence
    parallelism (default: the group's NCCL communicator)."""

    OWNER = "ColumnParallelLinear"

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group=None, *, sequence_parallel: bool = True,
                 keep_gathered: bool = False, max_m: int | None = None, partials: str | None = None, pg=None,
                 device=None, dtype=None):
        g = resolve_group(group)
        local = split_dim(self.OWNER, "out_features", out_features, g.world)
        _rows8(self.OWNER, "in_features", in_features)
        _rows8(self.OWNER, f"out_features / W ({out_features} / {g.world})", local)
        super().__init__(in_features, out_features, (local, in_features), local, bias, g, sequence_parallel, keep_gathered, max_m,
                         partials, pg, device, dtype)
        self.out_local = local

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        keep = self.keep_gathered and torch.is_grad_enabled() and self.weight.requires_grad
        y = _ColumnFn.apply(self._rows(x, self.in_features), self.weight, self.bias, self._cfg(keep))
        if self.sequence_parallel:
            lead = (lead[0] * self.world,) + tuple(lead[1:])
        return y.reshape(*lead, self.out_local)


class RowParallelLinear(_ParallelLinear):
    """y = x @ W^T + b with W split by input features: this rank holds columns r*in/W.. of W and
    takes the matching in/W columns of the input (a column-parallel layer's output). With sequence
    parallelism (default) the result is reduce-scattered (rawflux.gemm_rs): this rank gets rows
    r*m/W.. of y; without it (decode) every rank gets all of y (GEMM + all-reduce in fp32). The
    bias is whole on every rank and added once. max_m, partials, pg: as ColumnParallelLinear."""

    OWNER = "RowParallelLinear"

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group=None, *, sequence_parallel: bool = True,
                 max_m: int | None = None, partials: str | None = None, pg=None, device=None, dtype=None):
        g = resolve_group(group)
        local = split_dim(self.OWNER, "in_features", in_features, g.world)
        _rows8(self.OWNER, f"in_features / W ({in_features} / {g.world})", local)
        _rows8(self.OWNER, "out_features", out_features)
        super().__init__(in_features, out_features, (out_features, local), out_features, bias, g, sequence_parallel, False, max_m,
                         partials, pg, device, dtype)
        self.in_local = local

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        if self.sequence_parallel:
            if len(lead) > 1 and lead[0] % self.world:
                raise ValueError(f"{self.OWNER}: the input's first dimension {lead[0]} is not divisible by the world size "
                                 f"W = {self.world}: with sequence parallelism each rank gets 1/W of it")
            lead = (lead[0] // self.world,) + tuple(lead[1:]) if len(lead) > 1 else (-1,)
        y = _RowFn.apply(self._rows(x, self.in_local), self.weight, self.bias, self._cfg(False))
        return y.reshape(*lead, self.out_features)


def shard_linear(linear: torch.nn.Linear, group=None, style: str = "column", **kw):
    """A ColumnParallelLinear (style="column") or RowParallelLinear ("row") holding this rank's
    slice of ``linear``'s weight and bias, on its device and dtype. ``kw``: the layer's options."""
    g = resolve_group(group)
    if not isinstance(linear, torch.nn.Linear):
        raise TypeError(f"shard_linear takes a torch.nn.Linear, got {type(linear).__name__}")
    w, b = linear.weight, linear.bias
    fac = {"device": w.device, "dtype": w.dtype}
    r = g.rank
    if style == "column":
        layer = ColumnParallelLinear(linear.in_features, linear.out_features, b is not None, g, **kw, **fac)
        n = layer.out_local
        src_w, src_b = w[r * n:(r + 1) * n], (b[r * n:(r + 1) * n] if b is not None else None)
    elif style == "row":
        layer = RowParallelLinear(linear.in_features, linear.out_features, b is not None, g, **kw, **fac)
        k = layer.in_local
        src_w, src_b = w[:, r * k:(r + 1) * k], b
    else:
        raise ValueError(f"shard_linear: style={style!r}: use 'column' (split the output features) or 'row' (split the input features)")
    with torch.no_grad():
        layer.weight.copy_(src_w)
        if src_b is not None:
            layer.bias.copy_(src_b)
    return layer


def _shards(t: torch.Tensor | None, parts, rank: int, dim: int = 0):
    """Rank ``rank``'s slice of each of ``parts`` consecutive blocks of t along dim (sizes of the
    full blocks), each split in W equal pieces: [block_0 shard; block_1 shard; ...]."""
    if t is None:
        return None
    out, at = [], 0
    for size, local in parts:
        out.append(t.narrow(dim, at + rank * local, local))
        at += size
    return torch.cat(out, dim)


# --------------------------------------------------------------------------------------------
# blocks


class TPMLP(torch.nn.Module):
    """A Llama MLP, down(act(gate(x)) * up(x)), tensor parallel: gate and up in one column-parallel
    weight (this rank's gate rows then its up rows: one gather of x feeds both), SiLU times up,
    down row parallel. With sequence parallelism x and the output are this rank's rows of the
    sequence; without, the whole of it. Options as ColumnParallelLinear's."""

    def __init__(self, hidden_size: int, intermediate_size: int, group=None, *, bias: bool = False, sequence_parallel: bool = True,
                 keep_gathered: bool = False, max_m: int | None = None, partials: str | None = None, pg=None, act=TF.silu,
                 device=None, dtype=None):
        super().__init__()
        g = resolve_group(group)
        self.ffn_local = split_dim("TPMLP", "intermediate_size", intermediate_size, g.world)
        self.hidden_size, self.intermediate_size, self.act = hidden_size, intermediate_size, act
        kw = dict(group=g, sequence_parallel=sequence_parallel, max_m=max_m, partials=partials, pg=pg, device=device, dtype=dtype)
        self.gate_up = ColumnParallelLinear(hidden_size, 2 * intermediate_size, bias, keep_gathered=keep_gathered, **kw)
        self.down = RowParallelLinear(intermediate_size, hidden_size, bias, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)

    @classmethod
    def from_llama(cls, mlp, group=None, **kw) -> "TPMLP":
        """This rank's TPMLP from a LlamaMLP-shaped module (gate_proj, up_proj, down_proj: Linear;
        act_fn if it has one). kw: TPMLP's options."""
        gate, up, down = (_linear(mlp, name, "TPMLP.from_llama") for name in ("gate_proj", "up_proj", "down_proj"))
        g = resolve_group(group)
        w = gate.weight
        kw.setdefault("act", getattr(mlp, "act_fn", TF.silu))
        blk = cls(gate.in_features, gate.out_features, g, bias=gate.bias is not None, device=w.device, dtype=w.dtype, **kw)
        f, fl, r = gate.out_features, blk.ffn_local, g.rank
        gu_w = torch.cat([gate.weight, up.weight])
        gu_b = torch.cat([gate.bias, up.bias]) if gate.bias is not None else None
        with torch.no_grad():
            blk.gate_up.weight.copy_(_shards(gu_w, [(f, fl), (f, fl)], r))
            if gu_b is not None:
                blk.gate_up.bias.copy_(_shards(gu_b, [(f, fl), (f, fl)], r))
            blk.down.weight.copy_(down.weight[:, r * fl:(r + 1) * fl])
            if down.bias is not None:
                blk.down.bias.copy_(down.bias)
        return blk


class TPAttentionProjections(torch.nn.Module):
    """The projections around attention, tensor parallel by heads: q, k and v in one column-parallel
    weight (this rank's query heads, then its key heads, then its value heads), the output
    projection row parallel. Attention itself is the caller's:

        q, k, v = proj.qkv_split(x)          # (rows, heads/W * head_dim) each
        y = proj.out(attention(q, k, v))     # e.g. torch SDPA over this rank's heads
        y = proj(x, attention)               # the same

    With sequence parallelism x and y are this rank's rows of the sequence and q, k, v cover the
    whole sequence. Every rank holds whole heads: num_heads and num_kv_heads must divide by W."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int | None = None, head_dim: int | None = None, group=None, *,
                 qkv_bias: bool = False, out_bias: bool = False, sequence_parallel: bool = True, keep_gathered: bool = False,
                 max_m: int | None = None, partials: str | None = None, pg=None, device=None, dtype=None):
        super().__init__()
        g = resolve_group(group)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if head_dim is None:
            if hidden_size % num_heads:
                raise ValueError(f"TPAttentionProjections: hidden_size = {hidden_size} is not divisible by num_heads = {num_heads}; "
                                 "pass head_dim")
            head_dim = hidden_size // num_heads
        self.heads_local = split_dim("TPAttentionProjections", "num_heads", num_heads, g.world)
        self.kv_heads_local = split_dim("TPAttentionProjections", "num_kv_heads", num_kv_heads, g.world)
        self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim = hidden_size, num_heads, num_kv_heads, head_dim
        self.q_local, self.kv_local = self.heads_local * head_dim, self.kv_heads_local * head_dim
        kw = dict(group=g, sequence_parallel=sequence_parallel, max_m=max_m, partials=partials, pg=pg, device=device, dtype=dtype)
        self.qkv = ColumnParallelLinear(hidden_size, (num_heads + 2 * num_kv_heads) * head_dim, qkv_bias,
                                        keep_gathered=keep_gathered, **kw)
        self.out = RowParallelLinear(num_heads * head_dim, hidden_size, out_bias, **kw)

    def qkv_split(self, x: torch.Tensor):
        """(q, k, v) of this rank's heads: views of one (rows, (h + 2 h_kv) / W * head_dim) output."""
        return self.qkv(x).split([self.q_local, self.kv_local, self.kv_local], dim=-1)

    def forward(self, x: torch.Tensor, attention) -> torch.Tensor:
        return self.out(attention(*self.qkv_split(x)))

    @classmethod
    def from_llama(cls, attn, group=None, **kw) -> "TPAttentionProjections":
        """This rank's projections from a LlamaAttention-shaped module (q_proj, k_proj, v_proj,
        o_proj: Linear; head_dim, else hidden / num_heads from num_heads). kw: the options."""
        q, k, v, o = (_linear(attn, name, "TPAttentionProjections.from_llama") for name in ("q_proj", "k_proj", "v_proj", "o_proj"))
        hd = _head_dim(attn, q, "TPAttentionProjections.from_llama")
        g = resolve_group(group)
        w = q.weight
        blk = cls(q.in_features, q.out_features // hd, k.out_features // hd, hd, g, qkv_bias=q.bias is not None,
                  out_bias=o.bias is not None, device=w.device, dtype=w.dtype, **kw)
        parts = [(q.out_features, blk.q_local), (k.out_features, blk.kv_local), (v.out_features, blk.kv_local)]
        r = g.rank
        with torch.no_grad():
            blk.qkv.weight.copy_(_shards(torch.cat([q.weight, k.weight, v.weight]), parts, r))
            if q.bias is not None:
                blk.qkv.bias.copy_(_shards(torch.cat([q.bias, k.bias, v.bias]), parts, r))
            blk.out.weight.copy_(o.weight[:, r * blk.q_local:(r + 1) * blk.q_local])
            if o.bias is not None:
                blk.out.bias.copy_(o.bias)
        return blk


# --------------------------------------------------------------------------------------------
# Hugging Face modules in place


def _linear(module, name: str, fn: str) -> torch.nn.Linear:
    lin = getattr(module, name, None)
    if lin is None:
        raise ValueError(f"{fn}: {type(module).__name__} has no {name!r} (a Llama-shaped module is expected)")
    if not isinstance(lin, torch.nn.Linear):
        raise TypeError(f"{fn}: {name} is a {type(lin).__name__}, not a torch.nn.Linear (already parallelised?)")
    return lin


def _head_dim(attn, q: torch.nn.Linear, fn: str) -> int:
    hd = getattr(attn, "head_dim", None)
    if isinstance(hd, int):
        return hd
    heads = getattr(attn, "num_heads", None)
    if isinstance(heads, int) and q.out_features % heads == 0:
        return q.out_features // heads
    raise ValueError(f"{fn}: {type(attn).__name__} has no head_dim (or num_heads): cannot tell its heads apart")


def parallelize_llama_mlp(module, group=None, *, sequence_parallel: bool = False, **kw):
    """Shard a LlamaMLP-shaped module in place and return it: gate_proj and up_proj become
    ColumnParallelLinear, down_proj RowParallelLinear; the module's own forward runs unchanged.
    Without sequence parallelism (default) the module takes and returns the whole sequence, as
    before, on every rank. TPMLP.from_llama builds the fused block (one gather for gate and up)."""
    g = resolve_group(group)
    gate, up, down = (_linear(module, n, "parallelize_llama_mlp") for n in ("gate_proj", "up_proj", "down_proj"))
    new = [shard_linear(gate, g, "column", sequence_parallel=sequence_parallel, **kw),
           shard_linear(up, g, "column", sequence_parallel=sequence_parallel, **kw),
           shard_linear(down, g, "row", sequence_parallel=sequence_parallel, **kw)]
    module.gate_proj, module.up_proj, module.down_proj = new  # only once every shard was built: an error changes nothing
    return module


def parallelize_llama_attention(module, group=None, **kw):
    """Shard a LlamaAttention-shaped module in place by heads and return it: q_proj, k_proj, v_proj
    become ColumnParallelLinear, o_proj RowParallelLinear, without sequence parallelism (the
    module's forward shapes its heads by the input's rows, which sequence parallelism changes:
    use TPAttentionProjections for it). Head-count attributes (num_heads, num_key_value_heads)
    become this rank's; the module's forward runs unchanged on every rank."""
    g = resolve_group(group)
    fn = "parallelize_llama_attention"
    if kw.pop("sequence_parallel", False):
        raise ValueError(f"{fn}: sequence parallelism changes the rows the module's forward sees; use "
                         "rawflux.nn.TPAttentionProjections.from_llama for it")
    q, k, v, o = (_linear(module, n, fn) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
    hd = _head_dim(module, q, fn)
    split_dim(fn, "num_heads", q.out_features // hd, g.world)
    split_dim(fn, "num_key_value_heads", k.out_features // hd, g.world)
    new = [shard_linear(lin, g, "column", sequence_parallel=False, **kw) for lin in (q, k, v)]
    new.append(shard_linear(o, g, "row", sequence_parallel=False, **kw))
    module.q_proj, module.k_proj, module.v_proj, module.o_proj = new
    for name in ("num_heads", "num_key_value_heads"):
        n = getattr(module, name, None)
        if isinstance(n, int) and not isinstance(n, bool):
            setattr(module, name, n // g.world)
    return module
