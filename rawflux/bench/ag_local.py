"""AllGather-GEMM's fused GEMM of one rank at world W, on one GPU, without a group (no MPI, no IPC).

The peers' chunks are already in this rank's gathered buffer; what changes is when their ready
flags are released:
  * ``AgLocal.tax(...)``: every flag already set. The fused kernel (AgWait prologue, the fused
    configuration, every SM) against rawflux.gemm on the gathered A: the fusion tax, no link.
  * ``AgLocal.link(...)``: the link emulator. A one-thread kernel (kernels/link_emu.cu), launched
    just before the GEMM with the GEMM as its programmatic dependent, releases chunk (r + s) mod W's
    flag at s x chunk_bytes / G (the push schedule of ops/ag_gemm.py: one chunk at a time out of
    each rank, chunk r + 1 first), so the GEMM waits as it would behind a link of G GB/s. With S
    k-slabs, slab j of that chunk's flag at (j x (W - 1) + s) x chunk_bytes / (S x G) (slab-major,
    as the copies go). The own
    rows are read as a call reads them: a tile wholly inside the own chunk from a_shard in place
    (the tax: from the gathered buffer's own rows), the edge rows copied first. Not
    modelled: the peers' arrivals and the call-record check, and the HBM writes the arriving
    chunks would make. The
    emulator's CTA takes one SM from the GEMM (131 of 132 on an H200), which the times include.
"""
from __future__ import annotations

import struct
from types import SimpleNamespace

import numpy as np

from .. import engine, tune
from ..dist.layout import MAX_WORLD
from ..jit import register
from ..ops import ag_gemm as A
from ..runtime import DType, as_tensor
from ..tune.ag_order import slab_arrival_us
from .rs_local import _alloc, _bare_op, _group_ctrl

EMU_KERNEL_FILE = "link_emu.cu"
EMU_KERNEL = "rawflux::link_emu_kernel"
LINK_EMU_ARGS = struct.Struct("<QQQQii")  # LinkEmuArgs (kernels/link_emu.cu): ready, epoch, due_ns, flag, count, pad
EPOCH = 1  # the op's epoch before the first call: every flag holds it (every chunk landed)

register(EMU_KERNEL_FILE, EMU_KERNEL, archs=("sm_90a",))  # python -m rawflux.check_kernels compiles it


def push_arrivals(rank: int, world: int, chunk_bytes: int, gbps: float, slabs: int = 1) -> list[tuple[int, float]]:
    """(ready flag, ns after the call starts) in landing order on ``rank``: slab j of chunk
    (rank + s) mod W at (j x (W - 1) + s) x chunk_bytes / (slabs x G): the planner's schedule
    (tune.ag_order.slab_arrival_us; push_targets' steps, slab-major as ops.ag_gemm.schedule sends);
    the flag is ops.ag_gemm.ready_index(chunk, slab)."""
    # the planner's schedule (us), for a chunk of one chunk_bytes-byte row
    arr = slab_arrival_us(world, rank, 1, chunk_bytes, 1, gbps, slabs)
    landed = [(A.ready_index(q, j), t * 1e3) for q in range(world) if q != rank for j, t in enumerate(arr[q])]
    return sorted(landed, key=lambda f: f[1])


