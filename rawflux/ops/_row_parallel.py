"""What GEMM-ReduceScatter and GEMM + AllReduce share on the host.

Both take this rank's a (m, k_local) and weight shard b (n, k_local) ("nk") or (k_local, n) ("kn"),
both run one engine kernel whose epilogue Params have GEMM-RS's layout (out's tensor map, the
receive maps, then rs.EPI_TAIL), and at world 1 both are the plain GEMM into out. So the call
path (checks, the host's fast path, the launch) is one implementation here; an op says only how
many output rows a call of m has (``out_rows``), how it checks a call (``_check_call``) and what
its plan of m is (``_plan_entry``: (its plan or record fields, GemmPlan, Params past the out map)).
The construction's agreement, tuning's driver and the functional form's intake are shared too.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from .. import engine, env
from ..engine.launch import tensor_map
from ..runtime import DType, as_tensor, fastpath, intake_stream, new_output, resolve_stream, wrap_output
from ._collective import CollectiveOp, resolve_group, scratch_matrix

DTYPES = (DType.BF16, DType.F16)
B_LAYOUTS = ("nk", "kn")
MAX_WORLD = 8  # kRsMaxWorld: a tensor map per peer rides in the kernel's parameters
# Partial element types: name -> (kRsPart* code, bytes) (fused/rs_layout.cuh).
PARTIALS = {"bf16": (0, 2), "f16": (1, 2), "fp32": (2, 4)}
# Offsets past the out map (the per-call part of the Params) of bias and bias_kind: the receive
# maps, then EPI_TAIL's recv, sync, ctrl, bias, the peer tables, bias_kind (gemm_rs.EPI_TAIL).
BIAS_AT = 128 * MAX_WORLD + 24
BIAS_KIND_AT = 128 * MAX_WORLD + 32 + 16 * MAX_WORLD


def check_op_args(op: str, long_name: str, world: int, max_m: int, n: int, k: int, dtype, b_layout: str, partials, *,
                  rows_per_rank: bool) -> tuple[DType, str]:
    """Construction arguments of op ``op`` (clear errors before any allocation); returns (DType,
    partials). rows_per_rank: every rank gets m/W rows, so max_m >= W."""
    dt = DType.from_any(dtype)
    if dt not in DTYPES:
        raise TypeError(f"{op}: dtype {dt.tag} is not supported: use bf16 or f16")
    if b_layout not in B_LAYOUTS:
        raise ValueError(f"{op}: b_layout={b_layout!r}: use 'nk' (b_shard is (n, k), a linear layer's weight) or 'kn' (b_shard is (k, n))")
    if partials is None:
        partials = dt.tag
    if partials not in ("fp32", dt.tag):
        raise ValueError(f"{op}: partials={partials!r}: use {dt.tag!r} (default: the output's type) or 'fp32' (twice the bytes, "
                         "one rounding fewer)")
    for name, v in (("max_m", max_m), ("n", n), ("k", k)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{op}: {name}={v!r} must be a positive int")
    if n % 8 or k % 8:
        raise ValueError(f"{op}: n={n} and k={k} must be multiples of 8 (16-byte rows for the TMA loads and the stores)")
    if rows_per_rank and max_m < world:
        raise ValueError(f"{op}: max_m={max_m} is smaller than the world size {world}: every rank gets m/W >= 1 rows")
    if world > MAX_WORLD:
        raise ValueError(f"{op}: world size {world}: {long_name} runs within one node of at most {MAX_WORLD} ranks")
    return dt, partials


def check_same_args(got: list, names: tuple[str, ...], what: str) -> None:
    """``got``: every rank's construction arguments (``names``' values) followed by two values of
    its own (device key, grid). A ValueError listing every rank's where any rank differs."""
    if any(v[:-2] != got[0][:-2] for v in got):
        listing = "; ".join(f"rank {q}: " + ", ".join(f"{a}={b}" for a, b in zip(names, v)) for q, v in enumerate(got))
        raise ValueError(f"{what}: ranks build the op with different arguments ({listing}); every rank must pass the same")


@dataclass(eq=False)
class Fast:
    """A validated call's launch, for later calls with the same metadata: only the pointers and
    the stream are checked again (rawflux.runtime.fastpath)."""

    stream: int
    bound: engine.BoundGemm  # world > 1: the epilogue's Params past the out map written (bias_kind set)
    m: int
    rows: int  # out's rows
    ldc: int
    bias_kind: int
    spans: tuple[int, int, int]  # bytes covered by a, b_shard, bias
    out_span: int
    new_out: object  # makes a new output like the validated call's (None: that call passed out=)


