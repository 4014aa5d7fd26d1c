"""rawflux.gemm_ar: GEMM + AllReduce fused into the GEMM (row-parallel layers at decode).

On rank r of W: a (m, k) is this rank's columns of the activations (k = the local share of the
model's k), b_shard (n, k) ("nk", a linear layer's weight shard, default) or (k, n) ("kn"). The
result on every rank is out (m, n) = sum_q a_q @ b_q^T (+ bias), the same bits on every rank.

One kernel per call, one-shot: the GEMM engine with the data-parallel tile order and GEMM +
AllReduce's epilogue (cuda_src/rawflux/fused/ar_epilogue.cuh):
  * every rank computes its partial of every tile and sends it, rounded to the output's 16-bit
    type (or fp32 with partials="fp32"), to its receive slot on every rank, its own included
    (TMA bulk stores of the staged boxes), then raises the tile's flag on every peer;
  * it then waits (bounded) for the W - 1 peers' flags of the same tile and sums the W partials in
    the fixed order q = 0..W-1 in fp32 (its own from its own slot, as sent), adds the bias,
    rounds once and stores: the same inputs in the same order on every rank, so the same bits;
  * calls are numbered on the device (epoch) and the buffers double-buffered by its parity, so a
    call needs no barrier; every rank's call record is pushed to its peers and checked before any
    partial is read (CallMismatch), and a missing rank ends every wait within
    RAWFLUX_WAIT_TIMEOUT_S (CollectiveTimeout), raised at the next call or by synchronize();
  * world 1: no communication, the plain GEMM stores straight into out.
Each rank sends (W - 1) m n partials: meant for decode and small prefill (m up to a few hundred),
where the GEMM is one wave and GEMM-RS + AllGather would pay two latencies. For large m use
gemm_rs (and ag_gemm), whose traffic does not grow with W. `python -m rawflux.plan gemm_ar` models
one-shot against two-shot and cuBLAS + NCCL.

Calls of one op object must be ordered on the device (one stream, or streams joined by events).
Capturable in a CUDA graph (pass ``out=``; make the first call of each m before capturing).
Constraints: bf16 or f16; n and k multiples of 8; W <= 8 ranks of one node; every CTA of every
rank resident at once (a persistent grid; under the emulated node each rank gets its share of
the SMs).
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, replace

from .. import engine, tune
from ..dist.layout import OP_GEMM_AR
from ..engine.launch import tensor_map_3d
from ..jit import register
from ..runtime import DType, Tensor, as_tensor, check_matrix, check_out, fastpath, intake_stream, resolve_stream
from ..tune import GemmConfig, TileConfig
from ._collective import DTYPE_CODE, FunctionalFast, OpCache, bounded_allgather, call_record as _call_record, resolve_group
from ._row_parallel import B_LAYOUTS, DTYPES, RowParallelOp, check_same_args, functional
from ._row_parallel import check_op_args as _check_op_args
# GEMM + AllReduce keeps GEMM-RS's buffer layout (fused/rs_layout.cuh) and epilogue parameter layout
from .gemm_rs import (EPI_PARAMS_BYTES, EPI_TAIL, MAX_WORLD, PARTIALS, _LAYOUT_CODE, _ZERO_MAP, _device_key, flag_offset, record_offset,
                      slot_row, sync_bytes)

__all__ = ["GemmAR", "gemm_ar", "shared_op", "ar_tiles", "choose_config", "check_op_args", "recv_bytes", "tiles_cap_for",
           "flag_offset", "record_offset", "slot_row", "sync_bytes", "ar_epilogue", "gemm_kernel_name"]

KERNEL_FILE = "gemm_ar.cu"
AR_SCHED = engine.abi.FUSED_SCHED


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def recv_bytes(max_m: int, world: int, n: int, part_bytes: int) -> int:
    """Receive slots: (parity, source) x max_m rows x n partials."""
    return 2 * world * max_m * n * part_bytes


def ar_epilogue(partials: str) -> str:
    return f"{engine.abi.AR_EPILOGUE_PREFIX}{PARTIALS[partials][0]}>"


def gemm_kernel_name(tile: TileConfig, dtype: DType, b_layout: str, partials: str) -> str:
    return engine.kernel_name(tile, dtype, dtype, b_layout, sched=AR_SCHED, epilogue=ar_epilogue(partials))


@functools.cache
def ar_tiles(b_layout: str, partials: str = "bf16") -> tuple[TileConfig, ...]:
    """The tiles GEMM + AllReduce compiles: staged 16-bit boxes (whole 64-column boxes per
    warpgroup), no cluster (one CTA per tile: every CTA of every rank must be resident, and at
    decode one tile row leaves multicast nothing to share), fewer than 128 accumulators a thread
    (fewer than 96 with fp32 partials, whose register stores spill beside 96)."""
    acc_max = 96 if partials == "fp32" else 128
    out = []
    for t in tune.tiles_for(b_layout):
        if t.cluster_size > 1 or t.cluster_k > 1 or t.wn % 64 or t.wn // 2 >= acc_max:
            continue
        if engine.kernel_options(t, engine.NOWAIT, ar_epilogue("bf16"), DType.BF16).store_bufs == 0:
            continue
        out.append(t)
    return tuple(out)


def tiles_cap_for(max_m: int, n: int, tiles) -> int:
    """Flags per (parity, source): tiles of the largest call, for every tile shape."""
    return max(_cdiv(max_m, t.bm) * _cdiv(n, t.bn) for t in tiles)


def choose_config(m: int, n: int, k: int, b_layout: str, dev, ctas: int, part_bytes: int = 2, tiles=None) -> GemmConfig:
    """The GEMM configuration of one call: data-parallel on `ctas` CTAs, the tile by the engine's
    time model. A pure function of its arguments, so every rank picks the same (the kernel checks
    the call records)."""
    best, best_t = None, float("inf")
    for t in tiles or ar_tiles(b_layout, "fp32" if part_bytes == 4 else "bf16"):
        if not t.supports(b_layout):
            continue
        cfg = GemmConfig(t, tune.DP, group=8, raster_n=False, ctas=ctas)
        us = tune.estimate_us(m, n, k, cfg, dev, out_bytes=part_bytes)
        if us < best_t - 1e-9:
            best, best_t = cfg, us
    if best is None:
        raise ValueError(f"gemm_ar: no tile configuration for layout {b_layout!r}")
    return best


def check_op_args(world: int, max_m: int, n: int, k: int, dtype, b_layout: str, partials) -> tuple[DType, str]:
    """Construction arguments (clear errors before any allocation); returns (DType, partials)."""
    return _check_op_args("GemmAR", "GEMM + AllReduce", world, max_m, n, k, dtype, b_layout, partials, rows_per_rank=False)


def check_m(m: int, max_m: int) -> None:
    if m < 1:
        raise ValueError(f"gemm_ar: a has m={m} rows; at least 1 is needed")
    if m > max_m:
        raise ValueError(f"gemm_ar: m={m} exceeds the op's capacity max_m={max_m}; build GemmAR with a larger max_m")


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


def check_call(a, b_shard, *, n: int, k: int, dtype: DType, b_layout: str, device: int, max_m: int | None = None, bias=None,
               out=None, stream=None) -> Call:
    """Every check of one call (the op object's and the functional form's, which runs it before
    building or growing an op: a collective step). No CUDA call for CuPy and torch inputs until
    the checks pass; then the launch stream is resolved."""
    s = intake_stream(stream, (a, b_shard, bias, out))
    ta = check_matrix(as_tensor(a, "a", stream=s, accept=DTYPES), "a", dtypes=(dtype,), device=device, shape=(None, k), ld_ok=True)
    bshape = (n, k) if b_layout == "nk" else (k, n)
    tb = check_matrix(as_tensor(b_shard, "b_shard", stream=s, accept=DTYPES), "b_shard", dtypes=(dtype,), device=device,
                      shape=bshape, ld_ok=True)
    m = ta.shape[0]
    check_m(m, max(m, 1) if max_m is None else max_m)
    tbias, bias_ptr, bias_kind = engine.bias_args(bias, n, dtype, device, s, op="gemm_ar")
    inputs = {"a": ta, "b_shard": tb} | ({"bias": tbias} if tbias is not None else {})
    tout = None if out is None else check_out(out, "out", shape=(m, n), dtype=dtype, device=device, inputs=inputs, stream=s)
    if s is None:
        s = resolve_stream(None, [t for t in (ta, tb, tbias, tout) if t is not None])
    return Call(ta, tb, bias_ptr, bias_kind, tout, s, fastpath.span(tbias))


for _dt in DTYPES:
    for _partials in (_dt.tag, "fp32"):
        for _layout in B_LAYOUTS:
            for _t in ar_tiles(_layout, _partials):
                register(KERNEL_FILE, gemm_kernel_name(_t, _dt, _layout, _partials), archs=("sm_90a",))


class GemmAR(RowParallelOp):
    """GEMM + AllReduce sized once. Collective construction (every rank, same arguments):

        op = GemmAR(group, max_m, n, k, dtype, b_layout="nk")
        out = op(a, b_shard, bias=None, out=None, stream=None)     # a (m, k), out (m, n)

    max_m: largest m of any call; n: output columns; k: a's columns on each rank (the local share
    of the model's k); dtype: bf16 or f16. partials: the output's type (default) or "fp32".
    config: a fixed GemmConfig for every call (tests, benchmarks; its decomposition is ignored).
    ctas: CTAs of this rank's grid (default: every SM). Buffers: 2 W max_m n (2 or 4) bytes of
    receive slots and a flag per tile per source. Tuning: ``op.tune(m)`` (collective, as
    GemmRS.tune), or RAWFLUX_TUNE=on at the first call of each m.
    """

    OP_NAME = "gemm_ar"
    OP_ID = OP_GEMM_AR
    META_FIELDS = ("m", "n", "k", "dtype", "b_layout", "partials", "tile_m", "tile_n", "consumers")

    def __init__(self, group, max_m: int, n: int, k: int, dtype, b_layout: str = "nk", *, partials: str | None = None,
                 config: GemmConfig | None = None, ctas: int | None = None):
        group = resolve_group(group)
        self.dtype, self.partials = check_op_args(group.world, max_m, n, k, dtype, b_layout, partials)
        self.max_m, self.n, self.k, self.b_layout = int(max_m), int(n), int(k), b_layout
        if config is not None:
            if not isinstance(config, GemmConfig):
                raise TypeError(f"GemmAR: config must be a rawflux.tune.GemmConfig, got {type(config).__name__}")
            tiles = ar_tiles(b_layout, self.partials)
            if group.world > 1 and config.tile not in tiles:
                raise ValueError(f"GemmAR: config tile {config.tile.tag()} is not a GEMM + AllReduce variant for layout {b_layout!r} "
                                 f"and partials {self.partials!r} (use one of {', '.join(t.tag() for t in tiles)})")
        super().__init__(group, side_streams=0)
        self._configure(config, ctas)
        if self.world == 1:
            return
        part_code, part_bytes = PARTIALS[self.partials]
        mine = (self.max_m, self.n, self.k, DTYPE_CODE[self.dtype], _LAYOUT_CODE[b_layout], part_code)
        got = bounded_allgather(self.group, mine + (_device_key(self.device_id), self.ctas), "GemmAR construction")
        check_same_args(got, ("max_m", "n", "k", "dtype", "b_layout", "partials"), "GemmAR")
        self.tile_ctas = min(v[-1] for v in got)  # every rank picks the same tile, for the smallest grid
        self.recv = self.symmetric(recv_bytes(self.max_m, self.world, self.n, part_bytes), "recv")
        self.sync = self.symmetric(sync_bytes(self.world, self.tiles_cap), "sync")
        if config is None:
            self.agree_stored()

    def _configure(self, config: GemmConfig | None, ctas: int | None) -> None:
        """This rank's part of the construction: device, grid, tiles, plan cache; no buffers yet."""
        self.config = config
        self.dev = engine.check_arch(self.device_id) if self.world > 1 else tune.device_info(self.device_id)
        self.ctas = int(ctas) if ctas is not None else self.dev.sms
        if not 1 <= self.ctas <= self.dev.sms:
            raise ValueError(f"GemmAR: ctas={ctas} must be in 1..{self.dev.sms} (this device has {self.dev.sms} SMs)")
        self.tile_ctas = self.ctas
        self._tiles = [config.tile] if config is not None else list(ar_tiles(self.b_layout, self.partials))
        self.tiles_cap = tiles_cap_for(self.max_m, self.n, self._tiles)
        self._plans: dict[int, tuple] = {}
        self._plans_lock = threading.Lock()
        self._forced: dict[int, GemmConfig] = {}
        self.last_tune: list = []
        self.recv = self.sync = None

    # --- planning -------------------------------------------------------------------------------
    def config_for(self, m: int) -> GemmConfig:
        """The configuration calls of this m run (fixed, tuned, stored or the model's pick)."""
        check_m(m, self.max_m)
        cfg = self.config or self._forced.get(m) or self._stored(m)
        if cfg is None:
            cfg = choose_config(m, self.n, self.k, self.b_layout, self.dev, self.tile_ctas, PARTIALS[self.partials][1], self._tiles)
        return replace(cfg, decomp=tune.DP, raster_n=False, ctas=self.ctas)

    def _plan_entry(self, m: int):
        hit = self._plans.get(m)
        if hit is not None:
            return hit
        cfg = self.config_for(m)
        t = cfg.tile
        if _cdiv(m, t.bm) * _cdiv(self.n, t.bn) > self.tiles_cap:
            raise ValueError(f"gemm_ar: tile {t.tag()} needs more flags than the op holds ({self.tiles_cap})")
        gplan = engine.plan(cfg, m, self.n, self.k, dtype=self.dtype, b_layout=self.b_layout, out_dtype=self.dtype,
                            device_id=self.device_id, stream=0, relpath=KERNEL_FILE, sched=AR_SCHED, epilogue=ar_epilogue(self.partials),
                            timeout_ns=self.pipeline_timeout_ns())
        part_code = PARTIALS[self.partials][0]
        fields = (m, self.n, self.k, DTYPE_CODE[self.dtype], _LAYOUT_CODE[self.b_layout], part_code, t.bm, t.bn, t.consumers)
        maps = b"".join(self._recv_map(q, m) for q in range(self.world)) + _ZERO_MAP * (MAX_WORLD - self.world)
        peers = lambda ptrs: list(ptrs) + [0] * (MAX_WORLD - len(ptrs))  # noqa: E731
        tail = EPI_TAIL.pack(self.recv.ptr, self.sync.ptr, self.group_ctrl_ptr, 0, *peers(self.recv.peer_ptrs),
                             *peers(self.sync.peer_ptrs), 0, m, self.tiles_cap, self.rank, self.world, self.max_m,
                             *_call_record(OP_GEMM_AR, fields))
        rest = maps + tail  # Params past the out map, padded to sizeof(Params)
        entry = (fields, gplan, rest + bytes(EPI_PARAMS_BYTES - 128 - len(rest)))
        with self._plans_lock:
            self._plans[m] = entry
        return entry

    def _recv_map(self, q: int, m: int) -> bytes:
        """Rank q's receive buffer (this rank's too) as the 3-D (n, m, 2W) tensor of 16-bit partials, slots max_m rows apart."""
        if self.partials == "fp32":
            return _ZERO_MAP
        return tensor_map_3d(self.recv.peer_ptrs[q], engine.abi.TMAP_CODE[self.dtype], self.n, m, 2 * self.world, self.max_m, 64, 64)

    def warmup(self, ms) -> None:
        """Compile and load the kernels for calls of these m (do it before a graph capture)."""
        for m in ms:
            if self.world > 1:
                self._plan_entry(int(m))
            else:
                self._local_plan(int(m), None)

    # --- tuning (RAWFLUX_TUNE; rawflux/tune/collective.py) -----------------------------------------
    def _tune_id(self, m: int) -> str:
        shape = {"m": m, "n": self.n, "k": self.k, "layout": self.b_layout, "partials": self.partials, "ctas": self.tile_ctas}
        return self.tune_key(shape, self.dtype.tag)

    def _config_ok(self, cfg: GemmConfig) -> bool:
        return cfg.tile in self._tiles

    def tune_candidates(self, m: int, top: int = 6) -> list[GemmConfig]:
        """The model's pick first, then the other tiles by the model's time, `top` in all."""
        part_bytes = PARTIALS[self.partials][1]
        pick = lambda tiles: choose_config(m, self.n, self.k, self.b_layout, self.dev, self.tile_ctas, part_bytes, tiles)  # noqa: E731
        first = pick(self._tiles)
        rest = []
        for t in self._tiles:
            if t == first.tile or not t.supports(self.b_layout):
                continue
            c = pick([t])
            rest.append((tune.estimate_us(m, self.n, self.k, c, self.dev, out_bytes=part_bytes), c))
        return [first] + [c for _, c in sorted(rest, key=lambda x: x[0])][: max(0, top - 1)]

    # --- the call (rawflux/ops/_row_parallel.py) --------------------------------------------------
    def out_rows(self, m: int) -> int:
        return m

    def _check_m(self, m: int) -> None:
        check_m(m, self.max_m)

    def _check_call(self, a, b_shard, bias, out, stream) -> Call:
        return check_call(a, b_shard, n=self.n, k=self.k, dtype=self.dtype, b_layout=self.b_layout, device=self.device_id,
                          max_m=self.max_m, bias=bias, out=out, stream=stream)


