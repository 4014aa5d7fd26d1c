// Bounded waits on flags that peers set, with an error record instead of a hang.
//
// Every device-side spin in rawflux goes through poll_flag_geq / wait_flag_geq: it gives up after
// WaitCtx::timeout_ns (measured on %globaltimer) or as soon as this rank's abort word is set, and
// the first failure on a rank writes a Status record into host-mapped memory, which
// Group.raise_if_failed() turns into rawflux.dist.CollectiveTimeout. A wait that times out also
// sets the abort word of every rank, so every other wait in the group fails fast instead of each
// running into its own timeout. Waits return; they never __trap (that would kill the CUDA
// context and the message with it).
//
// Flags are u32 counters that only grow (epochs / call counters), compared wrap-safe, so they
// never need a reset between calls (DESIGN hazard 3) and replays of a CUDA graph keep working.
//
// Use from a fused kernel (one thread waits, the CTA follows):
//   WaitCtx ctx = make_wait_ctx(g, kOpAgGemm, call_id);
//   bool ok = cta_wait_flag_geq(&flags[chunk], call_id, ctx, src_rank, chunk);
//   if (!ok) return;   // the record is written; the host raises
#pragma once

#include "rawflux/comm/ctrl.cuh"
#include "rawflux/ptx/sync.cuh"

