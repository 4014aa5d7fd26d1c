"""rawflux.gemm: C = A @ B^T ("nk", B is a linear layer's (n, k) weight) or A @ B ("kn"), on the
sm_90a engine in cuda_src/rawflux/gemm (persistent, warp-specialized, TMA + wgmma).

Two levels:
  gemm(a, b, ...)        arrays in, array out (CuPy / torch / DLPack ...), every check before launch.
  launch_gemm(cfg, ...)  raw pointers + policy names and packed policy params: what the fused
                         AllGather-GEMM / GEMM-ReduceScatter ops call with their own prologue /
                         epilogue policies, scheduler rotation and kernel file.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import dataclass

from .. import env, tune
from ..jit import get_kernel, register
from ..runtime import DType, as_tensor, check_matrix, prepare_output, resolve_stream, wrap_output
from ..tune import GemmConfig, TileConfig

__all__ = [
    "gemm", "launch_gemm", "kernel_name", "register_variants", "local_store_params", "tma_store_params", "epilogue_params",
    "plain_epilogue", "NOWAIT_PARAMS", "PLAIN_SCHED", "FUSED_SCHED",
    "GemmConfig", "TileConfig", "pick_config", "GEMM_PARAMS",
]

_TYPE_CODE = {DType.BF16: 0, DType.F16: 1, DType.F32: 2}
_LAYOUT_CODE = {"nk": 0, "kn": 1}
_TMAP_CODE = {DType.BF16: 9, DType.F16: 6}  # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, CU_TENSOR_MAP_DATA_TYPE_FLOAT16

# struct GemmParams (cuda_src/rawflux/gemm/config.cuh), same field order.
GEMM_PARAMS = struct.Struct("<18i2Qq")
# struct LocalStore::Params (policies.cuh): c, bias, ldc, bias_kind, pad.
_LOCAL_STORE = struct.Struct("<QQqii")
_TMA_STORE_TAIL = struct.Struct("<QqQii")  # after the 128-byte map: c, ldc, bias, bias_kind, pad
NOWAIT_PARAMS = struct.pack("<i", 0)
BIAS_NONE, BIAS_IN16, BIAS_F32 = 0, 1, 2


# Scheduler policies (gemm/scheduler.cuh): the plain GEMM's can split k (split-K, stream-K); the
# fused ops' cannot (they pass splits = 1 and keep their epilogue hooks per whole tile).
PLAIN_SCHED = "rawflux::StreamKSched"
FUSED_SCHED = "rawflux::TileSched"


def narrow_sched(width: int) -> str:
    """The plain GEMM's scheduler with narrow columns of `width` (GemmConfig.narrow)."""
    return f"rawflux::NarrowSched<{width}>"


def kernel_name(tile: TileConfig, dtype: DType, out_dtype: DType, b_layout: str, *, sched: str = FUSED_SCHED,
                prologue: str = "rawflux::NoWait", epilogue: str = "rawflux::LocalStore") -> str:
    """The NVRTC name expression of one gemm_kernel instantiation."""
    cfg = (
        f"rawflux::GemmCfg<{tile.bm},{tile.bn},{tune.BK},{tile.stages},{tile.cluster_m},{tile.cluster_n},"
        f"{tile.consumers},{_TYPE_CODE[dtype]},{_TYPE_CODE[out_dtype]},{_LAYOUT_CODE[b_layout]}"
        + (f",{tile.cluster_k}>" if tile.cluster_k > 1 else ">")
    )
    return f"rawflux::gemm_kernel<{cfg}, {sched}, {prologue}, {epilogue}>"


def out_dtypes_for(dtype: DType) -> tuple[DType, ...]:
    return (dtype, DType.F32)


def register_variants(relpath: str = "gemm.cu", *, sched: str = FUSED_SCHED, prologue: str = "rawflux::NoWait",
                      epilogue="rawflux::LocalStore", tiles=None, dtypes=(DType.BF16, DType.F16), layouts=("nk", "kn"),
                      out_dtypes=None) -> None:
    """Register every variant a heuristic or tuner can launch so ``python -m rawflux.check_kernels``
    compiles them all on the CPU (sm_90a only: there is no sm_80 path). ``epilogue``: a policy name,
    or a function of the output dtype giving one."""
    for dt in dtypes:
        for layout in layouts:
            for t in tiles or tune.tiles_for(layout):
                if not t.supports(layout):
                    continue
                for od in out_dtypes or out_dtypes_for(dt):
                    epi = epilogue(od) if callable(epilogue) else epilogue
                    register(relpath, kernel_name(t, dt, od, layout, sched=sched, prologue=prologue, epilogue=epi), archs=("sm_90a",))


def plain_epilogue(out_dtype: DType) -> str:
    """The plain GEMM's epilogue policy: 16-bit C through shared memory and TMA stores (TmaStore),
    f32 C from registers (LocalStore)."""
    return "rawflux::LocalStore" if out_dtype == DType.F32 else "rawflux::TmaStore"


