"""The non-overlapped baselines against a float64 host reference, at the world size mpirun gives
(2 and 4 in the test script). Needs a GPU (skips with the reason otherwise); on one GPU the ranks
share it (the emulated node), where NCCL refuses and only the ipc backend runs.

    mpirun -np 2 python -m pytest --with-mpi tests/mpi/test_baseline.py
"""
from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

from rawflux import baseline

pytestmark = pytest.mark.mpi(min_size=2)

NP_DTYPE = {"bf16": np.dtype(ml_dtypes.bfloat16), "f16": np.dtype(np.float16), "f32": np.dtype(np.float32)}
# Relative Frobenius error bounds. Low-precision outputs carry a few roundings of 2^-9 (bf16) or
# 2^-12 (f16) each; fp32 runs an fp32 GEMM (no TF32) with k of a few hundred.
BOUND = {("bf16", "input"): 1e-2, ("bf16", "fp32"): 1e-2, ("f16", "input"): 3e-3, ("f16", "fp32"): 3e-3,
         ("f32", "input"): 1e-5, ("f32", "fp32"): 1e-5}


@pytest.fixture
def group():
    from tests.conftest import gpu_available

    ok, why = gpu_available()
    if not ok:
        pytest.skip(f"needs a GPU: {why}")
    from rawflux.dist import init

    return init()


def _backend_or_skip(group, backend):
    if backend == "nccl" and baseline.shares_gpu(group):
        pytest.skip("NCCL refuses several ranks on one GPU (emulated node); the ipc backend covers it")
    return backend


def _rng():
    return np.random.default_rng(int.from_bytes(os.urandom(8), "little"))  # fresh inputs every check


def _host(rng, shape, dt):
    return rng.standard_normal(shape).astype(NP_DTYPE[dt])


def _dev(h):
    """Upload through the raw bits, so no CuPy dtype conversion is involved."""
    import cupy

    if h.dtype.itemsize == 2:
        return cupy.asarray(h.view(np.uint16)).view(h.dtype)
    return cupy.asarray(h)


def _back(d):
    import cupy

    if d.dtype.itemsize == 2:
        return cupy.asnumpy(d.view(np.uint16)).view(d.dtype)
    return cupy.asnumpy(d)


def _poisoned(shape, dt):
    return _dev(np.full(shape, np.nan, dtype=NP_DTYPE[dt]))


def rel_err(got, ref) -> float:
    got = np.asarray(got).astype(np.float64)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def _sync():
    import cupy

    cupy.cuda.Device().synchronize()


AG_CASES = [
    # dtype, b_layout, bias, accum
    ("bf16", "nk", False, "input"),
    ("bf16", "kn", True, "input"),
    ("bf16", "nk", True, "fp32"),
    ("f16", "nk", True, "input"),
    ("f32", "kn", False, "input"),
    ("f32", "nk", True, "fp32"),
]


@pytest.mark.parametrize("backend", ["nccl", "ipc"])
@pytest.mark.parametrize("dt, layout, with_bias, accum", AG_CASES)
def test_ag_gemm_matches_reference(group, backend, dt, layout, with_bias, accum):
    _backend_or_skip(group, backend)
    comm, world = group.comm, group.world
    rng = _rng()
    m_loc, k, n_loc = 48, 320, 136
    a = _host(rng, (m_loc, k), dt)
    b = _host(rng, (n_loc, k) if layout == "nk" else (k, n_loc), dt)
    bias = _host(rng, (n_loc,), dt) if with_bias else None
    out = _poisoned((m_loc * world, n_loc), dt)
    gathered = _poisoned((m_loc * world, k), dt)
    got = baseline.ag_gemm(_dev(a), _dev(b), group, b_layout=layout, bias=None if bias is None else _dev(bias), out=out,
                           gathered_out=gathered, accum=accum, backend=backend)
    assert got is out
    _sync()
    shards = comm.allgather(a)
    ref = baseline.reference_ag_gemm(shards, b, b_layout=layout, bias=bias)
    res = _back(out)
    assert np.isfinite(res.astype(np.float32)).all(), "output not fully written"
    err = rel_err(res, ref)
    assert err < BOUND[(dt, accum)], f"rank {group.rank}: relative error {err:.3e}"
    assert np.array_equal(_back(gathered).view(np.uint8), np.concatenate(shards).view(np.uint8)), "gathered A differs"


