#!/usr/bin/env python3
"""rawflux.gemm_ar checks on GPUs, at several world sizes (the emulated node: N ranks on one GPU).

    python tests/gpu/gemm_ar_checks.py                    # world 1 plain, worlds 2, 4, 8 emulated
    python tests/gpu/gemm_ar_checks.py --worlds 2,8
    python tests/gpu/gemm_ar_checks.py --real --worlds 8  # one rank per GPU (rawflux-launch -n)

The driver launches this script with --worker per world size; rank 0 prints one line per check,
"gemm_ar world=W <check> PASS|FAIL|SKIP  detail", and the driver ends with one summary line.
Checks (every one can fail; fresh random inputs, outputs poisoned with NaN before every run):
  correct.*      against a float64 reference sum (relative Frobenius error), decode and ragged m
                 (1, 7, 100, 300), ragged n, both B layouts, bias kinds, fp32 / 16-bit partials,
                 f16, every tile; and every rank's output bitwise equal to rank 0's;
  deterministic  20 runs bitwise identical while the ranks' arrival order is perturbed (a rank's
                 SMs hogged ahead of its call on odd runs, different grids per rank);
  loop1000       1,000 back-to-back calls with random m (no host sync), every output checked on
                 the device against c * S (+ bias), S precomputed in fp32;
  graph          one call captured, 100 replays with fresh inputs, all checked;
  fast_path      repeated calls take the host's fast path, bitwise equal to the validated path;
  missing_rank   one rank skips a call: the others raise CollectiveTimeout within the timeout;
  mismatch       rank 0 calls with another m: every rank raises CallMismatch naming m.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from gemm_rs_checks import (Check, _fresh_seed, _guard, _hog, copy16, dev_f32, dev_from_f32, empty16, host_f64, host_inputs,  # noqa: E402
                            poison, rel_err, to_device)

PREFIX = "gemm_ar"


def _line(c: Check, world: int) -> str:
    tag = "SKIP" if c.skipped else ("PASS" if c.ok else "FAIL")
    return f"{PREFIX} world={world} {c.name:<22s} {tag}  {c.detail}"


CORRECT_CASES = [
    # name, m, n, k (this rank's), layout, dtype, partials, bias, tile (bm, bn) or None
    ("correct.decode1", 1, 1024, 512, "nk", "bf16", None, None, None),
    ("correct.decode7_bias", 7, 2048, 256, "nk", "bf16", None, "in", None),
    ("correct.m100_kn_f32bias", 100, 520, 136, "kn", "bf16", None, "f32", None),
    ("correct.m300_fp32p", 300, 1024, 512, "nk", "bf16", "fp32", "in", None),
    ("correct.f16_kn", 64, 512, 256, "kn", "f16", None, "f32", None),
    ("correct.f16_fp32p", 48, 1000, 256, "nk", "f16", "fp32", None, None),
    ("correct.tile64x128", 96, 640, 192, "nk", "bf16", None, "in", (64, 128)),
    ("correct.tile64x256", 33, 1000, 256, "nk", "bf16", None, None, (64, 256)),
    ("correct.tile128x192", 136, 1000, 256, "nk", "bf16", None, "in", (128, 192)),
    ("correct.tile128x192_f16", 200, 584, 136, "nk", "f16", None, None, (128, 192)),
]


def _tile_config(spec, partials):
    if spec is None:
        return None
    from rawflux import tune
    from rawflux.ops.gemm_ar import ar_tiles

    for t in ar_tiles("nk", partials or "bf16"):
        if (t.bm, t.bn) == tuple(spec):
            return tune.GemmConfig(t)
    raise ValueError(f"no compiled tile {spec}")


def _digest(x) -> str:
    import cupy

    return hashlib.sha1(cupy.asnumpy(x.view(cupy.uint16)).tobytes()).hexdigest()


def check_correct(g, comm, case) -> Check:
    import cupy

    from rawflux import baseline
    from rawflux.ops.gemm_ar import GemmAR

    name, m, n, k, layout, tag, partials, bias_kind, tile = case
    W, r = g.world, g.rank
    seed = _fresh_seed(comm)
    a_h = [host_inputs(seed, q, (m, k), tag) for q in range(W)]
    b_h = [host_inputs(seed + 1, q, (n, k) if layout == "nk" else (k, n), tag) for q in range(W)]
    bias_h = None
    if bias_kind == "in":
        bias_h = host_inputs(seed + 2, 0, (1, n), tag)[0]
    elif bias_kind == "f32":
        bias_h = np.random.default_rng(seed + 3).standard_normal(n, dtype=np.float32)
    ref = baseline.reference_gemm_rs(a_h, b_h, b_layout=layout, bias=None if bias_h is None else bias_h.astype(np.float64))
    # what a call that lost one rank's partial would give
    wrong = ref - baseline.reference_gemm_rs(a_h[-1:], b_h[-1:], b_layout=layout) if W > 1 else -ref
    with cupy.cuda.Device(g.device_id):
        s = cupy.cuda.Stream(non_blocking=True)
        a, b = to_device(a_h[r]), to_device(b_h[r])
        bias = None if bias_h is None else to_device(bias_h)
        out = empty16((m, n), tag)
        poison(out)
        op = GemmAR(g, m, n, k, tag, layout, partials=partials, config=_tile_config(tile, partials))
        try:
            cfg = op.config_for(m) if W > 1 else None
            op(a, b, bias=bias, out=out, stream=s)
            op.synchronize(s)
            got = host_f64(out)
            digest = _digest(out)
        finally:
            op.close()
    nan = int(np.isnan(got).sum())
    err, err_wrong = rel_err(got, ref), rel_err(got, wrong)
    bound = 1e-3 if tag == "f16" else 6e-3
    digests = comm.allgather(digest)
    same = len(set(digests)) == 1
    ok = nan == 0 and err <= bound and err_wrong > 0.05 and same
    errs = comm.gather(err, root=0)
    launch = "plain GEMM" if cfg is None else f"tile={cfg.tile.bm}x{cfg.tile.bn}"
    detail = (f"m={m} n={n} k={k} {layout} {tag} partials={partials or tag} bias={bias_kind} {launch}: err max "
              f"{max(errs) if r == 0 else err:.2e} (<= {bound:.0e}); ranks bitwise equal: {same}")
    if not ok:
        worst = np.unravel_index(np.nanargmax(np.abs(got - ref)), got.shape) if nan < got.size else (0, 0)
        detail += (f" | rank {r}: err {err:.3e} lost-rank {err_wrong:.2e} NaN {nan}; worst at {tuple(int(x) for x in worst)} "
                   f"got {got[worst]:.4g} want {ref[worst]:.4g}")
    return Check(name, ok, detail)


def check_deterministic(g, comm, runs: int = 20) -> Check:
    import cupy

    from rawflux import tune
    from rawflux.ops.gemm_ar import GemmAR

    W, r = g.world, g.rank
    m, n, k = 96, 2048, 512
    seed = _fresh_seed(comm)
    a_h = host_inputs(seed, r, (m, k), "bf16")
    b_h = host_inputs(seed + 1, r, (n, k), "bf16")
    sms = tune.device_info(g.device_id).sms
    with cupy.cuda.Device(g.device_id):
        s = cupy.cuda.Stream(non_blocking=True)
        a, b = to_device(a_h), to_device(b_h)
        out = empty16((m, n), "bf16")
        first, same = None, 0
        op = GemmAR(g, m, n, k, "bf16", ctas=sms - 2 * (r % 3))  # different grids: ranks deliver at different paces
        try:
            for i in range(runs):
                with s:
                    poison(out)
                if W > 1 and i % 2 == 1 and r == (i // 2) % W:
                    _hog(g, sms, s, 300_000)  # this rank's GEMM starts late: its partials arrive last everywhere
                op(a, b, out=out, stream=s)
                op.synchronize(s)
                bits = out.view(cupy.uint16).copy()
                if first is None:
                    first = bits
                elif bool(cupy.array_equal(bits, first)):
                    same += 1
            digest = _digest(first.view(out.dtype))
        finally:
            op.close()
    digests = comm.allgather(digest)
    ok = same == runs - 1 and len(set(digests)) == 1
    return Check("deterministic", ok, f"m={m} n={n} k={k}: {same + 1}/{runs} runs bitwise identical on rank {r}; "
                                      f"ranks bitwise equal: {len(set(digests)) == 1}")


def check_loop(g, comm, calls: int = 1000) -> Check:
    import cupy

    from rawflux.ops.gemm_ar import GemmAR

    W, r = g.world, g.rank
    max_m, n, k = 256, 1024, 256
    seed = _fresh_seed(comm)
    rng = np.random.default_rng(seed)  # the same sequence on every rank
    ms = [int(x) for x in rng.integers(1, max_m + 1, size=calls)]
    scales = rng.choice(np.array([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0], dtype=np.float32), size=calls)
    use_bias = rng.random(calls) < 0.3
    a_h = [host_inputs(seed, q, (max_m, k), "bf16") for q in range(W)]
    b_h = [host_inputs(seed + 1, q, (n, k), "bf16") for q in range(W)]
    with cupy.cuda.Device(g.device_id):
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            a_base32 = dev_f32(to_device(a_h[r]))
            b = to_device(b_h[r])
            full = cupy.zeros((max_m, n), cupy.float32)
            for q in range(W):
                full += dev_f32(to_device(a_h[q])) @ dev_f32(to_device(b_h[q])).T
            a = dev_from_f32(a_base32, "bf16")
            bias = dev_from_f32(cupy.asarray(np.random.default_rng(seed + 5).standard_normal(n, dtype=np.float32)), "bf16")
            bias32 = dev_f32(bias)
            out_full = empty16((max_m, n), "bf16")
            errs = cupy.full(calls, cupy.nan, cupy.float32)
        op = GemmAR(g, max_m, n, k, "bf16")
        try:
            t0 = time.perf_counter()
            for i, m in enumerate(ms):
                c = float(scales[i])
                with s:
                    copy16(a[:m], dev_from_f32(a_base32[:m] * cupy.float32(c), "bf16"))  # exact: c is a power of two
                    out = out_full[:m]
                    poison(out)
                op(a[:m], b, bias=bias if use_bias[i] else None, out=out, stream=s)
                with s:
                    want = full[:m] * cupy.float32(c)
                    if use_bias[i]:
                        want = want + bias32
                    d = dev_f32(out) - want
                    errs[i] = cupy.sqrt(cupy.sum(d * d) / cupy.maximum(cupy.sum(want * want), cupy.float32(1e-30)))
            op.synchronize(s)
            dt = time.perf_counter() - t0
        finally:
            op.close()
        e = cupy.asnumpy(errs)
    bad = np.flatnonzero(~(e < 8e-3))  # NaN counts as bad
    detail = f"{calls} calls, m in [{min(ms)}, {max(ms)}] random, max rel err {np.nanmax(e) if np.isfinite(e).any() else float('nan'):.2e}, {dt:.1f} s"
    if bad.size:
        i = int(bad[0])
        detail += f" | rank {r}: {bad.size} bad calls, first #{i} (m={ms[i]}, c={scales[i]}, bias={bool(use_bias[i])}): err {e[i]:.3e}"
    return Check("loop1000", bad.size == 0, detail)


def check_graph(g, comm, replays: int = 100) -> Check:
    import cupy

    from rawflux.ops.gemm_ar import GemmAR

    W, r = g.world, g.rank
    m, n, k = 64, 1024, 256
    seed = _fresh_seed(comm)
    with cupy.cuda.Device(g.device_id):
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            a = dev_from_f32(cupy.ones((m, k), cupy.float32), "bf16")
            b = dev_from_f32(cupy.ones((n, k), cupy.float32), "bf16")
            bias = dev_from_f32(cupy.zeros(n, cupy.float32), "bf16")
            out = empty16((m, n), "bf16")
            errs = cupy.full(replays, cupy.nan, cupy.float32)
        op = GemmAR(g, m, n, k, "bf16")
        try:
            graph = op.capture(a, b, bias=bias, out=out, stream=s)
            for i in range(replays):
                with s:
                    gen = cupy.random.default_rng(seed * 1000 + i)  # every rank draws every rank's inputs
                    want = cupy.zeros((m, n), cupy.float32)
                    for q in range(W):
                        aq = dev_from_f32(gen.standard_normal((m, k), dtype=cupy.float32), "bf16")
                        bq = dev_from_f32(gen.standard_normal((n, k), dtype=cupy.float32), "bf16")
                        want += dev_f32(aq) @ dev_f32(bq).T
                        if q == r:
                            copy16(a, aq)
                            copy16(b, bq)
                    copy16(bias, dev_from_f32(gen.standard_normal(n, dtype=cupy.float32), "bf16"))
                    want += dev_f32(bias)
                    poison(out)
                graph.replay(stream=s)
                with s:
                    d = dev_f32(out) - want
                    errs[i] = cupy.sqrt(cupy.sum(d * d) / cupy.sum(want * want))
            op.synchronize(s)
        finally:
            op.close()
        e = cupy.asnumpy(errs)
    bad = np.flatnonzero(~(e < 8e-3))
    detail = f"m={m} n={n} k={k}: 1 capture, {replays} replays with fresh inputs and bias, max rel err {np.nanmax(e) if np.isfinite(e).any() else float('nan'):.2e}"
    if bad.size:
        detail += f" | rank {r}: {bad.size} bad replays, first #{int(bad[0])} err {e[bad[0]]:.3e}"
    return Check("graph", bad.size == 0 and graph.replays == replays, detail)


def check_fast_path(g, comm, calls: int = 36) -> Check:
    """Calls repeating a validated call's metadata (new pointers every call, with and without bias)
    take the host's fast path and give the validated path's bits."""
    import cupy

    from rawflux.ops.gemm_ar import GemmAR, check_call

    W, r = g.world, g.rank
    m, n, k = 16, 512, 512
    seed = _fresh_seed(comm)
    bad, fast = [], 0
    with cupy.cuda.Device(g.device_id):
        s = cupy.cuda.Stream(non_blocking=True)
        op = GemmAR(g, m, n, k, "bf16")
        try:
            with s:
                gen = cupy.random.default_rng(seed * 7919 + r)
                sets = [dict(a=empty16((m, k), "bf16"), b=empty16((n, k), "bf16"), out=empty16((m, n), "bf16"),
                             bias=empty16((n,), "bf16")) for _ in range(3)]
                ref = empty16((m, n), "bf16")
            for i in range(calls):
                x, with_bias = sets[i % 3], (i // 3) % 2 == 1
                with s:
                    for name in ("a", "b", "bias"):
                        copy16(x[name], dev_from_f32(gen.standard_normal(x[name].shape, dtype=cupy.float32), "bf16"))
                    poison(x["out"])
                    poison(ref)
                bias = x["bias"] if with_bias else None
                before, checked = op.calls, op._fast.copy()
                op(x["a"], x["b"], bias=bias, out=x["out"], stream=s)
                fast += op.calls == before + 1 and op._fast == checked and i >= 6  # no new entry: the fast path ran
                op._call(check_call(x["a"], x["b"], n=n, k=k, dtype=op.dtype, b_layout="nk", device=g.device_id, max_m=m,
                                    bias=bias, out=ref, stream=s))
                with s:
                    if not bool(cupy.array_equal(x["out"].view(cupy.uint16), ref.view(cupy.uint16))):
                        bad.append(i)
            op.synchronize(s)
        finally:
            op.close()
    ok = not bad and fast == calls - 6
    detail = f"m={m} n={n} k={k}: {calls} calls over 3 buffer sets, {fast} on the fast path; all bitwise = validated path"
    if not ok:
        detail += f" | rank {r}: differing calls {bad[:6]}, fast {fast}/{calls - 6}"
    return Check("fast_path", ok, detail)


def check_missing_rank(comm, timeout_s: float) -> Check:
    import cupy

    import rawflux.dist as dist
    from rawflux.ops.gemm_ar import GemmAR

    W = comm.size
    if W == 1:
        return Check("missing_rank", True, "needs 2 ranks", skipped=True)
    g = dist.init(comm.Dup(), timeout_s=timeout_s)
    r = g.rank
    m, n, k = 32, 256, 128
    with cupy.cuda.Device(g.device_id):
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            a = dev_from_f32(cupy.ones((m, k), cupy.float32), "bf16")
            b = dev_from_f32(cupy.ones((n, k), cupy.float32), "bf16")
            out = empty16((m, n), "bf16")
        op = GemmAR(g, m, n, k, "bf16")
        op(a, b, out=out, stream=s)  # one good call: kernels compiled, everyone in step
        op.synchronize(s)
        comm.Barrier()
        skipper = W - 1
        raised, msg, took = False, "", 0.0
        if r != skipper:
            t0 = time.perf_counter()
            try:
                op(a, b, out=out, stream=s)
                op.synchronize(s)
            except dist.CollectiveTimeout as e:
                raised, msg = True, str(e)
            took = time.perf_counter() - t0
        comm.Barrier()
    ok = r == skipper or (raised and took < timeout_s + 8.0 and f"rank {skipper}" in msg)
    detail = f"rank {skipper} skipped; timeout {timeout_s:.1f} s"
    if r == 0:
        detail += f"; rank 0 raised after {took:.2f} s: {msg[:300]}"
    if not ok:
        detail = f"rank {r}: raised={raised} after {took:.2f} s: {msg[:300]}"
    return Check("missing_rank", ok, detail)


def check_mismatch(comm, timeout_s: float) -> Check:
    import cupy

    import rawflux.dist as dist
    from rawflux.ops._collective import CallMismatch
    from rawflux.ops.gemm_ar import GemmAR

    W = comm.size
    if W == 1:
        return Check("mismatch", True, "needs 2 ranks", skipped=True)
    g = dist.init(comm.Dup(), timeout_s=timeout_s)
    r = g.rank
    m_big, n, k = 64, 256, 128
    m = 32 if r == 0 else m_big
    with cupy.cuda.Device(g.device_id):
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            a = dev_from_f32(cupy.ones((m, k), cupy.float32), "bf16")
            b = dev_from_f32(cupy.ones((n, k), cupy.float32), "bf16")
            out = empty16((m, n), "bf16")
        op = GemmAR(g, m_big, n, k, "bf16")
        op.warmup([m])
        comm.Barrier()
        raised, msg = None, ""
        t0 = time.perf_counter()
        try:
            op(a, b, out=out, stream=s)
            op.synchronize(s)
        except CallMismatch as e:
            raised, msg = "CallMismatch", str(e)
        except dist.CollectiveTimeout as e:
            raised, msg = type(e).__name__, str(e)
        took = time.perf_counter() - t0
        comm.Barrier()
    ok = raised == "CallMismatch" and "m: rank" in msg and took < timeout_s + 8.0
    detail = f"rank 0 m=32, others m={m_big}"
    if r == 0:
        detail += f"; rank 0: {raised} after {took:.2f} s: {msg[:300]}"
    if not ok:
        detail = f"rank {r}: raised {raised} after {took:.2f} s: {msg[:300]}"
    return Check("mismatch", ok, detail)


def iter_checks(comm, args):
    import rawflux.dist as dist

    g = dist.init(comm)
    for case in CORRECT_CASES:
        yield _guard(comm, g, case[0], lambda c=case: check_correct(g, comm, c))
    yield _guard(comm, g, "deterministic", lambda: check_deterministic(g, comm, args.runs))
    yield _guard(comm, g, "loop1000", lambda: check_loop(g, comm, args.calls))
    yield _guard(comm, g, "graph", lambda: check_graph(g, comm, args.replays))
    yield _guard(comm, g, "fast_path", lambda: check_fast_path(g, comm))
    # Last: these abort their (fresh) groups on purpose.
    yield _guard(comm, g, "missing_rank", lambda: check_missing_rank(comm, args.timeout))
    yield _guard(comm, g, "mismatch", lambda: check_mismatch(comm, args.timeout))


def worker(args) -> int:
    from _worlds import preload_torch

    preload_torch()
    from mpi4py import MPI

    from rawflux.dist import finalize

    comm = MPI.COMM_WORLD
    ok = True
    for c in iter_checks(comm, args):
        ok = ok and (c.ok or c.skipped)
        if comm.rank == 0:
            print(_line(c, comm.size), flush=True)
    finalize()
    return 0 if ok else 1


def driver(args) -> int:
    from _worlds import counts_summary, run_worlds

    worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
    extra = ["--runs", str(args.runs), "--calls", str(args.calls), "--replays", str(args.replays), "--timeout", str(args.timeout)]
    lines, failures = run_worlds(__file__, PREFIX, worlds, extra, real=args.real, timeout_s=args.per_world_timeout, needs_pass=True)
    print(counts_summary(PREFIX, lines, failures, worlds), flush=True)
    return 0 if not failures else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="1,2,4,8")
    ap.add_argument("--real", action="store_true", help="one rank per GPU (rawflux-launch -n) instead of MPS emulation")
    ap.add_argument("--runs", type=int, default=20, help="runs of the determinism check")
    ap.add_argument("--calls", type=int, default=1000, help="calls of the random-m loop")
    ap.add_argument("--replays", type=int, default=100, help="CUDA graph replays")
    ap.add_argument("--timeout", type=float, default=2.0, help="wait timeout (s) of the missing-rank / mismatch checks")
    ap.add_argument("--per-world-timeout", type=float, default=300.0)
    ap.add_argument("--worker", action="store_true", help="run the checks in this process's MPI world")
    args = ap.parse_args()
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
