"""The CUDA calls rawflux.dist makes, behind one small object.

Group and SymmetricBuffer talk to the device only through a backend, so the CPU tests can swap
in a fake one (host shared memory standing in for IPC-mapped device memory) and cover the MPI
logic, the handle exchange and the teardown order on a machine with no GPU.

The real backend uses CuPy's CUDA runtime bindings (plain cudaMalloc, never CuPy's pool: an IPC
handle describes a whole allocation, and the pool sub-allocates) and rawflux.jit for the kernel.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from .layout import GROUP_CTRL_BYTES

_ERR_PEER_ACCESS_ALREADY_ENABLED = 704  # cudaErrorPeerAccessAlreadyEnabled


def gpu_available() -> tuple[bool, str]:
    """(True, "") when a CUDA device can run kernels here, else (False, why) for pytest.skip."""
    try:
        import cupy
        from cupy.cuda import runtime

        n = runtime.getDeviceCount()
        if n <= 0:
            return False, "no CUDA device visible"
        cupy.cuda.Device(0).synchronize()
        return True, ""
    except Exception as e:  # noqa: BLE001 - any failure means "no usable GPU", with the reason
        return False, f"no usable CUDA GPU ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"


def stream_handle(stream) -> int:
    """A raw cudaStream_t from None (CuPy's current stream), an int, a CuPy stream (.ptr) or a
    torch stream (.cuda_stream)."""
    if stream is None:
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    if isinstance(stream, (int, np.integer)):
        return int(stream)
    for attr in ("ptr", "cuda_stream"):
        h = getattr(stream, attr, None)
        if h is not None:
            return int(h)
    raise TypeError(f"cannot use {type(stream).__name__} as a CUDA stream: pass a CuPy or torch stream or a handle")


def barrier_block(world: int) -> int:
    """Threads of the one-CTA barrier kernel: a warp per 32 ranks (one thread per rank)."""
    return 32 * ((world + 31) // 32)


MPS_ENABLED_ATTR = 133  # cudaDevAttrMpsEnabled / CU_DEVICE_ATTRIBUTE_MPS_ENABLED (CUDA >= 12.x)


class CudaBackend:
    name = "cuda"
    has_device = True

    def problem(self) -> Exception | None:
        """Why CUDA cannot be used in this process (the error to raise), or None."""
        from ..runtime.device import problem

        return problem()

    # --- devices ----------------------------------------------------------------------------
    def device_count(self) -> int:
        from cupy.cuda import runtime

        return int(runtime.getDeviceCount())

    def use_device(self, dev: int) -> None:
        import cupy

        cupy.cuda.Device(dev).use()

    def device_scope(self, dev: int):
        import cupy

        return cupy.cuda.Device(dev)

    def pci_bus_id(self, dev: int) -> str:
        from cupy.cuda import runtime

        return runtime.deviceGetPCIBusId(dev)

    def device_by_pci_bus_id(self, bus_id: str) -> int | None:
        from cupy.cuda import runtime

        try:
            return int(runtime.deviceGetByPCIBusId(bus_id))
        except runtime.CUDARuntimeError:
            return None  # that GPU is not visible to this process

    def can_access_peer(self, dev: int, peer: int) -> bool:
        from cupy.cuda import runtime

        return bool(runtime.deviceCanAccessPeer(dev, peer))

    def mps_enabled(self, dev: int) -> bool:
        """Whether this process's contexts on ``dev`` are MPS clients (cudaDevAttrMpsEnabled)."""
        from cupy.cuda import runtime

        return bool(runtime.deviceGetAttribute(MPS_ENABLED_ATTR, dev))

    def enable_peer_access(self, peer: int) -> None:
        """Enable access from the current device to ``peer``; already enabled is fine. (CuPy
        links its own CUDA runtime, so the error code left behind stays private to CuPy.)"""
        from cupy.cuda import runtime

        try:
            runtime.deviceEnablePeerAccess(peer)
        except runtime.CUDARuntimeError as e:
            if getattr(e, "status", None) != _ERR_PEER_ACCESS_ALREADY_ENABLED:
                raise

    # --- memory -----------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        from cupy.cuda import runtime

        return int(runtime.malloc(nbytes))

    def free(self, ptr: int) -> None:
        from cupy.cuda import runtime

        runtime.free(ptr)

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        """Synchronous: returns once the bytes are set (peers may write right after)."""
        from cupy.cuda import runtime

        runtime.memset(ptr, value, nbytes)
        runtime.deviceSynchronize()

    def memcpy_htod(self, dst: int, data: bytes) -> None:
        from cupy.cuda import runtime

        buf = ctypes.create_string_buffer(bytes(data), len(data))
        runtime.memcpy(dst, ctypes.addressof(buf), len(data), runtime.memcpyHostToDevice)
        runtime.deviceSynchronize()

    def memcpy_dtoh(self, src: int, nbytes: int) -> bytes:
        from cupy.cuda import runtime

        buf = ctypes.create_string_buffer(nbytes)
        runtime.memcpy(ctypes.addressof(buf), src, nbytes, runtime.memcpyDeviceToHost)
        return buf.raw

    def address_range(self, ptr: int) -> tuple[int, int]:
        """(base, size) of the allocation that holds ``ptr`` (cuMemGetAddressRange). cudaMalloc may
        sub-allocate a small buffer from a larger block; an IPC handle then opens to the block's
        base, not to ``ptr``."""
        from cuda.bindings import driver

        err, base, size = driver.cuMemGetAddressRange(ptr)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuMemGetAddressRange({ptr:#x}) failed: {err.name}")
        return int(base), int(size)

    def ipc_get(self, ptr: int) -> bytes:
        from cupy.cuda import runtime

        return bytes(runtime.ipcGetMemHandle(ptr))

    def ipc_open(self, handle: bytes) -> int:
        from cupy.cuda import runtime

        return int(runtime.ipcOpenMemHandle(handle, runtime.cudaIpcMemLazyEnablePeerAccess))

    def ipc_close(self, ptr: int) -> None:
        from cupy.cuda import runtime

        runtime.ipcCloseMemHandle(ptr)

    def host_alloc_mapped(self, nbytes: int) -> tuple[int, int]:
        """Pinned host memory mapped into the device's address space, zeroed: (host, device)."""
        from cupy.cuda import runtime

        host = int(runtime.hostAlloc(nbytes, runtime.hostAllocMapped))
        ctypes.memset(host, 0, nbytes)
        dev = host  # with unified addressing (every 64-bit platform) the two coincide
        try:
            from cuda.bindings import driver

            err, dptr = driver.cuMemHostGetDevicePointer(host, 0)
            if err == driver.CUresult.CUDA_SUCCESS:
                dev = int(dptr)
        except Exception:  # noqa: BLE001 - cuda-bindings missing: UVA pointer above is right
            pass
        return host, dev

    def free_host(self, host: int) -> None:
        from cupy.cuda import runtime

        runtime.freeHost(host)

    def read_host(self, host: int, nbytes: int) -> bytes:
        return ctypes.string_at(host, nbytes)

    def device_u64_array(self, ptr: int, count: int, dev: int):
        """A CuPy u64 view of ``count`` words at ``ptr`` (memory owned by the group)."""
        import cupy

        mem = cupy.cuda.UnownedMemory(ptr, 8 * count, None, dev)
        return cupy.ndarray((count,), dtype=cupy.uint64, memptr=cupy.cuda.MemoryPointer(mem, 0))

    # --- sync -------------------------------------------------------------------------------
    def synchronize(self) -> None:
        from cupy.cuda import runtime

        runtime.deviceSynchronize()

    def stream_synchronize(self, stream) -> None:
        from cupy.cuda import runtime

        runtime.streamSynchronize(stream_handle(stream))

    # --- the barrier kernel ---------------------------------------------------------------
    @functools.lru_cache(maxsize=None)  # noqa: B019 - one backend per process, kernels per device
    def _barrier_kernel(self, dev: int):
        from ..jit import get_kernel

        return get_kernel("barrier.cu", "rawflux::barrier_kernel", device_id=dev)

    def prepare_barrier(self, dev: int) -> None:
        """Compile and load before any capture (loading a module is not a stream operation, but
        compiling during a capture would stall it)."""
        self._barrier_kernel(dev)

    def launch_barrier(self, group_ctrl_ptr: int, world: int, dev: int, stream) -> None:
        k = self._barrier_kernel(dev)
        k.launch((1, 1, 1), (barrier_block(world), 1, 1), (np.uint64(group_ctrl_ptr),), stream=cupy_stream(stream))


_external_streams: dict[int, object] = {}


def cupy_stream(stream):
    """What Kernel.launch takes: None (CuPy's current stream), a CuPy stream as is, anything
    else (int handle, torch stream) as a CuPy wrapper made once per handle (making one per launch
    costs host time, and CuPy warns each time)."""
    if stream is None:
        return None
    import cupy

    if isinstance(stream, (cupy.cuda.Stream, cupy.cuda.ExternalStream)):
        return stream
    handle = stream_handle(stream)
    wrapped = _external_streams.get(handle)
    if wrapped is None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            wrapped = cupy.cuda.ExternalStream(handle)
        _external_streams[handle] = wrapped
    return wrapped


_cuda_backend: CudaBackend | None = None


def cuda_backend() -> CudaBackend:
    global _cuda_backend
    if _cuda_backend is None:
        _cuda_backend = CudaBackend()
    return _cuda_backend


__all__ = ["CudaBackend", "cuda_backend", "gpu_available", "stream_handle", "barrier_block", "GROUP_CTRL_BYTES"]
