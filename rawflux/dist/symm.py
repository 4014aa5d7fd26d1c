"""Symmetric buffers: one allocation of the same size on every rank, each mapped into every peer.

``Group.symmetric(nbytes, name)`` is collective. Every rank allocates ``nbytes``, rounded up to
whole 2 MiB blocks, with a plain cudaMalloc (never CuPy's pool), zeroes it, exports it with
cudaIpcGetMemHandle, and all handles are exchanged at once, together with each rank's (nbytes,
name), so that mismatched calls fail on every rank with one clear error instead of corrupting
memory. The exchanges are bounded by the group's timeout (``topology.exchange``): a rank that
died or makes another call is named instead of hanging the others. Each rank then opens every
peer's handle (cudaIpcOpenMemHandle; its own entry is its own pointer). Two ranks on one GPU (the
emulated node under MPS) work the same way: opening a handle exported by another process on the
same device maps the same memory.

An IPC handle describes a whole underlying block, and cudaIpcOpenMemHandle maps it from the
block's base. cudaMalloc may sub-allocate small buffers from one block (the CUDA programming
guide says so; a pool does it always), so a peer that took the opened pointer for the buffer
would read another buffer of that block. (gemm_rs once raised a CallMismatch at world 2 on one
machine, three runs out of three, where a peer's call record read back a value that was
no record: what such aliasing would do; tests/cpu/test_ag_ce_ordering.py shows it is also the
one cause that fits the copy-engine AllGather's lost chunk of 73ae221.) So each rank also sends
its buffer's offset from its block's base (cuMemGetAddressRange) and peers add it, and the 2 MiB
rounding keeps every symmetric buffer in blocks of its own, so no block is opened twice and
nothing else is exposed. And every mapping is proven before use: each rank writes a stamp (a
random nonce and its rank) into its allocation past the buffer's bytes, where nothing else
writes; each peer reads it back through its mapping and compares it with the stamp sent in the
exchange. A mapping that lands anywhere else fails on every rank with a DistError naming it,
instead of corrupting data silently.

``peer_ptrs[q]`` is rank q's buffer as mapped in this process; ``peer_ptrs_dev`` is the same
table in device memory (u64[world]) for kernels: ``peer_ptr<T>(table, q, offset)`` in
cuda_src/rawflux/comm/signal.cuh.

Reusing a peer-visible buffer (DESIGN hazard 3)
-----------------------------------------------
A rank's buffer may be read or written by peers at any time between the moment they learn it is
ready and the moment they are done with it, and nothing on the writing rank sees that moment by
itself. So, between two calls that use the same buffer:

* Never overwrite data a peer may still read, and never zero or reset a flag a peer may still
  wait on, until every peer has said it is done. Two ways, both capturable in a CUDA graph:
  1. a device-side barrier (``Group.barrier(stream)``) on the op's stream before the next
     writes: after it, every peer has finished the kernels it issued before its own barrier
     call, reads of the old data included;
  2. flags that carry a call counter that only grows (``flag >= call_id``, wrap-safe): a flag
     is never reset, so a stale value from the previous call can never satisfy the next wait;
     the data may still only be overwritten once the readers signalled (a "done" flag per peer,
     or the barrier of 1.).
* A producer publishes data, then the flag, with a release (``signal_set``), and a consumer
  reads the flag with an acquire (``wait_flag_geq``) before the data (comm/signal.cuh,
  comm/wait.cuh). TMA stores must be complete before the release.
* Memory is freed only at ``Group.close()`` / ``free_symmetric()``, after a barrier: a peer may
  hold a mapping until then. A captured graph that uses a buffer must not outlive it.
"""
from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass, field

from .topology import DistError, check_symmetric_requests


