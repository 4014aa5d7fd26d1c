"""Both consumer warpgroups' k loop, k block by k block: is the tensor pipe slower, or idle?

    PYTHONPATH=. RAWFLUX_NVRTC_DEFINES="[RAWFLUX_PROBE=...]" python benchmarks/gemm_phase.py [--tile 128x256x64s4c1w2] [--k 131072]

One tile per SM (as benchmarks/gemm_kloop.py), the trace build without its per-block wait sums plus
RAWFLUX_TRACE_PHASE=1 (config.cuh): the first thread of each of the two consumer warpgroups stamps
%clock when its full wait returned (ready), when its wgmma group was issued and when that group
completed, for every k block of the first 16 CTAs. With the groups of both warpgroups in completion
order (the tensor pipe runs them one after another):
- period: a warpgroup's cycles per k block (two groups);
- exec: a group's completion minus max(its issue, the previous group's completion), i.e. its time on
  the pipe once the pipe was free for it;
- bubble_hi / bubble_lo: how long the pipe may have idled before a group, counted from its issue
  (upper bound) or from its warpgroup being ready (lower bound);
- d: warpgroup 1's completion of block i minus warpgroup 0's (about +-half a period when they take
  turns, near 0 when they issue and finish together);
- per warpgroup, completion -> ready (release, next full wait) and ready -> issued.
The stamps cost cycles of their own (config.cuh): compare variants under this build only.
Session 22 (docs/gemm-notes.md): with the producer waiting for releases, exec grows by ~7.5 cycles
per group with no bubble: the pipe is busy and slower, not idle.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CTAS, KINDS, BLOCKS = 16, 3, 2048  # trace.cuh: kPhaseCtas, the three stamps, kPhaseBlocks
READY, ISSUED, DONE = 0, 1, 2


def analyse(stamps, nkb: int, skip: int) -> dict:
    """stamps: uint32 [CTAS][2][KINDS][BLOCKS] (%clock, wrapping). Returns the distributions above over
    the CTAs with every stamp present, k blocks skip..nkb-1."""
    import numpy as np

    out = {"period": [], "exec": [], "bubble_hi": [], "bubble_lo": [], "d": [], "turn0": [], "issue0": [], "turn1": [], "issue1": []}
    st = np.asarray(stamps, dtype=np.int64)
    for c in range(st.shape[0]):
        x = st[c, :, :, :nkb]
        if not x.all():
            continue
        x = (x - x[0, DONE, 0]) % (1 << 32)
        x = np.where(x > (1 << 31), x - (1 << 32), x)  # relative to warpgroup 0's first completion, signed
        out["period"].append(np.diff(x[0, DONE, skip:]))
        out["d"].append(x[1, DONE, skip:] - x[0, DONE, skip:])
        groups = np.array(sorted((x[wg, DONE, i], x[wg, ISSUED, i], x[wg, READY, i]) for wg in (0, 1) for i in range(skip, nkb)))
        done, issued, ready = groups[:, 0], groups[:, 1], groups[:, 2]
        out["exec"].append(done[1:] - np.maximum(issued[1:], done[:-1]))
        out["bubble_hi"].append(np.maximum(0, issued[1:] - done[:-1]))
        out["bubble_lo"].append(np.maximum(0, ready[1:] - done[:-1]))
        for wg in (0, 1):
            out[f"turn{wg}"].append(x[wg, READY, skip + 1:] - x[wg, DONE, skip:-1])
            out[f"issue{wg}"].append(x[wg, ISSUED, skip:] - x[wg, READY, skip:])
    return {k: np.concatenate(v) if v else np.zeros(0, dtype=np.int64) for k, v in out.items()}


def last_blocks(stamps, nkb: int) -> list[tuple[int, int, int, int, int]]:
    """For a run caught mid-way (--snapshot): per recorded CTA and warpgroup, how many k blocks
    have each stamp (ready, issued, done), as (cta, wg, ready, issued, done). Stamps are written
    in block order, so the count is also the next block the warpgroup had not reached."""
    import numpy as np

    st = np.asarray(stamps)
    out = []
    for c in range(st.shape[0]):
        for wg in (0, 1):
            counts = [int(np.count_nonzero(st[c, wg, kind, :nkb])) for kind in (READY, ISSUED, DONE)]
            if any(counts):
                out.append((c, wg, *counts))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tile", default="128x256x64s4c1w2")
    ap.add_argument("--k", type=int, default=131072)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip", type=int, default=64, help="k blocks left out at the start (the ring's fill)")
    ap.add_argument("--snapshot", type=float, default=0.0,
                    help="seconds: launch once, copy the stamps on another stream this long after the launch (while a "
                         "hung kernel still waits; set RAWFLUX_WAIT_TIMEOUT_S above it) and print how far each "
                         "warpgroup got, then wait for the kernel")
    args = ap.parse_args(argv)
    os.environ["RAWFLUX_NVRTC_DEFINES"] = (os.environ.get("RAWFLUX_NVRTC_DEFINES", "")
                                           + " RAWFLUX_TRACE=1 RAWFLUX_TRACE_BLOCK_WAITS=0 RAWFLUX_TRACE_PHASE=1").strip()
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import cupy
    import numpy as np
    import torch
    from gemm_kloop import one_tile_per_sm

    from rawflux import tune
    from rawflux.ops import gemm as g
    from rawflux.runtime import DType

    cfg = tune.parse_tag(args.tile + "/k1/g8m/p0")
    t = cfg.tile
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    m, n = one_tile_per_sm(t.bm, t.bn, t.cluster_m, sms)
    k = args.k
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    o = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    # compiled (and its module loaded) without a launch: under --snapshot the launch may hang
    kern = g.get_kernel("gemm.cu", g.kernel_name(t, DType.BF16, DType.BF16, "nk", sched=g.PLAIN_SCHED,
                                                 epilogue=g.plain_epilogue(DType.BF16)), device_id=0, arch="sm_90a")
    if args.snapshot <= 0:
        g.gemm(a, w, out=o, config=cfg)  # warm-up
        torch.cuda.synchronize()
    size = CTAS * 2 * KINDS * BLOCKS
    buf = cupy.ndarray((CTAS, 2, KINDS, BLOCKS), dtype=cupy.uint32, memptr=cupy.cuda.MemoryPointer(
        cupy.cuda.UnownedMemory(kern._module.get_global_var("rawflux_phase"), size * 4, kern._module), 0))
    nkb = min(k // getattr(t, "bk", 64), BLOCKS)
    print(f"{os.environ['RAWFLUX_NVRTC_DEFINES']}: {sms} tiles {t.bm}x{t.bn} ({m}x{n}), k {k}, blocks {args.skip}..{nkb}", flush=True)
    if args.snapshot > 0:
        import time

        buf.fill(0)
        torch.cuda.synchronize()
        run_stream, copy_stream = torch.cuda.Stream(), cupy.cuda.Stream(non_blocking=True)
        with torch.cuda.stream(run_stream):
            g.gemm(a, w, out=o, config=cfg)
        time.sleep(args.snapshot)
        snap = buf.get(stream=copy_stream)
        copy_stream.synchronize()
        done = run_stream.query()
        print(f"snapshot after {args.snapshot} s (kernel finished: {done}); k blocks with each stamp, of {nkb}:", flush=True)
        for c, wg, r, i_, d in last_blocks(snap, nkb):
            print(f"  cta {c:2d} wg {wg}: ready {r:5d}  issued {i_:5d}  done {d:5d}", flush=True)
        run_stream.synchronize()
        return 0
    runs = []
    for _ in range(args.reps):
        buf.fill(0)
        torch.cuda._sleep(1_000_000)
        g.gemm(a, w, out=o, config=cfg)
        torch.cuda.synchronize()
        runs.append(analyse(buf.get(), nkb, args.skip))
    res = {key: np.concatenate([r[key] for r in runs]) for key in runs[0]}
    if not len(res["period"]):
        print("no CTA recorded every stamp", flush=True)
        return 1
    q = lambda v: np.percentile(v, [5, 25, 50, 75, 95]).round().astype(int).tolist()  # noqa: E731
    for key in ("period", "exec", "bubble_hi", "bubble_lo", "d"):
        print(f"  {key:9s} mean {res[key].mean():8.1f}  quantiles 5/25/50/75/95 {q(res[key])}", flush=True)
    for wg in (0, 1):
        tu, iss = res[f"turn{wg}"], res[f"issue{wg}"]
        print(f"  wg{wg}: completion->ready mean {tu.mean():6.1f} q {q(tu)};  ready->issued mean {iss.mean():6.1f} q {q(iss)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
