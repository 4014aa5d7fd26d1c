"""rawflux.gemm vs cuBLAS (torch.matmul and cupy.matmul) in one run.

    PYTHONPATH=. python benchmarks/gemm.py [--dtypes bf16,f16] [--ms 64,128,...] [--tune] [--sweep]
                                           [--precompile] [--json PATH]

CUDA events around each call, median of --reps (>= 30) after warm-up, fresh random inputs
(never zeros), rotated among enough input sets that the working set exceeds L2 (60 MB) several
times. A short GPU sleep before each timed batch lets the host queue the calls ahead of the GPU, so
the numbers are device time (host launch cost is reported separately). Prints a table with ratios
vs the faster cuBLAS and writes JSON (fields op, impl, m, n, k, dtype, ms, tflops, gpu, driver,
commit, date, config) to benchmarks/results/gemm.json (the current grid, which BENCHMARKS.md is
generated from: python benchmarks/report.py).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

SHAPES_NK = [(6144, 12288), (12288, 6144), (8192, 8192), (28672, 8192), (8192, 28672)]
MS = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
L2_BYTES = 60 << 20
CUBLAS = ("torch.matmul", "cupy.matmul")

Point = tuple[str, int, int, int]


def ratios(rows: list[dict], impl: str = "rawflux") -> dict[Point, tuple[float, str]]:
    """(dtype, m, n, k) -> (impl's TF/s over the faster cuBLAS's, impl's config) for one run."""
    best: dict[Point, float] = {}
    for r in rows:
        if r["impl"] in CUBLAS:
            key = (r["dtype"], r["m"], r["n"], r["k"])
            best[key] = max(best.get(key, 0.0), r["tflops"])
    out = {}
    for r in rows:
        key = (r["dtype"], r["m"], r["n"], r["k"])
        if r["impl"] == impl and best.get(key):
            out[key] = (r["tflops"] / best[key], r.get("config") or "")
    return out


def _commit() -> str:
    from rawflux.bench.timing import git_commit

    return git_commit() or "unknown"


def precompile(jobs: int = 16) -> None:
    """Compile every registered gemm variant on the host's cores before timing anything."""
    from concurrent.futures import ProcessPoolExecutor

    import rawflux.ops.gemm  # noqa: F401  (registers the variants)
    from rawflux.jit import variants

    vs = [v for v in variants() if v.relpath == "gemm.cu"]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(jobs) as ex:
        bad = [r for r in ex.map(_compile_one, vs) if r]
    print(f"precompiled {len(vs)} variants in {time.perf_counter() - t0:.1f}s; problems: {bad or 'none'}", flush=True)


def _compile_one(v) -> str:
    from rawflux.jit import compile_cubin, kernel_source

    r = compile_cubin(kernel_source(v.relpath), arch="sm_90a", name_expressions=(v.name_expr,), filename=v.relpath)
    res = r.resources.get(r.lowered[v.name_expr], {})
    if res.get("spill_stores") or res.get("stack"):
        return f"{v.name_expr}: {res}"
    return ""


def input_sets(m: int, n: int, k: int, elem_bytes: int = 2) -> int:
    """How many (A, B, C) input sets to rotate through so the working set is about three times L2
    (2 to 8 sets): consecutive calls then find no operand in L2."""
    return max(2, min(8, math.ceil(3 * L2_BYTES / (elem_bytes * (m * k + n * k + m * n)))))


def rotated_inputs(m: int, n: int, k: int):
    """input_sets(m, n, k) sets of random bf16 A (m, k), B (n, k) and an empty C (m, n) (torch,
    on the current device), for the single-shape probes in benchmarks/tools:
    (nsets, [A], [B], [C])."""
    import torch

    nsets = input_sets(m, n, k)
    a = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
    b = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
    c = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
    return nsets, a, b, c


def bench(fn, nsets: int, reps: int, warmup: int = 5) -> float:
    """Median milliseconds of fn(i) over reps calls, each between its own pair of events."""
    return bench_many([fn], nsets, reps, warmup)[0]


def bench_many(fns, nsets: int, reps: int, warmup: int = 5) -> list[float]:
    """Median milliseconds per function, the functions interleaved call by call (so clock and
    temperature drift during the run hits every implementation alike)."""
    import torch

    for f in fns:
        for i in range(warmup):
            f(i % nsets)
    torch.cuda.synchronize()
    ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)] for _ in fns]
    torch.cuda._sleep(40_000_000)  # ~20 ms of GPU time: the host queues all the calls meanwhile
    for r in range(reps):
        for j, f in enumerate(fns):
            ev[j][r][0].record()
            f((r + j) % nsets)  # neighbours never share an input set (no L2 carry-over)
            ev[j][r][1].record()
    torch.cuda.synchronize()
    return [statistics.median(s.elapsed_time(e) for s, e in evs) for evs in ev]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--shapes", default=None, help="n:k,n:k,... (default: the five TP shapes)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--tune", action="store_true", help="also run the measured tuner per shape and time its pick")
    ap.add_argument("--sweep", action="store_true", help="time every compiled tile shape (and split-K options) per shape")
    ap.add_argument("--tiles", default="", help="tile tags (e.g. 128x320x64s4c2x1w2) also timed at every point, split-K off, "
                    "raster as the heuristic picks it; rows 'rawflux[<tile>]'")
    ap.add_argument("--configs", default="", help="full config tags (e.g. 128x128x64s7c2x1w2/k2/g8m/p0, as GemmConfig.tag() "
                    "writes them) also timed at every point; rows 'rawflux{<tag>}'")
    ap.add_argument("--tails", default="", help="pieces per tile (e.g. 2,3,4) of the split tail also timed at every point where it "
                    "cuts tiles: the heuristic's pick with GemmConfig.tail (its tile, or the 128x256 pair where the pick's tile has "
                    "no stream-K); rows 'rawflux<tN>'")
    ap.add_argument("--bands", action="store_true", help="also time the pick as banded stream-K (band = its raster group's "
                    "column height; the 128x256 pair where the pick has no stream-K) where that cuts tiles")
    ap.add_argument("--narrow", action="store_true", help="also time the 128x256 pair with narrow columns (tune.narrow_config) "
                    "where a plan beats its data-parallel grid; rows 'rawflux<narrow>'")
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile-host", action="store_true", help="cProfile 2000 small rawflux.gemm calls")
    args = ap.parse_args(argv)

    if args.precompile:
        precompile()

    import cupy
    import torch

    from rawflux import engine, env, tune
    from rawflux.jit import get_kernel
    from rawflux.ops import gemm as g
    from rawflux.runtime import DType

    dev = torch.cuda.current_device()
    gpu = torch.cuda.get_device_name(dev)
    drv = cupy.cuda.runtime.driverGetVersion()
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                text=True).stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001
        driver = str(drv)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    commit = _commit()
    info = tune.device_info(dev)
    print(f"{gpu}, driver {driver}, {info.sms} SMs, commit {commit}, tune mode {env.tune_mode()}", flush=True)

    extra_tiles = [tune.parse_tag(t + "/k1/g8m/p0").tile for t in args.tiles.split(",") if t]
    extra_cfgs = [tune.parse_tag(t) for t in args.configs.split(",") if t]
    tails = [int(x) for x in args.tails.split(",") if x]
    shapes = SHAPES_NK if not args.shapes else [tuple(int(x) for x in s.split(":")) for s in args.shapes.split(",")]
    ms = [int(x) for x in args.ms.split(",")]
    rows, sweep_rows = [], []

    def record(impl, m, n, k, dt, ms_, cfg=None):
        tf = 2.0 * m * n * k / (ms_ * 1e-3) / 1e12
        rows.append({"op": "gemm", "impl": impl, "m": m, "n": n, "k": k, "dtype": dt, "ms": ms_, "tflops": tf, "gpu": gpu,
                     "driver": driver, "commit": commit, "date": date, "config": cfg})
        return tf

    # Cluster residency: a persistent grid of clusters only helps if every cluster is resident at once.
    from cuda.bindings import driver as cdrv

    for t in tune.TILES:
        if t.cluster_size < 2:
            continue
        epi = engine.plain_epilogue(DType.BF16)
        smem = engine.launch_smem_bytes(t, epi, DType.BF16)
        kern = get_kernel("gemm.cu", engine.kernel_name(t, DType.BF16, DType.BF16, "nk", sched=engine.PLAIN_SCHED, epilogue=epi), device_id=dev,
                            arch="sm_90a")
        kern.set_max_dynamic_smem(smem)
        lc = cdrv.CUlaunchConfig()
        lc.gridDimX, lc.gridDimY, lc.gridDimZ = info.sms, 1, 1
        lc.blockDimX, lc.blockDimY, lc.blockDimZ = t.threads, 1, 1
        lc.sharedMemBytes = smem
        at = cdrv.CUlaunchAttribute()
        at.id = cdrv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        at.value.clusterDim.x, at.value.clusterDim.y, at.value.clusterDim.z = t.cluster_size, 1, 1
        lc.attrs = [at]
        lc.numAttrs = 1
        err, nclu = cdrv.cuOccupancyMaxActiveClusters(cdrv.CUfunction(kern.handle), lc)
        print(f"max active clusters for {t.tag()}: {nclu} ({err.name}); persistent grid uses {info.sms // t.cluster_size}", flush=True)

    # Host launch cost (no sync): what a tiny problem costs per call on the CPU side.
    a0 = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    w0 = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    o0 = torch.empty(64, 256, device="cuda", dtype=torch.bfloat16)
    for f, label in ((lambda: g.gemm(a0, w0, out=o0), "rawflux.gemm"), (lambda: torch.matmul(a0, w0.T, out=o0), "torch.matmul")):
        for _ in range(20):
            f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            f()
        host_us = (time.perf_counter() - t0) / 200 * 1e6
        torch.cuda.synchronize()
        print(f"host cost per call, {label}: {host_us:.1f} us", flush=True)

    if args.profile_host:
        import cProfile
        import pstats

        ca, cw, co = cupy.from_dlpack(a0), cupy.from_dlpack(w0), cupy.from_dlpack(o0)
        for label, f in (("torch", lambda: g.gemm(a0, w0, out=o0)), ("cupy", lambda: g.gemm(ca, cw, out=co))):
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(2000):
                f()
            pr.disable()
            torch.cuda.synchronize()
            print(f"--- host profile, {label} inputs")
            pstats.Stats(pr).sort_stats("tottime").print_stats(14)

    for dt in args.dtypes.split(","):
        tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dt]
        rdt = {"bf16": DType.BF16, "f16": DType.F16}[dt]
        for n, k in shapes:
            for m in ms:
                nsets = input_sets(m, n, k)
                sets = []
                for _ in range(nsets):
                    a = torch.randn(m, k, device="cuda", dtype=tdt)
                    w = torch.randn(n, k, device="cuda", dtype=tdt)
                    o = torch.empty(m, n, device="cuda", dtype=tdt)
                    sets.append((a, w, o, cupy.from_dlpack(a), cupy.from_dlpack(w), cupy.from_dlpack(o)))
                cfg = engine.pick_config(m, n, k, rdt, "nk", rdt, dev)
                best = None
                if args.tune:
                    a, w = sets[0][0], sets[0][1]

                    def launch_with(c, a=a, w=w, o=sets[0][2]):
                        g.gemm(a, w, out=o, config=c)

                    best, _ = tune.tune(m, n, k, "nk", info, g._timer(launch_with, torch.cuda.current_stream().cuda_stream, dev))
                fns = [
                    lambda i: torch.matmul(sets[i][0], sets[i][1].T, out=sets[i][2]),
                    lambda i: cupy.matmul(sets[i][3], sets[i][4].T, out=sets[i][5]),
                    lambda i: g.gemm(sets[i][0], sets[i][1], out=sets[i][2], config=cfg),
                ]
                if best is not None:
                    fns.append(lambda i: g.gemm(sets[i][0], sets[i][1], out=sets[i][2], config=best))
                # (row label, config): --tiles as the heuristic would raster them, then --configs as given
                extra = [(f"[{tt.tag()}]", tune.GemmConfig(tt, tune.DP, 8, -(-m // tt.bm) > -(-n // tt.bn))) for tt in extra_tiles]
                extra += [(f"{{{c.tag()}}}", c) for c in extra_cfgs]
                for s in tails:  # the pick with a split tail, where it cuts tiles
                    base = cfg if cfg.tile.stream_k_ok else replace(cfg, tile=tune.parse_tag("128x256x64s4c2x1w2/k1/g8m/p0").tile)
                    tc = replace(base, decomp=tune.Decomp("tail", s))
                    if tune.sk_plan(m, n, k, tc, info.sms).tail:
                        extra.append((f"<t{s}>", tc))
                if args.bands:
                    base = cfg if cfg.tile.stream_k_ok else replace(cfg, tile=tune.parse_tag("128x256x64s4c2x1w2/k1/g8m/p0").tile)
                    band = tune.band_height(m, n, base)
                    bc = replace(base, decomp=tune.Decomp("band", band)) if band >= 2 else None
                    if bc is not None and tune.sk_plan(m, n, k, bc, info.sms).band:
                        extra.append(("<band>", bc))
                if args.narrow:
                    nc = tune.narrow_config(m, n, tune.NARROW_TILES[0], info)
                    if nc is not None and dt in ("bf16", "f16"):
                        extra.append(("<narrow>", nc))
                skipped = []
                for label, c in list(extra):  # a config this point cannot run (the host says why, before any launch)
                    try:
                        g.gemm(sets[0][0], sets[0][1], out=sets[0][2], config=c)
                    except ValueError as e:
                        extra.remove((label, c))
                        skipped.append(f"  {label} n/a ({e})")
                for _, c in extra:
                    fns.append(lambda i, c=c: g.gemm(sets[i][0], sets[i][1], out=sets[i][2], config=c))
                times = bench_many(fns, nsets, args.reps)
                tf_t = record("torch.matmul", m, n, k, dt, times[0])
                tf_c = record("cupy.matmul", m, n, k, dt, times[1])
                tf_r = record("rawflux", m, n, k, dt, times[2], cfg.tag())
                line = f"{dt} m={m:5d} n={n:5d} k={k:5d}  torch {tf_t:6.1f}  cupy {tf_c:6.1f}  rawflux {tf_r:6.1f} TF/s  ratio {tf_r / max(tf_t, tf_c):.3f}  [{cfg.tag()}]"
                if best is not None:
                    tf_b = record("rawflux-tuned", m, n, k, dt, times[3], best.tag())
                    line += f"  tuned {tf_b:6.1f} ({tf_b / max(tf_t, tf_c):.3f}) [{best.tag()}]"
                for (label, c), t_x in zip(extra, times[len(times) - len(extra):]):
                    tf_x = record(f"rawflux{label}", m, n, k, dt, t_x, c.tag())
                    line += f"  {label} {tf_x:6.1f} ({tf_x / max(tf_t, tf_c):.3f})"
                print(line + "".join(skipped), flush=True)
                if args.sweep and dt == "bf16":
                    seen = set()
                    cands = [c for c in tune.candidates(m, n, k, "nk", info)]
                    cands.sort(key=lambda c: tune.estimate_us(m, n, k, c, info))
                    picks = [c for c in cands if c.splits == 1] + [c for c in cands if c.splits > 1][:12]
                    for c in picks:
                        if c in seen:
                            continue
                        seen.add(c)
                        t_c = bench(lambda i, c=c: g.gemm(sets[i][0], sets[i][1], out=sets[i][2], config=c), nsets, 10, warmup=2)
                        sweep_rows.append({"m": m, "n": n, "k": k, "config": c.tag(), "ms": t_c,
                                           "tflops": 2.0 * m * n * k / (t_c * 1e-3) / 1e12,
                                           "model_us": tune.estimate_us(m, n, k, c, info)})
                sets = None
                torch.cuda.empty_cache()

    # Summary: ratio of rawflux to the faster cuBLAS per point, and the bar.
    print("\nsummary (ratio = rawflux TF/s / faster cuBLAS TF/s)")
    for dt in args.dtypes.split(","):
        for impl in (("rawflux", "rawflux-tuned") + tuple(f"rawflux[{t.tag()}]" for t in extra_tiles)
                     + tuple(f"rawflux{{{c.tag()}}}" for c in extra_cfgs) + tuple(f"rawflux<t{s}>" for s in tails) + ("rawflux<band>",)):
            big, small = [], []
            for (rdt, m, _, _), (ratio, _) in ratios(rows, impl).items():
                if rdt == dt:
                    (big if m >= 1024 else small).append(ratio)
            if big or small:
                print(f"{dt} {impl}: m>=1024 min {min(big, default=float('nan')):.3f} median {statistics.median(big) if big else float('nan'):.3f}"
                      f" | m<=512 min {min(small, default=float('nan')):.3f} median {statistics.median(small) if small else float('nan'):.3f}")

    path = Path(args.json) if args.json else Path(__file__).resolve().parent / "results" / "gemm.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rows": rows, "sweep": sweep_rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
