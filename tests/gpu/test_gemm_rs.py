"""rawflux.gemm_rs on one GPU (world 1: no communication, the plain GEMM straight into out) and the
op object's per-call checks. The multi-rank checks are tests/mpi/test_gemm_rs.py and the driver
tests/gpu/gemm_rs_checks.py (worlds 2, 4, 8 on the emulated node). Skips without a Hopper GPU."""
from __future__ import annotations

import pytest

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu


def _hopper() -> bool:
    try:
        return cupy.cuda.Device().compute_capability == "90"
    except Exception:  # noqa: BLE001
        return False


@pytest.fixture(scope="module")
def world1():
    from tests.conftest import gpu_available

    ok, why = gpu_available()
    if not ok:
        pytest.skip(f"needs a GPU: {why}")
    if not _hopper():
        pytest.skip("rawflux's GEMM kernels need sm_90 (Hopper)")
    from mpi4py import MPI

    import rawflux.dist as dist

    comm = MPI.COMM_WORLD
    if comm.size != 1:
        pytest.skip("world-1 tests: run without mpirun (tests/mpi/test_gemm_rs.py covers several ranks)")
    g = dist.init(comm)
    yield g, comm
    dist.finalize()


def _assert(c):
    print(c.line(1))
    assert c.ok, c.detail


@pytest.mark.parametrize("case", __import__("tests.gpu.gemm_rs_checks", fromlist=["CORRECT_CASES"]).CORRECT_CASES,
                         ids=lambda c: c[0])
def test_correct(world1, case):
    from tests.gpu import gemm_rs_checks as chk

    g, comm = world1
    _assert(chk.check_correct(g, comm, case))


def test_deterministic(world1):
    from tests.gpu import gemm_rs_checks as chk

    g, comm = world1
    _assert(chk.check_deterministic(g, comm, 20))


def test_loop_random_m(world1):
    from tests.gpu import gemm_rs_checks as chk

    g, comm = world1
    _assert(chk.check_loop(g, comm, 300))


def test_graph(world1):
    from tests.gpu import gemm_rs_checks as chk

    g, comm = world1
    _assert(chk.check_graph(g, comm, 100))


def test_world1_matches_gemm_speed(world1):
    from tests.gpu import gemm_rs_checks as chk

    g, comm = world1
    for c in chk.check_perf(g, comm):
        _assert(c)


def test_call_checks(world1):
    """Bad calls raise clear errors before any launch."""
    from rawflux.ops.gemm_rs import GemmRS, gemm_rs
    from tests.gpu.gemm_rs_checks import dev_from_f32, empty16

    g, _ = world1
    op = GemmRS(g, 256, 128, 64, "bf16")
    a = dev_from_f32(cupy.ones((128, 64), cupy.float32), "bf16")
    b = dev_from_f32(cupy.ones((128, 64), cupy.float32), "bf16")
    with pytest.raises(ValueError, match="capacity"):
        op(dev_from_f32(cupy.ones((512, 64), cupy.float32), "bf16"), b)
    with pytest.raises(ValueError, match="shape"):
        op(dev_from_f32(cupy.ones((128, 72), cupy.float32), "bf16"), b)
    with pytest.raises(TypeError, match="dtype"):
        op(cupy.ones((128, 64), cupy.float16), b)
    with pytest.raises(ValueError, match="out"):
        op(a, b, out=empty16((64, 128), "bf16"))
    with pytest.raises(ValueError, match="bias"):
        op(a, b, bias=dev_from_f32(cupy.ones(64, cupy.float32), "bf16"))
    out = op(a, b)  # and a good call works: every element = k
    from tests.gpu.gemm_rs_checks import dev_f32

    assert float(cupy.abs(dev_f32(out) - 64.0).max()) == 0.0
    out2 = gemm_rs(a, b, g)
    assert float(cupy.abs(dev_f32(out2) - 64.0).max()) == 0.0
    op.close()
