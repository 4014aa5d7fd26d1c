"""rawflux.gemm: C = A @ B^T ("nk", B is a linear layer's (n, k) weight) or A @ B ("kn"), on the
sm_90a engine in cuda_src/rawflux/gemm (persistent, warp-specialized, TMA + wgmma).

Arrays in, array out (CuPy / torch / DLPack ...), every check before the launch; the launch goes
through the engine's plan (rawflux.engine), which the fused ops use with their own policies.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .. import engine, tune
from ..engine import GemmPlan
from ..runtime import DType, as_tensor, check_matrix, check_out, fastpath, intake_stream, new_output, resolve_stream, wrap_output
from ..tune import GemmConfig

__all__ = ["gemm"]

DTYPES = (DType.BF16, DType.F16)

engine.register_variants(sched=engine.PLAIN_SCHED, epilogue=engine.plain_epilogue)
engine.register_variants(sched=engine.PLAIN_SCHED, epilogue=engine.plain_epilogue, tiles=tune.KSPLIT_TILES)  # k-split clusters: plain GEMM only
for _w in tune.NARROW_WIDTHS:  # narrow columns: the plain GEMM's 128x256 pair, B (n, k), 16-bit C
    for _dt in (DType.BF16, DType.F16):
        engine.register_variants(sched=engine.narrow_sched(_w), epilogue=engine.TMA_STORE_EPI, tiles=tune.NARROW_TILES, dtypes=(_dt,),
                                 layouts=("nk",), out_dtypes=(_dt,))


def _timer(launch_with, stream: int, device_id: int):
    def time_us(cfg: GemmConfig) -> float:
        import cupy

        from ..runtime import cupy_stream

        with cupy.cuda.Device(device_id):
            s = cupy_stream(stream)
            for _ in range(2):
                launch_with(cfg)
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            reps = 10
            start.record(s)
            for _ in range(reps):
                launch_with(cfg)
            stop.record(s)
            stop.synchronize()
            return cupy.cuda.get_elapsed_time(start, stop) * 1000.0 / reps

    return time_us


# ------------------------------------------------------------------------------------------------
# the array-level op


# ------------------------------------------------------------------------------------------------
# fast path: a call whose metadata (types, shapes, strides, dtypes, devices, options: no pointers)
# matches an earlier fully validated call reuses that validation and launch plan; only what
# depends on the pointers (alignment, overlap with the output, tensor maps) is redone.


@dataclass(eq=False)
class _Fast:
    bound: engine.BoundGemm  # the plan's launch with its own argument block
    ldc: int
    out_shape: tuple[int, int]
    plan_out_dtype: DType  # C's type (its tensor map)
    bias_kind: int
    epilogue: str  # the plan's epilogue policy (its params are rebuilt per output pointer)
    spans: tuple[int, int, int, int]  # bytes covered by a, b, out, bias
    stream: int  # the plan's split-K workspace belongs to this stream
    new_out: object  # makes a new output like the validated call's (fastpath.allocator)
    lock: threading.Lock = field(default_factory=threading.Lock)  # one thread patches and launches at a time


_fast: dict[tuple, _Fast] = {}
_FAST_MAX = 1024


def _fast_call(fw, f: _Fast, a, b, bias, out):
    stream = fastpath.current_stream(fw, a.get_device() if fw == "torch" else a.device.id)
    if stream != f.stream:
        return None  # another stream: the validated path makes a plan (and workspace) for it
    if out is None:
        out = f.new_out()
    sa, sb, sc, sbias = f.spans
    ptrs = fastpath.pointers(fw, a, b, bias, out, sc, (sa, sb, sbias))
    if ptrs is None:
        return None  # a misaligned pointer or out overlapping an input: the validated path says which
    pa, pb, pc, pbias = ptrs
    with f.lock:
        f.bound.point(pa, pb)
        if f.bound.out_changed(pc, pbias):
            m, n = f.out_shape
            f.bound.set_epilogue(engine.epilogue_params(f.epilogue, pc, m, n, f.ldc, f.plan_out_dtype, pbias, f.bias_kind))
        f.bound.launch(stream)
    return out


def gemm(a, b, *, b_layout: str = "nk", bias=None, out=None, out_dtype=None, stream=None, config: GemmConfig | None = None):
    """C = a @ b^T (b_layout "nk": b is (n, k), a linear layer's weight) or a @ b ("kn": b is (k, n)).

    a: (m, k) bf16 or f16, row-major rows (row pitch a multiple of 8 elements); b: same dtype;
    n and k multiples of 8, any m >= 1. bias: (n,) of a's dtype or float32, added in fp32.
    out / out_dtype: a's dtype (default) or float32. Returns the output in the caller's framework
    (``out`` itself when given). Runs on ``stream`` (else torch's current stream for torch inputs,
    else CuPy's). Every check happens before the launch.
    """
    fw = fastpath.framework(a) if stream is None else None
    key = None
    if fw is not None and fastpath.same_framework(fw, b, bias, out):
        try:
            key = (fw, b_layout, out_dtype, config) + fastpath.call_key(fw, a, b, bias, out)
            hit = _fast.get(key)
        except (AttributeError, TypeError):  # not a plain array after all (or unhashable options)
            key = hit = None
        if hit is not None:
            got = _fast_call(fw, hit, a, b, bias, out)
            if got is not None:
                return got
    res, entry = _gemm_checked(a, b, b_layout=b_layout, bias=bias, out=out, out_dtype=out_dtype, stream=stream, config=config,
                               want_entry=key is not None)
    if key is not None and entry is not None:
        if len(_fast) >= _FAST_MAX:
            _fast.clear()
        _fast[key] = entry
    return res


def _gemm_checked(a, b, *, b_layout, bias, out, out_dtype, stream, config, want_entry: bool = False):
    """The validated path: every check, then the launch. Returns (result, fast-path entry or None)."""
    if b_layout not in ("nk", "kn"):
        raise ValueError(f"b_layout must be 'nk' (b is (n, k)) or 'kn' (b is (k, n)), not {b_layout!r}")
    # Every check before the first CUDA call (CuPy and torch inputs are read without one); the
    # stream is asked for after them, unless reading an input needs it.
    s = intake_stream(stream, (a, b, bias, out))
    # Pitch alignment is checked below, after the shape checks, so a bad k or n gets its own message.
    ta = check_matrix(as_tensor(a, "a", stream=s, accept=DTYPES), "a", dtypes=DTYPES, device=None, ld_ok=True, pitch_align=1)
    dev = ta.device
    tb = check_matrix(as_tensor(b, "b", stream=s, accept=(ta.dtype,)), "b", dtypes=(ta.dtype,), device=dev, ld_ok=True,
                      pitch_align=1)
    m, k = ta.shape
    if b_layout == "nk":
        n, kb = tb.shape
        bdesc = "(n, k)"
    else:
        kb, n = tb.shape
        bdesc = "(k, n)"
    if kb != k:
        raise ValueError(f"a is (m, k) = {tuple(ta.shape)} but b ({b_layout!r} layout, {bdesc}) is {tuple(tb.shape)}: k differs ({k} vs {kb})")
    if k < 8 or k % 8:
        raise ValueError(f"k = {k} must be a positive multiple of 8 (16-byte rows for the TMA loads)")
    if n < 8 or n % 8:
        raise ValueError(f"n = {n} must be a positive multiple of 8 (16-byte rows for the TMA loads and stores)")
    for name, t in (("a", ta), ("b", tb)):
        if t.shape[0] > 1 and t.strides[0] % 8:
            raise ValueError(f"{name}'s row pitch {t.strides[0]} elements is not a multiple of 8 (rows must start 16-byte aligned)")
    if out is not None:
        out = as_tensor(out, "out", stream=s)  # once: check_out takes the Tensor as it is
    od = (out.dtype if out is not None else ta.dtype) if out_dtype is None else DType.from_any(out_dtype)
    if od not in engine.out_dtypes_for(ta.dtype):
        raise TypeError(f"out dtype {od} is not supported for {ta.dtype} inputs: use {ta.dtype} or f32")
    tbias, bias_ptr, bias_kind = engine.bias_args(bias, n, ta.dtype, dev, s, like="a", device_owner="a")
    inputs = {"a": ta, "b": tb} if tbias is None else {"a": ta, "b": tb, "bias": tbias}
    if out is not None:
        out = check_out(out, "out", shape=(m, n), dtype=od, device=dev, inputs=inputs, device_owner="a", stream=s)
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"config must be a rawflux.tune.GemmConfig, got {type(config).__name__}")
    if config is not None and ((config.tile not in tune.TILES and config.tile not in tune.KSPLIT_TILES)
                               or not config.tile.supports(b_layout)):
        raise ValueError(f"config tile {config.tile.tag()} is not a compiled variant for layout {b_layout!r}")
    if s is None:
        s = resolve_stream(None, [t for t in (ta, tb, tbias, out) if t is not None])
    tc = out if out is not None else new_output((m, n), od, ta, stream=s)[0]
    if m == 0:
        return wrap_output(ta, tc, stream=s), None
    engine.check_arch(dev)
    lda, ldb = ta.strides[0] if m > 1 else k, tb.strides[0] if tb.shape[0] > 1 else tb.shape[1]
    ldc = tc.strides[0] if m > 1 else n
    epilogue = engine.plain_epilogue(od)
    epi = engine.epilogue_params(epilogue, tc.ptr, m, n, ldc, od, bias_ptr, bias_kind)

    def plan_for(cfg: GemmConfig) -> GemmPlan:
        return engine.plan(cfg, m, n, k, dtype=ta.dtype, b_layout=b_layout, out_dtype=od, device_id=dev, stream=s)

    def launch_with(cfg: GemmConfig) -> None:
        plan_for(cfg).launch(ta.ptr, tb.ptr, lda=lda, ldb=ldb, stream=s, epilogue_params=epi)

    cfg = config or engine.pick_config(m, n, k, ta.dtype, b_layout, od, dev, timer=_timer(launch_with, s, dev))
    plan = plan_for(cfg)
    plan.launch(ta.ptr, tb.ptr, lda=lda, ldb=ldb, stream=s, epilogue_params=epi)
    res = wrap_output(ta, tc, stream=s)
    entry = None
    if want_entry and ta.framework == tb.framework == tc.framework and ta.framework in ("torch", "cupy") and tc.wrap_to is None:
        entry = _Fast(plan.bind(lda, ldb), ldc, (m, n), od, bias_kind, epilogue,
                      (fastpath.span(ta), fastpath.span(tb), fastpath.span(tc), fastpath.span(tbias)), s,
                      fastpath.allocator(ta.framework, res, dev))
    return res, entry
