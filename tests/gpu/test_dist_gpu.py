"""rawflux.dist on one GPU, world 1 (plain pytest, no mpirun): symmetric buffers through the
peer table, ordered fill/verify rounds, 10,000 back-to-back barriers, a barrier captured in a
CUDA graph replayed 1,000 times, barrier latency, and the bounded wait ending in
CollectiveTimeout. Multi-rank versions: tests/mpi/test_dist_gpu.py and tests/gpu/dist_checks.py."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def group():
    from rawflux.dist._backend import gpu_available

    ok, why = gpu_available()
    if not ok:
        pytest.skip(f"needs a GPU: {why}")
    import rawflux.dist as dist

    g = dist.init()
    yield g
    dist.finalize()


def _check(c):
    print(c.line(1))
    assert c.ok, c.detail


def test_symmetric(group):
    from rawflux.dist import selftest

    _check(selftest.check_symmetric(group))


def test_ordered_rounds(group):
    from rawflux.dist import selftest

    _check(selftest.check_ordered_rounds(group, rounds=100))


def test_10000_barriers(group):
    from rawflux.dist import selftest

    _check(selftest.check_barrier_loop(group, 10000))


def test_graph_replay(group):
    from rawflux.dist import selftest

    _check(selftest.check_graph(group, 1000))


def test_barrier_latency(group):
    from rawflux.dist import selftest

    _check(selftest.barrier_latency(group))


def test_bounded_wait_raises(group):
    from mpi4py import MPI

    from rawflux.dist import selftest

    _check(selftest.check_wait_timeout(MPI.COMM_WORLD, timeout_s=0.5))
    group.barrier()  # the main group is untouched by the failed one
    group.synchronize()


def test_timeout_setting_is_checked(group):
    with pytest.raises(ValueError, match="positive"):
        group.set_timeout(0)
