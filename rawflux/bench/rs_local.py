"""GEMM-ReduceScatter's kernel for W ranks inside one process, without a group (no MPI, no IPC).

Two uses, each its own question:
  * ``local_world(W, ..., tax=False)``: W launchers with distinct buffers; their kernels run on W
    streams of this GPU at once, each on SMs / W CTAs (so all are resident), and talk through the
    same receive slots, flags and records as across GPUs. The real protocol, for correctness only.
  * ``local_world(W, ..., tax=True)`` returns one launcher (rank 0) on every SM whose peers' buffers
    are local stand-ins, with the peers' flags and records to it pre-set: the same kernel, the same
    stores and reads, no link and no waiting. Its time over rawflux.gemm's on the same
    problem is the fusion tax (benchmarks/fusion_tax.py).
"""
from __future__ import annotations

import struct
import threading
from types import SimpleNamespace

import numpy as np

from ..ops import gemm_rs as R
from ..runtime import DType

_FOREVER = 0x7FFFFFFF  # a flag / record tag every epoch of a run is below (wrap-safe compare)


class _Buf(SimpleNamespace):
    """What GemmRS reads of a symmetric buffer: ptr, peer_ptrs, peer_table_ptr."""


def _alloc(nbytes: int, keep: list):
    import cupy

    a = cupy.zeros(max(int(nbytes), 16) // 8 * 8 + 8, dtype=cupy.uint8)
    keep.append(a)
    return a


def _table(ptrs, keep: list) -> int:
    import cupy

    t = cupy.asarray(np.array(ptrs, dtype=np.uint64))
    keep.append(t)
    return int(t.data.ptr)


class _HostStatus:
    """The Status record in pinned host memory mapped into the device, as a Group keeps it: reading
    it never synchronises the device (a device buffer read back per call would drain the stream
    before every launch, and the timings would include the host's launch path)."""

    def __init__(self):
        from ..dist._backend import CudaBackend

        self._be = CudaBackend()
        self.host, self.dev = self._be.host_alloc_mapped(64)

    def state(self) -> int:
        return struct.unpack("<I", self._be.read_host(self.host, 4))[0]

    def record(self):
        from ..dist.layout import STATUS_BYTES, StatusRecord

        return StatusRecord.from_bytes(self._be.read_host(self.host, STATUS_BYTES))

    def __del__(self):
        try:
            self._be.free_host(self.host)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _group_ctrl(rank: int, world: int, timeout_s: float, keep: list):
    """(GroupCtrl pointer, its status, its control buffer's pointer): a GroupCtrl (comm/ctrl.cuh)
    in device memory, its Status record in host-mapped memory (``failed()`` reads it) and its
    control words (abort, epoch) in a device buffer of this process, zero."""
    status = _HostStatus()
    keep.append(status)
    ctrl = _alloc(1024, keep)
    peers = _table([int(ctrl.data.ptr)] * world, keep)
    raw = struct.pack("<QQQii4Q", int(timeout_s * 1e9), status.dev, peers, rank, world, 0, 0, 0, 0)
    g = _alloc(64, keep)
    g[: len(raw)].set(np.frombuffer(raw, dtype=np.uint8))
    return int(g.data.ptr), status, int(ctrl.data.ptr)


class _FakeGroup:
    closed = False

    def __init__(self, rank, world, status, timeout_s):
        self.rank, self.world, self.timeout_s, self._status = rank, world, timeout_s, status
        self.device_id = 0

    @property
    def status(self):
        return self._status.record()  # the whole record: a failure is described like a Group's

    def healthy(self) -> bool:
        return self._status.record().state == 0


def _bare_op(cls, rank: int, world: int, status, timeout_s: float, ctrl: int):
    """An op object of ``cls`` whose CollectiveOp state is set by hand for a rank without a group
    (no buffers, no side streams); the caller sets the op's own state."""
    op = object.__new__(cls)
    op.group, op.rank, op.world, op.device_id = _FakeGroup(rank, world, status, timeout_s), rank, world, 0
    op._closed, op._buffers, op._streams, op.calls, op._kernels, op.capturing = False, [], [], 0, {}, False
    op._fast, op._fast_lock = {}, threading.Lock()
    op._group_ctrl = ctrl
    return op


def _launcher(rank: int, world: int, max_m: int, n: int, k: int, dt: DType, b_layout: str, partials: str, config, ctas: int,
              recv: list, sync: list, ctrl: int, status, timeout_s: float, keep: list):
    """A GemmRS of rank `rank` without a group: CollectiveOp's state by hand, then GemmRS's own."""
    op = _bare_op(R.GemmRS, rank, world, status, timeout_s, ctrl)
    op.dtype, op.partials, op.max_m, op.n, op.k, op.b_layout = dt, partials, max_m, n, k, b_layout
    op._configure(config, None, ctas)
    op.tunable = False  # no group to agree a tuned configuration with: the model's pick
    recv_ptrs = [int(b.data.ptr) for b in recv]
    sync_ptrs = [int(b.data.ptr) for b in sync]
    op.recv = _Buf(ptr=recv_ptrs[rank], peer_ptrs=recv_ptrs, peer_table_ptr=_table(recv_ptrs, keep))
    op.sync = _Buf(ptr=sync_ptrs[rank], peer_ptrs=sync_ptrs, peer_table_ptr=_table(sync_ptrs, keep))
    op.failed = status.state
    return op


def local_world(world: int, max_m: int, n: int, k: int, dtype="bf16", b_layout: str = "nk", *, partials: str | None = None,
                config=None, tax: bool = False, timeout_s: float = 10.0):
    """W launchers (tax=False) or the fusion tax's one (tax=True); see the module docstring. Each
    is called like GemmRS: ``op(a, b_shard, bias=None, out=None, stream=None)``."""
    import cupy

    dt, partials = R.check_op_args(world, max_m, n, k, dtype, b_layout, partials)
    keep: list = []
    part_bytes = R.PARTIALS[partials][1]
    tiles = [config.tile] if config is not None else R.rs_tiles(b_layout)
    cap = R.tiles_cap_for(max_m, world, n, tiles)
    sms = cupy.cuda.Device(0).attributes["MultiProcessorCount"]
    ranks = [0] if tax else list(range(world))
    # tax: the peers' buffers are local stand-ins that nobody reads (distinct, so the remote tiles'
    # stores land where they would on a peer, not all on one slot)
    recv = [_alloc(R.recv_bytes(max_m, n, part_bytes), keep) for _ in range(world)]
    sync = [_alloc(R.sync_bytes(world, cap), keep) for _ in range(world)]
    ops = []
    for r in ranks:
        ctrl, status, _ = _group_ctrl(r, world, timeout_s, keep)
        op = _launcher(r, world, max_m, n, k, dt, b_layout, partials, config, sms if tax else sms // world, recv, sync, ctrl, status,
                       timeout_s, keep)
        op._keep = keep
        ops.append(op)
    if tax:
        _preset_peers(ops[0], sync[0], world)
    return ops[0] if tax else ops


def _preset_peers(op, sync, world: int) -> None:
    """The fusion tax: the peers' flags of both parities set for every epoch to come; op.preset(m)
    sets their call records for calls of m (the record holds m)."""
    import cupy

    sync[R.FLAGS_OFFSET:].view(np.uint32)[:] = _FOREVER

    def preset(m: int) -> None:
        p = op.plan(m)
        rec = cupy.asarray(np.array(R.call_record(p.fields, tag=_FOREVER), dtype=np.uint32))
        for parity in (0, 1):
            for q in range(1, world):
                off = R.record_offset(parity, q)
                sync[off:off + R.RECORD_BYTES].view(np.uint32)[:] = rec

    op.preset = preset
