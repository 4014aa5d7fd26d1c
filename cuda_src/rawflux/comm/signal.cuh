// Signalling side of the flag protocol (the waiting side is wait.cuh).
//
// A producer makes data visible to a peer, then sets the peer's flag with a release; the peer
// waits on the flag with an acquire (wait_flag_geq). Flags hold counters that only grow
// (call_id / epoch), so a flag never needs a reset (DESIGN hazard 3).
//
// Where several threads wrote the data, first join them (CTA barrier), then ONE thread signals:
// the CTA barrier plus the release's cumulativity make all their writes visible before the flag.
// TMA (async-proxy) stores must be complete (cp.async.bulk.wait_group 0, not .read) and followed
// by fence_proxy_async() before the signal.
#pragma once

#include "rawflux/ptx/sync.cuh"

namespace rawflux {

// The address `offset` bytes into rank q's copy of a symmetric buffer, through its peer table.
template <typename T>
RAWFLUX_DEVICE T* peer_ptr(const u64* peer_table, int q, u64 offset = 0) {
  return reinterpret_cast<T*>(peer_table[q] + offset);
}

// Set a (local or peer) flag to value after this thread's prior writes.
RAWFLUX_DEVICE void signal_set(u32* flag, u32 value) {
  // release (sys): this thread's earlier data writes are visible before the flag value
  st_release_sys_u32(flag, value);
}

// Add to a counting flag (several producers; the consumer waits for the total).
RAWFLUX_DEVICE void signal_add(u32* flag, u32 delta) {
  // release (sys): this thread's earlier data writes are visible before the added count
  red_release_sys_add_u32(flag, delta);
}

// Set rank q's flag number `index` of a symmetric u32 flag array.
RAWFLUX_DEVICE void signal_peer(const u64* flag_table, int q, int index, u32 value) {
  signal_set(peer_ptr<u32>(flag_table, q, 4ull * static_cast<u64>(index)), value);
}

// CTA-wide: all threads' prior writes (generic proxy) are published by one flag store. Every
// thread of the CTA must call it.
RAWFLUX_DEVICE void cta_signal_set(u32* flag, u32 value) {
  __syncthreads();  // joins the CTA: every thread's data writes happen before thread 0's release
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    // release (sys): the CTA's data writes (via the barrier above) are visible before the flag
    st_release_sys_u32(flag, value);
  }
}

}  // namespace rawflux
