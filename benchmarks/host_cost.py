"""What one call costs the host, for the plain GEMM and the fused ops, at decode sizes.

    PYTHONPATH=. python benchmarks/host_cost.py [--ms 16,128] [--n 8192 --k 8192] [--calls 200] [--json PATH]
    rawflux-launch --emulate 2 python benchmarks/host_cost.py ...      # W = 2 (two ranks, one GPU)
    ... --profile gemm_rs.object                                       # where one form's host time goes

Each form (torch.matmul, one 4-byte cudaMemcpyAsync as the "ce" AllGather issues it per peer and
slab: rawflux.ops.ag_gemm.CE_CALL_US, rawflux.gemm, each op object and its functional form, on
torch inputs) is timed as: a delay kernel holds the stream, the host queues --calls calls (host_us = their
wall time / calls, perf_counter), then the stream runs them back to back between two CUDA
events (device_us = elapsed / calls: the device time once the host is out of the way); the
median of --reps such rounds. Bars: host_us <= 15 for op objects, <= 25 for functional forms.
At W > 1 every rank queues the same calls; the table is rank 0's. Records (op, form, world, m,
n, k, host_us, device_us, bar_us, copy, gpu, emulated, commit, date) go to --json ({"kind": "host-cost",
"records": [...]}), replacing the rows of the same world.
"""
from __future__ import annotations

import argparse
import cProfile
import datetime
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
OBJECT_BAR_US = 15.0
FUNCTIONAL_BAR_US = 25.0


