// The producer role of the GEMM engine: one thread of warpgroup 0 (40 registers; 56 under a
// k-slab prologue) walks the CTA's work units and fills the stage ring. Per unit it runs the
// prologue's wait (the fused AllGather's chunk flags; with k-slabs, before each slab's first
// block), then per k block waits for a free stage, arms its full barrier with the stage's byte
// count and issues the TMA loads of A and B (multicast to the cluster peer for the shared
// operand); a prologue with kBFirst has the first unit's first B blocks loaded before its wait.
// With the consumer refill (Cfg::kRefill) it loads only each unit's first kStages k blocks and
// waits on the stages' release counts instead of their empty barriers.
#pragma once
#include "rawflux/gemm/config.cuh"
#include "rawflux/gemm/load.cuh"
#include "rawflux/gemm/scheduler/tile.cuh"
#include "rawflux/ptx/mbarrier.cuh"

namespace rawflux {

// p by value: its fields are then values, not loads through a reference that the prologue's waits
// (asm with a memory clobber) would force to be repeated.
template <class Cfg, class SchedT, class Prologue, class Epilogue>
RAWFLUX_DEVICE void produce(u8* smem_raw, const TensorMap& tmap_a, const TensorMap& tmap_b, const TensorMap& tmap_a_tail,
                            const GemmParams p, const typename Prologue::Params& pro, const typename Epilogue::Params& epi) {
  constexpr int kStages = Cfg::kStages;
  constexpr bool kCluster = Cfg::kClusterSize > 1;
  constexpr bool kRefill = Cfg::kRefill;
  constexpr u32 kReleasers = 4 * Cfg::kConsumers * Cfg::kMcastSize;  // consumer warps that release each stage
  // The ring's addresses derived afresh here: a pointer kept from before setmaxnreg would be
  // spilled (the producer runs in 40 registers).
  u8* smem = ptx::opaque(smem_raw) + ((1024u - (ptx::smem_u32(smem_raw) & 1023u)) & 1023u);
  u8* smem_a = smem;
  u8* smem_b = smem + kStages * Cfg::kStageABytes;
  u64* full = reinterpret_cast<u64*>(smem + kStages * Cfg::kStageBytes);
  u64* empty = full + kStages;
  u32* released = reinterpret_cast<u32*>(empty + kStages + 2);  // the refill's counts, after the k-split pair
  const u32 cta_rank = kCluster ? ptx::cluster_ctarank() : 0u;
  const i32 cluster_id = kCluster ? (i32)ptx::cluster_id_x() : (i32)blockIdx.x;
  SchedT sched(p, cluster_id, (i32)cta_rank);
  WorkTile w;
  u32 stage = 0, phase = 0;
  u32 round = 0;  // kRefill: uses of the ring's stages before the current one (phase = round's parity)
  [[maybe_unused]] bool first_unit = true;  // Prologue::kBFirst: the ring has not been used yet
  // This CTA's slice of a multicast operand (whole tile when that dimension has no cluster).
  const i32 a_slice = Cfg::kClusterN > 1 ? (i32)cta_rank * Cfg::kBoxARows : 0;
  const i32 b_slice = Cfg::kClusterM > 1 ? (i32)cta_rank * Cfg::kBoxBRows : 0;
  // One tile's k loop. kAMode: how A's box is loaded. kALoadFull: the main map, its box
  // kBoxARows rows, or GemmParams::a_box_rows when m is smaller. kALoadTail: the tail map
  // (a_tail_rows rows), in a ragged last tile row, since the TMA unit's zero fill of rows past m
  // is slower than loading rows (m = 192, 128x96: 83 us against 66), and in a tile wholly past m
  // (a cluster's idle CTA: its rows are all zero-filled, a_tail_rows >= 8 of them instead of a
  // box). The rows a box leaves hold stale data; their results are never stored. A compile-time
  // mode, one loop each: choosing the map inside the loop cost the producer (40 registers) a spill.
  // k blocks [kb_first, kb_last) of the unit: all of them, or one k-slab's (Prologue::kSlabWait).
  // map_a, row_shift: A's map and the row of the tile in it (tmap_a, 0; or the prologue's own map).
  auto k_loop = [&](auto mode, const TensorMap& map_a, i32 row_shift, i32 kb_first, i32 kb_last) {
    constexpr int kAMode = decltype(mode)::value;
    const i32 m0 = (SchedT::kOwnerRows ? SchedT::a_row(p, w.tile_m) : w.tile_m * Cfg::kBM) + a_slice - row_shift;
    const u32 tx = stage_tx<Cfg, kAMode>(p);
    // kRefill: the unit's first kStages blocks; the consumers load the rest.
    const i32 kb_stop = kRefill ? min(kb_last, kb_first + kStages) : kb_last;
    for (i32 kb = kb_first; kb < kb_stop; ++kb) {
      if constexpr (kRefill) {
        // every consumer warp released the stage's previous use (round - 1); a count, not a
        // parity: the producer skips the blocks the consumers load and may be rounds ahead
        ptx::wait_count_geq<(Cfg::kMcastSize > 1)>(ptx::smem_u32(&released[stage]), round * kReleasers, p.timeout_ns);
      } else {
        ptx::mbar_wait(&empty[stage], phase ^ 1u, p.timeout_ns);
      }
      load_kblock<Cfg, kAMode>(map_a, tmap_a_tail, tmap_b, smem_a, smem_b, full, stage, kb, m0, SchedT::col0(p, w.tile_n), a_slice,
                               b_slice, tx);
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1u;
        if constexpr (kRefill) ++round;
      }
    }
    if constexpr (kRefill) {  // past the blocks the consumers load
      const u32 skip = (u32)max(0, kb_last - kb_stop);
      stage += skip % kStages;
      round += skip / kStages;
      if (stage >= kStages) {
        stage -= kStages;
        ++round;
      }
    }
  };
  while (sched.next(p, w)) {
    const i32 m0 = (SchedT::kOwnerRows ? SchedT::a_row(p, w.tile_m) : w.tile_m * Cfg::kBM) + a_slice;
    // The tail map: a_tail_box, written out (the call, by reference or by value, costs AG-GEMM's
    // producer a spill). Decided before the prologue's wait, so that only a predicate lives
    // across it (a row count kept across AgWait's loop costs the same spill).
    const bool tail = Cfg::kClusterN == 1 && p.a_tail_rows > 0 &&
                      (p.m - m0 <= 0 || (p.m - m0 < Cfg::kBoxARows && p.m > Cfg::kBoxARows));
    // Own rows in place (Prologue::kOwnRows): a tile wholly inside the own chunk loads A from the
    // prologue's map of the shard, the same bytes the gathered A would hold there.
    bool own = false;
    if constexpr (Prologue::kOwnRows) own = Prologue::own_tile(pro, m0 - a_slice, Cfg::kBM);
    // B first (Prologue::kBFirst): the CTA's first unit, if its rows are still in flight, loads
    // B's first k blocks into the (all free) ring before waiting for A, so that the wait overlaps
    // reading B, the whole cost of a small-m GEMM; stage and phase then point past them (the
    // count A's loads after the wait recover: no register held across the wait, which spilled).
    if constexpr (Prologue::kBFirst) {
      static_assert(!kRefill && Prologue::kSlabWait, "B first: the producer alone loads, between the slab waits");
      if (first_unit) {
        const i32 pre = min(kStages, Prologue::b_first(pro, m0, max(0, min(Cfg::kBoxARows, p.m - m0)), w.kb_begin, w.kb_end));
        const u32 tx = tail ? stage_tx<Cfg, kALoadTail>(p) : stage_tx<Cfg, kALoadFull>(p);
        for (i32 i = 0; i < pre; ++i) {  // stages 0.. on the ring's first round: free, no wait
          ptx::mbar_arrive_expect_tx(&full[i], tx);
          load_b_block<Cfg>(tmap_b, smem_b, full, (u32)i, w.kb_begin + i, SchedT::col0(p, w.tile_n), b_slice);
        }
        stage = (u32)(pre % kStages);
        phase = pre == kStages ? 1u : 0u;
      }
    }
    Prologue::wait(pro, p, w.tile_m, m0, max(0, min(Cfg::kBoxARows, p.m - m0)));
    auto blocks = [&](i32 kb_first, i32 kb_last) {
      if (tail) {
        k_loop(Int<kALoadTail>{}, tmap_a, 0, kb_first, kb_last);
      } else if (own) {
        if constexpr (Prologue::kOwnRows) k_loop(Int<kALoadFull>{}, pro.own_map, Prologue::own_row0(pro), kb_first, kb_last);
      } else {
        k_loop(Int<kALoadFull>{}, tmap_a, 0, kb_first, kb_last);
      }
    };
    if constexpr (Prologue::kSlabWait) {
      // k-slabs: the unit's blocks in runs of landed slabs, each run after the prologue's wait
      // for its first slab (between the k loops: a wait inside the loop costs spills)
      for (i32 kb = w.kb_begin; kb < w.kb_end;) {
        const i32 kb_next = min(w.kb_end, Prologue::wait_slabs(pro, m0, max(0, min(Cfg::kBoxARows, p.m - m0)), kb, w.kb_end));
        if constexpr (Prologue::kBFirst) {
          if (first_unit) {  // A of the blocks whose B went first (b_first kept them inside kb's slab)
            first_unit = false;
            const i32 pre = phase != 0u ? kStages : (i32)stage;
            for (i32 i = 0; i < pre; ++i) {
              if (tail) {
                load_a_block<Cfg, kALoadTail>(tmap_a, tmap_a_tail, smem_a, full, (u32)i, kb + i, m0, a_slice);
              } else if (own) {
                load_a_block<Cfg, kALoadFull>(pro.own_map, tmap_a_tail, smem_a, full, (u32)i, kb + i, m0 - Prologue::own_row0(pro), a_slice);
              } else {
                load_a_block<Cfg, kALoadFull>(tmap_a, tmap_a_tail, smem_a, full, (u32)i, kb + i, m0, a_slice);
              }
            }
            kb += pre;
          }
        }
        blocks(kb, kb_next);
        kb = kb_next;
      }
    } else {
      blocks(w.kb_begin, w.kb_end);
    }
    if constexpr (Epilogue::kExtraBlocks) {
      // The epilogue's own blocks after the tile's k blocks (GEMM-RS: an own tile's partials from
      // its peers, one 64-column box of the tile per stage, W - 1 rounds), into the A part of the ring.
      static_assert(!kRefill, "extra blocks are loaded by the producer alone");
      const i32 rounds = Epilogue::template extra_rounds<Cfg, SchedT>(epi, p, w.tile_m);
      if (rounds > 0) Epilogue::template extra_wait<Cfg>(epi, p, ptx::smem_u32(smem) + kScratchOffset<Cfg>);
      for (i32 r = 0; r < rounds; ++r) {
        for (i32 cb = 0; cb < Cfg::kBN / 64; ++cb) {
          ptx::mbar_wait(&empty[stage], phase ^ 1u, p.timeout_ns);
          Epilogue::template extra_load<Cfg, SchedT>(epi, p, w.tile_m, w.tile_n, r, cb, smem_a + stage * Cfg::kStageABytes, &full[stage],
                                                     ptx::smem_u32(smem) + kScratchOffset<Cfg>);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1u;
          }
        }
      }
    }
  }
}

}  // namespace rawflux
