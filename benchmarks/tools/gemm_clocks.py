"""Sustained SM clock and board power of rawflux.gemm and torch.matmul, each run alone.

    PYTHONPATH=. python benchmarks/tools/gemm_clocks.py [--shapes 4096x8192x8192,...] [--seconds 2.5]

Each implementation runs back to back for --seconds (inputs rotated past L2) while nvidia-smi
samples the SM clock, the board power and the clock-event reasons every 50 ms; each run is
repeated twice, alternating. Tells whether a gap against cuBLAS is power (a lower sustained clock
for the same work) or cycles (the same clock, more time). Its 50 ms samples and the clock's
15 MHz steps cannot show a difference below ~1 %; ncu at locked clocks can.
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/gemm.py


def parse_smi(text: str) -> list[tuple[float, float, float, str]]:
    """(epoch seconds, SM MHz, watts, event reasons) per nvidia-smi CSV line; others skipped."""
    out = []
    for line in text.splitlines():
        p = [x.strip() for x in line.split(",")]
        try:
            ts = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((ts, float(p[1].split()[0]), float(p[2].split()[0]), p[3]))
        except (ValueError, IndexError):
            continue
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x8192x8192,4096x12288x6144,2048x8192x28672,8192x8192x8192")
    ap.add_argument("--seconds", type=float, default=2.5)
    args = ap.parse_args(argv)

    import torch
    from gemm import rotated_inputs

    from rawflux.ops import gemm as g

    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active",
                            "--format=csv,noheader", "-lms", "50"], stdout=subprocess.PIPE, text=True)
    marks = []

    def run(label, fn, nsets):
        for i in range(3):
            fn(i % nsets)
        torch.cuda.synchronize()
        t0, calls = time.time(), 0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        while time.time() - t0 < args.seconds:
            for i in range(8):
                fn((calls + i) % nsets)
            calls += 8
            if calls % 64 == 0:
                torch.cuda.synchronize()
        end.record()
        torch.cuda.synchronize()
        marks.append((label, t0 + 0.7, time.time(), start.elapsed_time(end) / calls * 1e3))  # the first 0.7 s: the clock settles

    for shape in args.shapes.split(","):
        m, n, k = (int(x) for x in shape.split("x"))
        nsets, a, b, o = rotated_inputs(m, n, k)
        for _ in range(2):
            run(f"rawflux      {shape}", lambda i: g.gemm(a[i], b[i], out=o[i]), nsets)
            time.sleep(0.3)
            run(f"torch.matmul {shape}", lambda i: torch.matmul(a[i], b[i].T, out=o[i]), nsets)
            time.sleep(0.3)
        del a, b, o
    time.sleep(0.2)
    smi.terminate()
    samples = parse_smi(smi.communicate()[0])
    for label, t0, t1, us in marks:
        ss = [s for s in samples if t0 <= s[0] <= t1]
        if not ss:
            print(f"{label}: {us:8.1f} us/call, no clock samples")
            continue
        print(f"{label}: {us:8.1f} us/call  SM clock median {statistics.median(s[1] for s in ss):.0f} MHz  "
              f"power median {statistics.median(s[2] for s in ss):.0f} W  reasons {sorted({s[3] for s in ss})}  ({len(ss)} samples)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
