// Development timeline of the GEMM engine (RAWFLUX_TRACE=1 through RAWFLUX_NVRTC_DEFINES; off by
// default, and then compiled out): per CTA, %globaltimer stamps (ns) of its start-up, first load,
// first data, main-loop end and exit, and the time its producer waited for free stages and its
// first consumer warpgroup for full ones, in the module global `rawflux_trace` (kTraceSlots words
// per CTA, CTAs past kTraceCtas not recorded; the host zeroes it before a launch). The per-tile
// stamps are overwritten by each tile, so they hold the CTA's last tile; the waits add up over all
// tiles. The host reads it with benchmarks/gemm_trace.py.
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
  kTraceProducerWait = 8,   // ns the producer spent waiting for free stages, all tiles (a sum)
  kTraceConsumerWait = 9,   // ns consumer warpgroup 0 spent waiting for full stages, all tiles (a sum;
                            // 0 for the 128x320 tile, whose k loop has no register to spare)
  kTraceSm = 10,            // the SM the CTA ran on (%smid), to tell a slow SM from slow data
  kTraceLoopCycles = 11,    // SM cycles consumer warpgroup 0 spent from a tile's start to its loop end, all tiles
  kTraceEpiCycles = 12,     // ... from a tile's loop end to its epilogue's return, all tiles
  kTraceTiles = 13,         // tiles consumer warpgroup 0 ran (the two cycle sums: tiles whose
                            // fragment is at most 128 registers; 0 for wider ones, as slot 9)
  kTraceSlots = 14
};

// RAWFLUX_TRACE_PHASE (config.cuh): the stamps go to the module global rawflux_phase, indexed
// [cta][warpgroup][kind][k block] for CTAs < kPhaseCtas and k blocks < kPhaseBlocks of a tile.
constexpr int kPhaseCtas = 16, kPhaseBlocks = 2048;
enum : u32 { kPhaseReady = 0, kPhaseIssued = 1, kPhaseDone = 2 };

}  // namespace rawflux

#if RAWFLUX_TRACE
extern "C" {
__device__ unsigned long long rawflux_trace[rawflux::kTraceCtas * rawflux::kTraceSlots];
#if RAWFLUX_TRACE_PHASE
__device__ unsigned int rawflux_phase[rawflux::kPhaseCtas * 2 * 3 * rawflux::kPhaseBlocks];
#endif
}
#endif

namespace rawflux {

// True in thread `t` of the CTA; %tid.x read afresh (volatile), so no predicate computed earlier
// stays live across the consumers' loops (ptxas spilled the 128x320 tile's accumulators for one).
RAWFLUX_DEVICE bool trace_thread(u32 t) {
  u32 x = 0;
#if RAWFLUX_TRACE
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(x));
#endif
  return x == t;
}

// This CTA's index, read afresh at each use: a blockIdx.x that ptxas keeps live from the kernel's
// entry into both roles costs the 40-register producer a spill.
RAWFLUX_DEVICE u32 trace_cta() {
  u32 x = 0;
#if RAWFLUX_TRACE
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(x));
#endif
  return x;
}

RAWFLUX_DEVICE void trace_sm() {
#if RAWFLUX_TRACE
  u32 sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const u32 cta = trace_cta();
  if (cta < (unsigned)kTraceCtas) rawflux_trace[cta * kTraceSlots + kTraceSm] = sm;
#endif
}

RAWFLUX_DEVICE void trace_stamp(int slot) {
#if RAWFLUX_TRACE
  const u32 cta = trace_cta();
  if (cta < (unsigned)kTraceCtas) rawflux_trace[cta * kTraceSlots + slot] = ptx::globaltimer_ns();
#endif
}

// A 32-bit special register: the global timer's low bits (ns; enough for a wait, it wraps every
// 4.3 s, and one register in the consumers' main loop instead of two), or (kCycles) the SM's cycle
// counter (per-tile phases, finer than the global timer's steps).
template <bool kCycles>
RAWFLUX_DEVICE u32 trace_read32() {
  u32 t = 0;
#if RAWFLUX_TRACE
  if constexpr (kCycles) {
    asm volatile("mov.u32 %0, %%clock;" : "=r"(t));
  } else {
    asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(t));
  }
#endif
  return t;
}
RAWFLUX_DEVICE u32 trace_now32() { return trace_read32<false>(); }
RAWFLUX_DEVICE u32 trace_clock32() { return trace_read32<true>(); }

// Adds the cycles since `since` (a trace_clock32() value) to a sum slot, and (count) one to kTraceTiles.
RAWFLUX_DEVICE void trace_add_cycles(int slot, u32 since, bool count) {
#if RAWFLUX_TRACE
  const u32 cta = trace_cta();
  if (cta < (unsigned)kTraceCtas) {
    atomicAdd(&rawflux_trace[cta * kTraceSlots + slot], (u64)(trace_clock32() - since));
    if (count) atomicAdd(&rawflux_trace[cta * kTraceSlots + kTraceTiles], 1ull);
  }
#endif
}

// Adds the ns since `since` (a trace_now32() value) to a sum slot: a reduction, so the caller
// does not wait for it.
RAWFLUX_DEVICE void trace_add_since(int slot, u32 since) {
#if RAWFLUX_TRACE
  const u32 cta = trace_cta();
  if (cta < (unsigned)kTraceCtas) atomicAdd(&rawflux_trace[cta * kTraceSlots + slot], (u64)(trace_now32() - since));
#endif
}

// RAWFLUX_TRACE_PHASE: consumer warpgroup `consumer`'s stamp `kind` (kPhaseReady: its full wait
// returned; kPhaseIssued: its group issued, after the commit; kPhaseDone: its group completed,
// after wait_group 0) of k block i, taken by its thread tid == 0.
RAWFLUX_DEVICE void trace_phase(u32 consumer, u32 tid, i32 i, u32 kind) {
#if RAWFLUX_TRACE && RAWFLUX_TRACE_PHASE
  const u32 cta = trace_cta();
  if (tid == 0 && consumer < 2 && cta < (u32)kPhaseCtas && i < kPhaseBlocks) {
    u32 t;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(t) :: "memory");
    rawflux_phase[((cta * 2 + consumer) * 3 + kind) * kPhaseBlocks + i] = t;
  }
#endif
}

}  // namespace rawflux
