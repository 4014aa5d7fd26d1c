"""The bytes of a launch and the lean path that issues it: tensor maps (cached), epilogue
parameters, one preallocated argument block per thread, cached launch configurations
(cuLaunchKernelEx with cluster dims and programmatic dependent launch), and the per-stream
split-K workspace."""
from __future__ import annotations

import ctypes
import threading

from ..jit.faults import note_launch, raise_if_lost
from ..runtime import DType
from .abi import (BIAS_NONE, LOCAL_STORE_EPI, TMA_STORE_EPI, TMA_STORE_TAIL, TMAP_CODE, local_store_params)

# ------------------------------------------------------------------------------------------------
# tensor maps

_tmap_lock = threading.Lock()
_tmap_cache: dict[tuple, bytes] = {}
_TMAP_CACHE_MAX = 4096


def tensor_map(ptr: int, dtype: DType, rows: int, cols: int, ld: int, box_rows: int, box_cols: int) -> bytes:
    """128-byte CUtensorMap of a row-major (rows, cols) matrix with row pitch ld (elements), boxes of
    box_rows x box_cols, 128-byte swizzle, zero fill out of bounds. Cached: a map depends on nothing
    but these numbers."""
    return tensor_map_code(ptr, TMAP_CODE[dtype], rows, cols, ld, box_rows, box_cols)


def tensor_map_code(ptr: int, code: int, rows: int, cols: int, ld: int, box_rows: int, box_cols: int) -> bytes:
    """tensor_map with the driver's data-type code (abi.TMAP_CODE) instead of a DType."""
    key = (ptr, code, rows, cols, ld, box_rows, box_cols)
    hit = _tmap_cache.get(key)
    if hit is not None:
        return hit
    return _encode(key, code, ptr, (cols, rows), (ld,), (box_cols, box_rows),
                   f"a {rows}x{cols} matrix (dtype code {code}) at {ptr:#x}, pitch {ld}, box {box_rows}x{box_cols}")


def tensor_map_3d(ptr: int, code: int, cols: int, rows: int, slabs: int, slab_rows: int, box_rows: int, box_cols: int) -> bytes:
    """128-byte CUtensorMap of `slabs` row-major (rows, cols) matrices of 16-bit elements, slab_rows
    (>= rows) rows apart (dims cols, rows, slabs), boxes of box_rows x box_cols x 1, 128-byte
    swizzle: a box is clipped at its slab's `rows`. Cached like tensor_map."""
    key = ("3d", ptr, code, cols, rows, slabs, slab_rows, box_rows, box_cols)
    hit = _tmap_cache.get(key)
    if hit is not None:
        return hit
    return _encode(key, code, ptr, (cols, rows, slabs), (cols, slab_rows * cols), (box_cols, box_rows, 1),
                   f"{slabs} slabs of {rows}x{cols} (dtype code {code}) at {ptr:#x}, box {box_rows}x{box_cols}")


