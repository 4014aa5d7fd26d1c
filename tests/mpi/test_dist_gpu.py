"""rawflux.dist across ranks on GPUs (pytest-mpi), e.g. on the emulated node:

    rawflux-launch --emulate 2 -m pytest --with-mpi tests/mpi/test_dist_gpu.py
    rawflux-launch -n 8 -m pytest --with-mpi tests/mpi/test_dist_gpu.py

Every rank writes a distinct pattern into every peer's symmetric buffer through the peer table
and checks what it received (one large buffer, and eight small ones allocated back to back); ordered fill/verify rounds; 10,000 back-to-back barriers; a barrier
in a CUDA graph replayed 1,000 times; one rank skipping a barrier makes the others raise
CollectiveTimeout within the (2 s) timeout; barrier latency printed. Skips without a GPU."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.gpu]


@pytest.fixture(scope="module")
def group():
    from tests.mpi._ranks import require_gpu_on_every_rank

    require_gpu_on_every_rank()
    import rawflux.dist as dist

    g = dist.init()
    yield g
    dist.finalize()


def _check(g, c):
    if g.rank == 0:
        print(c.line(g.world))
    assert c.ok, c.detail


def test_symmetric(group):
    from rawflux.dist import selftest

    _check(group, selftest.check_symmetric(group))


def test_small_symmetric_buffers(group):
    from rawflux.dist import selftest

    _check(group, selftest.check_small_symmetric(group))


def test_ordered_rounds(group):
    from rawflux.dist import selftest

    _check(group, selftest.check_ordered_rounds(group, rounds=200))


def test_10000_barriers(group):
    from rawflux.dist import selftest

    _check(group, selftest.check_barrier_loop(group, 10000))


def test_graph_replay(group):
    from rawflux.dist import selftest

    _check(group, selftest.check_graph(group, 1000))


def test_barrier_latency(group):
    from rawflux.dist import selftest

    _check(group, selftest.barrier_latency(group))


def test_skipped_barrier_times_out(group):
    from mpi4py import MPI

    from rawflux.dist import selftest

    _check(group, selftest.check_skip_timeout(MPI.COMM_WORLD, timeout_s=2.0))
    group.barrier()  # the main group still works
    group.synchronize()


def test_bounded_wait_raises(group):
    from mpi4py import MPI

    from rawflux.dist import selftest

    _check(group, selftest.check_wait_timeout(MPI.COMM_WORLD, timeout_s=0.5))
