// Call metadata of a fused collective op, published by every rank and compared on the device, so
// that ranks that disagree on a call (different m, another op object, another protocol, or no
// call at all) get a clear error instead of silently wrong data (DESIGN hazard 5). Shared by
// ag_gemm and gemm_rs (rawflux/ops/_collective.py drives it).
//
// Each op object owns a symmetric buffer of two slots of kMetaWords u32 per rank:
//   word 0: tag = the group-barrier epoch of the call (device-resident, so CUDA-graph replays
//           stamp fresh tags), word 1: op id (kOp*), words 2..: op-defined fields (m, k, dtype ...).
// A call publishes its record into slot (tag & 1) of its own buffer before its last barrier and
// checks every peer's slot (tag & 1) after it. Two slots suffice: a rank can rewrite the slot of
// tag E only at tag E + 2, after it passed barrier E + 1, which no peer enters before its own
// call E (its check included) has joined its stream.
#pragma once

#include "rawflux/comm/ctrl.cuh"
#include "rawflux/comm/wait.cuh"

namespace rawflux {

enum : int { kMetaWords = 16, kMetaFields = kMetaWords - 2 };
enum : u32 { kMetaSlotBytes = 4 * kMetaWords };
// Status::state of a disagreement found by meta_check (rawflux/ops/_collective.py decodes it:
// peer = the rank that differs, index = the word, expected = this rank's, observed = the peer's).

struct MetaFields {
  u32 w[kMetaFields];
};

// This rank's epoch word (the barrier's, comm/barrier.cuh).
RAWFLUX_DEVICE const u32* epoch_word(const GroupCtrl* g) { return ctrl_word(g, g->rank, kCtrlEpochOffset); }

// One thread: write this call's record. `ahead` = barriers between now and the call's last one
// (1 when published right before it): the tag is the epoch that barrier will reach.
RAWFLUX_DEVICE void meta_publish(const GroupCtrl* g, u32* own_meta, u32 op, const MetaFields& f, u32 ahead) {
  // The epoch word is only written by this rank's barrier kernels, earlier on this stream.
  const u32 tag = *epoch_word(g) + ahead;
  u32* slot = own_meta + (tag & 1u) * kMetaWords;
  slot[1] = op;
#pragma unroll
  for (int i = 0; i < kMetaFields; ++i) slot[2 + i] = f.w[i];
  // The record is published to peers by the barrier that follows (its st.release.sys orders these
  // plain stores, which precede it in stream order, before the arrival flag peers acquire).
  slot[0] = tag;
}

// One CTA, blockDim.x >= world: thread q compares rank q's record of the current call with this
// rank's. The first difference is recorded (kStateCallMismatch) and the group aborted, so every
// other wait of the call gives up at once. Returns true on every thread if all records agree.
RAWFLUX_DEVICE bool meta_check_cta(const GroupCtrl* g, const u64* meta_peers, u32 op) {
  __shared__ u32 s_bad;
  const int tid = threadIdx.x;
  const u32 tag = *epoch_word(g);
  const u32 slot_off = (tag & 1u) * kMetaSlotBytes;
  if (tid == 0) s_bad = 0;
  __syncthreads();
  const int rank = g->rank;
  if (tid < g->world && tid != rank) {
    const u32* mine = reinterpret_cast<const u32*>(meta_peers[rank] + slot_off);
    const u32* theirs = reinterpret_cast<const u32*>(meta_peers[tid] + slot_off);
    // Ordering: the peer wrote its record before its barrier (st.release.sys of its arrival);
    // this rank's barrier acquired that arrival earlier in stream order. relaxed.sys loads read
    // the coherent value (no stale L1 line).
    int bad_word = -1;
    u32 want = 0, got = 0;
    for (int i = 0; i < kMetaWords; ++i) {
      const u32 a = (i == 0) ? tag : mine[i];
      const u32 b = ld_relaxed_sys_u32(theirs + i);
      if (a != b) {
        bad_word = i;
        want = a;
        got = b;
        break;
      }
    }
    if (bad_word >= 0) {
      atomicOr(&s_bad, 1u);
      const WaitCtx c = make_wait_ctx(g, op, tag);
      record_failure(c, kStateCallMismatch, tid, bad_word, want, got, 0, 1ull << tid);
      raise_abort(c);
    }
  }
  __syncthreads();
  return s_bad == 0;
}

}  // namespace rawflux
