// GEMM + AllReduce's epilogue policy (gemm_kernel's Epilogue argument, with TileSched's order):
// one-shot, one kernel per call, every rank ends with the same bits of out (m, n).
//
// Every rank computes its partial of every tile (k is its share). A consumer warpgroup's 64 x kWN
// fragment, once its k blocks are done:
//   1. send: rounded to the partial type (the output's 16-bit type, or fp32), it goes to the
//      receive slot (parity, this rank) of every rank, this one included: 16-bit boxes staged once
//      in TmaStore's buffers and stored to each rank by TMA (a 3-D map per rank, clipped at the
//      call's m rows); fp32 from registers. Thread 0 then waits for the stores and raises the
//      fragment's flag on every peer;
//   2. wait: lane q of warp 1 waits (bounded) for peer q's flag of the same fragment, beside
//      thread 0's releases; the send itself waits for the side role (warp 1 of the producer
//      warpgroup) to have read the call's epoch and checked every peer's call record; every
//      rank walks the tiles in the same order and sends before it waits, so the waits are acyclic
//      whenever every CTA of every rank is resident (a persistent grid);
//   3. reduce: partial_0 + partial_1 + ... + partial_{W-1} in fp32 in that fixed order, all read
//      from the local slots (the own one too: the sum stays in the accumulators, no registers
//      beside them), the bias, one rounding, stored through TmaStore's boxes into out. Same
//      inputs, same order: the same bits on every rank.
// Meant for decode (m up to a few hundred rows): each rank sends (W - 1) m n partials and every
// tile's epilogue waits for its peers, where GEMM-RS + AllGather would pay two latencies.
//
// Buffers are GEMM-RS's layout (fused/rs_layout.cuh) with the whole m: slots of slot_rows = max_m
// rows per (parity, source), flags per (parity, source, tile = tile_m * tiles_n + tile_n, consumer).
// Calls are numbered by the sync buffer's epoch (read once per CTA by the side role; the last CTA
// to finish advances it). Slot safety: a rank writes parity p again only in call e + 2, which it cannot
// start before each peer's call e + 1 raised its flags, after that peer's kernel of call e (the
// last reader of slot p) ended. A failed wait or a mismatched record is written to the group's
// Status (CollectiveTimeout / CallMismatch) and the warpgroup stores nothing of that tile; the
// kernel always runs to its end, so the epoch stays in step on every rank.
#pragma once
#include "rawflux/comm/call_record.cuh"
#include "rawflux/comm/signal.cuh"
#include "rawflux/comm/wait.cuh"
#include "rawflux/fused/rs_epilogue.cuh"
#include "rawflux/fused/rs_layout.cuh"
#include "rawflux/gemm/epilogue/fragment.cuh"
#include "rawflux/gemm/epilogue/tma_store.cuh"
#include "rawflux/gemm/scheduler/tile.cuh"
#include "rawflux/ptx/global.cuh"

namespace rawflux {
namespace ar {

RAWFLUX_DEVICE u32 ld_u32(u64 addr) {
  u32 v;
  asm volatile("ld.global.b32 %0, [%1];\n" : "=r"(v) : "l"(addr) : "memory");
  return v;
}

}  // namespace ar

// kPart: kRsPartBF16 / kRsPartF16 (the output's type: the default) or kRsPartF32.
template <int kPart>
struct ArEpilogue {
  struct Params {
    TensorMap tmap_out;                // out (m, n), 16-bit, boxes of 64 x 64, 128-byte swizzle
    TensorMap tmap_recv[kRsMaxWorld];  // 16-bit partials: rank q's receive buffer as (n, m, 2W), boxes 64 x 64 x 1
    u64 recv;                          // this rank's receive buffer
    u64 sync;                          // this rank's sync buffer (rs_layout.cuh)
    u64 ctrl;                          // const GroupCtrl*: bounded waits and the error record
    u64 bias;                          // (n,) bias or 0
    u64 recv_peer[kRsMaxWorld];        // every rank's receive buffer, mapped here (fp32 partials)
    u64 sync_peer[kRsMaxWorld];        // every rank's sync buffer, mapped here
    i32 bias_kind;                     // epi::kBias*
    i32 m;                             // the call's rows
    i32 tiles_cap;                     // flags per (parity, source): tiles of the op's largest call
    i32 rank;
    i32 world;
    i32 slot_rows;                     // rows between receive slots: the op's capacity max_m (fixed across calls)
    u32 record[kMetaWords];            // this call's record: word 0 is filled with the epoch, 1 the op id, then the fields
  };
  static constexpr bool kTileBarrier = false;
  static constexpr bool kDeferrable = false;
  static constexpr bool kExtraBlocks = false;
  static constexpr int kPartBytes = kPart == kRsPartF32 ? 4 : 2;