register_variants(sched=PLAIN_SCHED, epilogue=plain_epilogue)
register_variants(sched=PLAIN_SCHED, epilogue=plain_epilogue, tiles=tune.KSPLIT_TILES)  # k-split clusters: plain GEMM only
for _w in tune.NARROW_WIDTHS:  # narrow columns: the plain GEMM's 128x256 pair, B (n, k), 16-bit C
    for _dt in (DType.BF16, DType.F16):
        register_variants(sched=narrow_sched(_w), epilogue="rawflux::TmaStore", tiles=tune.NARROW_TILES, dtypes=(_dt,),
                          layouts=("nk",), out_dtypes=(_dt,))

# TmaStore stages C in 64-row x 64-column boxes of 16-bit values (8 KB), as many per consumer
# warpgroup as the shared memory the stage ring leaves holds, up to a fragment's (mirrors TmaStore::bufs
# in policies.cuh), at most RAWFLUX_TMA_STORE_BUFS (2 unless RAWFLUX_NVRTC_DEFINES sets it).
_TMA_STORE_BOX_BYTES = 64 * 128


def epilogue_scratch_bytes(tile: TileConfig, epilogue: str, out_dtype: DType) -> int:
    """Shared memory the epilogue policy asks for (Epilogue::scratch_bytes<Cfg>())."""
    if epilogue != "rawflux::TmaStore" or out_dtype == DType.F32 or tile.wn % 64:
        return 0
    free = tune.SMEM_PER_CTA - 1024 - _scratch_offset(tile)  # kScratchFree in policies.cuh
    per_buf = _TMA_STORE_BOX_BYTES * tile.consumers
    return min(free // per_buf, tile.wn // 64, env.nvrtc_define_int("RAWFLUX_TMA_STORE_BUFS", 2)) * per_buf


def _scratch_offset(tile: TileConfig) -> int:
    return tile.stages * (tile.bm + tile.bn) * tune.BK * 2 + 1024  # kScratchOffset in policies.cuh


def _dyn_order(tile: TileConfig) -> bool:
    """RAWFLUX_NVRTC_DEFINES="RAWFLUX_DYN_SCHED=1" (development): the plain GEMM's dynamic tile
    order, for the tiles the kernel compiles it into (TileSchedT::kDynamic)."""
    return env.nvrtc_define_int("RAWFLUX_DYN_SCHED", 0) != 0 and tile.cluster_k == 1 and tile.stream_k_ok


def launch_smem_bytes(tile: TileConfig, epilogue: str, out_dtype: DType) -> int:
    """Dynamic shared memory of a launch: the tile's, or with scratch, the ring and barriers up to the
    scratch offset, the scratch and the alignment slack. RAWFLUX_DYN_SCHED adds the ticket ring and
    its barriers after the k-split pair's (inside the 1024 bytes before the scratch)."""
    scratch = epilogue_scratch_bytes(tile, epilogue, out_dtype)
    if scratch:
        return 1024 + _scratch_offset(tile) + scratch
    extra = (16 + 12 * (tile.stages + 1) + 15) // 16 * 16 if _dyn_order(tile) else 0
    return tile.smem_bytes + extra


def local_store_params(c_ptr: int, ldc: int, bias_ptr: int = 0, bias_kind: int = BIAS_NONE) -> bytes:
    return _LOCAL_STORE.pack(int(c_ptr), int(bias_ptr), int(ldc), int(bias_kind), 0)


def tma_store_params(c_ptr: int, m: int, n: int, ldc: int, out_dtype: DType, bias_ptr: int = 0, bias_kind: int = BIAS_NONE) -> bytes:
    """TmaStore::Params: C's tensor map (64 x 64 boxes, 128-byte swizzle), then the register path's
    pointer and pitch and the bias; 192 bytes (the struct is 64-byte aligned for the map)."""
    tmap = tensor_map(int(c_ptr), out_dtype, int(m), int(n), int(ldc), 64, 64)
    return tmap + _TMA_STORE_TAIL.pack(int(c_ptr), int(ldc), int(bias_ptr), int(bias_kind), 0) + bytes(32)


def epilogue_params(epilogue: str, c_ptr: int, m: int, n: int, ldc: int, out_dtype: DType, bias_ptr: int = 0,
                    bias_kind: int = BIAS_NONE) -> bytes:
    """The packed Params of the named epilogue policy (TmaStore or LocalStore) for C at c_ptr."""
    if epilogue == "rawflux::TmaStore":
        return tma_store_params(c_ptr, m, n, ldc, out_dtype, bias_ptr, bias_kind)
    return local_store_params(c_ptr, ldc, bias_ptr, bias_kind)


def bias_args(bias, n: int, dt: DType, dev: int, stream: int, *, like: str = "a", device_owner: str = "the group",
              align: int = 4, op: str = ""):
    """(Tensor or None, pointer, bias kind) of an optional (n,) bias in the inputs' dtype or f32,
    checked before any launch. The engine's epilogue reads it by element (4-byte alignment);
    a kernel that reads it in 16-byte vectors asks for align=16."""
    if bias is None:
        return None, 0, BIAS_NONE
    pre = f"{op}: " if op else ""
    tb = as_tensor(bias, "bias", stream=stream)
    if tb.dtype not in (dt, DType.F32):
        raise TypeError(f"{pre}bias has dtype {tb.dtype} but must be {dt} (like {like}) or f32")
    if tb.ndim != 1 or tb.shape[0] != n:
        raise ValueError(f"{pre}bias must have shape ({n},) (one value per output column), got {tuple(tb.shape)}")
    if tb.device != dev:
        owner = f"the group uses device {dev}" if device_owner == "the group" else f"{device_owner} is on device {dev}"
        raise ValueError(f"{pre}bias is on device {tb.device} but {owner}")
    if n > 1 and tb.strides[0] != 1:
        raise ValueError(f"{pre}bias must be contiguous (stride 1), got stride {tb.strides[0]}")
    if tb.ptr % align:
        raise ValueError(f"{pre}bias's data pointer {tb.ptr:#x} is not {align}-byte aligned"
                         + (" (pass a fresh allocation)" if align > 4 else ""))
    return tb, tb.ptr, (BIAS_F32 if tb.dtype == DType.F32 else BIAS_IN16)



# ------------------------------------------------------------------------------------------------
# tensor maps


_tmap_lock = threading.Lock()
_tmap_cache: dict[tuple, bytes] = {}
_TMAP_CACHE_MAX = 4096


def tensor_map(ptr: int, dtype: DType, rows: int, cols: int, ld: int, box_rows: int, box_cols: int) -> bytes:
    """128-byte CUtensorMap of a row-major (rows, cols) matrix with row pitch ld (elements), boxes of
    box_rows x box_cols, 128-byte swizzle, zero fill out of bounds. Cached: a map depends on nothing
    but these numbers."""
    return _tensor_map(ptr, _TMAP_CODE[dtype], rows, cols, ld, box_rows, box_cols)


def _tensor_map(ptr: int, code: int, rows: int, cols: int, ld: int, box_rows: int, box_cols: int) -> bytes:
    key = (ptr, code, rows, cols, ld, box_rows, box_cols)
    hit = _tmap_cache.get(key)
    if hit is not None:
        return hit
    from cuda.bindings import driver as drv

    itemsize = 2  # both tensor-map dtypes rawflux uses are 16-bit
    err, tm = drv.cuTensorMapEncodeTiled(
        drv.CUtensorMapDataType(code),
        2,
        int(ptr),
        [drv.cuuint64_t(int(cols)), drv.cuuint64_t(int(rows))],
        [drv.cuuint64_t(int(ld) * itemsize)],
        [drv.cuuint32_t(int(box_cols)), drv.cuuint32_t(int(box_rows))],
        [drv.cuuint32_t(1), drv.cuuint32_t(1)],
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(
            f"cuTensorMapEncodeTiled failed ({err.name}) for a {rows}x{cols} matrix (dtype code {code}) at {ptr:#x}, "
            f"pitch {ld}, box {box_rows}x{box_cols}"
        )
    raw = ctypes.string_at(int(tm.getPtr()), 128)
    with _tmap_lock:
        if len(_tmap_cache) >= _TMAP_CACHE_MAX:
            _tmap_cache.clear()
        _tmap_cache[key] = raw
    return raw


# ------------------------------------------------------------------------------------------------
# launching: a lean path (cached launch configs, one preallocated argument block per thread)


class _ArgBlock(threading.local):
    """kernelParams for gemm_kernel: 6 slots (tmap_a, tmap_b, GemmParams, prologue and epilogue
    params, tmap_a_tail), each 64-byte aligned (CUtensorMap needs 64)."""

    OFFSETS = (0, 128, 256, 384, 640, 896)
    SIZES = (128, 128, 128, 256, 256, 128)

    def __init__(self):
        self.buf = ctypes.create_string_buffer(1024 + 64)
        base = (ctypes.addressof(self.buf) + 63) & ~63
        self.addrs = [base + o for o in self.OFFSETS]
        self.ptrs = (ctypes.c_void_p * 6)(*self.addrs)
        self.ptrs_addr = ctypes.addressof(self.ptrs)


_args = _ArgBlock()
_launch_cfgs: dict[tuple, object] = {}


def _launch(kernel, grid: int, threads: int, cluster: int, smem: int, stream: int, args: tuple[bytes, ...],
            pdl: bool = False) -> None:
    """``pdl``: launch as the programmatic dependent of the previous kernel in ``stream`` (it may
    start once every CTA of that kernel has run griddepcontrol.launch_dependents)."""
    from cuda.bindings import driver as drv

    key = (kernel.handle, grid, threads, cluster, smem, stream, pdl)
    cfg = _launch_cfgs.get(key)
    if cfg is None:
        kernel.set_max_dynamic_smem(smem)
        cfg = drv.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
        cfg.sharedMemBytes = smem
        cfg.hStream = drv.CUstream(stream)
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
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        if len(_launch_cfgs) > 1024:
            _launch_cfgs.clear()
        _launch_cfgs[key] = (cfg, drv.CUfunction(kernel.handle))
        cfg = _launch_cfgs[key]
    a = _args
    for addr, size, raw in zip(a.addrs, _ArgBlock.SIZES, args):
        if len(raw) > size:
            raise ValueError(f"kernel argument of {len(raw)} bytes exceeds its {size}-byte slot")
        ctypes.memmove(addr, raw, len(raw))
    (err,) = drv.cuLaunchKernelEx(cfg[0], cfg[1], a.ptrs_addr, 0)
    if err != drv.CUresult.CUDA_SUCCESS:
        _, msg = drv.cuGetErrorString(err)
        raise RuntimeError(f"launch of {kernel.symbol} failed: {err.name}: {msg.decode() if msg else ''}")


# ------------------------------------------------------------------------------------------------
# split-K workspace: per (device, stream), grown on demand; counters start at zero and every
# launch leaves them at zero (the last split of a tile resets its counter).


_ws_lock = threading.Lock()
_workspaces: dict[tuple[int, int], tuple] = {}


def _workspace(device_id: int, stream: int, ws_bytes: int, n_counters: int) -> tuple[int, int]:
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
            # The old buffers may still be in use by queued launches on this stream: keep them alive
            # until the stream has passed this point.
            import cupy

            with use_stream(stream, device_id):
                cupy.cuda.get_current_stream().synchronize()
        _workspaces[key] = entry
        return entry[2], entry[3]


# ------------------------------------------------------------------------------------------------
# the low-level entry the fused ops use


@dataclass(frozen=True)
class GemmShape:
    m: int
    n: int
    k: int
    dtype: DType
    b_layout: str
    out_dtype: DType


def _check_arch(device_id: int) -> tune.DeviceInfo:
    info = tune.device_info(device_id)
    if info.cc != (9, 0):
        raise RuntimeError(
            f"rawflux.gemm needs sm_90 (Hopper: H100 / H200 / GH200); device {device_id} ({info.name}) is "
            f"sm_{info.cc[0]}{info.cc[1]}, and rawflux has no portable (mma.sync) path yet"
        )
    return info


def gemm_params(cfg: GemmConfig, m: int, n: int, k: int, *, seg_count: int = 1, seg_start: int = 0, workspace: int = 0,
                counters: int = 0, timeout_ns: int | None = None, sms: int = 0) -> bytes:
    """GemmParams for one launch; `sms` (the device's SM count) sizes a stream-K plan, whose runs
    depend on the grid (grid_size with the same sms)."""
    t = cfg.tile
    kb, per, splits = tune.split_plan(k, cfg.splits)
    if t.cluster_k > 1:  # the k halves of a k-split cluster: split where split-K k2 splits
        _, per, _ = tune.split_plan(k, t.cluster_k)
    sk_tiles = tail = narrow_from = 0
    tiles_n = -(-n // t.bn)
    if cfg.narrow:
        if sms < 1:
            raise ValueError(f"config {cfg.tag()}: a narrow-column plan needs the device's SM count (sms=)")
        npl = tune.narrow_plan(m, n, cfg, sms)
        if npl is None:
            raise ValueError(f"config {cfg.tag()}: no narrow-column plan of width {cfg.narrow} for m = {m}, n = {n} beats the "
                             f"data-parallel grid")
        tiles_n, narrow_from = npl.columns, npl.narrow_from
    if cfg.stream_k:
        if sms < 1:
            raise ValueError(f"config {cfg.tag()}: a stream-K plan needs the device's SM count (sms=)")
        sp = tune.sk_plan(m, n, k, cfg, sms)
        kb, per, splits, sk_tiles, tail = sp.k_blocks, sp.k_blocks, sp.max_pieces, sp.sk_tiles, sp.tail or -sp.band
    if timeout_ns is None:
        timeout_ns = int(env.wait_timeout_s() * 1e9)
    return GEMM_PARAMS.pack(
        m, n, k, -(-m // t.bm), tiles_n, kb, splits, per, max(1, cfg.group), int(cfg.raster_n),
        max(1, seg_count), seg_start, sk_tiles, a_box_rows(t, m), a_tail_rows(t, m), tail, narrow_from, 0, workspace, counters,
        timeout_ns,
    )


# Rows of A's TMA box and of its tail box (GemmParams::a_box_rows / a_tail_rows; the rules live in
# tune, whose time model charges them). Module attributes, looked up at each plan: tests swap them
# for the full box.
a_box_rows = tune.a_box_rows
a_tail_rows = tune.a_tail_rows


def grid_size(cfg: GemmConfig, m: int, n: int, k: int, sms: int) -> int:
    """Persistent CTAs: at most one per SM (or cfg.ctas), never more than there are units, a
    multiple of the cluster size."""
    t = cfg.tile
    if cfg.stream_k:
        return tune.sk_plan(m, n, k, cfg, sms).clusters * t.cluster_size
    _, _, splits = tune.split_plan(k, cfg.splits)
    ctiles = tune.cluster_tiles(m, n, t)
    if cfg.narrow:  # the plan's columns, more than n / bn (gemm_params refuses a config without a plan)
        npl = tune.narrow_plan(m, n, cfg, sms)
        if npl is not None:
            ctiles = tune.cluster_tiles(m, 1, t) * npl.columns
    ctas = min(cfg.ctas or sms, sms)
    clusters = max(1, min(ctas // t.cluster_size, ctiles * splits))
    return clusters * t.cluster_size


@dataclass
class _Plan:
    kernel: object
    grid: int
    threads: int
    cluster: int
    smem: int
    params: bytes
    box_a: tuple[int, int]
    box_b: tuple[int, int]
    a_tail: int  # rows of A's tail box (a_tail_rows); 0: the kernel's tmap_a_tail is tmap_a
    mnk: tuple[int, int, int]
    b_layout: str
    tmap_code: int


_plans: dict[tuple, _Plan] = {}
_plans_lock = threading.Lock()


def _plan(cfg: GemmConfig, m, n, k, dtype, b_layout, out_dtype, stream, device_id, relpath, sched, prologue, epilogue,
          seg_count, seg_start) -> _Plan:
    key = (cfg, m, n, k, dtype, b_layout, out_dtype, stream, device_id, relpath, sched, prologue, epilogue, seg_count, seg_start)
    hit = _plans.get(key)
    if hit is not None:
        return hit
    t = cfg.tile
    if sched != PLAIN_SCHED and (cfg.splits > 1 or cfg.stream_k):
        raise ValueError(f"{sched} does not split k: config {cfg.tag()} needs splits = 1 and no stream-K")
    if cfg.tail and (not cfg.stream_k or cfg.tail < 2):
        raise ValueError(f"config {cfg.tag()}: a split tail is a stream-K mode (stream_k=True) of at least 2 pieces")
    if cfg.tail and _dyn_order(t):
        raise ValueError(f"config {cfg.tag()}: the RAWFLUX_DYN_SCHED build has no split tail")
    if cfg.band and (not cfg.stream_k or cfg.band < 2 or cfg.tail):
        raise ValueError(f"config {cfg.tag()}: banded stream-K is a stream-K mode (stream_k=True, no tail) with bands of at "
                         f"least 2 clusters")
    if cfg.band and _dyn_order(t):
        raise ValueError(f"config {cfg.tag()}: the RAWFLUX_DYN_SCHED build has no banded stream-K")
    if cfg.narrow and (sched != PLAIN_SCHED or cfg.stream_k or cfg.splits != 1 or t not in tune.NARROW_TILES or b_layout != "nk"
                       or out_dtype == DType.F32 or epilogue != "rawflux::TmaStore" or _dyn_order(t)):
        raise ValueError(f"config {cfg.tag()}: narrow columns are for the plain GEMM on "
                         f"{', '.join(x.tag() for x in tune.NARROW_TILES)}, data-parallel (splits = 1, no stream-K), "
                         f"B as (n, k) and a 16-bit output")
    if cfg.stream_k and (cfg.splits != 1 or not t.stream_k_ok):
        raise ValueError(f"config {cfg.tag()}: stream-K takes splits = 1 and a tile with at most 256 columns per "
                         f"consumer warpgroup (tile {t.tag()} has {t.wn})")
    info = _check_arch(device_id)
    if t.cluster_k > 1:
        tiles = -(-m // t.bm) * -(-n // t.bn)
        ctas = min(cfg.ctas or info.sms, info.sms)
        if cfg.splits != 1 or cfg.stream_k:
            raise ValueError(f"config {cfg.tag()}: a k-split cluster splits k itself: use splits = 1 and no stream-K")
        if tune.split_plan(k, 2)[2] < 2:
            raise ValueError(f"config {cfg.tag()}: a k-split cluster needs at least 2 k blocks of {tune.BK} (k = {k})")
        if 2 * tiles > ctas:
            raise ValueError(f"config {cfg.tag()}: a k-split cluster takes one tile: {tiles} tiles need {2 * tiles} CTAs, "
                             f"the grid has {ctas}")
    ws = ctr = 0
    _, _, splits = tune.split_plan(k, cfg.splits)
    slots = -(-m // t.bm) * -(-n // t.bn)  # split-K: one fix-up slot per CTA tile
    if cfg.stream_k:
        sp = tune.sk_plan(m, n, k, cfg, info.sms)
        splits, slots = sp.max_pieces, sp.sk_tiles * t.cluster_size  # stream-K: per CTA tile of the stream-K tiles
    if splits > 1:
        # two counts per (slot, consumer warpgroup): arrived and stored (splitk_fixup)
        ws, ctr = _workspace(device_id, stream, slots * splits * t.bm * t.bn * 4, 2 * slots * t.consumers)
    elif sched == PLAIN_SCHED and not cfg.stream_k and _dyn_order(t):
        # RAWFLUX_DYN_SCHED (development): the ticket counter and the done count, zero between launches
        _, ctr = _workspace(device_id, stream, 0, 2)
    params = gemm_params(cfg, m, n, k, seg_count=seg_count, seg_start=seg_start, workspace=ws, counters=ctr, sms=info.sms)
    name = kernel_name(t, dtype, out_dtype, b_layout, sched=narrow_sched(cfg.narrow) if cfg.narrow else sched, prologue=prologue,
                       epilogue=epilogue)
    kern = get_kernel(relpath, name, device_id=device_id, arch="sm_90a")
    box_b = (t.bn // t.cluster_m, tune.BK) if b_layout == "nk" else (tune.BK // t.cluster_m, 64)
    smem = launch_smem_bytes(t, epilogue, out_dtype)
    plan = _Plan(kern, grid_size(cfg, m, n, k, info.sms), t.threads, t.cluster_size, smem, params,
                 (a_box_rows(t, m), tune.BK), box_b, a_tail_rows(t, m), (m, n, k), b_layout, _TMAP_CODE[dtype])
    with _plans_lock:
        if len(_plans) > 4096:
            _plans.clear()
        _plans[key] = plan
    return plan


def launch_gemm(cfg: GemmConfig, *, a_ptr: int, b_ptr: int, m: int, n: int, k: int, dtype: DType, b_layout: str,
                out_dtype: DType, epilogue_params: bytes, stream: int, device_id: int, lda: int | None = None,
                ldb: int | None = None, relpath: str = "gemm.cu", sched: str = FUSED_SCHED,
                prologue: str = "rawflux::NoWait", prologue_params: bytes = NOWAIT_PARAMS,
                epilogue: str = "rawflux::LocalStore", seg_count: int = 1, seg_start: int = 0) -> None:
    """Launch one gemm_kernel instantiation on raw pointers. A: (m, k) row-major, pitch lda; B: (n, k)
    ("nk") or (k, n) ("kn") row-major, pitch ldb. The caller has checked shapes, alignment (16-byte
    pointers and pitches) and n, k multiples of 8. Split-K (cfg.splits > 1) and stream-K need the
    plain GEMM's scheduler (sched=PLAIN_SCHED) and an epilogue that only stores: the fused ops
    pass splits = 1. Launch-config, params and tensor maps
    are cached, so a repeated call costs a few dictionary look-ups and the driver call."""
    p = _plan(cfg, m, n, k, dtype, b_layout, out_dtype, stream, device_id, relpath, sched, prologue, epilogue, seg_count, seg_start)
    _launch_plan(p, a_ptr, b_ptr, k if lda is None else lda, ldb, stream, prologue_params, epilogue_params)


def _launch_plan(p: "_Plan", a_ptr: int, b_ptr: int, lda: int, ldb: int | None, stream: int, prologue_params: bytes,
                 epilogue_params: bytes) -> None:
    m, n, k = p.mnk
    tmap_a = _tensor_map(a_ptr, p.tmap_code, m, k, lda, p.box_a[0], p.box_a[1])
    tmap_a_tail = _tensor_map(a_ptr, p.tmap_code, m, k, lda, p.a_tail, p.box_a[1]) if p.a_tail else tmap_a
    if p.b_layout == "nk":
        tmap_b = _tensor_map(b_ptr, p.tmap_code, n, k, k if ldb is None else ldb, p.box_b[0], p.box_b[1])
    else:
        tmap_b = _tensor_map(b_ptr, p.tmap_code, k, n, n if ldb is None else ldb, p.box_b[0], p.box_b[1])
    _launch(p.kernel, p.grid, p.threads, p.cluster, p.smem, stream,
            (tmap_a, tmap_b, p.params, prologue_params, epilogue_params, tmap_a_tail))


# ------------------------------------------------------------------------------------------------
# configuration choice


_pick_cache: dict[tuple, GemmConfig] = {}


def pick_config(m: int, n: int, k: int, dtype: DType, b_layout: str, out_dtype: DType, device_id: int,
                timer=None) -> GemmConfig:
    """Tuned result if one is stored (RAWFLUX_TUNE=cached|on), else the heuristic; with
    RAWFLUX_TUNE=on and a `timer(cfg) -> us`, unseen problems are tuned and stored."""
    mode = env.tune_mode()
    key = (m, n, k, dtype, b_layout, out_dtype, device_id, mode)
    hit = _pick_cache.get(key)
    if hit is not None:
        return hit
    info = tune.device_info(device_id)
    tkey = tune.tune_key(m, n, k, dtype.tag, b_layout, out_dtype.tag, info)
    cfg = tune.lookup(tkey)
    if cfg is None and mode == "on" and timer is not None:
        cfg, us = tune.tune(m, n, k, b_layout, info, timer, out_bytes=out_dtype.itemsize)
        tune.store(tkey, cfg, us)
    if cfg is None:
        cfg = tune.heuristic(m, n, k, b_layout, info, out_dtype.itemsize)
    _pick_cache[key] = cfg
    return cfg


def _timer(launch_with, stream: int, device_id: int):
    def time_us(cfg: GemmConfig) -> float:
        import cupy

        from ..runtime import cupy_stream

        with cupy.cuda.Device(device_id):
            s = cupy_stream(stream)
            for _ in range(2):
                launch_with(cfg)
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            reps = 10
            start.record(s)
            for _ in range(reps):
                launch_with(cfg)
            stop.record(s)
            stop.synchronize()
            return cupy.cuda.get_elapsed_time(start, stop) * 1000.0 / reps

    return time_us


# ------------------------------------------------------------------------------------------------
# the array-level op


# ------------------------------------------------------------------------------------------------
# fast path: a call whose metadata (types, shapes, strides, dtypes, devices, options: no pointers)
# matches an earlier fully validated call reuses that validation and launch plan; only what
# depends on the pointers (alignment, overlap with the output, tensor maps) is redone.


@dataclass
class _Fast:
    plan: _Plan
    lda: int
    ldb: int
    ldc: int
    out_shape: tuple[int, int]
    out_dtype: object  # the framework's dtype for a new output
    plan_out_dtype: DType  # the same as rawflux's DType (C's tensor map)
    bias_kind: int
    epilogue: str  # the plan's epilogue policy (its params are rebuilt per output pointer)
    spans: tuple[int, int, int, int]  # bytes covered by a, b, out, bias
    stream: int  # the plan's split-K workspace belongs to this stream


_fast: dict[tuple, _Fast] = {}
_FAST_MAX = 1024


def _meta_torch(x):
    return (x.shape, x.stride(), x.dtype, x.get_device())


def _meta_cupy(x):
    return (x.shape, x.strides, x.dtype, x.device.id)


def _fw(x):
    mod = type(x).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("cupy"):
        return "cupy"
    return None


def _fast_key(fw, a, b, bias, out, b_layout, out_dtype, config):
    meta = _meta_torch if fw == "torch" else _meta_cupy
    return (fw, b_layout, out_dtype, config, meta(a), meta(b), None if bias is None else meta(bias),
            None if out is None else meta(out))


def _span(t) -> int:
    rows, cols = (t.shape if len(t.shape) == 2 else (1, t.shape[0]))
    ld = t.strides[0] if len(t.shape) == 2 else cols
    return ((rows - 1) * ld + cols) * t.itemsize if rows and cols else 0


def _fast_call(fw, f: _Fast, a, b, bias, out):
    if fw == "torch":
        import torch

        stream = torch.cuda.current_stream(a.get_device()).cuda_stream
        if stream != f.stream:
            return None  # another stream: the validated path makes a plan (and workspace) for it
        pa, pb = a.data_ptr(), b.data_ptr()
        pbias = bias.data_ptr() if bias is not None else 0
        if out is None:
            out = torch.empty(f.out_shape, dtype=f.out_dtype, device=a.device)
        pc = out.data_ptr()
    else:
        import cupy

        stream = cupy.cuda.get_current_stream(a.device.id).ptr
        if stream != f.stream:
            return None
        pa, pb = a.data.ptr, b.data.ptr
        pbias = bias.data.ptr if bias is not None else 0
        if out is None:
            with a.device:
                out = cupy.empty(f.out_shape, dtype=f.out_dtype)
        pc = out.data.ptr
    if (pa | pb | pc) & 15 or pbias & 3:
        return None  # a misaligned pointer: the validated path says which
    sa, sb, sc, sbias = f.spans
    c1 = pc + sc
    if (pc < pa + sa and pa < c1) or (pc < pb + sb and pb < c1) or (pbias and pc < pbias + sbias and pbias < c1):
        return None  # out overlaps an input: the validated path raises
    m, n = f.out_shape
    epi = epilogue_params(f.epilogue, pc, m, n, f.ldc, f.plan_out_dtype, pbias, f.bias_kind)
    _launch_plan(f.plan, pa, pb, f.lda, f.ldb, stream, NOWAIT_PARAMS, epi)
    return out


def gemm(a, b, *, b_layout: str = "nk", bias=None, out=None, out_dtype=None, stream=None, config: GemmConfig | None = None):
    """C = a @ b^T (b_layout "nk": b is (n, k), a linear layer's weight) or a @ b ("kn": b is (k, n)).

    a: (m, k) bf16 or f16, row-major rows (row pitch a multiple of 8 elements); b: same dtype;
    n and k multiples of 8, any m >= 1. bias: (n,) of a's dtype or float32, added in fp32.
    out / out_dtype: a's dtype (default) or float32. Returns the output in the caller's framework
    (``out`` itself when given). Runs on ``stream`` (else torch's current stream for torch inputs,
    else CuPy's). Every check happens before the launch.
    """
    fw = _fw(a) if stream is None else None
    key = None
    if fw is not None and _fw(b) == fw and (out is None or _fw(out) == fw) and (bias is None or _fw(bias) == fw):
        try:
            key = _fast_key(fw, a, b, bias, out, b_layout, out_dtype, config)
            hit = _fast.get(key)
        except (AttributeError, TypeError):  # not a plain array after all (or unhashable options)
            key = hit = None
        if hit is not None:
            got = _fast_call(fw, hit, a, b, bias, out)
            if got is not None:
                return got
    res, entry = _gemm_checked(a, b, b_layout=b_layout, bias=bias, out=out, out_dtype=out_dtype, stream=stream, config=config)
    if key is not None and entry is not None:
        if len(_fast) >= _FAST_MAX:
            _fast.clear()
        _fast[key] = entry
    return res


def _gemm_checked(a, b, *, b_layout, bias, out, out_dtype, stream, config):
    """The validated path: every check, then the launch. Returns (result, fast-path entry)."""
    if b_layout not in _LAYOUT_CODE:
        raise ValueError(f"b_layout must be 'nk' (b is (n, k)) or 'kn' (b is (k, n)), not {b_layout!r}")
    s = resolve_stream(stream, (a, b))
    # Pitch alignment is checked below, after the shape checks, so a bad k or n gets its own message.
    ta = check_matrix(as_tensor(a, "a", stream=s), "a", dtypes=(DType.BF16, DType.F16), device=None, ld_ok=True, pitch_align=1)
    dev = ta.device
    tb = check_matrix(as_tensor(b, "b", stream=s), "b", dtypes=(ta.dtype,), device=dev, ld_ok=True, pitch_align=1)
    m, k = ta.shape
    if b_layout == "nk":
        n, kb = tb.shape
        bdesc = "(n, k)"
    else:
        kb, n = tb.shape
        bdesc = "(k, n)"
    if kb != k:
        raise ValueError(f"a is (m, k) = {tuple(ta.shape)} but b ({b_layout!r} layout, {bdesc}) is {tuple(tb.shape)}: k differs ({k} vs {kb})")
    if k < 8 or k % 8:
        raise ValueError(f"k = {k} must be a positive multiple of 8 (16-byte rows for the TMA loads)")
    if n < 8 or n % 8:
        raise ValueError(f"n = {n} must be a positive multiple of 8 (16-byte rows for the TMA loads and stores)")
    for name, t in (("a", ta), ("b", tb)):
        if t.shape[0] > 1 and t.strides[0] % 8:
            raise ValueError(f"{name}'s row pitch {t.strides[0]} elements is not a multiple of 8 (rows must start 16-byte aligned)")
    if out is not None:
        out = as_tensor(out, "out", stream=s)  # once: prepare_output takes the Tensor as it is
    od = (out.dtype if out is not None else ta.dtype) if out_dtype is None else DType.from_any(out_dtype)
    if od not in out_dtypes_for(ta.dtype):
        raise TypeError(f"out dtype {od} is not supported for {ta.dtype} inputs: use {ta.dtype} or f32")
    tbias, bias_ptr, bias_kind = bias_args(bias, n, ta.dtype, dev, s, like="a", device_owner="a")
    inputs = {"a": ta, "b": tb} if tbias is None else {"a": ta, "b": tb, "bias": tbias}
    tc, _ = prepare_output(out, "out", (m, n), od, ta, stream=s, inputs=inputs)
    if m == 0:
        return wrap_output(ta, tc, stream=s), None
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"config must be a rawflux.tune.GemmConfig, got {type(config).__name__}")
    if config is not None and ((config.tile not in tune.TILES and config.tile not in tune.KSPLIT_TILES)
                               or not config.tile.supports(b_layout)):
        raise ValueError(f"config tile {config.tile.tag()} is not a compiled variant for layout {b_layout!r}")
    _check_arch(dev)
    lda, ldb = ta.strides[0] if m > 1 else k, tb.strides[0] if tb.shape[0] > 1 else tb.shape[1]
    ldc = tc.strides[0] if m > 1 else n
    epilogue = plain_epilogue(od)
    epi = epilogue_params(epilogue, tc.ptr, m, n, ldc, od, bias_ptr, bias_kind)

    def launch_with(cfg: GemmConfig) -> None:
        launch_gemm(cfg, a_ptr=ta.ptr, b_ptr=tb.ptr, m=m, n=n, k=k, dtype=ta.dtype, b_layout=b_layout, out_dtype=od,
                    epilogue_params=epi, stream=s, device_id=dev, lda=lda, ldb=ldb, sched=PLAIN_SCHED, epilogue=epilogue)

    cfg = config or pick_config(m, n, k, ta.dtype, b_layout, od, dev, timer=_timer(launch_with, s, dev))
    launch_with(cfg)
    res = wrap_output(ta, tc, stream=s)
    entry = None
    if ta.framework == tb.framework == tc.framework and ta.framework in ("torch", "cupy") and tc.wrap_to is None:
        plan = _plan(cfg, m, n, k, ta.dtype, b_layout, od, s, dev, "gemm.cu", PLAIN_SCHED, "rawflux::NoWait",
                     epilogue, 1, 0)
        if ta.framework == "torch":
            import torch

            new_dtype = getattr(torch, od.torch_name)
        else:
            new_dtype = od.np
        entry = _Fast(plan, lda, ldb, ldc, (m, n), new_dtype, od, bias_kind, epilogue,
                      (_span(ta), _span(tb), _span(tc), _span(tbias) if tbias is not None else 0), s)
    return res, entry
