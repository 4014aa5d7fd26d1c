// GEMM-ReduceScatter's epilogue policy (gemm_kernel's Epilogue argument, with RsSched's order):
// the reduction happens in the owner's own epilogue, one kernel per call.
//
// Remote tile (its rows belong to peer o): each consumer warpgroup packs its 64 x kWN fragment to
// 16 bits, stages it box by box in TmaStore's buffers and sends every box with a TMA bulk tensor
// store into o's receive slot (a 3-D tensor map per peer: n, m_loc rows, 2W slots slot_rows
// apart, so a store is clipped at the call's rows), then goes back to the main loop while the TMA
// engine drains the link. The warpgroup's flag on o is raised once its bulk group has completed, at the start of its
// next tile's epilogue (or at the kernel's end): the thread that issued the stores waits for
// them (wait_group 0, proxy fence) and posts the flag to the releaser (warp 2 of the producer
// warpgroup) with a CTA-scope release; the releaser raises it with the system-scope release, so
// the consumers never stall on that fence. fp32 partials (kRsPartF32) are stored from registers
// instead and posted the same way, one tile later, after a warpgroup barrier.
//
// Own tile: the fp32 accumulators stay in registers. The waits role (warp 1 of the producer
// warpgroup, walking the same tiles) checks each peer's call record once and waits (bounded) for
// the peers' flags of every own tile, normally long set (the tile runs a wave after its peers').
// The producer then loads the W - 1 partials through the stage ring after the tile's k blocks (a
// 64-column box a stage, kExtraBlocks), the consumers add them in the fixed order q = 0, 1, ...,
// W - 1 (the same bits on every run), add the bias, round once and store through TmaStore's boxes
// into out (m_loc, n). Before that the warpgroup raises its previous tile's flag, so that no wait
// holds back what a peer waits for.
//
// Per call: the epoch (this call's number, fused/rs_layout.cuh) is the sync buffer's counter + 1,
// read once per CTA before the kernel's start barrier; CTA 0 pushes this rank's call record into every peer at its start; the last CTA to finish
// advances the counter. A failed wait or a mismatched record is written to the group's Status
// (rawflux.dist raises CollectiveTimeout / CallMismatch) and the warpgroup stores nothing more of
// that tile; the kernel always runs to its end, so the epoch stays in step on every rank.
#pragma once
#include "rawflux/comm/signal.cuh"
#include "rawflux/comm/wait.cuh"
#include "rawflux/comm/call_record.cuh"
#include "rawflux/fused/rs_layout.cuh"
#include "rawflux/fused/rs_sched.cuh"
#include "rawflux/gemm/epilogue/fragment.cuh"
#include "rawflux/gemm/epilogue/tma_store.cuh"
#include "rawflux/ptx/global.cuh"