  template <class Cfg>
  static constexpr int bufs() {
    static_assert(Cfg::kStoreBufs > 0 && Cfg::kOut != kTypeF32, "GEMM + AllReduce stages 16-bit boxes (its output, and 16-bit partials)");
    static_assert(kPart == kRsPartF32 || kPart == Cfg::kOut, "16-bit partials have the output's type");
    static_assert(Cfg::kClusterK == 1, "a k-split cluster computes one tile in two halves: not a GEMM + AllReduce tile");
    return Cfg::kStoreBufs;
  }
  // Shared state past the staging buffers: the call's epoch (u32 at 0, written by init), the side
  // role's verdict on the peers' call records (u32 at 4: 0 not yet, 1 all the same call, 2 not).
  static constexpr int kStateBytes = 64;
  template <class Cfg>
  static constexpr int state_offset() { return bufs<Cfg>() * TmaStore::kBoxBytes * Cfg::kConsumers; }
  template <class Cfg>
  static constexpr int scratch_bytes() {
    static_assert(Cfg::kConsumers <= 2 && state_offset<Cfg>() + kStateBytes <= kScratchFree<Cfg>, "staging buffers and state fit beside the ring");
    return state_offset<Cfg>() + kStateBytes;
  }

  static RAWFLUX_DEVICE u32 epoch_of(u32 scratch_state) { return ptx::ld_shared_u32(scratch_state); }

  template <class Cfg>
  static RAWFLUX_DEVICE void init(const Params& ep, u32 scratch) {
    const u32 state = scratch + state_offset<Cfg>();
#pragma unroll
    for (int i = 0; i < kStateBytes; i += 8) ptx::st_shared_u64(state + i, 0ull);
    ptx::tma_prefetch_desc(&ep.tmap_out);
    if constexpr (kPart != kRsPartF32) {
#pragma unroll 1
      for (i32 q = 0; q < ep.world; ++q) ptx::tma_prefetch_desc(&ep.tmap_recv[q]);
    }
  }

  // Warp 1 of the producer warpgroup, off the consumers' path: lane 0 reads the call's epoch
  // (the sync buffer's word + 1: off the kernel's start, where it would delay the first loads);
  // in CTA 0 lane q pushes this call's record into peer q; then in every CTA lane q checks peer
  // q's record (bounded), and lane 0 posts the epoch (state + 0) and the verdict for the
  // consumers (state + 4: 1 all made this call, 2 not).
  template <class Cfg, class SchedT>
  static RAWFLUX_DEVICE void side(const Params& ep, const GemmParams&, u32 scratch) {
    if (threadIdx.x / 32 != 1) return;
    const u32 state = scratch + state_offset<Cfg>();
    const i32 q = (i32)(threadIdx.x % 32);
    // Written only by the last CTA of the previous call, after every CTA's read here (finish
    // waits for this role's verdict before it counts the CTA done).
    u32 e = q == 0 ? ld_volatile_u32(reinterpret_cast<const u32*>(ep.sync + kRsEpochOffset)) + 1u : 0u;
    e = __shfl_sync(0xffffffffu, e, 0);
    const bool peer = q < ep.world && q != ep.rank;
    if (blockIdx.x == 0 && peer) {
      record_push(reinterpret_cast<u32*>(ep.sync_peer[q] + rs_record_offset(e & 1u, ep.rank)), e, ep.record);
    }
    bool ok = true;
    if (peer) {
      const WaitCtx ctx = make_wait_ctx(reinterpret_cast<const GroupCtrl*>(ep.ctrl), kOpGemmAr, e);
      ok = record_check(reinterpret_cast<const u32*>(ep.sync + rs_record_offset(e & 1u, q)), e, ep.record, ctx, q);
    }
    ok = __all_sync(0xffffffffu, ok);
    if (q == 0) {
      ptx::st_shared_u32(state, e);
      // release (cta): the epoch above and the lanes' acquires of the peers' records (joined by __all_sync) before the consumers' reads
      ptx::st_release_cta_shared_u32(state + 4, ok ? 1u : 2u);
    }
  }

