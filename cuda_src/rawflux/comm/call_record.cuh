// Call records of the fused collective ops: every rank pushes its record of a call (op, shape,
// dtype, protocol) into every peer, which compares it with its own before trusting the peer's
// data, so ranks that disagree on a call (another m, another op object, no call at all) get a
// clear error instead of silently wrong data (DESIGN hazard 5). Shared by ag_gemm
// (fused/ag_gemm.cuh) and gemm_rs (fused/rs_epilogue.cuh); each op keeps the slots in its own
// sync buffer and numbers its calls with its own epoch e = 1, 2, ... (device-resident, so CUDA-
// graph replays stamp fresh tags).
//
// A record is kMetaWords u32: word 0 the tag (the call's epoch), word 1 the op id (kOp*), then
// op-defined fields. Slot (e & 1, s) of rank q holds what source s called in its call e. Two
// slots suffice: s rewrites slot (e & 1) only in call e + 2, which it cannot start before q has
// finished call e (each op's protocol guarantees it: a peer's call e + 1 needs q's data of e + 1).
#pragma once

#include "rawflux/comm/ctrl.cuh"
#include "rawflux/comm/wait.cuh"

namespace rawflux {

enum : int { kMetaWords = 16, kMetaFields = kMetaWords - 2 };
enum : u32 { kMetaSlotBytes = 4 * kMetaWords };

// The record words a kernel takes by value (word 0 unused: the tag is the device's epoch).
struct CallRecord {
  u32 w[kMetaWords];
};

// One thread: writes record `rec` (words 1.. of it) into a peer's slot, then its tag e.
template <class Rec>
RAWFLUX_DEVICE void record_push(u32* slot, u32 e, const Rec& rec) {
#pragma unroll 1
  for (int i = 1; i < kMetaWords; ++i) slot[i] = rec[i];
  st_release_sys_u32(slot, e);  // release (sys): the record's words reach the peer before its tag
}

// Word i of peer q's record against this rank's: a difference is recorded (kStateCallMismatch:
// peer q, the word, this rank's value, the peer's) and the group aborted. False on a difference.
RAWFLUX_DEVICE bool record_word_ok(const WaitCtx& ctx, i32 q, int i, u32 want, u32 got) {
  if (want == got) return true;
  record_failure(ctx, kStateCallMismatch, q, i, want, got, 0, 1ull << q);
  raise_abort(ctx);
  return false;
}

// One thread: waits (bounded) for peer q's record of call e in `slot` and compares it with `want`
// word by word. A difference is recorded (kStateCallMismatch: peer q, the word, this rank's value,
// the peer's) and the group aborted, so every other wait of the call gives up at once. False on
// a timeout or a difference.
template <class Rec>
RAWFLUX_DEVICE bool record_check(const u32* slot, u32 e, const Rec& want, const WaitCtx& ctx, i32 q) {
  if (!wait_flag_geq(slot, e, ctx, q, -1)) return false;  // acquire (sys): the record's words are visible after its tag
  // Word 0, the tag, is e: the wait saw >= e, and no peer reaches this parity's e + 2 before
  // this call is done (slot safety).
#pragma unroll 1
  for (int i = 1; i < kMetaWords; ++i) {
    const u32 w = want[i];
    if (!record_word_ok(ctx, q, i, w, ld_relaxed_sys_u32(slot + i))) return false;
  }
  return true;
}

// record_check for a check on a call's critical path: both records are read as 16-byte loads
// issued together (two round trips, not one per word). slot and want are 16-byte aligned.
RAWFLUX_DEVICE bool record_check_wide(const u32* slot, u32 e, const u32* want, const WaitCtx& ctx, i32 q) {
  if (!wait_flag_geq(slot, e, ctx, q, -1)) return false;  // acquire (sys): the record's words are visible after its tag
  static_assert(kMetaWords % 4 == 0, "a record is whole 16-byte vectors");
  uint4 got[kMetaWords / 4], mine[kMetaWords / 4];
#pragma unroll
  for (int j = 0; j < kMetaWords / 4; ++j) {
    got[j] = ld_relaxed_sys_v4_u32(slot + 4 * j);
    mine[j] = ld_relaxed_sys_v4_u32(want + 4 * j);
  }
  // word 0, the tag, is e (record_check says why)
#pragma unroll
  for (int i = 1; i < kMetaWords; ++i) {
    const uint4& g = got[i / 4];
    const uint4& w = mine[i / 4];
    const u32 gv = i % 4 == 0 ? g.x : i % 4 == 1 ? g.y : i % 4 == 2 ? g.z : g.w;
    const u32 wv = i % 4 == 0 ? w.x : i % 4 == 1 ? w.y : i % 4 == 2 ? w.z : w.w;
    if (!record_word_ok(ctx, q, i, wv, gv)) return false;
  }
  return true;
}

}  // namespace rawflux