namespace rawflux {
namespace rs {

RAWFLUX_DEVICE void ld_v2_f32(u64 addr, float& a, float& b) {
  asm volatile("ld.global.v2.f32 {%0, %1}, [%2];\n" : "=f"(a), "=f"(b) : "l"(addr) : "memory");
}
RAWFLUX_DEVICE void st_v4f(u64 addr, float a, float b, float c, float d) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

// fp32 fragment rows (addresses of column 0; 0 = row skipped) -> 16-byte stores. Lane pairs
// (q, q ^ 1) of a quad trade halves so that each lane holds 4 consecutive columns.
template <int kRegs>
RAWFLUX_DEVICE void store_rows_f32(u64 row_a, u64 row_b, const float (&acc)[kRegs], i32 col0, i32 n, u32 tid) {
  const u32 q = tid % 4;
  const bool odd = (q & 1u) != 0;
#pragma unroll
  for (int j = 0; j < kRegs / 4; j += 2) {
    const float xa0 = acc[4 * j + 0], xa1 = acc[4 * j + 1], ya0 = acc[4 * j + 4], ya1 = acc[4 * j + 5];
    const float xb0 = acc[4 * j + 2], xb1 = acc[4 * j + 3], yb0 = acc[4 * j + 6], yb1 = acc[4 * j + 7];
    const float ra0 = __shfl_xor_sync(0xffffffffu, odd ? xa0 : ya0, 1);
    const float ra1 = __shfl_xor_sync(0xffffffffu, odd ? xa1 : ya1, 1);
    const float rb0 = __shfl_xor_sync(0xffffffffu, odd ? xb0 : yb0, 1);
    const float rb1 = __shfl_xor_sync(0xffffffffu, odd ? xb1 : yb1, 1);
    const i32 col = odd ? col0 + 8 * (j + 1) + 2 * (i32)(q - 1) : col0 + 8 * j + 2 * (i32)q;
    if (col < n) {  // n % 8 == 0: a 4-column chunk is all in or all out
      if (row_a) {
        if (odd) st_v4f(row_a + 4ull * (u64)col, ra0, ra1, ya0, ya1);
        else st_v4f(row_a + 4ull * (u64)col, xa0, xa1, ra0, ra1);
      }
      if (row_b) {
        if (odd) st_v4f(row_b + 4ull * (u64)col, rb0, rb1, yb0, yb1);
        else st_v4f(row_b + 4ull * (u64)col, xb0, xb1, rb0, rb1);
      }
    }
  }
}

}  // namespace rs

// kPart: kRsPartBF16 / kRsPartF16 (the output's type: the default) or kRsPartF32.
template <int kPart>
struct RsEpilogue {
  struct Params {
    TensorMap tmap_out;                // out (m_loc, n), 16-bit, boxes of 64 x 64, 128-byte swizzle
    TensorMap tmap_recv[kRsMaxWorld];  // 16-bit partials: rank o's receive buffer as (n, m_loc, 2W), boxes 64 x 64 x 1
    u64 recv;                          // this rank's receive buffer
    u64 sync;                          // this rank's sync buffer (rs_layout.cuh)
    u64 ctrl;                          // const GroupCtrl*: bounded waits and the error record
    u64 bias;                          // (n,) bias or 0
    u64 recv_peer[kRsMaxWorld];        // every rank's receive buffer, mapped here (fp32 partials)
    u64 sync_peer[kRsMaxWorld];        // every rank's sync buffer, mapped here (kernel parameters: no load in the epilogue)
    i32 bias_kind;                     // epi::kBias*
    i32 m_loc;                         // m / W
    i32 tiles_cap;                     // flags per (parity, source): owner-local tiles
    i32 rank;
    i32 world;
    i32 slot_rows;                     // rows between receive slots: the op's capacity max_m / W (fixed across calls)
    u32 record[kMetaWords];  // this call's record: word 0 is filled with the epoch, 1 the op id, then the fields
  };
  static constexpr bool kTileBarrier = false;
  static constexpr bool kDeferrable = false;
  // 16-bit partials reach an own tile through the stage ring (extra_*); fp32 ones from global
  // memory into registers (add_partials)
  static constexpr bool kExtraBlocks = kPart != kRsPartF32;
  static constexpr int kPartBytes = kPart == kRsPartF32 ? 4 : 2;

  template <class Cfg>
  static constexpr int bufs() {
    static_assert(Cfg::kStoreBufs > 0 && Cfg::kOut != kTypeF32, "GEMM-RS stages 16-bit boxes (its output, and 16-bit partials)");
    static_assert(kPart == kRsPartF32 || kPart == Cfg::kOut, "16-bit partials have the output's type");
    return Cfg::kStoreBufs;
  }
  // Shared state past the staging buffers (kStateBytes): per consumer warpgroup c at 16 c, the
  // address of the flag it still owes (u64, 0: none) and the own tiles it has reached (u32 at +8);
  // at 32, the own tiles whose peers the side role has seen ready (u32), at 36 whether a wait
  // failed, at 40 the side role's done mark, at 44 the producer's count of own tiles, at 48 the
  // call's epoch (init), at 52 the releaser's done mark; from kMailOffset, consumer c's mailbox
  // to the releaser at kMailBytes c: flags posted (u32), flags raised (u32 at +4), closed (u32 at
  // +8), kMailSlots flag addresses (u64 from +16).
  static constexpr int kMailOffset = 64;
  static constexpr int kMailSlots = 4;
  static constexpr int kMailBytes = 16 + 8 * kMailSlots;
  static constexpr int kStateBytes = kMailOffset + 2 * kMailBytes;
  template <class Cfg>
  static constexpr int state_offset() { return bufs<Cfg>() * TmaStore::kBoxBytes * Cfg::kConsumers; }
  template <class Cfg>
  static constexpr int scratch_bytes() {
    static_assert(Cfg::kConsumers <= 2 && state_offset<Cfg>() + kStateBytes <= kScratchFree<Cfg>, "staging buffers and state fit beside the ring");
    return state_offset<Cfg>() + kStateBytes;
  }

