"""rawflux.runtime with no GPU: dtype mapping, intake of __cuda_array_interface__ and DLPack
objects (fakes that describe device memory they do not own), every check's error, streams."""
from __future__ import annotations

import ctypes
import re

import ml_dtypes
import numpy as np
import pytest

from rawflux import runtime as rt
from rawflux.runtime import DType, Tensor, arrays

BASE = 0x7F00_0000_0000  # a 256-byte-aligned fake device address
DEV1 = 0x7E00_0000_0000  # fake addresses from here up to BASE live on device 1


class FakeCAI:
    """Only a __cuda_array_interface__ (version 3), like a Numba device array."""

    def __init__(self, ptr, shape, typestr, strides=None, readonly=False, **extra):
        self.__cuda_array_interface__ = {
            "version": 3, "data": (ptr, readonly), "shape": tuple(shape), "typestr": typestr, "strides": strides, **extra,
        }


@pytest.fixture(autouse=True)
def fake_pointer_device(monkeypatch):
    """No GPU here: answer cudaPointerGetAttributes for the fake addresses."""

    def device(ptr):
        if ptr < 0x1000:
            raise ValueError(f"pointer {ptr:#x} is not CUDA device memory (memory type 0)")
        return 1 if DEV1 <= ptr < BASE else 0

    monkeypatch.setattr(arrays, "pointer_device", device)


def cai(shape=(128, 64), typestr="<V2", ptr=BASE, strides=None, **kw):
    return FakeCAI(ptr, shape, typestr, strides, **kw)


# ---------------------------------------------------------------------------------- dtypes

@pytest.mark.parametrize(
    "d, itemsize, npd, tag, dl",
    [
        (DType.BF16, 2, ml_dtypes.bfloat16, "bf16", (4, 16)),
        (DType.F16, 2, np.float16, "f16", (2, 16)),
        (DType.F32, 4, np.float32, "f32", (2, 32)),
        (DType.E4M3, 1, ml_dtypes.float8_e4m3fn, "e4m3", (10, 8)),
        (DType.E5M2, 1, ml_dtypes.float8_e5m2, "e5m2", (12, 8)),
    ],
)
def test_dtype_table(d, itemsize, npd, tag, dl):
    assert d.itemsize == itemsize and d.np == np.dtype(npd) and d.tag == tag and str(d) == tag
    assert d.dlpack == dl and DType.from_dlpack(*dl) is d
    assert DType.from_any(npd) is d and DType.from_any(np.dtype(npd)) is d
    assert DType.from_any(tag) is d and DType.from_any(tag.upper()) is d and DType.from_any(d) is d
    assert DType.from_any(np.dtype(npd).name) is d
    assert rt.dtype_of(np.zeros(2, dtype=npd)) is d  # anything with .dtype
    assert d.is_fp8 == (itemsize == 1)


@pytest.mark.parametrize(
    "name, d",
    [("bfloat16", DType.BF16), ("half", DType.F16), ("float", DType.F32), ("fp32", DType.F32),
     ("float8_e4m3fn", DType.E4M3), ("fp8_e5m2", DType.E5M2), ("torch.bfloat16", DType.BF16), ("<f2", DType.F16)],
)
def test_dtype_names(name, d):
    assert DType.from_any(name) is d


def _torch_like_dtype(name):
    """An object that looks like a torch.dtype (type in module torch, str 'torch.<name>')."""
    cls = type("dtype", (), {"__str__": lambda self: f"torch.{name}", "__module__": "torch"})
    return cls()


@pytest.mark.parametrize(
    "name, d",
    [("bfloat16", DType.BF16), ("float16", DType.F16), ("float32", DType.F32),
     ("float8_e4m3fn", DType.E4M3), ("float8_e5m2", DType.E5M2)],
)
def test_dtype_from_torch_dtype_without_torch(name, d):
    assert DType.from_any(_torch_like_dtype(name)) is d
    assert rt.dtype_of(_torch_like_dtype(name)) is d


@pytest.mark.parametrize("bad", [np.float64, np.int8, np.uint16, ml_dtypes.float8_e4m3fnuz, "int4", "nonsense"])
def test_unsupported_dtype_names_the_supported_ones(bad):
    with pytest.raises(TypeError, match=r"unsupported dtype .*bf16, f16, f32, e4m3, e5m2"):
        DType.from_any(bad)


