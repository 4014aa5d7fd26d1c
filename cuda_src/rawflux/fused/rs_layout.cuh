// Memory layout of GEMM-ReduceScatter's symmetric buffers (rawflux/ops/gemm_rs.py mirrors every
// constant; tests/cpu/test_gemm_rs_cpu.py compiles static_asserts generated from the Python side).
//
// Calls are numbered by an epoch e = 1, 2, ... kept on the device (the kernel reads it at its start
// and its last CTA advances it), and everything a call exchanges lives in the half of the buffers
// of its parity e & 1, so call e + 1 never touches what call e still reads (slot safety: a rank
// writes parity p again only in call e + 2, which it cannot start before every peer has finished
// reading call e; tests/cpu/test_rs_protocol.py checks it on an interleaving model).
//
// recv (one per rank, symmetric): 2 x W receive slots of slot_rows = max_m / W rows (the op's
//   capacity) each, element type the partial type (the output's 16-bit type by default, fp32 as
//   an option). Slot (p, s) holds what source rank s computed of THIS rank's rows in a call of
//   parity p: its first m/W rows, row-major, row stride n, from element ((p * W + s) * slot_rows) * n.
//   Fixed slot places: a call with another m than the previous one (the other parity) still never
//   writes where that call's owner reads. 2 * max_m * n elements; this rank's own slot is unused.
//
// sync (one per rank, symmetric), bytes:
//   [0, 4)     u32 epoch of the last call that completed on this rank (local: never read by peers)
//   [64, 68)   u32 CTAs of the running call that are done (local; the last one resets it)
//   [128, 128 + 2 * kRsMaxWorld * kMetaWords * 4)   call records: record (p, s) = what source s
//              called in its call of parity p (word 0 the epoch, word 1 the op id, then m, n, k ...),
//              written by s into every peer at its kernel's start
//   kRsFlagsOffset + 4 * (((p * W + s) * tiles_cap + tile) * 2 + c)   u32 flag: the epoch of the
//              last call (of parity p) in which source s completed consumer warpgroup c's rows of
//              this rank's tile `tile` (owner-local tile row * tiles_n + tile column)
//   Epochs only grow, so nothing is ever reset between calls (DESIGN hazard 3).
#pragma once
#include "rawflux/comm/call_record.cuh"
#include "rawflux/ptx/types.cuh"

namespace rawflux {

enum : int { kRsMaxWorld = 8 };  // a tensor map per peer rides in the kernel's parameters
enum : u32 {
  kRsEpochOffset = 0,
  kRsDoneOffset = 64,
  kRsRecordsOffset = 128,
  kRsFlagsOffset = kRsRecordsOffset + 2 * kRsMaxWorld * kMetaSlotBytes,
  kRsFlagsPerTile = 2,  // one per consumer warpgroup (kConsumers <= 2)
};

// Partial element types (template arguments; the same numbers as kTypeBF16 / kTypeF16 / kTypeF32).
enum : int { kRsPartBF16 = 0, kRsPartF16 = 1, kRsPartF32 = 2 };

// Byte offset of (parity, source, tile, consumer)'s flag inside an owner's sync buffer.
RAWFLUX_DEVICE u64 rs_flag_offset(u32 parity, i32 world, i32 src, i32 tiles_cap, i32 tile, u32 consumer) {
  return kRsFlagsOffset + 4ull * (((u64)(parity * (u32)world + (u32)src) * (u64)tiles_cap + (u64)tile) * kRsFlagsPerTile + consumer);
}

// Byte offset of (parity, source)'s call record inside an owner's sync buffer.
RAWFLUX_DEVICE u64 rs_record_offset(u32 parity, i32 src) {
  return kRsRecordsOffset + (u64)(parity * kRsMaxWorld + (u32)src) * kMetaSlotBytes;
}

// Element offset of row `row` of receive slot (parity, source); slots are slot_rows = max_m / W
// rows apart whatever the call's m, so a call's slots never overlap the other parity's.
RAWFLUX_DEVICE i64 rs_slot_row(u32 parity, i32 world, i32 src, i32 slot_rows, i32 row, i64 n) {
  return ((i64)(parity * (u32)world + (u32)src) * slot_rows + row) * n;
}

}  // namespace rawflux
