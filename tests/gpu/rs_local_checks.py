#!/usr/bin/env python3
"""GEMM-ReduceScatter's protocol with W ranks in one process (rawflux/bench/rs_local.py): W kernels
on W streams of one GPU, each on SMs / W CTAs, exchanging through distinct buffers. Correctness only.

    python tests/gpu/rs_local_checks.py [--worlds 2,4]

Checks (fresh random inputs; outputs poisoned with NaN before every call), one line each,
"rs_local world=W <check> PASS|FAIL detail":
  correct.*   every rank's rows against a float64 reference (relative Frobenius error), shapes with
              m/W not a multiple of the tile, both layouts, bias, fp32 partials, the 64-row tile;
  sequence    12 consecutive calls with m changing between them (epochs, both parities), each checked;
  bitwise     the same inputs 10 times: identical bits on every rank.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


def _inputs(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def _dev16(x, tag):
    """float32 host array -> 16-bit device array (round to nearest even)."""
    import cupy

    from tests.gpu.gemm_rs_checks import dev_from_f32

    return dev_from_f32(cupy.asarray(x, dtype=cupy.float32), tag)


def _to_f64(x, tag):
    from tests.gpu.gemm_rs_checks import host_f64

    return host_f64(x)


def _poisoned(shape, tag):
    from tests.gpu.gemm_rs_checks import empty16, poison

    x = empty16(shape, tag)
    poison(x)
    return x


def run_call(ops, a, b, outs, bias=None):
    import cupy

    streams = [cupy.cuda.Stream(non_blocking=True) for _ in ops]
    for op, s, ar, br, o in zip(ops, streams, a, b, outs):
        op(ar, br, bias=bias, out=o, stream=s.ptr)
    for s in streams:
        s.synchronize()
    bad = [op.failed() for op in ops]
    if any(bad):
        raise RuntimeError(f"device-side failure states {bad}")


def _problem(rng, W, m, n, k, layout, tag, bias_kind):
    """Fresh inputs of every rank and the float64 reference of the whole (m, n) sum."""
    import cupy

    a16 = [_dev16(_inputs(rng, (m, k)), tag) for _ in range(W)]
    b16 = [_dev16(_inputs(rng, (n, k) if layout == "nk" else (k, n)), tag) for _ in range(W)]
    a64 = [_to_f64(x, tag) for x in a16]
    b64 = [_to_f64(x, tag) for x in b16]
    full = sum(ai @ (bi.T if layout == "nk" else bi) for ai, bi in zip(a64, b64))
    bias = None
    if bias_kind:
        bh = _inputs(rng, (n,))
        bias = cupy.asarray(bh) if bias_kind == "f32" else _dev16(bh, tag)
        full = full + (bh.astype(np.float64) if bias_kind == "f32" else _to_f64(bias, tag))
    return a16, b16, bias, full


def _errors(outs, full, W, tag):
    m_loc = full.shape[0] // W
    errs = []
    for r in range(W):
        got = _to_f64(outs[r], tag)
        ref = full[r * m_loc:(r + 1) * m_loc]
        errs.append(float(np.linalg.norm(np.nan_to_num(got, nan=1e30) - ref) / np.linalg.norm(ref)))
    return errs


def check_case(W, name, m, n, k, layout, tag, partials, bias_kind, config, seed):
    from rawflux.bench.rs_local import local_world

    a16, b16, bias, full = _problem(np.random.default_rng(seed), W, m, n, k, layout, tag, bias_kind)
    ops = local_world(W, m, n, k, tag, layout, partials=partials, config=config)
    outs = [_poisoned((m // W, n), tag) for _ in range(W)]
    run_call(ops, a16, b16, outs, bias=bias)
    errs = _errors(outs, full, W, tag)
    tol = 8e-3 if partials != "fp32" else 5e-3
    ok = max(errs) < tol
    t = ops[0].plan(m).cfg.tile
    return ok, f"{name} m={m} n={n} k={k} {layout} {tag} partials={partials or tag} bias={bias_kind} tile={t.tag()}: err max {max(errs):.2e} (< {tol})"


def check_sequence(W, seed, calls: int = 12):
    """Consecutive calls of one set of ops with m changing between them (both parities, slots of
    one call's m next to the other parity's of another m), each checked."""
    from rawflux.bench.rs_local import local_world

    rng = np.random.default_rng(seed)
    n, k, rows_max = 512, 256, 256
    ops = local_world(W, W * rows_max, n, k, "bf16")
    worst, ms = 0.0, []
    for _ in range(calls):
        m = W * int(rng.choice([8, 64, 96, 200, 256]))
        ms.append(m)
        a16, b16, _, full = _problem(rng, W, m, n, k, "nk", "bf16", None)
        outs = [_poisoned((m // W, n), "bf16") for _ in range(W)]
        run_call(ops, a16, b16, outs)
        worst = max(worst, max(_errors(outs, full, W, "bf16")))
    return worst < 8e-3, f"sequence: {calls} calls, m in {sorted(set(ms))}: err max {worst:.2e} (< 8e-3)"


def check_bitwise(W, seed, runs: int = 10):
    """The same inputs `runs` times: identical bits on every rank."""
    import cupy

    from rawflux.bench.rs_local import local_world

    m, n, k = W * 192, 1024, 512
    a16, b16, _, full = _problem(np.random.default_rng(seed), W, m, n, k, "nk", "bf16", None)
    ops = local_world(W, m, n, k, "bf16")
    first, same = None, 0
    for _ in range(runs):
        outs = [_poisoned((m // W, n), "bf16") for _ in range(W)]
        run_call(ops, a16, b16, outs)
        bits = [cupy.asnumpy(o.view(cupy.uint16)) for o in outs]
        if first is None:
            first, err = bits, max(_errors(outs, full, W, "bf16"))
        elif all(np.array_equal(x, y) for x, y in zip(bits, first)):
            same += 1
    ok = same == runs - 1 and err < 8e-3
    return ok, f"bitwise: {same + 1}/{runs} runs identical on every rank; err {err:.2e}"


CASES = [
    ("correct.basic", 256, 512, 256, "nk", "bf16", None, None, None),
    ("correct.ragged", 200, 264, 136, "kn", "bf16", None, "f32", None),
    ("correct.fp32p_bias", 384, 640, 512, "nk", "bf16", "fp32", "in", None),
    ("correct.f16", 128, 512, 256, "kn", "f16", None, "in", None),
    ("correct.tile64x128", 96, 384, 192, "nk", "bf16", None, None, (64, 128, 1)),
    ("correct.cluster", 512, 1024, 256, "nk", "bf16", None, None, (128, 192, 2)),
    ("correct.decode", 8, 1024, 512, "nk", "bf16", None, "in", None),
    ("correct.owner_tail", 37, 512, 256, "nk", "bf16", None, None, (64, 128, 1)),  # tail box of an owner's last tile row
]


def _config(spec):
    from tests.gpu.gemm_rs_checks import _tile_config  # the same tile specs as the emulated-node checks

    return _tile_config(spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", default="2,4")
    args = ap.parse_args(argv)
    fails = total = 0
    for W in [int(x) for x in args.worlds.split(",")]:
        checks = [(name, lambda W=W, i=i, c=c: check_case(W, c[0], W * c[1], *c[2:8], _config(c[8]), 100 * W + i))
                  for i, c in enumerate(CASES) for name in (c[0],)]
        checks += [("sequence", lambda W=W: check_sequence(W, 7 * W)), ("bitwise", lambda W=W: check_bitwise(W, 11 * W))]
        for name, fn in checks:
            total += 1
            try:
                ok, detail = fn()
            except Exception as e:  # noqa: BLE001
                ok, detail = False, f"{name}: {type(e).__name__}: {str(e)[:400]}"
            fails += not ok
            print(f"rs_local world={W} {name} {'PASS' if ok else 'FAIL'}  {detail}", flush=True)
    print(f"rs_local summary: {total - fails}/{total} passed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