def t_gather_ms(world: int, m: int, k: int, itemsize: int, gbps: float) -> float:
    """(W - 1) chunks over one link of G GB/s, one after another (the push schedule)."""
    return (world - 1) * (m // world) * k * itemsize / gbps * 1e-6


class AgLocal:
    """Rank ``rank`` of an AGGemm at world W, without a group (see the module docstring).

    AgLocal(world, max_m, n, k, dtype="bf16"): n is this rank's n (n_local), k the full k.
    ``gathered(m)`` is the (m, k) CuPy view the GEMM reads (fill it before timing: the peers'
    rows stay as filled; a ``link`` call reads a_shard in place and copies only its edge rows,
    ops.ag_gemm.edge_rows, so fill the own rows with a_shard's);
    ``tax(b, out, m, stream)`` and ``link(a_shard, b, out, m, gbps, stream)`` issue one call each;
    ``config(m, link=)`` is the configuration each runs (the op's rule: ops.ag_gemm.fused_config),
    ``slabs(m, cfg)`` its k-slabs (the op's pick; ``slabs=`` overrides it per call).
    """

    def __init__(self, world: int, max_m: int, n: int, k: int, dtype="bf16", *, rank: int = 0, timeout_s: float = 10.0):
        import cupy

        from .. import tune

        if not 2 <= world <= MAX_WORLD or not 0 <= rank < world:
            raise ValueError(f"AgLocal: world {world}, rank {rank}")
        dt = DType.from_any(dtype)
        keep: list = []
        ctrl, status, _ = _group_ctrl(rank, world, timeout_s, keep)
        op = _bare_op(A.AGGemm, rank, world, status, timeout_s, ctrl)
        op.n, op.k, op.dtype, op.out_dtype, op.b_layout = int(n), int(k), dt, dt, "nk"
        op.direction, op.copy, op.paths = "push", "ce", ("ce",)
        op.m_local_cap = int(max_m) // world
        op.max_m = op.m_local_cap * world
        op.row_bytes = op.k * dt.itemsize
        op._cfgs, op._forced, op.tunable, op.last_tune, op.last_config = {}, {}, False, [], None
        op.slab_choice, op._slabs, op.b_first = None, {}, True
        op.sms = tune.device_info(0).sms
        op.copy_sms = op.ce_reserved_sms = 0  # push over copy engines between GPUs: every SM for the GEMM
        op._gath = SimpleNamespace(ptr=int(_alloc(op.max_m * op.row_bytes, keep).data.ptr))
        # Two sync buffers. The link's: its epoch advances with each link call (ag_local_kernel),
        # whose flags the emulator releases; every "peer" of the table is this buffer, so the call's
        # start writes its record and arrivals where nobody reads them. The tax's: epoch and every
        # ready flag at EPOCH for good (every chunk and slab landed), never written by a call.
        syncs = []
        for _ in range(2):
            sync = _alloc(A.SYNC_BYTES, keep)
            words = sync.view(np.uint32)
            words[A.EPOCH_OFFSET // 4] = EPOCH
            words[A.READY_OFFSET // 4:A.READY_OFFSET // 4 + MAX_WORLD * A.MAX_SLABS] = EPOCH
            table = cupy.asarray(np.full(world, int(sync.data.ptr), dtype=np.uint64))
            keep.append(table)
            syncs.append(SimpleNamespace(ptr=int(sync.data.ptr), peer_table_ptr=int(table.data.ptr)))
        op._sync, self._sync_tax = syncs
        self._ready_ptr = op._sync.ptr + A.READY_OFFSET
        self.op, self.status, self.world, self.rank, self._keep = op, status, world, rank, keep
        self._emu = op.kernel(EMU_KERNEL_FILE, EMU_KERNEL)
        op.kernel(A.KERNEL_FILE, A.LOCAL_KERNEL)
        self._due: dict[tuple, tuple] = {}
        self._record = A.CALL_RECORD.pack(*([0] * 16))
        cupy.cuda.Device(0).synchronize()

    @property
    def sms(self) -> int:
        return self.op.sms

    def gathered(self, m: int):
        return self.op.gathered(m)

    def config(self, m: int, *, link: bool = False, base=None):
        """The fused configuration of calls of m (fused_config over rawflux.gemm's pick, or over
        ``base``); behind the emulator on one SM fewer."""
        op = self.op
        return A.fused_config(op._default(m) if base is None else base, m, self.world, op.sms - 1 if link else 0, rank=self.rank,
                              n=op.n, k=op.k, dev=tune.device_info(0), out_bytes=op.out_dtype.itemsize)

    def slabs(self, m: int, cfg) -> int:
        """The op's k-slabs for calls of m on configuration cfg, as the device alone picks them
        (ops.ag_gemm.AGGemm.slabs, eager=False: the emulated link issues no copies from the host)."""
        return self.op.slabs(m, cfg, eager=False)

    def failed(self) -> int:
        return self.status.state()

    def _gemm(self, s: int, cfg, m: int, b, out, pdl: bool, slabs: int, own: tuple[int, int]) -> None:
        """The fused GEMM, its own tiles reading ``own`` (pointer, row pitch in bytes) in place as a call's would."""
        op, m_loc = self.op, m // self.world
        _, own = op._in_place(m_loc, cfg, False, *own)
        op._launch_gemm(s, op._prepare_gemm(s, cfg, m_loc, as_tensor(b, "b"), as_tensor(out, "out"), 0, 0, slabs, own), pdl=pdl)
        op.last_config = cfg

    def tax(self, b, out, m: int, stream: int, cfg=None, slabs: int | None = None) -> None:
        """One call with every chunk landed; ``slabs`` (default the op's pick) sets how many k-slab
        flags the GEMM waits for (each already set)."""
        cfg = cfg or self.config(m)
        op = self.op
        link_sync, op._sync = op._sync, self._sync_tax  # the GEMM's waits read the tax's flags
        m_loc = m // self.world
        own = (op._gath.ptr + self.rank * op.chunk_bytes(m_loc), op.row_bytes)  # the own rows, as filled, read in place
        try:
            self._gemm(stream, cfg, m, b, out, pdl=False, slabs=self.slabs(m, cfg) if slabs is None else slabs, own=own)
        finally:
            op._sync = link_sync

    def link(self, a_shard, b, out, m: int, gbps: float, stream: int, cfg=None, slabs: int | None = None,
             latency_us: float = 0.0) -> None:
        """One call behind the emulated link of ``gbps`` GB/s (see the module docstring), chunks in
        ``slabs`` k-slabs (default the op's pick), every arrival ``latency_us`` later (a link's
        first-byte and flag latency, which the bandwidth model leaves out)."""
        import cupy
        from cupy.cuda import runtime

        op, W = self.op, self.world
        m_loc = m // W
        ta = as_tensor(a_shard, "a_shard")
        if ta.shape != (m_loc, op.k):
            raise ValueError(f"AgLocal.link: a_shard is {tuple(ta.shape)}, not ({m_loc}, {op.k})")
        cfg = cfg or self.config(m, link=True)
        slabs = self.slabs(m, cfg) if slabs is None else int(slabs)
        pitch = ta.strides[0] * ta.itemsize if m_loc > 1 else op.row_bytes
        # the epoch, the own rows a tile shares with a peer's (the GEMM reads the rest of a_shard in place)
        op._launch_local(stream, ta.ptr, pitch, m_loc, self._record, flags=0, edges=op._edges(m_loc, cfg, False))
        runtime.memsetAsync(self._ready_ptr, 0, 4 * W * A.MAX_SLABS, stream)  # no peer chunk of this call has landed
        key = (m, float(gbps), slabs, float(latency_us))
        if key not in self._due:
            arr = push_arrivals(self.rank, W, op.chunk_bytes(m_loc), gbps, slabs)
            self._due[key] = (cupy.asarray(np.array([round(t + latency_us * 1e3) for _, t in arr], dtype=np.uint64)),
                              cupy.asarray(np.array([f for f, _ in arr], dtype=np.int32)))
        due, flag = self._due[key]
        args = LINK_EMU_ARGS.pack(self._ready_ptr, op.epoch_ptr, int(due.data.ptr), int(flag.data.ptr), len(due), 0)
        engine.launch(self._emu, 1, 32, 1, 0, stream, (args,))
        self._gemm(stream, cfg, m, b, out, pdl=True, slabs=slabs, own=(ta.ptr, pitch))
