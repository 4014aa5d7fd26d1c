"""Array intake and outputs: whatever the caller passes (CuPy, torch, JAX, any DLPack or
__cuda_array_interface__ object) becomes a `Tensor` (pointer, shape, strides in elements, DType,
device), checked before any launch; outputs are allocated in the caller's framework.

No framework is imported unless the object at hand comes from it (judged by
``type(x).__module__``). bf16 and fp8 never depend on a framework understanding them: torch
tensors are read through data_ptr()/stride()/dtype, DLPack capsules and CAI dicts are parsed
here.

Typical op:
    s = resolve_stream(stream, (a, b))          # before intake: DLPack producers sync on it
    ta = check_matrix(as_tensor(a, "a", stream=s), "a", dtypes=..., device=dev)
    tc, _ = prepare_output(out, "out", (m, n), ta.dtype, ta, stream=s, inputs={"a": ta})
    ... launch on s, writing tc.ptr ...
    return wrap_output(ta, tc, stream=s)        # the caller's out, or the new output in its framework
"""
from __future__ import annotations

import ctypes
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from .device import require_cuda
from .dtypes import DL_OPAQUE, DL_UINT, DType, _BY_NAME, np_dtype_to_dtype, supported, typestr_to_dtype
from .streams import resolve_stream, stream_handle, stream_wait, use_stream

# DLPack DLDeviceType values
KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
_DL_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host (pinned)", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 10: "ROCm", 13: "CUDA managed"}


@dataclass(eq=False)
class Tensor:
    """A strided view of device memory as rawflux sees it. ``obj`` (and ``keep``, e.g. a DLPack
    capsule) keep the caller's memory alive as long as the Tensor lives."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype: DType
    device: int  # CUDA device ordinal; -1 for an empty CAI array with no pointer
    framework: str  # "cupy" | "torch" | "jax" | "cai" | "dlpack"
    obj: object = field(repr=False, default=None)
    readonly: bool = False
    keep: object = field(repr=False, default=None)
    wrap_to: str | None = None  # set by new_output: wrap_output converts obj to this framework

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of data (elements x itemsize), not the span a strided view covers."""
        return self.numel * self.dtype.itemsize

    @property
    def ld(self) -> int:
        """Row pitch in elements (the stride of the second-to-last dimension)."""
        if self.ndim < 2:
            raise ValueError("ld needs at least 2 dimensions")
        return self.strides[-2]

    def is_row_major(self) -> bool:
        """Dense C order (what the kernels read); strides of size-1 dimensions do not matter."""
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n == 0:
                return True
            if n != 1 and s != expect:
                return False
            expect *= n
        return True

    def byte_range(self) -> tuple[int, int]:
        """[lo, hi) bytes this view can touch (empty range for an empty tensor)."""
        if self.numel == 0:
            return (self.ptr, self.ptr)
        lo = hi = 0
        for n, s in zip(self.shape, self.strides):
            if s >= 0:
                hi += (n - 1) * s
            else:
                lo += (n - 1) * s
        return (self.ptr + lo * self.itemsize, self.ptr + (hi + 1) * self.itemsize)


# --------------------------------------------------------------------------------------------
# intake

def framework_of(x) -> str:
    """"cupy" | "torch" | "jax" | "numpy" | "dlpack" | "cai" | "unknown", from the type alone."""
    if isinstance(x, Tensor):
        return x.framework
    mod = type(x).__module__ or ""
    root = mod.split(".", 1)[0]
    if root == "cupy":
        return "cupy"
    if root == "torch":
        return "torch"
    if root in ("jax", "jaxlib"):
        return "jax"
    if root == "numpy" or isinstance(x, np.ndarray):
        return "numpy"
    if hasattr(x, "__dlpack__"):
        return "dlpack"
    if hasattr(x, "__cuda_array_interface__"):
        return "cai"
    return "unknown"


def as_tensor(x, name: str, *, dtype=None, stream: int | None = None, accept=None) -> Tensor:
    """Describe ``x`` without copying it. ``dtype`` reinterprets raw storage (uint8/uint16/void
    of the same itemsize, e.g. fp8 bytes in a torch.uint8 tensor, or a CAI '|V1') and otherwise
    must agree with the detected dtype. ``stream`` (the op's stream handle) is handed to DLPack
    producers and CAI producer streams are joined to it, so the data is ready on it. ``accept``:
    the op's dtypes, named in the error for a dtype rawflux cannot read at all."""
    try:
        return _as_tensor(x, name, dtype, stream)
    except _Unsupported as e:
        if accept is None:
            raise
        raise TypeError(f"{name} has dtype {e.what} but must be {' or '.join(d.tag for d in _dtype_set(accept))}") from None


