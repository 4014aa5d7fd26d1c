"""Session 28: output bits of the split modes (bands, split tail, stream-K, split-K) for fixed seeded
inputs, f32 output (the fix-up's sums exactly), written as JSON {case: sha1}; run once per cuda_src
(RAWFLUX_CUDA_SRC) and compare: the band order and the in-place sums must not change a bit."""
import hashlib, json, sys, torch
from rawflux import tune
from rawflux.ops import gemm as g
P = "128x256x64s4c2x1w2"
cases = [
    (1024, 8192, 2048, P + "/b4/g8m/p0"), (1024, 8192, 8192, P + "/b4/g8m/p0"), (2048, 8192, 2048, P + "/b8/g8m/p0"),
    (1024, 12288, 1536, P + "/b4/g8m/p0"), (4096, 8192, 1024, P + "/b8/g8m/p0"), (4096, 8192, 1024, P + "/b8/g8n/p0"),
    (1000, 2056, 1000, P + "/b2/g2m/p20"), (3000, 5000, 777, P + "/b4/g4m/p0"),
    (2048, 8192, 1024, P + "/t3/g8m/p0"), (4096, 8192, 1024, P + "/t4/g8m/p0"), (1024, 8192, 1024, P + "/sk/g8m/p0"), (512, 2048, 8192, P + "/sk/g8m/p0"),
    (512, 4096, 4096, P + "/k3/g8m/p0"), (256, 4096, 8192, "128x128x64s7c1w2/k4/g8m/p0"),
]
out = {}
worst = 0.0
for i, (m, n, k, tag) in enumerate(cases):
    try:
        cfg = tune.parse_tag(tag)
    except Exception as e:  # a tag this tree does not parse
        print(tag, "skipped:", e); continue
    gen = torch.Generator(device="cuda").manual_seed(100 + i)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    d = hashlib.sha1()
    for f32 in (True, False):
        o = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32 if f32 else torch.bfloat16)
        for rep in range(3):
            g.gemm(a, b, out=o, config=cfg); torch.cuda.synchronize()
            d.update(o.view(torch.int32 if f32 else torch.int16).cpu().numpy().tobytes())
        if f32:
            ref = a.double() @ b.double().T
            e = ((o.double() - ref).norm() / ref.norm()).item(); worst = max(worst, e if e == e else 1.0)
    out[f"{m}x{n}x{k} {tag}"] = d.hexdigest()[:16]
    print(f"{m}x{n}x{k} {tag} {out[f'{m}x{n}x{k} {tag}']} err {e:.2e}", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
print("worst err", f"{worst:.2e}")
