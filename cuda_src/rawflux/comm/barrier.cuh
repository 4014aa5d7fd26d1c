// Device-side barrier across the ranks of a group, run by one CTA.
//
// State lives in each rank's symmetric control buffer (comm/ctrl.cuh): an epoch only this rank
// writes, and flag[q] = the last epoch rank q announced to this rank. Each call:
//   1. epoch = ++my_epoch                     (device memory, so CUDA-graph replays keep counting)
//   2. for every rank q: q.flag[me] = epoch   (st.release.sys through the peer table)
//   3. for every rank q: wait my.flag[q] >= epoch (bounded ld.acquire.sys)
// No reset is ever needed: epochs only grow and compare wrap-safe, and a rank can be at most one
// barrier ahead of a peer (it cannot leave barrier e+1 before the peer entered it), so a flag
// that is already past the epoch still proves arrival. On timeout thread 0 records which ranks
// had not arrived, raises the group abort, and the kernel returns (no __trap).
#pragma once

#include "rawflux/comm/ctrl.cuh"
#include "rawflux/comm/wait.cuh"

namespace rawflux {

// Must be called by every thread of exactly one CTA per rank; returns true if all ranks arrived.
// Writes of this rank issued before the call (earlier kernels in stream order) are visible to
// every peer after its barrier returns, and the peers' earlier writes are visible here.
RAWFLUX_DEVICE bool group_barrier_cta(const GroupCtrl* g) {
  __shared__ u32 s_epoch;
  __shared__ u32 s_code;  // bit 0: some wait timed out; bit 1: some wait saw the abort word
  __shared__ u64 s_start;
  const int tid = threadIdx.x;
  const int rank = g->rank;
  const int world = g->world;
  const u64 timeout_ns = g->timeout_ns;
  u32* my_abort = ctrl_word(g, rank, kCtrlAbortOffset);
  u32* my_epoch = ctrl_word(g, rank, kCtrlEpochOffset);
  u32* my_flags = ctrl_word(g, rank, kCtrlFlagsOffset);

  if (tid == 0) {
    // Only this rank writes its epoch and kernels on one stream run in order: plain access.
    const u32 epoch = *my_epoch + 1u;
    *my_epoch = epoch;
    s_epoch = epoch;
    s_code = ld_relaxed_sys_u32(my_abort) != 0 ? 2u : 0u;  // an aborted group fails at once
    s_start = globaltimer_ns();
  }
  __syncthreads();
  const u32 epoch = s_epoch;

  if (s_code == 0) {
    for (int q = tid; q < world; q += blockDim.x) {
      u32* their_flag = ctrl_word(g, q, kCtrlFlagsOffset) + rank;
      // release (sys): this rank's writes before the barrier reach rank q before it sees epoch
      st_release_sys_u32(their_flag, epoch);
    }
    for (int q = tid; q < world; q += blockDim.x) {
      // poll_flag_geq acquires (sys): rank q's writes before its arrival are visible after it
      const WaitResult r = poll_flag_geq(my_flags + q, epoch, timeout_ns, my_abort);
      if (r.code == kWaitTimeout) atomicOr(&s_code, 1u);
      if (r.code == kWaitAborted) atomicOr(&s_code, 2u);
    }
  }
  __syncthreads();  // joins the waiting threads: their acquires order the whole CTA's later reads
  const u32 code = s_code;
  if (code != 0 && tid == 0) {
    // Who had not arrived, as seen now (all waits started together, so this names them all).
    u64 late = 0;
    int first_late = -1;
    u32 first_seen = 0;
    for (int q = 0; q < world; ++q) {
      const u32 seen = ld_relaxed_sys_u32(my_flags + q);
      if (!seq_geq(seen, epoch)) {
        late |= 1ull << q;
        if (first_late < 0) {
          first_late = q;
          first_seen = seen;
        }
      }
    }
    const WaitCtx c = make_wait_ctx(g, kOpBarrier, epoch);
    const u32 state = (code & 1u) ? kStateTimeout : kStateAborted;
    record_failure(c, state, first_late, -1, epoch, first_seen, globaltimer_ns() - s_start, late);
    if (state == kStateTimeout) raise_abort(c);
  }
  return code == 0;
}

}  // namespace rawflux
