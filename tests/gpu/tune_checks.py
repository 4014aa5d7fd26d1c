"""The fused ops' on-line tuner on the GPU (rawflux/tune/collective.py), per world.

    python3 tests/gpu/tune_checks.py [--worlds 2,4] [--real] [--per-world-timeout 240]

Checks, at each world W (the emulated node unless --real), for gemm_rs, ag_gemm and gemm_ar
(at a decode m):
  * tune.<op>: op.tune(m) times its candidates on every rank; every rank ends with the same
    configuration, the chosen one's slowest-rank time is the table's lowest, the default pick was
    timed first, and the run stayed within its budget (+ one candidate);
  * stored.<op>: a NEW op object under RAWFLUX_TUNE=cached plans calls of m with the stored
    configuration, and its output matches the float64 reference (relative Frobenius error, fresh
    random inputs, output poisoned with NaN before the call);
  * first_use.gemm_rs: under RAWFLUX_TUNE=on, the first call of an unseen m tunes it (last_tune
    filled) and the result is correct.
The table goes to the cache folder (RAWFLUX_CACHE_DIR; the driver makes a private one unless it
is set, as launch/gpu_suite.sh sets it to share compiled kernels between stages).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

BUDGET_S = 20.0


def _rand(cp, shape, seed):
    import ml_dtypes

    return cp.random.default_rng(seed).standard_normal(shape, dtype=cp.float32).astype(ml_dtypes.bfloat16)


def _rel(cp, got, want) -> float:
    g = cp.asarray(got).astype(cp.float64)
    return float(cp.linalg.norm(g - want) / cp.linalg.norm(want))


def worker(args) -> int:
    import cupy as cp
    from mpi4py import MPI

    import rawflux
    from rawflux.ops.ag_gemm import AGGemm
    from rawflux.ops.gemm_ar import GemmAR
    from rawflux.ops.gemm_rs import GemmRS

    comm = MPI.COMM_WORLD
    group = rawflux.init()
    W, r = group.world, group.rank
    ok_all = True

    def report(name, ok, detail):
        nonlocal ok_all
        every = comm.allgather((bool(ok), detail))
        ok = all(o for o, _ in every)
        ok_all = ok_all and ok
        if r == 0:
            bad = "; ".join(f"r{q}: {d}" for q, (o, d) in enumerate(every) if not o)
            print(f"tune world={W} {name:18s} {'PASS' if ok else 'FAIL'}  {detail if ok else bad}", flush=True)

    m_ar = 64
    for op_name, make, label in (("gemm_rs", lambda: GemmRS(group, 2048, 2048, 1024 // W, "bf16"), lambda op, c: c.tile.tag()),
                                 ("ag_gemm", lambda: AGGemm(group, 2048, 2048 // W, 1024, "bf16"), lambda op, c: op._adapt(c, 2048).tag()),
                                 ("gemm_ar", lambda: GemmAR(group, m_ar, 2048, 1024 // W, "bf16"), lambda op, c: c.tile.tag())):
        m, n, k = (m_ar if op_name == "gemm_ar" else 2048), 2048, 1024
        op = make()
        t0 = time.perf_counter()
        try:
            best = op.tune(m, top=4, reps=10, budget_s=BUDGET_S)
            took = time.perf_counter() - t0
            rows = op.last_tune
            tags = comm.allgather(label(op, best))
            low = min(rows, key=lambda x: x.slowest_us)
            per = took / max(1, len(rows))
            ok = (len(set(tags)) == 1 and low.label == label(op, best) and rows[0].label == label(op, op.tune_candidates(m, 4)[0])
                  and took <= BUDGET_S + per + 5)
            report(f"tune.{op_name}", ok, f"{len(rows)} timed in {took:.1f} s; chose {tags[0]} at {low.slowest_us:.1f} us "
                   f"(default {rows[0].label} {rows[0].slowest_us:.1f} us)")
        except Exception as e:  # noqa: BLE001 - reported
            report(f"tune.{op_name}", False, f"{type(e).__name__}: {e}")
            best = None
        finally:
            op.close()
        # a fresh op reads the stored result (RAWFLUX_TUNE=cached) and computes right with it
        op = make()
        try:
            if op_name in ("gemm_rs", "gemm_ar"):
                out_rows = m // W if op_name == "gemm_rs" else m
                a = _rand(cp, (m, k // W), 10 + r)
                b = _rand(cp, (n, k // W), 20 + r)
                out = cp.full((out_rows, n), cp.nan, dtype=a.dtype)
                used = (op.plan(m).cfg if op_name == "gemm_rs" else op.config_for(m)).tile.tag()
                op(a, b, out=out)
                full = sum(cp.asarray(x).astype(cp.float64) for x in comm.allgather(cp.asnumpy(
                    a.astype(cp.float32) @ b.astype(cp.float32).T)))
                want = cp.asarray(full)[r * out_rows:(r + 1) * out_rows] if op_name == "gemm_rs" else cp.asarray(full)
            else:
                a = _rand(cp, (m // W, k), 30 + r)
                b = _rand(cp, (n // W, k), 40 + r)
                out = cp.full((m, n // W), cp.nan, dtype=a.dtype)
                op(a, b, out=out)
                used = op.last_config.tag() if op.last_config else "?"
                gathered = cp.concatenate([cp.asarray(x) for x in comm.allgather(cp.asnumpy(a))])
                want = gathered.astype(cp.float64) @ b.astype(cp.float64).T
            cp.cuda.Device().synchronize()
            err = _rel(cp, out, want)
            ok = best is not None and used == label(op, best) and err < 8e-3
            report(f"stored.{op_name}", ok, f"plan uses {used}, rel err {err:.2e}")
        except Exception as e:  # noqa: BLE001
            report(f"stored.{op_name}", False, f"{type(e).__name__}: {e}")
        finally:
            op.close()
    # RAWFLUX_TUNE=on: the first call of an unseen problem tunes it (n drawn per run: the table
    # persists in the cache folder, and a stored entry would be read instead)
    os.environ["RAWFLUX_TUNE"], os.environ["RAWFLUX_TUNE_BUDGET_S"] = "on", str(BUDGET_S)
    m, k = 2048, 1024
    n = comm.bcast(1024 + 64 * (int(time.time() * 1000) % 64) if r == 0 else None, root=0)
    op = GemmRS(group, m, n, k // W, "bf16")
    try:
        mm = m // 2
        a, b = _rand(cp, (mm, k // W), 50 + r), _rand(cp, (n, k // W), 60 + r)
        out = op(a, b)
        cp.cuda.Device().synchronize()
        full = sum(cp.asarray(x).astype(cp.float64) for x in comm.allgather(cp.asnumpy(a.astype(cp.float32) @ b.astype(cp.float32).T)))
        err = _rel(cp, out, cp.asarray(full)[r * (mm // W):(r + 1) * (mm // W)])
        report("first_use.gemm_rs", bool(op.last_tune) and err < 8e-3, f"{len(op.last_tune)} candidates timed at the first call; rel err {err:.2e}")
    except Exception as e:  # noqa: BLE001
        report("first_use.gemm_rs", False, f"{type(e).__name__}: {e}")
    finally:
        op.close()
    rawflux.finalize()
    return 0 if ok_all else 1


def driver(args) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _worlds import counts_summary, run_worlds

    worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
    cache = tempfile.mkdtemp(prefix="rawflux-tune-check-")
    got, failures = run_worlds(__file__, "tune", worlds, [], real=args.real, timeout_s=args.per_world_timeout,
                               env_defaults={"RAWFLUX_CACHE_DIR": cache, "RAWFLUX_TUNE": "cached"}, needs_pass=True)
    print(counts_summary("tune", got, failures, worlds), flush=True)
    return 0 if not failures else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--real", action="store_true", help="one rank per GPU (rawflux-launch -n) instead of MPS emulation")
    ap.add_argument("--per-world-timeout", type=float, default=240.0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
