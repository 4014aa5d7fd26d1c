// AllGather-GEMM pieces (rawflux/ops/ag_gemm.py drives them):
//
//   AgWait        the GEMM engine's prologue policy: before the TMA producer loads A rows
//                 [m0, m0 + rows) of a tile, it waits (bounded, ld.acquire.sys) for the ready flag
//                 of every chunk those rows touch. Chunk q = rows [q * m_local, (q + 1) * m_local)
//                 of the gathered A, i.e. rank q's shard; the own chunk is never waited for: a
//                 tile wholly inside it reads the shard in place (own_map, own_tile), a tile it
//                 shares with a peer reads the rows the call's start copied. With k-slabs (S > 1) a
//                 chunk travels as S column slabs of k / S, each with its own flag, and the
//                 producer waits for slab j only before the tile's first k block of slab j, so a
//                 tile starts on the first slab while the rest is in flight. A unit that is a k
//                 piece of a tile (the plain GEMM's split-K, stream-K, split tail, bands) waits
//                 for the slabs of its own k range only. A CTA's first unit whose rows are still
//                 in flight loads B's first k blocks before it waits (b_first: at small m the
//                 wait then hides behind reading B).
//   ag_local_*    starts a call: advances the op's epoch, pushes this rank's call record into
//                 every peer, copies this rank's shard into its own rows of the gathered buffer
//                 (only the edge rows, which share a tile with a peer's, where the GEMM reads the
//                 rest in place) and announces the call to the peers (arrive); on the copy-engine path its last
//                 CTA then waits for every peer's arrival (the copies that follow need it).
//   ag_copy_*     the SM copy path: a bounded grid of CTAs pushes this rank's shard into every
//                 peer's gathered buffer (or pulls every peer's shard into its own), chunk after
//                 chunk in rotated order (slab-major with k-slabs: slab 0 of every chunk first),
//                 each once its peer has arrived, and sets the (chunk, slab) ready flag after
//                 it; its last CTA compares the peers' call records.
//
// No barrier: a peer's arrival at call e says its GEMM of call e - 1 has ended (stream order), so
// this rank may write into its gathered buffer; this rank's own GEMM of e - 1 ended before its
// call e started. So one gathered slot suffices (tests/cpu/test_ag_protocol.py checks the
// protocol on an interleaving model). Pull adds a group barrier before the call (a peer may still
// be reading this rank's own rows of e - 1) and announces the call after its own rows are in place.
//
// Flags hold the op's epoch e (calls of this op object, counted on the device): ready[q][j] = the
// last call whose slab j of chunk q landed in this rank's gathered buffer (j = 0: the whole chunk
// without slabs), arrive[q] = the last call rank q started. Epochs only grow, so flags are never
// reset, and a stale flag (< e) never satisfies a wait. The copy engine sets a flag by copying the
// epoch word after the data on the same stream.
#pragma once

#include "rawflux/comm/ctrl.cuh"
#include "rawflux/comm/signal.cuh"
#include "rawflux/comm/wait.cuh"
#include "rawflux/comm/call_record.cuh"
#include "rawflux/gemm/config.cuh"
#include "rawflux/ptx/sync.cuh"
#include "rawflux/ptx/tma.cuh"

