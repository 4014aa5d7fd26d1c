"""Diagnostics for ag_gemm stalls on the emulated node: back-to-back calls of one gather path,
each followed by a bounded watch of every step it queued (events after each copy, flag copy,
GEMM and join), then the ready flags and epochs of every rank when a call does not finish.

    python -m rawflux.launch --emulate 2 tests/gpu/ag_diag.py --direction push --copy ce --m-local 2048 --n 4096 --k 4096
"""
import argparse
import os
import time

os.environ.setdefault("RAWFLUX_WAIT_TIMEOUT_S", "30")  # longer than the 10 s watch: a stall shows its pending steps
import cupy as cp
import ml_dtypes
import numpy as np

import rawflux
from rawflux.ops import ag_gemm as A
from rawflux import engine
from rawflux.engine import planning

ap = argparse.ArgumentParser()
ap.add_argument("--direction", default="push")
ap.add_argument("--copy", default="ce")
ap.add_argument("--m-local", type=int, default=2048)
ap.add_argument("--n", type=int, default=4096)
ap.add_argument("--k", type=int, default=4096)
ap.add_argument("--calls", type=int, default=12)
ap.add_argument("--sync-every", type=int, default=0, help="host-synchronise after every N calls (0: never)")
ap.add_argument("--batch", action="store_true", help="queue every call back to back, then watch them all (as the timing check does)")
args = ap.parse_args()

g = rawflux.init()
r, W = g.rank, g.world
op = A.AGGemm(g, args.m_local * W, args.n, args.k, "bf16", direction=args.direction, copy=args.copy)
rng = cp.random.default_rng(r)
a = rng.standard_normal((args.m_local, args.k), dtype=cp.float32).astype(ml_dtypes.bfloat16)
b = rng.standard_normal((args.n, args.k), dtype=cp.float32).astype(ml_dtypes.bfloat16)
out = cp.empty((args.m_local * W, args.n), dtype=ml_dtypes.bfloat16)
s = cp.cuda.Stream(non_blocking=True)

marks = []  # (label, event) in issue order
orig_memcpy, orig_memcpy2d, orig_launch = cp.cuda.runtime.memcpyAsync, cp.cuda.runtime.memcpy2DAsync, engine.launch


def _mark(label, stream):
    ev = cp.cuda.Event(disable_timing=True)
    cp.cuda.runtime.eventRecord(ev.ptr, stream)
    marks.append((label, ev))


def memcpy(dst, src, size, kind, stream):
    orig_memcpy(dst, src, size, kind, stream)
    _mark(f"memcpy {size} B on stream {stream:#x}", stream)


def memcpy2d(dst, dpitch, src, spitch, width, height, kind, stream):
    orig_memcpy2d(dst, dpitch, src, spitch, width, height, kind, stream)
    _mark(f"memcpy2D {width}x{height} on stream {stream:#x}", stream)


def launch(kernel, grid, threads, cluster, smem, stream, a_, **kw):
    orig_launch(kernel, grid, threads, cluster, smem, stream, a_, **kw)
    if "ag_copy_kernel" in kernel.symbol:
        return  # no event between the copy kernel and the GEMM, its programmatic dependent
    _mark(f"kernel {kernel.symbol[:40]} grid {grid} on stream {stream:#x}{' (PDL)' if kw.get('pdl') else ''}", stream)


cp.cuda.runtime.memcpyAsync, cp.cuda.runtime.memcpy2DAsync = memcpy, memcpy2d
engine.launch = planning.launch = launch  # the copy kernels' launches and the GEMM plan's
print(f"[{r}] {op!r} sms={op.sms} reserved={op.reserved_sms} copy_sms={op.copy_sms} main stream {s.ptr:#x}", flush=True)
for call in range(args.calls):
    if not args.batch:
        marks.clear()
    marks.append((f"-- call {call}", None))
    try:
        op(a, b, out=out, stream=s.ptr)
    except Exception as e:  # noqa: BLE001  (a previous call's device-side failure)
        print(f"[{r}] call {call} raised at its start: {type(e).__name__}: {str(e)[:300]}", flush=True)
        break
    _mark("end of call (main stream)", s.ptr)
    if args.batch and call + 1 < args.calls:
        continue
    if args.sync_every and (call + 1) % args.sync_every == 0:
        s.synchronize()
    t0 = time.time()
    while time.time() - t0 < 10 and not marks[-1][1].done:  # the device waits: RAWFLUX_WAIT_TIMEOUT_S (30 here)
        time.sleep(0.005)
    if marks[-1][1].done:
        continue
    last_call = "?"
    pending = []
    for label, ev in marks:
        if ev is None:
            last_call = label
        elif not ev.done:
            pending.append(f"{last_call}: {label}")
    print(f"[{r}] call {call}: not done after 10 s; {len(pending)} of {len(marks)} steps pending, first: {pending[:4]}", flush=True)
    break
try:
    s.synchronize()
    g.raise_if_failed()
    print(f"[{r}] all {args.calls} calls finished", flush=True)
except Exception as e:  # noqa: BLE001
    print(f"[{r}] failed: {type(e).__name__}: {str(e)[:400]}", flush=True)
ready = np.empty(W, np.uint32)
cp.cuda.runtime.memcpy(ready.ctypes.data, op._sync.ptr + A.READY_OFFSET, 4 * W, 2)
print(f"[{r}] ready flags {ready.tolist()} ctrl {g.ctrl_state()}", flush=True)