@dataclass(eq=False)
class SymmetricBuffer:
    """One rank's view of a symmetric allocation. Valid until the group closes or
    ``Group.free_symmetric(buf)``."""

    name: str
    nbytes: int
    ptr: int  # this rank's buffer
    peer_ptrs: list[int]  # rank q's buffer, mapped into this process (own rank: ptr)
    peer_table_ptr: int  # device u64[world] holding peer_ptrs
    peer_ptrs_dev: object  # CuPy u64[world] view of the table (kernels take .data.ptr)
    rank: int
    world: int
    device_id: int
    _imported: list[int] = field(default_factory=list, repr=False)  # IPC mappings to close
    closed: bool = False

    def view(self, dtype="uint8", count: int | None = None):
        """A CuPy array over this rank's buffer (no copy)."""
        return self.peer_view(self.rank, dtype, count)

    def peer_view(self, q: int, dtype="uint8", count: int | None = None):
        """A CuPy array over rank q's buffer as mapped here (for copies and tests)."""
        import cupy

        if self.closed:
            raise DistError(f"symmetric buffer '{self.name}' was freed")
        dt = cupy.dtype(dtype)
        n = self.nbytes // dt.itemsize if count is None else int(count)
        if n * dt.itemsize > self.nbytes:
            raise ValueError(f"{n} x {dt} does not fit in symmetric buffer '{self.name}' ({self.nbytes} bytes)")
        mem = cupy.cuda.UnownedMemory(self.peer_ptrs[q], self.nbytes, self, self.device_id)
        return cupy.ndarray((n,), dtype=dt, memptr=cupy.cuda.MemoryPointer(mem, 0))


def collective_try(mpi, fn, what: str, gather=None):
    """Run ``fn()`` on every rank and gather the results (``gather``, else mpi.allgather); if it
    raised on any rank, raise one DistError on every rank naming them (so no rank is left waiting
    in the next collective)."""
    try:
        val, err = fn(), None
    except Exception as e:  # noqa: BLE001 - reported to every rank below
        val, err = None, f"{type(e).__name__}: {e}"
    gathered = (gather or mpi.allgather)((val, err))
    bad = [(q, e) for q, (_, e) in enumerate(gathered) if e is not None]
    if bad:
        raise DistError(f"{what} failed on rank(s) {[q for q, _ in bad]}: " + "; ".join(f"rank {q}: {e}" for q, e in bad))
    return [v for v, _ in gathered]


ALLOC_BLOCK = 2 << 20  # symmetric buffers are whole blocks of this many bytes (the module docstring)
STAMP = struct.Struct("<QQ")  # the mapping check's stamp: (nonce, rank), in the allocation's last bytes


