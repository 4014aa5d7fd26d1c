// The link emulator (rawflux/bench/ag_local.py): on one GPU, the fused AllGather-GEMM's peers are
// replaced by a single thread that releases each ready flag (a chunk's, or a k-slab's of a chunk)
// at the time a link of a given bandwidth would have delivered its bytes. The bytes are in place
// before the call, so the GEMM waits as long as a real link would make it wait, without the
// link's traffic.
//
// Launched on the GEMM's stream just before it, with the GEMM as its programmatic dependent: the
// GEMM starts once this one CTA runs, so the waits never spin on a producer that is not resident.
#include "rawflux/ptx/sync.cuh"

namespace rawflux {

struct LinkEmuArgs {
  u64 ready;      // u32 ready[kMaxWorld][kAgMaxSlabs]: the flags AgWait acquires (fused/ag_gemm.cuh)
  u64 epoch;      // const u32*: this call's epoch, written by a kernel earlier on the stream
  u64 due_ns;     // const u64[count]: when flag i is released, ns after this kernel starts
  u64 flag;       // const i32[count]: the index into ready (ag_ready_index) released i-th
  i32 count;
  i32 pad;
};

// One CTA of 32 threads; thread 0 does the work. Every wait is bounded by the last due time.
__global__ void __launch_bounds__(32) link_emu_kernel(const LinkEmuArgs a) {
  griddep_launch_dependents();  // the GEMM may start: this CTA is resident
  if (threadIdx.x != 0) return;
  const u64 t0 = globaltimer_ns();
  const u32 epoch = *reinterpret_cast<const volatile u32*>(a.epoch);
  const u64* due = reinterpret_cast<const u64*>(a.due_ns);
  const i32* flag = reinterpret_cast<const i32*>(a.flag);
  u32* ready = reinterpret_cast<u32*>(a.ready);
  for (i32 i = 0; i < a.count; ++i) {
    while (globaltimer_ns() - t0 < due[i]) {
    }
    // relaxed (sys), not a release: the bytes were in place before the call (stream order), so
    // there is nothing to order, and a release's system-scope fence per flag would pace the
    // releases itself (56 flags at W = 8 with 8 slabs); the GEMM still acquires it
    st_relaxed_sys_u32(ready + flag[i], epoch);
  }
}

}  // namespace rawflux