  static RAWFLUX_DEVICE u32 epoch(const Params& ep) {
    // Written only by this kernel's last CTA, after every CTA's reads (init, the waits role; finish), and by earlier calls.
    return ld_volatile_u32(reinterpret_cast<const u32*>(ep.sync + kRsEpochOffset)) + 1u;
  }
  // The epoch init kept in shared memory (read after the kernel's start barrier).
  static RAWFLUX_DEVICE u32 epoch_of(u32 state) { return ptx::ld_shared_u32(state + 48); }
  static RAWFLUX_DEVICE i64 role_timeout_ns(const Params& ep) { return rawflux::role_timeout_ns(reinterpret_cast<const GroupCtrl*>(ep.ctrl)); }

  template <class Cfg>
  static RAWFLUX_DEVICE void init(const Params& ep, u32 scratch) {
    const u32 state = scratch + state_offset<Cfg>();
#pragma unroll
    for (int i = 0; i < kStateBytes; i += 8) ptx::st_shared_u64(state + i, 0ull);
    ptx::st_shared_u32(state + 48, epoch(ep));  // every role's epoch: the kernel's start barrier orders it before their reads
    // the stores' descriptors into the TMA unit's cache before the first tile needs them
    ptx::tma_prefetch_desc(&ep.tmap_out);
    if constexpr (kPart != kRsPartF32) {
#pragma unroll 1
      for (i32 q = 0; q < ep.world; ++q) ptx::tma_prefetch_desc(&ep.tmap_recv[q]);
    }
  }

  // The side roles, warps 1..3 of the producer warpgroup: warp 1 waits for the peers (waits), warp
  // 2 raises this CTA's flags on them (releaser). The two never wait for each other, so a wait on a
  // peer never holds back a flag that peer waits for.
  template <class Cfg, class SchedT>
  static RAWFLUX_DEVICE void side(const Params& ep, const GemmParams& p, u32 scratch) {
    if (threadIdx.x / 32 == 2) releaser<Cfg>(ep, scratch);
    if (threadIdx.x / 32 == 1) waits<Cfg, SchedT>(ep, p, scratch);
  }

  // Warp 1: CTA 0 pushes this call's record into every peer; then the warp walks the CTA's tiles in
  // the consumers' order and, for each own tile, lane q waits for peer q's record (once) and flags,
  // and lane 0 counts the tile ready for the consumers.
  template <class Cfg, class SchedT>
  static RAWFLUX_DEVICE void waits(const Params& ep, const GemmParams& p, u32 scratch) {
    const u32 lane = threadIdx.x % 32;
    const i32 q = (i32)lane;
    const u32 e = epoch(ep);  // the word itself (finish waits for this role's done mark before advancing it)
    const bool peer = q < ep.world && q != ep.rank;
    if (blockIdx.x == 0 && peer) {
      record_push(reinterpret_cast<u32*>(ep.sync_peer[q] + rs_record_offset(e & 1u, ep.rank)), e, ep.record);
    }
    const u32 state = scratch + state_offset<Cfg>();
    constexpr bool kCluster = Cfg::kClusterSize > 1;
    SchedT sched(p, kCluster ? (i32)ptx::cluster_id_x() : (i32)blockIdx.x, kCluster ? (i32)ptx::cluster_ctarank() : 0);
    WorkTile w;
    u32 ready = 0;
    bool failed = false, checked = false;
    while (sched.next(p, w)) {
      const i32 lp = RsSchedT<Cfg>::rows_per_owner(p);
      if (w.tile_m / lp != ep.rank) continue;
      const i32 l = w.tile_m - ep.rank * lp;
      bool ok = true;
      if (!failed && peer) {
        if (!checked) ok = check_record(ep, e, q);
        checked = true;
#pragma unroll 1
        for (u32 c = 0; c < (u32)Cfg::kConsumers && ok; ++c) {
          if (l * Cfg::kBM + (i32)(c / Cfg::kWgN) * 64 < ep.m_loc) ok = wait_flag(ep, e, q, l * p.tiles_n + w.tile_n, c);
        }
      }
      failed = failed || !__all_sync(0xffffffffu, ok);
      ++ready;
      if (lane == 0) {
        if (failed) ptx::st_shared_u32(state + 36, 1u);
        // release (cta): the lanes' acquires of the peers' flags (joined by __all_sync) before the consumers' reads
        ptx::st_release_cta_shared_u32(state + 32, ready);
      }
    }
    // release (cta): this role's reads of the epoch word and the sync buffer before finish's count of the CTA done
    if (lane == 0) ptx::st_release_cta_shared_u32(state + 40, 1u);
  }

