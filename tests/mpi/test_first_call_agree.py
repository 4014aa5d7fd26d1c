"""The fused ops' first-call agreement (rawflux/ops/_collective.py: agree_first_call and
CollectiveOp.agree_plan) over real MPI ranks, no GPU needed:

    mpirun -np 4 python -m pytest --with-mpi tests/mpi/test_first_call_agree.py

Matched records pass on every rank; one rank with another m makes every rank raise ValueError
naming each rank's m (the allgather completes, so nobody hangs); a rank left alone gives up with
CollectiveTimeout within its bound; a shape already agreed sends nothing."""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.mpi(min_size=2)

NAMES = ("m", "n", "k", "dtype")


class FakeGroup:
    def __init__(self, comm, timeout_s=5.0):
        self.comm, self.timeout_s = comm, timeout_s
        self.rank, self.world, self.closed = comm.Get_rank(), comm.Get_size(), False


def _record(m, uid=1):
    from rawflux.dist.layout import OP_GEMM_RS
    from rawflux.ops._collective import CHECK_PLAN, call_record

    return call_record(CHECK_PLAN, OP_GEMM_RS, uid, (m, 256, 128, 1))


def test_matched_records_pass():
    from mpi4py import MPI

    from rawflux.ops._collective import agree_first_call

    g = FakeGroup(MPI.COMM_WORLD.Dup())
    t0 = time.perf_counter()
    agree_first_call(g, "gemm_rs call #1", NAMES, _record(512), 5.0)
    assert time.perf_counter() - t0 < 5.0
    g.comm.Barrier()


def test_one_rank_with_another_m_raises_on_every_rank():
    from mpi4py import MPI

    from rawflux.ops._collective import agree_first_call

    g = FakeGroup(MPI.COMM_WORLD.Dup())
    last = g.world - 1
    m = 256 if g.rank == last else 512
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as e:
        agree_first_call(g, "gemm_rs call #1", NAMES, _record(m), 5.0)
    assert time.perf_counter() - t0 < 5.0  # every rank took part: no wait for a bound
    msg = str(e.value)
    for q in range(g.world):
        assert f"rank {q}: m={256 if q == last else 512}" in msg, msg
    assert "n=" not in msg  # only what differs
    # Every rank raised and nothing is pending: the communicator still agrees afterwards.
    agree_first_call(g, "gemm_rs call #2", NAMES, _record(512), 5.0)
    g.comm.Barrier()


def test_a_rank_left_alone_times_out_within_the_bound():
    from mpi4py import MPI

    from rawflux.dist import CollectiveTimeout
    from rawflux.ops._collective import agree_first_call

    g = FakeGroup(MPI.COMM_WORLD.Dup())
    # One agreement first, so the private communicator exists (its setup is a collective too).
    agree_first_call(g, "gemm_rs call #1", NAMES, _record(256), 5.0)
    if g.rank == 0:  # the others never make this first call (until after the barrier below)
        t0 = time.perf_counter()
        with pytest.raises(CollectiveTimeout, match="a peer did not arrive within 0.5 s") as e:
            agree_first_call(g, "gemm_rs call #2", NAMES, _record(512), 0.5, "test bound")
        took = time.perf_counter() - t0
        assert 0.5 <= took < 3.0, took
        assert "m=512" in str(e.value) and "test bound" in str(e.value)
    g.comm.Barrier()
    if g.rank != 0:  # the late ranks complete rank 0's abandoned allgather and see its record
        from rawflux.ops._collective import bounded_allgather

        got = bounded_allgather(g, _record(512), "late")
        assert all(r == _record(512) for r in got)
    g.comm.Barrier()


def test_an_agreed_shape_sends_nothing():
    """CollectiveOp.agree_plan: the first call with a shape agrees (every rank), a later one with
    the same shape returns at once on a rank that calls it alone."""
    from mpi4py import MPI

    from rawflux.dist.layout import OP_GEMM_RS
    from rawflux.ops._collective import CollectiveOp

    class Op(CollectiveOp):
        OP_NAME, OP_ID, META_FIELDS = "gemm_rs", OP_GEMM_RS, NAMES

    g = FakeGroup(MPI.COMM_WORLD.Dup(), timeout_s=0.5)
    op = object.__new__(Op)  # no device: only what agree_plan reads
    op.group, op.world, op.uid, op.calls, op._closed, op._agreed = g, g.world, 1, 0, False, set()
    fields = (512, 256, 128, 1)
    assert op.is_new_shape(fields)
    op.agree_plan(fields, 0.0)
    assert not op.is_new_shape(fields)
    if g.rank == 0:
        t0 = time.perf_counter()
        op.agree_plan(fields, 0.0)  # alone: would time out if it communicated
        assert time.perf_counter() - t0 < 0.1
    g.comm.Barrier()
