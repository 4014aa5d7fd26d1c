"""Byte layouts shared with the CUDA side (cuda_src/rawflux/comm/ctrl.cuh), and their decoding.

Every constant here mirrors one in ctrl.cuh; tests/cpu/test_dist_layout.py compiles
static_asserts generated from these values with NVRTC, so the two cannot drift apart silently.
Pure Python: nothing here needs MPI or a GPU.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

MAX_WORLD = 64  # kMaxWorld: ranks in one group (late_mask is a u64)

# Symmetric control buffer (SymCtrl), byte offsets.
CTRL_ABORT = 0
CTRL_CLAIM = 4
CTRL_EPOCH = 128
CTRL_FLAGS = 256
CTRL_BYTES = 1024

# GroupCtrl (plain device memory, one per rank): timeout_ns, status*, ctrl_peers*, rank, world.
GROUP_CTRL_FMT = "<QQQii32x"
GROUP_CTRL_BYTES = 64
GROUP_CTRL_OFFSETS = {"timeout_ns": 0, "status": 8, "ctrl_peers": 16, "rank": 24, "world": 28}

# Status (host-mapped pinned memory, one per rank).
STATUS_FMT = "<IIIiiiIIQQQII"
STATUS_BYTES = 64
STATUS_FIELDS = ("state", "op", "call_id", "waiter", "peer", "index", "expected", "observed",
                 "elapsed_ns", "timeout_ns", "late_mask", "abort_from", "reserved")
STATUS_OFFSETS = {"state": 0, "op": 4, "call_id": 8, "waiter": 12, "peer": 16, "index": 20, "expected": 24,
                  "observed": 28, "elapsed_ns": 32, "timeout_ns": 40, "late_mask": 48, "abort_from": 56}

STATE_OK, STATE_TIMEOUT, STATE_ABORTED, STATE_CALL_MISMATCH = 0, 1, 2, 3

# Op ids (kOp* in ctrl.cuh); fused ops pass theirs to make_wait_ctx().
OP_NONE, OP_BARRIER, OP_AG_GEMM, OP_GEMM_RS, OP_SIGNAL_WAIT, OP_SELFTEST, OP_GEMM_AR = 0, 1, 2, 3, 4, 5, 6
OP_NAMES = {OP_NONE: "op", OP_BARRIER: "barrier", OP_AG_GEMM: "ag_gemm", OP_GEMM_RS: "gemm_rs",
            OP_SIGNAL_WAIT: "signal wait", OP_SELFTEST: "self-test", OP_GEMM_AR: "gemm_ar"}

assert struct.calcsize(GROUP_CTRL_FMT) == GROUP_CTRL_BYTES
assert struct.calcsize(STATUS_FMT) == STATUS_BYTES
assert CTRL_FLAGS + 4 * MAX_WORLD <= CTRL_BYTES


def pack_group_ctrl(timeout_ns: int, status_ptr: int, ctrl_peers_ptr: int, rank: int, world: int) -> bytes:
    return struct.pack(GROUP_CTRL_FMT, int(timeout_ns), int(status_ptr), int(ctrl_peers_ptr), int(rank), int(world))


def unpack_group_ctrl(raw: bytes) -> dict:
    vals = struct.unpack(GROUP_CTRL_FMT, raw[:GROUP_CTRL_BYTES])
    return dict(zip(("timeout_ns", "status", "ctrl_peers", "rank", "world"), vals))


@dataclass(frozen=True)
class StatusRecord:
    state: int
    op: int
    call_id: int
    waiter: int
    peer: int
    index: int
    expected: int
    observed: int
    elapsed_ns: int
    timeout_ns: int
    late_mask: int
    abort_from: int
    reserved: int = 0

    @classmethod
    def from_bytes(cls, raw: bytes) -> "StatusRecord":
        return cls(*struct.unpack(STATUS_FMT, raw[:STATUS_BYTES]))

    def to_bytes(self) -> bytes:
        return struct.pack(STATUS_FMT, *(getattr(self, f) for f in STATUS_FIELDS))

    @property
    def failed(self) -> bool:
        return self.state != STATE_OK

    @property
    def late_ranks(self) -> list[int]:
        return [q for q in range(MAX_WORLD) if (self.late_mask >> q) & 1]

    @property
    def op_name(self) -> str:
        return OP_NAMES.get(self.op, f"op {self.op}")

    def message(self) -> str:
        """One sentence a user can act on: who did not arrive where, after how long."""
        what = f"{self.op_name} #{self.call_id}"
        if self.index >= 0:
            what += f" (flag {self.index})"
        timeout_s = self.timeout_ns / 1e9
        late = self.late_ranks
        late_txt = f"; ranks not arrived: {late}" if late else ""
        if self.state == STATE_TIMEOUT:
            who = f"rank {self.peer}" if self.peer >= 0 else "a peer"
            verb = "did not arrive at" if self.op == OP_BARRIER else "did not signal"
            return (
                f"{who} {verb} {what} within {timeout_s:.1f} s (waiting rank {self.waiter}; "
                f"flag read {self.observed}, expected >= {self.expected}{late_txt}). Every rank must "
                f"make the same collective calls in the same order; raise RAWFLUX_WAIT_TIMEOUT_S if the "
                f"peer is only slow"
            )
        if self.state == STATE_ABORTED:
            return (
                f"rank {self.waiter} gave up waiting in {what}: {describe_abort(self.abort_from)}{late_txt}. "
                f"The group cannot be used any more: close it (rawflux.finalize()) and build a new one"
            )
        return f"unknown failure state {self.state} in {what} on rank {self.waiter}"


def describe_abort(word: int) -> str:
    """What an abort word says (comm/wait.cuh raise_abort): who gave up, and on whom when known."""
    src, late = (word & 0xFFFF) - 1, (word >> 16) - 1
    who = f"rank {src}" if src >= 0 else "another rank"
    on = f" on rank {late}" if late >= 0 else ""
    return f"{who} gave up{on} (a wait timed out or a call record differed) and raised the group's abort flag"


def decode_ctrl(raw: bytes, world: int) -> dict:
    """The interesting words of a control buffer (for tests and debugging)."""
    abort, claim = struct.unpack_from("<II", raw, CTRL_ABORT)
    (epoch,) = struct.unpack_from("<I", raw, CTRL_EPOCH)
    flags = list(struct.unpack_from(f"<{world}I", raw, CTRL_FLAGS))
    return {"abort": abort, "claim": claim, "epoch": epoch, "flags": flags}


def cuda_layout_asserts() -> str:
    """static_asserts that hold iff ctrl.cuh matches this module (compiled by the CPU tests)."""
    lines = [
        '#include "rawflux/comm/ctrl.cuh"',
        "namespace rawflux {",
        f"static_assert(kMaxWorld == {MAX_WORLD}, \"kMaxWorld\");",
        f"static_assert(kCtrlAbortOffset == {CTRL_ABORT} && kCtrlClaimOffset == {CTRL_CLAIM}, \"ctrl\");",
        f"static_assert(kCtrlEpochOffset == {CTRL_EPOCH} && kCtrlFlagsOffset == {CTRL_FLAGS}, \"ctrl\");",
        f"static_assert(kCtrlBytes == {CTRL_BYTES}, \"ctrl bytes\");",
        f"static_assert(sizeof(GroupCtrl) == {GROUP_CTRL_BYTES}, \"GroupCtrl\");",
        f"static_assert(sizeof(Status) == {STATUS_BYTES}, \"Status\");",
        f"static_assert(kOpBarrier == {OP_BARRIER} && kOpAgGemm == {OP_AG_GEMM} && kOpGemmRs == {OP_GEMM_RS}, \"ops\");",
        f"static_assert(kOpSignalWait == {OP_SIGNAL_WAIT} && kOpSelfTest == {OP_SELFTEST} && kOpGemmAr == {OP_GEMM_AR}, \"ops\");",
        f"static_assert(kStateTimeout == {STATE_TIMEOUT} && kStateAborted == {STATE_ABORTED} && kStateCallMismatch == {STATE_CALL_MISMATCH}, \"states\");",
    ]
    for field, off in GROUP_CTRL_OFFSETS.items():
        lines.append(f"static_assert(__builtin_offsetof(GroupCtrl, {field}) == {off}, \"GroupCtrl.{field}\");")
    for field, off in STATUS_OFFSETS.items():
        lines.append(f"static_assert(__builtin_offsetof(Status, {field}) == {off}, \"Status.{field}\");")
    lines += ["}  // namespace rawflux", "__global__ void rawflux_layout_probe() {}"]
    return "\n".join(lines) + "\n"
