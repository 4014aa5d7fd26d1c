import os, time, torch
from rawflux import tune
from rawflux.ops import gemm as g
torch.manual_seed(0)
for tag in os.environ.get("TAGS", "128x256x64s4c2x1w2/k1/g8m/p0").split(","):
    cfg = tune.parse_tag(tag)
    for m, n, k in ((333, 1280, 512), (2048, 6400, 1536)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        t0 = time.time()
        try:
            g.gemm(a, b, out=out, config=cfg)
            torch.cuda.synchronize()
        except Exception as e:
            print(tag, m, n, k, "FAIL after", round(time.time() - t0, 2), "s:", str(e)[:200], flush=True)
            raise SystemExit(1)
        ref = a.double() @ b.double().T
        print(tag, m, n, k, "err", ((out.double() - ref).norm() / ref.norm()).item(), round(time.time() - t0, 2), "s", flush=True)
