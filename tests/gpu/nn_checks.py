#!/usr/bin/env python3
"""rawflux.nn checks on GPUs at several world sizes: world 1 on the plain GPU, W > 1 on the emulated
node (N ranks on one GPU under MPS) or one rank per GPU (--real).

    python tests/gpu/nn_checks.py                     # worlds 1, 2, 4
    python tests/gpu/nn_checks.py --worlds 2 --quick  # fewer m values and graph replays
    python tests/gpu/nn_checks.py --real --worlds 2

The driver runs this script with --worker per world size; rank 0 prints one line per check
("nn world=W <check> PASS|FAIL|SKIP  detail") and the driver ends with a summary line.

Each layer check builds the unsplit bf16 torch module, its fp32 copy (the same weights), the TP
layer from the module's weights (rawflux.nn.shard_linear / from_llama / parallelize_*), fresh
random inputs and output gradients for every m, and compares the TP layer's forward output and
every gradient (input, weights, bias) with the fp32 module on the full input: PASS if, for every
tensor, the relative error (Frobenius, over all ranks' shards) is at most 2x the unsplit bf16
module's error against the same fp32 reference, plus 1e-5. Tensors every rank holds whole (a
row-parallel bias gradient, outputs and input gradients without sequence parallelism) must also
be bitwise equal on every rank. The caching allocator is filled with NaN before each run, so an
element an op never writes shows up.

  column[sp|sp,keep|decode]  ColumnParallelLinear (bias), m/W in M_LOCS (ragged: 1, 37, 300, ...)
  row[sp|decode]             RowParallelLinear (bias)
  mlp[sp|decode]             TPMLP.from_llama of a LlamaMLP-shaped module (SiLU)
  mlp_inplace[decode]        parallelize_llama_mlp on the module itself, its own forward
  attn[sp]                   TPAttentionProjections.from_llama (GQA, qkv bias), torch SDPA between;
                             m/W >= 16 (ATTN_M_LOCS)
  attn_inplace[decode]       parallelize_llama_attention on a LlamaAttention-shaped module, (b, s, h) input
  graph[mlp]                 TPMLP forward + backward captured in one CUDA graph, replayed with fresh
                             inputs: outputs and input gradients bitwise equal to the eager step,
                             weight gradients within the accuracy bar of it
  dp[tp=2]                   (world 4) the job split into 2 TP groups of 2 (rawflux.dist.tp_split): each
                             group's TPMLP on its own batch against the unsplit module, gradients
                             averaged across the groups (MPI), one SGD step: weights bitwise equal on
                             both DP replicas
Exit status 0 only if every check passed (or skipped) at every world size.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import math
import os
import re
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

FLOOR = 1e-5
M_LOCS = (1, 37, 128, 300)
M_LOCS_QUICK = (1, 37, 128)
# Attention gets at least 16 tokens per rank: over a handful of tokens its gradients come out of
# the softmax's cancellation, and the ratio of two bf16 pipelines' errors is noise.
ATTN_M_LOCS, ATTN_M_LOCS_QUICK = (16, 37, 128, 300), (16, 37, 128)
DECODE_MS = (1, 7, 64, 257)
DECODE_MS_QUICK = (1, 7, 64)
H, IN, OUT, FFN = 512, 512, 768, 1536  # every shard a multiple of 8 up to W = 8
HEADS, KV_HEADS, HEAD_DIM = 8, 4, 64


class Skip(Exception):
    pass


# --------------------------------------------------------------------------------------------
# data and references (torch only: the layers under test are torch modules)


def _torch():
    import torch

    return torch


def rand(shape, seed: int, scale: float = 1.0, dtype=None):
    """bf16 (default) on the current GPU, the same on every rank (generated on the host)."""
    torch = _torch()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(int(seed) & 0x7FFFFFFF)) * scale
    return x.to(dtype or torch.bfloat16).cuda()


def poison():
    """Fill the caching allocator's free memory with NaN: outputs allocated next start as NaN."""
    torch = _torch()
    t = torch.empty(64 << 20, dtype=torch.float32, device="cuda")
    t.fill_(float("nan"))
    del t


