"""The tensor pipe's attainable rate under the GEMM engine's wgmma issue patterns, without loads.

    PYTHONPATH=. python benchmarks/wgmma_peak.py [--blocks 2000]

One CTA per SM, shared memory filled once with random bf16 (kStages stages of a 128x256x64 tile's
A and B, 128-byte swizzle as the engine's ring), then each consumer warpgroup issues `blocks` k
blocks of 4 x m64nNk16 wgmma (SS) on the stages in turn, with nothing else in the loop but what the
variant adds. SM cycles (clock64) per k block of the CTA are printed against the pipe's peak (a
m64n256k16 takes 128 cycles at 4096 dense FLOP/cycle/SM, so two warpgroups' block is 1024).
This separates what the hardware allows per k block from what the engine's barriers and loads
add (docs/gemm-notes.md, session 19: every variant with two warpgroups ran at 1024.0-1024.3 on the
H200, the trace-like per-block timer read at 1030; the engine's own k loop, measured with
`RAWFLUX_TRACE_BLOCK_WAITS=0 RAWFLUX_PROBE=3` in benchmarks/gemm_trace.py, at 1039). Session 20
added transplants of the engine's traits (code placement, the producer's poll styles, the barrier
layout, a TMA load, a cluster launch, turnaround delays and late warps): all ran at 1024.3; the
one slow pattern here, consumers that release but never wait (1052-1054), is not the engine's.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SRC = r"""
#include "rawflux/ptx/mbarrier.cuh"
#include "rawflux/ptx/tma.cuh"
#include "rawflux/ptx/wgmma.cuh"
using namespace rawflux;

// kWgs consumer warpgroups; kPending groups left in flight at each block's wait; kChunks wgmma
// per k16 step (n = 256 / kChunks); kSync: a 128-thread barrier per warpgroup before each block
// (cuBLAS's BAR.SYNC); kMbar: each block waits on a completed mbarrier and arrives on another
// (the engine's full / empty traffic, with no producer).
// kRing: a full / empty ring of kStages barriers with a producer thread (warpgroup 2's first thread),
// which waits for each stage's release and marks it full again at once (the engine's probe 2:
// no loads); kStamp: consumer thread 0 reads %globaltimer_lo before each block's wait and adds the
// wait to a global sum (the trace build's per-block wait sum).
// kRegs: the engine's register split (setmaxnreg: producer warpgroup 40, consumers 232); kScale:
// the first k16 step's scale-d as a run-time predicate (block 0 overwrites), as in the engine.
// kWaitOnly (with kRing): the engine's probe 771 here: the producer only waits for the releases (marks
// nothing full) and the consumers do not wait for full stages.
// kUnroll: the consumers' k loop unrolled (code size, as the engine's loop over the ring).
// kDiverge: the producer warp's other lanes wait at __syncwarp for its lane 0 (the engine's
// producer warp) instead of leaving.
// kPad (with kRegs): about kPad bytes of never-executed code ahead of the producer's loop, which
// moves that loop this far from the consumers' (the engine's loops are ~32 KB apart; session 20
// asks whether the instruction cache sees it: no, 1024.3 at every distance).
// kDelay: every consumer thread spins kDelay cycles after its release (a longer turnaround);
// kSkew: only the first warp of each consumer warpgroup does (one warp late, as a warp that shares
// its SM sub-partition with the producer could be).
// kMbar: 1 = wait on a completed barrier before each block and arrive on a never-completing one
// after it; 2 = the wait only; 3 = the arrival only.
// kPoll: the producer's wait for a released stage: 0 = the engine's mbar_wait (try_wait, which
// suspends in hardware), 1 = spinning on test_wait, 2 / 3 = test_wait with a 100 / 500 ns
// nanosleep between polls.
// kArrivers: which consumer warpgroups release stages: 0 = both (the engine), 1 = the first only,
// 2 = the second only (the producer then wakes at that warpgroup's release), 3 = none.
// kProd (with kRegs and kRing): what the producer thread does instead of waiting on the empty
// barriers, for about as long as the consumers run (blocks x 1024 cycles): 1 = nothing (it leaves),
// 2 = nanosleep(200) in a loop, 3 = test_wait on a completed barrier and nanosleep(200) in a loop,
// 4 = spin on clock64, 5 = test_wait on a completed barrier in a tight loop. 0: the ring's producer.
// kTma: 1 = the kernel holds a TMA load (never executed), as the engine does.
// kLayout: 1 = the engine's barrier layout (full[] first, then empty[], right after the stages).
// kCluster: 1 = launched as clusters of 2 CTAs (host side only; the kernel does nothing with it).
template <int kPoll>
__device__ void producer_wait(u64* bar, u32 parity) {
  if constexpr (kPoll == 0) {
    ptx::mbar_wait(bar, parity, 1000000000ll);  // acquire.cta: every consumer warp released the stage
  } else {
    for (u32 polls = 0; polls < (1u << 24); ++polls) {  // then mbar_wait's bounded wait (a trap, not a hang)
      if (ptx::mbar_test_wait(ptx::smem_u32(bar), parity)) return;  // acquire.cta: as mbar_wait's
      if constexpr (kPoll == 2) __nanosleep(100);
      if constexpr (kPoll == 3) __nanosleep(500);
    }
    ptx::mbar_wait(bar, parity, 1000000000ll);
  }
}

