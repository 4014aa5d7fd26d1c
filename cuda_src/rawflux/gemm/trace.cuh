// Development timeline of the GEMM engine (RAWFLUX_TRACE=1 through RAWFLUX_NVRTC_DEFINES; off by
// default, and then compiled out): per CTA, %globaltimer stamps (ns) of its start-up, first load,
// first data, main-loop end and exit, in the module global `rawflux_trace` (kTraceSlots words per
// CTA, CTAs past kTraceCtas not recorded). The per-tile stamps are overwritten by each tile, so they
// hold the CTA's last tile. The host reads it with benchmarks/gemm_trace.py.
#pragma once
#include "rawflux/gemm/config.cuh"
#include "rawflux/ptx/mbarrier.cuh"

namespace rawflux {

constexpr int kTraceCtas = 1024;
// Stamp slots, in timeline order.
enum : int {
  kTraceEntry = 0,          // thread 0 at kernel entry
  kTraceSynced = 1,         // thread 0 after the barrier that publishes the mbarrier inits
  kTraceProducerReady = 2,  // producer, before the first empty-stage wait of its last tile
  kTraceFirstLoad = 3,      // producer, after that tile's first TMA loads are issued
  kTraceConsumerReady = 4,  // consumer warpgroup 0, before the tile's first full-stage wait
  kTraceFirstData = 5,      // ... after it (the tile's first stage has landed)
  kTraceLoopEnd = 6,        // ... after the tile's last wgmma group
  kTraceExit = 7,           // ... after the epilogue's finish (its last store issued or drained)
  kTraceSlots = 8
};

}  // namespace rawflux

#if RAWFLUX_TRACE
extern "C" {
__device__ unsigned long long rawflux_trace[rawflux::kTraceCtas * rawflux::kTraceSlots];
}
#endif

namespace rawflux {

RAWFLUX_DEVICE void trace_stamp(int slot) {
#if RAWFLUX_TRACE
  if (blockIdx.x < (unsigned)kTraceCtas) rawflux_trace[blockIdx.x * kTraceSlots + slot] = ptx::globaltimer_ns();
#endif
}

}  // namespace rawflux
