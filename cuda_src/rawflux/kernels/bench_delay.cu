// A kernel that only waits, for the benchmark harness: enqueued just before a timed region, it
// holds the stream long enough for the host to queue every launch of that region, so the events
// around it time the GPU's work and not the host's launch cost (short ops such as a barrier are
// otherwise launch-bound). One thread; the wait is bounded by its argument.
#include "rawflux/ptx/types.cuh"

namespace rawflux {

RAWFLUX_DEVICE u64 bench_globaltimer_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void bench_delay_kernel(u64 wait_ns) {
  const u64 start = bench_globaltimer_ns();
  while (bench_globaltimer_ns() - start < wait_ns) {
    __nanosleep(1000);  // sleep between polls: leaves the SM's issue slots to co-resident kernels
  }
}

}  // namespace rawflux
