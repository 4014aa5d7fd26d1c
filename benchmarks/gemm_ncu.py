"""One rawflux.gemm launch for Nsight Compute (ncu -k regex:gemm_kernel --launch-skip 3 --launch-count 1).

    PYTHONPATH=. ncu --clock-control none -k regex:gemm_kernel --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats python3 benchmarks/gemm_ncu.py 8192 8192 8192
"""
import sys

import torch

from rawflux.ops import gemm as g

m, n, k = (int(x) for x in sys.argv[1:4]) if len(sys.argv) >= 4 else (8192, 8192, 8192)
a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
o = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    g.gemm(a, w, out=o)
torch.cuda.synchronize()
print("config", g.pick_config(m, n, k, g.DType.BF16, "nk", g.DType.BF16, 0).tag())