def alloc_bytes(nbytes: int) -> int:
    """Bytes actually allocated for ``nbytes`` of payload, in whole blocks."""
    return -(-max(1, int(nbytes)) // ALLOC_BLOCK) * ALLOC_BLOCK


def stamp_offset(nbytes: int) -> int:
    """Where a buffer of ``nbytes`` keeps its mapping stamp: its allocation's last STAMP.size bytes,
    past every byte the buffer's users touch (the same offset on every rank)."""
    return alloc_bytes(int(nbytes) + STAMP.size) - STAMP.size


def check_stamp(got: bytes, want: bytes, q: int, name: str, at: int) -> None:
    """The stamp rank q wrote, read back through this rank's mapping of its buffer."""
    if bytes(got) != bytes(want):
        raise RuntimeError(
            f"rank {q}'s buffer '{name}' maps to other memory here: byte {at} reads {bytes(got).hex()} where rank {q} "
            f"wrote its stamp {bytes(want).hex()} (an IPC mapping that does not start where the buffer does, e.g. "
            "a sub-allocated cudaMalloc block whose offset the driver did not report)"
        )


def allocate(group, nbytes: int, name: str) -> SymmetricBuffer:
    """Collective over ``group``; see the module docstring."""
    be = group._backend
    rank, world = group.rank, group.world
    nbytes = int(nbytes)
    name = str(name)
    ptr = offset = 0
    handle = err = None
    stamp = STAMP.pack(secrets.randbits(64), rank)
    at = stamp_offset(nbytes) if nbytes > 0 else 0
    if nbytes > 0:
        try:
            size = at + STAMP.size
            ptr = be.malloc(size)
            be.memset(ptr, 0, size)  # synchronous: zero before any peer can map and write it
            be.memcpy_htod(ptr + at, stamp)  # synchronous: in place before any peer reads it
            base, block = be.address_range(ptr)
            offset = ptr - base
            if offset < 0 or offset + size > block:
                raise RuntimeError(f"buffer {ptr:#x} ({size} bytes) is not inside its block ({base:#x}, {block} bytes)")
            handle = be.ipc_get(ptr)
        except Exception as e:  # noqa: BLE001 - reported to every rank below
            err = f"{type(e).__name__}: {e}"
    # One exchange carries the request (for the check), the handle, the offset in its block and
    # the stamp; bounded by the group's timeout (a rank that died or makes another call is named).
    what = f"symmetric buffer '{name}'"

    def release():
        # After a failed exchange a late peer may have mapped it: the group's close() decides.
        if getattr(group, "_failure", None):
            group._buffers.append(SymmetricBuffer(name, nbytes, ptr, [], 0, None, rank, world, group.device_id))
        else:
            be.free(ptr)

    try:
        gathered = group._exchange("symmetric()", (nbytes, name, handle, offset, err, stamp), what)
    except Exception:
        if ptr:
            release()
        raise
    try:
        check_symmetric_requests([(n, nm) for n, nm, *_ in gathered], rank)
        bad = [(q, e) for q, (_, _, _, _, e, _) in enumerate(gathered) if e is not None]
        if bad:
            raise DistError(
                f"symmetric buffer '{name}' ({nbytes} bytes): allocation failed on rank(s) "
                f"{[q for q, _ in bad]}: " + "; ".join(f"rank {q}: {e}" for q, e in bad)
            )
    except Exception:
        if ptr:
            be.free(ptr)
        raise

    imported: list[int] = []
    table = 0

    def open_all():
        nonlocal table
        peers = []
        for q, (_, _, h, off, _, want) in enumerate(gathered):
            if q == rank:
                peers.append(ptr)
            else:
                p = be.ipc_open(h)  # the base of rank q's block: closed by this pointer
                imported.append(p)
                peers.append(p + off)
                check_stamp(be.memcpy_dtoh(p + off + at, STAMP.size), want, q, name, at)
        table = be.malloc(8 * world)
        be.memcpy_htod(table, struct.pack(f"<{world}Q", *peers))
        return peers

    try:
        peer_ptrs = collective_try(group._mpi, open_all, f"mapping {what} (cudaIpcOpenMemHandle)",
                                   gather=lambda v: group._exchange("symmetric() mapping", v, f"mapping {what}"))[rank]
    except Exception:
        for p in imported:
            be.ipc_close(p)
        if table:
            be.free(table)
        release()
        raise
    table_dev = be.device_u64_array(table, world, group.device_id)
    return SymmetricBuffer(name, nbytes, ptr, list(peer_ptrs), table, table_dev, rank, world, group.device_id, imported)


def close_mappings(be, buf: SymmetricBuffer) -> None:
    """Unmap the peers' buffers (local; only once no kernel of this rank uses them)."""
    while buf._imported:
        be.ipc_close(buf._imported.pop())


def free_local(be, buf: SymmetricBuffer, shared: bool = True) -> None:
    """Free this rank's peer table (only its own kernels read it) and, with ``shared``, its
    allocation (only once no peer maps it any more; else it is left allocated)."""
    if buf.closed:
        return
    buf.closed = True
    if buf.peer_table_ptr:
        be.free(buf.peer_table_ptr)
    if buf.ptr and shared:
        be.free(buf.ptr)
