"""The launch plan of one gemm_kernel variant on one problem: validated once per (config, shape,
policies, stream), then every call only packs its pointers (tensor maps, epilogue params).

    p = plan(cfg, m, n, k, dtype=DType.BF16, b_layout="nk", out_dtype=DType.BF16, device_id=0, stream=s)
    p.launch(a_ptr, b_ptr, lda=k, ldb=k, stream=s, epilogue_params=epilogue_params(...))

The fused ops build theirs with their own kernel file, scheduler, prologue and epilogue policies
and tile-row rotation (seg_count, seg_start).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from .. import env, tune
from ..jit import get_kernel
from ..runtime import DType
from ..tune import GemmConfig, WorkPlan
from .abi import (GEMM_PARAMS, NOWAIT, NOWAIT_PARAMS, PLAIN_SCHED, TMAP_CODE, KernelOptions, check_options, kernel_name,
                  kernel_options, launch_smem_bytes, narrow_sched, plain_epilogue)
from .launch import LaunchBlock, launch, tensor_map_code, workspace

# Rows of A's TMA box and of its tail box (GemmParams::a_box_rows / a_tail_rows; the rules live in
# tune, whose time model charges them). Module attributes, looked up at each plan: tests swap them
# for the full box.
a_box_rows = tune.a_box_rows
a_tail_rows = tune.a_tail_rows


def check_arch(device_id: int) -> tune.DeviceInfo:
    """The device's attributes; RuntimeError unless it is sm_90 (the engine's wgmma + TMA path)."""
    info = tune.device_info(device_id)
    if info.cc != (9, 0):
        raise RuntimeError(
            f"rawflux.gemm needs sm_90 (Hopper: H100 / H200 / GH200); device {device_id} ({info.name}) is "
            f"sm_{info.cc[0]}{info.cc[1]}, and rawflux has no portable (mma.sync) path yet"
        )
    return info


def pack_params(cfg: GemmConfig, m: int, n: int, k: int, work: WorkPlan, *, seg_count: int = 1, seg_start: int = 0,
                workspace: int = 0, counters: int = 0, timeout_ns: int | None = None) -> bytes:
    """GemmParams of one launch of cfg on (m, n, k) with work plan `work` (tune.work_plan). The
    order's rotation is cfg.rotate (cluster tile rows), or (seg_count, seg_start) as TileSchedT
    reads them: a config's rotation is one-row segments starting at its row."""
    t = cfg.tile
    if cfg.rotate:
        if seg_count > 1:
            raise ValueError(f"config {cfg.tag()} rotates its order itself: pass no seg_count / seg_start")
        seg_count, seg_start = m, cfg.rotate * t.bm * t.cluster_m
    if timeout_ns is None:
        timeout_ns = int(env.wait_timeout_s() * 1e9)
    return GEMM_PARAMS.pack(
        m, n, k, -(-m // t.bm), work.tiles_n, work.k_blocks, work.splits, work.kb_per_split, max(1, cfg.group), int(cfg.raster_n),
        max(1, seg_count), seg_start, work.sk_tiles, a_box_rows(t, m), a_tail_rows(t, m), work.tail_splits, work.narrow_from, 0,
        workspace, counters, timeout_ns,
    )


def gemm_params(cfg: GemmConfig, m: int, n: int, k: int, *, sms: int, seg_count: int = 1, seg_start: int = 0, workspace: int = 0,
                counters: int = 0, timeout_ns: int | None = None) -> bytes:
    """GemmParams for cfg on (m, n, k) on a device of `sms` SMs (the grid the plan sizes)."""
    return pack_params(cfg, m, n, k, tune.work_plan(m, n, k, cfg, sms), seg_count=seg_count, seg_start=seg_start,
                       workspace=workspace, counters=counters, timeout_ns=timeout_ns)


def grid_size(cfg: GemmConfig, m: int, n: int, k: int, sms: int) -> int:
    """Persistent CTAs of a launch: at most one per SM (or cfg.ctas), never more than there are
    units, a multiple of the cluster size."""
    return tune.work_plan(m, n, k, cfg, sms).clusters * cfg.tile.cluster_size


def check_config(cfg: GemmConfig, m: int, n: int, k: int, *, sched: str, b_layout: str, out_dtype: DType, epilogue: str,
                 sms: int) -> None:
    """ValueError where cfg cannot run on this scheduler / layout / output, before any launch."""
    t = cfg.tile
    if sched != PLAIN_SCHED and cfg.decomp.kind != "dp":
        raise ValueError(f"{sched} does not split k: config {cfg.tag()} needs splits = 1 and no stream-K")
    if cfg.decomp.kind == "narrow" and (t not in tune.NARROW_TILES or b_layout != "nk" or out_dtype == DType.F32
                                        or epilogue != "rawflux::TmaStore"):
        raise ValueError(f"config {cfg.tag()}: narrow columns are for the plain GEMM on "
                         f"{', '.join(x.tag() for x in tune.NARROW_TILES)}, data-parallel (splits = 1, no stream-K), "
                         f"B as (n, k) and a 16-bit output")
    rows = -(-m // (t.bm * t.cluster_m))
    if not 0 <= cfg.rotate < rows:
        raise ValueError(f"config {cfg.tag()}: the order's rotation is a cluster tile row, 0 <= rotate < {rows} at m = {m}")
    if cfg.stream_k and not t.stream_k_ok:
        raise ValueError(f"config {cfg.tag()}: stream-K takes splits = 1 and a tile with at most 256 columns per "
                         f"consumer warpgroup (tile {t.tag()} has {t.wn})")
    if t.cluster_k > 1:
        tiles = -(-m // t.bm) * -(-n // t.bn)
        ctas = min(cfg.ctas or sms, sms)
        if cfg.decomp.kind != "dp":
            raise ValueError(f"config {cfg.tag()}: a k-split cluster splits k itself: use splits = 1 and no stream-K")
        if tune.split_plan(k, 2)[2] < 2:
            raise ValueError(f"config {cfg.tag()}: a k-split cluster needs at least 2 k blocks of {tune.BK} (k = {k})")
        if 2 * tiles > ctas:
            raise ValueError(f"config {cfg.tag()}: a k-split cluster takes one tile: {tiles} tiles need {2 * tiles} CTAs, "
                             f"the grid has {ctas}")


@dataclass(frozen=True)
class GemmPlan:
    """Everything a launch of one variant on one problem needs but the pointers."""

    cfg: GemmConfig
    name: str  # the kernel's name expression
    options: KernelOptions
    kernel: object  # jit.Kernel
    work: WorkPlan
    grid: int
    threads: int
    cluster: int
    smem: int
    params: bytes  # GemmParams (with this stream's workspace)
    box_a: tuple[int, int]
    box_b: tuple[int, int]
    a_tail: int  # rows of A's tail box (a_tail_rows); 0: the kernel's tmap_a_tail is tmap_a
    mnk: tuple[int, int, int]
    b_layout: str
    tmap_code: int

    def args(self, a_ptr: int, b_ptr: int, lda: int, ldb: int, prologue_params: bytes, epilogue_params: bytes) -> tuple[bytes, ...]:
        """gemm_kernel's arguments for A at a_ptr (pitch lda) and B at b_ptr (pitch ldb)."""
        tmap_a, tmap_a_tail = self.a_maps(a_ptr, lda)
        return tmap_a, self.b_map(b_ptr, ldb), self.params, prologue_params, epilogue_params, tmap_a_tail

    def a_maps(self, a_ptr: int, lda: int) -> tuple[bytes, bytes]:
        """A's tensor map and its tail map (the same map where the plan has no tail box)."""
        m, _, k = self.mnk
        tmap_a = self.a_map(a_ptr, m, lda)
        return tmap_a, (tensor_map_code(a_ptr, self.tmap_code, m, k, lda, self.a_tail, self.box_a[1]) if self.a_tail else tmap_a)

    def a_map(self, a_ptr: int, rows: int, lda: int) -> bytes:
        """A map of ``rows`` rows of A's k columns at a_ptr (pitch lda), with A's box: A's main map
        (rows = m), or a fused prologue's own map (AgWait::Params.own_map)."""
        return tensor_map_code(a_ptr, self.tmap_code, rows, self.mnk[2], lda, self.box_a[0], self.box_a[1])

    def b_map(self, b_ptr: int, ldb: int) -> bytes:
        _, n, k = self.mnk
        if self.b_layout == "nk":
            return tensor_map_code(b_ptr, self.tmap_code, n, k, ldb, self.box_b[0], self.box_b[1])
        return tensor_map_code(b_ptr, self.tmap_code, k, n, ldb, self.box_b[0], self.box_b[1])

    def bind(self, lda: int, ldb: int, prologue_params: bytes = NOWAIT_PARAMS, pdl: bool = False) -> "BoundGemm":
        """This plan's launch with an argument block of its own, for A and B of pitches lda, ldb."""
        return BoundGemm(self, lda, ldb, prologue_params, pdl)

    def launch_args(self, stream: int, args: tuple[bytes, ...], pdl: bool = False) -> None:
        """Launch with arguments built by args() (a fused op builds them before it issues anything)."""
        launch(self.kernel, self.grid, self.threads, self.cluster, self.smem, stream, args, pdl=pdl)

    def launch(self, a_ptr: int, b_ptr: int, *, lda: int, ldb: int, stream: int, epilogue_params: bytes,
               prologue_params: bytes = NOWAIT_PARAMS, pdl: bool = False) -> None:
        self.launch_args(stream, self.args(a_ptr, b_ptr, lda, ldb, prologue_params, epilogue_params), pdl=pdl)


class BoundGemm:
    """A GemmPlan's launch with its own argument block: GemmParams and the prologue's params are
    written once; A's and B's tensor maps when their pointer changes, the epilogue's params when
    the caller passes new ones. A call that repeats the last one's pointers is one driver call."""

    def __init__(self, plan: GemmPlan, lda: int, ldb: int, prologue_params: bytes, pdl: bool):
        self.plan, self.lda, self.ldb = plan, lda, ldb
        self.block = LaunchBlock(plan.kernel, plan.grid, plan.threads, plan.cluster, plan.smem, pdl=pdl)
        self.block.write(_PARAMS_SLOT, plan.params)
        self.block.write(_PROLOGUE_SLOT, prologue_params)
        self._a = self._b = None
        self._out = None  # (out, bias) pointers the epilogue's params were last written for

    def set_prologue(self, raw: bytes, offset: int = 0) -> None:
        """Rewrite the prologue's params from byte ``offset`` (a fused call's own map)."""
        self.block.write(_PROLOGUE_SLOT, raw, offset)

    def point(self, a_ptr: int, b_ptr: int) -> None:
        """A at a_ptr, B at b_ptr (pitches as bound)."""
        if a_ptr != self._a:
            tmap_a, tmap_a_tail = self.plan.a_maps(a_ptr, self.lda)
            self.block.write(_A_SLOT, tmap_a)
            self.block.write(_A_TAIL_SLOT, tmap_a_tail)
            self._a = a_ptr
        if b_ptr != self._b:
            self.block.write(_B_SLOT, self.plan.b_map(b_ptr, self.ldb))
            self._b = b_ptr

    def out_changed(self, out_ptr: int, bias_ptr: int) -> bool:
        """True (once) when the epilogue's params must be rewritten for these out and bias pointers."""
        if self._out == (out_ptr, bias_ptr):
            return False
        self._out = (out_ptr, bias_ptr)
        return True

    def set_epilogue(self, raw: bytes, offset: int = 0) -> None:
        self.block.write(_EPILOGUE_SLOT, raw, offset)

    def launch(self, stream: int) -> None:
        self.block.launch(stream)


_A_SLOT, _B_SLOT, _PARAMS_SLOT, _PROLOGUE_SLOT, _EPILOGUE_SLOT, _A_TAIL_SLOT = range(6)  # gemm_kernel's arguments

_plans: dict[tuple, GemmPlan] = {}
_plans_lock = threading.Lock()


def plan(cfg: GemmConfig, m: int, n: int, k: int, *, dtype: DType, b_layout: str, out_dtype: DType, device_id: int, stream: int,
         relpath: str = "gemm.cu", sched: str = PLAIN_SCHED, prologue: str = NOWAIT, epilogue: str | None = None,
         seg_count: int = 1, seg_start: int = 0, timeout_ns: int | None = None, options: KernelOptions | None = None) -> GemmPlan:
    """The launch plan of cfg on (m, n, k): A (m, k) row-major; B (n, k) ("nk") or (k, n) ("kn")
    row-major. The caller has checked shapes, alignment (16-byte pointers and pitches) and n, k
    multiples of 8. ``epilogue`` defaults to the plain GEMM's for out_dtype; ``options`` to
    abi.kernel_options. Split modes need the plain GEMM's scheduler (PLAIN_SCHED) and an epilogue
    that only stores. Cached per argument set."""
    epilogue = epilogue or plain_epilogue(out_dtype)
    key = (cfg, m, n, k, dtype, b_layout, out_dtype, stream, device_id, relpath, sched, prologue, epilogue, seg_count, seg_start,
           timeout_ns, options)
    hit = _plans.get(key)
    if hit is not None:
        return hit
    t = cfg.tile
    info = check_arch(device_id)
    check_config(cfg, m, n, k, sched=sched, b_layout=b_layout, out_dtype=out_dtype, epilogue=epilogue, sms=info.sms)
    if options is not None:
        check_options(options, t, prologue, epilogue, out_dtype, narrow=bool(cfg.narrow))
    opts = options or kernel_options(t, prologue, epilogue, out_dtype, narrow=bool(cfg.narrow))
    work = tune.work_plan(m, n, k, cfg, info.sms)
    ws = ctr = 0
    if work.splits > 1:
        # two counts per (slot, consumer warpgroup): arrived and stored (splitk_fixup)
        ws, ctr = workspace(device_id, stream, work.slots * work.splits * t.bm * t.bn * 4, 2 * work.slots * t.consumers)
    params = pack_params(cfg, m, n, k, work, seg_count=seg_count, seg_start=seg_start, workspace=ws, counters=ctr,
                         timeout_ns=timeout_ns)
    name = kernel_name(t, dtype, out_dtype, b_layout, sched=narrow_sched(cfg.narrow) if cfg.narrow else sched, prologue=prologue,
                       epilogue=epilogue, options=opts)
    kern = get_kernel(relpath, name, device_id=device_id, arch="sm_90a")
    box_b = (t.bn // t.cluster_m, tune.BK) if b_layout == "nk" else (tune.BK // t.cluster_m, 64)
    p = GemmPlan(cfg, name, opts, kern, work, work.clusters * t.cluster_size, t.threads, t.cluster_size,
                 launch_smem_bytes(t, epilogue, out_dtype, opts), params, (a_box_rows(t, m), tune.BK), box_b, a_tail_rows(t, m),
                 (m, n, k), b_layout, TMAP_CODE[dtype])
    with _plans_lock:
        if len(_plans) > 4096:
            _plans.clear()
        _plans[key] = p
    return p


# ------------------------------------------------------------------------------------------------
# configuration choice

_pick_cache: dict[tuple, GemmConfig] = {}


def pick_config(m: int, n: int, k: int, dtype: DType, b_layout: str, out_dtype: DType, device_id: int, timer=None) -> GemmConfig:
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
