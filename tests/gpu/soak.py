#!/usr/bin/env python3
"""The fused ops' soak: many back-to-back calls of random m, every output checked, memory flat.

    python tests/gpu/soak.py                               # worlds 2, 4, 8 (emulated node), 10,000 calls per op
    python tests/gpu/soak.py --worlds 2 --calls 1000 --replays 100
    python tests/gpu/soak.py --real --worlds 8

Per world (this script again with --worker under rawflux-launch), for ag_gemm (every gather path
the node takes), gemm_rs and gemm_ar (--ops picks among them), on one op object each, sized once:
  calls      --calls back-to-back calls, m drawn at random (the same sequence on every rank), no
             host synchronisation in the loop: every output is poisoned (NaN) first and its NaN
             count taken on the device; every --sample-th call is also compared with an fp32
             reference of every rank's inputs (each rank regenerates all of them from the shared
             seed) by relative Frobenius error. The input of call i is fresh: rank q's data of
             call i is drawn from seed (i, q).
  graph      --replays replays of one call captured by op.capture, fresh inputs copied into its
             buffers before each, every replay checked against the reference.
  memory     device memory in use (cudaMemGetInfo) and the process's resident host memory at the
             start and the end of each loop: a growth above --mem-slack-mb fails. The calls loop
             starts after one warm-up call per m (first-use allocations are not growth).
Rank 0 prints "soak world=W <op>.<loop> PASS|FAIL  detail" lines; exit status 0 only if all pass.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

N, K = 256, 512  # each rank's GEMM: small, so the loop measures the protocol, not the tensor cores
MAX_M_LOC = 64


def _cp():
    import cupy

    return cupy


def _bf16():
    from rawflux.runtime import DType

    return DType.BF16.np


def _rand(shape, seed: int):
    """bf16 from an fp32 normal draw, rounded to nearest even by bit operations."""
    cp = _cp()
    x = cp.random.RandomState(int(seed) & 0x7FFFFFFF).standard_normal(shape, dtype=cp.float32)
    u = x.view(cp.uint32)
    return ((u + cp.uint32(0x7FFF) + ((u >> 16) & cp.uint32(1))) >> 16).astype(cp.uint16).view(_bf16())


def _f32(x):
    cp = _cp()
    return (x.view(cp.uint16).astype(cp.uint32) << 16).view(cp.float32)


def _poison(x) -> None:
    x.view(_cp().uint16).fill(0x7FC0)


def _nan_count(x):
    cp = _cp()
    return cp.count_nonzero((x.view(cp.uint16) & cp.uint16(0x7FFF)) > cp.uint16(0x7F80))


def _seed(base: int, i: int, q: int, what: int) -> int:
    return (base * 1_000_003 + i * 8191 + q * 131 + what) & 0x7FFFFFFF


def _memory(dev: int) -> tuple[float, float]:
    """(device MB in use, this process's resident host MB)."""
    cp = _cp()
    with cp.cuda.Device(dev):
        free, total = cp.cuda.runtime.memGetInfo()
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    return (total - free) / 2**20, rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class Op:
    """One fused op's inputs, call and reference for rank r of W (rank q's data regenerable by all)."""

    def __init__(self, kind: str, group, path=None):
        import rawflux

        self.kind, self.group, self.w, self.r = kind, group, group.world, group.rank
        cp = _cp()
        max_m = self.w * MAX_M_LOC
        if kind == "ag_gemm":
            direction, copy = path
            self.op = rawflux.AGGemm(group, max_m, N, K, "bf16", direction=direction, copy=copy)
            self.a = cp.empty((MAX_M_LOC, K), _bf16())
            self.out = cp.empty((max_m, N), _bf16())
        elif kind == "gemm_rs":
            self.op = rawflux.GemmRS(group, max_m, N, K, "bf16")
            self.a = cp.empty((max_m, K), _bf16())
            self.out = cp.empty((MAX_M_LOC, N), _bf16())
        else:  # gemm_ar: m = m_loc rows (any m), the whole sum on every rank
            self.op = rawflux.GemmAR(group, MAX_M_LOC, N, K, "bf16")
            self.a = cp.empty((MAX_M_LOC, K), _bf16())
            self.out = cp.empty((MAX_M_LOC, N), _bf16())
        self.name = kind + (f"[{path[0]}/{path[1]}]" if path else "")

    def a_shape(self, m_loc: int):
        return (m_loc * self.w, K) if self.kind == "gemm_rs" else (m_loc, K)

    def out_shape(self, m_loc: int):
        return (m_loc * self.w, N) if self.kind == "ag_gemm" else (m_loc, N)

    def fill(self, base: int, i: int, m_loc: int, a=None):
        """This rank's inputs of call i into a (default: the op's buffer); returns (a view, b)."""
        a = self.a if a is None else a
        view = a[: self.a_shape(m_loc)[0]]
        view[...] = _rand(view.shape, _seed(base, i, self.r, 1))
        return view, _rand((N, K), _seed(base, 0, self.r, 2))  # the weight: fixed per rank

    def reference(self, base: int, i: int, m_loc: int):
        """The fp32 result this rank must hold after call i."""
        cp = _cp()
        if self.kind == "ag_gemm":
            full = cp.concatenate([_f32(_rand((m_loc, K), _seed(base, i, q, 1))) for q in range(self.w)])
            return full @ _f32(_rand((N, K), _seed(base, 0, self.r, 2))).T
        acc = cp.zeros((m_loc, N), cp.float32)
        rows = slice(self.r * m_loc, (self.r + 1) * m_loc) if self.kind == "gemm_rs" else slice(0, m_loc)
        for q in range(self.w):
            acc += _f32(_rand(self.a_shape(m_loc), _seed(base, i, q, 1)))[rows] @ _f32(_rand((N, K), _seed(base, 0, q, 2))).T
        return acc

    def call(self, a, b, out, stream):
        return self.op(a, b, out=out, stream=stream)


def _rel(got, want) -> float:
    cp = _cp()
    d = _f32(got) - want
    return float(cp.sqrt(cp.sum(d * d) / cp.maximum(cp.sum(want * want), cp.float32(1e-30))))


def soak_calls(o: Op, calls: int, sample: int, base: int, stream, slack_mb: float):
    import numpy as np

    cp = _cp()
    rng = np.random.default_rng(base)  # the same m sequence on every rank
    m_locs = rng.integers(1, MAX_M_LOC + 1, size=calls)
    nans = cp.zeros(calls, cp.int64)
    worst, checked = 0.0, 0
    # Warm-up, outside the measured run: the loop's body once per m (plans, rawflux's kernels, the
    # pool's first blocks, cuBLAS's kernels for the reference, and CuPy's for the poison and the
    # NaN count: a first CuPy kernel compile loads NVRTC into host memory), so the memory check
    # sees the steady state only.
    for m_loc in range(1, MAX_M_LOC + 1):
        with stream:
            a, b = o.fill(base + 1, m_loc, m_loc)
            out = o.out[: o.out_shape(m_loc)[0]]
            _poison(out)
        o.call(a, b, out, stream)
        with stream:
            nans[m_loc % calls] = _nan_count(out)
            _rel(out, o.reference(base + 1, m_loc, m_loc))
    with stream:
        nans.fill(0)
    o.op.synchronize(stream)
    mem0 = _memory(o.group.device_id)
    t0 = time.perf_counter()
    b = None
    for i, m_loc in enumerate(int(x) for x in m_locs):
        with stream:
            a, b = o.fill(base, i, m_loc)
            out = o.out[: o.out_shape(m_loc)[0]]
            _poison(out)
        o.call(a, b, out, stream)
        with stream:
            nans[i] = _nan_count(out)
            if i % sample == 0:
                err = _rel(out, o.reference(base, i, m_loc))
                worst, checked = max(worst, err), checked + 1
                if not err < 8e-3:
                    stream.synchronize()
                    return False, f"call {i} (m/W = {m_loc}): rel err {err:.3e}"
    o.op.synchronize(stream)
    secs = time.perf_counter() - t0
    mem1 = _memory(o.group.device_id)
    bad = int(cp.count_nonzero(nans))
    grow = (mem1[0] - mem0[0], mem1[1] - mem0[1])
    ok = bad == 0 and max(grow) <= slack_mb
    detail = (f"{calls} calls, m/W 1..{MAX_M_LOC}, {secs:.1f} s; {bad} with NaN; {checked} against the reference, worst rel err "
              f"{worst:.2e}; device {mem0[0]:.0f} -> {mem1[0]:.0f} MB, host {mem0[1]:.0f} -> {mem1[1]:.0f} MB")
    return ok, detail


def soak_graph(o: Op, replays: int, base: int, stream, slack_mb: float):
    m_loc = MAX_M_LOC // 2
    with stream:
        a, b = o.fill(base, 0, m_loc)
        out = o.out[: o.out_shape(m_loc)[0]]
    graph = o.op.capture(a, b, out=out, stream=stream)
    o.op.synchronize(stream)
    mem0 = _memory(o.group.device_id)
    worst = 0.0
    for i in range(1, replays + 1):
        with stream:
            o.fill(base, i, m_loc, a=a)  # fresh data into the captured buffers
            _poison(out)
        graph.replay(stream=stream)
        with stream:
            err = _rel(out, o.reference(base, i, m_loc))
        worst = max(worst, err)
        if not err < 8e-3:
            return False, f"replay {i}: rel err {err:.3e}"
    o.op.synchronize(stream)
    mem1 = _memory(o.group.device_id)
    ok = graph.replays == replays and max(mem1[0] - mem0[0], mem1[1] - mem0[1]) <= slack_mb
    return ok, (f"{replays} replays, every one checked, worst rel err {worst:.2e}; device {mem0[0]:.0f} -> {mem1[0]:.0f} MB, "
                f"host {mem0[1]:.0f} -> {mem1[1]:.0f} MB")


def worker(args) -> int:
    from mpi4py import MPI

    import rawflux

    comm = MPI.COMM_WORLD
    group = rawflux.init()
    cp = _cp()
    cp.cuda.Device(group.device_id).use()
    stream = cp.cuda.Stream(non_blocking=True)
    paths = [("push", "sm"), ("pull", "sm")] if getattr(group, "shares_gpu_under_mps", False) else \
        [("push", "ce"), ("pull", "ce"), ("push", "sm"), ("pull", "sm")]
    all_ok = True
    ops = args.ops.split(",")
    for kind, path in [("ag_gemm", p) for p in paths if "ag_gemm" in ops] + [(k, None) for k in ("gemm_rs", "gemm_ar") if k in ops]:
        o = Op(kind, group, path)
        for loop, run in (("calls", lambda: soak_calls(o, args.calls, args.sample, args.seed, stream, args.mem_slack_mb)),
                          ("graph", lambda: soak_graph(o, args.replays, args.seed + 1, stream, args.mem_slack_mb))):
            try:
                ok, detail = run()
            except Exception as e:  # noqa: BLE001 - reported, then the next loop
                ok, detail = False, f"{type(e).__name__}: {e} | {traceback.format_exc().splitlines()[-3].strip()}"
            got = comm.allgather((bool(ok), detail))
            ok = all(x for x, _ in got)
            detail = got[0][1] if ok else "; ".join(f"r{q}: {d}" for q, (x, d) in enumerate(got) if not x)
            all_ok &= ok
            if comm.rank == 0:
                print(f"soak world={group.world} {o.name}.{loop} {'PASS' if ok else 'FAIL'}  {detail}", flush=True)
        o.op.close()
    rawflux.finalize()
    return 0 if all_ok else 1


def driver(args) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _worlds import counts_summary, run_worlds

    worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
    extra = ["--calls", str(args.calls), "--replays", str(args.replays), "--sample", str(args.sample), "--seed", str(args.seed),
             "--mem-slack-mb", str(args.mem_slack_mb), "--ops", args.ops]
    got, failures = run_worlds(__file__, "soak", worlds, extra, real=args.real, timeout_s=args.per_world_timeout,
                               env_defaults={"RAWFLUX_WAIT_TIMEOUT_S": "30"}, needs_pass=True)
    print(counts_summary("soak", got, failures, worlds), flush=True)
    return 0 if not failures else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--real", action="store_true", help="one rank per GPU (rawflux-launch -n) instead of MPS emulation")
    ap.add_argument("--ops", default="ag_gemm,gemm_rs,gemm_ar", help="comma-separated among ag_gemm, gemm_rs, gemm_ar")
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--replays", type=int, default=1_000)
    ap.add_argument("--sample", type=int, default=50, help="compare every N-th call with the reference")
    ap.add_argument("--mem-slack-mb", type=float, default=64.0, help="allowed growth of device or host memory over a loop")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--per-world-timeout", type=float, default=1500.0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.calls < 1 or args.replays < 1 or args.sample < 1:
        ap.error("--calls, --replays and --sample must be positive")
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
