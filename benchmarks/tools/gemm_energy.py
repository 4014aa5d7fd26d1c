"""Energy per call of rawflux.gemm and torch.matmul, measured below the power cap.

    PYTHONPATH=. python benchmarks/tools/gemm_energy.py [--shapes 4096x8192x8192,...] [--seconds 2]

At the H200's 700 W cap the SM clock is whatever the power allows, so a kernel that spends more
energy per GEMM runs at a lower clock there, even with the same cycles. This measures the energy
itself: each implementation runs in bursts (a few calls, then the GPU idles for --gap-ms) so the
board stays below the cap, and NVML's energy counter (libnvidia-ml, mJ) is read around the run.
Two burst sizes with the same number of bursts give the energy per call as the slope,
(E(b2) - E(b1)) / (calls(b2) - calls(b1)): the idle gaps and the burst overheads cancel. The SM clock
(NVML, sampled between bursts) tells whether a run stayed off the cap. Implementations alternate,
twice each.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/gemm.py


class Nvml:
    """The few NVML calls needed, through ctypes (the driver ships libnvidia-ml; pynvml may not be there)."""

    def __init__(self, index: int = 0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self.h = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.h)) != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex_v2 failed")

    def energy_mj(self) -> int:
        v = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.h, ctypes.byref(v)) != 0:
            raise RuntimeError("nvmlDeviceGetTotalEnergyConsumption failed")
        return v.value

    def sm_mhz(self) -> int:
        v = ctypes.c_uint()
        self.lib.nvmlDeviceGetClockInfo(self.h, 1, ctypes.byref(v))  # NVML_CLOCK_SM
        return v.value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x8192x8192,2048x12288x6144")
    ap.add_argument("--bursts", type=int, default=300, help="bursts per run")
    ap.add_argument("--calls", default="1,3", help="calls per burst in the two runs (the slope's ends)")
    ap.add_argument("--gap-ms", type=float, default=4.0, help="idle time after each burst")
    args = ap.parse_args(argv)

    import torch
    from gemm import rotated_inputs

    from rawflux.ops import gemm as g

    nv = Nvml(torch.cuda.current_device())
    b1, b2 = (int(x) for x in args.calls.split(","))
    for shape in args.shapes.split(","):
        m, n, k = (int(x) for x in shape.split("x"))
        nsets, a, b, o = rotated_inputs(m, n, k)
        impls = {"rawflux": lambda i: g.gemm(a[i], b[i], out=o[i]),
                 "torch.matmul": lambda i: torch.matmul(a[i], b[i].T, out=o[i])}
        for fn in impls.values():
            for i in range(2 * nsets):
                fn(i % nsets)
        torch.cuda.synchronize()

        def run(fn, per_burst):
            """(energy in J, calls, median SM MHz between bursts, GPU us per call)."""
            calls, mhz, gpu_ms = 0, [], 0.0
            e0 = nv.energy_mj()
            for _ in range(args.bursts):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(per_burst):
                    fn(calls % nsets)
                    calls += 1
                e.record()
                e.synchronize()
                gpu_ms += s.elapsed_time(e)
                mhz.append(nv.sm_mhz())
                time.sleep(args.gap_ms / 1e3)
            return (nv.energy_mj() - e0) / 1e3, calls, statistics.median(mhz), gpu_ms / calls * 1e3

        res = {name: [] for name in impls}
        for _ in range(2):
            for name, fn in impls.items():
                lo, hi = run(fn, b1), run(fn, b2)
                res[name].append(((hi[0] - lo[0]) / (hi[1] - lo[1]), lo, hi))
        for name, rows in res.items():
            for j_per_call, lo, hi in rows:
                print(f"{shape} {name:13s}: {j_per_call * 1e3:8.1f} mJ/call  (runs: {lo[1]} calls {lo[0]:.2f} J, {hi[1]} calls "
                      f"{hi[0]:.2f} J; SM clock median {lo[2]:.0f} / {hi[2]:.0f} MHz; {lo[3]:.1f} / {hi[3]:.1f} us per call)")
        mean = {name: statistics.mean(r[0] for r in rows) for name, rows in res.items()}
        print(f"{shape}: rawflux / torch.matmul energy per call {mean['rawflux'] / mean['torch.matmul']:.4f}")
        del a, b, o
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
