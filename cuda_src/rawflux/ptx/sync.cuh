// Memory-ordering, signalling and timing primitives in inline PTX (sm_70+; the async-proxy fence
// needs sm_90). These are what cross-GPU and cross-process protocols are built from: the data a
// rank hands to a peer is ordered before the flag by a release, and the peer orders its reads
// after the flag by an acquire (docs/ARCHITECTURE.md "Memory ordering rules").
//
// Scope: ".sys" everywhere a peer may be another process or another GPU (IPC-mapped memory) or
// the host (mapped pinned memory); ".gpu" only for protocols inside one kernel on one device.
// All pointers are global-memory addresses (device, IPC-mapped peer, or host-mapped memory).
#pragma once

#include "rawflux/ptx/types.cuh"

namespace rawflux {

// ---- loads ---------------------------------------------------------------------------------

// Acquire at system scope: every write the releasing thread (any GPU, any process) made before
// its release of this location is visible to this thread's later reads.
RAWFLUX_DEVICE u32 ld_acquire_sys_u32(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

RAWFLUX_DEVICE u64 ld_acquire_sys_u64(const u64* p) {
  u64 v;
  // acquire (system scope): the releaser's prior writes are visible after this load
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Four consecutive flags in one load (p 16-byte aligned): each word is read as its own acquire
// would read it, in one round trip instead of four.
RAWFLUX_DEVICE uint4 ld_acquire_sys_v4_u32(const u32* p) {
  uint4 v;
  asm volatile("ld.acquire.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}

// Acquire at GPU scope: for flags written by other CTAs of the same device only.
RAWFLUX_DEVICE u32 ld_acquire_gpu_u32(const u32* p) {
  u32 v;
  // acquire (gpu scope): writes other CTAs of this GPU released before this flag are visible
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Relaxed at system scope: a coherent read (never a stale L1 line) that orders nothing.
RAWFLUX_DEVICE u32 ld_relaxed_sys_u32(const u32* p) {
  u32 v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Four consecutive words in one relaxed load (p 16-byte aligned): coherent, ordering nothing.
RAWFLUX_DEVICE uint4 ld_relaxed_sys_v4_u32(const u32* p) {
  uint4 v;
  asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}

RAWFLUX_DEVICE u32 ld_volatile_u32(const u32* p) {
  u32 v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// ---- stores ----------------------------------------------------------------------------------

// Release at system scope: every write this thread made (or observed, by cumulativity) before
// this store is visible to whoever acquires the stored value, on any GPU or the host.
RAWFLUX_DEVICE void st_release_sys_u32(u32* p, u32 v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

RAWFLUX_DEVICE void st_release_sys_u64(u64* p, u64 v) {
  // release (system scope): this thread's prior writes are visible before the stored value
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

RAWFLUX_DEVICE void st_release_gpu_u32(u32* p, u32 v) {
  // release (gpu scope): prior writes of this thread are visible to CTAs of this GPU first
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Relaxed at system scope: a coherent store that orders nothing (pair it with a fence).
RAWFLUX_DEVICE void st_relaxed_sys_u32(u32* p, u32 v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

RAWFLUX_DEVICE void st_relaxed_sys_u64(u64* p, u64 v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

RAWFLUX_DEVICE void st_relaxed_sys_i32(i32* p, i32 v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// ---- reductions (fire-and-forget atomics) ----------------------------------------------------

// Add with release at system scope: prior writes of this thread are visible before the new
// count; for "N producers each add 1, the consumer waits for N" flags.
RAWFLUX_DEVICE void red_release_sys_add_u32(u32* p, u32 v) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

RAWFLUX_DEVICE void red_relaxed_sys_add_u32(u32* p, u32 v) {
  asm volatile("red.relaxed.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

RAWFLUX_DEVICE void red_release_gpu_add_u32(u32* p, u32 v) {
  // release (gpu scope): prior writes are visible on this GPU before the new count
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Compare-and-swap, relaxed at system scope; returns the old value.
RAWFLUX_DEVICE u32 atom_cas_relaxed_sys_u32(u32* p, u32 expected, u32 desired) {
  u32 old;
  asm volatile("atom.relaxed.sys.global.cas.b32 %0, [%1], %2, %3;"
               : "=r"(old)
               : "l"(p), "r"(expected), "r"(desired)
               : "memory");
  return old;
}

// ---- fences ----------------------------------------------------------------------------------

// Acquire-release fence at system scope: this thread's earlier memory operations are ordered
// before its later ones as seen from any GPU or the host. "data stores; fence; relaxed flag
// store" is a release; "relaxed flag load; fence; data loads" is an acquire.
RAWFLUX_DEVICE void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// Programmatic dependent launch: lets the next kernel in the stream, launched with the
// programmatic-stream-serialization attribute, start once every CTA of this grid has issued this
// (or exited). It orders no memory: the dependent synchronises through flags of its own.
RAWFLUX_DEVICE void griddep_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Sequentially consistent fence at system scope (heavier; only where store->load order matters).
RAWFLUX_DEVICE void fence_sc_sys() { asm volatile("fence.sc.sys;" ::: "memory"); }

// Acquire-release fence at GPU scope (protocols among CTAs of one device).
RAWFLUX_DEVICE void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// Proxy fence between the generic proxy (ld/st) and the async proxy (TMA, wgmma operands):
// generic-proxy writes before it are visible to async-proxy reads after it, and vice versa.
// Needed e.g. before a TMA load reads data a peer delivered by st/memcpy, and after TMA stores
// completed (cp.async.bulk.wait_group 0, not .read) before the release that publishes them.
// sm_90+ only; a no-op on older targets (they have no async proxy for global memory).
RAWFLUX_DEVICE void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async;" ::: "memory");
#endif
}

// The same, restricted to the global state space.
RAWFLUX_DEVICE void fence_proxy_async_global() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}

// ---- time ------------------------------------------------------------------------------------

// Nanoseconds from the GPU's global timer (shared by all SMs; resolution ~1 us on some parts).
RAWFLUX_DEVICE u64 globaltimer_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Sleep about ns nanoseconds (a hint: 0..2*ns); eases the memory traffic of a spin loop.
RAWFLUX_DEVICE void nanosleep_ns(u32 ns) { asm volatile("nanosleep.u32 %0;" ::"r"(ns)); }

// ---- sequence numbers ------------------------------------------------------------------------

// "a is at or after b" for counters that only grow and may wrap around 2^32: correct while the
// two are less than 2^31 apart (epochs of ranks in one group differ by at most a few).
RAWFLUX_DEVICE bool seq_geq(u32 a, u32 b) { return static_cast<i32>(a - b) >= 0; }

}  // namespace rawflux
