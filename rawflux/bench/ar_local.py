"""GEMM + AllReduce's kernel for one rank of a world W inside one process, without a group: the
fusion tax (benchmarks/fusion_tax.py --op gemm_ar).

``local_ar_tax(W, ...)`` returns rank 0's op on every SM whose peers' buffers are local stand-ins,
with the peers' flags and records to it pre-set: the same kernel, the same W sends and W reads per
tile, no link and no waiting. Its time over rawflux.gemm's on the same problem is the tax.
"""
from __future__ import annotations

import numpy as np

from ..ops import gemm_ar as A
from ..ops.gemm_rs import FLAGS_OFFSET, RECORD_BYTES
from ..dist.layout import OP_GEMM_AR
from ..ops._collective import call_record
from .rs_local import _FOREVER, _Buf, _alloc, _bare_op, _group_ctrl, _table


def local_ar_tax(world: int, max_m: int, n: int, k: int, dtype="bf16", b_layout: str = "nk", *, partials: str | None = None,
                 config=None, timeout_s: float = 10.0):
    """Rank 0's GemmAR of a world W, peers mapped onto local buffers; call ``op.preset(m)`` before
    calls of m, then call it like GemmAR: ``op(a, b_shard, bias=None, out=None, stream=None)``."""
    import cupy

    dt, partials = A.check_op_args(world, max_m, n, k, dtype, b_layout, partials)
    keep: list = []
    part_bytes = A.PARTIALS[partials][1]
    tiles = [config.tile] if config is not None else A.ar_tiles(b_layout, partials)
    cap = A.tiles_cap_for(max_m, n, tiles)
    sms = cupy.cuda.Device(0).attributes["MultiProcessorCount"]
    # distinct stand-ins, so each peer's send lands where it would on that peer
    recv = [_alloc(A.recv_bytes(max_m, world, n, part_bytes), keep) for _ in range(world)]
    sync = [_alloc(A.sync_bytes(world, cap), keep) for _ in range(world)]
    ctrl, status, _ = _group_ctrl(0, world, timeout_s, keep)
    op = _bare_op(A.GemmAR, 0, world, status, timeout_s, ctrl)
    op.dtype, op.partials, op.max_m, op.n, op.k, op.b_layout = dt, partials, max_m, n, k, b_layout
    op._configure(config, sms)
    op.tunable = False  # no group to agree a tuned configuration with: the model's pick
    recv_ptrs = [int(b.data.ptr) for b in recv]
    sync_ptrs = [int(b.data.ptr) for b in sync]
    op.recv = _Buf(ptr=recv_ptrs[0], peer_ptrs=recv_ptrs, peer_table_ptr=_table(recv_ptrs, keep))
    op.sync = _Buf(ptr=sync_ptrs[0], peer_ptrs=sync_ptrs, peer_table_ptr=_table(sync_ptrs, keep))
    op.failed = status.state
    op._keep = keep
    own = sync[0]
    own[FLAGS_OFFSET:].view(np.uint32)[:] = _FOREVER  # every peer's flag of both parities, for every epoch to come

    def preset(m: int) -> None:
        """The peers' call records for calls of m (the record holds m)."""
        fields = op._plan_entry(m)[0]
        rec = cupy.asarray(np.array(call_record(OP_GEMM_AR, fields, _FOREVER), dtype=np.uint32))
        for parity in (0, 1):
            for q in range(1, world):
                off = A.record_offset(parity, q)
                own[off:off + RECORD_BYTES].view(np.uint32)[:] = rec

    op.preset = preset
    return op
