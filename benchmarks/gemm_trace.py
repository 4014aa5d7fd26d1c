"""Per-CTA timeline of rawflux.gemm: where a launch's time goes (start-up, first data, main loop,
epilogue / split-K fix-up, the slowest CTA), next to cuBLAS's time for the same problem.

    PYTHONPATH=. python benchmarks/gemm_trace.py [--cases M,N,K[,TAG];...] [--reps 12] [--json PATH]

Builds the kernels with RAWFLUX_TRACE=1 (cuda_src/rawflux/gemm/trace.cuh): each CTA stamps
%globaltimer at fixed points into the module global `rawflux_trace`. Every rep runs cuBLAS (torch)
and then rawflux between CUDA events after a short GPU sleep, fresh inputs rotated over 4 sets; the
table gives, per stamp, microseconds after the first CTA's entry for the median CTA and the slowest
CTA (each the median over reps), then the time the CTA's producer waited for free stages and its
first consumer warpgroup for full ones (sums over its tiles; the 128x320 tile records no consumer
wait). The stamps cost a few global stores, and the wait sums a timer read per k block in the
producer thread and every consumer thread: about 50 SM cycles per k block of 128x256 (session 19),
so per-k-block cycles come from --no-block-waits builds only. Use event times from
benchmarks/gemm.py for performance, this for attribution. A trace build that spills is reported and skipped. --json also
keeps every CTA's row of the last rep (stamps and waits in us, and its SM), to tell a slow SM from
slow data.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

os.environ["RAWFLUX_NVRTC_DEFINES"] = (os.environ.get("RAWFLUX_NVRTC_DEFINES", "") + " RAWFLUX_TRACE=1").strip()

STAMPS = ["entry", "synced", "producer_ready", "first_load", "consumer_ready", "first_data", "loop_end", "exit"]
SUMS = ["producer_wait", "consumer_wait"]  # ns summed over the CTA's tiles (slots 8, 9)
SM_SLOT = 10  # kTraceSm
CYCLES = 11  # kTraceLoopCycles, kTraceEpiCycles, kTraceTiles (SM cycles summed over tiles, and the tile count)
SLOTS = 14  # kTraceSlots
CTAS = 1024  # kTraceCtas
DEFAULT_CASES = ("64,8192,8192;128,8192,8192;256,8192,8192;512,8192,8192;128,8192,8192,128x128x64s7c1w2/k1/g8m/p0;"
                 "4096,8192,8192")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=DEFAULT_CASES, help="M,N,K[,config tag];... (no tag: the heuristic's pick)")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-block-waits", action="store_true",
                    help="build without the per-k-block wait sums (RAWFLUX_TRACE_BLOCK_WAITS=0): the per-tile loop cycles are then "
                         "the k loop's own (the sums add ~50 cycles per k block), and the waits read 0")
    args = ap.parse_args(argv)
    if args.no_block_waits:
        os.environ["RAWFLUX_NVRTC_DEFINES"] += " RAWFLUX_TRACE_BLOCK_WAITS=0"

    import cupy
    import numpy as np
    import torch

    from rawflux import tune
    from rawflux.ops import gemm as g
    from rawflux.runtime import DType

    out = []
    for case in args.cases.split(";"):
        parts = case.split(",")
        m, n, k = (int(x) for x in parts[:3])
        cfg = tune.parse_tag(parts[3]) if len(parts) > 3 else g.pick_config(m, n, k, DType.BF16, "nk", DType.BF16, 0)
        sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda", dtype=torch.bfloat16),
                 torch.empty(m, n, device="cuda", dtype=torch.bfloat16)) for _ in range(4)]
        for a, w, o in sets * 3:  # compile, warm up
            g.gemm(a, w, out=o, config=cfg)
        kern = g.get_kernel("gemm.cu", g.kernel_name(cfg.tile, DType.BF16, DType.BF16, "nk", sched=g.PLAIN_SCHED,
                                                     epilogue=g.plain_epilogue(DType.BF16)), device_id=0, arch="sm_90a")
        res = kern.resources
        if res.get("spill_stores") or res.get("stack"):
            print(f"{m}x{n}x{k} [{cfg.tag()}]: the trace build spills ({res}); its timeline would not be the kernel's: skipped")
            continue
        ptr = kern._module.get_global_var("rawflux_trace")
        buf = cupy.ndarray((CTAS, SLOTS), dtype=cupy.uint64,
                           memptr=cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, CTAS * SLOTS * 8, kern._module), 0))
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        med, slow, times, per_tile = [], [], [], []
        for rep in range(args.reps):
            a, w, o = sets[rep % 4]
            a2, w2, o2 = sets[(rep + 1) % 4]
            buf.fill(0)
            torch.cuda._sleep(2_000_000)
            ev[0].record()
            torch.matmul(a2, w2.T, out=o2)
            ev[1].record()
            g.gemm(a, w, out=o, config=cfg)
            ev[2].record()
            torch.cuda.synchronize()
            t = buf.get().astype(np.int64)
            ids = np.flatnonzero(t[:, 0] != 0)  # CTAs that ran (blockIdx.x)
            live = t[ids]
            stamps = live[:, :len(STAMPS)]
            rel = np.concatenate([(stamps - stamps[:, 0].min()) / 1000.0, live[:, len(STAMPS):SM_SLOT] / 1000.0], axis=1)
            med.append(np.median(rel, axis=0))
            slow.append(rel.max(axis=0))
            times.append((ev[0].elapsed_time(ev[1]) * 1e3, ev[1].elapsed_time(ev[2]) * 1e3))
            cyc = live[:, CYCLES:CYCLES + 3].astype(np.float64)
            ok = cyc[:, 2] > 0
            per_tile.append((np.median(cyc[ok, 0] / cyc[ok, 2]), np.median(cyc[ok, 1] / cyc[ok, 2])) if ok.any() else (0.0, 0.0))
        med_s, slow_s = np.median(np.array(med), axis=0), np.median(np.array(slow), axis=0)
        row = {"m": m, "n": n, "k": k, "config": cfg.tag(), "ctas": int(len(live)),
               "cublas_us": statistics.median(x[0] for x in times), "rawflux_us": statistics.median(x[1] for x in times),
               "median_cta_us": dict(zip(STAMPS + SUMS, med_s.round(3).tolist())),
               "slowest_cta_us": dict(zip(STAMPS + SUMS, slow_s.round(3).tolist())),
               "last_rep_ctas": [dict(zip(STAMPS + SUMS, r.round(3).tolist()), cta=int(i), sm=int(sm))
                                 for i, r, sm in zip(ids, rel, live[:, SM_SLOT])]}
        loop_c, epi_c = (statistics.median(x[i] for x in per_tile) for i in (0, 1))
        row["per_tile_cycles"] = {"loop": round(loop_c), "epilogue": round(epi_c)}
        out.append(row)
        print(f"{m}x{n}x{k} [{cfg.tag()}] {row['ctas']} CTAs; events: cuBLAS {row['cublas_us']:.1f} us, rawflux {row['rawflux_us']:.1f} us")
        print("   " + "  ".join(f"{s} {a:.2f}/{b:.2f}" for s, a, b in zip(STAMPS, med_s, slow_s)))
        print("   waits (us, median / largest CTA): " + "  ".join(f"{s} {a:.2f}/{b:.2f}" for s, a, b in
                                                          zip(SUMS, med_s[len(STAMPS):], slow_s[len(STAMPS):])), flush=True)
        if loop_c:
            print(f"   per tile (median CTA, SM cycles): loop {loop_c:.0f}  epilogue {epi_c:.0f} ({100 * epi_c / (loop_c + epi_c):.2f} %)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "rows": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
