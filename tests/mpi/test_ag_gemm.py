"""rawflux.ag_gemm across ranks on GPUs (pytest-mpi), e.g. on the emulated node:

    rawflux-launch --emulate 2 -m pytest --with-mpi tests/mpi/test_ag_gemm.py
    rawflux-launch -n 8 -m pytest --with-mpi tests/mpi/test_ag_gemm.py

For every gather path (push|pull x copy engine|SM copies): out bitwise equal to rawflux.gemm on
the gathered A with the op's config, gathered A bitwise equal to every rank's shard, m/W not a
multiple of the tile; back-to-back random calls; CUDA-graph replays with fresh data; the
functional form growing its buffers; a rank with another m, or skipping the call, makes the
others raise within seconds. Skips without a GPU. (tests/gpu/ag_gemm_checks.py runs the same
checks at several world sizes, with longer loops.)"""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.gpu]

MODES = (("push", "ce"), ("pull", "ce"), ("push", "sm"), ("pull", "sm"))


@pytest.fixture(scope="module")
def ctx():
    from mpi4py import MPI

    from tests.mpi._ranks import require_gpu_on_every_rank

    require_gpu_on_every_rank()
    import rawflux.dist as dist

    from tests.gpu.ag_gemm_checks import Ctx

    seed = MPI.COMM_WORLD.bcast(4321)
    g = dist.init(MPI.COMM_WORLD.Dup())
    c = Ctx(MPI.COMM_WORLD, g, seed=seed, quick=True)
    yield c
    for op in c.ops.values():
        op.close()
    g.close()


def _path(ctx, direction, copy):
    if (direction, copy) not in ctx.modes:
        pytest.skip(f"{direction}/{copy}: copy='ce' is refused where ranks share a GPU under MPS (test_ce_refused)")


def _ok(ctx, res):
    from tests.gpu.ag_gemm_checks import agree

    ok, detail = agree(ctx.comm, *res)
    if ctx.rank == 0:
        print(detail)
    assert ok, detail


@pytest.mark.parametrize("direction,copy", MODES)
def test_bitwise(ctx, direction, copy):
    from tests.gpu.ag_gemm_checks import ODD_M_LOCAL, check_bitwise

    _path(ctx, direction, copy)
    _ok(ctx, check_bitwise(ctx, direction, copy, "nk", (256, 64) + ODD_M_LOCAL))
    _ok(ctx, check_bitwise(ctx, direction, copy, "kn", (192,), with_bias=True))


def test_ce_refused(ctx):
    from tests.gpu.ag_gemm_checks import check_ce_refused

    if not ctx.group.shares_gpu_under_mps:
        pytest.skip("ranks are not sharing a GPU under MPS here: 'ce' is allowed")
    _ok(ctx, check_ce_refused(ctx))


def test_accuracy(ctx):
    from tests.gpu.ag_gemm_checks import check_accuracy

    _ok(ctx, check_accuracy(ctx))


def test_random_calls(ctx):
    from tests.gpu.ag_gemm_checks import check_random_calls

    _ok(ctx, check_random_calls(ctx, 200))


@pytest.mark.parametrize("direction,copy", MODES)
def test_graph_replay(ctx, direction, copy):
    from tests.gpu.ag_gemm_checks import check_graph

    _path(ctx, direction, copy)
    _ok(ctx, check_graph(ctx, direction, copy, replays=20))


def test_functional_form_grows(ctx):
    import cupy

    import rawflux
    from tests.gpu.ag_gemm_checks import bits, full_a, shard, weight

    k, n = 256, 128
    b = weight(5, ctx.rank, n, k, "nk")
    for m_loc in (64, 300, 64, 1):
        seed = ctx.next_seed()
        with ctx.stream:
            out, gath = rawflux.ag_gemm(shard(seed, ctx.rank, m_loc, k), b, ctx.group, return_gathered=True, stream=ctx.stream)
            full = full_a(seed, ctx.world, m_loc, k)
            op = rawflux.ops.ag_gemm.cached_op(ctx.group, n, k, "bf16")
            assert op is not None and op.max_m >= m_loc * ctx.world
            ref = rawflux.ops.gemm.gemm(full, b, stream=ctx.stream, config=op.last_config)
            ok = bool(cupy.all(bits(gath) == bits(full))) and bool(cupy.all(bits(out) == bits(ref)))
        assert all(ctx.comm.allgather(ok)), f"m/W={m_loc}"


@pytest.mark.parametrize("direction,copy", [("push", "ce"), ("pull", "sm")])
def test_mismatched_m_raises(ctx, direction, copy):
    from tests.gpu.ag_gemm_checks import check_mismatch_m

    _path(ctx, direction, copy)
    _ok(ctx, check_mismatch_m(ctx.comm, direction, copy, 2.0))


@pytest.mark.parametrize("direction,copy", [("push", "ce"), ("pull", "sm")])
def test_skipped_call_raises(ctx, direction, copy):
    from tests.gpu.ag_gemm_checks import check_skip

    _path(ctx, direction, copy)
    _ok(ctx, check_skip(ctx.comm, direction, copy, 2.0))