namespace rawflux {

enum : u32 { kWaitOk = 0, kWaitTimeout = 1, kWaitAborted = 2 };

struct WaitCtx {
  u64 timeout_ns;         // bound on each wait
  Status* status;         // host-mapped error record of this rank
  u32 op;                 // kOp* of the operation waiting
  u32 call_id;            // which call of it (for the message)
  const u32* abort;       // this rank's abort word: nonzero = give up at once
  u32* claim;             // this rank's claim word: the first failure owns the record
  const u64* ctrl_peers;  // every rank's control buffer, to raise the abort group-wide
  i32 rank;
  i32 world;
};

RAWFLUX_DEVICE WaitCtx make_wait_ctx(const GroupCtrl* g, u32 op, u32 call_id) {
  WaitCtx c;
  c.timeout_ns = g->timeout_ns;
  c.status = g->status;
  c.op = op;
  c.call_id = call_id;
  c.abort = ctrl_word(g, g->rank, kCtrlAbortOffset);
  c.claim = ctrl_word(g, g->rank, kCtrlClaimOffset);
  c.ctrl_peers = g->ctrl_peers;
  c.rank = g->rank;
  c.world = g->world;
  return c;
}

struct WaitResult {
  u32 code;         // kWaitOk / kWaitTimeout / kWaitAborted
  u32 observed;     // last value read from the flag
  u64 elapsed_ns;
};

// Spin until *flag >= target (wrap-safe), the timeout passes, or *abort becomes nonzero.
// Records nothing: the building block for callers that aggregate several waits (the barrier).
RAWFLUX_DEVICE WaitResult poll_flag_geq(const u32* flag, u32 target, u64 timeout_ns, const u32* abort) {
  const u64 start = globaltimer_ns();
  u32 spins = 0;
  while (true) {
    // acquire (sys): the signalling rank's writes before its release of this flag are visible
    // to this thread once the value is seen
    const u32 v = ld_acquire_sys_u32(flag);
    if (seq_geq(v, target)) return {kWaitOk, v, globaltimer_ns() - start};
    ++spins;
    if ((spins & 15u) == 0) {  // the abort word and the clock are read 1 in 16 polls
      const u64 elapsed = globaltimer_ns() - start;
      if (ld_relaxed_sys_u32(abort) != 0) return {kWaitAborted, v, elapsed};
      if (elapsed > timeout_ns) return {kWaitTimeout, v, elapsed};
      // back off once the wait is long, to leave memory bandwidth to the peers' producers
      if (spins > 4096) nanosleep_ns(256);
    }
  }
}

// Write the error record, once per rank: the first failure claims it, later ones leave it.
RAWFLUX_DEVICE void record_failure(const WaitCtx& c, u32 state, i32 peer, i32 index, u32 expected,
                                   u32 observed, u64 elapsed_ns, u64 late_mask) {
  if (atom_cas_relaxed_sys_u32(c.claim, 0u, 1u) != 0u) return;
  Status* s = c.status;
  st_relaxed_sys_u32(&s->op, c.op);
  st_relaxed_sys_u32(&s->call_id, c.call_id);
  st_relaxed_sys_i32(&s->waiter, c.rank);
  st_relaxed_sys_i32(&s->peer, peer);
  st_relaxed_sys_i32(&s->index, index);
  st_relaxed_sys_u32(&s->expected, expected);
  st_relaxed_sys_u32(&s->observed, observed);
  st_relaxed_sys_u64(&s->elapsed_ns, elapsed_ns);
  st_relaxed_sys_u64(&s->timeout_ns, c.timeout_ns);
  st_relaxed_sys_u64(&s->late_mask, late_mask);
  st_relaxed_sys_u32(&s->abort_from, ld_relaxed_sys_u32(c.abort));
  // release (sys): the record's fields reach host memory before the state word the host polls
  st_release_sys_u32(&s->state, state);
}

// Tell every rank (this one included) to stop waiting: each abort word gets rank + 1 in its low
// half and, when this rank's error record is written, its peer + 1 (the rank given up on) in its
// high half. Read back from the record, not passed in: a live argument spilled a GEMM-RS role.
RAWFLUX_DEVICE void raise_abort(const WaitCtx& c) {
  // Another thread of this rank may have claimed the record and not yet written it (copy CTAs
  // time out together): give it a bounded moment, or the word would name no rank.
  bool recorded = false;
  for (int tries = 0; tries < 64; ++tries) {
    // acquire (sys): the record's fields, written before its state
    recorded = ld_acquire_sys_u32(&c.status->state) != kStateOk;
    if (recorded) break;
    nanosleep_ns(1000);
  }
  const i32 late = recorded ? static_cast<i32>(ld_relaxed_sys_u32(reinterpret_cast<const u32*>(&c.status->peer))) : -1;
  const u32 word = static_cast<u32>(c.rank + 1) | (late >= 0 && late < kMaxWorld ? static_cast<u32>(late + 1) << 16 : 0u);
  for (int q = 0; q < c.world; ++q) {
    u32* abort = reinterpret_cast<u32*>(c.ctrl_peers[q] + kCtrlAbortOffset);
    // release (sys): this rank's error record is written before peers see the abort
    st_release_sys_u32(abort, word);
  }
}

// One thread waits until *flag >= target (wrap-safe). On timeout or abort it records what it
// waited for (peer = the rank expected to signal, index = which flag of it, -1 if none), raises
// the group abort on timeout, and returns false. The caller must then stop using the data.
RAWFLUX_DEVICE bool wait_flag_geq(const u32* flag, u32 target, const WaitCtx& c, int peer, int index) {
  const WaitResult r = poll_flag_geq(flag, target, c.timeout_ns, c.abort);
  if (r.code == kWaitOk) return true;
  const u64 late = (peer >= 0 && peer < kMaxWorld) ? (1ull << peer) : 0ull;
  record_failure(c, r.code == kWaitTimeout ? kStateTimeout : kStateAborted, peer, index, target,
                 r.observed, r.elapsed_ns, late);
  if (r.code == kWaitTimeout) raise_abort(c);
  return false;
}

// wait_flag_geq for a thread short of registers (a GEMM's 40-register producer): the same bounded
// wait and record, but only the flag, the target and the clock live across the poll; the group's
// abort word and timeout are read from `g` 1 in 16 polls and the WaitCtx is built only on a
// failure. The bound is the group's timeout x quarters / 4.
RAWFLUX_DEVICE void wait_flag_geq_lean(const u32* flag, u32 target, const GroupCtrl* g, u32 op, int peer, int index, u32 quarters) {
  const u64 start = globaltimer_ns();
  for (u32 spins = 1;; ++spins) {
    // acquire (sys): the signalling rank's writes before its release of this flag are visible
    // to this thread once the value is seen
    const u32 v = ld_acquire_sys_u32(flag);
    if (seq_geq(v, target)) return;
    if ((spins & 15u) != 0) continue;
    const u64 elapsed = globaltimer_ns() - start;
    const bool aborted = ld_relaxed_sys_u32(ctrl_word(g, g->rank, kCtrlAbortOffset)) != 0;
    const u64 bound = g->timeout_ns / 4 * quarters;
    if (aborted || elapsed > bound) {
      WaitCtx c = make_wait_ctx(g, op, target);
      c.timeout_ns = bound;
      record_failure(c, aborted ? kStateAborted : kStateTimeout, peer, index, target, v, elapsed,
                     (peer >= 0 && peer < kMaxWorld) ? (1ull << peer) : 0ull);
      if (!aborted) raise_abort(c);
      return;
    }
    if (spins > 4096) nanosleep_ns(256);  // back off once the wait is long (as poll_flag_geq)
  }
}

// CTA-wide form: thread 0 waits, then the whole CTA learns the outcome at a CTA barrier, which
// also orders the other threads' reads of the peer's data after thread 0's acquire. Every thread
// of the CTA must call it.
RAWFLUX_DEVICE bool cta_wait_flag_geq(const u32* flag, u32 target, const WaitCtx& c, int peer, int index) {
  int ok = 1;
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) ok = wait_flag_geq(flag, target, c, peer, index) ? 1 : 0;
  return __syncthreads_and(ok) != 0;
}

// True when this rank's group has been aborted (some wait timed out): long-running kernels may
// poll it between tiles to stop early.
RAWFLUX_DEVICE bool group_aborted(const WaitCtx& c) { return ld_relaxed_sys_u32(c.abort) != 0; }

}  // namespace rawflux