RS_CASES = [
    ("bf16", "nk", False, "input"),
    ("bf16", "kn", True, "input"),
    ("bf16", "nk", True, "fp32"),
    ("f16", "kn", True, "input"),
    ("f32", "nk", False, "input"),
    ("f32", "kn", True, "fp32"),
]


@pytest.mark.parametrize("backend", ["nccl", "ipc"])
@pytest.mark.parametrize("dt, layout, with_bias, accum", RS_CASES)
def test_gemm_rs_matches_reference(group, backend, dt, layout, with_bias, accum):
    _backend_or_skip(group, backend)
    comm, world, rank = group.comm, group.world, group.rank
    rng = _rng()
    m, k_loc, n = 40 * world, 200, 168
    a = _host(rng, (m, k_loc), dt)
    b = _host(rng, (n, k_loc) if layout == "nk" else (k_loc, n), dt)
    bias = comm.bcast(_host(rng, (n,), dt) if with_bias else None, root=0)  # one bias for the layer
    out = _poisoned((m // world, n), dt)
    baseline.gemm_rs(_dev(a), _dev(b), group, b_layout=layout, bias=None if bias is None else _dev(bias), out=out,
                     accum=accum, backend=backend)
    _sync()
    ref = baseline.reference_gemm_rs(comm.allgather(a), comm.allgather(b), rank=rank, b_layout=layout, bias=bias)
    res = _back(out)
    assert np.isfinite(res.astype(np.float32)).all(), "output not fully written"
    err = rel_err(res, ref)
    assert err < BOUND[(dt, accum)], f"rank {rank}: relative error {err:.3e}"


@pytest.mark.parametrize("backend", ["nccl", "ipc"])
def test_fp32_oracle_beats_the_bf16_reduction(group, backend):
    """accum="fp32" rounds once; the input-dtype path rounds each partial (and, with NCCL, each
    partial sum): over ~10^4 outputs its error must be the larger."""
    _backend_or_skip(group, backend)
    comm, world, rank = group.comm, group.world, group.rank
    rng = _rng()
    m, k_loc, n = 64 * world, 256, 192
    a, b = _host(rng, (m, k_loc), "bf16"), _host(rng, (n, k_loc), "bf16")
    ref = baseline.reference_gemm_rs(comm.allgather(a), comm.allgather(b), rank=rank)
    errs = {}
    for accum in ("input", "fp32"):
        got = baseline.gemm_rs(_dev(a), _dev(b), group, accum=accum, backend=backend)
        _sync()
        errs[accum] = rel_err(_back(got), ref)
    assert errs["fp32"] < errs["input"] < BOUND[("bf16", "input")], errs


@pytest.mark.parametrize("backend", ["nccl", "ipc"])
def test_back_to_back_calls_on_a_side_stream(group, backend):
    """Three calls queued with no host sync between them, on a non-default stream: each must
    see its own inputs (the ipc backend reuses its buffers only after every peer is done)."""
    import cupy

    _backend_or_skip(group, backend)
    comm, world, rank = group.comm, group.world, group.rank
    stream = cupy.cuda.Stream(non_blocking=True)
    m_loc, k, n = 32, 128, 96
    cases = []
    for _ in range(3):
        rng = _rng()
        ag_a, ag_b = _host(rng, (m_loc, k), "bf16"), _host(rng, (n, k), "bf16")
        rs_a, rs_b = _host(rng, (m_loc * world, k), "bf16"), _host(rng, (n, k), "bf16")
        cases.append((ag_a, ag_b, rs_a, rs_b))
    with stream:
        dev_cases = [tuple(_dev(x) for x in c) for c in cases]
    stream.synchronize()
    outs = []
    for ag_a, ag_b, rs_a, rs_b in dev_cases:
        c1 = baseline.ag_gemm(ag_a, ag_b, group, stream=stream, backend=backend)
        c2 = baseline.gemm_rs(rs_a, rs_b, group, stream=stream, backend=backend)
        outs.append((c1, c2))
    stream.synchronize()
    for (ag_a, ag_b, rs_a, rs_b), (c1, c2) in zip(cases, outs):
        ref1 = baseline.reference_ag_gemm(comm.allgather(ag_a), ag_b)
        ref2 = baseline.reference_gemm_rs(comm.allgather(rs_a), comm.allgather(rs_b), rank=rank)
        assert rel_err(_back(c1), ref1) < 1e-2
        assert rel_err(_back(c2), ref2) < 1e-2


def test_new_outputs_in_the_callers_framework(group):
    import cupy

    rng = _rng()
    a, b = _host(rng, (16, 64), "bf16"), _host(rng, (24, 64), "bf16")
    got = baseline.ag_gemm(_dev(a), _dev(b), group)
    assert isinstance(got, cupy.ndarray) and got.shape == (16 * group.world, 24) and got.dtype == NP_DTYPE["bf16"]
    _sync()
    assert rel_err(_back(got), baseline.reference_ag_gemm(group.comm.allgather(a), b)) < 1e-2


def test_torch_tensors_come_back_as_torch(group):
    torch = pytest.importorskip("torch")
    comm, world, rank = group.comm, group.world, group.rank
    dev = torch.device("cuda", group.device_id)
    g = torch.Generator(device=dev)
    g.manual_seed(int.from_bytes(os.urandom(4), "little"))
    a = torch.randn(24, 64, generator=g, device=dev).to(torch.bfloat16)
    b = torch.randn(40, 64, generator=g, device=dev).to(torch.bfloat16)
    c = baseline.ag_gemm(a, b, group)
    assert isinstance(c, torch.Tensor) and c.dtype == torch.bfloat16 and tuple(c.shape) == (24 * world, 40)
    a_full = a.repeat(world, 1)  # (24 W, 64): this rank's k slice of an m = 24 W problem
    rs = baseline.gemm_rs(a_full, b, group)
    assert isinstance(rs, torch.Tensor) and tuple(rs.shape) == (24, 40)
    torch.cuda.synchronize(dev)
    host = lambda t: t.float().cpu().numpy()  # noqa: E731
    ref = baseline.reference_ag_gemm(comm.allgather(host(a)), host(b))
    assert rel_err(host(c), ref) < 1e-2
    ref_rs = baseline.reference_gemm_rs(comm.allgather(host(a_full)), comm.allgather(host(b)), rank=rank)
    assert rel_err(host(rs), ref_rs) < 1e-2


def test_bad_inputs_raise_before_any_collective(group):
    world = group.world
    rng = _rng()
    bf = NP_DTYPE["bf16"]
    a = _dev(_host(rng, (8 * world + 1, 32), "bf16"))  # m not divisible by W
    b = _dev(_host(rng, (16, 32), "bf16"))
    with pytest.raises(ValueError, match="divisible"):
        baseline.gemm_rs(a, b, group)
    good_a = _dev(_host(rng, (8 * world, 32), "bf16"))
    with pytest.raises(ValueError, match="b_shard"):
        baseline.gemm_rs(good_a, _dev(_host(rng, (16, 31), "bf16")), group)  # k mismatch
    with pytest.raises(TypeError, match="dtype"):
        baseline.ag_gemm(good_a, _dev(_host(rng, (16, 32), "f16")), group)
    with pytest.raises(ValueError, match="b_layout"):
        baseline.ag_gemm(good_a, b, group, b_layout="mk")
    with pytest.raises(ValueError, match="accum"):
        baseline.ag_gemm(good_a, b, group, accum="fp64")
    with pytest.raises(ValueError, match="backend"):
        baseline.ag_gemm(good_a, b, group, backend="mpi")
    with pytest.raises(ValueError, match="bias"):
        baseline.ag_gemm(good_a, b, group, bias=_dev(np.ones(15, bf)))
    with pytest.raises(ValueError, match="out"):
        baseline.ag_gemm(good_a, b, group, out=_poisoned((8 * world * world, 15), "bf16"))
    # No rank queued a collective above: the group still works.
    out = baseline.gemm_rs(good_a, b, group)
    _sync()
    assert out.shape == (8, 16) and np.isfinite(_back(out).astype(np.float32)).all()
