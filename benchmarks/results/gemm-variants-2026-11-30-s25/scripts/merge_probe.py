"""Session 25 probe: are equal TMA loads from several SMs merged before L2, and where (one GPC:
a cluster; anywhere: no cluster)? Each CTA's thread 0 loads `iters` boxes of 128 rows x 64 bf16
(16 KB) along k into shared memory; the CTAs load the same rows (shared) or their own (unique).
A cluster's CTAs all sit in one GPC and issue each box together (a cluster barrier before each).
Run under ncu: lts__t_requests_srcunit_tex_op_read per launch, in the order printed."""
import numpy as np
import cupy
from rawflux.jit import compile_cubin
from rawflux.jit.kernel import Kernel
from rawflux.ops.gemm import tensor_map
from rawflux.runtime import DType

SRC = r'''
#include "rawflux/ptx/tma.cuh"
#include "rawflux/ptx/mbarrier.cuh"
using namespace rawflux;
extern "C" __global__ void __launch_bounds__(128, 1) merge_probe(const __grid_constant__ TensorMap tmap, int iters, int unique_rows,
                                                                int sync_cluster, int mcast) {
  extern __shared__ __align__(1024) u8 sm_raw[];
  u8* sm = sm_raw + ((1024u - (ptx::smem_u32(sm_raw) & 1023u)) & 1023u);
  u64* bar = reinterpret_cast<u64*>(sm + 16384);
  if (threadIdx.x == 0) {
    ptx::mbar_init(bar, 1);
    ptx::fence_mbar_init();  // the init before the TMA's complete_tx on it (and the peer's multicast)
  }
  __syncthreads();
  if (mcast) ptx::cluster_sync();  // both CTAs' barriers initialized before either multicasts into them
  const u32 rank = mcast ? ptx::cluster_ctarank() : 0u;
  const int row0 = unique_rows ? (int)(mcast ? blockIdx.x / 2 : blockIdx.x) * 128 : 0;
  for (int it = 0; it < iters; ++it) {
    if (sync_cluster) ptx::cluster_sync();  // the cluster's CTAs issue box `it` together
    if (threadIdx.x == 0) {
      ptx::mbar_arrive_expect_tx(bar, 16384);
      if (mcast) {  // this CTA's 64 rows of the box, to both CTAs of the pair (the engine's B)
        ptx::tma_load_2d_multicast(sm + rank * 8192, &tmap, bar, it * 64, row0 + (int)rank * 64, (u16)3);
      } else {
        ptx::tma_load_2d(sm, &tmap, bar, it * 64, row0);
      }
    }
    ptx::mbar_wait(bar, (u32)(it & 1), 2000000000ll);
    __syncthreads();
    if (mcast) ptx::cluster_sync();  // the peer is done with box `it` before either multicasts box it + 1 over it
  }
}
'''
res = compile_cubin(SRC, arch="sm_90a", name_expressions=("merge_probe",), filename="merge_probe.cu")
k = Kernel(res, res.lowered["merge_probe"], 0)
iters, ctas = 256, 16
rows, cols = 128 * ctas, 64 * iters
a = cupy.ones((rows, cols), dtype=cupy.uint16)
tm = tensor_map(a.data.ptr, DType.BF16, rows, cols, cols, 128, 64)
tm64 = tensor_map(a.data.ptr, DType.BF16, rows, cols, cols, 64, 64)
smem = 16384 + 1024 + 64
from cuda.bindings import driver
driver.cuFuncSetAttribute(driver.CUfunction(k.handle), driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
runs = [("nocluster8 shared", 8, 1, 0, 0, 0), ("nocluster8 unique", 8, 1, 1, 0, 0),
        ("4 pairs multicast shared", 8, 2, 0, 0, 1), ("4 pairs multicast unique", 8, 2, 1, 0, 1),
        ("8 pairs multicast shared", 16, 2, 0, 0, 1), ("8 pairs multicast unique", 16, 2, 1, 0, 1)]
for label, grid, cl, uniq, sync, mc in runs:
    try:
        k.launch_ex((grid, 1, 1), (128, 1, 1), (tm64 if mc else tm, np.int32(iters), np.int32(uniq), np.int32(sync), np.int32(mc)),
                    smem=smem, cluster=(cl, 1, 1))
        cupy.cuda.Device(0).synchronize()
        print(f"launched: {label} (grid {grid}, cluster {cl}): {grid * iters} boxes of 16 KB = {grid * iters * 128} row requests of 128 B", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"FAILED: {label}: {e}", flush=True)
