"""What the host and the CUDA engine must agree on: type codes, the byte layout of the kernel
parameters, the policy names, and the name expression of each gemm_kernel variant with its
pipeline options (GemmCfg in cuda_src/rawflux/gemm/config.cuh). tests/cpu check every layout
against the C++ structs and every option rule against the kernel's static_asserts.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from .. import tune
from ..jit import register
from ..runtime import DType, as_tensor
from ..tune import TileConfig

TYPE_CODE = {DType.BF16: 0, DType.F16: 1, DType.F32: 2}
LAYOUT_CODE = {"nk": 0, "kn": 1}
TMAP_CODE = {DType.BF16: 9, DType.F16: 6}  # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, CU_TENSOR_MAP_DATA_TYPE_FLOAT16

# struct GemmParams (gemm/config.cuh), same field order.
GEMM_PARAMS = struct.Struct("<18i2Qq")
# struct LocalStore::Params (gemm/epilogue/local_store.cuh): c, bias, ldc, bias_kind, pad.
LOCAL_STORE = struct.Struct("<QQqii")
# struct TmaStore::Params (gemm/epilogue/tma_store.cuh) after its 128-byte map: c, ldc, bias, bias_kind, pad.
TMA_STORE_TAIL = struct.Struct("<QqQii")
NOWAIT_PARAMS = struct.pack("<i", 0)
BIAS_NONE, BIAS_IN16, BIAS_F32 = 0, 1, 2

# Policies (gemm_kernel's template arguments).
PLAIN_SCHED = "rawflux::StreamKSched"  # the plain GEMM's: data-parallel, split-K and the stream-K plans
FUSED_SCHED = "rawflux::TileSched"  # GEMM-RS's and GEMM + AllReduce's: data-parallel (their epilogue hooks run per whole tile)
NARROW_SCHED_PREFIX = "rawflux::NarrowSched<"
NOWAIT = "rawflux::NoWait"
LOCAL_STORE_EPI = "rawflux::LocalStore"
TMA_STORE_EPI = "rawflux::TmaStore"

# Prologues whose wait orders only the producer's own loads: no consumer refill under them.
_NO_REFILL_PROLOGUES = frozenset({"rawflux::AgWait"})
RS_EPILOGUE_PREFIX = "rawflux::RsEpilogue<"  # GEMM-ReduceScatter's (fused/rs_epilogue.cuh), one per partial type
AR_EPILOGUE_PREFIX = "rawflux::ArEpilogue<"  # GEMM + AllReduce's (fused/ar_epilogue.cuh), one per partial type


@dataclass(frozen=True)
class EpilogueTraits:
    """What the host's option rules need to know of an epilogue policy."""

    staged: bool  # stages 16-bit C in TmaStore's 64 x 64 boxes (Cfg::kStoreBufs)
    deferrable: bool  # Epilogue::kDeferrable: boxes may be held for the next tile (Cfg::kDeferBoxes)
    refill_ok: bool  # no blocks of its own through the ring, so the consumers may refill it
    state_bytes: int  # shared state past the staging buffers (RsEpilogue::kStateBytes)


def epilogue_traits(epilogue: str) -> EpilogueTraits:
    if epilogue == TMA_STORE_EPI:
        return EpilogueTraits(staged=True, deferrable=True, refill_ok=True, state_bytes=0)
    if epilogue.startswith(RS_EPILOGUE_PREFIX):
        return EpilogueTraits(staged=True, deferrable=False, refill_ok=False, state_bytes=160)
    if epilogue.startswith(AR_EPILOGUE_PREFIX):
        return EpilogueTraits(staged=True, deferrable=False, refill_ok=True, state_bytes=64)
    return EpilogueTraits(staged=False, deferrable=False, refill_ok=True, state_bytes=0)


SMEM_PER_CTA = tune.SMEM_PER_CTA
_BOX_BYTES = 64 * 128  # TmaStore's staging box: 64 rows x 64 16-bit columns


def narrow_sched(width: int) -> str:
    """The plain GEMM's scheduler with narrow columns `width` wide (Decomp narrow)."""
    return f"{NARROW_SCHED_PREFIX}{width}>"


def plain_epilogue(out_dtype: DType) -> str:
    """The plain GEMM's epilogue: 16-bit C through shared memory and TMA stores (TmaStore), f32 C
    from registers (LocalStore)."""
    return LOCAL_STORE_EPI if out_dtype == DType.F32 else TMA_STORE_EPI


