// GEMM-ReduceScatter's epilogue policy for the sm_90a engine (gemm_kernel's Epilogue argument):
// every finished tile of the partial product P_r = A_r B_r^T is written straight into the
// symmetric partial buffer of the rank(s) that own its rows (slot r of each), then flagged.
//
// Rows are routed one by one (owner = row / (m/W)), so a tile may straddle several owners (decode:
// m = 64, W = 8 gives 8 rows per rank inside one 64-row tile). After the stores, every consumer
// thread of the CTA meets at the engine's consumer barrier (kTileBarrier), then consumer 0's
// threads each raise the (source r, tile) flag on one owner the tile touches with st.release.sys:
// the barrier orders every thread's stores before the releasing thread's store, and the release
// is cumulative, so an owner that acquires the flag sees the whole tile.
//
// The engine visits tile rows from segment rank + 1 of W (GemmParams.seg_start / seg_count): each
// rank first computes the rows owned by its right-hand neighbour, then the next one..., and its
// own rows last, so at any moment each owner receives from about one source (no link is
// oversubscribed) and the own rows, which need no link at all, close the GEMM.
#pragma once
#include "rawflux/comm/signal.cuh"
#include "rawflux/fused/rs_layout.cuh"
#include "rawflux/gemm/epilogue/fragment.cuh"
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
  static constexpr bool kDeferrable = false;
  static constexpr int kPartBytes = kPart == kRsPartF32 ? 4 : 2;

  template <class Cfg>
  static RAWFLUX_DEVICE void store(const Params& ep, const GemmParams& p, float (&acc)[Cfg::kAccRegs], const TileCoord& tc) {
    const u64* parts = reinterpret_cast<const u64*>(ep.parts_peers);
    const i32 ra = tc.row0 + 16 * (i32)(tc.tid / 32) + (i32)((tc.tid % 32) / 4);
    const u64 row_a = rs::route_row(parts, ra, p.m, ep.m_loc, ep.rank, ep.ld, kPartBytes);
    const u64 row_b = rs::route_row(parts, ra + 8, p.m, ep.m_loc, ep.rank, ep.ld, kPartBytes);
    if constexpr (kPart == kRsPartF32) {
      rs::store_rows_f32(row_a, row_b, acc, tc.col0, p.n, tc.tid);
    } else {
      epi::store_rows_16<kPart == kRsPartF16>(reinterpret_cast<u16*>(row_a), reinterpret_cast<u16*>(row_b), row_a != 0, row_b != 0, acc,
                                               tc.col0, p.n, tc.tid % 4);
    }
  }

  // After the consumer barrier: every consumer thread's stores of this tile are issued.
  template <class Cfg>
  static RAWFLUX_DEVICE void tile_done(const Params& ep, const GemmParams& p, const TileCoord& tc) {
    if (tc.consumer != 0) return;
    if (tc.tile_m >= p.tiles_m || tc.tile_n >= p.tiles_n) return;  // the idle CTA of a cluster stored nothing
    const i32 r0 = tc.tile_m * Cfg::kBM;
    const i32 r1 = min(p.m, r0 + Cfg::kBM);
    const i32 first = r0 / ep.m_loc;
    const i32 owners = (r1 - 1) / ep.m_loc - first + 1;
    if ((i32)tc.tid >= owners) return;
    const u32 epoch = ld_volatile_u32(reinterpret_cast<const u32*>(ep.epoch));  // set by this call's barrier kernel
    const u64* flags = reinterpret_cast<const u64*>(ep.flags_peers);
    const i64 index = rs_flag_index(ep.rank, ep.tiles_cap, tc.tile_m, p.tiles_n, tc.tile_n);
    for (i32 o = first + (i32)tc.tid; o < first + owners; o += 128) {
      // release (sys): every consumer thread's partial stores of this tile (ordered before this
      // thread by the consumer barrier) reach owner o before it sees the flag
      signal_set(reinterpret_cast<u32*>(flags[o]) + index, epoch);
    }
  }

  template <class Cfg>
  static constexpr int scratch_bytes() { return 0; }

  template <class Cfg>
  static RAWFLUX_DEVICE void finish(const Params&, u32) {}
};

}  // namespace rawflux
