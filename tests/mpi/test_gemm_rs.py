"""rawflux.gemm_rs across ranks on GPUs (pytest-mpi), e.g. on the emulated node:

    rawflux-launch --emulate 4 -m pytest --with-mpi tests/mpi/test_gemm_rs.py
    rawflux-launch -n 8 -m pytest --with-mpi tests/mpi/test_gemm_rs.py

The checks of tests/gpu/gemm_rs_checks.py (float64 reference vs the non-overlapped baseline,
m/W not a multiple of the tile, bitwise determinism, 1,000 random-m calls, CUDA graph replays,
a missing rank and a mismatched m raising within seconds). Skips without a GPU."""
from __future__ import annotations

import pytest

from tests.gpu import gemm_rs_checks as chk

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.gpu]


@pytest.fixture(scope="module")
def group():
    from mpi4py import MPI

    from tests.mpi._ranks import require_gpu_on_every_rank

    require_gpu_on_every_rank(hopper=True)
    import rawflux.dist as dist

    g = dist.init()
    yield g, MPI.COMM_WORLD
    dist.finalize()


def _run(group, name, fn):
    g, comm = group
    c = chk._guard(comm, g, name, fn)
    if comm.rank == 0:
        print(c.line(comm.size))
    assert c.ok, c.detail


@pytest.mark.parametrize("case", chk.CORRECT_CASES, ids=lambda c: c[0])
def test_correct(group, case):
    g, comm = group
    _run(group, case[0], lambda: chk.check_correct(g, comm, case))


def test_deterministic(group):
    g, comm = group
    _run(group, "deterministic", lambda: chk.check_deterministic(g, comm, 20))


def test_loop1000(group):
    g, comm = group
    _run(group, "loop1000", lambda: chk.check_loop(g, comm, 1000))


def test_graph(group):
    g, comm = group
    _run(group, "graph", lambda: chk.check_graph(g, comm, 100))


def test_missing_rank(group):
    g, comm = group
    _run(group, "missing_rank", lambda: chk.check_missing_rank(comm, 2.0))


def test_mismatch(group):
    g, comm = group
    _run(group, "mismatch", lambda: chk.check_mismatch(comm, 2.0))