namespace rawflux {

enum : int { kAgMaxSlabs = 8 };  // k-slabs per chunk at most

// The op's sync buffer (symmetric, one per rank; rawflux/ops/ag_gemm.py mirrors the offsets).
enum : u32 {
  kAgEpochOffset = 0,      // u32: calls of the op on this rank (local; ag_local_kernel advances it)
  kAgLocalDoneOffset = 64, // u32: ag_local_kernel's CTAs done (local; zero between launches)
  kAgArriveOffset = 128,   // u32 arrive[kMaxWorld]: the last call rank q started (written by q)
  kAgReadyOffset = kAgArriveOffset + 4 * kMaxWorld,     // u32 ready[kMaxWorld][kAgMaxSlabs]
  kAgRecordsOffset = kAgReadyOffset + 4 * kMaxWorld * kAgMaxSlabs,  // call records, slot (parity, source)
  kAgSyncBytes = kAgRecordsOffset + 2 * kMaxWorld * kMetaSlotBytes,
};

// ag_copy_kernel's counters (u32, zero between launches): [0] the next part to claim, [1 + c]
// parts done of claim block c = (slab, step), [kAgCopyExits] CTAs done claiming.
enum : int { kAgCopyExits = 1 + kMaxWorld * kAgMaxSlabs, kAgCopyCounters = kAgCopyExits + 1 };

static_assert(kAgReadyOffset % 32 == 0 && kAgMaxSlabs == 8, "AgWait reads a chunk's 8 slab flags as two aligned 16-byte loads");

RAWFLUX_DEVICE u32* ag_word(u64 sync, u32 offset) { return reinterpret_cast<u32*>(sync + offset); }
RAWFLUX_DEVICE constexpr u32 ag_ready_index(i32 chunk, i32 slab) { return (u32)chunk * kAgMaxSlabs + (u32)slab; }
RAWFLUX_DEVICE u32* ag_record(u64 sync, u32 parity, i32 src) {
  return ag_word(sync, kAgRecordsOffset + (parity * kMaxWorld + (u32)src) * kMetaSlotBytes);
}

// Rows [m0, m0 + rows) touch chunks first..last (m_local rows each).
RAWFLUX_DEVICE void ag_chunk_span(i32 m0, i32 rows, i32 m_local, i32& first, i32& last) {
  first = m0 / m_local;
  last = (m0 + rows - 1) / m_local;
}

// ------------------------------------------------------------------------------------------
// prologue policy

struct AgWait {
  struct Params {
    TensorMap own_map;  // this rank's shard (m_local rows, its own pitch), A's box: own tiles read it in place
    u64 group_ctrl;  // const GroupCtrl* of this rank (timeout, status record, abort word)
    u64 ready;       // u32 ready[kMaxWorld][kAgMaxSlabs] of this rank's sync buffer (ag_ready_index)
    u64 epoch;       // const u32*: the op's epoch word (this call's number once ag_local_kernel ran)
    i32 m_local;     // rows per chunk (m / world)
    i32 rank;
    i32 world;
    i32 slab_kb;     // k blocks per k-slab; 0: whole chunks (one flag each)
    i32 b_first;     // 1: the first unit may load B before its wait (b_first); 0: A and B after it
    i32 own_rows;    // 1: a tile wholly inside the own chunk loads A from own_map (own_tile); 0: every tile from the gathered A
  };

  // The proxy fence below orders the producer's TMA loads only: a consumer's would need its own.
  static constexpr bool kConsumerRefill = false;
  static constexpr bool kSlabWait = true;  // k-slabs: wait_slabs before each run of landed slabs

  // Own rows read in place: a tile whose rows [tile0, tile0 + tile_rows) all lie in the own chunk
  // loads A from the shard itself (own_map, at row tile0 - own_row0), so the call's start copies
  // only the own rows that share a tile with a peer's (ag_local_kernel's edge rows).
  static constexpr bool kOwnRows = true;
  static RAWFLUX_DEVICE i32 own_row0(const Params& pp) { return pp.rank * pp.m_local; }
  static RAWFLUX_DEVICE bool own_tile(const Params& pp, i32 tile0, i32 tile_rows) {
    const i32 r0 = own_row0(pp);
    return pp.own_rows != 0 && tile0 >= r0 && tile0 + tile_rows <= r0 + pp.m_local;
  }

  // k block kb's slab (0 without slabs); first..last: the chunks rows [m0, m0 + rows) touch
  static RAWFLUX_DEVICE i32 span(const Params& pp, i32 m0, i32 rows, i32 kb, i32& first, i32& last) {
    ag_chunk_span(m0, rows, pp.m_local, first, last);
    if (last >= pp.world) last = pp.world - 1;
    return pp.slab_kb > 0 ? kb / pp.slab_kb : 0;
  }

