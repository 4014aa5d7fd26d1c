"""What the op objects read of a Group, without MPI or a GPU: for the CPU tests of the ops'
planning and launch arguments (tests/cpu/test_ag_gemm_cpu.py, test_gemm_rs_cpu.py,
test_functional_checks.py)."""
from __future__ import annotations


class FakeGroup:
    """Any attributes, as keywords (a plain class: op objects keep weak references)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


class Buf:
    """A symmetric buffer's addresses: rank q's copy 4 GiB apart, its peer table beside them."""

    def __init__(self, name, nbytes, rank, world, base):
        self.name, self.nbytes = name, nbytes
        self.peer_ptrs = [base + (q << 32) for q in range(world)]
        self.ptr = self.peer_ptrs[rank]
        self.peer_table_ptr = base + (1 << 40)


class AgreeComm:
    """An agreement communicator on which every rank agrees with this one (bounded_allgather)."""

    def __init__(self, world):
        self.world = world

    def Get_size(self):
        return self.world

    def Iallgather(self, vals, out):
        out[:] = vals
        return FakeGroup(Test=lambda: True)


class OpGroup:
    """A Group at world > 1 as an op object uses it: symmetric buffers (kept by their last name
    part in ``buffers``), a barrier that logs, a status that never failed."""

    def __init__(self, rank, world, log):
        self.rank, self.world, self.device_id, self.timeout_s, self.closed = rank, world, 0, 5.0, False
        self.log, self._n = log, 0
        self.agree_comm = AgreeComm(world)
        self.group_ctrl_ptr = 0x5000_0000
        self.ctrl = Buf("ctrl", 1024, rank, world, 0x6000_0000_0000)
        self.status = FakeGroup(state=0, failed=False)
        self.buffers = {}

    def symmetric(self, nbytes, name):
        self._n += 1
        buf = Buf(name, nbytes, self.rank, self.world, (0x10 + self._n) << 44)
        self.buffers[name.split(".")[-1]] = buf
        return buf

    def barrier(self, stream):
        self.log.append(("barrier", stream))

    def healthy(self):
        return not self.closed and self.status.state == 0

    def free_symmetric(self, buf):
        pass
