// Memory layout of GEMM-ReduceScatter's symmetric buffers (rawflux/ops/gemm_rs.py mirrors every
// constant; tests/cpu/test_gemm_rs_cpu.py compiles static_asserts generated from the Python side).
//
// parts (one per rank, symmetric): W slots; slot s holds the (m/W, n) rows of THIS rank's output
//   that source rank s computed (its partial product), row-major, row stride n, element type fp32
//   (default) or the input's 16-bit type. Slot s starts at element s * (m/W) * n for the call's m
//   (slots are packed for the call's m, which every rank agrees on; the device-side call check
//   proves it), so the buffer holds max_m * n elements.
//
// flags (one per rank, symmetric):
//   bytes [0, 8)    u64 work counter of this rank's reduce kernels: (epoch << 32) | next unit,
//                   claimed by CAS; a counter tagged with an older epoch counts as 0 (no reset)
//   u32 word kRsFlagBase + s * tiles_cap + tile_m * tiles_n + tile_n = the call's barrier epoch
//                   once source s has stored its partial of global GEMM tile (tile_m, tile_n) for
//                   the rows this rank owns. One flag per (source, tile) on every owner the tile's
//                   rows touch.
//   Epochs only grow, so nothing is ever reset (DESIGN hazard 3: the per-call barrier proves every
//   peer is done with the previous call's buffers before anyone writes them again).
#pragma once
#include "rawflux/ptx/types.cuh"

namespace rawflux {

enum : int { kRsFlagBase = 32 };  // u32 words: the flags start 128 bytes in, past the counter's line

// Partial element types (template arguments; the same numbers as kTypeBF16 / kTypeF16 / kTypeF32).
enum : int { kRsPartBF16 = 0, kRsPartF16 = 1, kRsPartF32 = 2 };

// Flag index of (source, tile) inside an owner's flag buffer.
RAWFLUX_DEVICE i64 rs_flag_index(i32 src, i32 tiles_cap, i32 tile_m, i32 tiles_n, i32 tile_n) {
  return kRsFlagBase + (i64)src * tiles_cap + (i64)tile_m * tiles_n + tile_n;
}

}  // namespace rawflux