  // The consumers' wait for the side role's verdict; returns it (1: every peer made this call).
  static RAWFLUX_DEVICE u32 verdict(u32 state, i64 timeout_ns) {
    ptx::wait_count_geq<false>(state + 4, 1u, timeout_ns);  // acquire (cta): the side role's epoch and its acquires of the records
    return ptx::ld_shared_u32(state + 4);
  }

  // The fragment's 64-column boxes packed to 16 bits, staged in TmaStore's buffers and handed to
  // issue(shared address, first column) by thread 0: GEMM-RS's staging (the same buffers at the
  // same place in the scratch), one bulk group per box.
  template <class Cfg, class Issue>
  static RAWFLUX_DEVICE void store_boxes(const float (&acc)[Cfg::kAccRegs], const TileCoord& tc, Issue&& issue) {
    static_assert(bufs<Cfg>() == RsEpilogue<kPart>::template bufs<Cfg>() &&
                  state_offset<Cfg>() == RsEpilogue<kPart>::template state_offset<Cfg>(), "GEMM-RS's staging layout");
    RsEpilogue<kPart>::template store_boxes<Cfg>(acc, tc, static_cast<Issue&&>(issue));
  }

  // The fp32 fragment into slot (parity, this rank) of rank q (a row past m is skipped).
  template <class Cfg>
  static RAWFLUX_DEVICE void send_f32(const Params& ep, const GemmParams& p, const float (&acc)[Cfg::kAccRegs], const TileCoord& tc,
                                      u32 parity, i32 q) {
    const i32 ra = tc.row0 + 16 * (i32)(tc.tid / 32) + (i32)((tc.tid % 32) / 4);
    const u64 base = ep.recv_peer[q];
    const u64 row_a = ra < ep.m ? base + 4ull * (u64)rs_slot_row(parity, ep.world, ep.rank, ep.slot_rows, ra, p.n) : 0ull;
    const u64 row_b = ra + 8 < ep.m ? base + 4ull * (u64)rs_slot_row(parity, ep.world, ep.rank, ep.slot_rows, ra + 8, p.n) : 0ull;
    rs::store_rows_f32(row_a, row_b, acc, tc.col0, p.n, tc.tid);  // GEMM-RS's fp32 register stores
  }

  // One source's values of n8 blocks [j0, j0 + kSpan) of this thread's fragment (rows ra, ra + 8),
  // from the local slot at row_a: packed 16-bit pairs, or fp32 pairs (two words each).
  template <int kSpan, int kWords>
  static RAWFLUX_DEVICE void load_span(u32 (&v)[kWords], u64 row_a, u64 row_step, i32 col, i32 n, bool ok_a, bool ok_b) {
    constexpr int kPer = kPart == kRsPartF32 ? 2 : 1;  // words per pair
#pragma unroll
    for (int j = 0; j < kSpan; ++j) {
      const i32 c = col + 8 * j;
      const u64 at = (u64)c * (2 * kPer);  // column c's byte offset in the row
#pragma unroll
      for (int w = 0; w < 2 * kPer; ++w) v[2 * kPer * j + w] = 0u;
      if (c < n) {
        if constexpr (kPer == 2) {
          if (ok_a) asm volatile("ld.global.v2.b32 {%0, %1}, [%2];\n" : "=r"(v[4 * j]), "=r"(v[4 * j + 1]) : "l"(row_a + at) : "memory");
          if (ok_b) asm volatile("ld.global.v2.b32 {%0, %1}, [%2];\n" : "=r"(v[4 * j + 2]), "=r"(v[4 * j + 3]) : "l"(row_a + row_step + at) : "memory");
        } else {
          if (ok_a) v[2 * j] = ar::ld_u32(row_a + at);
          if (ok_b) v[2 * j + 1] = ar::ld_u32(row_a + row_step + at);
        }
      }
    }
  }