  // Warp 2, lane c < kConsumers: raises the flags consumer c posts, in order, until it closes its
  // mailbox (finish), then lane 0 marks the role done.
  template <class Cfg>
  static RAWFLUX_DEVICE void releaser(const Params& ep, u32 scratch) {
    const u32 lane = threadIdx.x % 32;
    const u32 state = scratch + state_offset<Cfg>();
    if (lane < (u32)Cfg::kConsumers) {
      const u32 box = state + kMailOffset + kMailBytes * lane;
      const u32 e = epoch_of(state);
      const i64 limit = role_timeout_ns(ep);
      u64 start = 0;
      for (u32 raised = 0;;) {
        // acquire (cta): closed, then the count: a mailbox seen closed shows its final count
        const u32 closed = ptx::ld_acquire_cta_shared_u32(box + 8);
        // acquire (cta): the consumer's wait for its stores (and the slot) before each post
        const u32 posted = ptx::ld_acquire_cta_shared_u32(box);
        if (raised == posted && closed != 0u) break;
        if (raised == posted) {
          const u64 now = ptx::globaltimer_ns();
          if (start == 0) start = now;
          if ((i64)(now - start) > limit) asm volatile("trap;");  // a consumer never closed its mailbox
          nanosleep_ns(64);
          continue;
        }
        start = 0;
        const u64 flag = ptx::ld_shared_u64(box + 16 + 8 * (raised % kMailSlots));
        signal_set(reinterpret_cast<u32*>(flag), e);  // release (sys): the partial the post published reaches its owner before the flag
        ++raised;
        ptx::st_release_cta_shared_u32(box + 4, raised);  // release (cta): this slot's read before the consumer writes it again
      }
    }
    __syncwarp();
    // release (cta): every flag raised before finish's count of the CTA done
    if (lane == 0) ptx::st_release_cta_shared_u32(state + 52, 1u);
  }

  // Lane q: peer q made the same call (its record, pushed at its kernel's start).
  static RAWFLUX_DEVICE bool check_record(const Params& ep, u32 e, i32 q) {
    const WaitCtx ctx = make_wait_ctx(reinterpret_cast<const GroupCtrl*>(ep.ctrl), kOpGemmRs, e);
    return rawflux::record_check(reinterpret_cast<const u32*>(ep.sync + rs_record_offset(e & 1u, q)), e, ep.record, ctx, q);
  }

  // Lane q: peer q delivered consumer warpgroup c's rows of owner-local tile `tile`.
  static RAWFLUX_DEVICE bool wait_flag(const Params& ep, u32 e, i32 q, i32 tile, u32 c) {
    const WaitCtx ctx = make_wait_ctx(reinterpret_cast<const GroupCtrl*>(ep.ctrl), kOpGemmRs, e);
    const u32* flag = reinterpret_cast<const u32*>(ep.sync + rs_flag_offset(e & 1u, ep.world, q, ep.tiles_cap, tile, c));
    return wait_flag_geq(flag, e, ctx, q, tile);  // acquire (sys): q's partial of these rows is visible after the flag
  }

