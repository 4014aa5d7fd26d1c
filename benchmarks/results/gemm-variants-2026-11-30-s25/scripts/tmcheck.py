import hashlib, os, torch
from rawflux import tune
from rawflux.ops import gemm as g
torch.manual_seed(1234)
digest = hashlib.sha1(); worst = 0.0
for tag in ("128x256x64s4c2x1w2", "128x320x64s4c2x1w2", "128x256x64s4c1w2"):
    t = tune.parse_tag(tag + "/k1/g8m/p0").tile
    for m, n, k in ((333, 1280, 512), (2048, 6400, 1536), (4096, 12288, 6144)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16); b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        g.gemm(a, b, out=out, config=tune.GemmConfig(t, 1, 8, False))
        digest.update(out.view(torch.int16).cpu().numpy().tobytes())
        ref = a.double() @ b.double().T
        err = ((out.double() - ref).norm() / ref.norm()).item(); worst = max(worst, err if err == err else 1.0)
print(f"{os.environ.get('LABEL')}: worst rel err {worst:.2e}, bits {digest.hexdigest()[:16]}", flush=True)
