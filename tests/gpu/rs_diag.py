"""Diagnostics for gemm_rs at world >= 2 (emulated node): one small call, then what the GEMM,
the flags and the partial buffers did. python -m rawflux.launch --emulate 2 tests/gpu/rs_diag.py [variant]"""
import os
import sys
import time

os.environ.setdefault("RAWFLUX_WAIT_TIMEOUT_S", "3")
import cupy as cp
import ml_dtypes
import numpy as np

import rawflux
from rawflux.engine import planning
from rawflux.ops import gemm_rs as R

variant = sys.argv[1] if len(sys.argv) > 1 else "normal"
g = rawflux.dist.init()
r = g.rank
op = R.GemmRS(g, 256, 512, 256, "bf16")
m = 128
rng = cp.random.default_rng(r)
a = rng.standard_normal((m, 256), dtype=cp.float32).astype(ml_dtypes.bfloat16)
b = rng.standard_normal((512, 256), dtype=cp.float32).astype(ml_dtypes.bfloat16)
p = op.plan(m)
print(f"[{r}] variant={variant} cfg={p.cfg} reduce_grid={p.reduce_grid} tail_grid={p.tail_grid} gemm_ctas={op.gemm_ctas} "
      f"sms={op.dev.sms} tiles_n={p.tiles_n} seg_start={p.seg_start} epoch_ptr={op.epoch_ptr:#x}", flush=True)
s = cp.cuda.Stream(non_blocking=True)
ev_gemm = cp.cuda.Event(disable_timing=True)
orig_gemm, orig_reduce = planning.GemmPlan.launch, R._launch_reduce


def gemm_wrap(self, *args, **kw):
    orig_gemm(self, *args, **kw)
    cp.cuda.runtime.eventRecord(ev_gemm.ptr, kw["stream"])


def reduce_wrap(kernel, grid, stream, params):
    if variant == "noside" and stream != s.ptr:
        return
    orig_reduce(kernel, grid, stream, params)


planning.GemmPlan.launch = gemm_wrap
R._launch_reduce = reduce_wrap
out = op(a, b, stream=s.ptr)
t0 = time.time()
done_at = None
while time.time() - t0 < 6:
    if ev_gemm.done:
        done_at = time.time() - t0
        break
    time.sleep(0.01)
print(f"[{r}] gemm done after {done_at}", flush=True)
try:
    s.synchronize()
    g.raise_if_failed()
    print(f"[{r}] call ok", flush=True)
except Exception as e:  # noqa: BLE001
    print(f"[{r}] call failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
flags = np.empty(op.flags.nbytes // 4, np.uint32)
cp.cuda.runtime.memcpy(flags.ctypes.data, op.flags.ptr, op.flags.nbytes, 2)
nz = np.nonzero(flags)[0]
print(f"[{r}] flags nonzero: {len(nz)} idx {nz[:24].tolist()} vals {flags[nz[:24]].tolist()}", flush=True)
parts = np.empty(op.parts.nbytes // 4, np.uint32)
cp.cuda.runtime.memcpy(parts.ctypes.data, op.parts.ptr, op.parts.nbytes, 2)
print(f"[{r}] parts nonzero words: {np.count_nonzero(parts)} of {parts.size}", flush=True)
ctrl = g.ctrl_state()
print(f"[{r}] ctrl {ctrl}", flush=True)
