"""The baselines' host logic with no GPU: a numpy stand-in for the slice of CuPy they use, NCCL
played by MPI, and the ipc backend's symmetric buffers played by POSIX shared memory (so
a rank really reads its peers' memory). Checks shapes, layouts, bias, both precisions, both
backends and the runtime intake against the float64 reference, under mpirun.

Device work is synchronous here, so this proves the arithmetic and the bookkeeping, not the
stream ordering (tests/mpi/test_baseline.py does that on a GPU).

    mpirun -np 2 python -m pytest --with-mpi tests/mpi/test_baseline_shim.py
"""
from __future__ import annotations

import contextlib
import ctypes
import sys
import types

import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.mpi(min_size=2)

BF16 = np.dtype(ml_dtypes.bfloat16)
NCCL_NP = {6: np.dtype(np.float16), 7: np.dtype(np.float32), 9: BF16}


# --- a numpy stand-in for the CuPy calls the baseline and rawflux.runtime make ------------------

class _Ptr:
    def __init__(self, ptr):
        self.ptr = ptr


class FakeArray(np.ndarray):
    """numpy memory posing as a CuPy array on device 0 (``data.ptr`` is the host address)."""

    @property
    def data(self):
        return _Ptr(self.ctypes.data)

    @property
    def device(self):
        return types.SimpleNamespace(id=0)


FakeArray.__module__ = "cupy._fake"  # rawflux.runtime recognises CuPy arrays by their module


def _fake(x):
    return np.asarray(x).view(FakeArray)


def _from_address(ptr, shape, dtype, strides=None):
    dtype = np.dtype(dtype)
    span = sum((n - 1) * s for n, s in zip(shape, strides)) + dtype.itemsize if strides else int(np.prod(shape)) * dtype.itemsize
    raw = (ctypes.c_char * max(1, span)).from_address(ptr)
    return np.ndarray(shape, dtype=dtype, buffer=raw, strides=strides).view(FakeArray)


class _Scope:
    def __init__(self, *a, **k):
        self.ptr = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def use(self):
        return self


def make_cupy():
    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    runtime = types.ModuleType("cupy.cuda.runtime")
    cupy.cuda = cuda
    cuda.runtime = runtime
    cupy.ndarray = lambda shape, dtype, memptr, strides=None: _from_address(memptr.mem.ptr + memptr.offset, shape, dtype, strides)
    cupy.empty = lambda shape, dtype=np.float32: _fake(np.empty(shape, dtype))
    cupy.matmul = lambda a, b, out=None: _fake(np.matmul(a, b, out=out)) if out is None else np.matmul(a, b, out=out)
    cupy.ascontiguousarray = lambda a: _fake(np.ascontiguousarray(a))
    cuda.Device = _Scope
    cuda.UnownedMemory = lambda ptr, size, owner, device_id=None: types.SimpleNamespace(ptr=ptr, size=size, owner=owner)
    cuda.MemoryPointer = lambda mem, offset: types.SimpleNamespace(mem=mem, offset=offset)
    cuda.get_current_stream = lambda dev=-1: types.SimpleNamespace(ptr=0)
    cuda.Stream = types.SimpleNamespace(from_external=lambda h: _Scope())
    runtime.memcpyAsync = lambda dst, src, size, kind, stream: ctypes.memmove(dst, src, size)
    return cupy


# --- NCCL by MPI, and a group with symmetric buffers in POSIX shared memory -------------------

class MpiNccl:
    def __init__(self, comm):
        self.comm = comm

    def allGather(self, send, recv, count, dtype, stream):
        nbytes = count * NCCL_NP[dtype].itemsize
        parts = self.comm.allgather(ctypes.string_at(send, nbytes))
        for q, part in enumerate(parts):
            ctypes.memmove(recv + q * nbytes, part, nbytes)

    def reduceScatter(self, send, recv, recvcount, dtype, op, stream):
        dt, world, rank = NCCL_NP[dtype], self.comm.Get_size(), self.comm.Get_rank()
        mine = _from_address(send, (world * recvcount,), dt)
        parts = self.comm.allgather(np.array(mine))  # every rank's partial; each keeps its own chunk's sum
        acc = parts[0][rank * recvcount:(rank + 1) * recvcount].copy()
        for p in parts[1:]:
            acc = (acc + p[rank * recvcount:(rank + 1) * recvcount]).astype(dt)  # sums in the dtype, like NCCL
        ctypes.memmove(recv, acc.ctypes.data, acc.nbytes)


