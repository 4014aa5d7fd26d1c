"""rawflux.nn on the CPU: shape and sharding rules, error messages, and the autograd wiring of every
layer against the unsplit torch module, with W ranks simulated by threads of one process.

The fused ops need a GPU, so rawflux.nn._ops (the one place nn calls them) is replaced by
reference implementations over the simulated world: ag_gemm concatenates every rank's shard,
gemm_rs sums every rank's partial and keeps this rank's rows, all_reduce sums in place. Like the
real ops, a gathered view returned without gathered_out= is valid only until the next call of the
same op (the fake fills the previous one with NaN), so a layer that keeps one too long fails here.
Everything runs in float64: the layers must match the unsplit module to rounding (1e-9).
"""
from __future__ import annotations

import copy
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as TF  # noqa: E402

import rawflux.nn as tp  # noqa: E402
from rawflux.nn import _ops  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOL = dict(rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------------------------
# a world of W ranks in threads, and the ops over it


class Sim:
    def __init__(self, world: int):
        self.world = world
        self.bar = threading.Barrier(world, timeout=30)
        self.slots = [None] * world
        self.log = [[] for _ in range(world)]
        self.views = [{} for _ in range(world)]  # the last gathered view per op key, per rank
        self.keys = [[] for _ in range(world)]  # the op objects each call used: (kind, n, k, layout)
        self.reserved = [set() for _ in range(world)]

    def exchange(self, rank: int, value):
        self.slots[rank] = value
        self.bar.wait()
        got = list(self.slots)
        self.bar.wait()
        return got


class SimGroup:
    def __init__(self, sim: Sim | None, rank: int, world: int | None = None):
        self.sim, self.rank = sim, rank
        self.world = sim.world if sim is not None else world
        self.device_id, self.closed = 0, False


def _is_torch(x):
    return isinstance(x, torch.Tensor)


def _cat(xs):
    return torch.cat(xs) if _is_torch(xs[0]) else np.concatenate(xs)


def _mm(a, b, layout):
    return a @ (b.T if layout == "nk" else b)


def fake_ag_gemm(a, b, group, *, b_layout="nk", bias=None, gathered_out=None, return_gathered=False, max_m=None):
    sim, r = group.sim, group.rank
    shards = sim.exchange(r, a)
    assert len({tuple(s.shape) for s in shards}) == 1, "ranks called ag_gemm with different shapes"
    n = b.shape[0] if b_layout == "nk" else b.shape[1]
    sim.log[r].append(("ag_gemm", b_layout, id(b), gathered_out is not None, return_gathered))
    sim.keys[r].append(("ag", n, a.shape[1], b_layout))
    full = _cat(shards)
    out = _mm(full, b, b_layout)
    if bias is not None:
        out = out + bias
    key = ("ag", n, a.shape[1], b_layout)
    old = sim.views[r].pop(key, None)
    if old is not None:
        old[...] = float("nan")  # the previous view of this op's buffer is overwritten now
    if gathered_out is not None:
        gathered_out[...] = full
        gath = gathered_out
    else:
        gath = full
        sim.views[r][key] = full
    return (out, gath) if return_gathered else out


def fake_gather(x, group, *, max_m=None):
    group.sim.log[group.rank].append(("gather",))
    _, full = fake_ag_gemm(x, _zeros(x, (_ops.GATHER_N, x.shape[1])), group, return_gathered=True)
    group.sim.log[group.rank].pop()  # the gather's own ag_gemm is logged as "gather"
    return full


def _zeros(x, shape):
    return x.new_zeros(shape) if _is_torch(x) else np.zeros(shape, dtype=x.dtype)


def fake_gemm_rs(a, b, group, *, b_layout="nk", bias=None, partials=None, max_m=None):
    sim, r, w = group.sim, group.rank, group.world
    sim.log[r].append(("gemm_rs", b_layout, id(b)))
    sim.keys[r].append(("rs", b.shape[0] if b_layout == "nk" else b.shape[1], a.shape[1], b_layout))
    parts = sim.exchange(r, _mm(a, b, b_layout))
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    assert total.shape[0] % w == 0
    rows = total.shape[0] // w
    out = total[r * rows:(r + 1) * rows]
    return out + bias if bias is not None else out


def fake_gemm_ar(a, b, group, *, b_layout="nk", bias=None, max_m=None):
    sim, r = group.sim, group.rank
    sim.log[r].append(("gemm_ar", b_layout, id(b)))
    sim.keys[r].append(("ar", b.shape[0] if b_layout == "nk" else b.shape[1], a.shape[1], b_layout))
    parts = sim.exchange(r, _mm(a, b, b_layout))
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total + bias if bias is not None else total


def fake_gemm(a, b, *, b_layout="nk", bias=None, out_dtype=None):
    c = _mm(a, b, b_layout)
    if bias is not None:
        c = c + bias
    return c  # float64 throughout: "f32" keeps it


def fake_all_reduce(x, group, *, pg=None):
    sim, r = group.sim, group.rank
    sim.log[r].append(("all_reduce",))
    assert x.is_contiguous() if _is_torch(x) else x.flags.c_contiguous
    vals = sim.exchange(r, x.clone() if _is_torch(x) else x.copy())
    total = vals[0]
    for v in vals[1:]:
        total = total + v
    x[...] = total
    return x


def fake_reserve(x, group, m, *, ag=None, rs=None, ar=None, gather_k=None, max_m=None):
    mine = group.sim.reserved[group.rank]
    if ar is not None:
        mine.add(("ar",) + tuple(ar[:3]))
    if ag is not None:
        mine.add(("ag",) + tuple(ag[:3]))
    if rs is not None:
        mine.add(("rs",) + tuple(rs[:3]))
    if gather_k is not None:
        mine.add(("ag", _ops.GATHER_N, gather_k, "nk"))


@pytest.fixture
def fake_ops(monkeypatch):
    for name, fn in (("ag_gemm", fake_ag_gemm), ("gemm_rs", fake_gemm_rs), ("gemm_ar", fake_gemm_ar), ("gemm", fake_gemm),
                     ("all_reduce", fake_all_reduce),
                     ("gather", fake_gather), ("reserve", fake_reserve)):
        monkeypatch.setattr(_ops, name, fn)


def run_ranks(world: int, fn):
    """fn(group) on every rank of a simulated world, each in its own thread; the results in rank order."""
    sim = Sim(world)
    out, errors = [None] * world, []

    def body(r):
        try:
            out[r] = fn(SimGroup(sim, r))
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append((r, e))
            sim.bar.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    real = [(r, e) for r, e in errors if not isinstance(e, threading.BrokenBarrierError)] or errors
    if real:
        raise real[0][1]
    return out, sim


def rows(t, r, w):
    n = t.shape[0] // w
    return t[r * n:(r + 1) * n]


def cols(t, r, w):
    n = t.shape[-1] // w
    return t[..., r * n:(r + 1) * n]


def rand(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def linear(i, o, bias, seed):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(i, o, bias=bias, dtype=torch.float64)
    if bias:
        with torch.no_grad():
            lin.bias.normal_()
    return lin


def grads(module, x, y_grad):
    x = x.clone().requires_grad_(True)
    y = module(x)
    y.backward(y_grad)
    return y.detach(), x.grad


# --------------------------------------------------------------------------------------------
# column- and row-parallel linear against nn.Linear


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("keep", [False, True])
def test_column_parallel_sequence_parallel_matches_linear(fake_ops, world, bias, keep):
    m, i, o = 6 * world, 16, 8 * world * 2
    ref = linear(i, o, bias, seed=1)
    X, G = rand(m, i, seed=2), rand(m, o, seed=3)
    Y, DX = grads(ref, X, G)

    def rank(g):
        layer = tp.shard_linear(ref, g, "column", keep_gathered=keep)
        y, dx = grads(layer, rows(X, g.rank, world), cols(G, g.rank, world))
        return y, dx, layer.weight.grad, layer.bias.grad if bias else None

    got, sim = run_ranks(world, rank)
    for r, (y, dx, dw, db) in enumerate(got):
        torch.testing.assert_close(y, cols(Y, r, world), **TOL)
        torch.testing.assert_close(dx, rows(DX, r, world), **TOL)
        torch.testing.assert_close(dw, rows(ref.weight.grad, r, world), **TOL)
        if bias:
            torch.testing.assert_close(db, cols(ref.bias.grad, r, world), **TOL)
        kinds = [e[0] for e in sim.log[r]]
        assert kinds == (["ag_gemm", "gemm_rs"] if keep else ["ag_gemm", "gather", "gemm_rs"]), kinds


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_row_parallel_sequence_parallel_matches_linear(fake_ops, world, bias):
    m, i, o = 5 * world, 8 * world, 24
    ref = linear(i, o, bias, seed=4)
    X, G = rand(m, i, seed=5), rand(m, o, seed=6)
    Y, DX = grads(ref, X, G)

    def rank(g):
        layer = tp.shard_linear(ref, g, "row")
        y, dx = grads(layer, cols(X, g.rank, world), rows(G, g.rank, world))
        return y, dx, layer.weight.grad, layer.bias.grad if bias else None

    got, sim = run_ranks(world, rank)
    for r, (y, dx, dw, db) in enumerate(got):
        torch.testing.assert_close(y, rows(Y, r, world), **TOL)
        torch.testing.assert_close(dx, cols(DX, r, world), **TOL)
        torch.testing.assert_close(dw, cols(ref.weight.grad, r, world), **TOL)
        if bias:
            torch.testing.assert_close(db, ref.bias.grad, **TOL)  # whole on every rank
        assert [e[0] for e in sim.log[r]] == ["gemm_rs", "ag_gemm"]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_decode_layers_without_sequence_parallelism(fake_ops, world):
    """Column then row without sequence parallelism: every rank takes and returns the whole input;
    the row layer's forward is a GEMM + AllReduce (gemm_ar), the column layer's input gradient too,
    its op object built in the forward."""
    m, h, f = 3, 16, 8 * world
    up, down = linear(h, f, True, seed=7), linear(f, h, True, seed=8)
    X, G = rand(m, h, seed=9), rand(m, h, seed=10)
    Y, DX = grads(lambda x: down(torch.tanh(up(x))), X, G)

    def rank(g):
        c = tp.shard_linear(up, g, "column", sequence_parallel=False)
        rw = tp.shard_linear(down, g, "row", sequence_parallel=False)
        y, dx = grads(lambda x: rw(torch.tanh(c(x))), X, G)
        return y, dx, c.weight.grad, c.bias.grad, rw.weight.grad, rw.bias.grad

    got, sim = run_ranks(world, rank)
    for r, (y, dx, cw, cb, rw_, rb) in enumerate(got):
        torch.testing.assert_close(y, Y, **TOL)
        torch.testing.assert_close(dx, DX, **TOL)
        torch.testing.assert_close(cw, rows(up.weight.grad, r, world), **TOL)
        torch.testing.assert_close(cb, cols(up.bias.grad, r, world), **TOL)
        torch.testing.assert_close(rw_, cols(down.weight.grad, r, world), **TOL)
        torch.testing.assert_close(rb, down.bias.grad, **TOL)
        assert [e[0] for e in sim.log[r]] == ([] if world == 1 else ["gemm_ar", "gemm_ar"])
        assert sim.reserved[r] == (set() if world == 1 else {("ar", h, f // world, "kn")})  # the column backward's


@pytest.mark.parametrize("x_grad", [False, True])
def test_backward_calls_the_fused_ops_with_the_weight_itself(fake_ops, x_grad):
    """Column backward: gemm_rs with the weight shard as its "kn" operand (no transposed copy);
    row backward: ag_gemm with the weight as "kn", its gathered dy reused for dw and db; an input
    that needs no gradient (a first layer) makes no gemm_rs call. Every op object a backward
    uses was built during the forward (on the caller's thread, not the autograd engine's)."""
    def rank(g):
        c = tp.ColumnParallelLinear(24, 32, True, g, dtype=torch.float64)
        rw = tp.RowParallelLinear(32, 40, True, g, dtype=torch.float64)
        x = rand(4, 24, seed=11 + g.rank).requires_grad_(x_grad)
        rw(c(x)).sum().backward()  # the sum's gradient is an expanded (stride 0) tensor
        return id(c.weight), id(rw.weight)

    got, sim = run_ranks(2, rank)
    for r, (cw, rw) in enumerate(got):
        log = sim.log[r]
        assert log[0] == ("ag_gemm", "nk", cw, False, False)
        assert log[1] == ("gemm_rs", "nk", rw)
        assert log[2] == ("ag_gemm", "kn", rw, False, True)  # dy gathered once, for dx, dw and db
        assert log[3:] == [("gather",)] + ([("gemm_rs", "kn", cw)] if x_grad else [])  # x gathered again for dw
        used = set(sim.keys[r][2:])
        want = {("ag", 16, 40, "kn"), ("ag", _ops.GATHER_N, 24, "nk")} | ({("rs", 24, 16, "kn")} if x_grad else set())
        assert sim.reserved[r] == used == want


@pytest.mark.parametrize("keep", [False, True])
def test_layers_of_one_shape_share_an_op_safely(fake_ops, keep):
    """Two column layers of one shape on one input (one op object, one gathered buffer): what one
    layer keeps for its backward must survive the other's calls."""
    w, m, i, o = 2, 3, 16, 32
    a, b = linear(i, o, True, seed=15), linear(i, o, True, seed=16)
    X, G = rand(m * w, i, seed=17), rand(m * w, o, seed=18)
    Y, DX = grads(lambda x: a(x) * b(x), X, G)

    def rank(g):
        ca, cb = (tp.shard_linear(lin, g, "column", keep_gathered=keep) for lin in (a, b))
        y, dx = grads(lambda x: ca(x) * cb(x), rows(X, g.rank, w), cols(G, g.rank, w))
        return y, dx, ca.weight.grad, cb.weight.grad

    got, _ = run_ranks(w, rank)
    for r, (y, dx, ga, gb) in enumerate(got):
        torch.testing.assert_close(y, cols(Y, r, w), **TOL)
        torch.testing.assert_close(dx, rows(DX, r, w), **TOL)
        torch.testing.assert_close(ga, rows(a.weight.grad, r, w), **TOL)
        torch.testing.assert_close(gb, rows(b.weight.grad, r, w), **TOL)


def test_leading_dimensions(fake_ops):
    """(s/W, b, h) in, (s, b, n/W) out of a column layer; (s, b, f/W) in, (s/W, b, h) out of a row
    layer: the same numbers as the 2-D rows."""
    w, s, b, h, f = 2, 6, 3, 16, 32
    up, down = linear(h, f, False, seed=12), linear(f, h, False, seed=13)
    X = rand(s, b, h, seed=14)

    def rank(g):
        c, rw = tp.shard_linear(up, g, "column"), tp.shard_linear(down, g, "row")
        x = rows(X, g.rank, w)
        mid = c(x)
        assert mid.shape == (s, b, f // w)
        y = rw(mid)
        assert y.shape == (s // w, b, h)
        with pytest.raises(ValueError, match="first dimension 3 is not divisible by the world size W = 2"):
            rw(mid[:3])
        return y

    got, _ = run_ranks(w, rank)
    torch.testing.assert_close(torch.cat(got), down(up(X)).detach(), **TOL)


# --------------------------------------------------------------------------------------------
# blocks


class RefMLP(torch.nn.Module):
    """LlamaMLP's shape: down(act(gate(x)) * up(x))."""

    def __init__(self, h, f, bias=False, seed=0):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = (linear(h, f, bias, seed), linear(h, f, bias, seed + 1),
                                                        linear(f, h, bias, seed + 2))
        self.act_fn = TF.silu

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class RefAttention(torch.nn.Module):
    """LlamaAttention's shape (recent Hugging Face): heads from the projections' widths and head_dim."""

    def __init__(self, h, heads, kv_heads, hd, bias=False, seed=0):
        super().__init__()
        self.head_dim, self.num_key_value_groups = hd, heads // kv_heads
        self.num_heads, self.num_key_value_heads = heads, kv_heads  # older versions' attributes
        self.q_proj, self.k_proj, self.v_proj = (linear(h, heads * hd, bias, seed), linear(h, kv_heads * hd, bias, seed + 1),
                                                 linear(h, kv_heads * hd, bias, seed + 2))
        self.o_proj = linear(heads * hd, h, False, seed + 3)

    def forward(self, x):
        lead = x.shape[:-1]
        shape = (*lead, -1, self.head_dim)
        q, k, v = (p(x).view(shape).transpose(-3, -2) for p in (self.q_proj, self.k_proj, self.v_proj))
        ctx = attend(q, k, v, self.num_key_value_groups)
        return self.o_proj(ctx.transpose(-3, -2).reshape(*lead, -1))


def attend(q, k, v, groups):
    k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    return TF.scaled_dot_product_attention(q, k, v, is_causal=True)


def flat_attention(hd, groups):
    """Attention over (tokens, heads * hd) projections, as a caller of TPAttentionProjections writes it."""
    def fn(q, k, v):
        t = q.shape[0]
        q, k, v = (x.reshape(t, -1, hd).transpose(0, 1) for x in (q, k, v))
        return attend(q, k, v, groups).transpose(0, 1).reshape(t, -1)
    return fn


def block_grads(module, X, G):
    x = X.clone().requires_grad_(True)
    y = module(x)
    y.backward(G)
    return y.detach(), x.grad


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("sp", [True, False])
def test_tpmlp_matches_llama_mlp(fake_ops, world, sp):
    m, h, f = 4 * world, 16, 8 * world
    ref = RefMLP(h, f, seed=20)
    X, G = rand(m, h, seed=21), rand(m, h, seed=22)
    Y, DX = block_grads(ref, X, G)
    shard = (lambda t, r: rows(t, r, world)) if sp else (lambda t, r: t)

    def rank(g):
        blk = tp.TPMLP.from_llama(ref, g, sequence_parallel=sp)
        assert blk.gate_up.weight.shape == (2 * f // world, h)
        y, dx = block_grads(blk, shard(X, g.rank), shard(G, g.rank))
        return y, dx, blk.gate_up.weight.grad, blk.down.weight.grad

    got, _ = run_ranks(world, rank)
    fl = f // world
    for r, (y, dx, gu, dw) in enumerate(got):
        torch.testing.assert_close(y, shard(Y, r), **TOL)
        torch.testing.assert_close(dx, shard(DX, r), **TOL)
        torch.testing.assert_close(gu[:fl], rows(ref.gate_proj.weight.grad, r, world), **TOL)
        torch.testing.assert_close(gu[fl:], rows(ref.up_proj.weight.grad, r, world), **TOL)
        torch.testing.assert_close(dw, cols(ref.down_proj.weight.grad, r, world), **TOL)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("sp", [True, False])
def test_parallelize_llama_mlp_in_place(fake_ops, world, sp):
    m, h, f = 2 * world, 16, 16 * world
    ref = RefMLP(h, f, bias=True, seed=30)
    X, G = rand(m, h, seed=31), rand(m, h, seed=32)
    Y, DX = block_grads(ref, X, G)
    shard = (lambda t, r: rows(t, r, world)) if sp else (lambda t, r: t)

    def rank(g):
        mod = copy.deepcopy(ref)
        assert tp.parallelize_llama_mlp(mod, g, sequence_parallel=sp) is mod
        assert isinstance(mod.gate_proj, tp.ColumnParallelLinear) and isinstance(mod.down_proj, tp.RowParallelLinear)
        y, dx = block_grads(mod, shard(X, g.rank), shard(G, g.rank))
        return y, dx, mod.up_proj.weight.grad, mod.up_proj.bias.grad, mod.down_proj.bias.grad

    got, _ = run_ranks(world, rank)
    for r, (y, dx, uw, ub, db) in enumerate(got):
        torch.testing.assert_close(y, shard(Y, r), **TOL)
        torch.testing.assert_close(dx, shard(DX, r), **TOL)
        torch.testing.assert_close(uw, rows(ref.up_proj.weight.grad, r, world), **TOL)
        torch.testing.assert_close(ub, cols(ref.up_proj.bias.grad, r, world), **TOL)
        torch.testing.assert_close(db, ref.down_proj.bias.grad, **TOL)


def _attn_grads(ref, pick):
    return [pick(p) for p in (ref.q_proj.weight.grad, ref.k_proj.weight.grad, ref.v_proj.weight.grad)]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_tp_attention_projections_match_unsplit(fake_ops, world):
    m, h, heads, kv, hd = 3 * world, 32, 8, 4, 8
    ref = RefAttention(h, heads, kv, hd, bias=True, seed=40)
    X, G = rand(m, h, seed=41), rand(m, h, seed=42)
    Y, DX = block_grads(ref, X, G)

    def rank(g):
        proj = tp.TPAttentionProjections.from_llama(ref, g)
        y, dx = block_grads(lambda x: proj(x, flat_attention(hd, heads // kv)), rows(X, g.rank, world), rows(G, g.rank, world))
        return y, dx, proj.qkv.weight.grad, proj.qkv.bias.grad, proj.out.weight.grad

    got, _ = run_ranks(world, rank)
    q, k = heads * hd // world, kv * hd // world
    for r, (y, dx, qkv_w, qkv_b, ow) in enumerate(got):
        torch.testing.assert_close(y, rows(Y, r, world), **TOL)
        torch.testing.assert_close(dx, rows(DX, r, world), **TOL)
        for part, want in zip(qkv_w.split([q, k, k]), _attn_grads(ref, lambda t: rows(t, r, world))):
            torch.testing.assert_close(part, want, **TOL)
        torch.testing.assert_close(qkv_b[:q], cols(ref.q_proj.bias.grad, r, world), **TOL)
        torch.testing.assert_close(ow, cols(ref.o_proj.weight.grad, r, world), **TOL)


@pytest.mark.parametrize("world", [1, 2])
def test_parallelize_llama_attention_in_place(fake_ops, world):
    b, s, h, heads, kv, hd = 2, 5, 32, 4, 2, 8
    ref = RefAttention(h, heads, kv, hd, seed=50)
    X, G = rand(b, s, h, seed=51), rand(b, s, h, seed=52)
    Y, DX = block_grads(ref, X, G)

    def rank(g):
        mod = copy.deepcopy(ref)
        tp.parallelize_llama_attention(mod, g)
        assert (mod.num_heads, mod.num_key_value_heads, mod.num_key_value_groups) == (heads // world, kv // world, heads // kv)
        y, dx = block_grads(mod, X, G)
        return y, dx, mod.k_proj.weight.grad, mod.o_proj.weight.grad

    got, _ = run_ranks(world, rank)
    for r, (y, dx, kw, ow) in enumerate(got):
        torch.testing.assert_close(y, Y, **TOL)
        torch.testing.assert_close(dx, DX, **TOL)
        torch.testing.assert_close(kw, rows(ref.k_proj.weight.grad, r, world), **TOL)
        torch.testing.assert_close(ow, cols(ref.o_proj.weight.grad, r, world), **TOL)


# --------------------------------------------------------------------------------------------
# the array functions without torch: numpy through the same wiring


def test_functions_take_numpy_arrays(fake_ops):
    w, m, i, o = 2, 4, 16, 16
    rng = np.random.default_rng(0)
    X, Wc, Wr, B, G = (rng.standard_normal(s) for s in ((m * w, i), (o, i), (i, o), (i,), (m * w, i)))
    F = tp.functional

    def rank(g):
        r = g.rank
        wc, wr = rows(Wc, r, w), cols(Wr, r, w)
        h, kept = F.column_parallel_linear(rows(X, r, w), wc, None, g, keep_gathered=True)
        y = F.row_parallel_linear(h, wr, B, g)
        dh, dwr, db = F.row_parallel_linear_backward(rows(G, r, w), h, wr, g)
        dx, dwc, _ = F.column_parallel_linear_backward(dh, rows(X, r, w), wc, g, gathered=kept, needs=(True, True, False))
        return y, dx, dwc, dwr, db

    got, _ = run_ranks(w, rank)
    H = X @ Wc.T
    np.testing.assert_allclose(np.concatenate([g[0] for g in got]), H @ Wr.T + B, rtol=1e-12)
    DH = G @ Wr
    np.testing.assert_allclose(np.concatenate([g[1] for g in got]), DH @ Wc, rtol=1e-12)
    np.testing.assert_allclose(np.concatenate([g[2] for g in got]), DH.T @ X, rtol=1e-12)
    np.testing.assert_allclose(np.concatenate([g[3] for g in got], axis=1), G.T @ H, rtol=1e-12)
    np.testing.assert_allclose(got[1][4], G.sum(0), rtol=1e-12)


def test_the_fake_catches_a_stale_gathered_view():
    """The reference ag_gemm overwrites the previous view of its buffer, as the fused op does."""
    def rank(g):
        a, b = torch.ones(2, 8, dtype=torch.float64), torch.ones(16, 8, dtype=torch.float64)
        _, first = fake_ag_gemm(a, b, g, return_gathered=True)
        fake_ag_gemm(a, b, g)
        return first

    got, _ = run_ranks(2, rank)
    assert all(bool(torch.isnan(v).all()) for v in got)


# --------------------------------------------------------------------------------------------
# shape rules and messages


@pytest.mark.parametrize("make,msg", [
    (lambda g: tp.ColumnParallelLinear(64, 102, group=g), "out_features = 102 is not divisible by the world size W = 4"),
    (lambda g: tp.RowParallelLinear(102, 64, group=g), "in_features = 102 is not divisible by the world size W = 4"),
    (lambda g: tp.ColumnParallelLinear(60, 64, group=g), "in_features = 60 must be a multiple of 8"),
    (lambda g: tp.ColumnParallelLinear(64, 48, group=g), r"out_features / W \(48 / 4\) = 12 must be a multiple of 8"),
    (lambda g: tp.RowParallelLinear(64, 20, group=g), "out_features = 20 must be a multiple of 8"),
    (lambda g: tp.TPMLP(64, 90, g), "intermediate_size = 90 is not divisible by the world size W = 4"),
    (lambda g: tp.TPAttentionProjections(64, 6, 2, 8, g), "num_heads = 6 is not divisible by the world size W = 4"),
    (lambda g: tp.TPAttentionProjections(64, 8, 2, 8, g), "num_kv_heads = 2 is not divisible by the world size W = 4"),
    (lambda g: tp.TPAttentionProjections(60, 8, group=g), "hidden_size = 60 is not divisible by num_heads = 8"),
    (lambda g: tp.shard_linear(torch.nn.Linear(64, 38), g, "column"), "out_features = 38 is not divisible by the world size W = 4"),
    (lambda g: tp.shard_linear(torch.nn.Linear(64, 64), g, "diagonal"), "style='diagonal'"),
])
def test_dimension_errors_name_the_dimension_and_w(make, msg):
    with pytest.raises(ValueError, match=msg):
        make(SimGroup(None, 0, world=4))


def test_llama_helpers_refuse_clearly_and_change_nothing_on_error():
    g = SimGroup(None, 0, world=4)
    with pytest.raises(TypeError, match="takes a torch.nn.Linear"):
        tp.shard_linear(torch.nn.Conv1d(4, 4, 1), g)
    mlp = RefMLP(16, 32)
    mlp.down_proj = torch.nn.Linear(30, 16, dtype=torch.float64)  # 30 rows do not split in 4
    with pytest.raises(ValueError, match="in_features = 30 is not divisible by the world size W = 4"):
        tp.parallelize_llama_mlp(mlp, g)
    assert type(mlp.gate_proj) is torch.nn.Linear and type(mlp.up_proj) is torch.nn.Linear  # untouched
    with pytest.raises(ValueError, match="has no 'gate_proj'"):
        tp.parallelize_llama_mlp(torch.nn.Module(), g)
    attn = RefAttention(32, 8, 2, 4)
    with pytest.raises(ValueError, match="num_key_value_heads = 2 is not divisible by the world size W = 4"):
        tp.parallelize_llama_attention(attn, g)
    assert type(attn.q_proj) is torch.nn.Linear and attn.num_heads == 8
    with pytest.raises(ValueError, match="TPAttentionProjections.from_llama"):
        tp.parallelize_llama_attention(RefAttention(32, 8, 8, 4), g, sequence_parallel=True)
    ok = RefMLP(16, 32)
    tp.parallelize_llama_mlp(ok, g)
    with pytest.raises(TypeError, match="already parallelised"):
        tp.parallelize_llama_mlp(ok, g)


def test_input_errors():
    g = SimGroup(None, 0, world=4)
    layer = tp.ColumnParallelLinear(16, 32, group=g, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"last dimension is \(8,\), expected 16"):
        layer(torch.zeros(4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="needs a row dimension"):
        layer(torch.zeros(16, dtype=torch.float64))
    with pytest.raises(ValueError, match="x has m = 6 rows, not divisible by the world size W = 4"):
        tp.row_parallel_linear(np.zeros((6, 8)), np.zeros((16, 8)), None, g)
    with pytest.raises(ValueError, match="x's columns must equal weight's"):
        tp.column_parallel_linear(np.zeros((6, 8)), np.zeros((16, 12)), None, g)


def test_a_copy_of_a_layer_shares_its_group():
    g = SimGroup(None, 0, world=2)
    mlp = tp.TPMLP(16, 32, g, dtype=torch.float64)
    twin = copy.deepcopy(mlp)
    assert twin.gate_up.group is g and twin.down.group is g
    assert twin.gate_up.weight is not mlp.gate_up.weight and torch.equal(twin.gate_up.weight, mlp.gate_up.weight)


def test_local_shapes_and_init():
    g = SimGroup(None, 2, world=4)
    c = tp.ColumnParallelLinear(64, 128, group=g)
    r = tp.RowParallelLinear(128, 64, group=g)
    assert c.weight.shape == (32, 64) and c.bias.shape == (32,)
    assert r.weight.shape == (64, 32) and r.bias.shape == (64,)
    assert float(r.weight.detach().abs().max()) <= 1 / 128 ** 0.5  # nn.Linear's bound for the FULL in_features
    assert float(r.bias.detach().abs().max()) == 0.0  # a replicated bias starts equal on every rank
    mlp, attn = tp.TPMLP(64, 256, g), tp.TPAttentionProjections(64, 8, 4, 8, g)
    assert mlp.gate_up.weight.shape == (128, 64) and mlp.down.weight.shape == (64, 64)
    assert attn.qkv.weight.shape == ((8 + 2 * 4) * 8 // 4, 64) and attn.out.weight.shape == (64, 16)


# --------------------------------------------------------------------------------------------
# layering and the rules the GPU path depends on


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)


def test_import_rawflux_does_not_import_torch():
    p = _run("import sys, rawflux; rawflux.nn.column_parallel_linear; sys.exit('torch' in sys.modules)")
    assert p.returncode == 0, p.stderr


def test_nn_functions_work_without_torch_and_modules_say_why_not():
    p = _run("import sys; sys.modules['torch'] = None\n"
             "import rawflux.nn as tp\n"
             "assert callable(tp.row_parallel_linear_backward)\n"
             "try:\n    tp.ColumnParallelLinear\nexcept ImportError as e:\n    print(e)\n")
    assert p.returncode == 0, p.stderr
    assert "rawflux.nn.ColumnParallelLinear needs torch" in p.stdout


def test_nothing_below_nn_imports_it():
    pat = re.compile(r"^\s*(from\s+(\.\.?nn\b|rawflux\.nn\b|\.\.\s+import\s+nn\b)|import\s+rawflux\.nn\b)", re.M)
    for sub in ("ops", "engine", "tune", "dist", "runtime", "jit"):
        for path in (ROOT / "rawflux" / sub).rglob("*.py"):
            assert not pat.search(path.read_text()), f"{path.relative_to(ROOT)} imports rawflux.nn (imports run api -> nn -> ops)"
    assert not pat.search((ROOT / "rawflux" / "baseline.py").read_text())


def test_nn_makes_no_host_synchronisation():
    """No .item() / .cpu() / .tolist() / .numpy() / synchronize in the layers: a training step must
    stay asynchronous and capturable in a CUDA graph."""
    for path in (ROOT / "rawflux" / "nn").glob("*.py"):
        text = path.read_text()
        for bad in (".item(", ".cpu(", ".tolist(", ".numpy(", "synchronize(", ".get()"):
            assert bad not in text, f"{path.name} calls {bad}"
