// Memory layouts shared by the device side of rawflux.dist and its Python side
// (rawflux/dist/layout.py mirrors every offset; tests/cpu/test_dist_layout.py checks that both
// agree by compiling static_asserts generated from the Python constants).
//
//   Status     host-mapped pinned memory, one per rank: the first failed device-side wait writes
//              what it waited for; the host reads it with no synchronisation.
//   SymCtrl    a symmetric buffer (same offsets on every rank, IPC-mapped by all peers): the
//              group's abort word and the barrier's epoch and arrival flags.
//   GroupCtrl  plain device memory, one per rank, written by the host at init: everything a
//              kernel needs to find the above. Kernels take a `const GroupCtrl*` argument, so no
//              per-call value is baked into a captured CUDA graph.
#pragma once

#include "rawflux/ptx/types.cuh"

namespace rawflux {

// enums, not constexpr variables: NVRTC's -default-device would make the latter device globals.
enum : int { kMaxWorld = 64 };  // ranks in one TP group (one node); late_mask is a u64

// Op ids in Status::op (rawflux/dist/layout.py OP_NAMES gives their names).
enum : u32 { kOpNone = 0, kOpBarrier = 1, kOpAgGemm = 2, kOpGemmRs = 3, kOpSignalWait = 4, kOpSelfTest = 5, kOpGemmAr = 6 };
// Status::state
// kStateCallMismatch: a fused op's per-call record differed between ranks (comm/call_record.cuh).
enum : u32 { kStateOk = 0, kStateTimeout = 1, kStateAborted = 2, kStateCallMismatch = 3 };

struct Status {
  u32 state;       // kStateOk until a wait fails; written last (the host polls it)
  u32 op;          // which operation waited (kOp*)
  u32 call_id;     // which call of it (barrier epoch, op call counter)
  i32 waiter;      // the rank that recorded (this rank)
  i32 peer;        // the rank waited for (first one that did not arrive), -1 unknown
  i32 index;       // which flag of that peer (chunk / tile index), -1 for none
  u32 expected;    // the value waited for (flag >= expected, wrap-safe)
  u32 observed;    // the last value read
  u64 elapsed_ns;  // how long the wait ran
  u64 timeout_ns;  // the bound it ran under
  u64 late_mask;   // bit q: rank q had not arrived when the wait gave up (when known)
  u32 abort_from;  // kStateAborted: the abort word (rank + 1 of the rank that gave up; high half: + 1 of the rank it gave up on)
  u32 reserved;
};
static_assert(sizeof(Status) == 64, "Status layout is mirrored in rawflux/dist/layout.py");

// Offsets inside the symmetric control buffer (bytes); separate 128-byte lines so the words
// peers hammer do not share a line with the words only this rank touches.
enum : u32 {
  kCtrlAbortOffset = 0,    // u32 abort: nonzero = rank (low half - 1) gave up on rank (high half - 1); every wait gives up
  kCtrlClaimOffset = 4,    // u32 claim: the first failing wait on this rank owns Status
  kCtrlEpochOffset = 128,  // u32 barrier epoch: barriers this rank entered (only grows)
  kCtrlFlagsOffset = 256,  // u32 flag[kMaxWorld]: last barrier epoch rank q announced here
  kCtrlBytes = 1024,
};
static_assert(kCtrlFlagsOffset + 4 * kMaxWorld <= kCtrlBytes, "control buffer too small");

struct GroupCtrl {
  u64 timeout_ns;        // bound on every device-side wait (RAWFLUX_WAIT_TIMEOUT_S)
  Status* status;        // this rank's host-mapped record (device view of the pointer)
  const u64* ctrl_peers; // u64[world]: each rank's SymCtrl buffer as mapped in this process
  i32 rank;
  i32 world;
  u64 reserved[4];
};
static_assert(sizeof(GroupCtrl) == 64, "GroupCtrl layout is mirrored in rawflux/dist/layout.py");

// Bound for a role's wait on this CTA's own roles, which may themselves wait on peers: past any
// bounded wait of a peer.
RAWFLUX_DEVICE i64 role_timeout_ns(const GroupCtrl* g) { return (i64)(2 * g->timeout_ns + 10000000000ull); }

RAWFLUX_DEVICE u32* ctrl_word(const GroupCtrl* g, int q, u32 offset) {
  return reinterpret_cast<u32*>(g->ctrl_peers[q] + offset);
}

}  // namespace rawflux
