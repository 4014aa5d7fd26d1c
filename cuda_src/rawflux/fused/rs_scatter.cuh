// GEMM-ReduceScatter's epilogue policy for the sm_90a engine (gemm_kernel's Epilogue argument):
// every finished tile of the partial product P_r = A_r B_r^T is written straight into the
// symmetric partial buffer of the rank(s) that own its rows (slot r of each), then flagged.
//
// Rows are routed one by one (owner = row / (m/W)), so a tile may straddle several owners (decode:
// m = 64, W = 8 gives 8 rows per rank inside one 64-row tile). Once a tile's rows are written
// (direct path: after the stores; bulk path: when its row copies completed, one tile later), every
// consumer thread of the CTA has met at the engine's consumer barrier (kTileBarrier) and consumer
// 0's threads each raise the (source r, tile) flag on one owner the tile touches with
// st.release.sys: the barrier orders every thread's writes before the releasing thread's store, and
// the release is cumulative, so an owner that acquires the flag sees the whole tile.
//
// The engine visits tile rows from segment rank + 1 of W (GemmParams.seg_start / seg_count): each
// rank first computes the rows owned by its right-hand neighbour, then the next one..., and its
// own rows last, so at any moment each owner receives from about one source (no link is
// oversubscribed) and the own rows, which need no link at all, close the GEMM.
#pragma once
#include "rawflux/comm/signal.cuh"
#include "rawflux/fused/rs_layout.cuh"
#include "rawflux/gemm/epilogue.cuh"
#include "rawflux/gemm/policies.cuh"