  // Producer thread, before the TMA loads of k block kb (of kb_end) of A rows [m0, m0 + rows):
  // waits (bounded) for kb's slab of every peer chunk those rows touch (slab 0, the whole chunk,
  // without slabs), then looks ahead: returns the first block of the first later slab not yet
  // landed in every one of them (kb_end if all have), so one wait and one fence cover every slab
  // already there. On a failed wait the record is written (and the group aborted, so later waits
  // return at once); the tile then reads whatever is there and the host raises at the next
  // raise_if_failed / synchronize.
  static RAWFLUX_DEVICE i32 wait_slabs(const Params& pp, i32 m0, i32 rows, i32 kb, i32 kb_end) {
    if (rows <= 0) return kb_end;
    i32 first, last;
    const i32 slab = span(pp, m0, rows, kb, first, last);
    // this call's epoch (ag_local_kernel wrote it earlier in stream order)
    const u32 epoch = *reinterpret_cast<const u32*>(pp.epoch);
    const u32* ready = reinterpret_cast<const u32*>(pp.ready);
    i32 end = pp.slab_kb > 0 ? kb_end : 0;  // the lookahead's bound (no lookahead without slabs)
    bool waited = false;
    for (i32 q = first; q <= last; ++q) {
      if (q == pp.rank) continue;
      waited = true;
      // acquire (sys), bounded: the slab's bytes, written by the copy engine or peer SMs before
      // the flag, are visible once it holds this call's epoch. Five quarters of the group's
      // timeout: a rank that never made the call is then named by a copy's arrival wait, not by
      // a chunk a waiting peer holds back.
      wait_flag_geq_lean(ready + ag_ready_index(q, slab), epoch, reinterpret_cast<const GroupCtrl*>(pp.group_ctrl), kOpAgGemm, q,
                         q, 5);
      if ((slab + 1) * pp.slab_kb >= end) continue;
      // acquire (sys): every slab flag of chunk q in two loads (ready[q] is 32-byte aligned); a
      // later slab seen landed is visible as its own wait would make it
      const uint4 lo = ld_acquire_sys_v4_u32(ready + ag_ready_index(q, 0));
      const uint4 hi = ld_acquire_sys_v4_u32(ready + ag_ready_index(q, 4));
      const u32 landed = (u32)seq_geq(lo.x, epoch) | (u32)seq_geq(lo.y, epoch) << 1 | (u32)seq_geq(lo.z, epoch) << 2 |
                         (u32)seq_geq(lo.w, epoch) << 3 | (u32)seq_geq(hi.x, epoch) << 4 | (u32)seq_geq(hi.y, epoch) << 5 |
                         (u32)seq_geq(hi.z, epoch) << 6 | (u32)seq_geq(hi.w, epoch) << 7;
      // the first slab after `slab` not landed (bit 8 and up: past the last slab)
      const i32 gap = __ffs(~(landed | ((1u << (slab + 1)) - 1u))) - 1;
      end = min(end, gap * pp.slab_kb);
    }
    // proxy fence: the TMA loads that follow (async proxy) must see the rows acquired above,
    // which reached memory through the generic proxy (peer SM stores / copy engine)
    if (waited) fence_proxy_async_global();
    return waited && pp.slab_kb > 0 ? end : kb_end;
  }

  // B first: a unit whose rows touch a peer chunk whose slab of kb has not landed yet (a relaxed
  // peek; wait_slabs acquires) may have B of kb's slab loaded before the wait. At small m every
  // tile spans peer rows and the GEMM is bound by reading B, so the wait hides behind B's loads.
  static constexpr bool kBFirst = true;
  static RAWFLUX_DEVICE i32 b_first(const Params& pp, i32 m0, i32 rows, i32 kb, i32 kb_end) {
    if (rows <= 0 || pp.b_first == 0) return 0;
    i32 first, last;
    const i32 slab = span(pp, m0, rows, kb, first, last);
    const u32 epoch = *reinterpret_cast<const u32*>(pp.epoch);
    const u32* ready = reinterpret_cast<const u32*>(pp.ready);
    bool pending = false;
    for (i32 q = first; q <= last; ++q) {
      if (q != pp.rank && !seq_geq(ld_relaxed_sys_u32(ready + ag_ready_index(q, slab)), epoch)) pending = true;
    }
    if (!pending) return 0;
    return (pp.slab_kb > 0 ? min(kb_end, (slab + 1) * pp.slab_kb) : kb_end) - kb;
  }

