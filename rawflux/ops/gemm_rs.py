"""rawflux.gemm_rs: GEMM-ReduceScatter fused into the GEMM (row-parallel layer, FLUX).

On rank r of W: a (m, k) is this rank's columns of the activations (k = the local share of the
model's k), b_shard (n, k) ("nk", a linear layer's weight shard, default) or (k, n) ("kn"). The
result on rank r is out (m/W, n) = rows r*m/W .. (r+1)*m/W of sum_q a_q @ b_q^T (+ bias).

One kernel per call: the GEMM engine with GEMM-RS's tile order and epilogue
(cuda_src/rawflux/fused/rs_sched.cuh, rs_epilogue.cuh):
  * rows are tiled per owner; rank r visits the tiles of its peers r+1, r+2, ... in round robin
    (every link carries an even share at every moment) and each of its own tiles one wave after
    the peers' tiles of the same rows;
  * a remote tile leaves as 16-bit TMA bulk stores from shared memory into the owner's receive
    slot (the mainloop never waits for the link); its flag is raised once the stores completed;
  * an own tile keeps its fp32 accumulators, waits (bounded) for the W - 1 flags, adds the
    partials from the local receive slots in the fixed order q = 0..W-1, adds the bias, rounds
    once and stores: the same bits on every run;
  * calls are numbered on the device (epoch) and the buffers are double-buffered by its parity,
    so a call needs no barrier; every rank's call record is pushed to its peers and checked by
    the kernel before any partial is read (CallMismatch), and a missing rank ends every wait
    within RAWFLUX_WAIT_TIMEOUT_S (CollectiveTimeout), raised at the next call or by synchronize().
  * partials="fp32" sends fp32 partials from registers instead (twice the bytes, one rounding
    fewer). The default sends the output's 16-bit type: one extra rounding per peer partial
    (relative ~2^-9, the order of the final rounding; a bf16 NCCL ring rounds at every step).
  * world 1: no communication, the plain GEMM stores straight into out.

Calls of one op object must be ordered on the device (one stream, or streams joined by events).
Capturable in a CUDA graph (pass ``out=``; the first call with a given m compiles its kernel, so
make it before capturing): the epoch lives in device memory, so replays stay in step.
"""
from __future__ import annotations

import functools
import struct
import threading
from dataclasses import dataclass, replace

from .. import engine, tune
from ..dist.layout import OP_GEMM_RS
from ..engine.launch import max_active_clusters, tensor_map_3d
from ..jit import register
from ..runtime import DType, Tensor, as_tensor, check_matrix, check_out, fastpath, intake_stream, resolve_stream
from ..tune import GemmConfig, TileConfig
from ..tune.rs_order import a_tail_rows, per_owner_tiles, rows_per_owner
from ._collective import DTYPE_CODE, FunctionalFast, META_WORDS, call_record as _call_record, OpCache, bounded_allgather, resolve_group
from ._row_parallel import B_LAYOUTS, DTYPES, MAX_WORLD, PARTIALS, RowParallelOp, check_same_args, functional
from ._row_parallel import check_op_args as _check_op_args

__all__ = ["GemmRS", "gemm_rs", "shared_op", "PARTIALS", "RsPlan", "plan_call", "choose_config", "check_op_args", "rs_tiles",
           "flag_offset", "record_offset", "slot_row", "sync_bytes", "recv_bytes", "tiles_cap_for", "EPI_PARAMS_BYTES"]

KERNEL_FILE = "gemm_rs.cu"
_LAYOUT_CODE = {"nk": 0, "kn": 1}

# fused/rs_layout.cuh
EPOCH_OFFSET, DONE_OFFSET, RECORDS_OFFSET = 0, 64, 128
RECORD_BYTES = 4 * META_WORDS
FLAGS_OFFSET = RECORDS_OFFSET + 2 * MAX_WORLD * RECORD_BYTES
FLAGS_PER_TILE = 2

