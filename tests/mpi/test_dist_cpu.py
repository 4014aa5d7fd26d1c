"""rawflux.dist on the CPU, under MPI: group formation, node-local ranks, device binding, peer
access decisions, symmetric-buffer handle exchange and checks, the barrier protocol's host side
(status record, CollectiveTimeout), teardown order, idempotence.

    mpirun -np 2 python -m pytest --with-mpi tests/mpi/test_dist_cpu.py
    mpirun -np 4 python -m pytest --with-mpi tests/mpi/test_dist_cpu.py

A fake backend stands in for CUDA: "device memory" is a file in a shared temp folder mapped by
mmap, so an "IPC handle" (the file's path) really maps the same bytes in the peer process, and
the fake barrier runs the device protocol of comm/barrier.cuh in Python over that memory. The
parts that need a real GPU are at the end and skip with the reason when there is none.
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import mmap
import os
import struct
import tempfile
import time

import numpy as np
import pytest

from rawflux.dist import layout, topology
from rawflux.dist.group import CollectiveTimeout, Group, current_group, finalize, init
from rawflux.dist.topology import DistError

mpi4py = pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

pytestmark = pytest.mark.mpi


class FakeBackend:
    """CUDA stand-in over shared files (see the module docstring). Logs every call."""

    name = "fake"
    _ids = itertools.count()

    def __init__(self, n_devices=1, peer_ok=True, folder=None):
        self.n_devices = n_devices
        self.peer_ok = peer_ok
        self.folder = folder or os.path.join(tempfile.gettempdir(), f"rawflux-fake-{os.getuid()}")
        os.makedirs(self.folder, exist_ok=True)
        self.log: list[tuple] = []
        self.current = None
        self.live: dict[int, tuple] = {}  # ptr -> (path, mmap, ctypes anchor, owned)
        self.hosts: dict[int, object] = {}
        self.fail_malloc = False

    # devices
    def device_count(self):
        return self.n_devices

    def use_device(self, dev):
        self.current = dev

    def device_scope(self, dev):
        return contextlib.nullcontext()

    def pci_bus_id(self, dev):
        return f"0000:{0x10 + dev:02X}:00.0"

    def device_by_pci_bus_id(self, bus):
        dev = int(bus.split(":")[1], 16) - 0x10
        return dev if 0 <= dev < self.n_devices else None

    def can_access_peer(self, dev, peer):
        return self.peer_ok

    def enable_peer_access(self, peer):
        self.log.append(("enable_peer_access", peer))

    # memory
    def _map(self, path, owned):
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        anchor = ctypes.c_char.from_buffer(mm)
        ptr = ctypes.addressof(anchor)
        self.live[ptr] = (path, mm, anchor, owned)
        return ptr

    def malloc(self, nbytes):
        if self.fail_malloc:
            raise MemoryError("fake out of memory")
        path = os.path.join(self.folder, f"{os.getpid()}_{next(self._ids)}")
        with open(path, "wb") as f:
            f.truncate(max(1, nbytes))
        self.log.append(("malloc", nbytes))
        return self._map(path, owned=True)

    def _unmap(self, ptr):
        path, mm, anchor, owned = self.live.pop(ptr)
        del anchor
        mm.close()
        return path, owned

    def free(self, ptr):
        path, owned = self._unmap(ptr)
        assert owned, "free() of a pointer this rank did not allocate"
        os.unlink(path)
        self.log.append(("free", ptr))

    def memset(self, ptr, value, nbytes):
        ctypes.memset(ptr, value, nbytes)

    def memcpy_htod(self, dst, data):
        ctypes.memmove(dst, bytes(data), len(data))

    def memcpy_dtoh(self, src, nbytes):
        return ctypes.string_at(src, nbytes)

    def address_range(self, ptr):
        return ptr, self.live[ptr][1].size()  # every fake allocation is a block of its own

    def ipc_get(self, ptr):
        return self.live[ptr][0].encode()

    def ipc_open(self, handle):
        self.log.append(("ipc_open",))
        return self._map(handle.decode(), owned=False)

    def ipc_close(self, ptr):
        _, owned = self._unmap(ptr)
        assert not owned
        self.log.append(("ipc_close", ptr))

    def host_alloc_mapped(self, nbytes):
        buf = ctypes.create_string_buffer(nbytes)
        ptr = ctypes.addressof(buf)
        self.hosts[ptr] = buf
        self.log.append(("host_alloc_mapped", nbytes))
        return ptr, ptr

    def free_host(self, ptr):
        del self.hosts[ptr]
        self.log.append(("free_host", ptr))

    def read_host(self, ptr, nbytes):
        return ctypes.string_at(ptr, nbytes)

    def device_u64_array(self, ptr, count, dev):
        return np.ctypeslib.as_array((ctypes.c_uint64 * count).from_address(ptr))

    # sync
    def synchronize(self):
        self.log.append(("synchronize",))

    def stream_synchronize(self, stream):
        self.log.append(("stream_synchronize",))

    def prepare_barrier(self, dev):
        pass

    # the protocol of comm/barrier.cuh, run on the host
    def launch_barrier(self, group_ctrl_ptr, world, dev, stream):
        self.log.append(("launch_barrier",))
        g = layout.unpack_group_ctrl(ctypes.string_at(group_ctrl_ptr, layout.GROUP_CTRL_BYTES))
        assert g["world"] == world
        rank = g["rank"]
        table = (ctypes.c_uint64 * world).from_address(g["ctrl_peers"])
        u32 = lambda base, off: ctypes.c_uint32.from_address(base + off)  # noqa: E731
        mine = table[rank]
        epoch = (u32(mine, layout.CTRL_EPOCH).value + 1) & 0xFFFFFFFF
        u32(mine, layout.CTRL_EPOCH).value = epoch
        geq = lambda a, b: ((a - b) & 0xFFFFFFFF) < 0x80000000  # noqa: E731
        t0 = time.monotonic()
        code = 2 if u32(mine, layout.CTRL_ABORT).value else 0
        if code == 0:
            for q in range(world):
                u32(table[q], layout.CTRL_FLAGS + 4 * rank).value = epoch
            while True:
                if all(geq(u32(mine, layout.CTRL_FLAGS + 4 * q).value, epoch) for q in range(world)):
                    return
                if u32(mine, layout.CTRL_ABORT).value:
                    code = 2
                    break
                if (time.monotonic() - t0) * 1e9 > g["timeout_ns"]:
                    code = 1
                    break
                time.sleep(0.0005)
        flags = [u32(mine, layout.CTRL_FLAGS + 4 * q).value for q in range(world)]
        late = [q for q in range(world) if not geq(flags[q], epoch)]
        if u32(mine, layout.CTRL_CLAIM).value == 0:
            u32(mine, layout.CTRL_CLAIM).value = 1
            rec = layout.StatusRecord(
                state=code, op=layout.OP_BARRIER, call_id=epoch, waiter=rank, peer=late[0] if late else -1, index=-1,
                expected=epoch, observed=flags[late[0]] if late else 0, elapsed_ns=int((time.monotonic() - t0) * 1e9),
                timeout_ns=g["timeout_ns"], late_mask=sum(1 << q for q in late),
                abort_from=u32(mine, layout.CTRL_ABORT).value)
            ctypes.memmove(g["status"], rec.to_bytes(), layout.STATUS_BYTES)
        if code == 1:
            for q in range(world):
                u32(table[q], layout.CTRL_ABORT).value = rank + 1


@pytest.fixture
def comm():
    c = MPI.COMM_WORLD.Dup()
    yield c
    finalize()
    c.Free()


def make(comm, **kw):
    be = kw.pop("backend", None) or FakeBackend()
    return init(comm, backend=be, **kw), be


# --- topology ----------------------------------------------------------------------------------

def test_form_local_ranks(comm):
    topo = topology.form(comm)
    assert (topo.rank, topo.world) == (comm.rank, comm.size)
    # mpirun on one machine: the whole communicator is one node, local rank = rank
    assert topo.local_world == comm.size
    assert topo.local_rank == comm.rank
    hosts = comm.allgather(topo.hostname)
    assert len(set(hosts)) == 1


@pytest.mark.mpi(min_size=2)
def test_group_spanning_two_nodes_is_refused(comm):
    fake_nodes = lambda c: c.Split(c.Get_rank() % 2, c.Get_rank())  # noqa: E731 - pretend 2 nodes
    with pytest.raises(DistError, match="must lie within one node"):
        topology.form(comm, split=fake_nodes)
    with pytest.raises(DistError, match="within one node"):
        init(comm, backend=FakeBackend(), split=fake_nodes)
    comm.Barrier()  # every rank raised (nobody is left inside a collective)


def test_choose_device():
    assert topology.choose_device(5, 4) == 1
    assert topology.choose_device(3, 1) == 0  # the emulated node: everyone on device 0
    assert topology.choose_device(3, 4, forced=2) == 2
    with pytest.raises(DistError, match="no CUDA device"):
        topology.choose_device(0, 0)
    with pytest.raises(DistError, match="only 2 device"):
        topology.choose_device(0, 2, forced=2)


def test_agree_names_the_odd_rank(comm):
    assert topology.agree(comm, 42, "the answer") == 42
    if comm.size > 1:
        with pytest.raises(DistError, match=r"ranks disagree on m .*ranks \[1\]"):
            topology.agree(comm, 7 if comm.rank == 1 else 8, "m")


# --- group formation ---------------------------------------------------------------------------

def test_init_is_idempotent_and_finalize_twice_is_safe(comm):
    g, be = make(comm)
    assert init(comm) is g
    assert current_group() is g
    assert (g.rank, g.world, g.local_rank) == (comm.rank, comm.size, comm.rank)
    assert g.peer_access and g.comm is comm
    finalize()
    assert g.closed
    finalize()
    g.close()
    with pytest.raises(DistError, match="no rawflux group"):
        current_group()
    with pytest.raises(DistError, match="closed"):
        g.barrier()


@pytest.mark.parametrize("n_devices", [1, 2, 8])
def test_device_binding(comm, n_devices):
    g, be = make(comm, backend=FakeBackend(n_devices=n_devices))
    assert g.device_id == comm.rank % n_devices
    same = [q % n_devices == comm.rank % n_devices for q in range(comm.size)]
    assert g.same_device == same
    enabled = sorted(p for op, *rest in be.log if op == "enable_peer_access" for p in rest)
    want = sorted(q % n_devices for q in range(comm.size) if not same[q])
    assert enabled == want  # every peer on another device, none on the same one


@pytest.mark.mpi(min_size=2)
def test_two_groups_on_one_node_get_distinct_devices(comm):
    half = comm.Split(comm.rank % 2, comm.rank)  # two "TP groups" sharing the node
    try:
        g, _ = make(half, backend=FakeBackend(n_devices=comm.size))
        assert g.world == half.size and g.local_world == half.size
        devices = comm.allgather(g.device_id)
        assert len(set(devices)) == comm.size, devices  # not both groups starting at device 0
        g.close()
    finally:
        half.Free()


def test_forced_device(comm, monkeypatch):
    monkeypatch.setenv("RAWFLUX_DEVICE", "1")
    g, _ = make(comm, backend=FakeBackend(n_devices=2))
    assert g.device_id == 1 and all(g.same_device)


def test_forced_device_out_of_range_fails_everywhere(comm, monkeypatch):
    if comm.rank == 0:
        monkeypatch.setenv("RAWFLUX_DEVICE", "5")
    with pytest.raises(DistError, match=r"device binding failed on rank\(s\) \[0\]"):
        make(comm, backend=FakeBackend(n_devices=2))


class NoCudaBackend(FakeBackend):
    """A rank whose CUDA cannot be used (the real backend's problem(): no CuPy, driver or device)."""

    def problem(self):
        from rawflux.runtime import CudaUnavailable

        return CudaUnavailable("no usable CUDA device or driver: rawflux needs an NVIDIA Hopper GPU (test)")


@pytest.mark.mpi(min_size=2)
def test_no_cuda_on_one_rank_is_one_sentence_everywhere(comm):
    from rawflux.runtime import CudaUnavailable

    bad = comm.size - 1
    be = NoCudaBackend() if comm.rank == bad else FakeBackend()
    with pytest.raises(CudaUnavailable) as info:
        init(comm, backend=be)
    if comm.rank == bad:
        assert str(info.value) == "no usable CUDA device or driver: rawflux needs an NVIDIA Hopper GPU (test)"
    else:
        assert str(info.value).startswith(f"rank(s) [{bad}] cannot use CUDA: no usable CUDA device or driver")
    assert not any(op == "malloc" for op, *_ in be.log)  # nothing allocated: no rank is left in a collective
    g, _ = make(comm)  # the processes can still make a group
    assert g.world == comm.size


@pytest.mark.mpi(min_size=2)
def test_no_peer_access_is_reported(comm):
    g, _ = make(comm, backend=FakeBackend(n_devices=comm.size, peer_ok=False))
    assert not g.peer_access
    assert any("no P2P" in p for p in g.peer_problems)
    with pytest.raises(DistError, match="need peer access"):
        g.symmetric(64, "x")


# --- symmetric buffers -------------------------------------------------------------------------

def test_symmetric_buffers_map_every_peer(comm):
    g, be = make(comm)
    slot = 256
    buf = g.symmetric(4 * slot * g.world, "test.symm")
    assert buf.peer_ptrs[g.rank] == buf.ptr and len(buf.peer_ptrs) == g.world
    assert list(buf.peer_ptrs_dev) == buf.peer_ptrs  # the device-side table holds the same
    assert bytes(ctypes.string_at(buf.ptr, buf.nbytes)) == b"\0" * buf.nbytes  # zeroed
    seed = comm.bcast(int.from_bytes(os.urandom(4), "little") if comm.rank == 0 else None)
    comm.Barrier()
    for q in range(g.world):  # write my slot of every peer's buffer through the peer table
        vals = (np.arange(slot, dtype=np.uint64) * 1_000_003 + seed + 7919 * g.rank + 31 * q) & 0xFFFFFFFF
        ctypes.memmove(buf.peer_ptrs[q] + 4 * slot * g.rank, vals.astype(np.uint32).tobytes(), 4 * slot)
    comm.Barrier()
    got = np.frombuffer(ctypes.string_at(buf.ptr, buf.nbytes), dtype=np.uint32).reshape(g.world, slot)
    for src in range(g.world):
        want = ((np.arange(slot, dtype=np.uint64) * 1_000_003 + seed + 7919 * src + 31 * g.rank) & 0xFFFFFFFF).astype(np.uint32)
        np.testing.assert_array_equal(got[src], want)
    flags = g.signal_buffer(16, "test.flags")
    assert flags.nbytes == 64
    with pytest.raises(ValueError, match="at least one flag"):
        g.signal_buffer(0, "bad")


def test_symmetric_size_mismatch_fails_on_every_rank(comm):
    g, be = make(comm)
    live_before = len(be.live)
    n = 4096 + (64 if comm.rank == comm.size - 1 else 0)
    if comm.size > 1:
        with pytest.raises(DistError, match=r"requests differ across ranks .*rank 0: 4096 bytes 'test.bad'"):
            g.symmetric(n, "test.bad")
    with pytest.raises(DistError, match="positive size"):
        g.symmetric(0, "test.zero")
    assert len(be.live) == live_before  # nothing leaked by the failed calls
    buf = g.symmetric(128, "test.after")  # the group still works afterwards
    assert buf.nbytes == 128


def test_symmetric_allocation_failure_on_one_rank(comm):
    g, be = make(comm)
    be.fail_malloc = comm.rank == 0
    with pytest.raises(DistError, match=r"allocation failed on rank\(s\) \[0\]: rank 0: MemoryError"):
        g.symmetric(1024, "test.oom")
    be.fail_malloc = False


def test_free_symmetric(comm):
    g, be = make(comm)
    buf = g.symmetric(1024, "test.free")
    g.free_symmetric(buf)
    assert buf.closed and buf not in g._buffers
    with pytest.raises(DistError, match="does not belong"):
        g.free_symmetric(buf)


# --- barrier protocol (host side) ----------------------------------------------------------------

def test_barrier_epochs_back_to_back(comm):
    g, be = make(comm)
    n = 200
    for _ in range(n):
        g.barrier()
    g.synchronize()
    st = g.ctrl_state()
    assert st["epoch"] == n and st["abort"] == 0
    assert all(f >= n for f in st["flags"])
    assert not g.status.failed


@pytest.mark.mpi(min_size=2)
def test_skipped_barrier_raises_collective_timeout(comm):
    g, be = make(comm, timeout_s=0.5)
    skip = comm.size - 1
    g.barrier()
    g.synchronize()
    comm.Barrier()
    if comm.rank != skip:
        t0 = time.monotonic()
        g.barrier()
        with pytest.raises(CollectiveTimeout) as info:
            g.synchronize()
        assert time.monotonic() - t0 < 0.5 + 3.0
        rec = info.value.record
        assert skip in rec.late_ranks and rec.call_id == 2 and rec.waiter == comm.rank
        msg = str(info.value)
        if rec.state == layout.STATE_TIMEOUT:
            assert msg.startswith(f"rank {skip} did not arrive at barrier #2 within 0.5 s (waiting rank {comm.rank}")
        else:
            assert "raised the group's abort flag" in msg
        t1 = time.monotonic()
        g.barrier()  # the group is aborted: the next barrier fails at once
        with pytest.raises(CollectiveTimeout):
            g.synchronize()
        assert time.monotonic() - t1 < 0.4
    comm.Barrier()
    if comm.rank == skip:
        assert g.ctrl_state()["abort"] != 0  # the timeout reached the skipping rank too


def test_teardown_order(comm):
    g, be = make(comm)
    g.symmetric(512, "test.a")
    g.symmetric(512, "test.b")
    be.log.clear()
    g.close()
    ops = [e[0] for e in be.log]
    # device sync, then every IPC mapping closed before any own buffer is freed (the peers said
    # "done" in between, over MPI: no device barrier, which could meet a peer's own barrier call),
    # the host-mapped status last
    assert ops[0] == "synchronize" and "launch_barrier" not in ops
    closes = [i for i, op in enumerate(ops) if op == "ipc_close"]
    frees = [i for i, op in enumerate(ops) if op == "free"]
    assert len(closes) == 3 * (comm.size - 1)  # ctrl + 2 buffers, each world-1 peers
    assert len(frees) == 3 * 2 + 1  # (buffer + its peer table) x 3, GroupCtrl
    assert not closes or max(closes) < min(frees)
    assert ops[-1] == "free_host"
    assert be.live == {}  # nothing left mapped or allocated
    g.close()  # twice is fine


def test_status_record_round_trip():
    rec = layout.StatusRecord(1, layout.OP_AG_GEMM, 77, 0, 3, 5, 77, 76, 10_000_000_000, 10_000_000_000, 1 << 3, 0)
    assert layout.StatusRecord.from_bytes(rec.to_bytes()) == rec
    msg = rec.message()
    assert msg.startswith("rank 3 did not signal ag_gemm #77 (flag 5) within 10.0 s (waiting rank 0; flag read 76")
    aborted = layout.StatusRecord(2, layout.OP_BARRIER, 9, 1, 3, -1, 9, 8, 5, 10, 1 << 3, 3)
    assert "rank 1 gave up waiting in barrier #9: rank 2 gave up (" in aborted.message()
    named = layout.StatusRecord(2, layout.OP_BARRIER, 9, 1, 3, -1, 9, 8, 5, 10, 1 << 3, 3 | (4 << 16))  # abort word: rank 2 on rank 3
    assert "rank 1 gave up waiting in barrier #9: rank 2 gave up on rank 3 (" in named.message()


def test_a_lost_context_at_synchronize_is_a_kernel_fault(comm):
    from rawflux import KernelFault

    class Lost(RuntimeError):
        status = 719  # CuPy's CUDARuntimeError carries the code in .status

    class Other(RuntimeError):
        status = 1

    g, be = make(comm)
    for err, want in ((Lost("cudaErrorLaunchFailure: unspecified launch failure"), KernelFault), (Other("cudaErrorInvalidValue"), Other)):
        def fail(stream, err=err):
            raise err
        be.stream_synchronize = fail
        with pytest.raises(want) as info:
            g.synchronize()
        assert (want is KernelFault) == ("seen at Group.synchronize" in str(info.value))
    del be.stream_synchronize
    g.synchronize()  # the fake's own again


def test_group_ctrl_is_packed_for_the_kernel(comm):
    g, be = make(comm, timeout_s=3.25)
    raw = ctypes.string_at(g._group_ctrl, layout.GROUP_CTRL_BYTES)
    d = layout.unpack_group_ctrl(raw)
    assert d == {"timeout_ns": 3_250_000_000, "status": g._status_dev, "ctrl_peers": g.ctrl.peer_table_ptr,
                 "rank": g.rank, "world": g.world}
    g.set_timeout(1.5)
    assert struct.unpack_from("<Q", ctypes.string_at(g._group_ctrl, 8))[0] == 1_500_000_000


# --- the real CUDA parts: skip without a GPU ------------------------------------------------------

def test_real_cuda_group_or_skip(comm):
    from tests.mpi._ranks import require_gpu_on_every_rank

    require_gpu_on_every_rank(comm)
    g = init(comm)
    g.barrier()
    g.synchronize()
    assert g.ctrl_state()["epoch"] == 1
    assert isinstance(g, Group)
