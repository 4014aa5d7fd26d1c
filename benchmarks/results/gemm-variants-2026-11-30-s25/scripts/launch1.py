import sys, torch
from rawflux.ops import gemm as g
for m, n, k in ((4096, 12288, 6144), (1024, 8192, 8192), (333, 1280, 512)):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    with open("/tmp/launchlog.txt", "a") as f:
        f.write(f"### m={m} n={n} k={k} A={a.data_ptr():#x} B={b.data_ptr():#x} C={c.data_ptr():#x}\n")
    torch.matmul(a, b.T, out=c)
    torch.cuda.synchronize()
    g.gemm(a, b, out=c)
    torch.cuda.synchronize()