  // Thread 0 of consumer warpgroup c: post the flag its previous remote tile still owes to the
  // releaser, once the tile's partial is written.
  template <class Cfg>
  static RAWFLUX_DEVICE void release_pending(const Params& ep, u32 state_base, u32 c) {
    const u32 state = state_base + 16 * c;
    const u64 flag = ptx::ld_shared_u64(state);
    if (flag == 0) return;
    if constexpr (kPart != kRsPartF32) {
      ptx::bulk_wait_all();             // the tile's boxes are written into the owner's slot, not only read from shared memory
      fence_proxy_async_global();  // orders those async-proxy writes before this thread's generic release below
    }
    const u32 box = state_base + kMailOffset + kMailBytes * c;
    const u32 posted = ptx::ld_shared_u32(box);  // written by this thread only
    // acquire (cta): the releaser's reads of the slots it has counted, before one is written again
    if (posted - ptx::ld_acquire_cta_shared_u32(box + 4) < (u32)kMailSlots) {
      ptx::st_shared_u64(box + 16 + 8 * (posted % kMailSlots), flag);
      ptx::st_release_cta_shared_u32(box, posted + 1u);  // release (cta): the partial's writes and the slot before the releaser's acquire
    } else {  // the releaser is kMailSlots flags behind: no wait here, this thread raises the flag
      signal_set(reinterpret_cast<u32*>(flag), epoch_of(state_base));  // release (sys): the partial reaches its owner before the flag
    }
    ptx::st_shared_u64(state, 0ull);
  }

  // ---- The own tile's partials through the stage ring (kExtraBlocks): after the tile's k blocks
  // the producer loads, for each peer q = 0, 1, ..., W - 1 but this rank (a round each) and each
  // 64-column box of the tile, q's partial of that box (BM rows, boxes of 64 rows) from the local
  // receive slot into the A part of a stage; the consumers add it to their accumulators in that
  // order (the same bits on every run) and hand the stage back. The ring keeps kStages boxes in
  // flight, where loads into registers kept a few (the consumers' 168 registers hold 96
  // accumulators beside them).

  template <class Cfg, class SchedT>
  static RAWFLUX_DEVICE i32 extra_rounds(const Params& ep, const GemmParams& p, i32 tile_m) {
    return tile_m / RsSchedT<Cfg>::rows_per_owner(p) == ep.rank ? ep.world - 1 : 0;
  }

  // Every consumer thread, after an own tile's k blocks and before its extra blocks: the flag of
  // the warpgroup's previous tile is raised first, so that no wait on peers ever holds back what a
  // peer waits for (the waits stay acyclic).
  template <class Cfg>
  static RAWFLUX_DEVICE void extra_begin(const Params& ep, u32 tid, u32 consumer, u32 scratch) {
    if (tid == 0) release_pending<Cfg>(ep, scratch + state_offset<Cfg>(), consumer);
  }

  // Producer thread, before an own tile's first extra block: the side role has seen its peers'
  // flags (the producer's count of own tiles at state + 44).
  template <class Cfg>
  static RAWFLUX_DEVICE void extra_wait(const Params& ep, const GemmParams& p, u32 scratch) {
    const u32 state = scratch + state_offset<Cfg>();
    const u32 seen = ptx::ld_shared_u32(state + 44) + 1u;
    ptx::st_shared_u32(state + 44, seen);
    ptx::wait_count_geq<false>(state + 32, seen, p.timeout_ns);  // acquire (cta): the side role's acquires of the peers' flags
    fence_proxy_async_global();  // the partials those flags published (generic order) before the TMA loads below read them
  }

  template <class Cfg, class SchedT>
  static RAWFLUX_DEVICE void extra_load(const Params& ep, const GemmParams& p, i32 tile_m, i32 tile_n, i32 round, i32 cb, u8* dst,
                                        u64* full, u32 scratch) {
    const i32 lp = RsSchedT<Cfg>::rows_per_owner(p);
    const i32 q = round < ep.rank ? round : round + 1;
    const i32 lrow0 = (tile_m - ep.rank * lp) * Cfg::kBM;
    const i32 slot = (i32)(ptx::ld_shared_u32(scratch + state_offset<Cfg>() + 48) & 1u) * ep.world + q;
    ptx::mbar_arrive_expect_tx(full, (u32)(Cfg::kBM * 128));  // BM rows of 64 16-bit columns (zero fill past the slot counts too)
#pragma unroll
    for (int h = 0; h < Cfg::kBM / 64; ++h) {
      ptx::tma_load_3d(dst + h * TmaStore::kBoxBytes, &ep.tmap_recv[ep.rank], full, tile_n * Cfg::kBN + 64 * cb, lrow0 + 64 * h, slot);
    }
  }