@dataclass(frozen=True)
class KernelOptions:
    """The pipeline choices of one variant, GemmCfg's kRefill / kDeferBoxes / kStoreBufs."""

    refill: bool  # the consumers refill the stage ring (no producer waits on the releases)
    defer_boxes: int  # TmaStore boxes held in registers for the next tile's first k block
    store_bufs: int  # TmaStore's staging buffers per consumer warpgroup (0: C from registers)

    def tag(self) -> str:
        return f"r{int(self.refill)}d{self.defer_boxes}s{self.store_bufs}"


def scratch_offset(tile: TileConfig) -> int:
    """kScratchOffset<Cfg> (gemm/config.cuh): where an epilogue's shared scratch starts."""
    return tile.stages * (tile.bm + tile.bn) * tune.BK * 2 + 1024


def kernel_options(tile: TileConfig, prologue: str, epilogue: str, out_dtype: DType, *, narrow: bool = False) -> KernelOptions:
    """The options the engine compiles each variant with (measured on the H200, docs/decisions.md):
    - refill for the wide tiles (a k block of at least 128 x 224, whose tensor time covers the
      refill's one-block delay), without multicast or in the 2x1 pair, under a prologue that allows it
      and not under GEMM-RS's epilogue (its producer loads extra blocks);
    - staging buffers: as many 64 x 64 boxes per warpgroup as the shared memory past the ring
      holds, at most 2 and at most a fragment's;
    - one deferred box where ptxas has room beside the accumulators: at most 128 of them, 128 only
      in a 2-CTA cluster, not with a k-split cluster, and not beside the refill at 128 (the two
      together spill), and not with narrow columns (``narrow``: their wgmma groups are waited for in
      their own branch)."""
    wide = tile.bm * tile.bn >= 128 * 224
    pair_or_none = tile.cluster_m * tile.cluster_n == 1 or (tile.cluster_m, tile.cluster_n) == (2, 1)
    ep = epilogue_traits(epilogue)
    refill = wide and pair_or_none and prologue not in _NO_REFILL_PROLOGUES and ep.refill_ok
    bufs = 0
    if ep.staged and out_dtype != DType.F32 and tile.wn % 64 == 0:
        room = (SMEM_PER_CTA - 1024 - scratch_offset(tile) - ep.state_bytes) // (_BOX_BYTES * tile.consumers)
        bufs = max(0, min(room, tile.wn // 64, 2))
        while bufs and (tile.wn // 64) % bufs:
            bufs -= 1
    acc = tile.wn // 2
    defer = 0
    if (bufs and ep.deferrable and acc <= 128 and tile.cluster_k == 1 and not narrow
            and not (acc == 128 and (tile.cluster_size != 2 or refill))):
        defer = 1
    return KernelOptions(refill, defer, bufs)


def check_options(opts: KernelOptions, tile: TileConfig, prologue: str, epilogue: str, out_dtype: DType, *, narrow: bool = False) -> None:
    """Raises ValueError where GemmCfg's static_asserts would reject `opts` (before any compile)."""
    where = f"tile {tile.tag()} with {prologue} / {epilogue}"
    ep = epilogue_traits(epilogue)
    if opts.refill and not ep.refill_ok:
        raise ValueError(f"{where}: the epilogue's producer loads blocks of its own into the ring: no consumer refill")
    if opts.refill and (prologue in _NO_REFILL_PROLOGUES or not (tile.cluster_m * tile.cluster_n == 1
                                                                 or (tile.cluster_m, tile.cluster_n) == (2, 1))):
        raise ValueError(f"{where}: the consumer refill needs a prologue that allows it and no multicast but the 2x1 pair")
    if opts.store_bufs:
        if not ep.staged or out_dtype == DType.F32 or tile.wn % 64 or (tile.wn // 64) % opts.store_bufs:
            raise ValueError(f"{where}: staging buffers are TmaStore's, for 16-bit C in whole rounds of 64-column boxes")
        if opts.store_bufs * _BOX_BYTES * tile.consumers + ep.state_bytes > SMEM_PER_CTA - 1024 - scratch_offset(tile):
            raise ValueError(f"{where}: {opts.store_bufs} staging buffers do not fit beside the stage ring")
    if opts.defer_boxes and (not ep.deferrable or not opts.store_bufs or opts.defer_boxes > tile.wn // 64
                             or tile.cluster_k > 1):
        raise ValueError(f"{where}: deferred boxes are staged boxes of the fragment, not in a k-split cluster")
    if opts.defer_boxes and narrow:
        raise ValueError(f"{where}: narrow columns wait for each wgmma group in their own branch: no deferred box")


def kernel_name(tile: TileConfig, dtype: DType, out_dtype: DType, b_layout: str, *, sched: str = FUSED_SCHED,
                prologue: str = NOWAIT, epilogue: str = LOCAL_STORE_EPI, options: KernelOptions | None = None) -> str:
    """The NVRTC name expression of one gemm_kernel instantiation (options: kernel_options's)."""
    o = options or kernel_options(tile, prologue, epilogue, out_dtype, narrow=sched.startswith(NARROW_SCHED_PREFIX))
    cfg = (f"rawflux::GemmCfg<{tile.bm},{tile.bn},{tune.BK},{tile.stages},{tile.cluster_m},{tile.cluster_n},{tile.consumers},"
           f"{TYPE_CODE[dtype]},{TYPE_CODE[out_dtype]},{LAYOUT_CODE[b_layout]},{tile.cluster_k},{int(o.refill)},{o.defer_boxes},"
           f"{o.store_bufs}>")
    return f"rawflux::gemm_kernel<{cfg}, {sched}, {prologue}, {epilogue}>"


def epilogue_scratch_bytes(tile: TileConfig, epilogue: str, out_dtype: DType, options: KernelOptions | None = None) -> int:
    """Shared memory the epilogue asks for (Epilogue::scratch_bytes<Cfg>(): TmaStore's staging)."""
    ep = epilogue_traits(epilogue)
    if not ep.staged:
        return 0
    o = options or kernel_options(tile, NOWAIT, epilogue, out_dtype)
    return o.store_bufs * _BOX_BYTES * tile.consumers + ep.state_bytes


def launch_smem_bytes(tile: TileConfig, epilogue: str, out_dtype: DType, options: KernelOptions | None = None) -> int:
    """Dynamic shared memory of a launch: the tile's, or with scratch the ring and barriers up to
    the scratch offset, the scratch and the alignment slack."""
    scratch = epilogue_scratch_bytes(tile, epilogue, out_dtype, options)
    return 1024 + scratch_offset(tile) + scratch if scratch else tile.smem_bytes


def out_dtypes_for(dtype: DType) -> tuple[DType, ...]:
    return (dtype, DType.F32)


def register_variants(relpath: str = "gemm.cu", *, sched: str = FUSED_SCHED, prologue: str = NOWAIT, epilogue=LOCAL_STORE_EPI,
                      tiles=None, dtypes=(DType.BF16, DType.F16), layouts=("nk", "kn"), out_dtypes=None) -> None:
    """Register every variant a heuristic or tuner can launch, so ``python -m rawflux.check_kernels``
    compiles them all on the CPU (sm_90a only: there is no sm_80 path). ``epilogue``: a policy
    name, or a function of the output dtype giving one."""
    for dt in dtypes:
        for layout in layouts:
            for t in tiles or tune.tiles_for(layout):
                if not t.supports(layout):
                    continue
                for od in out_dtypes or out_dtypes_for(dt):
                    epi = epilogue(od) if callable(epilogue) else epilogue
                    register(relpath, kernel_name(t, dt, od, layout, sched=sched, prologue=prologue, epilogue=epi), archs=("sm_90a",))


def local_store_params(c_ptr: int, ldc: int, bias_ptr: int = 0, bias_kind: int = BIAS_NONE) -> bytes:
    return LOCAL_STORE.pack(int(c_ptr), int(bias_ptr), int(ldc), int(bias_kind), 0)


def bias_args(bias, n: int, dt: DType, dev: int, stream: int, *, like: str = "a", device_owner: str = "the group",
              align: int = 4, op: str = ""):
    """(Tensor or None, pointer, bias kind) of an optional (n,) bias in the inputs' dtype or f32,
    checked before any launch. The engine's epilogues read it by element (4-byte alignment); a
    kernel that reads it in 16-byte vectors asks for align=16."""
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
