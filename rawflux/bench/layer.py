"""The ``layer`` op: a Llama-shaped block's tensor-parallel linear layers timed as model steps, as
the FLUX paper reports them (``--op layer``; not part of ``--op all``: weights of a 70B block and
three phases take minutes, so it runs when asked).

    rawflux-launch -m rawflux.bench --op layer                              # llama70b, every phase
    rawflux-launch -n 8 -m rawflux.bench --op layer --phase train,prefill --m 4096,8192
    rawflux-launch --emulate 4 -m rawflux.bench --op layer --quick --shapes tiny

Shapes (``--shapes``): presets ``llama70b`` (hidden 8192, ffn 28672, 64 query heads and 8 KV
heads of 128: the default) and ``tiny`` (1024, 3584, 16 / 8 heads of 64: a smoke run), or
"hidden,ffn,heads,kv_heads,head_dim". TP = W: heads, KV heads and ffn split over the ranks.

Phases (``--phase``, default all), at m = seq * batch tokens:
  train    forward + backward (input and weight gradients), sequence parallel, m from --m
  prefill  forward, sequence parallel, m from --m (default 1024..8192)
  decode   forward, no sequence parallelism (GEMM, and GEMM + all-reduce), m from --decode-m (1..64)

The block and the ways its layers run are in rawflux/bench/layer_steps.py: the attention
projections and the MLP (rawflux.nn.TPAttentionProjections, TPMLP) with an elementwise stand-in
for attention, so what is timed is the TP linear layers and their communication. Rows:
  nonoverlap      Megatron-style layers over rawflux.baseline (NCCL + cuBLAS, one after the other;
                  the ipc backend on the emulated node, where NCCL refuses)
  rawflux         rawflux.nn (fused ag_gemm / gemm_rs; decode: rawflux.gemm + all-reduce)
  torch_async_tp  torch SymmetricMemory's fused ops in the same places (one rank per GPU,
                  sequence parallel phases only; skipped with the reason elsewhere)
  gemm_only       the step's GEMMs alone (torch.matmul) on operands of their shapes: the bound
Before a rawflux or async-TP row is timed its step runs once on the reference's inputs and
weights: output and every gradient within REL_TOL (relative, Frobenius) of the nonoverlap
step's, on every rank, or the row is not timed and is listed as failed (the run file's
meta.failed). Times are device time per step: the timer's delay kernel also covers the host's
time to queue a step, recorded as host_ms.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from .problems import parse_ints
from .registry import Failed, Unavailable

PHASES = ("train", "prefill", "decode")
DECODE_M, QUICK_DECODE_M = (1, 4, 16, 64), (16,)
REL_TOL = 2e-2


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def q(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim


LAYER_PRESETS = {
    "llama70b": LayerShape(8192, 28672, 64, 8, 128),
    "tiny": LayerShape(1024, 3584, 16, 8, 64),  # every shard a multiple of 8 up to W = 8
}


@dataclass(frozen=True)
class LayerProblem:
    """One phase of the block at m tokens on W ranks. n and k (the records' fields) are the
    hidden and ffn sizes; label is "<shape>.<phase>"."""

    phase: str
    m: int
    shape: LayerShape
    dtype: str
    world: int
    label: str
    op: str = "layer"

    @property
    def n(self) -> int:
        return self.shape.hidden

    @property
    def k(self) -> int:
        return self.shape.ffn

    @property
    def seq_parallel(self) -> bool:
        return self.phase != "decode"

    @property
    def rows(self) -> int:
        """Rows of this rank's input and output: m/W sequence parallel, else m."""
        return self.m // self.world if self.seq_parallel else self.m

    def check(self) -> str | None:
        """None when the block splits over W ranks as rawflux.nn needs, else why not."""
        s, w = self.shape, self.world
        if self.phase not in PHASES:
            return f"phase {self.phase!r}: one of {', '.join(PHASES)}"
        if self.dtype not in ("bf16", "f16"):
            return f"the layer op takes bf16 or f16 (rawflux.nn's types), not {self.dtype}"
        if min(self.m, s.hidden, s.ffn, s.heads, s.kv_heads, s.head_dim) <= 0:
            return "m and every dimension must be positive"
        if s.heads % s.kv_heads:
            return f"num_heads = {s.heads} is not a multiple of num_kv_heads = {s.kv_heads}"
        bad = [f"{name} = {v}" for name, v in (("num_heads", s.heads), ("num_kv_heads", s.kv_heads), ("ffn", s.ffn)) if v % w]
        if bad:
            return f"{' and '.join(bad)} not divisible by world {w} (every rank holds whole heads and ffn / W)"
        if self.seq_parallel and self.m % w:
            return f"m = {self.m} not divisible by world {w} (sequence parallel: m / W rows per rank)"
        odd = [f"{name} = {v}" for name, v in (("hidden", s.hidden), ("heads / W * head_dim", s.q // w),
                                               ("kv_heads / W * head_dim", s.kv // w), ("ffn / W", s.ffn // w)) if v % 8]
        if odd:
            return f"{' and '.join(odd)} not a multiple of 8 (the fused kernels move 16-byte rows)"
        return None

    def local(self) -> dict:
        """This rank's shapes: input x, the weight shards (out, in) and the column layers' outputs."""
        s, w, m = self.shape, self.world, self.m
        qkv = (s.q + 2 * s.kv) // w
        return {"x": (self.rows, s.hidden), "w_qkv": (qkv, s.hidden), "w_o": (s.hidden, s.q // w),
                "w_gate_up": (2 * s.ffn // w, s.hidden), "w_down": (s.hidden, s.ffn // w),
                "qkv": (m, qkv), "attn": (m, s.q // w), "gate_up": (m, 2 * s.ffn // w), "act": (m, s.ffn // w)}

    def gemms(self) -> list[tuple[int, int, int, bool, bool]]:
        """The step's GEMMs on this rank: (M, N, K, a transposed, b transposed) of out (M, N) =
        a (M, K) @ b (K, N); a transposed view of a (K, M) tensor, b of an (N, K) one (a weight)."""
        loc = self.local()
        fwd = [(self.m, loc[w][0], loc[w][1]) for w in ("w_qkv", "w_o", "w_gate_up", "w_down")]
        out = [(m, n, k, False, True) for m, n, k in fwd]
        if self.phase == "train":
            for m, n, k in reversed(fwd):
                out += [(m, k, n, False, False),  # input gradient: dy (m, n) @ w (n, k)
                        (n, k, m, True, False)]  # weight gradient: dy^T @ x
        return out

    @property
    def flops_per_rank(self) -> float:
        return float(sum(2 * m * n * k for m, n, k, _, _ in self.gemms()))

    def input_bytes(self, itemsize: int) -> int:
        """One input set: x, and the output gradient for training (the harness sizes the sets by it)."""
        return self.rows * self.shape.hidden * itemsize * (2 if self.phase == "train" else 1)

    def extra(self) -> dict:
        """The fields a layer record adds."""
        s = self.shape
        return {"phase": self.phase, "hidden": s.hidden, "ffn": s.ffn, "heads": s.heads, "kv_heads": s.kv_heads,
                "head_dim": s.head_dim, "seq_parallel": self.seq_parallel}


def parse_layer_shapes(spec: str) -> list[tuple[str, LayerShape]]:
    """Preset names (joined by ',' or '+') or "hidden,ffn,heads,kv_heads,head_dim" items
    separated by spaces or ';' -> [(label, shape)]."""
    out = []
    for item in spec.replace(";", " ").split():
        if item.replace(",", "").isdigit():
            vals = parse_ints(item, f"layer shape {item!r}")
            if len(vals) != 5:
                raise ValueError(f"layer shape {item!r}: give hidden,ffn,heads,kv_heads,head_dim "
                                 f"(or a preset: {', '.join(LAYER_PRESETS)})")
            out.append((item, LayerShape(*vals)))
            continue
        for key in filter(None, (t.strip() for t in item.lower().replace("+", ",").split(","))):
            if key not in LAYER_PRESETS:
                raise ValueError(f"--shapes {key!r}: the layer op's presets are {', '.join(LAYER_PRESETS)}, "
                                 "or give hidden,ffn,heads,kv_heads,head_dim")
            out.append((key, LAYER_PRESETS[key]))
    if not out:
        raise ValueError(f"--shapes {spec!r}: no layer shape (presets: {', '.join(LAYER_PRESETS)})")
    return list(dict.fromkeys(out))


def parse_phases(text: str) -> list[str]:
    got = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [t for t in got if t not in PHASES]
    if bad or not got:
        raise ValueError(f"--phase {text!r}: comma-separated, among {', '.join(PHASES)}")
    return list(dict.fromkeys(got))


def build_layer_problems(spec: str, ms, decode_ms, phases, dtypes, world: int) -> list[LayerProblem]:
    """Every (shape, phase, m, dtype) to time, in a stable order."""
    return [LayerProblem(ph, int(m), shape, dt, world, f"{label}.{ph}")
            for label, shape in parse_layer_shapes(spec) for ph in phases
            for m in (decode_ms if ph == "decode" else ms) for dt in dtypes]


# --------------------------------------------------------------------------------------------
# the impls' factories (rawflux/bench/builtin.py registers them; torch on the GPU, the steps
# themselves in layer_steps.py)


def _cuda(torch, group, stream):
    """(device, on, sync): this rank's GPU, a context making the bench stream torch's current
    stream, and a device synchronisation. The CPU tests swap this for the CPU's."""
    dev = torch.device("cuda", group.device_id)
    torch.cuda.set_device(dev)
    ts = torch.cuda.ExternalStream(int(stream.ptr), device=dev)
    return dev, lambda: torch.cuda.stream(ts), lambda: torch.cuda.synchronize(dev)


class _State:
    """What the rows of one layer problem share: the rawflux modules (every way runs on their
    weights), the input sets, the bench stream, and the reference step's results."""

    def __init__(self, ctx):
        try:
            import torch
        except ImportError:
            raise Unavailable("torch is not installed (the layer op runs torch modules)") from None
        import rawflux.nn as tp

        from . import layer_steps

        p, g = ctx.problem, ctx.group
        self.torch, self.steps, self.p, self.group = torch, layer_steps, p, g
        self.dev, self.on, self.sync = _cuda(torch, g, ctx.stream)
        self.dtype = getattr(torch, {"bf16": "bfloat16", "f16": "float16"}[p.dtype])
        s, sp = p.shape, p.seq_parallel
        kw = dict(sequence_parallel=sp, keep_gathered=True, max_m=p.m if sp else None, device=self.dev, dtype=self.dtype)
        # decode: every rank holds the whole batch, so the same one
        seed = ctx.seed if sp else g.comm.bcast(ctx.seed, root=0)
        with self.on():
            self.proj = tp.TPAttentionProjections(s.hidden, s.heads, s.kv_heads, s.head_dim, g, **kw)
            self.mlp = tp.TPMLP(s.hidden, s.ffn, g, **kw)
            gen = torch.Generator(device=self.dev)
            gen.manual_seed(ctx.seed)
            layers = (self.proj.qkv, self.proj.out, self.mlp.gate_up, self.mlp.down)
            with torch.no_grad():  # torch.nn.Linear's distribution, fresh on every rank
                for lay in layers:
                    bound = 1.0 / math.sqrt(lay.in_features)
                    lay.weight.uniform_(-bound, bound, generator=gen)
            self.params = layer_steps.weights(self.proj, self.mlp)
            gen.manual_seed(seed + 1)
            train = p.phase == "train"
            self.xs = [self.randn((p.rows, s.hidden), gen).requires_grad_(train) for _ in range(ctx.nsets)]
            self.dys = [self.randn((p.rows, s.hidden), gen) for _ in range(ctx.nsets)] if train else []
        self.sync()
        self._ref = None
        self._ref_err = None

    def randn(self, shape, gen):
        return self.torch.randn(shape, generator=gen, device=self.dev, dtype=self.torch.float32).to(self.dtype)

    def step(self, way: str, symm_name=None):
        block = self.steps.build(way, self.proj, self.mlp, self.group, sequence_parallel=self.p.seq_parallel, symm_name=symm_name)
        return self.steps.step_fn(block, self.p.phase == "train", self.xs, self.dys, self.params)

    def reference(self):
        """The nonoverlap step's results on input set 0 (computed once per problem)."""
        if self._ref is None and self._ref_err is None:
            try:
                step = self.step("nonoverlap")
                with self.on():
                    self._ref = [t.detach().clone() for t in step(0)]
            except Exception as e:  # noqa: BLE001  (the rows that need it say why)
                self._ref_err = f"{type(e).__name__}: {e}"
        if self._ref is None:
            raise Unavailable(f"correctness guard: the nonoverlap reference step failed ({self._ref_err})")
        return self._ref

    def guard(self, way: str, step) -> None:
        """Raise Failed unless ``step`` matches the reference on every rank (collective)."""
        ref = self.reference()
        with self.on():  # compared on the stream that computed it (torch's default one would not wait)
            errs = self.steps.rel_errors(step(0), ref)
        name, worst = max(((k, v if math.isfinite(v) else math.inf) for k, v in errs.items()), key=lambda kv: kv[1])
        every = self.group.comm.allgather((worst, name))
        r = max(range(len(every)), key=lambda i: every[i][0])
        if not every[r][0] <= REL_TOL:
            raise Failed(f"{way} step's {every[r][1]} differs from the nonoverlap step's by {every[r][0]:.3g} "
                         f"(relative, rank {r}; bound {REL_TOL})")

    def timed(self, step):
        on = self.on

        def run(i):
            with on():
                step(i)

        run.host_us = _host_us(run, self.sync)
        return run


def _host_us(run, sync) -> float:
    """The host's time to queue one execution: the worst of three, each after the device is idle,
    after one more (a first call sets up cuBLAS handles and workspaces)."""
    run(0)
    worst = 0.0
    for _ in range(3):
        sync()
        t0 = time.perf_counter()
        run(0)
        worst = max(worst, time.perf_counter() - t0)
    sync()
    return worst * 1e6


def _state(ctx) -> _State:
    st = ctx.cache.get("layer")
    if st is None:
        st = ctx.cache["layer"] = _State(ctx)
    return st


def nonoverlap_row(ctx):
    """Megatron-style TP layers over rawflux.baseline (collective and cuBLAS GEMM one after the other)"""
    st = _state(ctx)
    st.reference()  # also its first run: compiles and sizes outside the timing
    return st.timed(st.step("nonoverlap"))


def rawflux_row(ctx):
    """rawflux.nn TPAttentionProjections + TPMLP (fused ag_gemm / gemm_rs)"""
    st = _state(ctx)
    step = st.step("rawflux")
    st.guard("rawflux", step)
    return st.timed(step)


def async_tp_row(ctx):
    """torch SymmetricMemory async-TP (fused_all_gather_matmul / fused_matmul_reduce_scatter) in the same layers"""
    if not ctx.problem.seq_parallel:
        raise Unavailable("decode has no sequence parallelism: no AllGather-matmul or matmul-ReduceScatter for async-TP to fuse")
    from .builtin import _torch_symm_group

    name = _torch_symm_group(ctx)
    st = _state(ctx)
    step = st.step("torch_async_tp", symm_name=name)
    st.guard("torch_async_tp", step)
    return st.timed(step)


def gemm_only_row(ctx):
    """the step's GEMMs alone (torch.matmul, cuBLAS) on random operands of their shapes: the lower bound"""
    st = _state(ctx)
    torch = st.torch
    gen = torch.Generator(device=st.dev)
    gen.manual_seed(ctx.seed + 17)
    ops = []
    with st.on():
        for m, n, k, a_t, b_t in ctx.problem.gemms():
            a = st.randn((k, m), gen).t() if a_t else st.randn((m, k), gen)
            b = st.randn((n, k), gen).t() if b_t else st.randn((k, n), gen)
            ops.append((a, b, torch.empty((m, n), device=st.dev, dtype=st.dtype)))

    def run(i):
        with st.on():
            for a, b, out in ops:
                torch.matmul(a, b, out=out)

    run.host_us = _host_us(run, st.sync)
    return run