def forms(group, m: int, n: int, k: int, paths: dict | None = None):
    """(op, form, bar_us or None, call) for every form at world W: each call writes a
    preallocated output from fresh random inputs made here once. ``paths`` gets (op, form) -> the
    copy path of the ag_gemm rows' calls at W > 1 (the default op's per-m pick, or the row's own)."""
    import torch

    import rawflux

    w, dev = group.world, torch.device("cuda", group.device_id)
    g = torch.Generator(device=dev).manual_seed(1234 + group.rank)
    rnd = lambda *s: torch.randn(*s, device=dev, dtype=torch.bfloat16, generator=g)  # noqa: E731
    a, b = rnd(m, k), rnd(n, k)
    c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    from cupy.cuda import runtime

    word = torch.zeros(2, device=dev, dtype=torch.int32)
    side = torch.cuda.current_stream(dev).cuda_stream
    out = [("torch", "matmul", None, lambda: torch.matmul(a, b.t(), out=c)),
           ("cuda", "memcpyAsync", None, lambda: runtime.memcpyAsync(word.data_ptr() + 4, word.data_ptr(), 4, runtime.memcpyDefault, side)),
           ("gemm", "functional", FUNCTIONAL_BAR_US, lambda: rawflux.gemm(a, b, out=c))]
    a_ar, b_ar = rnd(m, k // w), rnd(n, k // w)
    ar = rawflux.GemmAR(group, m, n, k // w, torch.bfloat16)
    out += [("gemm_ar", "object", OBJECT_BAR_US, lambda: ar(a_ar, b_ar, out=c)),
            ("gemm_ar", "functional", FUNCTIONAL_BAR_US, lambda: rawflux.gemm_ar(a_ar, b_ar, group, out=c))]
    if m % w:
        return out
    b_rs, c_rs = rnd(n, k // w), torch.empty(m // w, n, device=dev, dtype=torch.bfloat16)
    a_rs = rnd(m, k // w)
    rs = rawflux.GemmRS(group, m, n, k // w, torch.bfloat16)
    out += [("gemm_rs", "object", OBJECT_BAR_US, lambda: rs(a_rs, b_rs, out=c_rs)),
            ("gemm_rs", "functional", FUNCTIONAL_BAR_US, lambda: rawflux.gemm_rs(a_rs, b_rs, group, out=c_rs))]
    a_ag, b_ag, c_ag = rnd(m // w, k), rnd(n // w, k), torch.empty(m, n // w, device=dev, dtype=torch.bfloat16)
    ag = rawflux.AGGemm(group, m, n // w, k, torch.bfloat16)
    out += [("ag_gemm", "object", OBJECT_BAR_US, lambda: ag(a_ag, b_ag, out=c_ag)),
            ("ag_gemm", "functional", FUNCTIONAL_BAR_US, lambda: rawflux.ag_gemm(a_ag, b_ag, group, out=c_ag))]
    if w > 1:
        paths = {} if paths is None else paths
        paths[("ag_gemm", "object")] = paths[("ag_gemm", "functional")] = ag.path(m)
        # each copy path on its own where the default op picks between them (no bar: what
        # ops.ag_gemm.pick_copy weighs); the emulated node has one path ("ce" cannot run under MPS)
        for copy in ag.paths if len(ag.paths) > 1 else ():
            op = rawflux.AGGemm(group, m, n // w, k, torch.bfloat16, copy=copy)
            out.append(("ag_gemm", f"object.{copy}", None, lambda op=op: op(a_ag, b_ag, out=c_ag)))
            paths[("ag_gemm", f"object.{copy}")] = copy
    return out


def time_form(call, calls: int, reps: int, delay, stream) -> tuple[float, float]:
    """(host_us, device_us): medians over reps rounds of `calls` queued behind the delay kernel."""
    import numpy as np
    import torch

    for _ in range(10):
        call()
    torch.cuda.synchronize()
    host, dev = [], []
    for _ in range(reps):
        delay.launch((1,), (1,), (np.uint64(calls * 500_000 + 5_000_000),), stream=stream)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        t1 = time.perf_counter()
        e1.record()
        e1.synchronize()
        host.append((t1 - t0) * 1e6 / calls)
        dev.append(e0.elapsed_time(e1) * 1e3 / calls)
    return statistics.median(host), statistics.median(dev)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="16,128")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--profile", default=None, help="OP.FORM: print cProfile's top functions for that form instead")
    ap.add_argument("--json", default=str(RESULTS / "host-cost.json"))
    args = ap.parse_args(argv)
    import torch

    import rawflux
    from rawflux.bench.timing import run_info
    from rawflux.jit import get_kernel

    group = rawflux.init()
    torch.cuda.set_device(group.device_id)
    stream = torch.cuda.current_stream().cuda_stream
    delay = get_kernel("bench_delay.cu", "rawflux::bench_delay_kernel", device_id=group.device_id)
    info = run_info(group)
    rows, over = [], 0
    for m in (int(x) for x in args.ms.split(",")):
        paths: dict = {}
        for op, form, bar, call in forms(group, m, args.n, args.k, paths):
            if args.profile and args.profile != f"{op}.{form}":
                continue
            if args.profile:
                for _ in range(10):
                    call()
                torch.cuda.synchronize()
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(args.calls):
                    call()
                prof.disable()
                torch.cuda.synchronize()
                if group.rank == 0:
                    print(f"--- {op}.{form} m={m}: cProfile of {args.calls} calls")
                    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
                continue
            host_us, dev_us = time_form(call, args.calls, args.reps, delay, stream)
            ok = bar is None or host_us <= bar
            over += not ok
            rows.append({"op": op, "form": form, "world": group.world, "m": m, "n": args.n, "k": args.k, "host_us": round(host_us, 2),
                         "device_us": round(dev_us, 2), "bar_us": bar, "copy": paths.get((op, form)), "gpu": info.gpu, "emulated": info.emulated,
                         "commit": info.commit, "date": datetime.date.today().isoformat()})
            if group.rank == 0:
                verdict = "" if bar is None else ("ok" if ok else f"OVER {bar:g}")
                print(f"host-cost W={group.world} m={m:4d} {op:8s} {form:10s} {paths.get((op, form)) or '':2s} host {host_us:7.1f} us  device {dev_us:7.1f} us  {verdict}")
    if group.rank == 0 and rows:
        print(f"host-cost summary: W={group.world} {sum(r['bar_us'] is not None for r in rows) - over}/"
              f"{sum(r['bar_us'] is not None for r in rows)} forms within their bar")
        path = Path(args.json)
        old = json.loads(path.read_text())["records"] if path.exists() else []
        keep = [r for r in old if r.get("world") != group.world]
        path.write_text(json.dumps({"kind": "host-cost", "records": keep + rows}, indent=1) + "\n")
    rawflux.finalize()
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
