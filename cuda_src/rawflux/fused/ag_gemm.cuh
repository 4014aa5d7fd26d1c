// AllGather-GEMM pieces (rawflux/ops/ag_gemm.py drives them):
//
//   AgWait        the GEMM engine's prologue policy: before the TMA producer loads A rows
//                 [m0, m0 + rows) of a tile, it waits (bounded, ld.acquire.sys) for the ready flag
//                 of every chunk those rows touch. Chunk q = rows [q * m_local, (q + 1) * m_local)
//                 of the gathered A, i.e. rank q's shard; the own chunk is in place before the
//                 GEMM starts (stream order), so it is never waited for.
//   ag_local_*    copies this rank's shard into its own rows of the gathered buffer and publishes
//                 the call's metadata record (fused/ag_meta.cuh), in one launch.
//   ag_copy_*     the SM copy path: a bounded grid of CTAs pushes this rank's shard into every
//                 peer's gathered buffer (or pulls every peer's shard into its own), chunk after
//                 chunk in rotated order, and sets the chunk's ready flag after each one.
//
// Flags: ready[q] (u32, in each rank's symmetric flag buffer) holds the barrier epoch of the
// last call whose chunk q has landed in that rank's gathered buffer. Epochs only grow, so flags
// are never reset, and a stale flag (< this call's epoch) never satisfies a wait. The copy engine
// sets a flag by copying the epoch word (device memory) after the data copy on the same stream.
#pragma once

#include "rawflux/comm/ctrl.cuh"
#include "rawflux/comm/signal.cuh"
#include "rawflux/comm/wait.cuh"
#include "rawflux/fused/ag_meta.cuh"
#include "rawflux/gemm/config.cuh"
#include "rawflux/ptx/sync.cuh"

namespace rawflux {

// Rows [m0, m0 + rows) touch chunks first..last (m_local rows each).
RAWFLUX_DEVICE void ag_chunk_span(i32 m0, i32 rows, i32 m_local, i32& first, i32& last) {
  first = m0 / m_local;
  last = (m0 + rows - 1) / m_local;
}

// ------------------------------------------------------------------------------------------
// prologue policy

struct AgWait {
  struct Params {
    u64 group_ctrl;  // const GroupCtrl* of this rank (timeout, status record, abort word, epoch)
    u64 ready;       // u32 ready[world]: this rank's flags (chunk q landed in the gathered buffer)
    i32 m_local;     // rows per chunk (m / world)
    i32 rank;
    i32 world;
    i32 pad;
  };

  // The proxy fence below orders the producer's TMA loads only: a consumer's would need its own.
  static constexpr bool kConsumerRefill = false;