def test_unsupported_torch_and_dlpack_dtypes():
    with pytest.raises(TypeError):
        DType.from_any(_torch_like_dtype("float64"))
    with pytest.raises(TypeError, match="code=2, bits=64"):
        DType.from_dlpack(2, 64)
    with pytest.raises(TypeError):
        DType.from_dlpack(4, 16, lanes=2)
    with pytest.raises(TypeError):
        DType.from_dlpack(11, 8)  # e4m3fnuz is not e4m3fn


@pytest.mark.parametrize(
    "typestr, d",
    [("<f2", DType.F16), ("<f4", DType.F32), ("<V2", DType.BF16), ("|f1", DType.E5M2), ("<f1", DType.E5M2),
     ("|V1", None), ("<f8", None), (">f4", None), ("<u2", None)],
)
def test_typestr_mapping(typestr, d):
    assert rt.typestr_to_dtype(typestr) is d


def test_typestr_matches_numpy_spelling():
    """The CAI typestr of each dtype is numpy's .str for it (what CuPy + ml_dtypes emit)."""
    for d in (DType.BF16, DType.F16, DType.F32, DType.E5M2):
        assert rt.typestr_to_dtype(d.np.str) is d
    assert rt.typestr_to_dtype(DType.E4M3.np.str) is None  # '|V1' is ambiguous: needs dtype=


# ---------------------------------------------------------------------------- CAI intake

def test_cai_intake_fields():
    x = cai((128, 64), "<V2")
    t = rt.as_tensor(x, "a")
    assert (t.ptr, t.shape, t.strides, t.dtype, t.device, t.framework) == (BASE, (128, 64), (64, 1), DType.BF16, 0, "cai")
    assert t.obj is x and t.nbytes == 128 * 64 * 2 and t.numel == 128 * 64 and t.ndim == 2
    assert t.is_row_major() and t.ld == 64 and not t.readonly
    assert t.byte_range() == (BASE, BASE + 128 * 64 * 2)
    assert rt.framework_of(x) == "cai"


def test_cai_byte_strides_become_element_strides():
    t = rt.as_tensor(cai((32, 16), "<f4", strides=(256, 4)), "b")
    assert t.strides == (64, 1) and not t.is_row_major() and t.ld == 64
    t = rt.as_tensor(cai((32, 16), "<f2", strides=(2, 64)), "b")  # column-major
    assert t.strides == (1, 32) and not t.is_row_major()


def test_cai_device_from_pointer():
    assert rt.as_tensor(cai(ptr=DEV1 + 4096), "a").device == 1


def test_cai_host_pointer_is_rejected_naming_the_argument():
    with pytest.raises(ValueError, match=r"^a: pointer 0x100 is not CUDA device memory"):
        rt.as_tensor(cai(ptr=0x100), "a")


def test_cai_empty_array_without_pointer():
    t = rt.as_tensor(cai((0, 64), "<f2", ptr=0), "a")
    assert t.device == -1 and t.numel == 0 and t.nbytes == 0
    assert rt.check_matrix(t, "a", dtypes=DType.F16, device=0) is t  # nothing to check on no data


def test_cai_strides_not_multiple_of_itemsize():
    with pytest.raises(ValueError, match=r"a has byte strides \(129, 2\) that are not multiples of its 2-byte elements"):
        rt.as_tensor(cai((4, 64), "<f2", strides=(129, 2)), "a")


def test_cai_fp8_bytes_need_dtype():
    x = cai((64, 64), "|V1")
    with pytest.raises(TypeError, match=r"a has unsupported dtype typestr '\|V1' \(raw bytes: pass dtype="):
        rt.as_tensor(x, "a")
    assert rt.as_tensor(x, "a", dtype="e4m3").dtype is DType.E4M3
    assert rt.as_tensor(x, "a", dtype=DType.E5M2).dtype is DType.E5M2
    with pytest.raises(TypeError, match="cannot hold bf16"):
        rt.as_tensor(x, "a", dtype=DType.BF16)
    t = rt.as_tensor(cai((64, 64), "|u1"), "a", dtype=DType.E4M3)  # fp8 stored as uint8
    assert t.dtype is DType.E4M3 and t.strides == (64, 1)