class ShmBuffer:
    """One rank's POSIX shared-memory segment, with every peer's segment attached."""

    def __init__(self, comm, nbytes, name):
        from multiprocessing import resource_tracker, shared_memory

        self.nbytes, self.rank, self.name, self.closed = nbytes, comm.Get_rank(), name, False
        self.own = shared_memory.SharedMemory(create=True, size=nbytes)
        names = comm.allgather(self.own.name)
        self.segs = [self.own if q == self.rank else shared_memory.SharedMemory(name=nm) for q, nm in enumerate(names)]
        for q, seg in enumerate(self.segs):
            if q != self.rank:
                resource_tracker.unregister(seg._name, "shared_memory")  # the owner unlinks it, not us
        self.peer_ptrs = [ctypes.addressof(ctypes.c_char.from_buffer(seg.buf)) for seg in self.segs]

    def view(self, dtype="uint8", count=None):
        return self.peer_view(self.rank, dtype, count)

    def peer_view(self, q, dtype="uint8", count=None):
        dt = np.dtype(dtype)
        return _from_address(self.peer_ptrs[q], (self.nbytes // dt.itemsize if count is None else count,), dt)

    def free(self, comm):
        self.closed = True
        self.peer_ptrs = []
        comm.Barrier()  # no peer reads this rank's segment any more
        for seg in self.segs:
            seg.close()
        self.own.unlink()


class ShimGroup:
    def __init__(self, comm, shared_gpu):
        self.comm, self.rank, self.world, self.device_id = comm, comm.Get_rank(), comm.Get_size(), 0
        self.bus_ids = ["0000:01:00.0"] * self.world if shared_gpu else [f"0000:{q + 1:02x}:00.0" for q in range(self.world)]
        self.peer_access = True
        self._nccl = MpiNccl(comm)
        self.barriers = 0
        self.buffers = []

    def nccl(self):
        if len(set(self.bus_ids)) < self.world:
            raise RuntimeError("Duplicate GPU detected")  # what NCCL does on the emulated node
        return self._nccl

    def barrier(self, stream=None):
        self.barriers += 1
        self.comm.Barrier()  # device work is synchronous here: a host barrier orders it exactly

    def symmetric(self, nbytes, name):
        buf = ShmBuffer(self.comm, nbytes, name)
        self.buffers.append(buf)
        return buf

    def free_symmetric(self, buf):
        buf.free(self.comm)
        self.buffers.remove(buf)


@pytest.fixture
def shim(monkeypatch):
    cupy = make_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cupy.cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.runtime", cupy.cuda.runtime)
    from rawflux import baseline
    from rawflux.runtime import streams

    monkeypatch.setattr(streams, "use_stream", lambda stream, device=None: contextlib.nullcontext(stream))
    monkeypatch.setattr(baseline, "use_stream", lambda stream, device=None: contextlib.nullcontext(stream))
    monkeypatch.setattr(baseline, "_ipc_bufs", {})
    from rawflux.runtime import arrays

    monkeypatch.setattr(arrays, "use_stream", lambda stream, device=None: contextlib.nullcontext(stream))
    from rawflux.runtime import device

    monkeypatch.setattr(device, "_ok", True)  # the shim stands in for a working CUDA
    return baseline


@pytest.fixture(params=["nccl", "ipc"])
def setup(request, shim):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD.Dup()
    group = ShimGroup(comm, shared_gpu=request.param == "ipc")
    yield shim, group, request.param
    for buf in list(group.buffers):
        group.free_symmetric(buf)
    comm.Free()


def _rand(rng, shape, dt):
    return _fake(rng.standard_normal(shape).astype(dt))


def _rel(got, ref):
    got = np.asarray(got).astype(np.float64)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("dt", [BF16, np.dtype(np.float32)])
@pytest.mark.parametrize("layout, with_bias, accum", [("nk", False, "input"), ("kn", True, "input"), ("nk", True, "fp32")])
def test_ag_gemm(setup, dt, layout, with_bias, accum):
    baseline, group, backend = setup
    rng = np.random.default_rng()
    world, m_loc, k, n = group.world, 6, 20, 10
    a = _rand(rng, (m_loc, k), dt)
    b = _rand(rng, (n, k) if layout == "nk" else (k, n), dt)
    bias = _rand(rng, (n,), dt) if with_bias else None
    gathered = _fake(np.full((m_loc * world, k), np.nan, dt))
    out = baseline.ag_gemm(a, b, group, b_layout=layout, bias=bias, gathered_out=gathered, accum=accum)  # auto backend
    assert isinstance(out, FakeArray) and out.shape == (m_loc * world, n) and out.dtype == dt
    shards = group.comm.allgather(np.asarray(a))
    np.testing.assert_array_equal(np.asarray(gathered), np.concatenate(shards))
    ref = baseline.reference_ag_gemm(shards, np.asarray(b), b_layout=layout, bias=None if bias is None else np.asarray(bias))
    assert _rel(out, ref) < (1e-2 if dt == BF16 else 1e-5)
    assert group.barriers == (2 if backend == "ipc" else 0)


@pytest.mark.parametrize("dt", [BF16, np.dtype(np.float32)])
@pytest.mark.parametrize("layout, with_bias, accum", [("nk", False, "input"), ("kn", True, "input"), ("nk", True, "fp32")])
def test_gemm_rs(setup, dt, layout, with_bias, accum):
    baseline, group, backend = setup
    rng = np.random.default_rng()
    world, rank = group.world, group.rank
    m, k_loc, n = 4 * world, 12, 10
    a = _rand(rng, (m, k_loc), dt)
    b = _rand(rng, (n, k_loc) if layout == "nk" else (k_loc, n), dt)
    bias = group.comm.bcast(np.asarray(_rand(rng, (n,), dt)) if with_bias else None, root=0)  # one bias for the layer
    out = _fake(np.full((m // world, n), np.nan, dt))
    got = baseline.gemm_rs(a, b, group, b_layout=layout, bias=None if bias is None else _fake(bias), out=out, accum=accum)
    assert got is out
    ref = baseline.reference_gemm_rs(group.comm.allgather(np.asarray(a)), group.comm.allgather(np.asarray(b)), rank=rank,
                                     b_layout=layout, bias=None if bias is None else np.asarray(bias))
    assert np.isfinite(np.asarray(out, dtype=np.float64)).all()
    assert _rel(out, ref) < (1e-2 if dt == BF16 else 1e-5)
    assert group.barriers == (2 if backend == "ipc" else 0)


def test_ipc_buffers_grow_and_are_reused(setup):
    baseline, group, backend = setup
    if backend != "ipc":
        pytest.skip("ipc bookkeeping only")
    rng = np.random.default_rng()
    sizes = []
    for m_loc in (4, 4, 40000, 8):  # 40000 rows of 8 bf16 outgrow the first 1 MiB buffer
        baseline.ag_gemm(_rand(rng, (m_loc, 8), BF16), _rand(rng, (3, 8), BF16), group)
        sizes.append(group.buffers[0].nbytes)
    assert [b.name for b in group.buffers] == ["rawflux.baseline.ag"]  # the outgrown one was freed
    assert sizes[0] == sizes[1] == 1 << 20 and sizes[2] == sizes[3] >= 40000 * group.world * 8 * 2


def test_bad_calls_raise_on_every_rank_before_any_collective(setup):
    baseline, group, _ = setup
    rng = np.random.default_rng()
    with pytest.raises(ValueError, match="divisible"):
        baseline.gemm_rs(_rand(rng, (group.world * 2 + 1, 4), BF16), _rand(rng, (3, 4), BF16), group)
    with pytest.raises(TypeError, match="dtype"):
        baseline.ag_gemm(_rand(rng, (2, 4), BF16), _rand(rng, (3, 4), np.float32), group)
    with pytest.raises(ValueError, match="bias"):
        baseline.ag_gemm(_rand(rng, (2, 4), BF16), _rand(rng, (3, 4), BF16), group, bias=_rand(rng, (4,), BF16))
    assert group.barriers == 0
