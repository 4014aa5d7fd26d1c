// Shared-memory mbarriers (sm_90): the full/empty pairs of the GEMM's shared-memory ring, their
// transaction counts (TMA completes bytes on them) and cluster-remote arrivals.
#pragma once
#include "rawflux/ptx/types.cuh"

namespace rawflux {
namespace ptx {

// 32-bit shared-window address of a generic pointer into this CTA's shared memory.
RAWFLUX_DEVICE u32 smem_u32(const void* p) {
  u64 a;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return (u32)a;
}

// The same pointer, opaque to the optimizer: values derived from it are computed where they are
// used instead of being kept live from an earlier computation.
template <class T>
RAWFLUX_DEVICE T* opaque(T* p) {
  asm volatile("" : "+l"(p));
  return p;
}

RAWFLUX_DEVICE u64 globaltimer_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

RAWFLUX_DEVICE u32 cluster_ctarank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// gridDim.x read where it is used (volatile: not hoisted into a register that lives across a loop).
RAWFLUX_DEVICE u32 grid_dim_x() {
  u32 r;
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(r));
  return r;
}

RAWFLUX_DEVICE u32 cluster_id_x() {
  u32 r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}

RAWFLUX_DEVICE u32 cluster_count_x() {
  u32 r;
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
  return r;
}

// All threads of all CTAs of the cluster: release this thread's earlier shared/global writes and
// mbarrier inits to the cluster, acquire the others' (start-up and tear-down of the cluster).
RAWFLUX_DEVICE void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");  // publishes inits / last remote arrivals
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");    // sees the peers' inits before using them
}

RAWFLUX_DEVICE void mbar_init(u64* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// Makes the mbarrier inits above visible to the async proxy (TMA) and to the cluster's peers.
RAWFLUX_DEVICE void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // orders inits before peers' / TMA's use
}

// Arrive once and add `bytes` to the transactions this phase waits for (TMA completes them).
RAWFLUX_DEVICE void mbar_arrive_expect_tx(u64* bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// Arrive on the barrier at the same shared offset in cluster CTA `cta` (may be this CTA), given by
// its 32-bit shared address (the k loop's form) or by pointer.
// Default .release.cta semantics on purpose: what the arrival hands back is a stage whose reads by
// wgmma are already complete (wgmma.wait_group), and nothing written needs publishing, so no
// cluster-scope release is needed (a .release.cluster arrive costs a MEMBAR.GPU per k block).
RAWFLUX_DEVICE void mbar_arrive_cluster_addr(u32 addr, u32 cta) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(addr),
      "r"(cta)
      : "memory");  // release.cta: the stage's wgmma reads are complete before the producer reuses it
}
RAWFLUX_DEVICE void mbar_arrive_cluster(u64* bar, u32 cta) { mbar_arrive_cluster_addr(smem_u32(bar), cta); }

// Arrive on the barrier at the same shared offset in cluster CTA `cta`, releasing at cluster scope:
// this thread's earlier writes to that CTA's shared memory (st.shared::cluster) are visible to a
// thread that sees the phase complete with an acquire.cluster wait (the k-split exchange).
RAWFLUX_DEVICE void mbar_arrive_release_cluster(u64* bar, u32 cta) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_u32(bar)),
      "r"(cta)
      : "memory");
}

// Plain local arrive (release at CTA scope: orders this thread's shared reads before the waiter),
// by 32-bit shared address (the k loop's form) or by pointer.
RAWFLUX_DEVICE void mbar_arrive_addr(u32 addr) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(addr) : "memory");  // release.cta: shared reads before the waiter
}
RAWFLUX_DEVICE void mbar_arrive(u64* bar) { mbar_arrive_addr(smem_u32(bar)); }

RAWFLUX_DEVICE bool mbar_try_wait(u32 bar_addr, u32 parity) {
  u32 ok;
  // acquire (default .acquire.cta): the stage's bytes written by TMA / released by consumers are
  // visible to this thread once the phase is seen complete.
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar_addr), "r"(parity)
      : "memory");
  return ok != 0;
}

// Waits for the phase of parity `parity` of the barrier at 32-bit shared address `addr` (the k
// loop's form) to complete. Bounded: a pipeline that stops moving (a bug, never normal operation)
// ends in a trap after timeout_ns instead of hanging the GPU; the clock is read only every 4096
// failed polls so the fast path stays one try_wait.
RAWFLUX_DEVICE void mbar_wait_addr(u32 addr, u32 parity, i64 timeout_ns) {
  if (mbar_try_wait(addr, parity)) return;
  u64 start = 0;
  for (u32 polls = 1;; ++polls) {
    if (mbar_try_wait(addr, parity)) return;
    if ((polls & 4095) == 0) {
      const u64 now = globaltimer_ns();
      if (start == 0) {
        start = now;
      } else if ((i64)(now - start) > timeout_ns) {
        asm volatile("trap;");  // rawflux gemm pipeline stalled: a barrier phase never completed
      }
    }
  }
}

// mbar_wait_addr on a barrier given by pointer.
RAWFLUX_DEVICE void mbar_wait(u64* bar, u32 parity, i64 timeout_ns) { mbar_wait_addr(smem_u32(bar), parity, timeout_ns); }

// mbar_wait with acquire at cluster scope: after it returns, what the threads of other cluster CTAs
// wrote before their release.cluster arrivals on this phase is visible to this thread.
RAWFLUX_DEVICE void mbar_wait_acquire_cluster(u64* bar, u32 parity, i64 timeout_ns) {
  const u32 addr = smem_u32(bar);
  u64 start = 0;
  for (u32 polls = 0;; ++polls) {
    u32 ok;
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(addr), "r"(parity)
        : "memory");
    if (ok) return;
    if ((polls & 4095) == 4095) {
      const u64 now = globaltimer_ns();
      if (start == 0) {
        start = now;
      } else if ((i64)(now - start) > timeout_ns) {
        asm volatile("trap;");  // rawflux gemm: the k-split partner never handed over its fragment
      }
    }
  }
}

