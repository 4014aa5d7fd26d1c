"""How fast SMs write into a peer GPU's memory, by path: the question behind GEMM-ReduceScatter's
epilogue (each finished tile goes to its owner's buffer).

One process, two GPUs with peer access (python benchmarks/tools/p2p_store.py; needs >= 2 GPUs):
  regs   every thread stores 16-byte vectors from registers (st.global.v4), as GEMM-RS's fp32 partials do
  bulk   one thread per CTA copies a shared-memory buffer out with 1-D bulk copies
         (cp.async.bulk.global.shared::cta), the TMA engine draining it while the SM goes on
to the local GPU's memory and to the peer's, with 1 .. all SMs writing. Each CTA writes
`--mib-per-cta` MiB in total. CUDA events, warm-up, median of --iters. Prints GB/s.
"""
from __future__ import annotations

import argparse
import json
import statistics

KERNELS = r"""
typedef unsigned long long u64;
typedef unsigned int u32;

extern "C" __global__ void __launch_bounds__(256) store_regs(char* dst, u64 bytes_per_cta) {
  // Each CTA writes its own contiguous range, 4 KiB per loop step (256 threads x 16 B).
  char* base = dst + (u64)blockIdx.x * bytes_per_cta;
  const float v = (float)threadIdx.x;
  for (u64 off = (u64)threadIdx.x * 16; off < bytes_per_cta; off += 256 * 16) {
    asm volatile("st.global.v4.f32 [%0], {%1, %1, %1, %1};\n" ::"l"(base + off), "f"(v) : "memory");
  }
}

// One thread issues bulk copies of `chunk` bytes from a 64 KiB shared buffer, keeping up to
// `depth` groups in flight; the shared buffer is only read, so no waits for reuse are needed
// beyond the in-flight bound.
extern "C" __global__ void __launch_bounds__(128) store_bulk(char* dst, u64 bytes_per_cta, u32 chunk, u32 depth) {
  extern __shared__ __align__(128) char smem[];
  for (u32 i = threadIdx.x; i < 65536 / 4; i += blockDim.x) reinterpret_cast<float*>(smem)[i] = (float)i;
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic smem writes before the bulk reads
  __syncthreads();
  if (threadIdx.x != 0) return;
  char* base = dst + (u64)blockIdx.x * bytes_per_cta;
  const u32 src = (u32)__cvta_generic_to_shared(smem);
  u32 n = 0;
  for (u64 off = 0; off < bytes_per_cta; off += chunk) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(base + off), "r"(src + (u32)(off % 65536)), "r"(chunk)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    if (++n >= depth) asm volatile("cp.async.bulk.wait_group.read 8;\n" ::: "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
"""


def main() -> int:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib-per-cta", type=float, default=4.0)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--ctas", default="1,8,32,66,132")
    ap.add_argument("--chunk", default="1024,4096,16384")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if cp.cuda.runtime.getDeviceCount() < 2:
        print("p2p_store: needs two GPUs")
        return 2
    cp.cuda.Device(0).use()
    cp.cuda.runtime.deviceEnablePeerAccess(1)
    sms = cp.cuda.Device(0).attributes["MultiProcessorCount"]
    mod = cp.RawModule(code=KERNELS, options=("-arch=sm_90a", "-std=c++17"))
    k_regs, k_bulk = mod.get_function("store_regs"), mod.get_function("store_bulk")
    k_bulk.max_dynamic_shared_size_bytes = 65536
    per_cta = int(args.mib_per_cta * 2**20)
    ctas = [min(int(c), sms) for c in args.ctas.split(",")]
    bufs = {"local": cp.cuda.alloc(per_cta * sms)}
    with cp.cuda.Device(1):
        bufs["peer"] = cp.cuda.alloc(per_cta * sms)
    rows = []

    def timed(launch):
        launch()
        cp.cuda.Device(0).synchronize()
        ts = []
        for _ in range(args.iters):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            launch()
            b.record()
            b.synchronize()
            ts.append(cp.cuda.get_elapsed_time(a, b))
        return statistics.median(ts)

    for where, buf in bufs.items():
        for n in ctas:
            ms = timed(lambda: k_regs((n,), (256,), (buf.ptr, cp.uint64(per_cta))))
            rows.append({"path": "regs", "dst": where, "ctas": n, "chunk": 16, "gbps": n * per_cta / ms / 1e6})
            for chunk in (int(c) for c in args.chunk.split(",")):
                ms = timed(lambda: k_bulk((n,), (128,), (buf.ptr, cp.uint64(per_cta), cp.uint32(chunk), cp.uint32(16)), shared_mem=65536))
                rows.append({"path": "bulk", "dst": where, "ctas": n, "chunk": chunk, "gbps": n * per_cta / ms / 1e6})
    for r in rows:
        print(f"p2p_store {r['path']:5s} -> {r['dst']:5s} ctas={r['ctas']:4d} chunk={r['chunk']:6d} B: {r['gbps']:8.1f} GB/s "
              f"({r['gbps'] / r['ctas']:6.1f} per CTA)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sms": sms, "mib_per_cta": args.mib_per_cta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
