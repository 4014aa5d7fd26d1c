"""The fusion tax of GEMM-ReduceScatter: the fused kernel at world W with every peer mapped onto
its own buffers (rawflux/bench/rs_local.py: the same kernel, the same stores and reads, no link,
no waiting) against rawflux.gemm's own pick on the same (m, n, k_local), in one process on one GPU.

    PYTHONPATH=. python benchmarks/fusion_tax.py [--worlds 2,4,8] [--ms 1024,2048,4096,8192] [--json PATH]

Bar: fused / gemm <= 1.03 at every point (printed per point; exit status 1 if any misses).
CUDA events, warm-up, median of --reps, the two interleaved call by call, inputs rotated over sets
larger than 4x L2. Writes benchmarks/results/fusion-tax.json (records: op, world, m, n, k, dtype,
partials, fused_ms, gemm_ms, ratio, tile, same_tile_gemm_ms: rawflux.gemm on the fused
kernel's tile and grid, gpu, commit, date).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import L2_BYTES, bench_many  # noqa: E402

# (name, n, k of the whole layer): the row-parallel GEMMs (GEMM-RS) of the paper's GPT-3 175B and Llama-3-70B
SHAPES = [("gpt3.attn_out", 12288, 12288), ("gpt3.mlp_down", 12288, 49152),
          ("llama70b.o_proj", 8192, 8192), ("llama70b.down_proj", 8192, 28672)]
BAR = 1.03


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--ms", default="1024,2048,4096,8192")
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--partials", default=None, help="default: the output's type; or fp32")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "fusion-tax.json"))
    args = ap.parse_args(argv)

    import cupy
    import torch

    import rawflux
    from rawflux.bench.rs_local import local_world
    from rawflux.bench.timing import git_commit
    from rawflux.runtime import DType

    dev = cupy.cuda.Device(0)
    gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    gpu = gpu.decode() if isinstance(gpu, bytes) else str(gpu)
    commit = (git_commit() or "unknown")[:12]
    bf16 = DType.BF16.np
    rows, worst = [], 0.0
    shapes = SHAPES if args.shapes == "all" else [s for s in SHAPES if s[0] in args.shapes.split(",")]
    for W in [int(x) for x in args.worlds.split(",")]:
        for name, n, k_all in shapes:
            k = k_all // W
            for m in [int(x) for x in args.ms.split(",")]:
                op = local_world(W, m, n, k, "bf16", partials=args.partials, tax=True)
                op.preset(m)
                set_bytes = (m * k + n * k) * 2
                nsets = max(2, min(16, 4 * L2_BYTES // set_bytes + 1))
                a = [torch.randn(m, k, device="cuda").to(torch.bfloat16) for _ in range(nsets)]
                b = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(nsets)]
                out = torch.empty(m // W, n, device="cuda", dtype=torch.bfloat16)
                full = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                s = torch.cuda.current_stream().cuda_stream

                def fused(i):
                    op(a[i], b[i], out=out, stream=s)

                def plain(i):
                    rawflux.gemm(a[i], b[i], out=full, stream=s)

                same_cfg = op.plan(m).cfg

                def same(i):  # the fused kernel's tile and grid, data-parallel, in the plain GEMM
                    rawflux.gemm(a[i], b[i], out=full, stream=s, config=same_cfg)

                t_f, t_g, t_s = bench_many([fused, plain, same], nsets, args.reps)
                torch.cuda.synchronize()
                if op.failed():
                    raise RuntimeError(f"fused kernel reported a device-side failure (state {op.failed()})")
                ratio = t_f / t_g
                worst = max(worst, ratio)
                tile = op.plan(m).cfg.tile.tag()
                print(f"fusion-tax W={W} {name} m={m} n={n} k={k}: fused {t_f * 1e3:8.1f} us  gemm {t_g * 1e3:8.1f} us  "
                      f"ratio {ratio:.3f} {'ok' if ratio <= BAR else 'OVER'}  tile {tile} (plain GEMM on it {t_s * 1e3:.1f} us)", flush=True)
                rows.append({"op": "gemm_rs", "world": W, "shape": name, "m": m, "n": n, "k": k, "dtype": "bf16",
                             "partials": args.partials or "bf16", "fused_ms": t_f, "gemm_ms": t_g, "ratio": ratio, "tile": tile, "same_tile_gemm_ms": t_s,
                             "gpu": gpu, "commit": commit, "date": datetime.date.today().isoformat()})
                del a, b, out, full, op
                torch.cuda.empty_cache()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"kind": "fusion-tax", "bar": BAR, "rows": rows}, indent=1) + "\n")
    over = sum(r["ratio"] > BAR for r in rows)
    print(f"fusion-tax summary: {len(rows) - over}/{len(rows)} points within {BAR}, worst {worst:.3f}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