# ------------------------------------------------------------------------------------------------
# the functional form


def _make_op(group, key, capacity):
    n, k, dt, b_layout, partials = key
    return GemmAR(group, capacity, n, k, dt, b_layout, partials=partials)


_ops = OpCache(_make_op, lambda op: op.max_m)


def shared_op(group, n: int, k: int, dtype: DType, b_layout: str, partials: str, need: int, *, stream: int | None = None) -> GemmAR:
    """The cached op object for these parameters, grown collectively to at least ``need`` rows."""
    return _ops.get(group, (int(n), int(k), dtype, b_layout, partials), max(int(need), 1), stream=stream)


def gemm_ar(a, b_shard, group=None, *, b_layout: str = "nk", bias=None, out=None, stream=None, partials: str | None = None):
    """Fused GEMM + AllReduce on rank r of the group (default: the current one, rawflux.init()).

    a: (m, k) this rank's columns of the activations; b_shard: (n, k) ("nk") or (k, n) ("kn");
    bias: (n,) in a's dtype or f32, added once after the reduction; out: (m, n) in a's dtype.
    Returns sum_q a_q @ b_q^T (+ bias), the same bits on every rank, in the caller's framework.
    An op object (GemmAR) is built per (n, k, dtype, layout, partials) on first use and grown
    collectively when m exceeds its capacity; use GemmAR directly to size buffers once (and
    before capturing a CUDA graph).
    """
    def build(group, ta, tb, n, k, partials, stream):
        m = ta.shape[0]
        check_m(m, max(m, 1))
        dt, partials = check_op_args(group.world, max(m, 1), n, k, ta.dtype, b_layout, partials)
        c = check_call(ta, tb, n=n, k=k, dtype=dt, b_layout=b_layout, device=group.device_id, bias=bias, out=out, stream=stream)
        return shared_op(group, n, k, dt, b_layout, partials, m, stream=c.stream), c

    return functional("gemm_ar", _fn_ops, build, a, b_shard, group, b_layout=b_layout, bias=bias, out=out, stream=stream,
                      partials=partials)


_fn_ops = FunctionalFast()  # the functional form's fast path


def clear_cache() -> None:
    """Close the op objects the functional form made (collective)."""
    _fn_ops.clear()
    _ops.clear()
