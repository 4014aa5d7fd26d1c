"""Bad input on one rank, on the CPU: the functional forms rawflux.ag_gemm and rawflux.gemm_rs check
every argument before any collective step (the op cache's bounded agreement, building an op) and
before any CUDA call, and the error names the argument. The MPI side (the peers' error, a new group
afterwards): tests/mpi/test_bad_input_cpu.py."""
from __future__ import annotations

import numpy as np
import pytest

from rawflux.ops import _collective as C
from rawflux.ops import ag_gemm as A
from rawflux.ops import gemm_rs as R
from rawflux.runtime import device
from tests.fake_arrays import BF16, FakeCupy, at
from tests.fake_group import FakeGroup

W, M_LOC, N, K = 2, 64, 128, 256


class Collective(Exception):
    """Raised by the stand-ins of every collective step: a call that gets there passed its checks."""


@pytest.fixture
def steps(monkeypatch):
    """Every collective step and CUDA entry recorded; each stops the call."""
    seen = []

    def agree(group, value, what, timeout_s=None):
        seen.append(("agree", what))
        raise Collective(what)

    def make(*a, **k):
        seen.append(("make",))
        raise Collective("make")

    def no_cuda():
        seen.append(("cuda",))
        return device.CudaUnavailable("no CUDA here (test)")

    monkeypatch.setattr(C, "bounded_allgather", agree)
    monkeypatch.setattr(A._cache, "_make", make)
    monkeypatch.setattr(R._ops, "_make", make)
    monkeypatch.setattr(device, "_ok", False)
    monkeypatch.setattr(device, "problem", no_cuda)
    return seen


def group():
    return FakeGroup(rank=1, world=W, device_id=0, timeout_s=1.0, closed=False, same_device=[False] * W, shares_gpu_under_mps=False,
                     comm=None)


def ag(a=None, b=None, **kw):
    a = FakeCupy((M_LOC, K), ptr=at(1)) if a is None else a
    b = FakeCupy((N, K), ptr=at(2)) if b is None else b
    return A.ag_gemm(a, b, group(), **kw)


def rs(a=None, b=None, **kw):
    a = FakeCupy((M_LOC * W, K), ptr=at(1)) if a is None else a
    b = FakeCupy((N, K), ptr=at(2)) if b is None else b
    return R.gemm_rs(a, b, group(), **kw)


@pytest.mark.parametrize("stream", [0, None])
def test_good_calls_reach_the_collective_step(steps, stream):
    """The control: the stand-ins do stop a call that passes its checks (with an explicit stream no
    CUDA call comes first; without one, the stream lookup is the first CUDA call)."""
    for call in (ag, rs):
        steps.clear()
        with pytest.raises((Collective, device.CudaUnavailable)):
            call(stream=stream, bias=FakeCupy((N,), ptr=at(3)))
        assert steps == ([("agree", steps[0][1])] if stream == 0 else [("cuda",)]), steps