class _Unsupported(TypeError):
    def __init__(self, message: str, what: str):
        super().__init__(message)
        self.what = what


def _as_tensor(x, name, dtype, stream) -> Tensor:
    if isinstance(x, Tensor):
        if dtype is not None and DType.from_any(dtype) != x.dtype:
            raise TypeError(f"{name} has dtype {x.dtype} but dtype={DType.from_any(dtype)} was requested")
        return x
    fw = framework_of(x)
    if fw == "cupy":
        return _from_cupy(x, name, dtype)
    if fw == "torch":
        return _from_torch(x, name, dtype)
    if fw == "numpy":
        raise TypeError(f"{name} is a numpy (host) array: rawflux needs CUDA device memory (CuPy, torch, JAX ...)")
    if hasattr(x, "__dlpack__"):
        try:
            return _from_dlpack(x, name, dtype, stream, "jax" if fw == "jax" else "dlpack")
        except BufferError:
            if not hasattr(x, "__cuda_array_interface__"):
                raise
    if hasattr(x, "__cuda_array_interface__"):
        return _from_cai(x, name, dtype, stream)
    raise TypeError(
        f"{name} of type {type(x).__module__}.{type(x).__qualname__} is not an array rawflux can read: "
        "pass a CuPy array, a torch tensor, a JAX array, or an object with __dlpack__ or __cuda_array_interface__"
    )


def intake_stream(stream, arrays) -> int | None:
    """The op's stream when reading one of ``arrays`` needs it (a DLPack producer orders its work
    before the stream it is handed; a CAI producer's stream is joined to it), else None: CuPy
    arrays and torch tensors are read and checked first, and the op asks for its stream after
    (resolve_stream), so a bad argument is told before any CUDA call."""
    if stream is not None:
        return stream_handle(stream)
    if any(_read_on_stream(x) for x in arrays if x is not None):
        return resolve_stream(None, [x for x in arrays if x is not None])
    return None


def _read_on_stream(x) -> bool:
    if isinstance(x, Tensor):
        return False  # read already
    fw = framework_of(x)
    if fw == "cai":
        return True
    if fw not in ("jax", "dlpack"):
        return False
    where = getattr(x, "__dlpack_device__", None)
    if where is None:
        return True
    try:
        return int(where()[0]) in (KDL_CUDA, KDL_CUDA_MANAGED)  # host memory: refused at intake, no stream needed
    except Exception:  # noqa: BLE001 - let intake say what is wrong with it
        return False


def _settle_dtype(name: str, found: DType | None, raw_itemsize: int | None, what: str, override) -> DType:
    """The DType for intake: the detected one, or ``override`` over raw bytes of its size."""
    if override is None:
        if found is None:
            hint = " (raw bytes: pass dtype= to say what they hold)" if raw_itemsize else ""
            raise _Unsupported(f"{name} has unsupported dtype {what}{hint}: rawflux handles {supported()}", what)
        return found
    want = DType.from_any(override)
    if found is not None:
        if found != want:
            raise TypeError(f"{name} has dtype {found} but dtype={want} was requested")
        return found
    if raw_itemsize != want.itemsize:
        raise TypeError(f"{name} has dtype {what}, which cannot hold {want} ({want.itemsize}-byte elements)")
    return want