class RowParallelOp(CollectiveOp):
    """The call path of GemmRS and GemmAR (module docstring). Subclasses set n, k, dtype,
    b_layout, config, _plans, _forced and provide out_rows(m), _check_call(...) and _plan_entry(m)."""

    def out_rows(self, m: int) -> int:
        raise NotImplementedError

    def _check_call(self, a, b_shard, bias, out, stream):
        raise NotImplementedError

    def _call_fields(self, head) -> tuple[int, ...]:
        """The call record's fields from the first item of a _plan_entry (the fields themselves here)."""
        return head

    def __call__(self, a, b_shard, *, bias=None, out=None, stream=None):
        """The op's result for this call (see the op's docstring). Every check runs before any
        launch; a previous call's device-side failure raises here."""
        key = fastpath.key(a, b_shard, bias, out)
        f = self.fast_entry(key)
        if f is not None:
            got = self._fast_call(f, a, b_shard, bias, out, stream)
            if got is not None:
                return got
        c = self._check_call(a, b_shard, bias, out, stream)
        res = self._call(c)
        if key is not None:
            self.remember_fast(key, self._fast_for(c, res, key[0]))
        return res

    def _check_m(self, m: int) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return (f"<rawflux {type(self).__name__} rank {self.rank}/{self.world} max_m={self.max_m} n={self.n} k={self.k} "
                f"{self.dtype.tag} {self.b_layout} partials={self.partials} ctas={self.ctas}>")

    def tune(self, m: int, *, top: int = 6, reps: int = 20, budget_s: float | None = None, stream=None):
        """Collective (every rank, the same m): time up to ``top`` configurations for calls of m on
        scratch inputs and keep the one whose slowest rank is fastest, for this op and in the
        fused-op table (RAWFLUX_TUNE=cached reads it at the next process's first call of m). Not
        in a graph capture. Returns the chosen configuration; ``last_tune`` holds the timed rows."""
        name = type(self).__name__
        if self.world == 1:
            raise ValueError(f"{name}.tune: world 1 runs the plain GEMM; tune it with RAWFLUX_TUNE=on (rawflux.gemm)")
        if self.config is not None:
            raise ValueError(f"{name}.tune: this op was built with a fixed config")
        m = int(m)
        self._check_m(m)
        import cupy

        s = resolve_stream(stream, ())
        with self._device():
            a = scratch_matrix((m, self.k), self.dtype, 1)
            b = scratch_matrix((self.n, self.k) if self.b_layout == "nk" else (self.k, self.n), self.dtype, 2)
            out = cupy.empty((self.out_rows(m), self.n), dtype=self.dtype.np)
            return self.run_tuning(m, lambda: self(a, b, out=out, stream=s), top=top, reps=reps, budget_s=budget_s, stream=s,
                                   label=lambda c: c.tile.tag())

    def _strides(self, c, rows: int) -> tuple[int, int, int]:
        """(lda, ldb, ldc) of a checked call (a row count of 1 has no stride of its own)."""
        m = c.ta.shape[0]
        lda = c.ta.strides[0] if m > 1 else self.k
        ldb = c.tb.strides[0] if c.tb.shape[0] > 1 else c.tb.shape[1]
        ldc = c.tout.strides[0] if c.tout is not None and rows > 1 else self.n
        return lda, ldb, ldc

    # --- the fast path (rawflux.runtime.fastpath): a call like a validated one -------------------
    def _fast_for(self, c, res, fw: str) -> Fast:
        """The fast-path entry of validated call c (already launched; res: what it returned)."""
        m = c.ta.shape[0]
        rows = self.out_rows(m)
        lda, ldb, ldc = self._strides(c, rows)
        if self.world == 1:
            bound = self._local_plan(m, c.stream).bind(lda, ldb)
        else:
            _, gplan, rest = self._plan_entry(m)
            if c.bias_kind:
                rest = rest[:BIAS_KIND_AT] + struct.pack("<i", c.bias_kind) + rest[BIAS_KIND_AT + 4:]
            bound = gplan.bind(lda, ldb)
            bound.set_epilogue(rest, 128)  # everything past the out map: the out map and bias pointer follow per call
        spans = (fastpath.span(c.ta), fastpath.span(c.tb), c.bias_span)
        new_out = None if c.tout is not None else fastpath.allocator(fw, res, self.device_id)
        return Fast(c.stream, bound, m, rows, ldc, c.bias_kind, spans, fastpath.byte_span(rows, self.n, ldc, self.dtype.itemsize), new_out)

    def _fast_call(self, f: Fast, a, b_shard, bias, out, stream):
        """Launch f for these arrays, or None where the validated path must look at the call."""
        got = self.fast_args(f, a, b_shard, bias, out, stream)
        if got is None:
            return None
        s, out, pa, pb, pc, pbias = got
        with self._fast_lock:
            f.bound.point(pa, pb)
            if f.bound.out_changed(pc, pbias):
                if self.world == 1:
                    f.bound.set_epilogue(engine.epilogue_params(engine.plain_epilogue(self.dtype), pc, f.m, self.n, f.ldc, self.dtype,
                                                                pbias, f.bias_kind))
                else:
                    f.bound.set_epilogue(tensor_map(pc, self.dtype, f.rows, self.n, f.ldc, 64, 64))
                    f.bound.set_epilogue(struct.pack("<Q", pbias), 128 + BIAS_AT)
            f.bound.launch(s)
            self.calls += 1
        return out

    # --- the validated path ---------------------------------------------------------------------
    def _call(self, c):
        """A call whose every argument the op's checks passed."""
        ta, tb, s, n, dt = c.ta, c.tb, c.stream, self.n, self.dtype
        m = ta.shape[0]
        rows = self.out_rows(m)
        tc = c.tout if c.tout is not None else new_output((rows, n), dt, ta, stream=s)[0]
        lda, ldb, _ = self._strides(c, rows)
        ldc = tc.strides[0] if rows > 1 else n
        if self.world == 1:
            self.begin(s, (m,))
            epi = engine.epilogue_params(engine.plain_epilogue(dt), tc.ptr, m, n, ldc, dt, c.bias_ptr, c.bias_kind)
            self._local_plan(m, s).launch(ta.ptr, tb.ptr, lda=lda, ldb=ldb, stream=s, epilogue_params=epi)
            return wrap_output(ta, tc, stream=s)
        if m not in self._plans and self.config is None and self.tunable and m not in self._forced and env.tune_mode() == "on":
            self.tune_first_use(m, s)
        head, gplan, rest = self._plan_entry(m)
        self.begin(s, self._call_fields(head))
        if c.bias_kind:
            rest = (rest[:BIAS_AT] + struct.pack("<Q", c.bias_ptr) + rest[BIAS_AT + 8:BIAS_KIND_AT] + struct.pack("<i", c.bias_kind)
                    + rest[BIAS_KIND_AT + 4:])
        out_map = tensor_map(tc.ptr, dt, rows, n, ldc, 64, 64)
        gplan.launch(ta.ptr, tb.ptr, lda=lda, ldb=ldb, stream=s, epilogue_params=out_map + rest)
        return wrap_output(ta, tc, stream=s)

    def _local_plan(self, m: int, stream: int | None):
        """World 1: the plain GEMM's plan (the configuration rawflux.gemm would pick); stream None:
        the current one (warmup)."""
        cfg = self.config or engine.pick_config(m, self.n, self.k, self.dtype, self.b_layout, self.dtype, self.device_id)
        stream = resolve_stream(None, ()) if stream is None else stream
        return engine.plan(cfg, m, self.n, self.k, dtype=self.dtype, b_layout=self.b_layout, out_dtype=self.dtype,
                           device_id=self.device_id, stream=stream)


