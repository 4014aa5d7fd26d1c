"""A/B in one process: the plain GEMM's data-parallel configs launched with StreamKSched (as
rawflux.gemm does since 67d2d1c) vs TileSched (the scheduler without the stream-K branch, as the
plain GEMM ran before), same tile config, interleaved with cuBLAS."""
import sys, statistics, math
sys.path.insert(0, "benchmarks")  # run from the repo root
import torch
from gemm import bench_many
from rawflux.ops import gemm as g
from rawflux.runtime import DType
dev = torch.cuda.current_device()
pts = [(m, n, k) for m in (2048, 8192) for n, k in [(6144, 12288), (12288, 6144), (8192, 8192), (28672, 8192), (8192, 28672)]]
pts += [(256, 8192, 8192), (512, 8192, 8192), (1024, 6144, 12288)]
rows = []
for m, n, k in pts:
    nsets = max(2, min(8, math.ceil(3 * (60 << 20) / (2 * (m * k + n * k + m * n)))))
    sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda", dtype=torch.bfloat16),
             torch.empty(m, n, device="cuda", dtype=torch.bfloat16)) for _ in range(nsets)]
    cfg = g.pick_config(m, n, k, DType.BF16, "nk", DType.BF16, dev)
    epi = g.plain_epilogue(DType.BF16)
    s = torch.cuda.current_stream().cuda_stream
    def run(i, sched):
        a, w, o = sets[i]
        g.launch_gemm(cfg, a_ptr=a.data_ptr(), b_ptr=w.data_ptr(), m=m, n=n, k=k, dtype=DType.BF16, b_layout="nk", out_dtype=DType.BF16,
                      epilogue_params=g.epilogue_params(epi, o.data_ptr(), m, n, n, DType.BF16), stream=s, device_id=dev, sched=sched, epilogue=epi)
    # both schedulers give the same bits
    run(0, g.PLAIN_SCHED); x = sets[0][2].clone(); run(0, g.FUSED_SCHED); torch.cuda.synchronize()
    same = bool(torch.equal(x, sets[0][2]))
    t = bench_many([lambda i: torch.matmul(sets[i][0], sets[i][1].T, out=sets[i][2]),
                    lambda i: run(i, g.PLAIN_SCHED), lambda i: run(i, g.FUSED_SCHED)], nsets, 30)
    rows.append((m, n, k, t[0] / t[1], t[0] / t[2], same, cfg.tag()))
    print(f"m={m:5d} n={n:5d} k={k:5d} StreamKSched {t[0]/t[1]:.3f} TileSched {t[0]/t[2]:.3f} bitwise-same {same} [{cfg.tag()}]", flush=True)
    sets = None; torch.cuda.empty_cache()
print("median ratio to torch: StreamKSched %.3f TileSched %.3f" % (statistics.median(r[3] for r in rows), statistics.median(r[4] for r in rows)))
print("mean StreamKSched/TileSched speed: %.4f" % statistics.mean(r[3] / r[4] for r in rows))
