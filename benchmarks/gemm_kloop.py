"""The engine's k loop in SM cycles per k block, per compile-time variant, against the tensor pipe's peak.

    PYTHONPATH=. python benchmarks/gemm_kloop.py [--variants "base|;bare|RAWFLUX_PROBE=3;noring|RAWFLUX_PROBE=67"]
                                                 [--tile 128x256x64s4c2x1w2] [--ks 16384,65536] [--reps 4]

One tile per CTA (m x n chosen so the grid has exactly one tile per SM: no tile changes, no tail),
each variant built as the trace build without its per-k-block wait sums (benchmarks/gemm_trace.py
--no-block-waits, RAWFLUX_TRACE_BLOCK_WAITS=0) in its own process, at two or more k. The slope of
the per-tile loop cycles against the number of k blocks is the cost of one k block; the per-tile
constants cancel. The peak is the tile's MMA work at 4096 dense FLOP per cycle per SM (1024 cycles
for 128x256x64). Session 19 (docs/gemm-notes.md) measured 1039 for the engine and 1024 for
benchmarks/wgmma_peak.py; RAWFLUX_PROBE's ring bits (config.cuh) split the difference.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOP = re.compile(r"per tile \(median CTA, SM cycles\): loop (\d+)")  # gemm_trace.py's per-case line


def one_tile_per_sm(bm: int, bn: int, cluster_m: int, sms: int) -> tuple[int, int]:
    """(m, n) with exactly `sms` tiles of bm x bn, the tile rows a multiple of the cluster's m."""
    best = None
    for rows in range(cluster_m, sms + 1, cluster_m):
        if sms % rows == 0:
            cols = sms // rows
            score = abs(rows * bm - cols * bn)  # the squarest
            if best is None or score < best[0]:
                best = (score, rows * bm, cols * bn)
    if best is None:
        raise ValueError(f"{sms} SMs cannot hold one {bm}x{bn} tile each with tile rows in multiples of {cluster_m}")
    return best[1], best[2]


def slope(ks_blocks: list[int], cycles: list[float]) -> float:
    """Least-squares slope of cycles against k blocks."""
    n = len(ks_blocks)
    mx, my = sum(ks_blocks) / n, sum(cycles) / n
    return sum((x - mx) * (y - my) for x, y in zip(ks_blocks, cycles)) / sum((x - mx) ** 2 for x in ks_blocks)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="base|;bare|RAWFLUX_PROBE=3;noring|RAWFLUX_PROBE=67",
                    help="label|RAWFLUX_NVRTC_DEFINES;... (each in its own process)")
    ap.add_argument("--tile", default="128x256x64s4c2x1w2", help="tile tag (tune.TILES)")
    ap.add_argument("--ks", default="16384,65536")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--sms", type=int, default=0, help="SM count (default: the device's)")
    ap.add_argument("--jobs", type=int, default=8,
                    help="variants compiled at once before the timed runs (each a short run at the smallest k; 1: no warm-up pass)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from rawflux import tune

    cfg = tune.parse_tag(args.tile + "/k1/g8m/p0")
    t = cfg.tile
    sms = args.sms
    if not sms:
        import cupy

        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    m, n = one_tile_per_sm(t.bm, t.bn, t.cluster_m, sms)
    ks = [int(x) for x in args.ks.split(",")]
    if len(ks) < 2:
        raise SystemExit("--ks needs two k or more")
    bk = getattr(t, "bk", 64)
    peak = t.bm * t.bn * bk * 2 / 4096
    cases = ";".join(f"{m},{n},{k},{cfg.tag()}" for k in ks)
    print(f"{sms} tiles of {t.bm}x{t.bn} ({m} x {n}), k {args.ks}; peak {peak:.0f} cycles per k block", flush=True)
    variants = [v.partition("|")[::2] for v in args.variants.split(";")]
    trace = [sys.executable, str(ROOT / "benchmarks" / "gemm_trace.py"), "--no-block-waits"]

    def env_of(defs: str) -> dict:
        return dict(os.environ, RAWFLUX_NVRTC_DEFINES=defs.strip(), PYTHONPATH=str(ROOT))

    if args.jobs > 1 and len(variants) > 1:
        # Compile pass: every variant's kernel into the JIT cache, args.jobs processes at a time (NVRTC
        # takes ~15 s a variant; the timed runs below then find their cubins cached). Their GPU runs
        # overlap, which does not matter here: nothing is timed.
        warm = f"{m},{n},{ks[0]},{cfg.tag()}"
        pending = list(variants)
        running = []
        while pending or running:
            while pending and len(running) < args.jobs:
                _, defs = pending.pop(0)
                running.append(subprocess.Popen(trace + ["--cases", warm, "--reps", "1"], stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL, env=env_of(defs)))
            proc = running.pop(0)
            try:
                proc.wait(timeout=900)
            except subprocess.TimeoutExpired:  # its timed run below reports the variant as failed
                proc.kill()
                proc.wait()
    print(f"{'variant':16s} {'cycles/k block':>14s} {'vs peak':>8s}  defines")
    for label, defs in variants:
        r = subprocess.run(trace + ["--cases", cases, "--reps", str(args.reps)], capture_output=True, text=True, env=env_of(defs),
                           timeout=600)
        loops = [int(x.group(1)) for x in map(LOOP.search, r.stdout.splitlines()) if x]
        if r.returncode != 0 or len(loops) != len(ks):
            print(f"{label:16s} {'failed':>14s}  {defs}\n{r.stdout[-800:]}{r.stderr[-800:]}", flush=True)
            continue
        s = slope([k // bk for k in ks], [float(c) for c in loops])
        print(f"{label:16s} {s:14.1f} {s / peak:8.4f}  {defs}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