# struct RsEpilogue<kPart>::Params after its 1 + MAX_WORLD tensor maps:
#   recv, sync, ctrl, bias, recv_peer[8], sync_peer[8], bias_kind, m_loc, tiles_cap, rank, world, slot_rows, record[16]
EPI_TAIL = struct.Struct(f"<4Q{MAX_WORLD}Q{MAX_WORLD}Q6i{META_WORDS}I")
EPI_PARAMS_BYTES = 1408  # sizeof(Params): 64-byte aligned (its tensor maps)
_ZERO_MAP = bytes(128)


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


# ------------------------------------------------------------------------------------------------
# buffer layout (fused/rs_layout.cuh; tests/cpu compile static_asserts from these)


def flag_offset(parity: int, world: int, src: int, tiles_cap: int, tile: int, consumer: int) -> int:
    """Byte offset of (parity, source, owner-local tile, consumer warpgroup)'s flag in a sync buffer."""
    return FLAGS_OFFSET + 4 * (((parity * world + src) * tiles_cap + tile) * FLAGS_PER_TILE + consumer)


def record_offset(parity: int, src: int) -> int:
    return RECORDS_OFFSET + (parity * MAX_WORLD + src) * RECORD_BYTES


def slot_row(parity: int, world: int, src: int, slot_rows: int, row: int, n: int) -> int:
    """Element offset of row `row` of receive slot (parity, source); slots are slot_rows = max_m // W apart."""
    return ((parity * world + src) * slot_rows + row) * n


def call_record(fields: tuple[int, ...], tag: int = 0) -> tuple[int, ...]:
    """The META_WORDS u32 words of a call record (comm/call_record.cuh): tag (the epoch, filled in
    on the device), the op id, then the call's fields."""
    return _call_record(OP_GEMM_RS, fields, tag)


def sync_bytes(world: int, tiles_cap: int) -> int:
    return FLAGS_OFFSET + 4 * 2 * world * tiles_cap * FLAGS_PER_TILE


def recv_bytes(max_m: int, n: int, part_bytes: int) -> int:
    return 2 * max_m * n * part_bytes


@functools.cache
def rs_tiles(b_layout: str) -> tuple[TileConfig, ...]:
    """The tiles GEMM-RS compiles: staged 16-bit boxes (whole 64-column boxes per warpgroup, a
    staging buffer beside the ring), no k-split cluster, fewer than 128 accumulators a thread."""
    out = []
    for t in tune.tiles_for(b_layout):
        # 128 accumulators (a 256-wide warpgroup fragment) beside this epilogue: ptxas spills (8-108 B)
        if t.cluster_k > 1 or t.wn % 64 or t.wn // 2 >= 128:
            continue
        if engine.kernel_options(t, engine.NOWAIT, rs_epilogue("bf16"), DType.BF16).store_bufs == 0:
            continue
        out.append(t)
    return tuple(out)