def test_cai_dtype_override_must_agree():
    with pytest.raises(TypeError, match=r"a has dtype f16 but dtype=bf16 was requested"):
        rt.as_tensor(cai(typestr="<f2"), "a", dtype=DType.BF16)
    assert rt.as_tensor(cai(typestr="<f2"), "a", dtype="float16").dtype is DType.F16


def test_cai_descr_names_the_type():
    x = cai((8, 8), "|V1", descr=[("float8_e4m3fn", "|V1")])
    assert rt.as_tensor(x, "a").dtype is DType.E4M3


def test_cai_unsupported_typestr():
    with pytest.raises(TypeError, match=r"b has unsupported dtype typestr '<f8': rawflux handles"):
        rt.as_tensor(cai(typestr="<f8"), "b")


def test_cai_mask_rejected():
    with pytest.raises(ValueError, match="mask"):
        rt.as_tensor(cai(mask=object()), "a")


def test_cai_readonly_flag():
    assert rt.as_tensor(cai(readonly=True), "a").readonly


def test_cai_without_stream_key_needs_no_gpu_even_with_a_stream():
    assert rt.as_tensor(cai(), "a", stream=12345).ptr == BASE


def test_dtype_of_cai_object():
    assert rt.dtype_of(cai(typestr="<f4")) is DType.F32


# --------------------------------------------------------------------- CuPy intake (fake memory)

def _fake_cupy(shape, dtype, ptr=BASE, device=0):
    """A CuPy array over memory that does not exist: CuPy builds it without touching a GPU."""
    cupy = pytest.importorskip("cupy")
    mem = cupy.cuda.UnownedMemory(ptr, 1 << 24, None, device)
    return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))


@pytest.mark.parametrize("dt", list(DType))
def test_cupy_intake_all_dtypes(dt):
    x = _fake_cupy((96, 64), dt.np)
    t = rt.as_tensor(x, "a")
    assert (t.ptr, t.shape, t.strides, t.dtype, t.device, t.framework) == (BASE, (96, 64), (64, 1), dt, 0, "cupy")
    assert t.obj is x and rt.framework_of(x) == "cupy" and rt.dtype_of(x) is dt
    v = rt.as_tensor(x[3:, 8:], "a")
    assert v.ptr == BASE + (3 * 64 + 8) * dt.itemsize and v.strides == (64, 1) and v.shape == (93, 56)
    assert rt.as_tensor(x.T, "a").strides == (1, 64)


def test_cupy_intake_checks():
    x = _fake_cupy((64, 128), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match=re.escape("a has strides (1, 128) (in elements) for shape (128, 64)")):
        rt.check_matrix(x.T, "a", dtypes=DType.BF16, device=0)
    with pytest.raises(ValueError, match="is not 16-byte aligned"):
        rt.check_matrix(x[:, 1:9], "a", dtypes=DType.BF16, device=0, ld_ok=True)
    assert rt.check_matrix(x[:, 8:], "a", dtypes=DType.BF16, device=0, ld_ok=True).ld == 128
    with pytest.raises(ValueError, match=r"^a is on device 1 but the group uses device 0$"):
        rt.check_matrix(_fake_cupy((8, 8), np.float32, device=1), "a", dtypes=DType.F32, device=0)
    with pytest.raises(TypeError, match=r"a has unsupported dtype float64: rawflux handles"):
        rt.as_tensor(_fake_cupy((8, 8), np.float64), "a")


def test_cupy_raw_bytes_as_fp8():
    x = _fake_cupy((16, 32), np.uint8)
    with pytest.raises(TypeError, match=r"a has unsupported dtype uint8 \(raw bytes: pass dtype="):
        rt.as_tensor(x, "a")
    assert rt.as_tensor(x, "a", dtype=DType.E4M3).dtype is DType.E4M3
    with pytest.raises(TypeError, match="cannot hold f16"):
        rt.as_tensor(x, "a", dtype=DType.F16)
    with pytest.raises(TypeError, match="a has dtype bf16 but dtype=f16 was requested"):
        rt.as_tensor(_fake_cupy((4, 4), ml_dtypes.bfloat16), "a", dtype=DType.F16)


# ------------------------------------------------------------------------ other intake

def test_numpy_array_is_rejected_as_host_memory():
    with pytest.raises(TypeError, match=r"a is a numpy \(host\) array"):
        rt.as_tensor(np.zeros((4, 4), np.float32), "a")


