"""rawflux.engine.bias_args: the one bias intake of gemm, ag_gemm and gemm_rs (no GPU)."""
from __future__ import annotations

import pytest

from rawflux import engine as G
from rawflux.runtime import DType, arrays

BASE = 0x7F0000000000


class FakeCAI:
    def __init__(self, ptr, shape, typestr="<V2", strides=None):
        self.__cuda_array_interface__ = {"version": 3, "data": (ptr, False), "shape": tuple(shape), "typestr": typestr,
                                         "strides": strides}


@pytest.fixture(autouse=True)
def on_device_0(monkeypatch):
    monkeypatch.setattr(arrays, "pointer_device", lambda ptr: 1 if ptr >= BASE + (1 << 30) else 0)


def test_no_bias():
    assert G.bias_args(None, 64, DType.BF16, 0, 0) == (None, 0, G.BIAS_NONE)


@pytest.mark.parametrize("typestr,kind", [("<V2", G.BIAS_IN16), ("<f4", G.BIAS_F32)])
def test_kinds(typestr, kind):
    t, ptr, got = G.bias_args(FakeCAI(BASE + 64, (64,), typestr), 64, DType.BF16, 0, 0)
    assert (ptr, got, t.shape) == (BASE + 64, kind, (64,))


@pytest.mark.parametrize("bias,kw,err,match", [
    (FakeCAI(BASE, (64,), "<f2"), {}, TypeError, r"bias has dtype f16 but must be bf16 \(like a\) or f32"),
    (FakeCAI(BASE, (32,)), {}, ValueError, r"bias must have shape \(64,\)"),
    (FakeCAI(BASE + (1 << 30), (64,)), {}, ValueError, r"bias is on device 1 but the group uses device 0"),
    (FakeCAI(BASE + (1 << 30), (64,)), {"device_owner": "a"}, ValueError, r"bias is on device 1 but a is on device 0"),
    (FakeCAI(BASE, (64,), strides=(4,)), {}, ValueError, r"must be contiguous"),
    (FakeCAI(BASE + 2, (64,)), {}, ValueError, r"not 4-byte aligned"),
    (FakeCAI(BASE + 8, (64,)), {"align": 16, "op": "gemm_rs"}, ValueError, r"gemm_rs: bias's data pointer .* not 16-byte aligned"),
])
def test_bad_bias_is_rejected_before_launch(bias, kw, err, match):
    with pytest.raises(err, match=match):
        G.bias_args(bias, 64, DType.BF16, 0, 0, **kw)
