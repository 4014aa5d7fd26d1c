"""Arrays rawflux reads as CuPy arrays without a GPU (intake of a CuPy array makes no CUDA call): for
the tests that an op checks its arguments before any CUDA call or collective step."""
from __future__ import annotations

import types

import ml_dtypes
import numpy as np

BASE = 0x7F00_0000_0000  # a 256-byte-aligned fake device address
BF16 = ml_dtypes.bfloat16


class FakeCupy:
    """What rawflux.runtime reads of a cupy.ndarray: shape, strides in bytes, dtype, data.ptr, device.id."""

    def __init__(self, shape, dtype=BF16, ptr=BASE, strides=None, device=0):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        if strides is None:
            strides, acc = [], self.dtype.itemsize
            for n in reversed(self.shape):
                strides.append(acc)
                acc *= max(n, 1)
            strides = tuple(reversed(strides))
        self.strides = tuple(strides)
        self.data = types.SimpleNamespace(ptr=int(ptr))
        self.device = types.SimpleNamespace(id=int(device))


FakeCupy.__module__ = "cupy._core.core"  # rawflux tells CuPy arrays by their type's module


def at(i: int) -> int:
    """The i-th of some disjoint fake allocations (1 GiB apart)."""
    return BASE + (int(i) << 30)