  // Consumer warpgroup (wm, wn): add CTA column box kCb of a stage, if it is in this warpgroup's
  // columns, to the accumulators (ldmatrix: the inverse of the staging's stmatrix).
  template <class Cfg, int kCb>
  static RAWFLUX_DEVICE void extra_add(float (&acc)[Cfg::kAccRegs], u32 stage_a, u32 wm, u32 wn, u32 tid) {
    constexpr int kWgBoxes = Cfg::kWN / 64;
    constexpr bool kF16 = kPart == kRsPartF16;
    const u32 warp = tid / 32, lane = tid % 32;
    const u32 half = (lane / 8) % 2, next_block = lane / 16;
    const u32 row = 16 * warp + 8 * half + lane % 8;
    const u32 box = stage_a + wm * TmaStore::kBoxBytes;
    static_for<0, kWgBoxes>([&](auto b) {
      constexpr int kB = decltype(b)::value;
      if ((i32)wn * kWgBoxes + kB == kCb) {
        u32 v[TmaStore::kBoxRegs];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const u32 unit = (u32)(2 * q) + next_block;
          ptx::ldmatrix_x4(box + row * 128 + ((unit ^ (row & 7u)) << 4), v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
        }
#pragma unroll
        for (int i = 0; i < TmaStore::kBoxRegs; ++i) {
          float lo, hi;
          ptx::unpack2<kF16>(v[i], lo, hi);
          acc[32 * kB + 2 * i] += lo;
          acc[32 * kB + 2 * i + 1] += hi;
        }
      }
    });
  }

  // fp32 partials (16-bit ones come through the ring): acc += the W - 1 peers' partials of this
  // thread's fragment from the local receive slots, q = 0, 1, ..., W - 1 for every element; four
  // n8 blocks at a time with the sources in a loop, which is what fits beside the accumulators.
  template <class Cfg>
  static RAWFLUX_DEVICE void add_partials(const Params& ep, const GemmParams& p, float (&acc)[Cfg::kAccRegs], i32 lrow0, i32 col0, u32 tid,
                                          u32 parity) {
    static_assert(kPart == kRsPartF32, "16-bit partials are added from the stage ring (extra_add)");
    constexpr int kBlocks = Cfg::kAccRegs / 4;  // n8 blocks of the fragment
    const u32 qd = tid % 4;
    const i32 ra = lrow0 + 16 * (i32)(tid / 32) + (i32)((tid % 32) / 4);
    const bool ok_a = ra < ep.m_loc, ok_b = ra + 8 < ep.m_loc;
    const u64 slot_bytes = (u64)ep.slot_rows * (u64)p.n * 4;
    const u64 row_a0 = ep.recv + (u64)rs_slot_row(parity, ep.world, 0, ep.slot_rows, ra, p.n) * 4;
    const u64 row_step = (u64)(8 * (i64)p.n) * 4;
    static_for<0, (kBlocks + 3) / 4>([&](auto step) {
      constexpr int j0 = 4 * decltype(step)::value;
#pragma unroll 1
      for (i32 q = 0; q < ep.world; ++q) {
        if (q == ep.rank) continue;
        const u64 row_a = row_a0 + (u64)q * slot_bytes;
#pragma unroll
        for (int j = j0; j < j0 + 4 && j < kBlocks; ++j) {
          const i32 col = col0 + 8 * j + 2 * (i32)qd;
          float x0 = 0.f, x1 = 0.f, y0 = 0.f, y1 = 0.f;
          if (col < p.n) {
            if (ok_a) rs::ld_v2_f32(row_a + 4ull * (u64)col, x0, x1);
            if (ok_b) rs::ld_v2_f32(row_a + row_step + 4ull * (u64)col, y0, y1);
          }
          acc[4 * j + 0] += x0;
          acc[4 * j + 1] += x1;
          acc[4 * j + 2] += y0;
          acc[4 * j + 3] += y1;
        }
      }
    });
  }

