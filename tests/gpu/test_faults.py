"""A kernel that ends the CUDA context surfaces as rawflux.KernelFault (rawflux/jit/faults.py) at
rawflux's next launch or synchronize, naming the last kernels launched. Each case runs in a child
process: the context it breaks cannot be used again. Skips without a GPU (tests/conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

cupy = pytest.importorskip("cupy")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = r"""
import cupy
import rawflux
from rawflux import KernelFault

rng = cupy.random.default_rng()
a = (rng.standard_normal((4096, 8192), dtype=cupy.float32) + 1).astype(cupy.float16)
b = (rng.standard_normal((4096, 8192), dtype=cupy.float32) + 1).astype(cupy.float16)
out = cupy.empty((4096, 4096), dtype=cupy.float16)
rawflux.gemm(a, b, out=out)
cupy.cuda.Device().synchronize()
# what an expired pipeline wait does (asm trap), in a kernel of the test's own
cupy.RawKernel('extern "C" __global__ void boom() { asm volatile("trap;"); }', "boom")((1,), (1,), ())
try:
    for _ in range(20):
        rawflux.gemm(a, b, out=out)
    try:
        cupy.cuda.Device().synchronize()
    except cupy.cuda.runtime.CUDARuntimeError as e:
        print("SYNC", e.status, flush=True)  # CuPy's own call: its error, not rawflux's
    rawflux.gemm(a, b, out=out)  # a launch on a lost context
    cupy.cuda.Device().synchronize()
    print("RESULT no-fault")
except KernelFault as e:
    print("RESULT fault", e.code, str(e).replace("\n", " "))
except Exception as e:
    print("RESULT other", type(e).__name__, getattr(e, "status", None), str(e).replace("\n", " "))
"""


def _child() -> str:
    p = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=240)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"the child printed no result (rc {p.returncode}): {p.stdout[-2000:]} {p.stderr[-2000:]}"
    return lines[-1]


def test_a_trapped_kernel_is_a_kernel_fault_at_the_next_rawflux_call():
    got = _child()
    assert got.startswith("RESULT fault 719"), got  # CUDA_ERROR_LAUNCH_FAILED: what a trap gives
    assert "must restart" in got and "rawflux::gemm_kernel<...>" in got and "_ZN" not in got, got