  // Nothing per unit: wait_slabs waits, for slab 0 (the whole chunk without slabs) and on.
  static RAWFLUX_DEVICE void wait(const Params&, const GemmParams&, i32, i32, i32) {}
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

// A (rows x row_vecs) block of 16-byte vectors, rows src_pitch / dst_pitch bytes apart. Packed
// blocks take the flat path; a pitched one (a strided shard, a k-slab) is walked as one flat index
// over its vectors too, so that narrow rows keep every thread busy (u32: a block holds < 2^32 vectors).
template <bool kSrcReadOnly>
RAWFLUX_DEVICE void copy_rows(u8* dst, i64 dst_pitch, const u8* src, i64 src_pitch, i32 rows, i32 row_vecs, i32 part, i32 parts) {
  const i64 row_bytes = (i64)row_vecs * 16;
  if (src_pitch == row_bytes && dst_pitch == row_bytes) {
    copy_flat<kSrcReadOnly>(dst, src, (i64)rows * row_vecs, part, parts);
    return;
  }
  const u32 vecs = (u32)rows * (u32)row_vecs, cols = (u32)row_vecs;
  const u32 stride = (u32)parts * blockDim.x;
  auto src_at = [&](u32 i) { const u32 r = i / cols; return src + (i64)r * src_pitch + (i64)(i - r * cols) * 16; };
  auto dst_at = [&](u32 i) { const u32 r = i / cols; return dst + (i64)r * dst_pitch + (i64)(i - r * cols) * 16; };
  u32 i = (u32)part * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < vecs; i += kUnroll * stride) {
    V4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = kSrcReadOnly ? ld_nc_v4(src_at(i + u * stride)) : ld_v4(src_at(i + u * stride));
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) st_v4(dst_at(i + u * stride), v[u]);
  }
  for (; i < vecs; i += stride) st_v4(dst_at(i), kSrcReadOnly ? ld_nc_v4(src_at(i)) : ld_v4(src_at(i)));
}

}  // namespace ag

// ------------------------------------------------------------------------------------------
// the call's start: epoch, call record, own rows, arrival (one launch, first of the call)

enum : u32 {
  kAgArriveLate = 1,  // announce the call after the own rows are in place (pull: peers read them)
  kAgGate = 2,        // the last CTA waits for every peer's arrival and checks its record (the copy-engine copies follow)
};

struct AgLocalArgs {
  u64 group_ctrl;  // const GroupCtrl*
  u64 src;         // this rank's shard (m_local rows, pitch src_pitch bytes)
  u64 dst;         // own gathered buffer, rows [rank * m_local, ...) (packed rows)
  u64 sync;        // this rank's sync buffer
  u64 sync_peers;  // u64[world]: every rank's sync buffer as mapped here
  i64 src_pitch;   // bytes
  i32 m_local;
  i32 row_vecs;    // 16-byte vectors per row (k * element bytes / 16)
  u32 flags;       // kAgArriveLate | kAgGate
  i32 head;        // own rows copied: [0, head) and [tail, m_local), the edge rows (AgWait::own_tile);
  i32 tail;        // head = tail = m_local: all of them
  i32 pad;
};

// One warp: tell every peer that this rank has started call e (its sync buffer's arrive[rank]),
// lane q for peers q, q + 32, ...: side by side, a call pays one release per 32 peers, not W - 1.
RAWFLUX_DEVICE void ag_arrive(const AgLocalArgs& a, i32 lane, i32 rank, i32 world, u32 e) {
  const u64* sync_peers = reinterpret_cast<const u64*>(a.sync_peers);
  for (i32 q = lane; q < world; q += 32) {
    // release (sys): this rank's own rows, counted before (kAgArriveLate), reach the peer before its
    // acquire of the arrival; without it the store orders only what stream order already ended
    // (this rank's GEMM of the previous call, the last reader of the rows peers write)
    if (q != rank) st_release_sys_u32(ag_word(sync_peers[q], kAgArriveOffset) + rank, e);
  }
}