  // Stages packed box kBox in its buffer (TmaStore's layout and rotation) and returns its address;
  // every thread of the warpgroup calls it, boxes in order.
  template <class Cfg, int kBox>
  static RAWFLUX_DEVICE u32 stage_box(const u32 (&v)[TmaStore::kBoxRegs], u32 tid, u32 consumer, u32 scratch) {
    constexpr int kBufs = bufs<Cfg>();
    static_assert((Cfg::kWN / 64) % kBufs == 0, "whole rounds of buffers per fragment");
    const u32 bar = kWarpgroupBarrierBase + consumer;
    const u32 warp = tid / 32, lane = tid % 32;
    const u32 half = (lane / 8) % 2, next_block = lane / 16;
    const u32 row = 16 * warp + 8 * half + lane % 8;
    const u32 box_addr = scratch + consumer * kBufs * TmaStore::kBoxBytes + (u32)((kBox % kBufs) * TmaStore::kBoxBytes);
    if (tid == 0) ptx::bulk_wait_read<kBufs - 1>();  // the store that last read this buffer is done reading it
    ptx::named_barrier_sync(bar, 128);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const u32 unit = (u32)(2 * q) + next_block;
      ptx::stmatrix_x4(box_addr + row * 128 + ((unit ^ (row & 7u)) << 4), v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    }
    ptx::fence_proxy_async_smem();  // this thread's stmatrix writes before the TMA store reads them
    ptx::named_barrier_sync(bar, 128);
    return box_addr;
  }

  // The fragment's 64-column boxes, packed to 16 bits and staged in order; thread 0 hands each to
  // issue(shared address, its first column) for its TMA store and closes a bulk group per box.
  template <class Cfg, class Issue>
  static RAWFLUX_DEVICE void store_boxes(const float (&acc)[Cfg::kAccRegs], const TileCoord& tc, Issue&& issue) {
    static_for<0, Cfg::kWN / 64>([&](auto box) {
      constexpr int kBox = decltype(box)::value;
      u32 v[TmaStore::kBoxRegs];
      TmaStore::pack_box<Cfg, kBox>(acc, v);
      const u32 addr = stage_box<Cfg, kBox>(v, tc.tid, tc.consumer, tc.scratch);
      if (tc.tid == 0) {
        issue(addr, tc.col0 + 64 * kBox);
        ptx::bulk_commit();
      }
    });
  }

