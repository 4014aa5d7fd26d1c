"""Kernel handles: a compiled cubin loaded on one device, launched through CuPy or, where CuPy
falls short (cluster dimensions, 64-byte-aligned by-value parameters such as CUtensorMap),
through cuda-bindings' cuLaunchKernelEx."""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import numpy as np

from .. import env
from .compiler import CompileResult, compile_cubin
from .faults import note_launch, raise_if_lost

_ARCH_BY_CC = {(9, 0): "sm_90a", (10, 0): "sm_100a"}


def arch_for_cc(major: int, minor: int) -> str:
    """sm_90a on Hopper (wgmma, setmaxnreg need the 'a' target); sm_XY elsewhere."""
    return _ARCH_BY_CC.get((major, minor), f"sm_{major}{minor}")


def device_arch(device_id: int | None = None) -> str:
    override = env.arch_override()
    if override:
        return override
    import cupy

    dev = cupy.cuda.Device(device_id)
    major, minor = (int(x) for x in dev.compute_capability)  # "90" -> 9, 0
    return arch_for_cc(major, minor)


def _drv_check(result, what: str):
    from cuda.bindings import driver

    err = result[0] if isinstance(result, tuple) else result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise_if_lost(err, what)
        _, msg = driver.cuGetErrorString(err)
        raise RuntimeError(f"{what} failed: {err.name}: {msg.decode() if msg else ''}")
    return result[1:] if isinstance(result, tuple) and len(result) > 1 else None


class _ParamPack:
    """kernelParams for cuLaunchKernel(Ex): an array of pointers to each argument's bytes.
    Each argument is copied into its own 64-byte-aligned host buffer (CUtensorMap wants 64)."""

    def __init__(self, args):
        self._keep = []
        ptrs = (ctypes.c_void_p * max(1, len(args)))()
        for i, a in enumerate(args):
            raw = _arg_bytes(a)
            buf = ctypes.create_string_buffer(len(raw) + 64)
            addr = (ctypes.addressof(buf) + 63) & ~63
            ctypes.memmove(addr, raw, len(raw))
            self._keep.append(buf)
            ptrs[i] = addr
        self._ptrs = ptrs

    @property
    def address(self) -> int:
        return ctypes.addressof(self._ptrs)


def _arg_bytes(a) -> bytes:
    if isinstance(a, (bytes, bytearray, memoryview)):
        return bytes(a)
    if isinstance(a, np.ndarray):
        return a.tobytes()
    if isinstance(a, np.generic):
        return a.tobytes()
    data_ptr = getattr(a, "data", None)
    if data_ptr is not None and hasattr(data_ptr, "ptr"):  # cupy.ndarray
        return np.uint64(data_ptr.ptr).tobytes()
    raise TypeError(
        f"kernel argument of type {type(a).__name__}: pass numpy scalars (np.uint64 for pointers, "
        "np.int32 for ints), bytes, or a CuPy array"
    )


