"""rawflux.gemm and cuBLAS (torch.matmul) launches on the same inputs, for Nsight Compute.

Each implementation runs 3 warm-up calls and then one profiled call, rawflux first. The kernel
filter below keeps only the GEMM kernels (cuBLAS on Hopper names them nvjet_* or sm90_xmma_*):

    PYTHONPATH=. ncu --set full -k regex:'gemm_kernel|nvjet|xmma' --launch-skip 3 --launch-count 1 \
        python3 benchmarks/tools/gemm_ncu.py 8192 8192 8192 --impl rawflux
    (or benchmarks/tools/ncu_gemm.sh M N K, which profiles both and writes text reports)
"""
import argparse

import torch

from rawflux import engine
from rawflux.ops import gemm as g
from rawflux.runtime import DType

ap = argparse.ArgumentParser()
ap.add_argument("m", type=int, nargs="?", default=8192)
ap.add_argument("n", type=int, nargs="?", default=8192)
ap.add_argument("k", type=int, nargs="?", default=8192)
ap.add_argument("--impl", choices=("rawflux", "torch"), default="rawflux")
ap.add_argument("--config", default=None, help="a tune.GemmConfig tag, e.g. 128x256x64s4c2x1w2/k1/g8m/p0")
args = ap.parse_args()
m, n, k = args.m, args.n, args.k
a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
o = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
cfg = engine.pick_config(m, n, k, DType.BF16, "nk", DType.BF16, 0)
if args.config:
    from rawflux import tune

    cfg = tune.parse_tag(args.config)
if args.impl == "rawflux":
    call = lambda: g.gemm(a, w, out=o, config=cfg)  # noqa: E731
    print("config", cfg.tag(), flush=True)
else:
    call = lambda: torch.matmul(a, w.T, out=o)  # noqa: E731
for _ in range(4):
    call()
torch.cuda.synchronize()
