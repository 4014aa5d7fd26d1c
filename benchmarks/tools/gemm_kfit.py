"""Where rawflux.gemm's time goes against cuBLAS: per k block or per tile.

    PYTHONPATH=. python benchmarks/tools/gemm_kfit.py [--shapes 4096:8192,4096:12288] [--ks 1024,...,16384]
                                                      [--config 128x256x64s4c2x1w2/k1/g8m/p0]

At fixed m and n (so a fixed grid of tiles and waves), times rawflux.gemm with one config and
torch.matmul over several k, interleaved call by call (benchmarks/gemm.py's bench_many, inputs
rotated past L2; the best of three medians), and fits time per wave = k_blocks x (cost of a k
block) + (fixed cost of a tile) for each. The same tile as cuBLAS's (128x256, cluster 2x1 at
m >= 1024) makes the two slopes comparable: a gap in the slope is the main loop's, a gap in the
intercept the epilogue's and the tile change's. Long runs slow the clock (the H200 caps power at
700 W), which bends the line at large k; read the intercept at small k with that in mind.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/gemm.py

BK = 64


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares line y = slope * x + intercept through (x, y) points; (slope, intercept)."""
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        raise ValueError("fit needs at least two distinct x values")
    xm = statistics.mean(x for x, _ in points)
    ym = statistics.mean(y for _, y in points)
    slope = sum((x - xm) * (y - ym) for x, y in points) / sum((x - xm) ** 2 for x, _ in points)
    return slope, ym - slope * xm


def waves(m: int, n: int, bm: int, bn: int, sms: int) -> int:
    """Waves of a data-parallel persistent grid of one tile per SM."""
    return math.ceil(math.ceil(m / bm) * math.ceil(n / bn) / sms)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096:8192,4096:12288", help="m:n,...")
    ap.add_argument("--ks", default="1024,2048,4096,8192,16384")
    ap.add_argument("--config", default="128x256x64s4c2x1w2/k1/g8m/p0")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args(argv)

    import torch
    from gemm import bench_many, rotated_inputs

    from rawflux import tune
    from rawflux.ops import gemm as g

    cfg = tune.parse_tag(args.config)
    sms = tune.device_info(torch.cuda.current_device()).sms
    for shape in args.shapes.split(","):
        m, n = (int(x) for x in shape.split(":"))
        nw = waves(m, n, cfg.tile.bm, cfg.tile.bn, sms)
        per_wave = {"rawflux": [], "torch": []}
        for k in (int(x) for x in args.ks.split(",")):
            nsets, a, b, o = rotated_inputs(m, n, k)
            runs = [bench_many([lambda i: g.gemm(a[i], b[i], out=o[i], config=cfg),
                                lambda i: torch.matmul(a[i], b[i].T, out=o[i])], nsets, args.reps) for _ in range(3)]
            r, t = min(x[0] for x in runs), min(x[1] for x in runs)
            print(f"m={m} n={n} k={k:6d}: rawflux {r * 1e3:8.1f} us  torch.matmul {t * 1e3:8.1f} us  ratio {t / r:.3f}", flush=True)
            per_wave["rawflux"].append((k / BK, r * 1e3 / nw))
            per_wave["torch"].append((k / BK, t * 1e3 / nw))
            del a, b, o
        for impl, pts in per_wave.items():
            slope, icpt = fit(pts)
            print(f"{m}x{n} {impl}: {slope * 1e3:.1f} ns per k block per wave, {icpt:.2f} us fixed per wave ({nw} waves)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