@dataclass
class Kernel:
    """One kernel symbol loaded on one device."""

    result: CompileResult
    symbol: str
    device_id: int
    _module: object = None
    _function: object = None

    def __post_init__(self):
        import cupy

        with cupy.cuda.Device(self.device_id):
            mod = cupy.cuda.function.Module()
            mod.load(self.result.cubin)
            self._module = mod
            self._function = mod.get_function(self.symbol)
        self._max_smem_set = 0

    @property
    def function(self):
        return self._function

    @property
    def handle(self) -> int:
        return int(self._function.ptr)

    @property
    def resources(self) -> dict:
        return self.result.resources.get(self.symbol, {})

    def set_max_dynamic_smem(self, nbytes: int) -> None:
        if nbytes <= max(self._max_smem_set, 48 * 1024):
            return
        from cuda.bindings import driver

        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _drv_check(driver.cuFuncSetAttribute(driver.CUfunction(self.handle), attr, int(nbytes)), "cuFuncSetAttribute")
        self._max_smem_set = nbytes

    def launch(self, grid, block, args, *, smem: int = 0, stream=None) -> None:
        """Plain launch through CuPy. ``stream`` is a CuPy stream or a raw handle (int)."""
        self.set_max_dynamic_smem(smem)
        if isinstance(stream, int):
            stream = _external_stream(stream)
        note_launch(self.symbol)
        try:
            self._function(tuple(grid), tuple(block), tuple(args), shared_mem=smem, stream=stream)
        except Exception as e:  # noqa: BLE001 - a lost context gets its own error, the rest pass through
            raise_if_lost(e, f"launch of {self.symbol}")
            raise

    def launch_ex(self, grid, block, args, *, smem: int = 0, stream=None, cluster=(1, 1, 1)) -> None:
        """Launch through cuLaunchKernelEx: cluster dimensions and arbitrary by-value params."""
        from cuda.bindings import driver

        self.set_max_dynamic_smem(smem)
        cfg = driver.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (int(x) for x in _dim3(grid))
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (int(x) for x in _dim3(block))
        cfg.sharedMemBytes = int(smem)
        cfg.hStream = driver.CUstream(_stream_handle(stream))
        attrs = []
        cluster = _dim3(cluster)
        if cluster != (1, 1, 1):
            at = driver.CUlaunchAttribute()
            at.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            at.value.clusterDim.x, at.value.clusterDim.y, at.value.clusterDim.z = cluster
            attrs.append(at)
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        pack = _ParamPack(args)
        note_launch(self.symbol)
        _drv_check(driver.cuLaunchKernelEx(cfg, driver.CUfunction(self.handle), pack.address, 0), f"launch of {self.symbol}")


_external_streams: dict[int, object] = {}


def _external_stream(handle: int):
    """A CuPy view of a raw stream handle, made once per handle (making one per launch costs
    host time and, in CuPy 14, a deprecation warning)."""
    s = _external_streams.get(handle)
    if s is None:
        import warnings

        import cupy

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            s = cupy.cuda.ExternalStream(handle)
        if len(_external_streams) > 256:  # streams come and go; keep the table small
            _external_streams.clear()
        _external_streams[handle] = s
    return s


def _dim3(x) -> tuple[int, int, int]:
    if isinstance(x, int):
        return (x, 1, 1)
    x = tuple(int(v) for v in x)
    return x + (1,) * (3 - len(x))


def _stream_handle(stream) -> int:
    if stream is None:
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    if isinstance(stream, int):
        return stream
    return int(stream.ptr)


_kernels: dict[tuple, Kernel] = {}
_kernels_lock = threading.Lock()


def kernel_source(relpath: str) -> str:
    """The NVRTC source for a kernel file under cuda_src/rawflux/kernels/."""
    return f'#include "rawflux/kernels/{relpath}"\n'


def get_kernel(
    relpath: str,
    name_expr: str,
    *,
    device_id: int | None = None,
    arch: str | None = None,
    extra_options: tuple[str, ...] = (),
) -> Kernel:
    """Compile (or fetch) ``name_expr`` from cuda_src/rawflux/kernels/``relpath`` and load it on
    ``device_id`` (default: CuPy's current device). Memory-cached per device."""
    import cupy

    dev = cupy.cuda.Device(device_id).id if device_id is None else int(device_id)
    arch = arch or device_arch(dev)
    mkey = (relpath, name_expr, dev, arch, tuple(extra_options))
    with _kernels_lock:
        k = _kernels.get(mkey)
    if k is not None:
        return k
    res = compile_cubin(kernel_source(relpath), arch=arch, name_expressions=(name_expr,), filename=relpath, extra_options=tuple(extra_options))
    k = Kernel(res, res.lowered[name_expr], dev)
    with _kernels_lock:
        _kernels.setdefault(mkey, k)
        return _kernels[mkey]