  // Producer thread, before the TMA loads of A rows [m0, m0 + rows). On a failed wait the record
  // is written (and the group aborted, so later waits return at once); the tile then reads
  // whatever is there and the host raises at the next raise_if_failed / synchronize.
  static RAWFLUX_DEVICE void wait(const Params& pp, const GemmParams&, i32, i32 m0, i32 rows) {
    if (rows <= 0) return;
    const GroupCtrl* g = reinterpret_cast<const GroupCtrl*>(pp.group_ctrl);
    const u32* ready = reinterpret_cast<const u32*>(pp.ready);
    i32 first, last;
    ag_chunk_span(m0, rows, pp.m_local, first, last);
    if (last >= pp.world) last = pp.world - 1;
    bool waited = false;
    u32 epoch = 0;
    for (i32 q = first; q <= last; ++q) {
      if (q == pp.rank) continue;
      if (!waited) epoch = *epoch_word(g);  // this call's epoch: written by the barrier earlier in stream order
      waited = true;
      // wait_flag_geq acquires (sys): the chunk's bytes, written by the copy engine or peer SMs
      // before the flag, are visible to this thread after it returns
      const WaitCtx c = make_wait_ctx(g, kOpAgGemm, epoch);
      wait_flag_geq(ready + q, epoch, c, q, q);
    }
    // proxy fence: the TMA loads that follow (async proxy) must see the rows acquired above,
    // which reached memory through the generic proxy (peer SM stores / copy engine)
    if (waited) fence_proxy_async_global();
  }
};

// ------------------------------------------------------------------------------------------
// copies (16-byte vectors; row bytes are a multiple of 16, checked on the host)

namespace ag {

struct V4 {
  u32 x, y, z, w;
};

// Data another rank wrote (a peer's gathered rows): cached in L2 only (.cg), so no L1 line left
// from an earlier call can be returned.
RAWFLUX_DEVICE V4 ld_v4(const void* p) {
  V4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}

// Read-only, no L1 allocation: this rank's input shard, not written during the call.
RAWFLUX_DEVICE V4 ld_nc_v4(const void* p) {
  V4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

RAWFLUX_DEVICE void st_v4(void* p, const V4& v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

enum : int { kUnroll = 4 };  // 16-byte loads in flight per thread before the stores (remote latency)

// Copies `vecs` contiguous 16-byte vectors; the work is spread over `parts` cooperating CTAs,
// this being CTA `part`, whose threads stride through it with kUnroll loads in flight.
template <bool kSrcReadOnly>
RAWFLUX_DEVICE void copy_flat(u8* dst, const u8* src, i64 vecs, i32 part, i32 parts) {
  const i64 stride = (i64)parts * blockDim.x;
  i64 i = (i64)part * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < vecs; i += kUnroll * stride) {
    V4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = kSrcReadOnly ? ld_nc_v4(src + (i + u * stride) * 16) : ld_v4(src + (i + u * stride) * 16);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) st_v4(dst + (i + u * stride) * 16, v[u]);
  }
  for (; i < vecs; i += stride) st_v4(dst + i * 16, kSrcReadOnly ? ld_nc_v4(src + i * 16) : ld_v4(src + i * 16));
}

// A (rows x row_vecs) block of 16-byte vectors, source rows src_pitch bytes apart, destination
// rows packed. Contiguous sources take the flat path; a pitched source goes row by row (CTAs
// over rows, threads over the row).
template <bool kSrcReadOnly>
RAWFLUX_DEVICE void copy_rows(u8* dst, const u8* src, i64 src_pitch, i32 rows, i32 row_vecs, i32 part, i32 parts) {
  const i64 row_bytes = (i64)row_vecs * 16;
  if (src_pitch == row_bytes) {
    copy_flat<kSrcReadOnly>(dst, src, (i64)rows * row_vecs, part, parts);
    return;
  }
  for (i32 r = part; r < rows; r += parts) {
    const u8* s = src + (i64)r * src_pitch;
    u8* d = dst + (i64)r * row_bytes;
    for (i32 c = threadIdx.x; c < row_vecs; c += blockDim.x)
      st_v4(d + (i64)c * 16, kSrcReadOnly ? ld_nc_v4(s + (i64)c * 16) : ld_v4(s + (i64)c * 16));
  }
}

}  // namespace ag

// ------------------------------------------------------------------------------------------
// own rows + metadata (one launch, before the call's last barrier)

struct AgLocalArgs {
  u64 group_ctrl;  // const GroupCtrl*
  u64 src;         // this rank's shard (m_local rows, pitch src_pitch bytes)
  u64 dst;         // own gathered buffer, rows [rank * m_local, ...) (packed rows)
  u64 meta;        // own metadata buffer (2 slots)
  i64 src_pitch;   // bytes
  i32 m_local;
  i32 row_vecs;    // 16-byte vectors per row (k * element bytes / 16)
  u32 op;          // kOpAgGemm
  u32 ahead;       // barriers still to come before the call's last one + 1 (normally 1)
};

RAWFLUX_DEVICE void ag_local_body(const AgLocalArgs& a, const MetaFields& f) {
  ag::copy_rows<true>(reinterpret_cast<u8*>(a.dst), reinterpret_cast<const u8*>(a.src), a.src_pitch, a.m_local,
                      a.row_vecs, blockIdx.x, gridDim.x);
  if (blockIdx.x == 0 && threadIdx.x == 0 && a.meta != 0)
    meta_publish(reinterpret_cast<const GroupCtrl*>(a.group_ctrl), reinterpret_cast<u32*>(a.meta), a.op, f, a.ahead);
}

// ------------------------------------------------------------------------------------------
// SM copy path (after the call's last barrier; never waits on anything)
//
// The GEMM spins on the flags this kernel sets, so the copy CTAs must be resident before the GEMM
// can take the SMs. Both go on one stream, the GEMM launched as this kernel's programmatic
// dependent: it starts only once every copy CTA is running (griddep_launch_dependents below).
// Leaving SMs free was not enough where processes share a GPU (MPS, the emulated node,
// 2026-11-29): a copy kernel on a side stream got no SM at all while the GEMMs spun. Also, no CTA
// owns a fixed share: each chunk is cut into kPartsPerCta * gridDim.x parts, CTAs claim parts in
// chunk order from one counter, and whoever finishes a chunk's last part sets its flag.

enum : int { kAgPush = 0, kAgPull = 1 };
enum : int { kPartsPerCta = 4 };  // parts per chunk = kPartsPerCta x CTAs: claims balance the load

struct AgCopyArgs {
  u64 group_ctrl;   // const GroupCtrl*
  u64 src;          // push: this rank's shard; pull: unused
  u64 gath_peers;   // u64[world]: every rank's gathered buffer as mapped here
  u64 ready_peers;  // u64[world]: every rank's ready flags as mapped here
  u64 counters;     // u32[kMaxWorld + 1], zero between launches: [0] next part to claim,
                    // [step] parts of step's chunk done, [kMaxWorld] CTAs done claiming
  i64 src_pitch;    // push: bytes between rows of src
  i32 m_local;
  i32 row_vecs;
  i32 mode;         // kAgPush / kAgPull
  i32 pad;
};

RAWFLUX_DEVICE void ag_copy_body(const AgCopyArgs& a) {
  const GroupCtrl* g = reinterpret_cast<const GroupCtrl*>(a.group_ctrl);
  const i32 rank = g->rank, world = g->world;
  const u64* gath = reinterpret_cast<const u64*>(a.gath_peers);
  const u64* ready = reinterpret_cast<const u64*>(a.ready_peers);
  u32* counters = reinterpret_cast<u32*>(a.counters);
  u32* next_part = counters;
  u32* exits = counters + kMaxWorld;
  const i64 chunk_bytes = (i64)a.m_local * a.row_vecs * 16;
  const i32 parts = kPartsPerCta * (i32)gridDim.x;
  const i32 total = (world - 1) * parts;
  __shared__ u32 s_epoch;
  __shared__ i32 s_claim;
  // this CTA is resident: once all are, the GEMM (this kernel's programmatic dependent) may start
  griddep_launch_dependents();
  if (threadIdx.x == 0) s_epoch = *epoch_word(g);  // this call's epoch (barrier earlier in stream order)
  for (;;) {
    if (threadIdx.x == 0) s_claim = (i32)atomicAdd(next_part, 1u);
    __syncthreads();
    const i32 claim = s_claim;
    const u32 epoch = s_epoch;
    __syncthreads();  // every thread has read s_claim before thread 0 claims again
    if (claim >= total) break;
    const i32 step = 1 + claim / parts, part = claim % parts;
    u32* flag;
    if (a.mode == kAgPush) {
      // Step s writes to rank - s: a permutation of the ranks, so no two ranks write one peer at
      // once, and every rank receives chunk rank + 1 first (the GEMM visits rank, rank + 1, ...).
      const i32 q = (rank - step + world) % world;
      u8* dst = reinterpret_cast<u8*>(gath[q]) + (i64)rank * chunk_bytes;
      flag = reinterpret_cast<u32*>(ready[q]) + rank;
      ag::copy_rows<true>(dst, reinterpret_cast<const u8*>(a.src), a.src_pitch, a.m_local, a.row_vecs, part, parts);
    } else {
      // Step s reads from rank + s (a permutation too): chunk rank + 1 lands first.
      const i32 q = (rank + step) % world;
      u8* dst = reinterpret_cast<u8*>(gath[rank]) + (i64)q * chunk_bytes;
      const u8* src = reinterpret_cast<const u8*>(gath[q]) + (i64)q * chunk_bytes;
      flag = reinterpret_cast<u32*>(ready[rank]) + q;
      ag::copy_rows<false>(dst, src, (i64)a.row_vecs * 16, a.m_local, a.row_vecs, part, parts);
    }
    __syncthreads();  // joins the CTA: every thread's stores of this part precede thread 0's fence
    if (threadIdx.x == 0) {
      // fence (sys) + count = release: this part of the chunk is visible (to the peer that will
      // read it) before it is counted
      fence_acq_rel_sys();
      const u32 done = atomicAdd(counters + step, 1u);
      if (done == (u32)parts - 1) {
        counters[step] = 0;  // every part of this chunk is counted: zero for the next launch
        // fence (sys) = acquire of the other CTAs' counted parts before the flag is released
        fence_acq_rel_sys();
        // release (sys): the whole chunk is visible before the reader's acquire of the flag
        st_release_sys_u32(flag, epoch);
      }
    }
  }
  if (threadIdx.x == 0 && atomicAdd(exits, 1u) == gridDim.x - 1) {
    // the last CTA out: nobody claims any more in this launch, zero both for the next one
    *next_part = 0;
    *exits = 0;
  }
}

}  // namespace rawflux
