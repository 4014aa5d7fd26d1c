"""rawflux.gemm_rs: GEMM-ReduceScatter fused into the GEMM (row-parallel layer, FLUX).

On rank r of W: a (m, k) is this rank's columns of the activations (k = the local share of the
model's k), b_shard (n, k) ("nk", a linear layer's weight shard, default) or (k, n) ("kn"). The
result on rank r is out (m/W, n) = rows r*m/W .. (r+1)*m/W of sum_q a_q @ b_q^T (+ bias).

How (cuda_src/rawflux/fused/rs_scatter.cuh, rs_reduce.cuh):
  * the GEMM engine runs with a scatter epilogue: each finished tile of a_r @ b_r^T is stored
    straight into the symmetric partial buffer of the rank(s) owning its rows (slot r), then
    flagged there with the call's epoch. Tiles are visited from the rows of rank r + 1 on, so
    ranks do not queue on one peer, and the rank's own rows come last. A tile may straddle
    owners (m/W not a multiple of the tile height): rows are routed one by one and the tile's
    flag is raised on every owner it touches.
  * a reduce kernel on a side stream (R CTAs; the GEMM runs on the other SMs, so neither can
    starve the other whatever the launch order) waits for each of its tiles' W flags and sums
    the partials in fp32 in the fixed order q = 0..W-1, adds the bias once, rounds once: the
    same bits on every run, whatever order the tiles arrive in. The same kernel is launched
    again after the GEMM on the caller's stream with a full grid: both claim work units from
    one counter, so the tail (the rank's own rows, computed last) is reduced on every SM.
  * partials are fp32 by default (one rounding in all). ``partials="bf16"`` (or "f16") halves
    the bytes on the links at the cost of one extra rounding of each rank's partial to 16 bits
    before the fp32 sum (relative error ~2^-9 per partial, the same order as the final bf16
    rounding; a framework's bf16 NCCL reduce-scatter rounds at every step of its ring instead).
  * every call starts with the group barrier on the caller's stream (it proves every peer is done
    with the previous call's buffers, and its epoch tags this call's flags) and a device-side
    comparison of every rank's call record (m, n, k, dtype, tile ...): a mismatched call fails
    with CallMismatch, a missing rank with CollectiveTimeout, within RAWFLUX_WAIT_TIMEOUT_S.
  * world 1: no communication, the plain GEMM stores straight into out.

Capturable in a CUDA graph (pass ``out=``; the first call with a given m compiles its kernels, so
make it before capturing). ``GemmRS`` is sized once (symmetric buffers at construction, nothing
allocated per call); ``gemm_rs`` caches one GemmRS per (n, k, dtype, layout, partials) and group.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import dataclass, replace

from .. import engine, env, tune
from ..dist.layout import OP_GEMM_RS
from ..jit import get_kernel, register
from ..runtime import DType, as_tensor, check_matrix, prepare_output, resolve_stream, wrap_output
from ..tune import GemmConfig, TileConfig
from ._collective import DTYPE_CODE, CollectiveOp, OpCache, bounded_allgather, resolve_group

__all__ = ["GemmRS", "gemm_rs", "PARTIALS", "RsPlan", "plan_call", "tile_owners", "route_row", "reduce_units", "flag_index",
           "tiles_cap_for", "default_reduce_ctas", "choose_config", "check_op_args"]

KERNEL_FILE = "gemm_rs.cu"
REDUCE_THREADS = 512  # kRsReduceThreads (fused/rs_reduce.cuh)
DTYPES = (DType.BF16, DType.F16)
B_LAYOUTS = ("nk", "kn")

# Partial element types: name -> (kRsPart* code, bytes, the DType the engine's Cfg carries as kOut).
PARTIALS = {"fp32": (2, 4, DType.F32), "bf16": (0, 2, DType.BF16), "f16": (1, 2, DType.F16)}
_LAYOUT_CODE = {"nk": 0, "kn": 1}

# struct ScatterStore<kPart>::Params (fused/rs_scatter.cuh):
#   parts_peers, flags_peers, epoch, ld, m_loc, tiles_cap, rank, world
SCATTER_PARAMS = struct.Struct("<QQQqiiii")
# struct RsReduceParams (fused/rs_reduce.cuh):
#   parts, flags, meta_peers, ctrl, out, bias, m, n, m_loc, bm, bn, tiles_n, tiles_cap, bias_kind
REDUCE_PARAMS = struct.Struct("<6Q8i")
BIAS_NONE, BIAS_IN16, BIAS_F32 = 0, 1, 2  # epi::kBias*


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


# ------------------------------------------------------------------------------------------------
# pure tile / owner / flag math (mirrors the CUDA side; unit-tested on the CPU)


def tile_owners(tile_m: int, bm: int, m: int, m_loc: int) -> range:
    """Ranks owning rows of global tile row ``tile_m`` (rows tile_m*bm .. min(m, +bm)): the
    owners whose flag the tile's source raises (ScatterStore::tile_done)."""
    r0 = tile_m * bm
    r1 = min(m, r0 + bm)
    if r0 >= r1:
        return range(0)
    return range(r0 // m_loc, (r1 - 1) // m_loc + 1)


def route_row(g: int, m: int, m_loc: int, src: int, n: int) -> tuple[int, int] | None:
    """Where row g of source ``src``'s partial goes: (owner rank, element offset of (g, 0) in the
    owner's partial buffer), None for rows past m (rs::route_row in fused/rs_scatter.cuh)."""
    if g >= m:
        return None
    owner = g // m_loc
    return owner, (src * m_loc + (g - owner * m_loc)) * n


FLAG_BASE = 32  # kRsFlagBase (fused/rs_layout.cuh): u32 words before the first flag (the work counter's line)


def flag_index(src: int, tiles_cap: int, tile_m: int, tiles_n: int, tile_n: int) -> int:
    """rs_flag_index (fused/rs_layout.cuh): u32 word of the (source, tile) flag in an owner's buffer."""
    return FLAG_BASE + src * tiles_cap + tile_m * tiles_n + tile_n


def flags_bytes(world: int, tiles_cap: int) -> int:
    """Size of each rank's flag buffer: the counter's 128-byte line, then W * tiles_cap flags."""
    return 4 * (FLAG_BASE + world * tiles_cap)


def reduce_units(rank: int, m_loc: int, bm: int, bn: int, n: int) -> list[tuple[int, int, int, int, int, int]]:
    """The reduce kernel's work units on ``rank`` in its order: (tile_m, tile_n, r0, r1, c0, c1),
    rows as global row numbers, clipped to the rank's rows [rank*m_loc, (rank+1)*m_loc)."""
    row_lo, row_hi = rank * m_loc, (rank + 1) * m_loc
    tm0 = row_lo // bm
    nrows = (row_hi - 1) // bm - tm0 + 1
    tiles_n = _cdiv(n, bn)
    out = []
    for u in range(nrows * tiles_n):
        tn, tm = u // nrows, tm0 + u % nrows
        out.append((tm, tn, max(tm * bm, row_lo), min(tm * bm + bm, row_hi), tn * bn, min(n, tn * bn + bn)))
    return out


def tiles_cap_for(max_m: int, n: int, tiles) -> int:
    """Flags per source slot: enough for every tile shape the op may launch, at any m <= max_m."""
    return max(_cdiv(max_m, t.bm) * _cdiv(n, t.bn) for t in tiles)


def default_reduce_ctas(sms: int, world: int) -> int:
    """CTAs of the reduce kernel beside the GEMM (the GEMM gets the rest): RAWFLUX_RS_REDUCE_CTAS,
    else ~1/32 of the SMs (4 of 132), at least 1 and at most half of them. Few: with the rotated
    tile order most of a rank's tiles are complete only when its GEMM ends, and what is left then
    is reduced on every SM by the launch after the GEMM; SMs given to the reducer are taken from
    the GEMM for its whole run."""
    forced = env.rs_reduce_ctas()
    r = forced if forced is not None else max(1, round(sms / 32))
    return max(1, min(r, sms // 2 if sms >= 2 else 1))


def choose_config(m: int, n: int, k: int, b_layout: str, dev, gemm_ctas: int, part_bytes: int, tiles=None) -> GemmConfig:
    """The GEMM configuration of one call: no split-K (every tile is stored and flagged exactly
    once), tile rows walked along n (raster_n False: the rotation then visits owners one after
    the other), on ``gemm_ctas`` persistent CTAs; the tile by the engine's time model. A pure
    function of its arguments, so every rank picks the same (the call check verifies it)."""
    best, best_t = None, float("inf")
    for t in tiles or tune.tiles_for(b_layout):
        if not t.supports(b_layout) or t.cluster_size > gemm_ctas:
            continue
        cfg = GemmConfig(t, tune.DP, group=8, raster_n=False, ctas=gemm_ctas)
        us = tune.estimate_us(m, n, k, cfg, dev, out_bytes=part_bytes)
        if us < best_t - 1e-9:
            best, best_t = cfg, us
    if best is None:
        raise ValueError(f"gemm_rs: no tile configuration fits {gemm_ctas} CTAs for layout {b_layout!r}")
    return best


def check_op_args(world: int, max_m: int, n: int, k: int, dtype, b_layout: str, partials: str) -> DType:
    """Construction arguments (clear errors before any allocation); returns the DType."""
    dt = DType.from_any(dtype)
    if dt not in DTYPES:
        raise TypeError(f"GemmRS: dtype {dt.tag} is not supported: use bf16 or f16")
    if b_layout not in B_LAYOUTS:
        raise ValueError(f"GemmRS: b_layout={b_layout!r}: use 'nk' (b_shard is (n, k), a linear layer's weight) or 'kn' (b_shard is (k, n))")
    if partials not in PARTIALS:
        raise ValueError(f"GemmRS: partials={partials!r}: use 'fp32' (default, one rounding), 'bf16' or 'f16' (half the bytes)")
    for name, v in (("max_m", max_m), ("n", n), ("k", k)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"GemmRS: {name}={v!r} must be a positive int")
    if n % 8 or k % 8:
        raise ValueError(f"GemmRS: n={n} and k={k} must be multiples of 8 (16-byte rows for the TMA loads and the stores)")
    if max_m < world:
        raise ValueError(f"GemmRS: max_m={max_m} is smaller than the world size {world}: every rank gets m/W >= 1 rows")
    return dt


def check_m(m: int, max_m: int, world: int) -> int:
    """A call's m: 1..max_m and a multiple of W (each rank gets m/W rows). Returns m/W."""
    if m < 1:
        raise ValueError(f"gemm_rs: a has m={m} rows; at least {world} (one per rank) are needed")
    if m > max_m:
        raise ValueError(f"gemm_rs: m={m} exceeds the op's capacity max_m={max_m}; build GemmRS with a larger max_m")
    if m % world:
        raise ValueError(
            f"gemm_rs: m={m} is not a multiple of the world size {world}: rank r gets rows r*m/W .. (r+1)*m/W, so "
            f"m must divide evenly (pad m to {_cdiv(m, world) * world})"
        )
    return m // world


@dataclass(frozen=True)
class RsPlan:
    """Everything a call of a given m launches, computed once per m."""

    m: int
    m_loc: int
    cfg: GemmConfig
    tiles_n: int
    reduce_grid: int  # the reduce kernel beside the GEMM (side stream)
    tail_grid: int  # the reduce kernel after the GEMM (caller's stream): what is left, on every SM
    epi_params: bytes
    seg_start: int
    fields: tuple[int, ...]


def plan_call(m: int, *, n: int, k: int, dtype: DType, b_layout: str, partials: str, rank: int, world: int,
              dev, gemm_ctas: int, reduce_ctas: int, tiles_cap: int, parts_table: int = 0, flags_table: int = 0,
              epoch_ptr: int = 0, config: GemmConfig | None = None, tile_ctas: int | None = None) -> RsPlan:
    """The launch plan of one call (pure: pointers are numbers). The tile is chosen for a grid of
    ``tile_ctas`` (default gemm_ctas; GemmRS passes the group's smallest, so every rank picks the
    same), and the GEMM runs on this rank's ``gemm_ctas``."""
    m_loc = m // world
    part_code, part_bytes, _ = PARTIALS[partials]
    cfg = config if config is not None else choose_config(m, n, k, b_layout, dev, tile_ctas or gemm_ctas, part_bytes)
    cfg = replace(cfg, decomp=tune.DP, raster_n=False, ctas=gemm_ctas)
    t = cfg.tile
    tiles_n = _cdiv(n, t.bn)
    if _cdiv(m, t.bm) * tiles_n > tiles_cap:
        raise ValueError(f"gemm_rs: tile {t.bm}x{t.bn} needs {_cdiv(m, t.bm) * tiles_n} flags per source at m={m}, "
                         f"the op holds {tiles_cap}")
    units = len(reduce_units(rank, m_loc, t.bm, t.bn, n)) if world > 1 else 0
    epi = SCATTER_PARAMS.pack(parts_table, flags_table, epoch_ptr, n, m_loc, tiles_cap, rank, world)
    fields = (m, n, k, DTYPE_CODE[dtype], _LAYOUT_CODE[b_layout], part_code, t.bm, t.bn)
    return RsPlan(m, m_loc, cfg, tiles_n, max(1, min(reduce_ctas, units)), max(1, min(gemm_ctas + reduce_ctas, units)),
                  epi, (rank + 1) % world, fields)


# ------------------------------------------------------------------------------------------------
# kernel names and registration (python -m rawflux.check_kernels compiles every variant)


def scatter_epilogue(partials: str) -> str:
    return f"rawflux::ScatterStore<{PARTIALS[partials][0]}>"


def gemm_kernel_name(tile: TileConfig, dtype: DType, b_layout: str, partials: str) -> str:
    return engine.kernel_name(tile, dtype, PARTIALS[partials][2], b_layout, epilogue=scatter_epilogue(partials))


def reduce_kernel_name(partials: str, out_dtype: DType) -> str:
    return f"rawflux::rs_reduce_kernel<{PARTIALS[partials][0]},{engine.abi.TYPE_CODE[out_dtype]}>"


def _default_partials_for(dt: DType) -> tuple[str, ...]:
    return ("fp32", "bf16" if dt == DType.BF16 else "f16")


def _register_variants() -> None:
    for dt in DTYPES:
        for partials in _default_partials_for(dt):
            register(KERNEL_FILE, reduce_kernel_name(partials, dt), archs=("sm_90a",))
            for layout in B_LAYOUTS:
                for t in tune.tiles_for(layout):
                    register(KERNEL_FILE, gemm_kernel_name(t, dt, layout, partials), archs=("sm_90a",))


_register_variants()


# ------------------------------------------------------------------------------------------------
# a lean launcher for the reduce kernel (one by-value struct; cached launch configs)


class _ParamSlot(threading.local):
    def __init__(self):
        self.buf = ctypes.create_string_buffer(REDUCE_PARAMS.size + 64)
        self.addr = (ctypes.addressof(self.buf) + 63) & ~63
        self.ptrs = (ctypes.c_void_p * 1)(self.addr)
        self.ptrs_addr = ctypes.addressof(self.ptrs)


_slot = _ParamSlot()
_reduce_cfgs: dict[tuple, tuple] = {}


def _launch_reduce(kernel, grid: int, stream: int, params: bytes) -> None:
    from cuda.bindings import driver as drv

    key = (kernel.handle, grid, stream)
    hit = _reduce_cfgs.get(key)
    if hit is None:
        cfg = drv.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = REDUCE_THREADS, 1, 1
        cfg.sharedMemBytes = 0
        cfg.hStream = drv.CUstream(stream)
        cfg.attrs = []
        cfg.numAttrs = 0
        if len(_reduce_cfgs) > 1024:
            _reduce_cfgs.clear()
        hit = _reduce_cfgs[key] = (cfg, drv.CUfunction(kernel.handle))
    ctypes.memmove(_slot.addr, params, len(params))
    (err,) = drv.cuLaunchKernelEx(hit[0], hit[1], _slot.ptrs_addr, 0)
    if err != drv.CUresult.CUDA_SUCCESS:
        _, msg = drv.cuGetErrorString(err)
        raise RuntimeError(f"launch of {kernel.symbol} failed: {err.name}: {msg.decode() if msg else ''}")


# ------------------------------------------------------------------------------------------------
# the op object


class GemmRS(CollectiveOp):
    """GEMM-ReduceScatter sized once. Collective construction (every rank, same arguments):

        op = GemmRS(group, max_m, n, k, dtype, b_layout="nk")
        out = op(a, b_shard, bias=None, out=None, stream=None)     # a (m, k), out (m/W, n)

    max_m: largest m of any call (a multiple of W is not required; each call's m is); n: output
    columns; k: a's columns on each rank (the local share of the model's k); dtype: bf16 or f16.
    partials: "fp32" (default), "bf16" or "f16" (see the module docstring); reduce_ctas: CTAs of
    the reduce kernel beside the GEMM (default: RAWFLUX_RS_REDUCE_CTAS or SMs/32); config: a fixed GemmConfig for
    every call (tests, benchmarks; split-K is ignored).
    Buffers: max_m * n * (4 or 2) bytes of partials + one u32 flag per (source, tile) per rank.
    """

    OP_NAME = "gemm_rs"
    OP_ID = OP_GEMM_RS
    META_FIELDS = ("m", "n", "k", "dtype", "b_layout", "partials", "tile_m", "tile_n")

    def __init__(self, group, max_m: int, n: int, k: int, dtype, b_layout: str = "nk", *, partials: str = "fp32",
                 reduce_ctas: int | None = None, config: GemmConfig | None = None):
        group = resolve_group(group)
        self.dtype = check_op_args(group.world, max_m, n, k, dtype, b_layout, partials)
        self.max_m, self.n, self.k, self.b_layout, self.partials = int(max_m), int(n), int(k), b_layout, partials
        if config is not None:
            if not isinstance(config, GemmConfig):
                raise TypeError(f"GemmRS: config must be a rawflux.tune.GemmConfig, got {type(config).__name__}")
            if config.tile not in tune.TILES or not config.tile.supports(b_layout):
                raise ValueError(f"GemmRS: config tile {config.tile.tag()} is not a compiled variant for layout {b_layout!r}")
        self.config = config
        super().__init__(group, side_streams=1)
        g = self.group
        self.dev = engine.check_arch(self.device_id) if self.world > 1 else tune.device_info(self.device_id)
        sms = self.dev.sms
        self.reduce_ctas = int(reduce_ctas) if reduce_ctas is not None else default_reduce_ctas(sms, self.world)
        if self.world > 1 and not 1 <= self.reduce_ctas < sms:
            raise ValueError(f"GemmRS: reduce_ctas={self.reduce_ctas} must be in 1..{sms - 1} (this device has {sms} SMs)")
        self.gemm_ctas = sms - self.reduce_ctas if self.world > 1 else sms
        self.tile_ctas = self.gemm_ctas
        self._tiles = [config.tile] if config is not None else tune.tiles_for(b_layout)
        self.tiles_cap = tiles_cap_for(self.max_m, self.n, self._tiles)
        self._plans: dict[int, RsPlan] = {}
        self._plans_lock = threading.Lock()
        self.parts = self.flags = None
        if self.world == 1:
            return
        part_code, part_bytes, _ = PARTIALS[partials]
        # Every rank must build the same op: compare the arguments (bounded) before allocating.
        mine = (self.max_m, self.n, self.k, DTYPE_CODE[self.dtype], _LAYOUT_CODE[b_layout], part_code)
        got = bounded_allgather(g, mine + (self.gemm_ctas,), "GemmRS construction")  # a flat tuple of ints
        bad = [q for q, v in enumerate(got) if v[:-1] != got[0][:-1]]
        if bad:
            names = ("max_m", "n", "k", "dtype", "b_layout", "partials")
            listing = "; ".join(f"rank {q}: " + ", ".join(f"{a}={b}" for a, b in zip(names, v)) for q, v in enumerate(got))
            raise ValueError(f"GemmRS: ranks build the op with different arguments ({listing}); every rank must pass the same")
        # Every rank must pick the same tile for a call (the flag layout and the call check depend on
        # it), while each runs its own grid: ranks may differ in reduce_ctas, and their devices in SM
        # count (an SM cap under MPS). The tile is chosen for the group's smallest GEMM grid.
        self.tile_ctas = min(v[-1] for v in got)
        self.parts = self.symmetric(self.max_m * self.n * part_bytes, "parts")
        self.flags = self.symmetric(flags_bytes(self.world, self.tiles_cap), "flags")
        self.prepare_meta_kernels()
        self._reduce_kernel = self.kernel(KERNEL_FILE, reduce_kernel_name(partials, self.dtype))

    # --- planning -------------------------------------------------------------------------------
    def plan(self, m: int) -> RsPlan:
        """The launch plan for calls of this m (cached)."""
        p = self._plans.get(m)
        if p is not None:
            return p
        check_m(m, self.max_m, self.world)
        p = plan_call(
            m, n=self.n, k=self.k, dtype=self.dtype, b_layout=self.b_layout, partials=self.partials, rank=self.rank,
            world=self.world, dev=self.dev, gemm_ctas=self.gemm_ctas, reduce_ctas=self.reduce_ctas, tiles_cap=self.tiles_cap,
            tile_ctas=self.tile_ctas,
            parts_table=self.parts.peer_table_ptr if self.parts else 0,
            flags_table=self.flags.peer_table_ptr if self.flags else 0, epoch_ptr=self.epoch_ptr, config=self.config,
        )
        with self._plans_lock:
            self._plans[m] = p
        return p

    def warmup(self, ms) -> None:
        """Compile and load the kernels for calls of these m (do it before a graph capture)."""
        for m in ms:
            p = self.plan(int(m))
            if self.world > 1:
                name = gemm_kernel_name(p.cfg.tile, self.dtype, self.b_layout, self.partials)
                get_kernel(KERNEL_FILE, name, device_id=self.device_id, arch="sm_90a")
            else:
                self._local_plan(int(m), None)

    # --- the call -------------------------------------------------------------------------------
    def __call__(self, a, b_shard, *, bias=None, out=None, stream=None):
        """out (m/W, n) = this rank's rows of sum_q a_q @ b_q^T (+ bias). Every check runs
        before any launch; a previous call's device-side failure raises here."""
        n, k, dt, world = self.n, self.k, self.dtype, self.world
        s = resolve_stream(stream, [x for x in (a, b_shard, bias, out) if x is not None])
        dev = self.device_id
        ta = check_matrix(as_tensor(a, "a", stream=s), "a", dtypes=(dt,), device=dev, shape=(None, k), ld_ok=True)
        bshape = (n, k) if self.b_layout == "nk" else (k, n)
        tb = check_matrix(as_tensor(b_shard, "b_shard", stream=s), "b_shard", dtypes=(dt,), device=dev, shape=bshape, ld_ok=True)
        m = ta.shape[0]
        m_loc = check_m(m, self.max_m, world)
        # 16-byte alignment: the reduce kernel reads the bias in 16-byte vectors
        tbias, bias_ptr, bias_kind = engine.bias_args(bias, n, dt, dev, s, align=16, op="gemm_rs")
        inputs = {"a": ta, "b_shard": tb} | ({"bias": tbias} if tbias is not None else {})
        tc, _ = prepare_output(out, "out", (m_loc, n), dt, ta, stream=s, inputs=inputs)
        lda = ta.strides[0] if m > 1 else k
        ldb = tb.strides[0] if tb.shape[0] > 1 else tb.shape[1]
        p = self.plan(m)
        if world > 1:
            # The GEMM's kernel compiled and loaded before this rank issues anything: a compile
            # after the barrier would hold every peer's flag wait for as long (seen as a 10 s
            # timeout in a loop of 1000 calls whose m sweeps through several tiles).
            gplan = engine.plan(p.cfg, m, n, k, dtype=dt, b_layout=self.b_layout, out_dtype=PARTIALS[self.partials][2], device_id=dev,
                                stream=s, relpath=KERNEL_FILE, sched=engine.FUSED_SCHED, epilogue=scatter_epilogue(self.partials),
                                seg_count=world, seg_start=p.seg_start)
        self.begin(s, p.fields)
        if world == 1:
            self._local_gemm(ta, tb, tc, bias_ptr, bias_kind, lda, ldb, s)
            return wrap_output(ta, tc, stream=s)
        self.publish_meta(s, p.fields)
        self.barrier(s)
        (side,) = self.fork(s)
        rparams = REDUCE_PARAMS.pack(self.parts.ptr, self.flags.ptr, self._meta.peer_table_ptr, self.group_ctrl_ptr,
                                     tc.ptr, bias_ptr, m, n, m_loc, p.cfg.tile.bm, p.cfg.tile.bn, p.tiles_n,
                                     self.tiles_cap, bias_kind)
        # The GEMM (the producer) is queued before the reduce kernel that spins on its flags:
        # streams may share one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1, few connections
        # under MPS), and a waiter queued first would hold its producer back. The GEMM leaves R
        # SMs free, so where the queues are separate the reducer runs beside it.
        gplan.launch(ta.ptr, tb.ptr, lda=lda, ldb=ldb, stream=s, epilogue_params=p.epi_params)
        _launch_reduce(self._reduce_kernel, p.reduce_grid, side, rparams)
        # Once the GEMM is done its SMs are free: the same kernel on every SM takes the units the
        # side reducer has not claimed yet (the own rows come last, so usually most of them).
        _launch_reduce(self._reduce_kernel, p.tail_grid, s, rparams)
        self.join(s)
        return wrap_output(ta, tc, stream=s)

    def _local_plan(self, m: int, stream: int | None):
        """World 1: the plain GEMM's plan (the configuration rawflux.gemm would pick); stream None:
        the current one (warmup)."""
        cfg = self.config or engine.pick_config(m, self.n, self.k, self.dtype, self.b_layout, self.dtype, self.device_id)
        stream = resolve_stream(None, ()) if stream is None else stream
        return engine.plan(cfg, m, self.n, self.k, dtype=self.dtype, b_layout=self.b_layout, out_dtype=self.dtype,
                           device_id=self.device_id, stream=stream)

    def _local_gemm(self, ta, tb, tc, bias_ptr, bias_kind, lda, ldb, s) -> None:
        """World 1: the plain GEMM into out."""
        m, n, dt = ta.shape[0], self.n, self.dtype
        epi = engine.epilogue_params(engine.plain_epilogue(dt), tc.ptr, m, n, n, dt, bias_ptr, bias_kind)
        self._local_plan(m, s).launch(ta.ptr, tb.ptr, lda=lda, ldb=ldb, stream=s, epilogue_params=epi)

    def __repr__(self) -> str:
        return (f"<rawflux GemmRS rank {self.rank}/{self.world} max_m={self.max_m} n={self.n} k={self.k} "
                f"{self.dtype.tag} {self.b_layout} partials={self.partials} reduce_ctas={self.reduce_ctas}>")


# ------------------------------------------------------------------------------------------------
# the functional form


def _make_op(group, key, capacity):
    n, k, dt, b_layout, partials = key
    return GemmRS(group, capacity, n, k, dt, b_layout, partials=partials)


_ops = OpCache(_make_op, lambda op: op.max_m)


def gemm_rs(a, b_shard, group=None, *, b_layout: str = "nk", bias=None, out=None, stream=None, partials: str = "fp32"):
    """Fused GEMM-ReduceScatter on rank r of the group (default: the current one, rawflux.init()).

    a: (m, k) this rank's columns of the activations; b_shard: (n, k) ("nk") or (k, n) ("kn");
    bias: (n,) in a's dtype or f32, added once after the reduction; out: (m/W, n) in a's dtype.
    Returns rows r*m/W .. (r+1)*m/W of sum_q a_q @ b_q^T (+ bias), in the caller's framework.
    m must be a multiple of W. An op object (GemmRS) is built per (n, k, dtype, layout, partials)
    on first use and grown collectively when m exceeds its capacity; use GemmRS directly to size
    buffers once (and before capturing a CUDA graph).
    """
    if b_layout not in B_LAYOUTS:
        raise ValueError(f"gemm_rs: b_layout={b_layout!r}: use 'nk' (b_shard is (n, k)) or 'kn' (b_shard is (k, n))")
    if partials not in PARTIALS:
        raise ValueError(f"gemm_rs: partials={partials!r}: use 'fp32', 'bf16' or 'f16'")
    group = resolve_group(group)
    s = resolve_stream(stream, [x for x in (a, b_shard, bias, out) if x is not None])
    ta = as_tensor(a, "a", stream=s)
    tb = as_tensor(b_shard, "b_shard", stream=s)
    if ta.ndim != 2 or tb.ndim != 2:
        raise ValueError(f"gemm_rs: a and b_shard must be 2-D matrices, got shapes {tuple(ta.shape)} and {tuple(tb.shape)}")
    if ta.dtype not in DTYPES:
        raise TypeError(f"gemm_rs: a has dtype {ta.dtype.tag}: use bf16 or f16")
    m, k = ta.shape
    n = tb.shape[0] if b_layout == "nk" else tb.shape[1]
    kb = tb.shape[1] if b_layout == "nk" else tb.shape[0]
    if kb != k:
        raise ValueError(f"gemm_rs: a is (m, k) = {tuple(ta.shape)} but b_shard ({b_layout!r}) is {tuple(tb.shape)}: k differs ({k} vs {kb})")
    check_m(m, max(m, 1), group.world)
    op = _ops.get(group, (n, k, ta.dtype, b_layout, partials), m, stream=s, round_to=group.world)
    return op(ta, tb, bias=bias, out=out, stream=s)


def clear_cache() -> None:
    """Close the op objects the functional form made (collective)."""
    _ops.clear()