def functional(name: str, fn_ops, build, a, b_shard, group, *, b_layout: str, bias, out, stream, partials):
    """A row-parallel op's functional form: the fast path of a call like a validated one, else
    every argument checked before the op is built or grown (a collective step), so that a rank
    with a bad argument raises here and its peers at the bounded agreement instead of hanging.
    ``build(group, ta, tb, n, k, partials, stream)`` runs the op's own checks and returns
    (the shared op object, the checked Call)."""
    key = fastpath.key(a, b_shard, bias, out)
    options = (b_layout, partials)
    if key is not None:
        got = fn_ops.call(group, options, key, a, b_shard, bias, out, stream)
        if got is not None:
            return got
    if b_layout not in B_LAYOUTS:
        raise ValueError(f"{name}: b_layout={b_layout!r}: use 'nk' (b_shard is (n, k)) or 'kn' (b_shard is (k, n))")
    if partials is not None and partials not in PARTIALS:
        raise ValueError(f"{name}: partials={partials!r}: use the output's type (default) or 'fp32'")
    group = resolve_group(group)
    s = intake_stream(stream, (a, b_shard, bias, out))
    ta = as_tensor(a, "a", stream=s, accept=DTYPES)
    tb = as_tensor(b_shard, "b_shard", stream=s, accept=DTYPES)
    if ta.ndim != 2 or tb.ndim != 2:
        raise ValueError(f"{name}: a and b_shard must be 2-D matrices, got shapes {tuple(ta.shape)} and {tuple(tb.shape)}")
    if ta.dtype not in DTYPES:
        raise TypeError(f"{name}: a has dtype {ta.dtype.tag}: use bf16 or f16")
    m, k = ta.shape
    n = tb.shape[0] if b_layout == "nk" else tb.shape[1]
    kb = tb.shape[1] if b_layout == "nk" else tb.shape[0]
    if kb != k:
        raise ValueError(f"{name}: a is (m, k) = {tuple(ta.shape)} but b_shard ({b_layout!r}) is {tuple(tb.shape)}: k differs ({k} vs {kb})")
    op, c = build(group, ta, tb, n, k, partials, s if s is not None else stream)
    res = op._call(c)
    if key is not None:
        fn_ops.remember(options, key, op, op._fast_for(c, res, key[0]))
    return res