AG_BAD = [
    # (what, the functional form, its arguments, error, message)
    ("a_shard host", ag, dict(a=np.zeros((M_LOC, K), np.float16)), TypeError, r"a_shard is a numpy \(host\) array"),
    ("a_shard 1-D", ag, dict(a=FakeCupy((K,))), ValueError, r"a_shard and b must be 2-D"),
    ("a_shard f32", ag, dict(a=FakeCupy((M_LOC, K), np.float32)), TypeError, r"a_shard has dtype f32: rawflux.ag_gemm takes bf16 or f16"),
    ("a_shard f64", ag, dict(a=FakeCupy((M_LOC, K), np.float64)), TypeError, r"a_shard has dtype float64 but must be bf16 or f16"),
    ("a_shard no rows", ag, dict(a=FakeCupy((0, K))), ValueError, r"a_shard has no rows"),
    ("a_shard strides", ag, dict(a=FakeCupy((M_LOC, K), strides=(2, 2 * M_LOC))), ValueError, r"a_shard has strides"),
    ("a_shard pointer", ag, dict(a=FakeCupy((M_LOC, K), ptr=at(1) + 8)), ValueError, r"a_shard's data pointer .* not 16-byte aligned"),
    ("a_shard pitch", ag, dict(a=FakeCupy((M_LOC, K), strides=(2 * K + 2, 2))), ValueError, r"a_shard's rows are .* not a multiple of 16"),
    ("a_shard device", ag, dict(a=FakeCupy((M_LOC, K), device=1)), ValueError, r"a_shard is on device 1 but the group uses device 0"),
    ("b f16", ag, dict(b=FakeCupy((N, K), np.float16, ptr=at(2))), TypeError, r"b has dtype f16 but must be bf16"),
    ("b f64", ag, dict(b=FakeCupy((N, K), np.float64, ptr=at(2))), TypeError, r"b has dtype float64 but must be bf16 or f16"),
    ("b k", ag, dict(b=FakeCupy((N, K + 8), ptr=at(2))), ValueError, r"k differs"),
    ("b n", ag, dict(b=FakeCupy((N + 4, K), ptr=at(2))), ValueError, r"n = 132 .* multiple of 8"),
    ("b 1-D", ag, dict(b=FakeCupy((K,), ptr=at(2))), ValueError, r"a_shard and b must be 2-D"),
    ("b strides", ag, dict(b=FakeCupy((N, K), ptr=at(2), strides=(2, 2 * N))), ValueError, r"b has strides"),
    ("b pointer", ag, dict(b=FakeCupy((N, K), ptr=at(2) + 2)), ValueError, r"b's data pointer .* not 16-byte aligned"),
    ("b device", ag, dict(b=FakeCupy((N, K), ptr=at(2), device=1)), ValueError, r"b is on device 1 but the group uses device 0"),
    ("b host", ag, dict(b=np.zeros((N, K), BF16)), TypeError, r"b is a numpy \(host\) array"),
    ("bias shape", ag, dict(bias=FakeCupy((N // 2,), ptr=at(3))), ValueError, r"bias must have shape \(128,\)"),
    ("bias dtype", ag, dict(bias=FakeCupy((N,), np.float16, ptr=at(3))), TypeError, r"bias has dtype f16 but must be bf16"),
    ("bias device", ag, dict(bias=FakeCupy((N,), ptr=at(3), device=1)), ValueError, r"bias is on device 1"),
    ("bias stride", ag, dict(bias=FakeCupy((N,), ptr=at(3), strides=(4,))), ValueError, r"bias must be contiguous"),
    ("bias pointer", ag, dict(bias=FakeCupy((N,), ptr=at(3) + 2)), ValueError, r"bias's data pointer .* not 4-byte aligned"),
    ("out shape", ag, dict(out=FakeCupy((M_LOC, N), ptr=at(4))), ValueError, r"out has shape \(64, 128\) but \(128, 128\)"),
    ("out dtype", ag, dict(out=FakeCupy((M_LOC * W, N), np.float16, ptr=at(4))), TypeError, r"out_dtype f16 is not supported"),
    ("out device", ag, dict(out=FakeCupy((M_LOC * W, N), ptr=at(4), device=1)), ValueError, r"out is on device 1"),
    ("out overlaps", ag, dict(out=FakeCupy((M_LOC * W, N), ptr=at(1))), ValueError, r"out overlaps input a_shard"),
    ("out strides", ag, dict(out=FakeCupy((M_LOC * W, N), ptr=at(4), strides=(4 * N, 2))), ValueError, r"out has strides"),
    ("out_dtype", ag, dict(out_dtype="e4m3"), TypeError, r"out_dtype e4m3 is not supported"),
    ("gathered_out shape", ag, dict(gathered_out=FakeCupy((M_LOC, K), ptr=at(5))), ValueError, r"gathered_out has shape"),
    ("gathered_out dtype", ag, dict(gathered_out=FakeCupy((M_LOC * W, K), np.float16, ptr=at(5))), TypeError, r"gathered_out has dtype"),
    ("gathered_out overlaps", ag, dict(gathered_out=FakeCupy((M_LOC * W, K), ptr=at(2))), ValueError, r"gathered_out overlaps input b"),
    ("b_layout", ag, dict(b_layout="tn"), ValueError, r"b_layout must be"),
    ("direction", ag, dict(direction="up"), ValueError, r"direction must be"),
    ("copy", ag, dict(copy="dma"), ValueError, r"copy must be"),
]

RS_BAD = [
    ("a host", rs, dict(a=np.zeros((M_LOC * W, K), np.float16)), TypeError, r"a is a numpy \(host\) array"),
    ("a 1-D", rs, dict(a=FakeCupy((K,))), ValueError, r"a and b_shard must be 2-D"),
    ("a f32", rs, dict(a=FakeCupy((M_LOC * W, K), np.float32)), TypeError, r"a has dtype f32: use bf16 or f16"),
    ("a f64", rs, dict(a=FakeCupy((M_LOC * W, K), np.float64)), TypeError, r"a has dtype float64 but must be bf16 or f16"),
    ("a m", rs, dict(a=FakeCupy((M_LOC * W + 1, K))), ValueError, r"m=129 is not a multiple of the world size 2"),
    ("a no rows", rs, dict(a=FakeCupy((0, K))), ValueError, r"a has m=0 rows"),
    ("a strides", rs, dict(a=FakeCupy((M_LOC * W, K), strides=(2, 2 * M_LOC * W))), ValueError, r"a has strides"),
    ("a pointer", rs, dict(a=FakeCupy((M_LOC * W, K), ptr=at(1) + 8)), ValueError, r"a's data pointer .* not 16-byte aligned"),
    ("a device", rs, dict(a=FakeCupy((M_LOC * W, K), device=1)), ValueError, r"a is on device 1 but the group uses device 0"),
    ("b_shard f16", rs, dict(b=FakeCupy((N, K), np.float16, ptr=at(2))), TypeError, r"b_shard has dtype f16 but must be bf16"),
    ("b_shard k", rs, dict(b=FakeCupy((N, K + 8), ptr=at(2))), ValueError, r"k differs"),
    ("b_shard n", rs, dict(b=FakeCupy((N + 4, K), ptr=at(2))), ValueError, r"n=132 and k=256 must be multiples of 8"),
    ("b_shard 1-D", rs, dict(b=FakeCupy((K,), ptr=at(2))), ValueError, r"a and b_shard must be 2-D"),
    ("b_shard strides", rs, dict(b=FakeCupy((N, K), ptr=at(2), strides=(2, 2 * N))), ValueError, r"b_shard has strides"),
    ("b_shard pointer", rs, dict(b=FakeCupy((N, K), ptr=at(2) + 4)), ValueError, r"b_shard's data pointer .* not 16-byte aligned"),
    ("b_shard device", rs, dict(b=FakeCupy((N, K), ptr=at(2), device=1)), ValueError, r"b_shard is on device 1"),
    ("bias shape", rs, dict(bias=FakeCupy((N + 8,), ptr=at(3))), ValueError, r"gemm_rs: bias must have shape \(128,\)"),
    ("bias dtype", rs, dict(bias=FakeCupy((N,), np.float16, ptr=at(3))), TypeError, r"gemm_rs: bias has dtype f16"),
    ("bias device", rs, dict(bias=FakeCupy((N,), ptr=at(3), device=1)), ValueError, r"gemm_rs: bias is on device 1"),
    ("out shape", rs, dict(out=FakeCupy((M_LOC * W, N), ptr=at(4))), ValueError, r"out has shape \(128, 128\) but \(64, 128\)"),
    ("out dtype", rs, dict(out=FakeCupy((M_LOC, N), np.float32, ptr=at(4))), TypeError, r"out has dtype f32 but must be bf16"),
    ("out device", rs, dict(out=FakeCupy((M_LOC, N), ptr=at(4), device=1)), ValueError, r"out is on device 1"),
    ("out overlaps", rs, dict(out=FakeCupy((M_LOC, N), ptr=at(2))), ValueError, r"out overlaps input b_shard"),
    ("partials", rs, dict(partials="fp8"), ValueError, r"partials='fp8'"),
    ("partials type", rs, dict(partials="f16"), ValueError, r"partials='f16'"),  # 16-bit partials have a's type
    ("b_layout", rs, dict(b_layout="tn"), ValueError, r"b_layout='tn'"),
]


@pytest.mark.parametrize("stream", [0, None])
@pytest.mark.parametrize("what,op,kwargs,exc,match", AG_BAD + RS_BAD, ids=[c[0] for c in AG_BAD] + [f"rs {c[0]}" for c in RS_BAD])
def test_bad_argument_raises_before_any_collective_or_cuda_call(steps, what, op, kwargs, exc, match, stream):
    """On the rank with the bad argument: a ValueError / TypeError naming it, and no agreement, no
    op built, no CUDA call (without an explicit stream the first one would be the stream lookup)."""
    with pytest.raises(exc, match=match):
        op(stream=stream, **kwargs)
    assert steps == [], steps


def test_gemm_rs_kn_layout_checks_b_shard_as_k_by_n(steps):
    with pytest.raises(ValueError, match=r"b_shard \('kn'\) is \(128, 256\): k differs"):
        rs(b=FakeCupy((N, K), ptr=at(2)), b_layout="kn", stream=0)
    with pytest.raises(Collective):
        rs(b=FakeCupy((K, N), ptr=at(2)), b_layout="kn", stream=0)
