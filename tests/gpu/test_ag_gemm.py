"""rawflux.ag_gemm at world 1 on the plain GPU (no mpirun): no communication, the call is
rawflux.gemm on a_shard; the op object and the functional form agree with rawflux.gemm bitwise,
the gathered A is a_shard itself, CUDA-graph replays with fresh data stay right, and ag_gemm
takes at most 1.02x rawflux.gemm's time at m >= 1024. The multi-rank checks are in
tests/gpu/ag_gemm_checks.py (emulated node) and tests/mpi/test_ag_gemm.py. Skips without a GPU."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

MODES = (("push", "ce"), ("pull", "sm"))


@pytest.fixture(scope="module")
def ctx():
    from rawflux.dist._backend import gpu_available

    ok, why = gpu_available()
    if not ok:
        pytest.skip(f"needs a GPU: {why}")
    import cupy

    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip("rawflux's GEMM kernels need sm_90 (Hopper)")
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() != 1:
        pytest.skip("world-1 tests: run without mpirun (tests/mpi/test_ag_gemm.py covers W > 1)")
    import rawflux.dist as dist

    from tests.gpu.ag_gemm_checks import Ctx

    g = dist.init(MPI.COMM_WORLD.Dup())
    c = Ctx(MPI.COMM_WORLD, g, seed=1234, quick=True)
    yield c
    for op in c.ops.values():
        op.close()
    g.close()


def _ok(res):
    ok, detail = res  # world 1: the local result is the result
    print(detail)
    assert ok, detail


@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_bitwise_equal_to_gemm(ctx, layout):
    from tests.gpu.ag_gemm_checks import ODD_M_LOCAL, check_bitwise

    _ok(check_bitwise(ctx, "push", "ce", layout, (1024, 256) + ODD_M_LOCAL))
    _ok(check_bitwise(ctx, "push", "ce", layout, (192,), with_bias=True))


def test_accuracy(ctx):
    from tests.gpu.ag_gemm_checks import check_accuracy

    _ok(check_accuracy(ctx))


def test_random_calls(ctx):
    from tests.gpu.ag_gemm_checks import check_random_calls

    _ok(check_random_calls(ctx, 200))


@pytest.mark.parametrize("direction,copy", MODES)
def test_graph_replay(ctx, direction, copy):
    from tests.gpu.ag_gemm_checks import check_graph

    _ok(check_graph(ctx, direction, copy, replays=100))


def test_world1_time_bar(ctx):
    from tests.gpu.ag_gemm_checks import check_timing

    _ok(check_timing(ctx))


def test_gathered_is_the_shard_and_functional_form(ctx):
    import cupy

    import rawflux
    from tests.gpu.ag_gemm_checks import bits, poisoned, shard, weight

    k, n, m = 512, 256, 320
    a = shard(99, 0, m, k)
    b = weight(99, 0, n, k, "nk")
    with ctx.stream:
        out, gath = rawflux.ag_gemm(a, b, ctx.group, return_gathered=True, stream=ctx.stream)
        assert gath is a
        g_out = poisoned((m, k))
        out2, g2 = rawflux.ag_gemm(a, b, ctx.group, gathered_out=g_out, return_gathered=True, stream=ctx.stream)
        ref = rawflux.ops.gemm.gemm(a, b, stream=ctx.stream)
        ctx.stream.synchronize()
    assert g2 is g_out and bool(cupy.all(bits(g_out) == bits(a)))
    assert bool(cupy.all(bits(out) == bits(ref))) and bool(cupy.all(bits(out2) == bits(ref)))