  // acc[4 j0 ..] += one source's span, loaded by load_span (rows a then b, as the fragment holds them).
  template <int kSpan, int kWords, int kRegs>
  static RAWFLUX_DEVICE void add_span(float (&acc)[kRegs], int j0, const u32 (&v)[kWords]) {
#pragma unroll
    for (int j = 0; j < kSpan; ++j) {
      float x0, x1, y0, y1;
      if constexpr (kPart == kRsPartF32) {
        x0 = __uint_as_float(v[4 * j]), x1 = __uint_as_float(v[4 * j + 1]);
        y0 = __uint_as_float(v[4 * j + 2]), y1 = __uint_as_float(v[4 * j + 3]);
      } else {
        ptx::unpack2<kPart == kRsPartF16>(v[2 * j], x0, x1);
        ptx::unpack2<kPart == kRsPartF16>(v[2 * j + 1], y0, y1);
      }
      acc[4 * (j0 + j) + 0] += x0;
      acc[4 * (j0 + j) + 1] += x1;
      acc[4 * (j0 + j) + 2] += y0;
      acc[4 * (j0 + j) + 3] += y1;
    }
  }

  // acc = the W partials of this thread's fragment from the local receive slots (this rank's own
  // among them, as sent), summed in place in the order q = 0, 1, ..., W - 1. A span of n8 blocks
  // at a time, two sources' loads in flight before their adds (in order): the sum's latency is
  // a load round per two sources, and the accumulators need no registers beside them.
  template <class Cfg>
  static RAWFLUX_DEVICE void reduce(const Params& ep, const GemmParams& p, float (&acc)[Cfg::kAccRegs], const TileCoord& tc, u32 parity) {
    constexpr int kBlocks = Cfg::kAccRegs / 4;  // n8 blocks of the fragment
    // 8 blocks of 16-bit pairs in flight per source where the accumulators leave room (<= 64 of them), else 4
    constexpr int kSpan = kPart == kRsPartF32 || Cfg::kAccRegs > 64 ? 4 : (kBlocks >= 8 ? 8 : kBlocks);
    static_assert(kBlocks % kSpan == 0, "whole spans per fragment");
    constexpr int kWords = kSpan * (kPart == kRsPartF32 ? 4 : 2);
    const i32 ra = tc.row0 + 16 * (i32)(tc.tid / 32) + (i32)((tc.tid % 32) / 4);
    const bool ok_a = ra < ep.m, ok_b = ra + 8 < ep.m;
    const u64 slot_bytes = (u64)ep.slot_rows * (u64)p.n * kPartBytes;
    const u64 row_a0 = ep.recv + (u64)rs_slot_row(parity, ep.world, 0, ep.slot_rows, ra, p.n) * kPartBytes;
    const u64 row_step = (u64)(8 * (i64)p.n) * kPartBytes;
    static_for<0, kBlocks / kSpan>([&](auto step) {
      constexpr int j0 = kSpan * decltype(step)::value;
      const i32 col = tc.col0 + 8 * j0 + 2 * (i32)(tc.tid % 4);
#pragma unroll
      for (int i = 4 * j0; i < 4 * (j0 + kSpan); ++i) acc[i] = 0.f;
#pragma unroll 1
      for (i32 q = 0; q < ep.world; q += 2) {
        u32 v0[kWords], v1[kWords];
        load_span<kSpan>(v0, row_a0 + (u64)q * slot_bytes, row_step, col, p.n, ok_a, ok_b);
        const bool two = q + 1 < ep.world;
        load_span<kSpan>(v1, row_a0 + (u64)(q + 1) * slot_bytes, row_step, col, p.n, ok_a && two, ok_b && two);
        add_span<kSpan>(acc, j0, v0);
        if (two) add_span<kSpan>(acc, j0, v1);
      }
    });
  }