RAWFLUX_DEVICE void ag_local_body(const AgLocalArgs& a, const CallRecord& rec) {
  const GroupCtrl* g = reinterpret_cast<const GroupCtrl*>(a.group_ctrl);
  const i32 rank = g->rank, world = g->world;
  const i32 lane = (i32)(threadIdx.x % 32);
  u32* epoch = ag_word(a.sync, kAgEpochOffset);
  if (blockIdx.x == 0 && threadIdx.x < 32) {
    // The op's epoch: lane 0 is its only writer, and every reader of the previous value (the
    // last call's kernels and copies) is earlier in stream order.
    u32 e = 0;
    if (lane == 0) {
      e = *epoch + 1;
      *epoch = e;
    }
    e = __shfl_sync(0xffffffffu, e, 0);
    // lane q pushes the record into ranks q, q + 32, ... (its own slot too: the record checks read it)
    const u64* sync_peers = reinterpret_cast<const u64*>(a.sync_peers);
    for (i32 q = lane; q < world; q += 32) record_push(ag_record(sync_peers[q], e & 1u, rank), e, rec.w);
    if (!(a.flags & kAgArriveLate)) ag_arrive(a, lane, rank, world, e);
  }
  // the own rows a tile shares with a peer's (every own row where the GEMM reads none in place)
  const i64 row_bytes = (i64)a.row_vecs * 16;
  u8* dst = reinterpret_cast<u8*>(a.dst);
  const u8* src = reinterpret_cast<const u8*>(a.src);
  ag::copy_rows<true>(dst, row_bytes, src, a.src_pitch, a.head, a.row_vecs, blockIdx.x, gridDim.x);
  if (a.tail < a.m_local) {
    ag::copy_rows<true>(dst + a.tail * row_bytes, row_bytes, src + a.tail * a.src_pitch, a.src_pitch, a.m_local - a.tail, a.row_vecs, blockIdx.x,
                        gridDim.x);
  }
  if (a.flags == 0) return;
  __syncthreads();  // joins the CTA: every thread's rows precede thread 0's fence
  if (threadIdx.x >= 32) return;
  bool last = false;
  if (lane == 0) {
    // fence (sys) + count = release: this CTA's rows are visible (to the peers that pull them) before it is counted
    fence_acq_rel_sys();
    u32* done = ag_word(a.sync, kAgLocalDoneOffset);
    last = atomicAdd(done, 1u) == gridDim.x - 1;
    if (last) {
      *done = 0u;  // every CTA is counted: zero for the next launch
      // fence (sys) = acquire of the other CTAs' counted rows and of CTA 0's epoch
      fence_acq_rel_sys();
    }
  }
  if (!__shfl_sync(0xffffffffu, (int)last, 0)) return;
  __syncwarp();  // joins the warp: lane 0's acquire above precedes every lane's release in ag_arrive
  const u32 e = ld_volatile_u32(epoch);
  if (a.flags & kAgArriveLate) ag_arrive(a, lane, rank, world, e);
  if (!(a.flags & kAgGate)) return;
  // lane q gates on peers q, q + 32, ... side by side, and compares each one's record of the call
  // with this rank's (CTA 0 wrote it, acquired above) before any copy of the call moves data
  const WaitCtx ctx = make_wait_ctx(g, kOpAgGemm, e);
  const u32* arrive = ag_word(a.sync, kAgArriveOffset);
  const u32* mine = ag_record(a.sync, e & 1u, rank);
  for (i32 q = lane; q < world; q += 32) {
    if (q == rank) continue;
    // acquire (sys): peer q has started call e, so its GEMM of e - 1 has ended: the copies that
    // follow this kernel may write into its gathered buffer (or read its own rows, pull)
    if (!wait_flag_geq(arrive + q, e, ctx, q, -1)) break;
    if (!record_check_wide(ag_record(a.sync, e & 1u, q), e, mine, ctx, q)) break;
  }
}

