"""Element types rawflux kernels handle, and their names in every framework we take arrays from.

fp8 (E4M3 = OCP float8_e4m3fn, E5M2 = float8_e5m2) is carried as raw bytes: intake and output
only move pointers, so any op can accept it later without changes here.
"""
from __future__ import annotations

import enum
from typing import NamedTuple

import ml_dtypes
import numpy as np

# DLPack DLDataTypeCode values (dlpack.h, v1.1)
DL_INT, DL_UINT, DL_FLOAT, DL_OPAQUE, DL_BFLOAT = 0, 1, 2, 3, 4
DL_FLOAT8_E4M3FN, DL_FLOAT8_E5M2 = 10, 12


class _Info(NamedTuple):
    itemsize: int
    np: np.dtype
    torch: str  # attribute name in the torch module
    dlpack: tuple[int, int]  # (code, bits)
    aliases: tuple[str, ...]


class DType(enum.Enum):
    """A dtype rawflux kernels understand. ``.tag`` is the short name used in kernel names,
    configs and messages."""

    BF16 = "bf16"
    F16 = "f16"
    F32 = "f32"
    E4M3 = "e4m3"
    E5M2 = "e5m2"

    @property
    def tag(self) -> str:
        return self.value

    @property
    def itemsize(self) -> int:
        return _INFO[self].itemsize

    @property
    def np(self) -> np.dtype:
        """The numpy dtype (ml_dtypes for bf16 and fp8); CuPy and JAX use the same objects."""
        return _INFO[self].np

    @property
    def torch_name(self) -> str:
        return _INFO[self].torch

    @property
    def dlpack(self) -> tuple[int, int]:
        """(DLDataTypeCode, bits), lanes are always 1."""
        return _INFO[self].dlpack

    @property
    def is_fp8(self) -> bool:
        return self.itemsize == 1

    def __str__(self) -> str:
        return self.value

    @classmethod
    def from_any(cls, x) -> "DType":
        """DType from a DType, a name ("bf16", "bfloat16", "float8_e4m3fn", ...), a numpy / CuPy /
        JAX / ml_dtypes dtype or scalar type, or a torch.dtype. TypeError if rawflux has no such
        dtype."""
        got = _lookup(x)
        if got is None:
            raise TypeError(f"unsupported dtype {_describe(x)}: rawflux handles {supported()}")
        return got

    @classmethod
    def from_dlpack(cls, code: int, bits: int, lanes: int = 1) -> "DType":
        got = _BY_DLPACK.get((int(code), int(bits))) if int(lanes) == 1 else None
        if got is None:
            raise TypeError(
                f"unsupported DLPack dtype (code={code}, bits={bits}, lanes={lanes}): rawflux handles {supported()}"
            )
        return got


_INFO = {
    DType.BF16: _Info(2, np.dtype(ml_dtypes.bfloat16), "bfloat16", (DL_BFLOAT, 16), ("bf16", "bfloat16")),
    DType.F16: _Info(2, np.dtype(np.float16), "float16", (DL_FLOAT, 16), ("f16", "fp16", "float16", "half")),
    DType.F32: _Info(4, np.dtype(np.float32), "float32", (DL_FLOAT, 32), ("f32", "fp32", "float32", "float")),
    DType.E4M3: _Info(
        1, np.dtype(ml_dtypes.float8_e4m3fn), "float8_e4m3fn", (DL_FLOAT8_E4M3FN, 8),
        ("e4m3", "fp8_e4m3", "e4m3fn", "float8_e4m3fn", "fp8_e4m3fn"),
    ),
    DType.E5M2: _Info(
        1, np.dtype(ml_dtypes.float8_e5m2), "float8_e5m2", (DL_FLOAT8_E5M2, 8), ("e5m2", "fp8_e5m2", "float8_e5m2"),
    ),
}
_BY_NAME = {a: d for d, info in _INFO.items() for a in info.aliases}
_BY_NP = {info.np: d for d, info in _INFO.items()}
_BY_DLPACK = {info.dlpack: d for d, info in _INFO.items()}


def supported() -> str:
    return ", ".join(d.tag for d in DType)


def _describe(x) -> str:
    return repr(x) if isinstance(x, str) else str(x)


def _lookup(x) -> DType | None:
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        key = x.strip().lower()
        if key.startswith("torch."):
            key = key[len("torch."):]
        hit = _BY_NAME.get(key)
        if hit is not None:
            return hit
        try:
            return _BY_NP.get(np.dtype(key))
        except TypeError:
            return None
    mod = type(x).__module__ or ""
    if mod.startswith("torch"):  # torch.dtype: read its name, never import torch for this
        name = str(x)
        return _BY_NAME.get(name[len("torch."):]) if name.startswith("torch.") else None
    try:
        return _BY_NP.get(np.dtype(x))  # numpy / CuPy / JAX dtypes and scalar types, ml_dtypes
    except TypeError:
        return None


def np_dtype_to_dtype(d: np.dtype) -> DType | None:
    """Exact numpy-dtype match, or None (used by intake before it decides how to complain)."""
    return _BY_NP.get(d)


def _is_dtype_like(x) -> bool:
    if isinstance(x, (DType, str, np.dtype, type)):
        return True
    return type(x).__name__ == "dtype" and (type(x).__module__ or "").startswith("torch")


def dtype_of(x) -> DType:
    """DType of a dtype-like (see DType.from_any) or of an array that has ``.dtype`` (CuPy, torch,
    JAX, numpy) or only a ``__cuda_array_interface__``."""
    if _is_dtype_like(x):
        return DType.from_any(x)
    if hasattr(x, "dtype"):
        return DType.from_any(x.dtype)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        got = typestr_to_dtype(cai["typestr"])
        if got is None:
            raise TypeError(f"unsupported __cuda_array_interface__ typestr {cai['typestr']!r}: rawflux handles {supported()}")
        return got
    return DType.from_any(x)


_BY_TYPESTR = {"f2": DType.F16, "f4": DType.F32, "V2": DType.BF16, "f1": DType.E5M2}


def typestr_to_dtype(typestr: str) -> DType | None:
    """A __cuda_array_interface__ typestr: '<f2', '<f4', '<V2' (bf16: ml_dtypes' and CuPy's
    spelling; no other 2-byte void type exists there), '|f1' (ml_dtypes' float8_e5m2). '|V1' is
    every other 8-bit ml_dtypes type (e4m3fn, e4m3fnuz, int4 ...), so it is ambiguous: None."""
    t = typestr.strip()
    order, body = (t[0], t[1:]) if t[:1] in "<>|=" else ("=", t)
    if order == ">" and body[1:] != "1":
        return None  # big-endian multi-byte data: no GPU producer emits it
    return _BY_TYPESTR.get(body)