  template <class Cfg>
  static RAWFLUX_DEVICE void store(const Params& ep, const GemmParams& p, float (&acc)[Cfg::kAccRegs], const TileCoord& tc) {
    if (tc.row0 >= ep.m) return;  // a warpgroup wholly past the call's rows: nothing sent, nothing awaited, on every rank
    const u32 state = tc.scratch + state_offset<Cfg>();
    // a peer that made another call (or none): nothing sent, nothing read; the error is recorded
    if (verdict(state, p.timeout_ns) != 1u) return;
    const u32 e = epoch_of(state);
    const u32 parity = e & 1u;
    const i32 tile = tc.tile_m * p.tiles_n + tc.tile_n;
    const u32 bar = kWarpgroupBarrierBase + tc.consumer;
    // 1. send this rank's partial of the fragment to every peer, then raise its flags there
    if constexpr (kPart == kRsPartF32) {
#pragma unroll 1
      for (i32 q = 0; q < ep.world; ++q) send_f32<Cfg>(ep, p, acc, tc, parity, q);
      ptx::named_barrier_sync(bar, 128);  // every thread's stores of the partial before thread 0's releases of its flags
    } else {
      const i32 slot = (i32)parity * ep.world + ep.rank;
      store_boxes<Cfg>(acc, tc, [&](u32 addr, i32 col) {
#pragma unroll 1
        for (i32 q = 0; q < ep.world; ++q) ptx::tma_store_3d(&ep.tmap_recv[q], addr, col, tc.row0, slot);
      });
      if (tc.tid == 0) {
        ptx::bulk_wait_all();        // the boxes are written into the slots, not only read from shared memory
        fence_proxy_async_global();  // those async-proxy writes before this thread's generic releases (and, past the barrier below, the reads of the own slot)
      }
    }
    if (tc.tid == 0) {
      fence_acq_rel_sys();  // release (sys), once for every flag below: the partial reaches each peer before its flag
#pragma unroll 1
      for (i32 q = 0; q < ep.world; ++q) {
        if (q == ep.rank) continue;
        u32* flag = reinterpret_cast<u32*>(ep.sync_peer[q] + rs_flag_offset(parity, ep.world, ep.rank, ep.tiles_cap, tile, tc.consumer));
        st_relaxed_sys_u32(flag, e);  // the fence above makes this strong store a release
      }
    }
    // 2. lane q of warp 1 (beside thread 0's release above): peer q's partial of this fragment has arrived
    bool ok = true;
    if (tc.tid / 32 == 1) {
      const i32 q = (i32)(tc.tid % 32);
      if (q < ep.world && q != ep.rank) {
        const WaitCtx ctx = make_wait_ctx(reinterpret_cast<const GroupCtrl*>(ep.ctrl), kOpGemmAr, e);
        const u32* flag = reinterpret_cast<const u32*>(ep.sync + rs_flag_offset(parity, ep.world, q, ep.tiles_cap, tile, tc.consumer));
        ok = wait_flag_geq(flag, e, ctx, q, tile);  // acquire (sys): q's partial of these rows is visible after the flag
      }
      ok = __all_sync(0xffffffffu, ok);
    }
    // joins warp 1: its acquires order every thread's reads of the receive slots below
    if (ptx::named_barrier_or(bar, 128, !ok)) return;
    // 3. the fixed-order sum, the bias, one rounding, out
    reduce<Cfg>(ep, p, acc, tc, parity);
    if (ep.bias_kind != epi::kBiasNone) {
      epi::add_bias<Cfg::kInF16>(acc, reinterpret_cast<const void*>(ep.bias), ep.bias_kind, tc.col0, p.n, tc.tid);
    }
    store_boxes<Cfg>(acc, tc, [&](u32 addr, i32 col) { ptx::tma_store_2d(&ep.tmap_out, addr, col, tc.row0); });
  }

  template <class Cfg>
  static RAWFLUX_DEVICE void tile_done(const Params&, const GemmParams&, const TileCoord&) {}

  template <class Cfg>
  static RAWFLUX_DEVICE void finish(const Params& ep, u32 tid, u32 consumer, u32 scratch) {
    if (tid == 0) ptx::bulk_wait_all();  // out's boxes written (and the staging read) before the CTA ends
    // every consumer thread of the CTA is past its last read of the slots
    ptx::named_barrier_sync(kConsumerBarrier, 128 * Cfg::kConsumers);
    if (consumer == 0 && tid == 0) {
      verdict(scratch + state_offset<Cfg>(), role_timeout_ns(reinterpret_cast<const GroupCtrl*>(ep.ctrl)));  // the side role's read of the epoch word (and its epoch) before this CTA counts done
      const u32 e = epoch_of(scratch + state_offset<Cfg>());
      u32* done = reinterpret_cast<u32*>(ep.sync + kRsDoneOffset);
      // acq_rel: every CTA's read of the epoch word (its side role, waited for above) happens before the last one advances it
      const u32 prev = ptx::atom_add_acq_rel_gpu(done, 1u);
      if (prev == gridDim.x - 1) {
        *done = 0u;
        *reinterpret_cast<volatile u32*>(ep.sync + kRsEpochOffset) = e;  // the next call (next kernel in stream order) is e + 1
      }
    }
  }
};

}  // namespace rawflux