def test_unknown_object_is_rejected():
    with pytest.raises(TypeError, match=r"a of type builtins.list is not an array rawflux can read"):
        rt.as_tensor([1.0, 2.0], "a")


def test_tensor_passes_through():
    t = rt.as_tensor(cai(), "a")
    assert rt.as_tensor(t, "a") is t
    with pytest.raises(TypeError, match="was requested"):
        rt.as_tensor(t, "a", dtype=DType.F32)


class HostDLPack:
    """A DLPack producer on the CPU (numpy underneath)."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, **kw):
        return self.arr.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_dlpack_host_producer_is_rejected():
    with pytest.raises(ValueError, match=r"a lives on CPU memory: rawflux needs CUDA device memory"):
        rt.as_tensor(HostDLPack(np.zeros((4, 4), np.float32)), "a")


class LyingDLPack(HostDLPack):
    """Claims CUDA in __dlpack_device__, but the capsule says CPU: the capsule wins."""

    def __dlpack_device__(self):
        return (2, 0)


def test_dlpack_capsule_device_is_checked():
    with pytest.raises(ValueError, match="lives on CPU memory"):
        rt.as_tensor(LyingDLPack(np.zeros((4, 4), np.float32)), "a")


@pytest.mark.parametrize("versioned", [True, False])
def test_read_dlpack_capsule_of_a_strided_view(versioned):
    base = np.arange(48, dtype=np.float16).reshape(6, 8)
    view = base[1:5:2, 2:7]
    cap = view.__dlpack__(max_version=(1, 0)) if versioned else view.__dlpack__()
    v = rt.read_dlpack_capsule(cap)
    assert v.ptr == view.ctypes.data
    assert v.shape == (2, 5) and v.strides == (16, 1)
    assert (v.code, v.bits, v.lanes) == (2, 16, 1) and DType.from_dlpack(v.code, v.bits) is DType.F16
    assert (v.device_type, v.device_id, v.versioned) == (1, 0, versioned)
    name = arrays._capsule_get_name(cap)
    assert name in (b"dltensor", b"dltensor_versioned")  # not consumed: the producer still frees it
    assert np.from_dlpack(HostDLPack(view)).ctypes.data == view.ctypes.data


def test_read_dlpack_capsule_rejects_other_capsules():
    ctypes.pythonapi.PyCapsule_New.restype = ctypes.py_object
    ctypes.pythonapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    cap = ctypes.pythonapi.PyCapsule_New(BASE, _USED, None)
    with pytest.raises(BufferError, match="not an unconsumed DLPack capsule"):
        rt.read_dlpack_capsule(cap)


# A CUDA DLPack producer forged in host memory: the capsule describes device memory we never touch.
_DLTENSOR, _DLTENSOR_V, _USED = b"dltensor", b"dltensor_versioned", b"used_dltensor"


class ForgedCudaDLPack:
    def __init__(self, shape, code, bits, strides=None, device=1, byte_offset=0, versioned=True, readonly=False):
        ndim = len(shape)
        self.shape = (ctypes.c_int64 * ndim)(*shape)
        self.strides = (ctypes.c_int64 * ndim)(*strides) if strides is not None else None
        if versioned:
            self.m = arrays._DLManagedTensorVersioned()
            self.m.major, self.m.minor, self.m.flags = 1, 0, 1 if readonly else 0
        else:
            self.m = arrays._DLManagedTensor()
        t = self.m.dl_tensor
        t.data, t.byte_offset = BASE, byte_offset
        t.device.device_type, t.device.device_id = 2, device
        t.ndim, t.dtype.code, t.dtype.bits, t.dtype.lanes = ndim, code, bits, 1
        t.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64)) if strides is not None else None
        self.versioned, self.device, self.calls = versioned, device, []

    def __dlpack__(self, stream=None, max_version=None, **kw):
        self.calls.append({"stream": stream, "max_version": max_version})
        if max_version is not None and not self.versioned:
            raise TypeError("old producer: no max_version")
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.m), _DLTENSOR_V if self.versioned else _DLTENSOR, None)

    def __dlpack_device__(self):
        return (2, self.device)


@pytest.mark.parametrize("versioned", [True, False])
@pytest.mark.parametrize("code, bits, d", [(4, 16, DType.BF16), (10, 8, DType.E4M3), (12, 8, DType.E5M2), (2, 32, DType.F32)])
def test_dlpack_cuda_intake(versioned, code, bits, d):
    x = ForgedCudaDLPack((256, 128), code, bits, versioned=versioned, byte_offset=512)
    t = rt.as_tensor(x, "b", stream=0)
    assert (t.ptr, t.shape, t.strides, t.dtype, t.device, t.framework) == (BASE + 512, (256, 128), (128, 1), d, 1, "dlpack")
    assert t.obj is x and t.keep is not None  # the capsule stays alive with the Tensor
    assert x.calls[-1]["stream"] == 1  # handle 0 goes out as DLPack's 1 (legacy default stream)
    if versioned:
        assert x.calls[0]["max_version"] == (1, 0)
    assert rt.check_matrix(t, "b", dtypes=d, device=1, shape=(256, 128)) is t


def test_dlpack_stream_handle_passed_through_and_none_by_default():
    x = ForgedCudaDLPack((4, 8), 2, 16)
    rt.as_tensor(x, "a", stream=0xABCDEF)
    assert x.calls[-1]["stream"] == 0xABCDEF
    rt.as_tensor(x, "a")
    assert x.calls[-1]["stream"] is None


def test_dlpack_strides_and_readonly():
    t = rt.as_tensor(ForgedCudaDLPack((64, 32), 4, 16, strides=(1, 64), readonly=True), "a")
    assert t.strides == (1, 64) and t.readonly and not t.is_row_major()
    with pytest.raises(ValueError, match="rawflux needs a row-major matrix with contiguous rows"):
        rt.check_matrix(t, "a", dtypes=DType.BF16, device=1)


def test_dlpack_raw_uint8_as_fp8():
    x = ForgedCudaDLPack((16, 32), 1, 8)  # kDLUInt 8: fp8 bytes
    with pytest.raises(TypeError, match=r"raw bytes: pass dtype="):
        rt.as_tensor(x, "a")
    assert rt.as_tensor(x, "a", dtype="e5m2").dtype is DType.E5M2


# ------------------------------------------------------------------------------- checks

def test_check_matrix_accepts_good_operand_and_raw_objects():
    t = rt.check_matrix(cai((256, 128), "<V2"), "a", dtypes=(DType.BF16, DType.F16), device=0, shape=(256, None))
    assert isinstance(t, Tensor) and t.dtype is DType.BF16


def test_check_matrix_wrong_device_message():
    t = rt.as_tensor(cai(ptr=DEV1), "a")
    with pytest.raises(ValueError, match=r"^a is on device 1 but the group uses device 0$"):
        rt.check_matrix(t, "a", dtypes=DType.BF16, device=0)
    with pytest.raises(ValueError, match=r"^a is on device 1 but the current device uses device 0$"):
        rt.check_matrix(t, "a", dtypes=DType.BF16, device=0, device_owner="the current device")
    assert rt.check_matrix(t, "a", dtypes=DType.BF16, device=None) is t


def test_check_matrix_wrong_dtype():
    with pytest.raises(TypeError, match=r"^b has dtype f32 but must be bf16 or f16$"):
        rt.check_matrix(cai(typestr="<f4"), "b", dtypes=[DType.BF16, "f16"], device=0)


def test_check_matrix_needs_2d():
    with pytest.raises(ValueError, match=r"a must be a 2-D matrix, got 3-D shape \(2, 4, 8\)"):
        rt.check_matrix(cai((2, 4, 8)), "a", dtypes=DType.BF16, device=0)


def test_check_matrix_wrong_shape():
    with pytest.raises(ValueError, match=re.escape("b has shape (128, 64) but (*, 256) is expected")):
        rt.check_matrix(cai((128, 64)), "b", dtypes=DType.BF16, device=0, shape=(None, 256))
    with pytest.raises(ValueError, match=re.escape("b has shape (128, 64) but (64, 64) is expected")):
        rt.check_matrix(cai((128, 64)), "b", dtypes=DType.BF16, device=0, shape=(64, 64))


def test_check_matrix_transposed_strides():
    with pytest.raises(ValueError, match=re.escape("a has strides (1, 128) (in elements) for shape (128, 64): rawflux needs a row-major matrix with contiguous rows, strides (64, 1)")):
        rt.check_matrix(cai((128, 64), strides=(2, 256)), "a", dtypes=DType.BF16, device=0)


def test_check_matrix_row_pitch():
    x = cai((128, 64), strides=(256, 2))  # ld = 128 > 64 columns
    with pytest.raises(ValueError, match=re.escape("strides (64, 1)")):
        rt.check_matrix(x, "a", dtypes=DType.BF16, device=0)
    t = rt.check_matrix(x, "a", dtypes=DType.BF16, device=0, ld_ok=True)
    assert t.ld == 128
    with pytest.raises(ValueError, match=re.escape("strides (ld >= 64, 1)")):
        rt.check_matrix(cai((128, 64), strides=(64, 2)), "a", dtypes=DType.BF16, device=0, ld_ok=True)


def test_check_matrix_size_one_dimensions_ignore_strides():
    t = rt.check_matrix(cai((1, 64), strides=(2, 2)), "a", dtypes=DType.BF16, device=0)
    assert t.is_row_major()
    t = rt.check_matrix(cai((64, 1), strides=(2, 999 * 2)), "a", dtypes=DType.BF16, device=0, pitch_align=1)
    assert t.is_row_major() and t.strides == (1, 999)


@pytest.mark.parametrize("offset", [2, 8, 14])
def test_check_matrix_misaligned_pointer(offset):
    x = cai((64, 64), ptr=BASE + offset)
    with pytest.raises(ValueError, match=rf"a's data pointer {BASE + offset:#x} is not 16-byte aligned \({offset} bytes past a boundary\)"):
        rt.check_matrix(x, "a", dtypes=DType.BF16, device=0)
    assert rt.check_matrix(x, "a", dtypes=DType.BF16, device=0, align=2)


def test_check_matrix_row_pitch_alignment():
    x = cai((64, 12), typestr="<V2")  # 24-byte rows
    with pytest.raises(ValueError, match=r"a's rows are 24 bytes apart, not a multiple of 16.*multiple of 8"):
        rt.check_matrix(x, "a", dtypes=DType.BF16, device=0)
    assert rt.check_matrix(x, "a", dtypes=DType.BF16, device=0, pitch_align=1)


def test_check_order_device_before_dtype_before_shape():
    x = cai((3,), typestr="<f4", ptr=DEV1 + 2)
    with pytest.raises(ValueError, match="device"):
        rt.check_matrix(x, "a", dtypes=DType.BF16, device=0)
    with pytest.raises(TypeError, match="dtype"):
        rt.check_matrix(x, "a", dtypes=DType.BF16, device=1)


def test_check_same_dtype_and_device():
    a, b = rt.as_tensor(cai(typestr="<V2"), "a"), rt.as_tensor(cai(typestr="<f2"), "b")
    assert rt.check_same_dtype(a=a, c=a) is DType.BF16
    with pytest.raises(TypeError, match=r"^a and b must have the same dtype: a is bf16, b is f16$"):
        rt.check_same_dtype(a=a, b=b)
    c = rt.as_tensor(cai(ptr=DEV1), "c")
    assert rt.check_same_device(a=a, b=b) == 0
    with pytest.raises(ValueError, match=r"a and c must be on one device: a on device 0, c on device 1"):
        rt.check_same_device(a=a, c=c)


def test_check_out():
    a = rt.as_tensor(cai((128, 64), ptr=BASE), "a")
    good = cai((128, 256), ptr=BASE + 1 << 20)
    t = rt.check_out(good, "out", shape=(128, 256), dtype=DType.BF16, device=0, inputs={"a": a})
    assert t.obj is good
    with pytest.raises(ValueError, match="out is read-only"):
        rt.check_out(cai((128, 256), ptr=BASE + 1 << 20, readonly=True), "out", shape=(128, 256), dtype=DType.BF16, device=0)
    with pytest.raises(ValueError, match="out overlaps input a"):
        rt.check_out(cai((128, 256), ptr=BASE + 4096), "out", shape=(128, 256), dtype=DType.BF16, device=0, inputs={"a": a})
    with pytest.raises(ValueError, match=re.escape("out has shape (128, 256) but (128, 128) is expected")):
        rt.check_out(good, "out", shape=(128, 128), dtype=DType.BF16, device=0)
    with pytest.raises(TypeError, match="out has dtype bf16 but must be f32"):
        rt.check_out(good, "out", shape=(128, 256), dtype=DType.F32, device=0)
    # right after a's last byte is fine
    after = cai((128, 256), ptr=BASE + 128 * 64 * 2)
    assert rt.check_out(after, "out", shape=(128, 256), dtype=DType.BF16, device=0, inputs={"a": a})


def test_prepare_output_checks_a_given_out_against_like():
    a = rt.as_tensor(cai((128, 64)), "a")
    out = cai((128, 64), ptr=DEV1)
    with pytest.raises(ValueError, match="out is on device 1 but the group uses device 0"):
        rt.prepare_output(out, "out", (128, 64), DType.BF16, a)
    good = cai((128, 64), ptr=BASE + (1 << 20))
    t, obj = rt.prepare_output(good, "out", (128, 64), DType.BF16, a, inputs={"a": a})
    assert obj is good and t.ptr == BASE + (1 << 20)
    assert rt.wrap_output(a, t) is good  # the caller's own out comes back unchanged


def test_is_row_major_and_byte_range():
    t = Tensor(BASE, (2, 3, 4), (12, 4, 1), DType.F32, 0, "cai")
    assert t.is_row_major() and t.byte_range() == (BASE, BASE + 96)
    t = Tensor(BASE, (2, 3, 4), (12, 1, 3), DType.F32, 0, "cai")
    assert not t.is_row_major() and t.byte_range() == (BASE, BASE + 96)
    t = Tensor(BASE + 64, (4,), (-2,), DType.F16, 0, "cai")
    assert t.byte_range() == (BASE + 64 - 12, BASE + 66)
    assert Tensor(BASE, (0, 5), (5, 1), DType.F16, 0, "cai").is_row_major()


# ------------------------------------------------------------------------------ streams

class FakeCupyStream:
    ptr = 0x5150


class ProtocolStream:
    def __cuda_stream__(self):
        return (0, 0x7070)


FakeTorchStream = type("Stream", (), {"__module__": "torch.cuda.streams", "cuda_stream": 0x7171})


@pytest.mark.parametrize(
    "stream, handle",
    [(0, 0), (2, 2), (0xDEAD, 0xDEAD), (FakeCupyStream(), 0x5150), (ProtocolStream(), 0x7070), (FakeTorchStream(), 0x7171)],
)
def test_explicit_streams(stream, handle):
    assert rt.stream_handle(stream) == handle
    assert rt.resolve_stream(stream, [cai()]) == handle


@pytest.mark.parametrize("bad, exc", [(True, TypeError), (-1, ValueError), ("s", TypeError), (1.5, TypeError)])
def test_bad_streams(bad, exc):
    with pytest.raises(exc):
        rt.stream_handle(bad)


def test_cupy_stream_wraps_a_handle_without_a_gpu():
    pytest.importorskip("cupy")
    assert rt.cupy_stream(0x1234).ptr == 0x1234


def test_torch_cpu_tensor_is_rejected():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"a is a torch tensor on cpu: rawflux needs CUDA tensors"):
        rt.as_tensor(torch.zeros(4, 4), "a")
    assert rt.framework_of(torch.zeros(1)) == "torch"
    assert DType.from_any(torch.bfloat16) is DType.BF16 and DType.from_any(torch.float8_e4m3fn) is DType.E4M3


def test_jax_arrays_on_the_cpu():
    """JAX is judged by type, its host arrays rejected, and its bf16 capsule read by our parser."""
    jax = pytest.importorskip("jax")
    x = jax.device_put(jax.numpy.asarray(np.arange(12, dtype=np.float32).reshape(3, 4) + 1), jax.devices("cpu")[0])
    x = x.astype(jax.numpy.bfloat16)
    assert rt.framework_of(x) == "jax" and rt.dtype_of(x) is DType.BF16
    with pytest.raises(ValueError, match="a lives on CPU memory"):
        rt.as_tensor(x, "a")
    v = rt.read_dlpack_capsule(arrays._dlpack_capsule(x, None))
    assert (v.code, v.bits, v.shape, v.ptr) == (4, 16, (3, 4), x.unsafe_buffer_pointer())
    assert v.strides in (None, (4, 1))


def test_runtime_does_not_import_torch_or_jax():
    import subprocess
    import sys

    code = ("import sys, rawflux.runtime as rt; rt.DType.from_any('bf16'); "
            "print(any(m in sys.modules for m in ('torch', 'jax')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