def make_linear(i, o, bias, seed):
    torch = _torch()
    lin = torch.nn.Linear(i, o, bias=bias, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(rand((o, i), seed, 1.0 / math.sqrt(i)))
        if bias:
            lin.bias.copy_(rand((o,), seed + 1, 0.5))
    return lin


def _nn():
    torch = _torch()

    class RefMLP(torch.nn.Module):
        """A LlamaMLP's shape: down(silu(gate(x)) * up(x))."""

        def __init__(self, h, f, seed, bias=False):
            super().__init__()
            self.gate_proj, self.up_proj = make_linear(h, f, bias, seed), make_linear(h, f, bias, seed + 10)
            self.down_proj = make_linear(f, h, bias, seed + 20)
            self.act_fn = torch.nn.functional.silu

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    class RefAttention(torch.nn.Module):
        """A LlamaAttention's projections (recent Hugging Face shapes) around causal SDPA with GQA."""

        def __init__(self, h, heads, kv, hd, seed, qkv_bias=True):
            super().__init__()
            self.head_dim, self.num_key_value_groups = hd, heads // kv
            self.num_heads, self.num_key_value_heads = heads, kv
            self.q_proj = make_linear(h, heads * hd, qkv_bias, seed)
            self.k_proj = make_linear(h, kv * hd, qkv_bias, seed + 10)
            self.v_proj = make_linear(h, kv * hd, qkv_bias, seed + 20)
            self.o_proj = make_linear(heads * hd, h, False, seed + 30)

        def forward(self, x):
            if x.dim() == 2:  # one sequence: SDPA over (1, heads, s, hd), as flat_attention runs it
                return self.forward(x.unsqueeze(0)).squeeze(0)
            lead = x.shape[:-1]
            q, k, v = (p(x).view(*lead, -1, self.head_dim).transpose(-3, -2) for p in (self.q_proj, self.k_proj, self.v_proj))
            ctx = attend(q, k, v, self.num_key_value_groups)
            return self.o_proj(ctx.transpose(-3, -2).reshape(*lead, -1))

    return RefMLP, RefAttention


def attend(q, k, v, groups):
    """Causal SDPA over (..., heads, s, hd), kv heads repeated for GQA."""
    torch = _torch()
    k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def flat_attention(hd, groups):
    """Attention over (tokens, heads * hd) projections: what a TPAttentionProjections caller writes."""
    def fn(q, k, v):
        t = q.shape[0]
        q, k, v = (x.reshape(t, -1, hd).transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        return attend(q, k, v, groups).squeeze(0).transpose(0, 1).reshape(t, -1)
    return fn


def run_ref(module, X, G):
    """(y, dx, {param name: grad}) of a module on the full input."""
    x = X.clone().requires_grad_(True)
    y = module(x)
    y.backward(G)
    out = (y.detach(), x.grad, {n: p.grad for n, p in module.named_parameters()})
    module.zero_grad(set_to_none=True)
    return out


def refs(module, X, G):
    """The bf16 module's and its fp32 copy's results."""
    m32 = copy.deepcopy(module).float()
    return run_ref(module, X, G), run_ref(m32, X.float(), G.float())


def rows(t, r, w):
    n = t.shape[0] // w
    return t[r * n:(r + 1) * n]


def cols(t, r, w):
    n = t.shape[-1] // w
    return t[..., r * n:(r + 1) * n]


def whole(t, r, w):
    return t


# --------------------------------------------------------------------------------------------
# error bookkeeping: each check returns local sums, the worker reduces them over the ranks


def item(name, got, ref16, ref32, replicated=False):
    """(name, |got - ref32|^2, |ref16 - ref32|^2, |ref32|^2, finite, digest) of this rank's part."""
    torch = _torch()
    if got is None:
        return (name, float("nan"), 0.0, 1.0, False, None)
    g, r16, r32 = got.detach().double(), ref16.detach().double(), ref32.detach().double()
    digest = None
    if replicated:
        digest = hashlib.sha1(got.detach().contiguous().view(torch.int16).cpu().numpy().tobytes()).hexdigest()
    return (name, float((g - r32).square().sum()), float((r16 - r32).square().sum()), float(r32.square().sum()),
            bool(torch.isfinite(g).all()), digest)


def judge(per_rank_items):
    """(ok, detail) from every rank's items (the same names in the same order on every rank)."""
    problems, worst = [], (0.0, "")
    for parts in zip(*per_rank_items):
        name = parts[0][0]
        num = sum(p[1] for p in parts)
        num16 = sum(p[2] for p in parts)
        den = sum(p[3] for p in parts) or 1.0
        e, e16 = math.sqrt(num / den), math.sqrt(num16 / den)
        ratio = e / max(e16, 1e-30)
        if not all(p[4] for p in parts) or not e <= 2 * e16 + FLOOR:
            problems.append(f"{name}: rel err {e:.3e} > 2x bf16's {e16:.3e} + {FLOOR:g}" + ("" if all(p[4] for p in parts) else " (non-finite)"))
        digests = [p[5] for p in parts]
        if digests[0] is not None and len(set(digests)) > 1:
            problems.append(f"{name}: differs across ranks (should be whole and equal on every rank)")
        if ratio > worst[0] and e > FLOOR:
            worst = (ratio, f"{name} {e:.2e} vs bf16 {e16:.2e}")
    return not problems, "; ".join(problems[:4]) or f"worst {worst[1] or 'exact'}"


# --------------------------------------------------------------------------------------------
# context


class Ctx:
    def __init__(self, comm, group, seed: int, quick: bool):
        self.comm, self.group = comm, group
        self.rank, self.world = group.rank, group.world
        self.seed, self.quick = seed, quick

    def next_seed(self) -> int:
        self.seed += 1000
        return self.seed

    @property
    def m_locs(self):
        return M_LOCS_QUICK if self.quick else M_LOCS

    @property
    def attn_m_locs(self):
        return ATTN_M_LOCS_QUICK if self.quick else ATTN_M_LOCS

    @property
    def decode_ms(self):
        return DECODE_MS_QUICK if self.quick else DECODE_MS


def _tag(m, items):
    return [(f"m={m} {it[0]}",) + tuple(it[1:]) for it in items]


# --------------------------------------------------------------------------------------------
# checks: each returns (local ok, local note, items) and makes no MPI call


def check_linear(ctx: Ctx, style: str, sp: bool, keep: bool = False):
    import rawflux.nn as tpnn

    w, r = ctx.world, ctx.rank
    i, o = (IN, OUT) if style == "column" else (OUT, IN)
    ms = [ml * w for ml in ctx.m_locs] if sp else list(ctx.decode_ms)
    kw = dict(sequence_parallel=sp, max_m=max(ms)) | ({"keep_gathered": keep} if style == "column" else {})
    if style == "column":
        x_of, g_of, y_of, dx_of, w_of, b_of = (rows if sp else whole), cols, cols, (rows if sp else whole), rows, cols
        rep = {"dx": not sp}
    else:
        x_of, g_of, y_of, dx_of, w_of, b_of = cols, (rows if sp else whole), (rows if sp else whole), cols, cols, whole
        rep = {"out": not sp, "db": True}
    items = []
    for m in ms:
        seed = ctx.next_seed()
        lin = make_linear(i, o, True, seed)
        layer = tpnn.shard_linear(lin, ctx.group, style, **kw)
        X, G = rand((m, i), seed + 2), rand((m, o), seed + 3)
        (y16, dx16, p16), (y32, dx32, p32) = refs(lin, X, G)
        poison()
        x = x_of(X, r, w).contiguous().requires_grad_(True)
        y = layer(x)
        y.backward(g_of(G, r, w).contiguous())
        items += _tag(m, [item("out", y, y_of(y16, r, w), y_of(y32, r, w), rep.get("out", False)),
                          item("dx", x.grad, dx_of(dx16, r, w), dx_of(dx32, r, w), rep.get("dx", False)),
                          item("dw", layer.weight.grad, w_of(p16["weight"], r, w), w_of(p32["weight"], r, w)),
                          item("db", layer.bias.grad, b_of(p16["bias"], r, w), b_of(p32["bias"], r, w), rep.get("db", False))])
    return True, f"m in {ms}, {i}->{o}", items


def _mlp_items(blk, x, y, r, w, sp, res16, res32):
    (y16, dx16, p16), (y32, dx32, p32) = res16, res32
    fl = blk.ffn_local
    sh = rows if sp else whole
    gu = blk.gate_up.weight.grad
    return [item("out", y, sh(y16, r, w), sh(y32, r, w), not sp), item("dx", x.grad, sh(dx16, r, w), sh(dx32, r, w), not sp),
            item("d_gate", gu[:fl] if gu is not None else None, rows(p16["gate_proj.weight"], r, w), rows(p32["gate_proj.weight"], r, w)),
            item("d_up", gu[fl:] if gu is not None else None, rows(p16["up_proj.weight"], r, w), rows(p32["up_proj.weight"], r, w)),
            item("d_down", blk.down.weight.grad, cols(p16["down_proj.weight"], r, w), cols(p32["down_proj.weight"], r, w))]


def check_mlp(ctx: Ctx, sp: bool):
    import rawflux.nn as tpnn

    RefMLP, _ = _nn()
    w, r = ctx.world, ctx.rank
    ms = [ml * w for ml in ctx.m_locs] if sp else list(ctx.decode_ms)
    items = []
    for m in ms:
        seed = ctx.next_seed()
        ref = RefMLP(H, FFN, seed)
        blk = tpnn.TPMLP.from_llama(ref, ctx.group, sequence_parallel=sp, max_m=max(ms))
        X, G = rand((m, H), seed + 2), rand((m, H), seed + 3)
        res16, res32 = refs(ref, X, G)
        poison()
        sh = rows if sp else whole
        x = sh(X, r, w).contiguous().requires_grad_(True)
        y = blk(x)
        y.backward(sh(G, r, w).contiguous())
        items += _tag(m, _mlp_items(blk, x, y, r, w, sp, res16, res32))
    return True, f"m in {ms}, hidden {H}, ffn {FFN}", items


def check_mlp_inplace(ctx: Ctx):
    import rawflux.nn as tpnn

    RefMLP, _ = _nn()
    w, r = ctx.world, ctx.rank
    items = []
    for m in ctx.decode_ms:
        seed = ctx.next_seed()
        ref = RefMLP(H, FFN, seed, bias=True)
        X, G = rand((m, H), seed + 2), rand((m, H), seed + 3)
        (y16, dx16, p16), (y32, dx32, p32) = refs(ref, X, G)
        mod = tpnn.parallelize_llama_mlp(ref, ctx.group, max_m=max(ctx.decode_ms))  # in place: ref is the TP module now
        poison()
        x = X.clone().requires_grad_(True)
        y = mod(x)
        y.backward(G)
        items += _tag(m, [item("out", y, y16, y32, True), item("dx", x.grad, dx16, dx32, True),
                          item("d_up", mod.up_proj.weight.grad, rows(p16["up_proj.weight"], r, w), rows(p32["up_proj.weight"], r, w)),
                          item("d_up_bias", mod.up_proj.bias.grad, cols(p16["up_proj.bias"], r, w), cols(p32["up_proj.bias"], r, w)),
                          item("d_down", mod.down_proj.weight.grad, cols(p16["down_proj.weight"], r, w), cols(p32["down_proj.weight"], r, w)),
                          item("d_down_bias", mod.down_proj.bias.grad, p16["down_proj.bias"], p32["down_proj.bias"], True)])
    return True, f"m in {list(ctx.decode_ms)}", items


def check_attn(ctx: Ctx):
    import rawflux.nn as tpnn

    _, RefAttention = _nn()
    w, r = ctx.world, ctx.rank
    ms = [ml * w for ml in ctx.attn_m_locs]
    items = []
    for m in ms:
        seed = ctx.next_seed()
        ref = RefAttention(H, HEADS, KV_HEADS, HEAD_DIM, seed)
        proj = tpnn.TPAttentionProjections.from_llama(ref, ctx.group, max_m=max(ms))
        X, G = rand((m, H), seed + 2), rand((m, H), seed + 3)
        (y16, dx16, p16), (y32, dx32, p32) = refs(ref, X, G)
        poison()
        x = rows(X, r, w).contiguous().requires_grad_(True)
        y = proj(x, flat_attention(HEAD_DIM, HEADS // KV_HEADS))
        y.backward(rows(G, r, w).contiguous())
        sizes = [proj.q_local, proj.kv_local, proj.kv_local]
        wg, bg = proj.qkv.weight.grad, proj.qkv.bias.grad
        wparts = wg.split(sizes) if wg is not None else (None,) * 3
        bparts = bg.split(sizes) if bg is not None else (None,) * 3
        its = [item("out", y, rows(y16, r, w), rows(y32, r, w)), item("dx", x.grad, rows(dx16, r, w), rows(dx32, r, w))]
        for nm, gw, gb in zip("qkv", wparts, bparts):
            its.append(item(f"d{nm}", gw, rows(p16[f"{nm}_proj.weight"], r, w), rows(p32[f"{nm}_proj.weight"], r, w)))
            if nm != "k":  # the key bias shifts every score of a query alike: its exact gradient is 0, its error only noise
                its.append(item(f"d{nm}_bias", gb, cols(p16[f"{nm}_proj.bias"], r, w), cols(p32[f"{nm}_proj.bias"], r, w)))
        its.append(item("do", proj.out.weight.grad, cols(p16["o_proj.weight"], r, w), cols(p32["o_proj.weight"], r, w)))
        items += _tag(m, its)
    return True, f"m in {ms}, {HEADS} heads / {KV_HEADS} kv heads x {HEAD_DIM}", items


def check_attn_inplace(ctx: Ctx):
    import rawflux.nn as tpnn

    _, RefAttention = _nn()
    w, r = ctx.world, ctx.rank
    items = []
    for b, s in ((1, 1), (2, 37), (3, 64)):
        seed = ctx.next_seed()
        ref = RefAttention(H, HEADS, KV_HEADS, HEAD_DIM, seed)
        X, G = rand((b, s, H), seed + 2), rand((b, s, H), seed + 3)
        (y16, dx16, p16), (y32, dx32, p32) = refs(ref, X, G)
        mod = tpnn.parallelize_llama_attention(ref, ctx.group, max_m=192)
        poison()
        x = X.clone().requires_grad_(True)
        y = mod(x)
        y.backward(G)
        items += _tag(f"{b}x{s}", [item("out", y, y16, y32, True), item("dx", x.grad, dx16, dx32, True),
                                   item("dk", mod.k_proj.weight.grad, rows(p16["k_proj.weight"], r, w), rows(p32["k_proj.weight"], r, w)),
                                   item("dq_bias", mod.q_proj.bias.grad, cols(p16["q_proj.bias"], r, w), cols(p32["q_proj.bias"], r, w)),
                                   item("do", mod.o_proj.weight.grad, cols(p16["o_proj.weight"], r, w), cols(p32["o_proj.weight"], r, w))])
    return True, "(batch, seq) in [(1, 1), (2, 37), (3, 64)]", items


def check_graph(ctx: Ctx, replays: int, m_loc: int = 96):
    torch = _torch()
    import rawflux.nn as tpnn

    RefMLP, _ = _nn()
    w, r = ctx.world, ctx.rank
    seed = ctx.next_seed()
    ref = RefMLP(H, FFN, seed)
    blk = tpnn.TPMLP.from_llama(ref, ctx.group, max_m=w * m_loc)
    params = list(blk.parameters())
    sx = rows(rand((w * m_loc, H), seed + 1), r, w).contiguous().requires_grad_(True)
    sg = rows(rand((w * m_loc, H), seed + 2), r, w).contiguous()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on the capture stream: op objects, kernels and plans made
        for _ in range(3):
            torch.autograd.grad(blk(sx), [sx, *params], sg)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        sy = blk(sx)
        sgrads = torch.autograd.grad(sy, [sx, *params], sg)
    problems, items, bitwise_w = [], [], 0
    fl = blk.ffn_local
    for i in range(replays):
        X, G = rand((w * m_loc, H), seed + 10 + 2 * i), rand((w * m_loc, H), seed + 11 + 2 * i)
        with torch.no_grad():
            sx.copy_(rows(X, r, w))
            sg.copy_(rows(G, r, w))
        graph.replay()
        x = rows(X, r, w).clone().requires_grad_(True)
        eager = torch.autograd.grad(y := blk(x), [x, *params], rows(G, r, w).contiguous())
        torch.cuda.synchronize()
        for nm, a, b in (("out", sy, y), ("dx", sgrads[0], eager[0])):  # rawflux's ops alone: the same bits
            if not torch.equal(a, b):
                problems.append(f"replay {i}: {nm} differs from the eager step (max |diff| {float((a.float() - b.float()).abs().max()):.3e})")
        bitwise_w += sum(bool(torch.equal(a, b)) for a, b in zip(sgrads[1:], eager[1:]))
        (_, _, p16), (_, _, p32) = refs(ref, X, G)
        gu = sgrads[1]
        items += _tag(f"replay{i}", [
            item("d_gate", gu[:fl], rows(p16["gate_proj.weight"], r, w), rows(p32["gate_proj.weight"], r, w)),
            item("d_up", gu[fl:], rows(p16["up_proj.weight"], r, w), rows(p32["up_proj.weight"], r, w)),
            item("d_down", sgrads[2], cols(p16["down_proj.weight"], r, w), cols(p32["down_proj.weight"], r, w))])
    note = (f"{replays} replays, m/W={m_loc}: out and dx bitwise equal to the eager step; weight grads bitwise equal to it "
            f"in {bitwise_w}/{2 * replays}")
    return not problems, "; ".join(problems[:3]) or note, items


def dp_worker(comm, seed: int):
    """(ok, detail) on every rank: the dp[tp=2] check (collective over comm, world 4)."""
    torch = _torch()
    import rawflux
    import rawflux.nn as tpnn
    from rawflux.dist import tp_split

    RefMLP, _ = _nn()
    sp = tp_split(comm, 2)
    g2 = rawflux.init(sp.tp_comm)
    ok, detail, items = True, "", []
    try:
        d, dp, r = sp.dp_comm.Get_rank(), sp.dp_comm.Get_size(), sp.tp_rank
        m, lr = 2 * 128, 0.125
        ref = RefMLP(H, FFN, seed)
        ref32 = copy.deepcopy(ref).float()
        blk = tpnn.TPMLP.from_llama(ref, g2, max_m=m)
        sets = [(rand((m, H), seed + 100 + q), rand((m, H), seed + 200 + q)) for q in range(dp)]
        X, G = sets[d]
        res16, res32 = run_ref(ref, X, G), run_ref(ref32, X.float(), G.float())
        x = rows(X, r, 2).contiguous().requires_grad_(True)
        y = blk(x)
        y.backward(rows(G, r, 2).contiguous())
        items += _mlp_items(blk, x, y, r, 2, True, res16, res32)[:2]  # this group's outputs and input gradient
        with torch.no_grad():
            for p in blk.parameters():
                tot = sp.dp_comm.allreduce(p.grad.float().cpu().numpy())
                p.grad.copy_(torch.from_numpy(tot / dp))
                p -= lr * p.grad
        digests = {n: hashlib.sha1(p.detach().view(torch.int16).cpu().numpy().tobytes()).hexdigest() for n, p in blk.named_parameters()}
        same = all(v == digests for v in sp.dp_comm.allgather(digests))
        if not same:
            ok, detail = False, "weights differ across the DP group after the step"
        # the step against the unsplit module's, with the gradient averaged over both batches
        avg16 = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in ref.named_parameters()}
        avg32 = {n: torch.zeros_like(p) for n, p in ref32.named_parameters()}
        for Xq, Gq in sets:
            for avg, mod, cast in ((avg16, ref, lambda t: t), (avg32, ref32, lambda t: t.float())):
                _, _, gq = run_ref(mod, cast(Xq), cast(Gq))
                for n in avg:
                    avg[n] += gq[n].float() / dp
        fl = blk.ffn_local
        for nm, full, pick in (("d_gate", "gate_proj.weight", rows), ("d_up", "up_proj.weight", rows), ("d_down", "down_proj.weight", cols)):
            got = {"d_gate": blk.gate_up.weight.grad[:fl], "d_up": blk.gate_up.weight.grad[fl:], "d_down": blk.down.weight.grad}[nm]
            items.append(item(f"{nm} (DP mean)", got, pick(avg16[full], r, 2), pick(avg32[full], r, 2)))
    except Exception as e:  # noqa: BLE001 - reported on every rank below
        ok, detail = False, f"{type(e).__name__}: {e} | {traceback.format_exc().splitlines()[-3].strip()}"
    got = comm.allgather((ok, detail, [tuple(it) for it in items]))
    g2.close()
    sp.tp_comm.Free()
    sp.dp_comm.Free()
    if not all(o for o, _, _ in got):
        return False, "; ".join(f"r{q}: {dt}" for q, (o, dt, _) in enumerate(got) if not o)[:400]
    if len({len(its) for _, _, its in got}) != 1:
        return False, "ranks returned different item lists"
    # each TP group judged on its own batch: the items of one group's ranks together
    lines, all_ok = [], True
    for grp in sp.tp_groups:
        good, det = judge([got[q][2] for q in grp])
        all_ok &= good
        lines.append(f"group {list(grp)}: {det}")
    return all_ok, "; ".join(lines) + "; weights bitwise equal across the DP group after one step"


# --------------------------------------------------------------------------------------------
# worker / driver


def checks(ctx: Ctx, args):
    return [
        ("column[sp]", lambda c: check_linear(c, "column", True)),
        ("column[sp,keep]", lambda c: check_linear(c, "column", True, keep=True)),
        ("column[decode]", lambda c: check_linear(c, "column", False)),
        ("row[sp]", lambda c: check_linear(c, "row", True)),
        ("row[decode]", lambda c: check_linear(c, "row", False)),
        ("mlp[sp]", lambda c: check_mlp(c, True)),
        ("mlp[decode]", lambda c: check_mlp(c, False)),
        ("mlp_inplace[decode]", check_mlp_inplace),
        ("attn[sp]", check_attn),
        ("attn_inplace[decode]", check_attn_inplace),
        ("graph[mlp]", lambda c: check_graph(c, 5 if args.quick else 20)),
    ]


def worker(args) -> int:
    import torch  # before any fused op runs (launch/gpu_suite.sh: torch's import once failed after them)
    from mpi4py import MPI

    import rawflux
    from rawflux.dist import init

    comm = MPI.COMM_WORLD
    world = comm.Get_size()
    sub = comm.Dup()
    group = init(sub)
    torch.cuda.set_device(group.device_id)
    # the references: fp32 without TF32, bf16 with fp32 reductions (the stricter bar)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    ctx = Ctx(comm, group, args.seed, args.quick)
    all_ok = True

    def report(name, status, detail):
        nonlocal all_ok
        all_ok = all_ok and status != "FAIL"
        if comm.rank == 0:
            print(f"nn world={world} {name} {status}  {detail}", flush=True)

    if comm.rank == 0:
        print(f"nn world={world} info  {torch.cuda.get_device_name(group.device_id)}, torch {torch.__version__}, "
              f"wait timeout {group.timeout_s:.1f} s", flush=True)
    for name, fn in checks(ctx, args):
        if args.only and not re.search(args.only, name):
            continue
        t0 = time.perf_counter()
        ok, note, items, skipped = False, "", [], False
        try:
            ok, note, items = fn(ctx)
            torch.cuda.synchronize()
            group.raise_if_failed()
        except Skip as e:
            ok, note, skipped = True, str(e), True
        except Exception as e:  # noqa: BLE001 - reported; the group is rebuilt if it broke
            ok, note = False, f"{type(e).__name__}: {e} | {traceback.format_exc().splitlines()[-3].strip()}"
        got = comm.allgather((bool(ok), note, [tuple(it) for it in items], skipped))
        if not all(o for o, _, _, _ in got):
            status, detail = "FAIL", "; ".join(f"r{q}: {n}" for q, (o, n, _, _) in enumerate(got) if not o)[:600]
        elif all(s for _, _, _, s in got):
            status, detail = "SKIP", got[0][1]
        elif len({len(its) for _, _, its, _ in got}) != 1:
            status, detail = "FAIL", "ranks returned different item lists"
        else:
            good, det = judge([its for _, _, its, _ in got])
            status, detail = ("PASS" if good else "FAIL"), f"{got[0][1]}; {det}"
        report(name, status, f"{detail} [{time.perf_counter() - t0:.1f} s]")
        if any(comm.allgather(group.status_unchecked().failed)):  # device errors are sticky: a fresh group
            report(name + ".group", "FAIL", "the group failed; rebuilding it for the next checks")
            group.close()  # its op objects go with it (rawflux.nn drops ops of a closed group)
            sub.Free()
            sub = comm.Dup()
            group = init(sub)
            ctx = Ctx(comm, group, ctx.seed + 1, args.quick)
    if world == 4 and (not args.only or re.search(args.only, "dp[tp=2]")):
        t0 = time.perf_counter()
        ok, detail = dp_worker(comm, ctx.next_seed())
        report("dp[tp=2]", "PASS" if ok else "FAIL", f"{detail} [{time.perf_counter() - t0:.1f} s]")
    rawflux.nn.clear_cache()
    rawflux.dist.finalize()
    return 0 if all_ok else 1


def driver(args) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script from anywhere
    from _worlds import counts_summary, run_worlds

    worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
    extra = ["--seed", str(args.seed)] + (["--quick"] if args.quick else []) + (["--only", args.only] if args.only else [])
    got, failures = run_worlds(__file__, "nn", worlds, extra, real=args.real, timeout_s=args.per_world_timeout,
                               env_defaults={"RAWFLUX_WAIT_TIMEOUT_S": "30"}, needs_pass=True)
    print(counts_summary("nn", got, failures, worlds), flush=True)
    return 0 if not failures else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--real", action="store_true", help="one rank per GPU (rawflux-launch -n) instead of MPS emulation")
    ap.add_argument("--quick", action="store_true", help="fewer m values, 5 graph replays instead of 20")
    ap.add_argument("--only", default=None, help="regex: run only the checks whose name matches")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--per-world-timeout", type=float, default=300.0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