namespace rawflux {
namespace rs {

// Byte address of element (g, 0) of the partial in slot `src` of the buffer of the rank that owns
// global row g; 0 when g >= m (rows past the matrix are not stored).
RAWFLUX_DEVICE u64 route_row(const u64* parts, i32 g, i32 m, i32 m_loc, i32 src, i64 ld, int elem_bytes) {
  if (g >= m) return 0;
  const i32 owner = g / m_loc;
  const i32 local = g - owner * m_loc;
  return parts[owner] + (u64)(((i64)src * m_loc + local) * ld) * (u64)elem_bytes;
}

RAWFLUX_DEVICE void st_v4f(u64 addr, float a, float b, float c, float d) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

// fp32 fragment rows ra / rb (addresses of column 0; 0 = row skipped) -> 16-byte stores.
// Lane pairs (q, q^1) of a quad trade halves so that each lane holds 4 consecutive columns: the
// even lane of the pair block j's columns 2q..2q+3, the odd lane block j+1's 2(q-1)..2(q-1)+3.
template <int kRegs>
RAWFLUX_DEVICE void store_rows_f32(u64 row_a, u64 row_b, const float (&acc)[kRegs], i32 col0, i32 n, u32 tid) {
  const u32 q = tid % 4;
  const bool odd = (q & 1u) != 0;
#pragma unroll
  for (int j = 0; j < kRegs / 4; j += 2) {
    // row a: block j regs 4j+0..1, block j+1 regs 4j+4..5; row b: 4j+2..3 and 4j+6..7
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

// Epilogue policy. kPart: kRsPartF32 (default: the partial is rounded only once, in the reduce)
// or kRsPartBF16 / kRsPartF16 (half the bytes on the links; one extra rounding per partial).
//
// Two ways out of the registers:
//  * direct (fp32 partials, or no room for staging): every thread stores its fragment rows with
//    16-byte st.global; the tile's flags go up in tile_done, right after the stores. The stores
//    hold the consumer warps until the link takes them, so while the links drain a wave of tiles
//    (all CTAs finish their tiles together) no MMA runs: measured on two H200s, 2026-11-29,
//    0.4-0.6 ms of a 0.76 ms GEMM at n = k = 8192.
//  * bulk (16-bit partials, when shared memory holds both warpgroups' fragments): each
//    warpgroup writes its 64 x kWN fragment into padded staging rows, and threads 0..63 each hand
//    one row to the TMA engine (cp.async.bulk, to whichever rank owns that row), then the
//    warpgroup goes back to the main loop while the engine drains the rows over the link. The
//    tile's flags go up one tile later, when the next store() has waited for these copies anyway
//    (before it reuses the staging rows), or in finish() after the last tile: the flag never
//    precedes its data, and the wait costs nothing because a whole main loop ran in between.
template <int kPart>
struct ScatterStore {
  struct Params {
    u64 parts_peers;  // const u64[world]: every rank's partial buffer, mapped here
    u64 flags_peers;  // const u64[world]: every rank's flag buffer, mapped here
    u64 epoch;        // const u32*: this rank's barrier epoch word (read per tile: never baked in)
    i64 ld;           // n: row stride of a partial slot, in elements
    i32 m_loc;        // m / W: rows per owner
    i32 tiles_cap;    // flags per source slot on every owner
    i32 rank;         // this (source) rank
    i32 world;
  };
  static constexpr bool kTileBarrier = true;
  static constexpr int kPartBytes = kPart == kRsPartF32 ? 4 : 2;
  // Bulk path: a 128-byte header (the tile whose flags are pending: tile_m, tile_n), then per
  // consumer warpgroup 64 staging rows of kWN partial values, each padded by 16 bytes so that the
  // 8 rows of a warp's 16-byte writes fall in different banks.
  static constexpr int kHeaderBytes = 128;
  template <class Cfg>
  static constexpr int pitch() { return Cfg::kWN * kPartBytes + 16; }
  template <class Cfg>
  static constexpr int stage_bytes() { return kHeaderBytes + Cfg::kConsumers * 64 * pitch<Cfg>(); }
  template <class Cfg>
  static constexpr bool bulk() { return kPart != kRsPartF32 && kScratchFree<Cfg> >= stage_bytes<Cfg>(); }
  template <class Cfg>
  static constexpr int scratch_bytes() { return bulk<Cfg>() ? stage_bytes<Cfg>() : 0; }

  // Raise the (this source, tile) flag on every owner whose rows the tile holds: consumer 0's
  // threads, one owner each.
  static RAWFLUX_DEVICE void raise_flags(const Params& ep, const GemmParams& p, i32 bm, i32 tile_m, i32 tile_n, u32 tid) {
    const i32 r0 = tile_m * bm;
    const i32 r1 = min(p.m, r0 + bm);
    const i32 first = r0 / ep.m_loc;
    const i32 owners = (r1 - 1) / ep.m_loc - first + 1;
    if ((i32)tid >= owners) return;
    const u32 epoch = ld_volatile_u32(reinterpret_cast<const u32*>(ep.epoch));  // set by this call's barrier kernel
    const u64* flags = reinterpret_cast<const u64*>(ep.flags_peers);
    const i64 index = rs_flag_index(ep.rank, ep.tiles_cap, tile_m, p.tiles_n, tile_n);
    for (i32 o = first + (i32)tid; o < first + owners; o += 128) {
      // release (sys): the tile's partial rows (ordered before this thread by the consumer
      // barrier; the bulk rows also completed and proxy-fenced by their issuers) reach owner o
      // before it sees the flag
      signal_set(reinterpret_cast<u32*>(flags[o]) + index, epoch);
    }
  }

  template <class Cfg>
  static RAWFLUX_DEVICE void init(const Params&, u32 scratch, u32 tid, u32 consumer) {
    if constexpr (bulk<Cfg>()) {
      // No tile pending yet. Read by consumer 0 only after a consumer barrier (tile_done, finish).
      if (consumer == 0 && tid == 0) ptx::st_shared_u32(scratch, 0xffffffffu);
    }
  }

  template <class Cfg>
  static RAWFLUX_DEVICE void store(const Params& ep, const GemmParams& p, float (&acc)[Cfg::kAccRegs], const TileCoord& tc) {
    const u64* parts = reinterpret_cast<const u64*>(ep.parts_peers);
    if constexpr (!bulk<Cfg>()) {
      const i32 ra = tc.row0 + 16 * (i32)(tc.tid / 32) + (i32)((tc.tid % 32) / 4);
      const u64 row_a = rs::route_row(parts, ra, p.m, ep.m_loc, ep.rank, ep.ld, kPartBytes);
      const u64 row_b = rs::route_row(parts, ra + 8, p.m, ep.m_loc, ep.rank, ep.ld, kPartBytes);
      if constexpr (kPart == kRsPartF32) {
        rs::store_rows_f32(row_a, row_b, acc, tc.col0, p.n, tc.tid);
      } else {
        epi::store_rows_16<kPart == kRsPartF16>(reinterpret_cast<u16*>(row_a), reinterpret_cast<u16*>(row_b), row_a != 0, row_b != 0,
                                                 acc, tc.col0, p.n, tc.tid % 4);
      }
    } else {
      constexpr bool kF16 = kPart == kRsPartF16;
      constexpr int kPitch = pitch<Cfg>();
      constexpr int kBlocks = Cfg::kAccRegs / 4;  // n8 blocks of the fragment
      constexpr int kQuads = kBlocks / 4;
      const u32 bar = kWarpgroupBarrierBase + tc.consumer;
      const u32 rows = tc.scratch + kHeaderBytes + tc.consumer * 64 * kPitch;
      // 1. This warpgroup's row copies of its previous tile are complete (wait_group 0: written to
      //    their owners, not only read out of the staging rows), so the rows may be rewritten and
      //    that tile's flags may go up (tile_done, after the consumer barrier).
      if (tc.tid < 64) {
        ptx::bulk_wait_all();
        fence_proxy_async_global();  // orders the completed async-proxy row writes before the flag's release
      }
      ptx::named_barrier_sync(bar, 128);
      // 2. Fragment -> staging rows: after the quad transpose each lane holds one whole n8 block
      //    (16 bytes) of its rows a and a + 8.
      const u32 q = tc.tid % 4;
      const u32 ra = 16 * (tc.tid / 32) + (tc.tid % 32) / 4;
      const u32 row_a = rows + ra * kPitch, row_b = row_a + 8 * kPitch;
#pragma unroll
      for (int g = 0; g < kQuads; ++g) {
        u32 va[4], vb[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = 4 * (4 * g + i);
          va[i] = ptx::pack2<kF16>(acc[r + 0], acc[r + 1]);
          vb[i] = ptx::pack2<kF16>(acc[r + 2], acc[r + 3]);
        }
        epi::quad_transpose(va, q);
        epi::quad_transpose(vb, q);
        const u32 off = 16u * (u32)(4 * g + (int)q);
        ptx::st_shared_v4(row_a + off, va[0], va[1], va[2], va[3]);
        ptx::st_shared_v4(row_b + off, vb[0], vb[1], vb[2], vb[3]);
      }
#pragma unroll
      for (int j = kQuads * 4; j < kBlocks; ++j) {  // leftover n8 blocks (kWN % 32 == 16)
        const u32 off = 16u * (u32)j + 4u * q;
        ptx::st_shared_u32(row_a + off, ptx::pack2<kF16>(acc[4 * j + 0], acc[4 * j + 1]));
        ptx::st_shared_u32(row_b + off, ptx::pack2<kF16>(acc[4 * j + 2], acc[4 * j + 3]));
      }
      ptx::fence_proxy_async_smem();  // this thread's staging writes before the bulk copies read them
      ptx::named_barrier_sync(bar, 128);
      // 3. Thread t < 64 sends row t of the fragment to its owner (rows past m and columns past n
      //    stay behind; n % 8 == 0 keeps every copy a multiple of 16 bytes).
      if (tc.tid < 64) {
        const i32 cols = min(Cfg::kWN, p.n - tc.col0);
        const u64 dst = rs::route_row(parts, tc.row0 + (i32)tc.tid, p.m, ep.m_loc, ep.rank, ep.ld, kPartBytes);
        if (dst != 0 && cols > 0) {
          ptx::bulk_store_1d(dst + (u64)tc.col0 * kPartBytes, rows + tc.tid * kPitch, (u32)cols * kPartBytes);
        }
        ptx::bulk_commit();
      }
    }
  }

  // After the consumer barrier: every consumer thread's stores of this tile are issued.
  template <class Cfg>
  static RAWFLUX_DEVICE void tile_done(const Params& ep, const GemmParams& p, const TileCoord& tc) {
    if (tc.consumer != 0) return;
    if (tc.tile_m >= p.tiles_m || tc.tile_n >= p.tiles_n) return;  // the idle CTA of a cluster stored nothing
    if constexpr (!bulk<Cfg>()) {
      raise_flags(ep, p, Cfg::kBM, tc.tile_m, tc.tile_n, tc.tid);
    } else {
      // This tile's store() waited for the previous tile's row copies in both warpgroups (the
      // consumer barrier since orders that before here): the pending tile's flags go up now,
      // this tile becomes the pending one.
      const u32 pending = ptx::ld_shared_u32(tc.scratch);
      if (pending != 0xffffffffu) raise_flags(ep, p, Cfg::kBM, (i32)(pending >> 16), (i32)(pending & 0xffffu), tc.tid);
      ptx::named_barrier_sync(kWarpgroupBarrierBase + 0, 128);  // every reader of `pending` is done before it changes
      if (tc.tid == 0) ptx::st_shared_u32(tc.scratch, ((u32)tc.tile_m << 16) | (u32)tc.tile_n);
    }
  }

  template <class Cfg>
  static RAWFLUX_DEVICE void finish(const Params& ep, const GemmParams& p, u32 scratch, u32 tid, u32 consumer) {
    if constexpr (bulk<Cfg>()) {
      // The last tile's row copies: complete in both warpgroups, then its flags.
      if (tid < 64) {
        ptx::bulk_wait_all();
        fence_proxy_async_global();  // orders the completed async-proxy row writes before the flag's release
      }
      ptx::named_barrier_sync(kConsumerBarrier, 128 * Cfg::kConsumers);
      if (consumer == 0) {
        const u32 pending = ptx::ld_shared_u32(scratch);
        if (pending != 0xffffffffu) raise_flags(ep, p, Cfg::kBM, (i32)(pending >> 16), (i32)(pending & 0xffffu), tid);
      }
    }
  }
};

}  // namespace rawflux