// One CTA, blockDim.x >= world: thread q compares peer q's record of this call with this rank's.
RAWFLUX_DEVICE void ag_check_records(const GroupCtrl* g, u64 sync, u32 e) {
  const i32 q = threadIdx.x;
  if (q >= g->world || q == g->rank) return;
  const WaitCtx ctx = make_wait_ctx(g, kOpAgGemm, e);
  // this rank's own record, written by ag_local_kernel earlier in stream order
  const u32* mine = ag_record(sync, e & 1u, g->rank);
  record_check(ag_record(sync, e & 1u, q), e, mine, ctx, q);
}

// ------------------------------------------------------------------------------------------
// SM copy path (after ag_local_kernel; waits only for each peer's arrival)
//
// The GEMM spins on the flags this kernel sets, so the copy CTAs must be resident before the GEMM
// can take the SMs. Both go on one stream, the GEMM launched as this kernel's programmatic
// dependent: it starts only once every copy CTA is running (griddep_launch_dependents below).
// Leaving SMs free was not enough where processes share a GPU (MPS, the emulated node,
// 2026-11-29): a copy kernel on a side stream got no SM at all while the GEMMs spun. Also, no CTA
// owns a fixed share: each (slab, chunk) block is cut into parts, CTAs claim parts in block order
// (slab-major: slab 0 of every chunk, then slab 1, ...) from one counter, and whoever finishes a
// block's last part sets its flag.

enum : int { kAgPush = 0, kAgPull = 1 };
enum : int { kPartsPerCta = 4 };  // parts per chunk ~ kPartsPerCta x CTAs (ag_block_parts): claims balance the load

// Parts per (slab, chunk) block: kPartsPerCta x CTAs per chunk, spread over its slabs, and at
// least one per CTA.
RAWFLUX_DEVICE i32 ag_block_parts(i32 ctas, i32 slabs) { return max(ctas, kPartsPerCta * ctas / slabs); }

struct AgCopyArgs {
  u64 group_ctrl;   // const GroupCtrl*
  u64 src;          // push: this rank's shard; pull: unused
  u64 gath_peers;   // u64[world]: every rank's gathered buffer as mapped here
  u64 sync;         // this rank's sync buffer (epoch, arrivals, records)
  u64 sync_peers;   // u64[world]: every rank's sync buffer as mapped here (ready flags)
  u64 counters;     // u32[kAgCopyCounters], zero between launches
  i64 src_pitch;    // push: bytes between rows of src
  i32 m_local;
  i32 row_vecs;
  i32 mode;         // kAgPush / kAgPull
  i32 slabs;        // k-slabs per chunk (1: whole chunks); divides row_vecs
};