  template <class Cfg>
  static RAWFLUX_DEVICE void store(const Params& ep, const GemmParams& p, float (&acc)[Cfg::kAccRegs], const TileCoord& tc) {
    using Sched = RsSchedT<Cfg>;
    const i32 lp = Sched::rows_per_owner(p);
    const i32 owner = tc.tile_m / lp;
    const i32 l = tc.tile_m - owner * lp;  // the owner's tile row
    const i32 lrow0 = l * Cfg::kBM + (tc.row0 - tc.tile_m * Cfg::kBM);
    const u32 state_base = tc.scratch + state_offset<Cfg>();
    const u32 state = state_base + 16 * tc.consumer;
    const u32 parity = epoch_of(state_base) & 1u;
    const i32 tile = l * p.tiles_n + tc.tile_n;
    if constexpr (kPart == kRsPartF32) {
      // the previous tile's register stores of every thread before thread 0's release of its flag
      ptx::named_barrier_sync(kWarpgroupBarrierBase + tc.consumer, 128);
    }
    if (tc.tid == 0) release_pending<Cfg>(ep, state_base, tc.consumer);
    if (owner != ep.rank) {
      if (lrow0 >= ep.m_loc) return;  // padding of the owner's last cluster row: no rows, no flag
      if constexpr (kPart == kRsPartF32) {
        const u64 base = ep.recv_peer[owner];
        const i32 ra = lrow0 + 16 * (i32)(tc.tid / 32) + (i32)((tc.tid % 32) / 4);
        const u64 row_a = ra < ep.m_loc ? base + 4ull * (u64)rs_slot_row(parity, ep.world, ep.rank, ep.slot_rows, ra, p.n) : 0ull;
        const u64 row_b = ra + 8 < ep.m_loc ? base + 4ull * (u64)rs_slot_row(parity, ep.world, ep.rank, ep.slot_rows, ra + 8, p.n) : 0ull;
        rs::store_rows_f32(row_a, row_b, acc, tc.col0, p.n, tc.tid);
      } else {
        const TensorMap* map = &ep.tmap_recv[owner];
        const i32 slot = (i32)parity * ep.world + ep.rank;
        store_boxes<Cfg>(acc, tc, [&](u32 addr, i32 col) { ptx::tma_store_3d(map, addr, col, lrow0, slot); });
      }
      if (tc.tid == 0) {
        const u64 flag = ep.sync_peer[owner] +
                         rs_flag_offset(parity, ep.world, ep.rank, ep.tiles_cap, tile, tc.consumer);
        ptx::st_shared_u64(state, flag);
      }
      return;
    }
    // Own tile: thread 0 waits until the side role has seen its peers' flags.
    bool ok = true;
    if (tc.tid == 0) {
      const u32 seen = ptx::ld_shared_u32(state + 8) + 1u;
      ptx::st_shared_u32(state + 8, seen);
      ptx::wait_count_geq<false>(state_base + 32, seen, p.timeout_ns);  // acquire (cta): the side role's acquires of the flags
      ok = ptx::ld_shared_u32(state_base + 36) == 0u;
    }
    // joins thread 0: its acquire orders every thread's reads of the receive slots below
    if (ptx::named_barrier_or(kWarpgroupBarrierBase + tc.consumer, 128, !ok) || lrow0 >= ep.m_loc) return;  // any thread not ok
    if constexpr (!kExtraBlocks) add_partials<Cfg>(ep, p, acc, lrow0, tc.col0, tc.tid, parity);
    if (ep.bias_kind != epi::kBiasNone) {
      epi::add_bias<Cfg::kInF16>(acc, reinterpret_cast<const void*>(ep.bias), ep.bias_kind, tc.col0, p.n, tc.tid);
    }
    store_boxes<Cfg>(acc, tc, [&](u32 addr, i32 col) { ptx::tma_store_2d(&ep.tmap_out, addr, col, lrow0); });
  }

  template <class Cfg>
  static RAWFLUX_DEVICE void tile_done(const Params&, const GemmParams&, const TileCoord&) {}

  template <class Cfg>
  static RAWFLUX_DEVICE void finish(const Params& ep, u32 tid, u32 consumer, u32 scratch) {
    const u32 state = scratch + state_offset<Cfg>();
    const u32 e = epoch_of(state);
    if constexpr (kPart == kRsPartF32) {
      ptx::named_barrier_sync(kWarpgroupBarrierBase + consumer, 128);  // the last tile's register stores before its flag
    }
    if (tid == 0) {
      release_pending<Cfg>(ep, state, consumer);
      // release (cta): the last post before the mark that ends the releaser's loop
      ptx::st_release_cta_shared_u32(state + kMailOffset + kMailBytes * consumer + 8, 1u);
      ptx::bulk_wait_all();  // out's boxes written before the CTA ends
    }
    // every consumer thread of the CTA is past its last read of the slots
    ptx::named_barrier_sync(kConsumerBarrier, 128 * Cfg::kConsumers);
    if (consumer == 0 && tid == 0) {
      ptx::wait_count_geq<false>(state + 40, 1u, role_timeout_ns(ep));  // acquire (cta): the waits role is done with the epoch word
      ptx::wait_count_geq<false>(state + 52, 1u, role_timeout_ns(ep));  // acquire (cta): the releaser has raised every flag
      u32* done = reinterpret_cast<u32*>(ep.sync + kRsDoneOffset);
      // acq_rel: every CTA's reads of the epoch word happen before the last one advances it
      const u32 prev = ptx::atom_add_acq_rel_gpu(done, 1u);
      if (prev == gridDim.x - 1) {
        *done = 0u;
        *reinterpret_cast<volatile u32*>(ep.sync + kRsEpochOffset) = e;  // the next call (next kernel in stream order) is e + 1
      }
    }
  }
};

}  // namespace rawflux
