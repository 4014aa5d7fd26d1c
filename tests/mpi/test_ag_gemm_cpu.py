"""The MPI side of the fused ops' shared machinery (rawflux/ops/_collective.py), no GPU needed:

    mpirun -np 3 python -m pytest --with-mpi tests/mpi/test_ag_gemm_cpu.py

bounded_allgather agrees, and gives up with CallMismatch (instead of hanging) when a rank does not
join; the functional-form cache grows every rank's op to the largest need of any rank."""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.mpi(min_size=2)


class FakeGroup:
    def __init__(self, comm, timeout_s=5.0):
        self.comm, self.timeout_s = comm, timeout_s
        self.rank, self.world, self.closed = comm.Get_rank(), comm.Get_size(), False


def test_bounded_allgather_agrees_and_times_out():
    from mpi4py import MPI

    from rawflux.ops._collective import CallMismatch, bounded_allgather

    comm = MPI.COMM_WORLD.Dup()
    g = FakeGroup(comm)
    got = bounded_allgather(g, (g.rank, 7), "agreement")
    assert got == [(q, 7) for q in range(g.world)]
    if g.rank == 0:  # rank 0 alone: must give up after ~0.5 s with a clear error
        t0 = time.perf_counter()
        with pytest.raises(CallMismatch, match="not every rank joined within 0.5 s"):
            bounded_allgather(g, (1, 1), "lonely call", timeout_s=0.5)
        assert time.perf_counter() - t0 < 3.0
    comm.Barrier()
    if g.rank != 0:  # the others join late: this completes rank 0's abandoned request too
        late = bounded_allgather(g, (2, 2), "late call")
        assert late[0] == (1, 1) and all(v == (2, 2) for v in late[1:])
    comm.Barrier()


def test_op_cache_agrees_on_the_largest_need():
    from mpi4py import MPI

    from rawflux.ops._collective import OpCache

    comm = MPI.COMM_WORLD.Dup()
    g = FakeGroup(comm)

    class Op:
        def __init__(self, group, key, cap):
            self.group, self.max_m, self.closed = group, cap, False

        def close(self):
            self.closed = True

    cache = OpCache(lambda group, key, cap: Op(group, key, cap), lambda op: op.max_m)
    op = cache.get(g, ("k",), 64 * (g.rank + 1), round_to=64)
    assert op.max_m == 64 * g.world  # every rank built the same size
    assert cache.get(g, ("k",), 64) is op  # fits: no communication
    comm.Barrier()