RAWFLUX_DEVICE void ag_copy_body(const AgCopyArgs& a) {
  const GroupCtrl* g = reinterpret_cast<const GroupCtrl*>(a.group_ctrl);
  const i32 rank = g->rank, world = g->world;
  const u64* gath = reinterpret_cast<const u64*>(a.gath_peers);
  const u64* sync_peers = reinterpret_cast<const u64*>(a.sync_peers);
  u32* counters = reinterpret_cast<u32*>(a.counters);
  u32* next_part = counters;
  u32* exits = counters + kAgCopyExits;
  const i64 row_bytes = (i64)a.row_vecs * 16;
  const i64 chunk_bytes = (i64)a.m_local * row_bytes;
  const i32 slab_vecs = a.row_vecs / a.slabs;
  const i32 parts = ag_block_parts((i32)gridDim.x, a.slabs);
  const i32 total = a.slabs * (world - 1) * parts;
  __shared__ u32 s_epoch;
  __shared__ i32 s_claim;
  __shared__ i32 s_gated;  // the step whose peer this CTA saw arrive last (0: none yet)
  __shared__ u32 s_go;     // that peer arrived (its wait did not fail)
  // this CTA is resident: once all are, the GEMM (this kernel's programmatic dependent) may start
  griddep_launch_dependents();
  if (threadIdx.x == 0) {
    s_epoch = *ag_word(a.sync, kAgEpochOffset);  // this call's epoch (ag_local_kernel, earlier in stream order)
    s_gated = 0;
  }
  for (;;) {
    if (threadIdx.x == 0) {
      const i32 claim = (i32)atomicAdd(next_part, 1u);
      s_claim = claim;
      const i32 step = 1 + (claim / parts) % (world - 1);
      if (claim < total && step != s_gated) {
        // Push writes into rank - step's gathered buffer: that peer's GEMM of the previous call
        // must have ended; pull reads rank + step's own rows: they must be in place.
        const i32 q = a.mode == kAgPush ? (rank - step + world) % world : (rank + step) % world;
        const WaitCtx ctx = make_wait_ctx(g, kOpAgGemm, s_epoch);
        // acquire (sys): the peer's arrival at this call, before this CTA's stores (the barrier below orders the other threads')
        s_go = wait_flag_geq(ag_word(a.sync, kAgArriveOffset) + q, s_epoch, ctx, q, -1) ? 1u : 0u;
        s_gated = step;
      }
    }
    __syncthreads();
    const i32 claim = s_claim;
    const u32 epoch = s_epoch;
    const bool go = s_go != 0u;
    __syncthreads();  // every thread has read s_claim before thread 0 claims again
    if (claim >= total) break;
    const i32 block = claim / parts, part = claim % parts;  // block = slab x (world - 1) + step - 1
    const i32 slab = block / (world - 1), step = 1 + block % (world - 1);
    const i64 col = (i64)slab * slab_vecs * 16;  // the slab's first byte within a row
    u32* flag;
    if (a.mode == kAgPush) {
      // Step s writes to rank - s: a permutation of the ranks, so no two ranks write one peer at
      // once, and every rank receives chunk rank + 1 first (the GEMM visits rank, rank + 1, ...).
      const i32 q = (rank - step + world) % world;
      u8* dst = reinterpret_cast<u8*>(gath[q]) + (i64)rank * chunk_bytes + col;
      flag = ag_word(sync_peers[q], kAgReadyOffset) + ag_ready_index(rank, slab);
      if (go)
        ag::copy_rows<true>(dst, row_bytes, reinterpret_cast<const u8*>(a.src) + col, a.src_pitch, a.m_local, slab_vecs, part, parts);
    } else {
      // Step s reads from rank + s (a permutation too): chunk rank + 1 lands first.
      const i32 q = (rank + step) % world;
      u8* dst = reinterpret_cast<u8*>(gath[rank]) + (i64)q * chunk_bytes + col;
      const u8* src = reinterpret_cast<const u8*>(gath[q]) + (i64)q * chunk_bytes + col;
      flag = ag_word(a.sync, kAgReadyOffset) + ag_ready_index(q, slab);
      if (go) ag::copy_rows<false>(dst, row_bytes, src, row_bytes, a.m_local, slab_vecs, part, parts);
    }
    __syncthreads();  // joins the CTA: every thread's stores of this part precede thread 0's fence
    if (threadIdx.x == 0) {
      // fence (sys) + count = release: this part of the block is visible (to the peer that will
      // read it) before it is counted
      fence_acq_rel_sys();
      u32* done = counters + 1 + block;
      if (atomicAdd(done, 1u) == (u32)parts - 1) {
        *done = 0;  // every part of this block is counted: zero for the next launch
        // fence (sys) = acquire of the other CTAs' counted parts before the flag is released
        fence_acq_rel_sys();
        // release (sys): the whole block is visible before the reader's acquire of the flag (a
        // peer that never arrived gets no flag: the group is aborted and its waits give up)
        if (go) st_release_sys_u32(flag, epoch);
      }
    }
  }
  __shared__ u32 s_last;
  if (threadIdx.x == 0) s_last = atomicAdd(exits, 1u) == gridDim.x - 1 ? 1u : 0u;
  __syncthreads();
  if (s_last == 0u) return;
  if (threadIdx.x == 0) {
    // the last CTA out: nobody claims any more in this launch, zero both for the next one
    *next_part = 0;
    *exits = 0;
  }
  ag_check_records(g, a.sync, s_epoch);  // every peer made this call (their records, pushed at their calls' start)
}

}  // namespace rawflux
