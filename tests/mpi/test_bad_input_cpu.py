"""Bad input on one rank, under MPI, with no GPU (the CPU fake backend of test_dist_cpu.py): the rank
with the bad argument raises a ValueError / TypeError naming it before any collective step; its
peers, already in the functional form's bounded agreement, raise CallMismatch within the group's
timeout, saying the group must be rebuilt; every later agreement on that group fails at once; and
the group can then be closed and a new one made in the same processes, whose agreements work.

    mpirun -np 2 python -m pytest --with-mpi tests/mpi/test_bad_input_cpu.py

The op objects behind the functional forms are stand-ins (building a real one needs a GPU); the
agreements are the real ones, over the group's agreement communicator."""
from __future__ import annotations

import time

import numpy as np
import pytest

mpi4py = pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

from rawflux.dist import CallMismatch, DistError, finalize, init  # noqa: E402
from rawflux.ops import _collective as C  # noqa: E402
from rawflux.ops import ag_gemm as A  # noqa: E402
from rawflux.ops import gemm_rs as R  # noqa: E402
from tests.fake_arrays import FakeCupy, at  # noqa: E402

from .test_dist_cpu import FakeBackend  # noqa: E402

pytestmark = pytest.mark.mpi(min_size=2)
TIMEOUT_S = 1.0
N, K, M_LOC = 128, 256, 64


class StandIn:
    """An op object as the op cache sees it; a call returns what it was given."""

    def __init__(self, group, key, capacity):
        self.group, self.key, self.max_m, self.closed = group, key, capacity, False

    def close(self):
        self.closed = True

    def _call(self, c, *rest):
        return ("ran", self.max_m, c.ta.shape)

    def _fast_for(self, c, res, fw):  # the functional forms' fast path: no entry, so calls stay validated
        return None

    def remember_fast(self, key, entry):
        pass

    def fast_entry(self, key):
        return None


@pytest.fixture
def comm(monkeypatch):
    built = []
    monkeypatch.setattr(A._cache, "_make", lambda g, key, cap: built.append(cap) or StandIn(g, key, cap))
    monkeypatch.setattr(R._ops, "_make", lambda g, key, cap: built.append(cap) or StandIn(g, key, cap))
    c = MPI.COMM_WORLD.Dup()
    yield c, built
    A.clear_cache()
    R.clear_cache()
    finalize()
    c.Free()


def _ag(g, bad: bool):
    b = FakeCupy((N, K), np.float16 if bad else "bfloat16", ptr=at(2))  # bad: b's dtype differs from a_shard's
    return A.ag_gemm(FakeCupy((M_LOC, K), ptr=at(1)), b, g, stream=0)


def _rs(g, bad: bool):
    out = FakeCupy((M_LOC, N), ptr=at(1) if bad else at(4))  # bad: out overlaps a
    return R.gemm_rs(FakeCupy((M_LOC * g.world, K), ptr=at(1)), FakeCupy((N, K), ptr=at(2)), g, out=out, stream=0)


@pytest.mark.parametrize("call,exc,match", [(_ag, TypeError, r"^b has dtype f16 but must be bf16$"),
                                            (_rs, ValueError, r"^out overlaps input a")])
def test_bad_input_on_one_rank(comm, call, exc, match):
    c, built = comm
    g = init(c, backend=FakeBackend(), timeout_s=TIMEOUT_S)
    bad = c.rank == c.size - 1
    t0 = time.monotonic()
    if bad:
        with pytest.raises(exc, match=match):
            call(g, bad=True)
        assert built == []  # raised before the op was built (or grown)
    else:
        with pytest.raises(CallMismatch) as info:
            call(g, bad=False)
        took = time.monotonic() - t0
        msg = str(info.value)
        assert TIMEOUT_S <= took < TIMEOUT_S + 3.0, took
        assert "not every rank joined within 1.0 s" in msg and "a rank raised on a bad argument" in msg
        assert "rawflux.finalize(), then rawflux.init()" in msg
        assert built == []
        with pytest.raises(CallMismatch, match="an earlier agreement on this group .* timed out"):
            call(g, bad=False)  # would meet the abandoned agreement on the peers: refused at once
        assert time.monotonic() - t0 < TIMEOUT_S + 3.0
    # The group can be closed and a new one made in the same processes; its agreements work.
    g.close()
    assert g.closed
    with pytest.raises(DistError, match="the group is closed"):
        call(g, bad=False)
    g2 = init(c, backend=FakeBackend(), timeout_s=TIMEOUT_S)
    assert g2 is not g and g2.world == c.size
    assert C.bounded_allgather(g2, (c.rank, 7), "after the rebuild") == [(q, 7) for q in range(c.size)]
    got = call(g2, bad=False)
    assert got[0] == "ran" and built == [got[1]]  # every rank built the op, at the size they agreed on
    assert c.allgather(got[1]) == [got[1]] * c.size
    g2.close()


class Probe(C.CollectiveOp):
    OP_NAME = "probe"


def test_building_an_op_object_is_bounded(comm, monkeypatch):
    """A rank that raises before building an op object (its own arguments) leaves its peers in the
    construction, which is collective: they raise CallMismatch within the bound, not hang."""
    c, _ = comm
    monkeypatch.setattr(C, "CONSTRUCT_WAIT_S", 0.0)  # the group's timeout, not the generous default
    g = init(c, backend=FakeBackend(), timeout_s=TIMEOUT_S)
    ok = Probe(g, side_streams=0)  # every rank: built, its symmetric buffer mapped everywhere
    assert ok.world == c.size
    ok.close()
    t0 = time.monotonic()
    if c.rank != c.size - 1:
        with pytest.raises(CallMismatch, match="probe construction: not every rank joined within 1.0 s"):
            Probe(g, side_streams=0)
        assert time.monotonic() - t0 < TIMEOUT_S + 3.0
    g.close()


def test_ranks_building_different_op_objects_all_raise(comm):
    c, _ = comm
    g = init(c, backend=FakeBackend(), timeout_s=TIMEOUT_S)
    if c.rank == 0:
        C._next_uid(g)  # rank 0 built one more op object before: the ranks are out of step
    with pytest.raises(CallMismatch, match=r"ranks build different op objects \(rank 0: .* #2; rank 1: .* #1"):
        Probe(g, side_streams=0)
    g.close()
