"""A few rawflux.gemm calls for compute-sanitizer (launch/gpu_suite.sh sanitize): every tile whose
TmaStore epilogue stages C in shared memory, ragged m and n, few CTAs so the staging buffers are
reused across tiles; then split-K and stream-K (the fix-up's workspace and counters) on every tile
that compiles them; then the k-split clusters (tune.KSPLIT_TILES: CTA 1's fragment handed to CTA 0
through distributed shared memory). Checks each result against the f32 (register-path) result
rounded, bitwise. Exit status 0 only if every call matched. `gemm_sanitize.py c1k2` runs only the
tiles whose tag contains c1k2."""
from __future__ import annotations

import sys
from dataclasses import replace

import cupy

from rawflux import tune
from rawflux.ops import gemm as g


def main(only: str = "") -> int:
    """only: run just the tiles whose tag contains it (e.g. "c1k2" for the k-split clusters)."""
    bad = 0
    rs = cupy.random.RandomState()
    for t in (*tune.TILES, *tune.KSPLIT_TILES):
        if not t.supports("nk") or only not in t.tag():
            continue
        m, n, k = 3 * t.bm + 19, 2 * t.bn + 40, 192
        a = rs.standard_normal((m, k), dtype=cupy.float32).astype(cupy.float16)
        w = rs.standard_normal((n, k), dtype=cupy.float32).astype(cupy.float16)
        if t.cluster_k > 1:  # one tile per cluster: a grid of every tile's pair
            cfgs = [tune.GemmConfig(t)]
        else:
            cfgs = [tune.GemmConfig(t, ctas=2 * t.cluster_size)]
        if t.cluster_k == 1 and t.stream_k_ok and t.bn in (128, 256) and t.bm == 128:  # a cluster tile and a plain one: the sanitizer is slow
            cfgs += [tune.GemmConfig(t, tune.Decomp.split_k(3)), tune.GemmConfig(t, tune.STREAM_K),
                     tune.GemmConfig(t, tune.STREAM_K, ctas=5 * t.cluster_size),
                     tune.GemmConfig(t, tune.Decomp("tail", 3), ctas=5 * t.cluster_size),  # a split tail after whole waves
                     tune.GemmConfig(t, tune.Decomp("band", 2), ctas=5 * t.cluster_size)]  # bands of 2 and a leftover cluster
        for cfg in cfgs:
            out = cupy.full((m, n), cupy.nan, dtype=cupy.float16)
            g.gemm(a, w, out=out, config=cfg)
            c32 = g.gemm(a, w, out_dtype="f32", config=cfg)
            diff = int(cupy.count_nonzero(out.view(cupy.uint16) != c32.astype(cupy.float16).view(cupy.uint16)))
            print(f"gemm sanitize {cfg.tag()}: {'ok' if diff == 0 else f'{diff} outputs differ'}", flush=True)
            bad += diff != 0
    # Narrow columns (16-bit C only): against the data-parallel pair on the same inputs, bit for bit.
    for t in tune.NARROW_TILES:
        if only not in t.tag():
            continue
        m, n, k = 600, 3000, 192
        a = rs.standard_normal((m, k), dtype=cupy.float32).astype(cupy.float16)
        w = rs.standard_normal((n, k), dtype=cupy.float32).astype(cupy.float16)
        base = tune.GemmConfig(t, ctas=10 * t.cluster_size)
        plan = tune.narrow_plan(m, n, base, cupy.cuda.Device().attributes["MultiProcessorCount"])
        cfg = replace(base, decomp=tune.Decomp("narrow", plan.width))
        out = g.gemm(a, w, out=cupy.full((m, n), cupy.nan, dtype=cupy.float16), config=cfg)
        ref = g.gemm(a, w, config=base)
        diff = int(cupy.count_nonzero(out.view(cupy.uint16) != ref.view(cupy.uint16)))
        print(f"gemm sanitize {cfg.tag()}: {'ok' if diff == 0 else f'{diff} outputs differ'}", flush=True)
        bad += diff != 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