def tiles_cap_for(max_m: int, world: int, n: int, tiles) -> int:
    """Flags per (parity, source): owner-local tiles of the largest call, for every tile shape."""
    m_loc = max(1, max_m // world)
    return max(rows_per_owner(m_loc, t) * _cdiv(n, t.bn) for t in tiles)


# ------------------------------------------------------------------------------------------------
# configuration


def choose_config(m: int, n: int, k: int, b_layout: str, dev, ctas: int, world: int, part_bytes: int = 2,
                  tiles=None) -> GemmConfig:
    """The GEMM configuration of one call: data-parallel on `ctas` CTAs, the tile by the engine's
    time model on the per-owner padded problem (W owners of rows_per_owner tile rows). A pure
    function of its arguments, so every rank picks the same (the kernel checks the call records)."""
    m_loc = m // world
    best, best_t = None, float("inf")
    for t in tiles or rs_tiles(b_layout):
        if not t.supports(b_layout) or t.cluster_size > ctas:
            continue
        cfg = GemmConfig(t, tune.DP, group=8, raster_n=False, ctas=ctas)
        m_eff = world * rows_per_owner(m_loc, t) * t.bm
        us = tune.estimate_us(m_eff, n, k, cfg, dev, out_bytes=part_bytes)
        if us < best_t - 1e-9:
            best, best_t = cfg, us
    if best is None:
        raise ValueError(f"gemm_rs: no tile configuration fits {ctas} CTAs for layout {b_layout!r}")
    return best


def _device_key(device_id: int) -> int:
    """A number naming this rank's physical GPU (its PCI bus id), equal on ranks that share it."""
    import zlib

    import cupy

    return zlib.crc32(cupy.cuda.Device(device_id).pci_bus_id.encode())


def check_op_args(world: int, max_m: int, n: int, k: int, dtype, b_layout: str, partials) -> tuple[DType, str]:
    """Construction arguments (clear errors before any allocation); returns (DType, partials)."""
    return _check_op_args("GemmRS", "GEMM-RS", world, max_m, n, k, dtype, b_layout, partials, rows_per_rank=True)


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


@dataclass
class Call:
    """One call's arguments, every one checked (check_call); stream: the launch stream."""

    ta: Tensor
    tb: Tensor
    bias_ptr: int
    bias_kind: int
    tout: Tensor | None  # the caller's out= (None: a new output)
    stream: int
    bias_span: int = 0  # bytes the bias covers


def check_call(a, b_shard, *, n: int, k: int, dtype: DType, b_layout: str, device: int, world: int, max_m: int | None = None,
               bias=None, out=None, stream=None) -> Call:
    """Every check of one call (shared by the op object and the functional form, which runs it
    before building or growing an op: a collective step). No CUDA call for CuPy and torch inputs
    until the checks pass; then the launch stream is resolved."""
    s = intake_stream(stream, (a, b_shard, bias, out))
    ta = check_matrix(as_tensor(a, "a", stream=s, accept=DTYPES), "a", dtypes=(dtype,), device=device, shape=(None, k), ld_ok=True)
    bshape = (n, k) if b_layout == "nk" else (k, n)
    tb = check_matrix(as_tensor(b_shard, "b_shard", stream=s, accept=DTYPES), "b_shard", dtypes=(dtype,), device=device,
                      shape=bshape, ld_ok=True)
    m = ta.shape[0]
    m_loc = check_m(m, max(m, 1) if max_m is None else max_m, world)
    tbias, bias_ptr, bias_kind = engine.bias_args(bias, n, dtype, device, s, op="gemm_rs")
    inputs = {"a": ta, "b_shard": tb} | ({"bias": tbias} if tbias is not None else {})
    tout = None if out is None else check_out(out, "out", shape=(m_loc, n), dtype=dtype, device=device, inputs=inputs, stream=s)
    if s is None:
        s = resolve_stream(None, [t for t in (ta, tb, tbias, tout) if t is not None])
    return Call(ta, tb, bias_ptr, bias_kind, tout, s, fastpath.span(tbias))


@dataclass(frozen=True)
class RsPlan:
    """Everything a call of a given m launches but the pointers of a, b, out and bias."""

    m: int
    m_loc: int
    cfg: GemmConfig
    rows_per_owner: int  # tile rows of each owner (padded to whole clusters)
    per_owner: int  # cluster tiles of each owner (T)
    clusters: int  # the grid's clusters (G): also the own tiles' delay
    own_delay: int
    params: bytes  # GemmParams
    a_tail: int  # rows of A's tail box, for the owner tiling (GemmParams::a_tail_rows, and the tail map's box)
    fields: tuple[int, ...]  # the call record's fields (m, n, k ...)


def plan_call(m: int, *, n: int, k: int, dtype: DType, b_layout: str, partials: str, world: int, rank: int, dev, ctas: int,
              tiles_cap: int, config: GemmConfig | None = None, tile_ctas: int | None = None, own_delay: int | None = None,
              timeout_ns: int | None = None, tiles=None) -> RsPlan:
    """The launch plan of one call (pure). The tile is chosen for a grid of ``tile_ctas`` (default
    ctas; GemmRS passes the group's smallest, so every rank picks the same); this rank runs ``ctas``."""
    m_loc = m // world
    part_code, part_bytes = PARTIALS[partials]
    cfg = config if config is not None else choose_config(m, n, k, b_layout, dev, tile_ctas or ctas, world, part_bytes, tiles)
    cfg = replace(cfg, decomp=tune.DP, raster_n=False, ctas=ctas)
    t = cfg.tile
    lp = rows_per_owner(m_loc, t)
    tiles_n = _cdiv(n, t.bn)
    if lp * tiles_n > tiles_cap:
        raise ValueError(f"gemm_rs: tile {t.tag()} needs {lp * tiles_n} flags per source at m={m}, the op holds {tiles_cap}")
    per_owner = per_owner_tiles(m_loc, n, t)
    clusters = max(1, min(min(ctas, dev.sms) // t.cluster_size, world * per_owner))
    delay = clusters if own_delay is None else int(own_delay)
    if delay < 0:
        raise ValueError(f"gemm_rs: own_delay={own_delay} must be >= 0 (positions an own tile moves later)")
    kb, _, _ = tune.split_plan(k, 1)
    if timeout_ns is None:
        from .. import env

        timeout_ns = int(env.wait_timeout_s() * 1e9)
    a_tail = a_tail_rows(t, m, world)
    params = engine.GEMM_PARAMS.pack(
        m, n, k, world * lp, tiles_n, kb, 1, kb, max(1, cfg.group), 0, world, rank, 0,
        tune.a_box_rows(t, m), a_tail, 0, 0, delay, 0, 0, timeout_ns,
    )
    fields = (m, n, k, DTYPE_CODE[dtype], _LAYOUT_CODE[b_layout], part_code, t.bm, t.bn, t.cluster_m, t.cluster_n, t.consumers)
    return RsPlan(m, m_loc, cfg, lp, per_owner, clusters, delay, params, a_tail, fields)


# ------------------------------------------------------------------------------------------------
# kernel names and registration (python -m rawflux.check_kernels compiles every variant)


def rs_epilogue(partials: str) -> str:
    return f"{engine.abi.RS_EPILOGUE_PREFIX}{PARTIALS[partials][0]}>"


RS_SCHED = "rawflux::RsSched"


def gemm_kernel_name(tile: TileConfig, dtype: DType, b_layout: str, partials: str) -> str:
    return engine.kernel_name(tile, dtype, dtype, b_layout, sched=RS_SCHED, epilogue=rs_epilogue(partials))


def _register_variants() -> None:
    for dt in DTYPES:
        for partials in (dt.tag, "fp32"):
            for layout in B_LAYOUTS:
                for t in rs_tiles(layout):
                    register(KERNEL_FILE, gemm_kernel_name(t, dt, layout, partials), archs=("sm_90a",))


_register_variants()


# ------------------------------------------------------------------------------------------------
# the op object


class GemmRS(RowParallelOp):
    """GEMM-ReduceScatter sized once. Collective construction (every rank, same arguments):

        op = GemmRS(group, max_m, n, k, dtype, b_layout="nk")
        out = op(a, b_shard, bias=None, out=None, stream=None)     # a (m, k), out (m/W, n)

    max_m: largest m of any call (each call's m must be a multiple of W); n: output columns; k: a's
    columns on each rank (the local share of the model's k); dtype: bf16 or f16. partials: the
    output's type (default) or "fp32" (see the module docstring). config: a fixed GemmConfig for
    every call (tests, benchmarks; its decomposition is ignored). ctas: CTAs of this rank's grid
    (default: every SM). Buffers: 2 * max_m * n * (2 or 4) bytes of receive slots and a few flags
    per tile per rank. Tuning: ``op.tune(m)`` (collective), or RAWFLUX_TUNE=on at the first call of
    each m; a stored result is used where every rank holds it (RAWFLUX_TUNE=cached, the default).
    """

    OP_NAME = "gemm_rs"
    OP_ID = OP_GEMM_RS
    META_FIELDS = ("m", "n", "k", "dtype", "b_layout", "partials", "tile_m", "tile_n", "cluster_m", "cluster_n", "consumers")

    def __init__(self, group, max_m: int, n: int, k: int, dtype, b_layout: str = "nk", *, partials: str | None = None,
                 config: GemmConfig | None = None, ctas: int | None = None, own_delay: int | None = None):
        group = resolve_group(group)
        self.dtype, self.partials = check_op_args(group.world, max_m, n, k, dtype, b_layout, partials)
        self.max_m, self.n, self.k, self.b_layout = int(max_m), int(n), int(k), b_layout
        if config is not None:
            if not isinstance(config, GemmConfig):
                raise TypeError(f"GemmRS: config must be a rawflux.tune.GemmConfig, got {type(config).__name__}")
            if group.world > 1 and config.tile not in rs_tiles(b_layout):
                raise ValueError(f"GemmRS: config tile {config.tile.tag()} is not a GEMM-RS variant for layout {b_layout!r} "
                                 f"(use one of {', '.join(t.tag() for t in rs_tiles(b_layout))})")
        super().__init__(group, side_streams=0)
        self._configure(config, own_delay, ctas)
        if self.world == 1:
            return
        part_code, part_bytes = PARTIALS[self.partials]
        # Every rank must build the same op: compare the arguments (bounded) before allocating.
        mine = (self.max_m, self.n, self.k, DTYPE_CODE[self.dtype], _LAYOUT_CODE[b_layout], part_code)
        got = bounded_allgather(self.group, mine + (_device_key(self.device_id), self.ctas), "GemmRS construction")
        check_same_args(got, ("max_m", "n", "k", "dtype", "b_layout", "partials"), "GemmRS")
        # Every rank picks the same tile (the flag layout and the call check depend on it) while each
        # runs its own grid (an SM cap under MPS may differ): the tile is chosen for the smallest.
        self.tile_ctas = min(v[-1] for v in got)
        # Ranks sharing a GPU (the emulated node, under MPS) split its SMs, and pairs of CTAs of
        # two ranks' clusters need not fit beside each other in its GPCs: no cluster tiles there,
        # since every CTA of every rank must be resident at once.
        self.shares_gpu = len({v[-2] for v in got}) < self.world
        if self.shares_gpu and config is None:
            self._tiles = [t for t in self._tiles if t.cluster_size == 1]
        self.recv = self.symmetric(recv_bytes(self.max_m, self.n, part_bytes), "recv")
        self.sync = self.symmetric(sync_bytes(self.world, self.tiles_cap), "sync")
        if config is None:
            self.agree_stored()  # the stored tunings every rank holds (one bounded exchange)

    def _configure(self, config: GemmConfig | None, own_delay: int | None, ctas: int | None) -> None:
        """This rank's part of the construction, once the group's is done (rawflux/bench/rs_local.py
        calls it for ranks without a group): device, grid, tiles, plan cache; no buffers yet."""
        self.config = config
        self.own_delay = own_delay
        self.dev = engine.check_arch(self.device_id) if self.world > 1 else tune.device_info(self.device_id)
        self.ctas = int(ctas) if ctas is not None else self.dev.sms
        if not 1 <= self.ctas <= self.dev.sms:
            raise ValueError(f"GemmRS: ctas={ctas} must be in 1..{self.dev.sms} (this device has {self.dev.sms} SMs)")
        self.tile_ctas = self.ctas
        self._tiles = [config.tile] if config is not None else list(rs_tiles(self.b_layout))
        self.tiles_cap = tiles_cap_for(self.max_m, self.world, self.n, self._tiles)
        self._plans: dict[int, tuple] = {}
        self._plans_lock = threading.Lock()
        self._forced: dict[int, GemmConfig] = {}  # per m: a tuned (or being timed) configuration
        self.last_tune: list = []  # the rows of this op's latest tuning run
        self.recv = self.sync = None

    # --- planning -------------------------------------------------------------------------------
    def plan(self, m: int) -> RsPlan:
        """The fused kernel's launch plan for calls of this m (cached). World 1 has none: it runs
        rawflux.gemm's plan."""
        if self.world == 1:
            raise ValueError("GemmRS.plan: world 1 runs the plain GEMM (rawflux.gemm's configuration), not the fused kernel")
        return self._plan_entry(m)[0]

    def _plan_entry(self, m: int):
        hit = self._plans.get(m)
        if hit is not None:
            return hit
        check_m(m, self.max_m, self.world)
        config = self.config or self._forced.get(m) or self._stored(m)
        p = plan_call(m, n=self.n, k=self.k, dtype=self.dtype, b_layout=self.b_layout, partials=self.partials, world=self.world,
                      rank=self.rank, dev=self.dev, ctas=self.ctas, tiles_cap=self.tiles_cap, config=config,
                      tile_ctas=self.tile_ctas, own_delay=self.own_delay, timeout_ns=self.pipeline_timeout_ns(), tiles=self._tiles)
        gplan = engine.plan(p.cfg, m, self.n, self.k, dtype=self.dtype, b_layout=self.b_layout, out_dtype=self.dtype,
                            device_id=self.device_id, stream=0, relpath=KERNEL_FILE, sched=RS_SCHED,
                            epilogue=rs_epilogue(self.partials))
        t = p.cfg.tile
        if t.cluster_size > 1:
            # Own tiles wait on peers' tiles at earlier positions: every cluster of the grid must be
            # resident at once, and GPCs with an odd SM count hold fewer pairs than SMs / 2.
            fit = max_active_clusters(gplan.kernel, gplan.threads, gplan.smem, t.cluster_size)
            if fit < p.clusters:
                p = plan_call(m, n=self.n, k=self.k, dtype=self.dtype, b_layout=self.b_layout, partials=self.partials,
                              world=self.world, rank=self.rank, dev=self.dev, ctas=fit * t.cluster_size, tiles_cap=self.tiles_cap,
                              config=p.cfg, own_delay=self.own_delay, timeout_ns=self.pipeline_timeout_ns())
        # A's tail box follows the owner tiling (RsPlan.a_tail), not the plain tiling engine.plan assumed
        gplan = replace(gplan, params=p.params, grid=p.clusters * t.cluster_size, a_tail=p.a_tail)
        maps = b"".join(self._recv_map(o, p.m_loc) for o in range(self.world))
        maps += _ZERO_MAP * (MAX_WORLD - self.world)
        record = call_record(p.fields)
        peers = lambda ptrs: list(ptrs) + [0] * (MAX_WORLD - len(ptrs))  # noqa: E731
        tail = EPI_TAIL.pack(self.recv.ptr, self.sync.ptr, self.group_ctrl_ptr, 0, *peers(self.recv.peer_ptrs),
                             *peers(self.sync.peer_ptrs), 0, p.m_loc, self.tiles_cap, self.rank, self.world, self.max_m // self.world,
                             *record)
        rest = maps + tail  # Params past the out map, padded to sizeof(Params)
        entry = (p, gplan, rest + bytes(EPI_PARAMS_BYTES - 128 - len(rest)))
        with self._plans_lock:
            self._plans[m] = entry
        return entry

    def _recv_map(self, owner: int, m_loc: int) -> bytes:
        """Rank `owner`'s receive buffer as the 3-D (n, m_loc, 2W) tensor of 16-bit partials, slots max_m / W rows apart."""
        if self.partials == "fp32":
            return _ZERO_MAP
        return tensor_map_3d(self.recv.peer_ptrs[owner], engine.abi.TMAP_CODE[self.dtype], self.n, m_loc, 2 * self.world,
                             self.max_m // self.world, 64, 64)

    # --- tuning (RAWFLUX_TUNE; rawflux/tune/collective.py) -----------------------------------------
    def _tune_id(self, m: int) -> str:
        shape = {"m": m, "n": self.n, "k": self.k, "layout": self.b_layout, "partials": self.partials, "ctas": self.tile_ctas}
        return self.tune_key(shape, self.dtype.tag)

    def _config_ok(self, cfg: GemmConfig) -> bool:
        return cfg.tile in self._tiles  # not, e.g., a cluster tile where ranks share a GPU

    def tune_candidates(self, m: int, top: int = 6) -> list[GemmConfig]:
        """The model's pick first, then the other GEMM-RS tiles by the model's time, `top` in all."""
        part_bytes = PARTIALS[self.partials][1]
        pick = lambda tiles: choose_config(m, self.n, self.k, self.b_layout, self.dev, self.tile_ctas, self.world, part_bytes, tiles)  # noqa: E731
        first = pick(self._tiles)
        rest = []
        for t in self._tiles:
            if t == first.tile or not t.supports(self.b_layout) or t.cluster_size > self.tile_ctas:
                continue
            c = pick([t])
            m_eff = self.world * rows_per_owner(m // self.world, t) * t.bm
            rest.append((tune.estimate_us(m_eff, self.n, self.k, c, self.dev, out_bytes=part_bytes), c))
        return [first] + [c for _, c in sorted(rest, key=lambda x: x[0])][: max(0, top - 1)]

    def warmup(self, ms) -> None:
        """Compile and load the kernels for calls of these m (do it before a graph capture)."""
        for m in ms:
            if self.world > 1:
                self._plan_entry(int(m))
            else:
                self._local_plan(int(m), None)

    # --- the call (rawflux/ops/_row_parallel.py) --------------------------------------------------
    def out_rows(self, m: int) -> int:
        return m // self.world

    def _check_m(self, m: int) -> None:
        check_m(m, self.max_m, self.world)

    def _check_call(self, a, b_shard, bias, out, stream) -> Call:
        return check_call(a, b_shard, n=self.n, k=self.k, dtype=self.dtype, b_layout=self.b_layout, device=self.device_id,
                          world=self.world, max_m=self.max_m, bias=bias, out=out, stream=stream)

    def _call_fields(self, head) -> tuple[int, ...]:
        return head.fields


# ------------------------------------------------------------------------------------------------
# the functional form


def _make_op(group, key, capacity):
    n, k, dt, b_layout, partials = key
    return GemmRS(group, capacity, n, k, dt, b_layout, partials=partials)


_ops = OpCache(_make_op, lambda op: op.max_m)


def shared_op(group, n: int, k: int, dtype: DType, b_layout: str, partials: str, need: int, *, stream: int | None = None) -> GemmRS:
    """The cached op object for these parameters (partials resolved), grown collectively to at
    least ``need`` rows: the functional form's, and rawflux.nn's."""
    return _ops.get(group, (int(n), int(k), dtype, b_layout, partials), max(int(need), group.world), stream=stream, round_to=group.world)


def gemm_rs(a, b_shard, group=None, *, b_layout: str = "nk", bias=None, out=None, stream=None, partials: str | None = None):
    """Fused GEMM-ReduceScatter on rank r of the group (default: the current one, rawflux.init()).

    a: (m, k) this rank's columns of the activations; b_shard: (n, k) ("nk") or (k, n) ("kn");
    bias: (n,) in a's dtype or f32, added once after the reduction; out: (m/W, n) in a's dtype.
    Returns rows r*m/W .. (r+1)*m/W of sum_q a_q @ b_q^T (+ bias), in the caller's framework.
    m must be a multiple of W. An op object (GemmRS) is built per (n, k, dtype, layout, partials)
    on first use and grown collectively when m exceeds its capacity; use GemmRS directly to size
    buffers once (and before capturing a CUDA graph).
    """
    def build(group, ta, tb, n, k, partials, stream):
        m = ta.shape[0]
        check_m(m, max(m, 1), group.world)
        dt, partials = check_op_args(group.world, m, n, k, ta.dtype, b_layout, partials)  # what building the op would refuse
        c = check_call(ta, tb, n=n, k=k, dtype=dt, b_layout=b_layout, device=group.device_id, world=group.world, bias=bias, out=out,
                       stream=stream)
        return shared_op(group, n, k, dt, b_layout, partials, m, stream=c.stream), c

    return functional("gemm_rs", _fn_ops, build, a, b_shard, group, b_layout=b_layout, bias=bias, out=out, stream=stream,
                      partials=partials)


_fn_ops = FunctionalFast()  # the functional form's fast path


def clear_cache() -> None:
    """Close the op objects the functional form made (collective)."""
    _fn_ops.clear()
    _ops.clear()