RAWFLUX_DEVICE void fence_acq_rel_cta() { asm volatile("fence.acq_rel.cta;" ::: "memory"); }

// A stage's release count (the consumer refill, gemm_kernel): add 1, return the count before.
// Relaxed, as the engine's stage releases are release.cta arrives: what a warp hands back is a
// stage whose wgmma reads are complete (wgmma.wait_group 0) and it has written nothing to publish.
// The add of whoever makes the count whole orders its refill after the others' with a fence.
RAWFLUX_DEVICE u32 atom_add_relaxed_cta_shared(u32 addr, u32 v) {
  u32 old;
  asm volatile("atom.relaxed.cta.shared::cta.add.u32 %0, [%1], %2;\n" : "=r"(old) : "r"(addr), "r"(v) : "memory");
  return old;
}
// The same on a count in either CTA of the cluster (addr from mapa_shared): cluster scope, so the
// two CTAs' adds to one count are atomic with each other.
RAWFLUX_DEVICE u32 atom_add_relaxed_cluster_shared(u32 cluster_addr, u32 v) {
  u32 old;
  asm volatile("atom.relaxed.cluster.shared::cluster.add.u32 %0, [%1], %2;\n" : "=r"(old) : "r"(cluster_addr), "r"(v) : "memory");
  return old;
}

// Waits until this CTA's count at shared address `addr` reaches `want` (wrap-safe, 32-bit), with
// acquire at CTA scope, or cluster scope when a peer CTA adds to it (kCluster): the counted
// releases come before this thread's later writes (its TMA loads into the stage). Bounded like
// mbar_wait_addr.
template <bool kCluster>
RAWFLUX_DEVICE void wait_count_geq(u32 addr, u32 want, i64 timeout_ns) {
  u64 start = 0;
  for (u32 polls = 0;; ++polls) {
    u32 v;
    if constexpr (kCluster) {
      asm volatile("ld.acquire.cluster.shared::cta.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");  // acquire.cluster: the pair's counted releases
    } else {
      asm volatile("ld.acquire.cta.shared::cta.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");  // acquire.cta: the counted releases
    }
    if ((i32)(v - want) >= 0) return;
    if ((polls & 4095) == 4095) {
      const u64 now = globaltimer_ns();
      if (start == 0) {
        start = now;
      } else if ((i64)(now - start) > timeout_ns) {
        asm volatile("trap;");  // rawflux gemm pipeline stalled: a stage was never released
      }
    }
  }
}

// mbar_arrive_expect_tx on the barrier at the same shared offset in cluster CTA `cta` (may be this
// CTA): the consumer refill arms the peer's stage for the loads it issues into it. Default
// release.cta semantics: the bytes are TMA's, completed on the barrier itself.
RAWFLUX_DEVICE void mbar_arrive_expect_tx_cluster(u32 addr, u32 cta, u32 bytes) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.expect_tx.shared::cluster.b64 _, [remote], %2;\n}\n" ::"r"(addr),
      "r"(cta), "r"(bytes)
      : "memory");
}

// Shared-window address `addr` of this CTA, as cluster CTA `cta` maps it (for st.shared::cluster).
RAWFLUX_DEVICE u32 mapa_shared(u32 addr, u32 cta) {
  u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(cta));
  return remote;
}

RAWFLUX_DEVICE void st_cluster_v4f(u32 remote_addr, float a, float b, float c, float d) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(remote_addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

// Scalar shared-memory words (an epilogue's state; the release orders this thread's earlier accesses
// before a CTA-scope acquire of the word).
RAWFLUX_DEVICE u64 ld_shared_u64(u32 addr) {
  u64 v;
  asm volatile("ld.shared.u64 %0, [%1];\n" : "=l"(v) : "r"(addr) : "memory");
  return v;
}
RAWFLUX_DEVICE void st_shared_u64(u32 addr, u64 v) { asm volatile("st.shared.u64 [%0], %1;\n" ::"r"(addr), "l"(v) : "memory"); }
RAWFLUX_DEVICE u32 ld_shared_u32(u32 addr) {
  u32 v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
RAWFLUX_DEVICE void st_shared_u32(u32 addr, u32 v) { asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory"); }
RAWFLUX_DEVICE void st_release_cta_shared_u32(u32 addr, u32 v) {
  asm volatile("st.release.cta.shared::cta.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
RAWFLUX_DEVICE u32 ld_acquire_cta_shared_u32(u32 addr) {
  u32 v;
  asm volatile("ld.acquire.cta.shared::cta.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}


RAWFLUX_DEVICE void ld_shared_v4f(u32 addr, float& a, float& b, float& c, float& d) {
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(a), "=f"(b), "=f"(c), "=f"(d) : "r"(addr) : "memory");
}

// Named barrier over `count` threads (a multiple of 32); id 0 is __syncthreads'.
RAWFLUX_DEVICE void named_barrier_sync(u32 id, u32 count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Named barrier that also ORs a predicate over the participating threads.
RAWFLUX_DEVICE bool named_barrier_or(u32 id, u32 count, bool pred) {
  u32 out;
  asm volatile(
      "{\n.reg .pred pi, po;\n"
      "setp.ne.u32 pi, %1, 0;\n"
      "bar.red.or.pred po, %2, %3, pi;\n"
      "selp.u32 %0, 1, 0, po;\n}\n"
      : "=r"(out)
      : "r"((u32)pred), "r"(id), "r"(count)
      : "memory");
  return out != 0;
}

}  // namespace ptx
}  // namespace rawflux