def _encode(key, code: int, ptr: int, dims, strides, box, what: str) -> bytes:
    """cuTensorMapEncodeTiled of 16-bit elements (dims innermost first, strides in elements of the
    dims past the first), 128-byte swizzle, zero fill out of bounds; cached under key."""
    from cuda.bindings import driver as drv

    itemsize = 2  # both tensor-map dtypes rawflux uses are 16-bit
    err, tm = drv.cuTensorMapEncodeTiled(
        drv.CUtensorMapDataType(code),
        len(dims),
        int(ptr),
        [drv.cuuint64_t(int(d)) for d in dims],
        [drv.cuuint64_t(int(st) * itemsize) for st in strides],
        [drv.cuuint32_t(int(b)) for b in box],
        [drv.cuuint32_t(1)] * len(dims),
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed ({err.name}) for {what}")
    raw = ctypes.string_at(int(tm.getPtr()), 128)
    with _tmap_lock:
        if len(_tmap_cache) >= _TMAP_CACHE_MAX:
            _tmap_cache.clear()
        _tmap_cache[key] = raw
    return raw


# ------------------------------------------------------------------------------------------------
# epilogue parameters


def tma_store_params(c_ptr: int, m: int, n: int, ldc: int, out_dtype: DType, bias_ptr: int = 0, bias_kind: int = BIAS_NONE) -> bytes:
    """TmaStore::Params: C's tensor map (64 x 64 boxes, 128-byte swizzle), then the register path's
    pointer and pitch and the bias; 192 bytes (the struct is 64-byte aligned for the map)."""
    tmap = tensor_map(int(c_ptr), out_dtype, int(m), int(n), int(ldc), 64, 64)
    return tmap + TMA_STORE_TAIL.pack(int(c_ptr), int(ldc), int(bias_ptr), int(bias_kind), 0) + bytes(32)


def epilogue_params(epilogue: str, c_ptr: int, m: int, n: int, ldc: int, out_dtype: DType, bias_ptr: int = 0,
                    bias_kind: int = BIAS_NONE) -> bytes:
    """The packed Params of the engine's own epilogues (TmaStore or LocalStore) for C at c_ptr."""
    if epilogue == TMA_STORE_EPI:
        return tma_store_params(c_ptr, m, n, ldc, out_dtype, bias_ptr, bias_kind)
    if epilogue != LOCAL_STORE_EPI:
        raise ValueError(f"epilogue_params packs TmaStore or LocalStore, not {epilogue}")
    return local_store_params(c_ptr, ldc, bias_ptr, bias_kind)


# ------------------------------------------------------------------------------------------------
# launching


class _ArgBlock:
    """kernelParams for up to 6 arguments (gemm_kernel: tmap_a, tmap_b, GemmParams, prologue and
    epilogue params, tmap_a_tail), each 64-byte aligned (CUtensorMap needs 64)."""

    OFFSETS = (0, 128, 256, 384, 640, 2048)
    SIZES = (128, 128, 128, 256, 1408, 128)

    def __init__(self):
        self.buf = ctypes.create_string_buffer(2176 + 64)
        base = (ctypes.addressof(self.buf) + 63) & ~63
        self.addrs = [base + o for o in self.OFFSETS]
        self.ptrs = (ctypes.c_void_p * 6)(*self.addrs)
        self.ptrs_addr = ctypes.addressof(self.ptrs)


class _ThreadArgs(threading.local):
    """One _ArgBlock per thread for launch()."""

    def __init__(self):
        self.block = _ArgBlock()


_args = _ThreadArgs()
_launch_cfgs: dict[tuple, object] = {}


def launch(kernel, grid: int, threads: int, cluster: int, smem: int, stream: int, args: tuple[bytes, ...], pdl: bool = False) -> None:
    """Launch `kernel` (a jit.Kernel) with its arguments as packed bytes (at most 6, of the sizes
    _ArgBlock holds). ``pdl``: as the programmatic dependent of the previous kernel in ``stream``
    (it may start once every CTA of that kernel has run griddepcontrol.launch_dependents)."""
    key = (kernel.handle, grid, threads, cluster, smem, stream, pdl)
    cfg = _launch_cfgs.get(key)
    if cfg is None:
        if len(_launch_cfgs) > 1024:
            _launch_cfgs.clear()
        cfg = _launch_cfgs[key] = _launch_config(kernel, grid, threads, cluster, smem, stream, pdl)
    a = _args.block
    for addr, size, raw in zip(a.addrs, _ArgBlock.SIZES, args):
        if len(raw) > size:
            raise ValueError(f"kernel argument of {len(raw)} bytes exceeds its {size}-byte slot")
        ctypes.memmove(addr, raw, len(raw))
    _driver_launch(cfg, a.ptrs_addr, kernel)


class LaunchBlock:
    """One kernel's launch with an argument block of its own (the _ArgBlock slots), written once
    and patched where a call changes it: a repeated call is one driver call. The driver copies
    kernelParams at launch, so the block may be rewritten right after. Not for concurrent use
    from several threads (its owner serialises patch + launch)."""

    def __init__(self, kernel, grid: int, threads: int, cluster: int, smem: int, args: tuple[bytes, ...] = (), pdl: bool = False):
        self.kernel, self.grid, self.threads, self.cluster, self.smem, self.pdl = kernel, grid, threads, cluster, smem, pdl
        self._block = _ArgBlock()
        self._lens = [0] * len(_ArgBlock.SIZES)  # bytes written per slot (read())
        self._cfgs: dict[int, tuple] = {}
        for slot, raw in enumerate(args):
            self.write(slot, raw)

    def write(self, slot: int, raw: bytes, offset: int = 0) -> None:
        if offset + len(raw) > _ArgBlock.SIZES[slot]:
            raise ValueError(f"{len(raw)} bytes at offset {offset} overflow argument slot {slot} ({_ArgBlock.SIZES[slot]} bytes)")
        ctypes.memmove(self._block.addrs[slot] + offset, raw, len(raw))
        self._lens[slot] = max(self._lens[slot], offset + len(raw))

    def read(self, slot: int) -> bytes:
        """The bytes written to slot `slot` (tests and debugging)."""
        return ctypes.string_at(self._block.addrs[slot], self._lens[slot])

    def args(self) -> tuple[bytes, ...]:
        """Every written slot's bytes, as launch() takes them."""
        return tuple(self.read(i) for i in range(len(self._lens)) if self._lens[i])

    def launch(self, stream: int) -> None:
        cfg = self._cfgs.get(stream)
        if cfg is None:
            cfg = self._cfgs[stream] = _launch_config(self.kernel, self.grid, self.threads, self.cluster, self.smem, stream, self.pdl)
        _driver_launch(cfg, self._block.ptrs_addr, self.kernel)


def _launch_config(kernel, grid: int, threads: int, cluster: int, smem: int, stream: int, pdl: bool):
    """(CUlaunchConfig, CUfunction) of one launch shape on one stream (cached by the callers)."""
    from cuda.bindings import driver as drv

    kernel.set_max_dynamic_smem(smem)
    lc = drv.CUlaunchConfig()
    lc.gridDimX, lc.gridDimY, lc.gridDimZ = grid, 1, 1
    lc.blockDimX, lc.blockDimY, lc.blockDimZ = threads, 1, 1
    lc.sharedMemBytes = smem
    lc.hStream = drv.CUstream(stream)
    attrs = []
    if cluster > 1:
        at = drv.CUlaunchAttribute()
        at.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        at.value.clusterDim.x, at.value.clusterDim.y, at.value.clusterDim.z = cluster, 1, 1
        attrs.append(at)
    if pdl:
        at = drv.CUlaunchAttribute()
        at.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        at.value.programmaticStreamSerializationAllowed = 1
        attrs.append(at)
    lc.attrs = attrs
    lc.numAttrs = len(attrs)
    return lc, drv.CUfunction(kernel.handle)


_cu = None  # cuda.bindings.driver, imported on first launch (the module imports without CUDA)


def _driver_launch(cfg, params_addr: int, kernel) -> None:
    global _cu
    if _cu is None:
        from cuda.bindings import driver

        _cu = driver
    (err,) = _cu.cuLaunchKernelEx(cfg[0], cfg[1], params_addr, 0)
    note_launch(kernel.symbol)
    if err:  # CUDA_SUCCESS is 0
        raise_if_lost(err, f"launch of {kernel.symbol}")
        _, msg = _cu.cuGetErrorString(err)
        raise RuntimeError(f"launch of {kernel.symbol} failed: {err.name}: {msg.decode() if msg else ''}")


def max_active_clusters(kernel, threads: int, smem: int, cluster: int) -> int:
    """How many clusters of `cluster` CTAs of `kernel` the device can hold at once (the driver's
    occupancy query: GPCs with an odd SM count leave SMs no pair can use). A grid whose CTAs wait
    on each other must not exceed it."""
    from cuda.bindings import driver as drv

    kernel.set_max_dynamic_smem(smem)
    lc = drv.CUlaunchConfig()
    lc.gridDimX, lc.gridDimY, lc.gridDimZ = cluster, 1, 1
    lc.blockDimX, lc.blockDimY, lc.blockDimZ = threads, 1, 1
    lc.sharedMemBytes = smem
    at = drv.CUlaunchAttribute()
    at.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    at.value.clusterDim.x, at.value.clusterDim.y, at.value.clusterDim.z = cluster, 1, 1
    lc.attrs = [at]
    lc.numAttrs = 1
    err, n = drv.cuOccupancyMaxActiveClusters(drv.CUfunction(kernel.handle), lc)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters failed for {kernel.symbol}: {err.name}")
    return int(n)


# ------------------------------------------------------------------------------------------------
# split-K workspace: per (device, stream), grown on demand; counters start at zero and every
# launch leaves them at zero (the last piece of a tile resets its counts).

_ws_lock = threading.Lock()
_workspaces: dict[tuple[int, int], tuple] = {}
_retired: list[tuple] = []  # grown-out workspaces (see workspace())


def workspace(device_id: int, stream: int, ws_bytes: int, n_counters: int) -> tuple[int, int]:
    """(partials pointer, counters pointer) of at least ws_bytes and n_counters u32 for `stream`."""
    key = (device_id, stream)
    with _ws_lock:
        cur = _workspaces.get(key)
        if cur is not None and cur[0].nbytes >= ws_bytes and cur[1].size >= n_counters:
            return cur[2], cur[3]
        import cupy

        from ..runtime import use_stream

        with use_stream(stream, device_id):
            ws = cupy.empty(max(ws_bytes, cur[0].nbytes if cur else 0), dtype=cupy.uint8)
            ctr = cupy.zeros(max(n_counters, cur[1].size if cur else 0, 1024), dtype=cupy.uint32)
        entry = (ws, ctr, int(ws.data.ptr), int(ctr.data.ptr))
        if cur is not None:
            # The old buffers stay allocated for good: the plans cached with their pointers (engine.plan,
            # the fused ops' fast entries) launch into them again, and freed to CuPy's pool they
            # would be handed to the caller's arrays, which a later split's partials then overwrite.
            _retired.append(cur)
        _workspaces[key] = entry
        return entry[2], entry[3]