def _elem_strides(name: str, byte_strides, itemsize: int, shape) -> tuple[int, ...]:
    out = []
    for n, s in zip(shape, byte_strides):
        if s % itemsize:
            if n <= 1:  # a stride never used to step can be anything
                out.append(0)
                continue
            raise ValueError(f"{name} has byte strides {tuple(byte_strides)} that are not multiples of its {itemsize}-byte elements")
        out.append(s // itemsize)
    return tuple(out)


def _contiguous_strides(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(out))


def _np_dtype_info(d: np.dtype) -> tuple[DType | None, int | None, str]:
    found = np_dtype_to_dtype(d)
    raw = d.itemsize if d.kind in "uV" else None
    return found, raw, str(d)


def _from_cupy(x, name, override) -> Tensor:
    found, raw, what = _np_dtype_info(x.dtype)
    dt = _settle_dtype(name, found, raw, what, override)
    shape = tuple(int(n) for n in x.shape)
    return Tensor(int(x.data.ptr), shape, _elem_strides(name, x.strides, x.dtype.itemsize, shape), dt, int(x.device.id), "cupy", x)


_TORCH_RAW = {"uint8": 1, "uint16": 2}  # storage that dtype= may reinterpret


def _from_torch(x, name, override) -> Tensor:
    dev = x.device
    if dev.type != "cuda":
        raise ValueError(f"{name} is a torch tensor on {dev}: rawflux needs CUDA tensors (x.cuda())")
    if str(x.layout) != "torch.strided":
        raise ValueError(f"{name} has torch layout {x.layout}: rawflux needs dense strided tensors")
    tname = str(x.dtype).removeprefix("torch.")
    found = _BY_NAME.get(tname)
    dt = _settle_dtype(name, found, _TORCH_RAW.get(tname), str(x.dtype), override)
    return Tensor(int(x.data_ptr()), tuple(int(n) for n in x.shape), tuple(int(s) for s in x.stride()), dt, int(dev.index), "torch", x)


# --- DLPack: read the capsule ourselves (bf16/fp8 need no framework support) ---------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_DLPACK_FLAG_READ_ONLY = 1
_capsule_get_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_get_name.restype = ctypes.c_char_p
_capsule_get_name.argtypes = [ctypes.py_object]
_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


@dataclass(frozen=True)
class DLPackView:
    ptr: int  # data + byte_offset
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None  # elements; None = compact row-major
    code: int
    bits: int
    lanes: int
    device_type: int
    device_id: int
    readonly: bool
    versioned: bool


def read_dlpack_capsule(capsule) -> DLPackView:
    """Read a (not yet consumed) DLPack capsule without consuming it: the capsule stays owned by
    its producer and frees the tensor when it is collected, so keep it alive while in use."""
    name = _capsule_get_name(capsule)
    if name == b"dltensor_versioned":
        m = _DLManagedTensorVersioned.from_address(_capsule_get_pointer(capsule, name))
        if m.major != 1:
            raise BufferError(f"DLPack version {m.major}.{m.minor} is not supported (need 1.x)")
        t, readonly = m.dl_tensor, bool(m.flags & _DLPACK_FLAG_READ_ONLY)
    elif name == b"dltensor":
        t, readonly = _DLManagedTensor.from_address(_capsule_get_pointer(capsule, name)).dl_tensor, False
    else:
        raise BufferError(f"not an unconsumed DLPack capsule (capsule name {name!r})")
    ndim = int(t.ndim)
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    strides = tuple(int(t.strides[i]) for i in range(ndim)) if ndim and bool(t.strides) else None
    return DLPackView(
        int(t.data or 0) + int(t.byte_offset), shape, strides, int(t.dtype.code), int(t.dtype.bits),
        int(t.dtype.lanes), int(t.device.device_type), int(t.device.device_id), readonly, name == b"dltensor_versioned",
    )


def _dlpack_capsule(x, stream: int | None):
    # DLPack stream convention for CUDA: None = legacy default stream, 1 = legacy, 2 = per-thread,
    # 0 is disallowed; an int is the consumer's stream the producer must order its work before.
    s = None if stream is None else (1 if int(stream) == 0 else int(stream))
    try:
        return x.__dlpack__(stream=s, max_version=(1, 0))
    except TypeError:
        pass  # a producer from before DLPack 1.0
    try:
        return x.__dlpack__(stream=s)
    except TypeError:
        if s is not None:
            raise
        return x.__dlpack__()


def _dl_device_name(t: int) -> str:
    return _DL_DEVICE_NAMES.get(t, f"device type {t}")


def _from_dlpack(x, name, override, stream, framework) -> Tensor:
    if hasattr(x, "__dlpack_device__"):
        dev_type, _ = x.__dlpack_device__()
        if int(dev_type) not in (KDL_CUDA, KDL_CUDA_MANAGED):
            raise ValueError(f"{name} lives on {_dl_device_name(int(dev_type))} memory: rawflux needs CUDA device memory")
    capsule = _dlpack_capsule(x, stream)
    v = read_dlpack_capsule(capsule)
    if v.device_type not in (KDL_CUDA, KDL_CUDA_MANAGED):
        raise ValueError(f"{name} lives on {_dl_device_name(v.device_type)} memory: rawflux needs CUDA device memory")
    return _tensor_from_view(v, name, override, framework, x, capsule)


def _tensor_from_view(v: DLPackView, name, override, framework, obj, keep) -> Tensor:
    what = f"DLPack (code={v.code}, bits={v.bits}, lanes={v.lanes})"
    try:
        found = DType.from_dlpack(v.code, v.bits, v.lanes)
    except TypeError:
        found = None
    raw = v.bits // 8 if v.code in (DL_UINT, DL_OPAQUE) and v.lanes == 1 and v.bits % 8 == 0 else None
    dt = _settle_dtype(name, found, raw, what, override)
    strides = v.strides if v.strides is not None else _contiguous_strides(v.shape)
    return Tensor(v.ptr, v.shape, strides, dt, v.device_id, framework, obj, v.readonly, keep)


# --- __cuda_array_interface__ ----------------------------------------------------------------

def pointer_device(ptr: int) -> int:
    """CUDA device ordinal owning ``ptr``; ValueError for host memory. (Tests replace this.)"""
    require_cuda()
    import cupy

    attrs = cupy.cuda.runtime.pointerGetAttributes(int(ptr))
    if int(attrs.type) not in (2, 3):  # cudaMemoryTypeDevice, cudaMemoryTypeManaged
        raise ValueError(f"pointer {int(ptr):#x} is not CUDA device memory (memory type {int(attrs.type)})")
    return int(attrs.device)


def _from_cai(x, name, override, stream) -> Tensor:
    cai = x.__cuda_array_interface__
    if cai.get("mask") is not None:
        raise ValueError(f"{name} has a __cuda_array_interface__ mask: masked arrays are not supported")
    shape = tuple(int(n) for n in cai["shape"])
    typestr = cai["typestr"]
    found = typestr_to_dtype(typestr)
    descr = cai.get("descr")
    if found is None and descr and len(descr) == 1 and descr[0][0]:
        found = _BY_NAME.get(str(descr[0][0]).lower())  # a producer naming the type, e.g. ('bfloat16', '<V2')
    kind, size = typestr[1:2], typestr[2:]
    raw = int(size) if kind in ("u", "V") and size.isdigit() else None
    dt = _settle_dtype(name, found, raw, f"typestr {typestr!r}", override)
    ptr, readonly = cai["data"]
    ptr = int(ptr or 0)
    itemsize = int(size) if size.isdigit() else dt.itemsize
    if itemsize != dt.itemsize:
        raise TypeError(f"{name}: typestr {typestr!r} has {itemsize}-byte elements but {dt} has {dt.itemsize}")
    byte_strides = cai.get("strides")
    strides = _contiguous_strides(shape) if byte_strides is None else _elem_strides(name, byte_strides, itemsize, shape)
    numel = math.prod(shape)
    if ptr == 0 and numel == 0:
        device = -1
    else:
        try:
            device = pointer_device(ptr)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    producer = cai.get("stream")
    if producer is not None and stream is not None and device >= 0:
        # CAI v3: the consumer must order its work after the producer's stream.
        stream_wait(int(stream), int(producer), device)
    return Tensor(ptr, shape, strides, dt, device, "cai", x, bool(readonly))


# --------------------------------------------------------------------------------------------
# checks (all before any launch; messages name the argument)

def _dtype_set(dtypes) -> tuple[DType, ...]:
    if isinstance(dtypes, (DType, str)) or not isinstance(dtypes, Iterable):
        return (DType.from_any(dtypes),)
    return tuple(DType.from_any(d) for d in dtypes)


def _fmt_shape(shape) -> str:
    return "(" + ", ".join("*" if n is None else str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def check_matrix(
    t,
    name: str,
    *,
    dtypes,
    device: int | None,
    shape=None,
    align: int = 16,
    pitch_align: int | None = None,
    ld_ok: bool = False,
    device_owner: str = "the group",
) -> Tensor:
    """Check a 2-D operand before launch and return its Tensor (``t`` may be a raw array).

    dtypes: allowed DType(s); device: required device ordinal (None: any); shape: expected
    (rows, cols), None for "any" in either; align: required pointer alignment in bytes;
    pitch_align: required row pitch alignment in bytes (default ``align``: 16-byte vector and
    TMA loads need every row to start aligned; pass 1 where a kernel copes with ragged rows);
    ld_ok: accept a row pitch larger than the row (strides (ld, 1), ld >= cols).
    """
    if not isinstance(t, Tensor):
        t = as_tensor(t, name)
    if device is not None and t.device != device and not (t.device < 0 and t.numel == 0):
        raise ValueError(f"{name} is on device {t.device} but {device_owner} uses device {device}")
    allowed = _dtype_set(dtypes)
    if t.dtype not in allowed:
        raise TypeError(f"{name} has dtype {t.dtype} but must be {' or '.join(d.tag for d in allowed)}")
    if t.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got {t.ndim}-D shape {tuple(t.shape)}")
    if shape is not None:
        if len(shape) != 2 or any(want is not None and want != got for want, got in zip(shape, t.shape)):
            raise ValueError(f"{name} has shape {tuple(t.shape)} but {_fmt_shape(tuple(shape))} is expected")
    rows, cols = t.shape
    if t.numel == 0:
        return t
    col_ok = t.strides[1] == 1 or cols == 1
    row_ok = rows == 1 or t.strides[0] == cols or (ld_ok and t.strides[0] >= cols)
    if not (col_ok and row_ok):
        want = f"({'ld >= ' if ld_ok else ''}{cols}, 1)"
        raise ValueError(
            f"{name} has strides {tuple(t.strides)} (in elements) for shape {tuple(t.shape)}: rawflux needs a "
            f"row-major matrix with contiguous rows, strides {want}; pass a contiguous copy "
            "(torch: x.contiguous(), CuPy: cupy.ascontiguousarray(x))"
        )
    if align > 1 and t.ptr % align:
        raise ValueError(
            f"{name}'s data pointer {t.ptr:#x} is not {align}-byte aligned ({t.ptr % align} bytes past a boundary): "
            "the kernels' vector and TMA loads need it; pass a fresh allocation or a copy (a slice that starts "
            "mid-row shifts the pointer)"
        )
    pitch_align = align if pitch_align is None else pitch_align
    pitch = (t.strides[0] if rows > 1 else cols) * t.itemsize
    if rows > 1 and pitch_align > 1 and pitch % pitch_align:
        raise ValueError(
            f"{name}'s rows are {pitch} bytes apart, not a multiple of {pitch_align}: every row must start "
            f"{pitch_align}-byte aligned (for {t.dtype}, make the row length a multiple of {pitch_align // math.gcd(pitch_align, t.itemsize)})"
        )
    return t


def check_same_dtype(**named: Tensor) -> DType:
    """All named tensors share one dtype (returned); TypeError naming them otherwise."""
    items = list(named.items())
    first = items[0][1].dtype
    if any(t.dtype != first for _, t in items[1:]):
        listing = ", ".join(f"{n} is {t.dtype}" for n, t in items)
        raise TypeError(f"{' and '.join(n for n, _ in items)} must have the same dtype: {listing}")
    return first


def check_same_device(**named: Tensor) -> int:
    items = list(named.items())
    first = items[0][1].device
    if any(t.device != first for _, t in items[1:]):
        listing = ", ".join(f"{n} on device {t.device}" for n, t in items)
        raise ValueError(f"{' and '.join(n for n, _ in items)} must be on one device: {listing}")
    return first


def _overlaps(a: Tensor, b: Tensor) -> bool:
    a0, a1 = a.byte_range()
    b0, b1 = b.byte_range()
    return a0 < b1 and b0 < a1


# --------------------------------------------------------------------------------------------
# outputs

def new_output(shape, dtype, like, *, stream=None) -> tuple[Tensor, object]:
    """Allocate a dense row-major output on ``like``'s device, in ``like``'s framework: torch.empty
    for torch callers, CuPy for everyone else. JAX callers get a CuPy buffer (JAX arrays are
    immutable) that `wrap_output` turns into a JAX array after the launch. The allocation is
    made on ``stream`` (the op's launch stream) so the caching allocators never hand the memory
    to other work while the op still writes it. Returns (Tensor, buffer object); hand the
    Tensor to wrap_output to get what the caller receives."""
    dt = DType.from_any(dtype)
    like = like if isinstance(like, Tensor) else as_tensor(like, "like")
    shape = tuple(int(n) for n in shape)
    if like.framework == "torch":
        import torch

        dev = torch.device("cuda", like.device)
        tdt = getattr(torch, dt.torch_name)
        if stream is not None and int(stream) != torch.cuda.current_stream(dev).cuda_stream:
            with torch.cuda.stream(torch.cuda.ExternalStream(int(stream), device=dev)):
                obj = torch.empty(shape, dtype=tdt, device=dev)
        else:
            obj = torch.empty(shape, dtype=tdt, device=dev)
        return _from_torch(obj, "out", None), obj
    require_cuda()
    import cupy

    with use_stream(stream, like.device if like.device >= 0 else None):
        try:
            obj = cupy.empty(shape, dtype=dt.np)
        except (TypeError, ValueError):  # a CuPy that cannot hold ml_dtypes: raw storage of the same size
            obj = cupy.empty(shape, dtype=_raw_np(dt))
    t = _from_cupy(obj, "out", dt)
    if like.framework == "jax":
        t.wrap_to = "jax"
    return t, obj


def _raw_np(dt: DType) -> np.dtype:
    return np.dtype({1: np.uint8, 2: np.uint16, 4: np.uint32}[dt.itemsize])


def check_out(out, name: str, *, shape, dtype, device: int | None, inputs: Mapping | None = None,
              align: int = 16, device_owner: str = "the group", stream=None) -> Tensor:
    """Validate a caller-given output: writable, on ``device``, ``dtype``, exactly ``shape``,
    dense row-major, aligned, and not overlapping any of ``inputs`` ({name: Tensor})."""
    t = as_tensor(out, name, stream=stream)
    if t.readonly:
        raise ValueError(f"{name} is read-only")
    t = check_matrix(t, name, dtypes=dtype, device=device, shape=shape, align=align, device_owner=device_owner)
    for other_name, other in (inputs or {}).items():
        if _overlaps(t, other):
            raise ValueError(f"{name} overlaps input {other_name}: rawflux reads inputs while it writes {name}; pass a separate buffer")
    return t


def prepare_output(out, name: str, shape, dtype, like, *, stream=None, inputs: Mapping | None = None,
                   align: int = 16, device_owner: str = "the group") -> tuple[Tensor, object]:
    """``out`` checked (see check_out), or a new output like ``like`` when ``out`` is None."""
    like = like if isinstance(like, Tensor) else as_tensor(like, "like")
    if out is None:
        return new_output(shape, dtype, like, stream=stream)
    t = check_out(out, name, shape=shape, dtype=dtype, device=like.device, inputs=inputs, align=align,
                  device_owner=device_owner, stream=stream)
    return t, out


def wrap_output(like, out, *, stream=None):
    """What the op returns. ``out`` is the output Tensor (from prepare_output / new_output: the
    caller's own ``out=`` object comes back unchanged, a new JAX output becomes a JAX array) or a
    CuPy array (converted to ``like``'s framework when that is torch or JAX). Call it after the
    launch: JAX and torch import through DLPack, which makes their stream wait for ``stream``,
    where the op wrote the data."""
    if isinstance(out, Tensor):
        if out.wrap_to is None:
            return out.obj
        target, arr, dt = out.wrap_to, out.obj, out.dtype
    else:
        target = like.framework if isinstance(like, Tensor) else framework_of(like)
        arr = out
        if framework_of(arr) != "cupy" or target not in ("jax", "torch"):
            return arr
        dt = np_dtype_to_dtype(arr.dtype)
        if dt is None:
            return arr  # not a rawflux dtype: hand it over as it is
    with use_stream(stream, int(arr.device.id)):
        if dt in (DType.F16, DType.F32) and arr.dtype == dt.np:
            if target == "jax":
                import jax.dlpack

                return jax.dlpack.from_dlpack(arr)
            import torch

            return torch.from_dlpack(arr)
        # bf16 / fp8 travel as same-size unsigned ints, so no CuPy DLPack support for them is needed
        raw = arr.view(_raw_np(dt))
        if target == "jax":
            import jax
            import jax.dlpack

            if arr.dtype == dt.np:
                try:
                    return jax.dlpack.from_dlpack(arr)  # zero copy where CuPy exports bf16/fp8
                except Exception:
                    pass
            return jax.lax.bitcast_convert_type(jax.dlpack.from_dlpack(raw), dt.np)  # one device copy
        import torch

        return torch.from_dlpack(raw).view(getattr(torch, dt.torch_name))