template <int kWgs, int kPending, int kChunks, int kSync, int kMbar, int kRing = 0, int kStamp = 0, int kRegs = 0, int kScale = 0,
          int kDiverge = 0, int kUnroll = 1, int kWaitOnly = 0, int kPad = 0, int kDelay = 0, int kSkew = 0, int kPoll = 0,
          int kArrivers = 0, int kProd = 0, int kTma = 0, int kLayout = 0, int kCluster = 0>
__global__ void __launch_bounds__(384, 1) wgmma_peak(const uint4* src, unsigned long long* cycles, float* sink, int blocks) {
  constexpr int kStages = 4;
  constexpr u32 kStageA = 128 * 128, kStageB = 256 * 128;  // bytes: 128 rows of A, 256 of B, 64 bf16 each
  constexpr int kN = 256 / kChunks;
  extern __shared__ u8 smem_raw[];
  u8* smem = smem_raw + ((1024u - (ptx::smem_u32(smem_raw) & 1023u)) & 1023u);
  u64* bars = reinterpret_cast<u64*>(smem + kStages * (kStageA + kStageB));
  for (u32 i = threadIdx.x; i < kStages * (kStageA + kStageB) / 16; i += blockDim.x) reinterpret_cast<uint4*>(smem)[i] = src[i];
  u64* full = kLayout ? bars : bars + 2;
  u64* empty = full + kStages;
  if (kLayout) bars += 2 * kStages;  // the two spare barriers after the ring's
  if (threadIdx.x == 0) {
    for (int st = 0; st < kStages; ++st) {
      ptx::mbar_init(&full[st], 1);
      ptx::mbar_init(&empty[st], kArrivers == 0 ? kWgs * 4 : 4);
    }
    ptx::mbar_init(&bars[0], 1);
    ptx::mbar_init(&bars[1], (1u << 20) - 1);  // never completes: arrivals only
    ptx::fence_mbar_init();
  }
  ptx::fence_proxy_async_smem();  // the generic fill before the wgmma's async-proxy reads
  __syncthreads();
  if (threadIdx.x == 0) ptx::mbar_arrive(&bars[0]);  // phase 0 completes: waits on parity 0 return at once
  __syncthreads();
  const u32 wg = threadIdx.x / 128;
  if (kRegs && wg == 2) {  // the engine's producer warpgroup: 40 registers, and it never reaches the consumers' code
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (kRing && threadIdx.x == 256) {
      if (kPad > 0 && blocks < 0) dead_code_pad<kPad>(reinterpret_cast<u32*>(sink));  // never (blocks >= 1): code placement only
      u8* sm = smem_raw + ((1024u - (ptx::smem_u32(smem_raw) & 1023u)) & 1023u);
      u64* f = reinterpret_cast<u64*>(sm + kStages * (kStageA + kStageB)) + (kLayout ? 0 : 2);
      if (kTma && blocks < 0) ptx::tma_load_2d(sm, reinterpret_cast<const TensorMap*>(sink), f, 0, 0);  // never (blocks >= 1)
      u64* e = f + kStages;
      if constexpr (kProd != 0) {
        const long long until = clock64() + (long long)blocks * 1024;
        while (kProd != 1 && clock64() < until) {
          if constexpr (kProd == 3 || kProd == 5) producer_wait<1>(reinterpret_cast<u64*>(sm + kStages * (kStageA + kStageB)), 0u);
          if constexpr (kProd == 2 || kProd == 3) __nanosleep(200);
        }
        blocks = 0;
      }
      for (int b = 0; b < blocks; ++b) {
        const u32 st = (u32)b % kStages, ph = ((u32)b / kStages) & 1u;
        producer_wait<kPoll>(&e[st], ph ^ 1u);  // acquire.cta: every consumer warp released the stage
        if (!kWaitOnly) ptx::mbar_arrive(&f[st]);         // release.cta: the stage is "full" (no data moves)
      }
    }
    __syncwarp();
    return;
  }
  if (kRegs) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  if (kRing && threadIdx.x == 256) {  // the producer
    for (int b = 0; b < blocks; ++b) {
      const u32 st = (u32)b % kStages, ph = ((u32)b / kStages) & 1u;
      producer_wait<kPoll>(&empty[st], ph ^ 1u);  // acquire.cta: every consumer warp released the stage
      if (!kWaitOnly) ptx::mbar_arrive(&full[st]);         // release.cta: the stage is "full" (no data moves)
    }
  }
  if (kDiverge && threadIdx.x / 32 == 8) __syncwarp();
  if (wg >= (u32)kWgs) return;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  const u32 a0 = ptx::smem_u32(smem) + wg * 64 * 128;
  const u32 b0 = ptx::smem_u32(smem) + kStages * kStageA;
  const long long t0 = clock64();
#pragma unroll kUnroll
  for (int b = 0; b < blocks; ++b) {
    const u32 st = (u32)b % kStages;
    if (kSync) ptx::named_barrier_sync(1 + wg, 128);
    if (kMbar == 1 || kMbar == 2) ptx::mbar_wait(&bars[0], 0, 1000000000ll);
    u32 from = 0;
    if (kStamp) asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(from));
    if (kRing && !kWaitOnly) ptx::mbar_wait(&full[st], ((u32)b / kStages) & 1u, 1000000000ll);
    if (kStamp && threadIdx.x == 0) {
      u32 now;
      asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(now));
      atomicAdd(reinterpret_cast<unsigned long long*>(sink) + 1000, (unsigned long long)(now - from));
    }
    ptx::wgmma_fence();  // orders the accumulators' earlier register accesses before the wgmma below
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        float(&ac)[kN / 2] = *reinterpret_cast<float(*)[kN / 2]>(&acc[c * (kN / 2)]);
        const u64 da = ptx::smem_desc(a0 + st * kStageA + kk * 32, 16, 1024);
        const u64 db = ptx::smem_desc(b0 + st * kStageB + c * kN * 128 + kk * 32, 16, 1024);
        ptx::Wgmma<kN, false, 0>::mma(ac, da, db, (kScale && b == 0 && kk == 0) ? 0u : 1u);
      }
    }
    ptx::wgmma_commit();
    ptx::wgmma_wait<kPending>();  // at most kPending of this warpgroup's groups still run (0: the stage is read)
    if ((kMbar == 1 || kMbar == 3) && (threadIdx.x % 32) == 0) ptx::mbar_arrive(&bars[1]);
    if (kRing && (threadIdx.x % 32) == 0 && (kArrivers == 0 || kArrivers == wg + 1)) ptx::mbar_arrive(&empty[st]);  // release.cta: the stage's reads are done (wait_group 0)
    if (kDelay > 0 || (kSkew > 0 && (threadIdx.x / 32) % 4 == 0)) {
      const long long from = clock64();
      while (clock64() - from < (kDelay > 0 ? kDelay : kSkew)) {
      }
    }
  }
  ptx::wgmma_wait<0>();
  ptx::reg_fence(acc);
  const long long t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 128; ++i) s += acc[i];
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 4 + wg] = (unsigned long long)(t1 - t0);
  if (s == 12345.f) sink[threadIdx.x] = s;  // keeps the wgmma live
}
"""

VARIANTS = {  # label: (warpgroups, pending, chunks, sync, mbar, ring, stamp)
    "2wg wait0 + ring": (2, 0, 1, 0, 0, 1, 0),
    "2wg wait0 + ring, diverged": (2, 0, 1, 0, 0, 1, 0, 0, 0, 1),
    "2wg wait0 + ring + regs": (2, 0, 1, 0, 0, 1, 0, 1, 0),
    "ring + regs, unrolled x16": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 16),
    "ring + regs, unrolled x32": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 32),
    "ring + regs, waits only": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1),
    "ring + regs, waits only, bar.sync": (2, 0, 1, 1, 0, 1, 0, 1, 0, 0, 1, 1),
    "ring + regs, waits only, mbar": (2, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 1),
    "ring + regs, bar.sync": (2, 0, 1, 1, 0, 1, 0, 1, 0, 0, 1, 0),
    "ring + regs, waits only, mbar wait": (2, 0, 1, 0, 2, 1, 0, 1, 0, 0, 1, 1),
    "ring + regs, waits only, mbar arrive": (2, 0, 1, 0, 3, 1, 0, 1, 0, 0, 1, 1),
    "ring + regs, waits only, spin": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 1),
    "ring + regs, waits only, sleep 100": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 2),
    "ring + regs, waits only, sleep 500": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 3),
    "ring + regs, spin": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 1),
    "ring + regs, sleep 100": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 2),
    "ring + regs, waits only, no producer": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1),
    "ring + regs, waits only, producer sleeps": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 2),
    "ring + regs, waits only, producer polls bars[0]": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 3),
    "ring + regs, waits only, producer spins": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 4),
    "ring + regs, tma": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1),
    "ring + regs, layout": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1),
    "ring + regs, cluster": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1),
    "ring + regs, tma, layout, cluster": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1),
    "no ring + producer polling, sleeps": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 3, 3),
    "no ring + producer polling, tight": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 3, 5),
    "no ring + producer sleeping": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 3, 2),
    "ring + regs, waits only, wg0 releases": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1),
    "ring + regs, waits only, wg1 releases": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 2),
    "ring + regs, wg0 releases": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1),
    "ring + regs, wg1 releases": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 2),
    "ring + regs, delay 64": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 64),
    "ring + regs, delay 256": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 256),
    "ring + regs, waits only, delay 64": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 64),
    "ring + regs, skew 16": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 16),
    "ring + regs, skew 64": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 64),
    "2wg wait0, skew 16": (2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 16),
    "2wg wait0, skew 64": (2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 64),
    "2wg wait0, skew 64, bar.sync": (2, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 64),
    "2wg wait0, delay 256": (2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 256),
    "ring + regs, pad 2048": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 2048),
    "ring + regs, pad 4096": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 4096),
    "ring + regs, pad 12288": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 12288),
    "ring + regs, pad 28672": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 28672),
    "ring + regs, pad 30720": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 30720),
    "ring + regs, pad 61440": (2, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 61440),
    "2wg wait0 + ring + scale": (2, 0, 1, 0, 0, 1, 0, 0, 1),
    "2wg wait0 + ring + stamp": (2, 0, 1, 0, 0, 1, 1),
    "2wg wait0 + stamp": (2, 0, 1, 0, 0, 0, 1),
    "2wg wait0": (2, 0, 1, 0, 0, 0, 0),
    "2wg wait0 + mbar": (2, 0, 1, 0, 1, 0, 0),
    "2wg wait0 + bar.sync": (2, 0, 1, 1, 0, 0, 0),
    "2wg wait1": (2, 1, 1, 0, 0, 0, 0),
    "2wg wait0 n128x2": (2, 0, 2, 0, 0, 0, 0),
    "2wg wait1 n128x2": (2, 1, 2, 0, 0, 0, 0),
    "1wg wait0": (1, 0, 1, 0, 0, 0, 0),
    "1wg wait1": (1, 1, 1, 0, 0, 0, 0),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--smem-kb", type=int, default=0, help="dynamic shared memory to request per CTA (KB; default: what the ring needs, ~193)")
    ap.add_argument("--only", default="", help="run only the variants whose label contains this")
    ap.add_argument("--exact", action="store_true", help="--only names one variant's whole label")
    args = ap.parse_args(argv)
    import cupy as cp

    from rawflux.jit import Kernel, compile_cubin

    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    names = ["wgmma_peak<%s>" % ",".join(map(str, v)) for v in VARIANTS.values()]
    res = compile_cubin(SRC, arch="sm_90a", name_expressions=tuple(names), filename="wgmma_peak.cu")
    for n in names:
        r = res.resources.get(res.lowered[n], {})
        if r.get("spill_stores"):
            print(f"warning: {n} spills {r}")
    smem = max(4 * (128 + 256) * 128 + 1024 + 128, args.smem_kb * 1024)
    rng = cp.random.default_rng(1)
    vals = rng.standard_normal(smem // 2, dtype=cp.float32)
    src = (vals.view(cp.uint32) >> 16).astype(cp.uint16)  # bf16 bits (truncated): random, never zeros
    cycles = cp.zeros(sms * 4, dtype=cp.uint64)
    sink = cp.zeros(4096, dtype=cp.float32)
    print(f"{sms} CTAs, {smem} B of shared memory, {args.blocks} k blocks each; peak: 512 cycles per warpgroup-block (m64n256k16 x 4 at 4096 FLOP/cycle)")
    print(f"{'variant':24s} {'cycles/block':>12s} {'vs peak':>8s}")
    for (label, (w, *_)), n in zip(VARIANTS.items(), names):
        if args.only and (args.only != label if args.exact else args.only not in label):
            continue
        kern = Kernel(res, res.lowered[n], dev.id)  # the engine's loader (the cubin from memory)
        per = []
        for _ in range(args.reps):
            cycles.fill(0)
            if len(VARIANTS[label]) > 20 and VARIANTS[label][20]:
                kern.launch_ex((sms - sms % 2,), (384,), (src, cycles, sink, cp.int32(args.blocks)), smem=smem, cluster=(2, 1, 1))
            else:
                kern.launch((sms,), (384,), (src, cycles, sink, cp.int32(args.blocks)), smem=smem)
            cp.cuda.runtime.deviceSynchronize()
            cyc = cycles.get().reshape(sms, 4)[:, :w].max(axis=1)
            per.append(float(statistics.median(cyc)) / args.blocks)
        cpb = statistics.median(per)
        peak = 512.0 * w
        print(f"{label:24s} {cpb:12.1f} {cpb / peak:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
