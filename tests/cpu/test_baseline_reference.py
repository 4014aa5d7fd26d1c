"""The float64 host references the GPU tests trust, checked element by element on small inputs."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from rawflux import baseline


def _rand(rng, shape, dt=ml_dtypes.bfloat16):
    return rng.standard_normal(shape).astype(dt)


@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_reference_ag_gemm_by_definition(layout):
    rng = np.random.default_rng()
    world, m_loc, k, n = 3, 4, 5, 6
    shards = [_rand(rng, (m_loc, k)) for _ in range(world)]
    b = _rand(rng, (n, k) if layout == "nk" else (k, n))
    bias = _rand(rng, (n,))
    got = baseline.reference_ag_gemm(shards, b, b_layout=layout, bias=bias)
    assert got.shape == (world * m_loc, n) and got.dtype == np.float64
    for q in range(world):
        for i in range(m_loc):
            for j in range(n):
                bj = b[j] if layout == "nk" else b[:, j]
                want = sum(float(shards[q][i, t]) * float(bj[t]) for t in range(k)) + float(bias[j])
                assert got[q * m_loc + i, j] == pytest.approx(want, rel=1e-12, abs=1e-12)
    # the gathered array gives the same answer as the list of shards
    np.testing.assert_array_equal(baseline.reference_ag_gemm(np.concatenate(shards), b, b_layout=layout, bias=bias), got)


@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_reference_gemm_rs_by_definition(layout):
    rng = np.random.default_rng()
    world, m, k_loc, n = 2, 6, 3, 4
    a_parts = [_rand(rng, (m, k_loc)) for _ in range(world)]
    b_parts = [_rand(rng, (n, k_loc) if layout == "nk" else (k_loc, n)) for _ in range(world)]
    bias = _rand(rng, (n,))
    full = baseline.reference_gemm_rs(a_parts, b_parts, b_layout=layout, bias=bias)
    a = np.concatenate([p.astype(np.float64) for p in a_parts], axis=1)  # (m, k): k split over ranks
    bs = [p.astype(np.float64) for p in b_parts]
    b = np.concatenate(bs, axis=1) if layout == "nk" else np.concatenate(bs, axis=0)
    want = a @ (b.T if layout == "nk" else b) + bias.astype(np.float64)
    np.testing.assert_allclose(full, want, rtol=1e-12, atol=1e-12)
    rows = m // world
    for r in range(world):
        np.testing.assert_array_equal(baseline.reference_gemm_rs(a_parts, b_parts, rank=r, b_layout=layout, bias=bias),
                                      full[r * rows:(r + 1) * rows])


def test_reference_rejects_bad_calls():
    rng = np.random.default_rng()
    with pytest.raises(ValueError, match="b_layout"):
        baseline.reference_ag_gemm([_rand(rng, (2, 2))], _rand(rng, (2, 2)), b_layout="mn")
    with pytest.raises(ValueError, match="one per rank"):
        baseline.reference_gemm_rs([_rand(rng, (2, 2))], [], rank=0)
    with pytest.raises(ValueError, match="divisible"):
        baseline.reference_gemm_rs([_rand(rng, (3, 2))] * 2, [_rand(rng, (2, 2))] * 2, rank=0)


def test_public_surface():
    assert baseline.ACCUMS == ("input", "fp32") and baseline.B_LAYOUTS == ("nk", "kn")
    assert set(baseline.BACKENDS) == {"auto", "nccl", "ipc"}
    # ncclDataType_t values (nccl.h): the raw-pointer API gets these numbers
    from rawflux.runtime import DType

    assert baseline.NCCL_DTYPE == {DType.F16: 6, DType.F32: 7, DType.BF16: 9} and baseline.NCCL_SUM == 0
