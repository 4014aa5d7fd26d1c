// The TMA loads of one k block into a stage of the ring: the producer's, and the consumer
// refill's (which may load for the peer CTA of a 2x1 pair).
#pragma once
#include "rawflux/gemm/config.cuh"
#include "rawflux/ptx/mbarrier.cuh"
#include "rawflux/ptx/tma.cuh"

namespace rawflux {

// How a tile's producer loads A's box (the producer's k loop): the main map, or the tail map of a
// ragged last tile row and of a tile wholly past m (GemmParams::a_tail_rows).
enum : int { kALoadFull = 0, kALoadTail = 1 };

// Whether the tile whose A rows start at m0 loads A through the tail map (kALoadTail): a cluster's
// idle CTA, or a ragged last row where m spans more than one box (within one box, a_box_rows
// already cut the main map's box to m).
template <class Cfg>
RAWFLUX_DEVICE bool a_tail_box(const GemmParams& p, i32 m0) {
  return Cfg::kClusterN == 1 && p.a_tail_rows > 0 && (p.m - m0 <= 0 || (p.m - m0 < Cfg::kBoxARows && p.m > Cfg::kBoxARows));
}

// Bytes a stage receives with A loaded as kAMode: the rows A's box(es) leave out are not counted.
template <class Cfg, int kAMode>
RAWFLUX_DEVICE u32 stage_tx(const GemmParams& p) {
  const i32 a_load = kAMode == kALoadTail ? p.a_tail_rows : p.a_box_rows > 0 ? p.a_box_rows : Cfg::kBoxARows;
  return (u32)(Cfg::kStageBytes - (Cfg::kBoxARows - a_load) * Cfg::kClusterN * Cfg::kRowBytes);
}

// The consumer refill of a 2x1 cluster (two CTAs along m share B): CTA `cta`'s loads of k block kb
// into its stage, issued from either CTA. Armed on that CTA's full barrier; A's box (row m0, that
// CTA's) goes to it alone, its half of B to both, as its producer would load them.
template <class Cfg, int kAMode>
RAWFLUX_DEVICE void load_kblock_for(const TensorMap& tmap_a, const TensorMap& tmap_a_tail, const TensorMap& tmap_b, u8* smem_a,
                                    u8* smem_b, u64* full, u32 stage, i32 kb, i32 m0, i32 n_tile0, u32 cta, u32 tx) {
  static_assert(Cfg::kClusterM == 2 && Cfg::kClusterN == 1, "a pair along m");
  ptx::mbar_arrive_expect_tx_cluster(ptx::smem_u32(&full[stage]), cta, tx);
  u8* sa = smem_a + stage * Cfg::kStageABytes;
  ptx::tma_load_2d_multicast(sa, kAMode == kALoadTail ? &tmap_a_tail : &tmap_a, &full[stage], kb * Cfg::kBK, m0, (u16)(1u << cta));
  const i32 b_slice = (i32)cta * Cfg::kBoxBRows;
  u8* sb = smem_b + stage * Cfg::kStageBBytes + b_slice * Cfg::kRowBytes;
  if constexpr (Cfg::kBLayout == kLayoutNK) {
    ptx::tma_load_2d_multicast(sb, &tmap_b, &full[stage], kb * Cfg::kBK, n_tile0 + b_slice, (u16)3u);
  } else {
#pragma unroll
    for (int ch = 0; ch < Cfg::kBChunks; ++ch) {
      ptx::tma_load_2d_multicast(sb + ch * Cfg::kChunkBytes, &tmap_b, &full[stage], n_tile0 + ch * 64, kb * Cfg::kBK + b_slice, (u16)3u);
    }
  }
}

// k block kb's TMA load of A into a stage (armed already): A's box at row m0 (this CTA's slice
// a_slice of a multicast A).
template <class Cfg, int kAMode>
RAWFLUX_DEVICE void load_a_block(const TensorMap& tmap_a, const TensorMap& tmap_a_tail, u8* smem_a, u64* full, u32 stage, i32 kb, i32 m0,
                                 i32 a_slice) {
  u8* sa = smem_a + stage * Cfg::kStageABytes + a_slice * Cfg::kRowBytes;
  if constexpr (Cfg::kClusterN > 1) {
    ptx::tma_load_2d_multicast(sa, &tmap_a, &full[stage], kb * Cfg::kBK, m0, (u16)((1u << Cfg::kClusterSize) - 1));
  } else if constexpr (kAMode == kALoadTail) {
    ptx::tma_load_2d(sa, &tmap_a_tail, &full[stage], kb * Cfg::kBK, m0);
  } else {
    ptx::tma_load_2d(sa, &tmap_a, &full[stage], kb * Cfg::kBK, m0);
  }
}

// k block kb's TMA loads of B into a stage (armed already): B's box at column n_tile0 (this CTA's
// slice b_slice of a multicast B).
template <class Cfg>
RAWFLUX_DEVICE void load_b_block(const TensorMap& tmap_b, u8* smem_b, u64* full, u32 stage, i32 kb, i32 n_tile0, i32 b_slice) {
  u8* sb = smem_b + stage * Cfg::kStageBBytes + b_slice * Cfg::kRowBytes;
  if constexpr (Cfg::kBLayout == kLayoutNK) {
    const i32 n0 = n_tile0 + b_slice;
    if constexpr (Cfg::kClusterM > 1) {
      ptx::tma_load_2d_multicast(sb, &tmap_b, &full[stage], kb * Cfg::kBK, n0, (u16)((1u << Cfg::kClusterSize) - 1));
    } else {
      ptx::tma_load_2d(sb, &tmap_b, &full[stage], kb * Cfg::kBK, n0);
    }
  } else {
    const i32 k0 = kb * Cfg::kBK + b_slice;
#pragma unroll
    for (int ch = 0; ch < Cfg::kBChunks; ++ch) {
      const i32 n0 = n_tile0 + ch * 64;
      if constexpr (Cfg::kClusterM > 1) {
        ptx::tma_load_2d_multicast(sb + ch * Cfg::kChunkBytes, &tmap_b, &full[stage], n0, k0, (u16)((1u << Cfg::kClusterSize) - 1));
      } else {
        ptx::tma_load_2d(sb + ch * Cfg::kChunkBytes, &tmap_b, &full[stage], n0, k0);
      }
    }
  }
}

// Arms full[stage] for tx bytes and issues k block kb's TMA loads into the stage: A's, then B's.
// The producer's loads, and the consumers' refill (Cfg::kRefill).
template <class Cfg, int kAMode>
RAWFLUX_DEVICE void load_kblock(const TensorMap& tmap_a, const TensorMap& tmap_a_tail, const TensorMap& tmap_b, u8* smem_a,
                                u8* smem_b, u64* full, u32 stage, i32 kb, i32 m0, i32 n_tile0, i32 a_slice, i32 b_slice, u32 tx) {
  ptx::mbar_arrive_expect_tx(&full[stage], tx);
  load_a_block<Cfg, kAMode>(tmap_a, tmap_a_tail, smem_a, full, stage, kb, m0, a_slice);
  load_b_block<Cfg>(tmap_b, smem_b, full, stage, kb, n_tile0, b_slice);
}

}  // namespace rawflux
