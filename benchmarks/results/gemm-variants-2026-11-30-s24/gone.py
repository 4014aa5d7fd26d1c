"""Single-process plain GEMM at the failing GEMM-RS shape (m=144 n=680 k=136) and neighbours, wide pair tiles."""
import sys, time, torch
from rawflux import tune
from rawflux.ops import gemm as g
for tag in ("128x224x64s5c2x1w2", "128x256x64s4c2x1w2", "128x320x64s4c2x1w2", "128x256x64s4c1w2"):
    t = tune.parse_tag(tag + "/k1/g8m/p0").tile
    for m, n, k in ((144, 680, 136), (72, 680, 136), (288, 680, 136), (144, 1000, 256), (150, 680, 72), (144, 680, 8)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16); b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        t0 = time.time()
        g.gemm(a, b, out=out, config=tune.GemmConfig(t, 1, 8, False)); torch.cuda.synchronize()
        ref = a.double() @ b.double().T
        err = ((out.double() - ref).norm() / ref.norm()).item()
        print(f"{tag} {m}x{n}x{k}: err {err:.2e} {'PASS' if err < 1e-2 else 'FAIL'} {time.time()-t0:.2f}s", flush=True)
