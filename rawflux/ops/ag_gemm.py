"""rawflux.ag_gemm: C_r = AllGather(A) @ B_r^T with the gather hidden behind the GEMM (FLUX).

Column-parallel layer on rank r of W: ``a_shard`` (m/W, k) is this rank's rows of A; ``b`` is
this rank's weight shard, (n_local, k) for ``b_layout="nk"`` (default, a linear layer's weight)
or (k, n_local) for "kn"; the output is (m, n_local). bf16 / f16 inputs, output in the input
dtype (or f32), optional bias (n_local,) added in fp32.

Two levels:
  AGGemm(group, max_m, n, k, dtype, b_layout="nk", direction=, copy=)   the op object, sized once:
      it allocates its symmetric buffers (the gathered A, ready flags, call records) at
      construction and nothing per call; any m = W * m_local <= max_m per call.
  ag_gemm(a_shard, b, group=None, ...)   the functional form: a cache of op objects keyed by
      (group, n, k, dtype, layout, direction, copy), grown (collectively) when m exceeds them.

How a call runs (rank r, caller's stream s; the hazards of docs/ARCHITECTURE.md; ``schedule()`` is
the exact order, tests/cpu simulate it across ranks). No per-call barrier (push): each op object
numbers its calls on the device (its epoch e) and every flag carries e.
  push (default): [s] ag_local_kernel: e = epoch + 1; this rank's call record into every peer;
      arrive[r] = e at every peer (this rank's GEMM of call e - 1 has ended: stream order); the
      own rows that share a BM-row tile with a peer's -> the gathered buffer (edge_rows: a tile
      wholly inside the own chunk reads a_shard in place, through AgWait's own tensor map; every
      own row is copied on pull and where the call returns the gathered A). Then the GEMM,
      whose TMA producer waits (bounded, ld.acquire.sys) only for the chunks a tile's rows
      touch, chunk-major: row segments r, r+1,
      ... (own rows first, then in arrival order), its raster groups never spanning two chunks
      (fused_config), a row shared with chunk r-1 last (rotation); the plain GEMM's scheduler and
      decompositions (split tail, bands, narrow columns) where the model has them paying; a CTA
      whose first tile still waits loads B's first k blocks before the wait (b_first). The
      copies: for q = r-1, r-2, ...: once q has arrived at call e (its GEMM of e - 1, the last
      reader of its buffer, has ended), copy the shard into q's rows [r*m/W, (r+1)*m/W) (a permutation per step: no two
      ranks write one peer at once; chunk r+1 reaches rank r first), then set q's ready[r] = e.
      Every peer's record is compared with this rank's (CallMismatch) before any copy moves data.
  pull: [s] group barrier (no peer still reads this rank's own rows of call e - 1); ag_local_kernel
      (as above, announcing the call once the own rows are in place); the copies read rank q's
      own rows of its buffer (q = r+1, r+2, ...) once q has arrived, into the same rows of this
      rank's, then set this rank's ready[q].
  copy path "ce": cudaMemcpyAsync between IPC-mapped buffers (copy engines, no SM) on side streams
      forked after ag_local_kernel, whose last CTA first waits for every peer's arrival (the copies
      cannot wait themselves) and compares its record; a flag is a 4-byte copy of the
      device-resident epoch word (so CUDA-graph replays stay right). Two launches a call.
  copy path "sm": one copy kernel of R CTAs (RAWFLUX_AG_COPY_SMS, default min(16, SMs/4)) does
      the same chunk loop, each chunk once its peer has arrived, and compares the records at its
      end; the GEMM, on SMs - R CTAs, follows it as its programmatic dependent (PDL), so it starts
      only once every copy CTA is resident (hazard 1: a copy kernel on a side stream was seen to
      get no SM while the GEMMs spun, under MPS). Three launches a call, no side streams.
  copy mode "auto" (the default between GPUs): each m takes the path whose call the model has
      ending first (pick_copy, ``op.path(m)``): "ce" costs the host two driver calls per peer,
      "sm" three launches at any world but the copy kernel's SMs, so decode sizes, where the host
      decides, go "sm" and the rest "ce". The pick depends on m and the op alone, so every rank
      makes it alike, and the call record carries it.
k-slabs (``slabs(m)``, S = 1, 2, 4 or 8): each chunk goes as S column slabs of k / S, slab 0 to
every peer first, each slab with its own flag; the GEMM's producer waits for a tile's slab j only
before its first k block of slab j (one wait covers every slab already landed), so where one wave
holds every chunk a tile starts on the first slab instead of the whole chunk. On "ce" every slab
costs the host two driver calls per peer, so an eager call's S is picked on the longer of the GEMM
and the host's issue time (ce_issue_us); a call made inside ``op.capture`` counts the GEMM alone.
Why one gathered buffer suffices: a rank writes a peer's rows of call e only after that peer
arrived at call e, i.e. after the peer's GEMM of e - 1 ended (tests/cpu/test_ag_protocol.py, the
gated one-slot variant); its own rows only after its own GEMM of e - 1 ended (stream order).
The side streams read a_shard and are joined into s before the call returns, so a caching
allocator (torch's) that reuses a_shard's memory for later work on s, or on its own stream after
the caller's record_stream(s), sees the reads complete: nothing of the side streams outlives s.
World 1: no communication; the call is rawflux.gemm on a_shard.

The gathered A: ``return_gathered=True`` returns (out, gathered). Without ``gathered_out`` it is a
VIEW of this rank's symmetric buffer (no copy), valid until the next call of the same op object
(the functional form: the next ag_gemm call with the same n, k, dtype, layout); with
``gathered_out=`` the gathered A is copied there (after the GEMM, on the call's stream). At world 1
the gathered A is a_shard itself.

Errors: every bad argument raises before any CUDA call, launch or collective step (the functional
form checks before it builds or grows an op: check_call). A rank that calls with another shape,
another op object, or not at all makes the others fail within RAWFLUX_WAIT_TIMEOUT_S (device-side
bounded waits and a device-side comparison of the call records; the functional form's bounded
agreement when it grows); the error (CollectiveTimeout or its subclass CallMismatch, naming the
ranks and the field) is raised at the next call's start or by ``op.synchronize()`` /
``Group.synchronize()``. Calls of one op object must be ordered on the device (one stream, or
streams joined by events).
"""
from __future__ import annotations

import struct
import threading
from dataclasses import dataclass, replace

from .. import engine, env, tune
from ..dist.layout import MAX_WORLD, OP_AG_GEMM
from ..jit import register
from ..runtime import (DType, Tensor, as_tensor, check_matrix, check_out, fastpath, intake_stream, new_output, resolve_stream,
                       wrap_output)
from ..tune import GemmConfig
from ..tune.ag_order import (SLAB_CHOICES, ag_units, arrival_us, chunk_span, cut_tiles_wait_us, pick_slabs, rotation,
                             row_shift)
from .gemm import gemm
from ._collective import DTYPE_CODE, META_SLOT_BYTES, FunctionalFast, CollectiveOp, OpCache, resolve_group, scratch_matrix

__all__ = ["AGGemm", "ag_gemm", "cached_op", "clear_cache", "shared_op", "schedule", "push_targets", "pull_sources", "arrival_order",
           "chunk_span", "default_copy_sms", "chunk_group", "fused_config", "rotation", "slab_count", "ready_index", "ce_issue_us"]

KERNEL_FILE = "ag_gemm.cu"
PROLOGUE = "rawflux::AgWait"
# The GEMM's scheduler per B layout: with B (n, k) the plain GEMM's (split-K, stream-K, split tail,
# bands; narrow columns: engine.plan picks NarrowSched); with B (k, n) data-parallel only: the
# stream-K scheduler's state spills 4 B in the k-slab producer of the kn 2x1 pair tiles.
SCHEDS = {"nk": engine.PLAIN_SCHED, "kn": engine.FUSED_SCHED}
LOCAL_KERNEL = "rawflux::ag_local_kernel"
COPY_KERNEL = "rawflux::ag_copy_kernel"
LOCAL_THREADS = 256
COPY_THREADS = 512
DTYPES = (DType.BF16, DType.F16)
DIRECTIONS = {"push": 0, "pull": 1}  # kAgPush / kAgPull
COPIES = {"ce": 0, "sm": 1}  # a call's copy path (its call record's field)
COPY_MODES = ("ce", "sm", "auto")  # an op's: "auto" picks "ce" or "sm" per m (pick_copy)
B_LAYOUTS = ("nk", "kn")

# Byte layouts of the kernel parameters (cuda_src/rawflux/fused/ag_gemm.cuh); tests/cpu checks
# them against the CUDA structs with NVRTC static_asserts.
# AgWait::Params is its own_map (a CUtensorMap, 128 bytes) followed by AG_WAIT_PARAMS (wait_params).
OWN_MAP_BYTES = 128
AG_WAIT_PARAMS = struct.Struct("<QQQiiiiii16x")  # group_ctrl, ready, epoch, m_local, rank, world, slab_kb, b_first, own_rows, (pad to 64)
AG_LOCAL_ARGS = struct.Struct("<QQQQQqiiIiii")  # AgLocalArgs: group_ctrl, src, dst, sync, sync_peers, src_pitch, m_local, row_vecs, flags, head, tail, pad
AG_COPY_ARGS = struct.Struct("<QQQQQQqiiii")  # AgCopyArgs: group_ctrl, src, gath_peers, sync, sync_peers, counters, src_pitch, m_local, row_vecs, mode, slabs
CALL_RECORD = struct.Struct("<16I")  # CallRecord (comm/call_record.cuh)
LOCAL_ARRIVE_LATE, LOCAL_GATE = 1, 2  # kAgArriveLate, kAgGate

# The op's sync buffer (fused/ag_gemm.cuh kAg*Offset; tests/cpu checks them against the CUDA enums).
MAX_SLABS = 8  # kAgMaxSlabs: k-slabs per chunk at most
EPOCH_OFFSET, LOCAL_DONE_OFFSET, ARRIVE_OFFSET = 0, 64, 128
READY_OFFSET = ARRIVE_OFFSET + 4 * MAX_WORLD  # u32 ready[MAX_WORLD][MAX_SLABS]
RECORDS_OFFSET = READY_OFFSET + 4 * MAX_WORLD * MAX_SLABS
SYNC_BYTES = RECORDS_OFFSET + 2 * MAX_WORLD * META_SLOT_BYTES
COPY_COUNTERS = 2 + MAX_WORLD * MAX_SLABS  # kAgCopyCounters: ag_copy_kernel's claim, per-block and exit counters
LINK_GBPS = 370.0  # the link the k-slab choice assumes (an H200's NVLink, one direction; rawflux.plan's default)
CE_CALL_US = 5.0  # host us per driver call of the "ce" path (a copy, an event): host-cost.json's cuda memcpyAsync rows (4.8-5.4)


def sm_issue_us(barrier: bool = False) -> float:
    """The host's time to issue one "sm" call: three launches (the call's start, the copy kernel,
    the GEMM) and pull's barrier, at CE_CALL_US each (a launch costs the host about a copy)."""
    return CE_CALL_US * (3 + int(barrier))


def pick_copy(gemm_ce_us: float, gemm_sm_us: float, world: int, sides: int = 1, barrier: bool = False) -> str:
    """The copy path an "auto" op gives calls whose GEMM the model times at gemm_ce_us on every
    SM the "ce" path leaves it and gemm_sm_us beside the copy kernel: the one whose call ends first,
    a call lasting the longer of the host's issue time and the GEMM. "ce" costs the host two
    driver calls per peer (ce_issue_us) but no SM, "sm" three launches at any world but copy_sms
    SMs: at decode sizes the host decides ("sm"), from where the GEMM outlasts the host's copies
    on, the SMs do ("ce"). Ties go to "ce"."""
    ce = max(gemm_ce_us, ce_issue_us(world, 1, sides, barrier))
    sm = max(gemm_sm_us, sm_issue_us(barrier))
    return "sm" if sm < ce else "ce"


def ce_issue_us(world: int, slabs: int, sides: int = 1, barrier: bool = False) -> float:
    """The host's time to issue one "ce" call: a copy and a flag per (peer, slab), the two
    launches (and pull's barrier), the fork (one record, a wait per side stream) and the join (a
    record and a wait per side stream), at CE_CALL_US each."""
    return CE_CALL_US * (2 * slabs * (world - 1) + 3 + 3 * sides + int(barrier))


def wait_params(own_map: bytes, *fields) -> bytes:
    """AgWait::Params: the own rows' map (zeros where no tile reads them in place), then AG_WAIT_PARAMS's fields."""
    return bytes(own_map) + AG_WAIT_PARAMS.pack(*fields)


def edge_rows(m_local: int, rank: int, bm: int) -> tuple[int, int]:
    """(head, tail): the own rows the call's start copies into the gathered buffer when the GEMM
    reads the rest in place, [0, head) and [tail, m_local): those in a BM-row tile that also holds
    a peer's rows or runs past m (AgWait::own_tile: a tile wholly inside the own chunk reads the shard)."""
    r0, r1 = rank * m_local, (rank + 1) * m_local
    first = min(-(-r0 // bm) * bm, r1)  # the first own tile's first row
    last = max(first, r1 // bm * bm)  # past the last own tile
    return first - r0, last - r0


def ready_index(chunk: int, slab: int = 0) -> int:
    """The ready flag of slab ``slab`` of chunk ``chunk`` (ag_ready_index; slab 0: the whole chunk without slabs)."""
    return chunk * MAX_SLABS + slab

# Every variant a call can launch (python -m rawflux.check_kernels compiles them on the CPU).
for _layout, _sched in SCHEDS.items():
    engine.register_variants(KERNEL_FILE, sched=_sched, prologue=PROLOGUE, epilogue=engine.plain_epilogue, dtypes=DTYPES, layouts=(_layout,))
for _w in tune.NARROW_WIDTHS:  # narrow columns, as the plain GEMM has them: its 128x256 pair, B (n, k), 16-bit C
    for _dt in DTYPES:
        engine.register_variants(KERNEL_FILE, sched=engine.narrow_sched(_w), prologue=PROLOGUE, epilogue=engine.TMA_STORE_EPI,
                                 tiles=tune.NARROW_TILES, dtypes=(_dt,), layouts=("nk",), out_dtypes=(_dt,))
register(KERNEL_FILE, LOCAL_KERNEL, archs=("sm_90a",))
register(KERNEL_FILE, COPY_KERNEL, archs=("sm_90a",))


# --------------------------------------------------------------------------------------------
# the protocol as data (pure Python; tests/cpu simulate it across ranks)


def push_targets(rank: int, world: int) -> list[int]:
    """Push order: step s = 1..W-1 writes this rank's shard into rank (rank - s) mod W. For every
    s the map rank -> target is a permutation (no two ranks write one peer at once), and every
    rank receives chunk rank+1 first, then rank+2, ... (the GEMM's upward rotation)."""
    return [(rank - s) % world for s in range(1, world)]


def pull_sources(rank: int, world: int) -> list[int]:
    """Pull order: step s reads rank (rank + s) mod W's shard (a permutation per step too)."""
    return [(rank + s) % world for s in range(1, world)]


def arrival_order(rank: int, world: int) -> list[int]:
    """Chunks in the order they land on ``rank`` (both directions) and the GEMM visits them: own
    first (never waited for: read in place or copied before the GEMM starts), then rank+1, rank+2, ..."""
    return [(rank + s) % world for s in range(world)]


def default_copy_sms(sms: int) -> int:
    """SMs the "sm" copy path takes: RAWFLUX_AG_COPY_SMS, else min(16, SMs // 4), at least 1 and
    leaving the GEMM at least one SM."""
    want = env.ag_copy_sms()
    r = want if want is not None else min(16, sms // 4)
    return max(1, min(r, sms - 1))


def chunk_group(m_local: int, tile, group: int) -> int:
    """The raster group (tile rows walked along n) of the fused GEMM's chunk-major order: as
    tall as ``group`` at most and, where a chunk is a whole number of cluster-tile rows, a divisor
    of that number, so no group spans two chunks and a wave's tiles read the chunks that have
    arrived (own first, then in arrival order) instead of waiting for later ones."""
    rows = m_local // (tile.bm * tile.cluster_m)
    if rows < 1:
        return 1  # a tile spans several chunks anyway (decode)
    if m_local % (tile.bm * tile.cluster_m):
        return max(1, min(group, rows))  # chunk edges fall inside tiles: about one chunk per group
    return max(d for d in range(1, min(group, rows) + 1) if rows % d == 0)


def fused_decomp(cfg: GemmConfig, b_layout: str = "nk") -> tuple:
    """(tile, decomposition) of cfg as the fused GEMM can run them: a k-split pair becomes its tile
    without the pair, split-K 2 (k-split clusters are compiled for the plain GEMM only); with B
    (k, n) data-parallel (SCHEDS)."""
    if cfg.tile.cluster_k == 1:
        tile, decomp = cfg.tile, cfg.decomp
    else:
        tile, decomp = tune.ksplit_base(cfg.tile), tune.Decomp.split_k(2)
    return tile, decomp if SCHEDS[b_layout] == engine.PLAIN_SCHED else tune.DP


def fused_config(base: GemmConfig, m: int, world: int, ctas: int, *, rank: int, n: int, k: int, dev, out_bytes: int = 2,
                 b_layout: str = "nk") -> GemmConfig:
    """A GEMM configuration as the fused call of rank ``rank`` runs it on (m, n, k): on ``ctas``
    CTAs (0: every SM of ``dev``), chunk-major (raster along n in groups of chunk_group rows), the
    order rotated to start at the rank's own chunk (GemmConfig.rotate: tune.ag_order.row_shift), a
    k-split pair replaced by its tile without the pair (k-split clusters are compiled for the plain
    GEMM only), and the base's decomposition (split-K, stream-K, split tail, bands, narrow columns;
    split-K k2 for a k-split pair) kept where its plan still runs on this order and grid and the
    model (tune.estimate_us, plus the k-cut tiles' wait for their chunks behind a LINK_GBPS link:
    cut_tiles_wait_us) has it faster than data-parallel, else data-parallel (always with B (k, n):
    SCHEDS).
    rawflux.gemm with the result on the gathered A computes bitwise what the fused call does."""
    tile, decomp = fused_decomp(base, b_layout)
    group = chunk_group(m // world, tile, max(1, base.group))
    rotate = row_shift(m, world, rank, tile) if world > 1 else 0
    dp = replace(base, tile=tile, decomp=tune.DP, group=group, raster_n=False, ctas=ctas, rotate=rotate)
    cand = replace(dp, decomp=decomp)
    if decomp == tune.DP or (cand.stream_k and not tile.stream_k_ok) or (cand.narrow and tile not in tune.NARROW_TILES):
        return dp
    try:
        wp = tune.work_plan(m, n, k, cand, dev.sms)
    except ValueError:  # e.g. no narrow-column plan beats the data-parallel grid in this order
        return dp
    t_dp = tune.estimate_us(m, n, k, dp, dev, out_bytes)
    wait = 0.0
    if wp.sk_tiles and world > 1:  # the cut tiles' wait behind a link (rank 0's: every rank picks alike)
        units = ag_units(m, n, world, 0, tile, group)
        arrivals = arrival_us(world, 0, m // world, k, 2, LINK_GBPS)
        wait = cut_tiles_wait_us(units, wp.sk_tiles, tile, m, world, arrivals, t_dp * (len(units) - wp.sk_tiles) / len(units))
    return cand if tune.estimate_us(m, n, k, cand, dev, out_bytes) + wait < t_dp else dp


def slab_count(cfg: GemmConfig, m: int, n: int, k: int, world: int, dev, itemsize: int, gbps: float = LINK_GBPS,
               issue_us=None, out_bytes: int | None = None) -> int:
    """k-slabs per chunk for calls of m on fused configuration ``cfg``: tune.ag_order.pick_slabs on
    the op's tile order, the model's GEMM time and a link of ``gbps`` (1 at decode sizes, where one
    chunk is smaller than a slab's worth of k blocks would pay for); ``issue_us``: S -> the host's
    time to issue a call (ce_issue_us for the copy-engine path), None: the device alone. itemsize:
    bytes of A's elements (what the link carries); out_bytes: of the output's (default itemsize)."""
    t = cfg.tile
    units = ag_units(m, n, world, 0, t, cfg.group, cfg.raster_n)
    clusters = max(1, (cfg.ctas or dev.sms) // t.cluster_size)
    waves = -(-len(units) // clusters)
    unit_us = tune.estimate_us(m, n, k, cfg, dev, itemsize if out_bytes is None else out_bytes) / waves
    return pick_slabs(units, t, m, k, world, itemsize, gbps, clusters, unit_us, tune.BK, issue_us)


@dataclass(frozen=True)
class Step:
    """One action of a call, in issue order. kind:
      local     ag_local_kernel (main stream): the epoch, the call record into every peer, the
                arrival, own shard's edge rows (all on pull) -> own gathered rows; on "ce" its last CTA waits for every
                peer's arrival and compares the peers' call records with this rank's (``gate``)
      barrier   group barrier (main stream; pull only)
      fork      side streams start after the main stream's work so far
      copy      copy engine, on side stream ``side``: chunk ``chunk`` (its k-slab ``slab`` of
                ``slabs``) from ``src`` ("shard": this rank's input; or rank ``src_rank``'s
                gathered buffer) into rank ``dst_rank``'s gathered buffer (same rows, columns)
      flag      copy engine, on ``side``: rank ``dst_rank``'s ready[``chunk``][``slab``] = this call's epoch
      gemm      the GEMM with the wait prologue (main stream); on the "sm" path launched as the
                copy kernel's programmatic dependent (it starts once every copy CTA runs)
      sm_copy   the copy kernel, on the main stream (it runs the same loop on SMs)
      join      the main stream waits for every side stream ("ce" only)
    """

    kind: str
    side: int = -1
    src: str = ""
    src_rank: int = -1
    dst_rank: int = -1
    chunk: int = -1
    slab: int = 0


def schedule(direction: str, copy: str, rank: int, world: int, sides: int = 1, slabs: int = 1) -> list[Step]:
    """The ordered actions of one call on ``rank`` (world > 1); with k-slabs the copies go
    slab-major (slab 0 to every peer, then slab 1, ...), each peer's on the same side stream."""
    if direction not in DIRECTIONS or copy not in COPIES:
        raise ValueError(f"direction {direction!r} / copy {copy!r}")
    steps: list[Step] = [Step("barrier")] if direction == "pull" else []
    steps.append(Step("local"))
    # Producers are queued before the GEMM that waits on them. Streams may share one hardware
    # queue (CUDA_DEVICE_MAX_CONNECTIONS=1, as Megatron sets it, or few connections under MPS):
    # a spinning GEMM queued first would then hold back the copies it waits for, forever.
    if copy == "sm":
        # One stream: the GEMM is the copy kernel's programmatic dependent, so it starts only
        # once every copy CTA is resident (a side stream's kernel may get no SM while GEMMs spin).
        return steps + [Step("sm_copy"), Step("gemm")]
    steps += [Step("fork")]
    for j in range(slabs):
        if direction == "push":
            for i, q in enumerate(push_targets(rank, world)):
                side = i % sides
                steps.append(Step("copy", side, "shard", rank, q, rank, j))
                steps.append(Step("flag", side, dst_rank=q, chunk=rank, slab=j))
        else:
            for i, q in enumerate(pull_sources(rank, world)):
                side = i % sides
                steps.append(Step("copy", side, "gathered", q, rank, q, j))
                steps.append(Step("flag", side, dst_rank=rank, chunk=q, slab=j))
    steps += [Step("gemm"), Step("join")]
    return steps


def sm_copy_steps(direction: str, rank: int, world: int, slabs: int = 1) -> list[Step]:
    """What ag_copy_kernel does, block by block (mirrors ag_copy_body in fused/ag_gemm.cuh):
    (slab, step) blocks slab-major."""
    out = []
    for j in range(slabs):
        for step in range(1, world):
            if direction == "push":
                q = (rank - step + world) % world
                out += [Step("copy", 0, "shard", rank, q, rank, j), Step("flag", 0, dst_rank=q, chunk=rank, slab=j)]
            else:
                q = (rank + step) % world
                out += [Step("copy", 0, "gathered", q, rank, q, j), Step("flag", 0, dst_rank=rank, chunk=q, slab=j)]
    return out


# --------------------------------------------------------------------------------------------
# argument checks (shared by the op object and the functional form)


def default_copy(group, copy: str | None = None) -> str:
    """The copy mode: ``copy`` if given, else RAWFLUX_AG_COPY, else 'auto' (per m, pick_copy)
    when every peer is on another GPU and 'sm' when ranks share one (see rawflux.env.ag_copy)."""
    if copy is not None:
        return copy
    chosen = env.ag_copy()
    if chosen is not None:
        return chosen
    return "sm" if sum(getattr(group, "same_device", ())) > 1 else "auto"


def copy_paths(group, copy: str) -> tuple[str, ...]:
    """The paths an op of copy mode ``copy`` may give its calls: 'auto' is both, except where
    ranks share a GPU under MPS, where 'ce' cannot run (_check_copy_path) and 'auto' is 'sm'."""
    if copy != "auto":
        return (copy,)
    return ("sm",) if getattr(group, "shares_gpu_under_mps", False) else ("ce", "sm")


def _check_options(direction: str, copy: str, b_layout: str) -> None:
    if b_layout not in B_LAYOUTS:
        raise ValueError(f"b_layout must be 'nk' (b is (n_local, k), a linear layer's weight) or 'kn' (b is (k, n_local)), not {b_layout!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be 'push' or 'pull', not {direction!r}")
    if copy not in COPY_MODES:
        raise ValueError(f"copy must be 'ce' (copy engine), 'sm' (copy kernel on a few SMs) or 'auto' (per m), not {copy!r}")


def _check_copy_path(group, copy: str) -> None:
    """'ce' needs copy engines that make progress while a GEMM spins: not so between MPS clients
    on one GPU. Measured on the emulated node (tests/gpu/ag_diag.py, 2026-11-29): a rank's
    queued copies stayed unstarted, barrier passed, while its own and its peers' GEMMs spun on
    them, at world 2 (back-to-back calls), 4 and 8; the 'sm' path runs on SMs kept free for it."""
    if copy == "ce" and getattr(group, "shares_gpu_under_mps", False):
        raise ValueError(
            "copy='ce' is not supported where ranks share one GPU under MPS (the emulated node): the copies "
            "stall behind the spinning GEMMs (see rawflux.ops.ag_gemm._check_copy_path); use copy='sm', the "
            "default there, or one GPU per rank"
        )


def _out_dtype(dt: DType, out_dtype) -> DType:
    od = dt if out_dtype is None else DType.from_any(out_dtype)
    if od not in (dt, DType.F32):
        raise TypeError(f"out_dtype {od} is not supported for {dt} inputs: use {dt} or f32")
    return od


def _check_nk(n: int, k: int) -> None:
    if k < 8 or k % 8:
        raise ValueError(f"k = {k} must be a positive multiple of 8 (16-byte rows for the TMA loads and the copies)")
    if n < 8 or n % 8:
        raise ValueError(f"n = {n} (columns of this rank's output) must be a positive multiple of 8 (16-byte rows for the TMA loads and stores)")


def _cupy_matrix(ptr: int, rows: int, cols: int, dt: DType, owner, device: int):
    """A CuPy (rows, cols) array over memory rawflux owns (no copy)."""
    import cupy
    import numpy as np

    nbytes = rows * cols * dt.itemsize
    mem = cupy.cuda.UnownedMemory(int(ptr), max(nbytes, 1), owner, int(device))
    try:
        np_dt = dt.np
        cupy.dtype(np_dt)
    except (TypeError, ValueError):  # a CuPy that cannot hold bf16: raw storage of the same size
        np_dt = {1: np.uint8, 2: np.uint16, 4: np.uint32}[dt.itemsize]
    return cupy.ndarray((rows, cols), dtype=np_dt, memptr=cupy.cuda.MemoryPointer(mem, 0))


@dataclass
class Call:
    """One call's arguments, every one checked (check_call); stream: the launch stream."""

    ta: Tensor
    tb: Tensor
    bias: object  # the caller's, for the world-1 path (rawflux.gemm)
    bias_ptr: int
    bias_kind: int
    out: object  # the caller's out= (None: a new output)
    tout: Tensor | None
    gathered_out: object
    tg: Tensor | None
    stream: int
    config: GemmConfig | None
    tbias: Tensor | None = None


def check_call(a_shard, b, *, n: int, k: int, dtype: DType, out_dtype: DType, b_layout: str, device: int, world: int,
               max_m: int | None = None, bias=None, out=None, gathered_out=None, stream=None, config=None) -> Call:
    """Every check of one call (shared by the op object and the functional form, which runs it
    before building or growing an op: a collective step). No CUDA call for CuPy and torch inputs
    until the checks pass; then the launch stream is resolved."""
    dt = dtype
    s = intake_stream(stream, (a_shard, b, bias, out, gathered_out))
    ta = check_matrix(as_tensor(a_shard, "a_shard", stream=s, accept=DTYPES), "a_shard", dtypes=(dt,), device=device,
                      shape=(None, k), ld_ok=True)
    m_loc = ta.shape[0]
    if m_loc < 1:
        raise ValueError(f"a_shard has no rows (shape {tuple(ta.shape)}): every rank needs m/W >= 1 rows")
    m = m_loc * world
    if max_m is not None and m > max_m:
        raise ValueError(
            f"a_shard has {m_loc} rows, so m = {m_loc} x {world} ranks = {m}, above this op's max_m = {max_m}; "
            "build the op with a larger max_m (the functional rawflux.ag_gemm grows its buffers itself)"
        )
    bshape = (n, k) if b_layout == "nk" else (k, n)
    tb = check_matrix(as_tensor(b, "b", stream=s, accept=DTYPES), "b", dtypes=(dt,), device=device, shape=bshape, ld_ok=True)
    tbias, bias_ptr, bias_kind = engine.bias_args(bias, n, dt, device, s, like="a_shard")
    inputs = {"a_shard": ta, "b": tb} | ({"bias": tbias} if tbias is not None else {})
    tg = None
    if gathered_out is not None:
        tg = check_out(gathered_out, "gathered_out", shape=(m, k), dtype=dt, device=device, inputs=inputs, stream=s)
    tout = None
    if out is not None:
        tout = check_out(out, "out", shape=(m, n), dtype=out_dtype, device=device, stream=s,
                         inputs=inputs | ({"gathered_out": tg} if tg is not None else {}))
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"config must be a rawflux.tune.GemmConfig, got {type(config).__name__}")
    if config is not None and config.tile not in tune.TILES:
        raise ValueError(f"config tile {config.tile.tag()} is not one ag_gemm compiles (tiles: "
                         f"{', '.join(t.tag() for t in tune.TILES)})")
    if s is None:
        s = resolve_stream(None, [t for t in (ta, tb, tbias, tout, tg) if t is not None])
    return Call(ta, tb, bias, bias_ptr, bias_kind, out, tout, gathered_out, tg, s, config, tbias)


@dataclass(eq=False)
class _Fast:
    """A validated call's launches, for later calls with the same metadata: only the pointers and
    the stream are checked again (rawflux.runtime.fastpath)."""

    stream: int
    bound: engine.BoundGemm  # the GEMM (world 1: rawflux.gemm's plan on a_shard; else the fused one on the gathered A)
    m: int
    m_loc: int
    ldc: int
    src_pitch: int  # a_shard's row pitch in bytes
    bias_kind: int
    meta: bytes  # the call record, packed (CALL_RECORD)
    slabs: int  # k-slabs per chunk
    spans: tuple[int, int, int]  # bytes covered by a_shard, b, bias
    out_span: int
    new_out: object  # makes a new output like the validated call's (None: that call passed out=)
    starts: Blocks | None = None  # world > 1: the call's start and ("sm") copy kernel, packed once
    cfg: GemmConfig | None = None  # world > 1: the GEMM's configuration (the op's last_config after a fast call)
    own_ptr: int = 0  # world > 1, own tiles read in place: the a_shard its GEMM's own map was last written for (0: none read)
    path: str = "ce"  # world > 1: the call's copy path (AGGemm.path)


@dataclass(frozen=True)
class Blocks:
    """The small kernels of a fast call, their arguments packed once: per call only a_shard's
    pointer (SRC_OFFSET into both argument structs) is written."""

    local: engine.LaunchBlock
    copy: engine.LaunchBlock | None  # the "sm" path's copy kernel


SRC = struct.Struct("<Q")
SRC_OFFSET = 8  # AgLocalArgs.src and AgCopyArgs.src: right after group_ctrl


# --------------------------------------------------------------------------------------------
# the op object


class AGGemm(CollectiveOp):
    """Fused AllGather-GEMM sized once (see the module docstring).

    AGGemm(group, max_m, n, k, dtype, b_layout="nk", *, direction=None, copy=None, out_dtype=None,
           copy_sms=None, ce_streams=1, slabs=None, b_first=True)
    group: a rawflux Group (None: the current one). max_m: the largest m (all ranks' rows) a call
    may use; m must be a multiple of the world size W. n: this rank's output columns (n_local).
    direction: "push" | "pull" (default RAWFLUX_AG_DIRECTION, push); copy: "ce" | "sm" | "auto"
    (default RAWFLUX_AG_COPY, else "auto" between GPUs and "sm" where ranks share one; "auto": per
    m, ``op.path(m)``). slabs: k-slabs per chunk (1, 2, 4 or 8, dividing k into whole 64-column
    blocks; None: per m, the model's pick, ``op.slabs(m)``): a chunk travels as that many column
    slabs, each with its own flag, so a tile starts on the first slab while the rest is in flight.
    On "ce" the pick of an eager call also counts the host's driver calls; ``op.capture`` counts
    the GEMM alone (a graph captured another way: pass slabs=, e.g. rawflux.plan's S).
    b_first: a GEMM CTA whose first tile waits for peer rows loads B's first k blocks before the
    wait (AgWait::b_first), so that at small m the wait hides behind reading B; False: after it.
    Collective: every rank constructs the same op objects in the same order.
    Call it: ``op(a_shard, b, bias=None, out=None, gathered_out=None, return_gathered=False, stream=None)``.
    Tuning: ``op.tune(m)`` (collective), or RAWFLUX_TUNE=on at the first call of each m.
    """

    OP_NAME = "ag_gemm"
    OP_ID = OP_AG_GEMM
    META_FIELDS = ("m_local", "k", "dtype", "direction", "copy path", "capacity (max_m / W)", "k-slabs")

    def __init__(self, group, max_m: int, n: int, k: int, dtype, b_layout: str = "nk", *, direction: str | None = None,
                 copy: str | None = None, out_dtype=None, copy_sms: int | None = None, ce_streams: int = 1,
                 slabs: int | None = None, b_first: bool = True):
        direction = env.ag_direction() if direction is None else direction
        copy = default_copy(resolve_group(group), copy)
        _check_options(direction, copy, b_layout)
        _check_copy_path(resolve_group(group), copy)
        dt = DType.from_any(dtype)
        if dt not in DTYPES:
            raise TypeError(f"ag_gemm dtype must be bf16 or f16, got {dt}")
        od = _out_dtype(dt, out_dtype)
        n, k, max_m = int(n), int(k), int(max_m)
        _check_nk(n, k)
        if int(ce_streams) < 1:
            raise ValueError(f"ce_streams must be at least 1, got {ce_streams}")
        if slabs is not None and (int(slabs) not in SLAB_CHOICES or k % (int(slabs) * tune.BK)):
            raise ValueError(f"slabs = {slabs}: one of {SLAB_CHOICES} that splits k = {k} into whole "
                             f"{tune.BK}-column blocks (None: the model's pick per m)")
        self.slab_choice = None if slabs is None else int(slabs)
        self._slabs: dict[tuple, int] = {}
        self.b_first = bool(b_first)
        g = resolve_group(group)
        world = g.world
        if max_m < world:
            raise ValueError(f"max_m = {max_m} must be at least the world size {world} (one row per rank)")
        self.n, self.k, self.dtype, self.out_dtype, self.b_layout = n, k, dt, od, b_layout
        self.direction, self.copy = direction, copy
        self.paths = copy_paths(g, copy) if world > 1 else ("ce",)
        self._path: dict[int, str] = {}  # per m: the path an "auto" op's calls take (path())
        self.m_local_cap = max_m // world
        self.max_m = self.m_local_cap * world
        self.row_bytes = k * dt.itemsize
        self.last_config: GemmConfig | None = None
        self._cfgs: dict[int, GemmConfig] = {}
        self._forced: dict[int, GemmConfig] = {}  # per m: a tuned (or being timed) configuration
        self.last_tune: list = []  # the rows of this op's latest tuning run
        self._lock = threading.Lock()
        sides = (int(ce_streams) if "ce" in self.paths else 1) if world > 1 else 0
        super().__init__(g, side_streams=sides)
        self.sms = tune.device_info(self.device_id).sms
        self.copy_sms = 0
        if "sm" in self.paths and world > 1:
            self.copy_sms = default_copy_sms(self.sms) if copy_sms is None else int(copy_sms)
            if not 1 <= self.copy_sms < self.sms:
                raise ValueError(f"copy_sms = {self.copy_sms}: between 1 and SMs - 1 = {self.sms - 1}")
        # SMs the GEMM leaves free. The copy engine needs none between GPUs, but a copy within ONE
        # device runs as a driver kernel: a GEMM filling every SM and spinning on its flags would
        # starve it (DESIGN hazard 1). On the emulated node every copy is one (ranks share the
        # GPU); between GPUs, pull's flags are (the epoch word into this rank's own ready flags):
        # two H200s, 2026-11-29, pull/ce timed out at its first call once the GEMM filled the GPU
        # (m = 4096, n = 24576), while push/ce, whose flags go to the peer, ran.
        self.ce_reserved_sms = 0
        if world > 1 and sum(getattr(g, "same_device", ())) > 1:
            self.ce_reserved_sms = max(2, min(8, self.sms // 8))
        elif world > 1 and direction == "pull":
            self.ce_reserved_sms = 1  # the 4-byte flag copies run one small kernel at a time
        self._gath = self._sync = None
        self._counters = None
        if world > 1:
            self._gath = self.symmetric(self.max_m * self.row_bytes, "gathered")
            self._sync = self.symmetric(SYNC_BYTES, "sync")  # epoch, arrivals, ready flags, call records
            import cupy

            with self._device():
                self._counters = cupy.zeros(COPY_COUNTERS, dtype=cupy.uint32)  # ag_copy_kernel's counters, zero between launches
                # The zeroing ran on CuPy's current stream; the copy kernel runs on a side stream
                # that does not order with it: settle it now (construction is not capturable anyway).
                cupy.cuda.Device(self.device_id).synchronize()
            # Load every small kernel now: never compile or load inside a graph capture.
            self.kernel(KERNEL_FILE, LOCAL_KERNEL)
            if "sm" in self.paths:
                self.kernel(KERNEL_FILE, COPY_KERNEL)
            # per-op constants of every call: its steps (per path and slab count), the start kernel's flags
            self._sides = max(1, sides)
            self._schedules = {(p, s): tuple(schedule(direction, p, self.rank, world, self._sides, s)) for p in self.paths for s in SLAB_CHOICES}
            self._programs: dict[tuple, tuple] = {}  # _program()'s, per (path, slabs, m_loc, src_pitch)
            self._local_flags = {p: (LOCAL_ARRIVE_LATE if direction == "pull" else 0) | (LOCAL_GATE if p == "ce" else 0) for p in self.paths}
            self.agree_stored()  # the stored tunings every rank holds (one bounded exchange)

    # --- sizes ----------------------------------------------------------------------------------
    @property
    def epoch_ptr(self) -> int:
        """Device address of this op's epoch word (its calls so far on this rank; during a call,
        after ag_local_kernel, that call's number): the flags' value."""
        return self._sync.ptr + EPOCH_OFFSET

    @property
    def capacity(self) -> int:
        """The largest m a call may use."""
        return self.max_m

    def chunk_bytes(self, m_local: int) -> int:
        return m_local * self.row_bytes

    # --- configuration ----------------------------------------------------------------------------
    @property
    def reserved_sms(self) -> int:
        """SMs the GEMM leaves free on the op's one path (an "auto" op: reserved(path(m)) per m)."""
        return self.reserved(self.paths[0]) if len(self.paths) == 1 else max(self.reserved(p) for p in self.paths)

    def reserved(self, path: str) -> int:
        """SMs a call on ``path`` leaves free: the copy kernel's on "sm"; on "ce" those a copy within
        one device or pull's flag copies need (ce_reserved_sms)."""
        return self.copy_sms if path == "sm" else self.ce_reserved_sms

    def path(self, m: int) -> str:
        """The copy path of a call with m rows: the op's one, or an "auto" op's pick_copy on the
        model's times of the default configuration on each path's SMs (not fused_config's, whose
        decomposition weighs this rank's arrivals: the pick must be the same on every rank; the call
        record carries it)."""
        if len(self.paths) == 1:
            return self.paths[0]
        got = self._path.get(m)
        if got is None:
            if len(self._path) > 4096:
                self._path.clear()
            base, dev = self._default(m), tune.device_info(self.device_id)
            on = lambda p: replace(base, ctas=self.sms - self.reserved(p)) if self.reserved(p) else base  # noqa: E731
            t = {p: tune.estimate_us(m, self.n, self.k, on(p), dev, self.out_dtype.itemsize) for p in self.paths}
            got = self._path[m] = pick_copy(t["ce"], t["sm"], self.world, self._sides, self.direction == "pull")
        return got

    def config(self, m: int) -> GemmConfig:
        """The GEMM configuration a call with m rows uses (fused_config of the stored or default
        pick: k-split clusters off, the order rotated to this rank's chunk; on the "sm" path (path(m))
        the GEMM's persistent grid leaves copy_sms SMs to the copy kernel).
        rawflux.gemm(..., config=this) on the gathered A computes bitwise the same output."""
        cfg = self._cfgs.get(m)
        if cfg is None:
            if len(self._cfgs) > 4096:
                self._cfgs.clear()
            base = self._forced.get(m) or self._stored(m) or self._default(m)
            cfg = self._adapt(base, m)
            self._cfgs[m] = cfg
        return cfg

    def _default(self, m: int) -> GemmConfig:
        return engine.pick_config(m, self.n, self.k, self.dtype, self.b_layout, self.out_dtype, self.device_id)

    def slabs(self, m: int, cfg: GemmConfig | None = None, *, eager: bool | None = None) -> int:
        """k-slabs per chunk of a call with m rows on fused configuration ``cfg`` (default
        ``config(m)``): the constructor's ``slabs``, else slab_count's pick (1 at world 1). An eager
        call on the "ce" path counts the host's time to issue it (ce_issue_us: two driver calls per
        peer and slab), which can outlast the GEMM; a call being captured (``capture``: the graph
        replays without the host) and the "sm" path do not. ``eager``: None, the op's own case."""
        if self.world == 1:
            return 1
        if self.slab_choice is not None:
            return self.slab_choice
        cfg = self.config(m) if cfg is None else cfg
        if eager is None:
            eager = self.path(m) == "ce" and not self.capturing
        key = (m, cfg, eager)
        got = self._slabs.get(key)
        if got is None:
            if len(self._slabs) > 4096:
                self._slabs.clear()
            issue = (lambda s: ce_issue_us(self.world, s, self._sides, self.direction == "pull")) if eager else None
            got = self._slabs[key] = slab_count(cfg, m, self.n, self.k, self.world, tune.device_info(self.device_id),
                                                self.dtype.itemsize, issue_us=issue, out_bytes=self.out_dtype.itemsize)
        return got

    def _given(self, config: GemmConfig, m: int) -> GemmConfig:
        """A caller's configuration as calls of m run it: its tile, group and decomposition (a
        k-split pair: its tile without the pair, split-K 2; data-parallel with B (k, n): SCHEDS),
        the op's rotation, and on the "sm" path the copy kernel's SMs left free (hazard 1).
        Checked here, before the call issues anything."""
        reserved = self.reserved(self.path(m))
        ctas = min(config.ctas or self.sms, self.sms - reserved) if reserved else config.ctas
        tile, decomp = fused_decomp(config, self.b_layout)
        cfg = replace(config, tile=tile, decomp=decomp, ctas=ctas, rotate=row_shift(m, self.world, self.rank, tile))
        engine.check_config(cfg, m, self.n, self.k, sched=SCHEDS[self.b_layout], b_layout=self.b_layout, out_dtype=self.out_dtype,
                            epilogue=engine.plain_epilogue(self.out_dtype), sms=self.sms)
        tune.work_plan(m, self.n, self.k, cfg, self.sms)  # raises where its plan cannot run (a narrow width too wide)
        return cfg

    def _adapt(self, base: GemmConfig, m: int) -> GemmConfig:
        """A GEMM configuration as calls of m run it (fused_config), on the SMs the call's path leaves free."""
        reserved = self.reserved(self.path(m))
        return fused_config(base, m, self.world, self.sms - reserved if reserved else base.ctas, rank=self.rank,
                            n=self.n, k=self.k, dev=tune.device_info(self.device_id), out_bytes=self.out_dtype.itemsize,
                            b_layout=self.b_layout)

    # --- tuning (RAWFLUX_TUNE; rawflux/tune/collective.py) -------------------------------------------
    def _tune_id(self, m: int) -> str:
        shape = {"m": m, "n": self.n, "k": self.k, "layout": self.b_layout, "out": self.out_dtype.tag, "direction": self.direction,
                 "copy": self.path(m), "copy_sms": self.copy_sms}
        return self.tune_key(shape, self.dtype.tag)

    def _config_ok(self, cfg: GemmConfig) -> bool:
        return cfg.tile in tune.TILES

    def _use_config(self, m: int, cfg: GemmConfig) -> None:
        """Calls of m run ``cfg`` (adapted) from now on (tuning)."""
        with self._lock:
            self._forced[m] = cfg
            self._cfgs.pop(m, None)
        self.forget_fast()

    def tune_candidates(self, m: int, top: int = 6) -> list[GemmConfig]:
        """The default pick first, then the model's next best tiles as the fused call runs them."""
        first = self._default(m)
        dev = tune.device_info(self.device_id)
        ranked = sorted(tune.candidates(m, self.n, self.k, self.b_layout, dev, self.out_dtype.itemsize),
                        key=lambda c: tune.estimate_us(m, self.n, self.k, self._adapt(c, m), dev, self.out_dtype.itemsize))
        out, seen = [first], {self._adapt(first, m).tile}
        for c in ranked:
            t = self._adapt(c, m).tile
            if len(out) >= top:
                break
            if t not in seen:
                seen.add(t)
                out.append(c)
        return out

    def tune(self, m: int, *, top: int = 6, reps: int = 20, budget_s: float | None = None, stream=None) -> GemmConfig:
        """Collective (every rank, the same m): time up to ``top`` GEMM configurations for calls of
        m on scratch inputs and keep the one whose slowest rank is fastest, for this op and in the
        fused-op table (RAWFLUX_TUNE=cached reads it). Not in a graph capture. ``last_tune`` holds
        the timed rows."""
        if self.world == 1:
            raise ValueError("AGGemm.tune: world 1 runs the plain GEMM; tune it with RAWFLUX_TUNE=on (rawflux.gemm)")
        m = int(m)
        if m <= 0 or m % self.world or m > self.max_m:
            raise ValueError(f"AGGemm.tune: m = {m} must be a positive multiple of W = {self.world} up to max_m = {self.max_m}")
        import cupy

        s = resolve_stream(stream, ())
        with self._device():
            a = scratch_matrix((m // self.world, self.k), self.dtype, 1)
            b = scratch_matrix((self.n, self.k) if self.b_layout == "nk" else (self.k, self.n), self.dtype, 2)
            out = cupy.empty((m, self.n), dtype=self.out_dtype.np)
            return self.run_tuning(m, lambda: self(a, b, out=out, stream=s), top=top, reps=reps, budget_s=budget_s, stream=s,
                                   label=lambda c: self._adapt(c, m).tag())

    # --- the call ---------------------------------------------------------------------------------
    def __call__(self, a_shard, b, *, bias=None, out=None, gathered_out=None, return_gathered: bool = False, stream=None,
                 config: GemmConfig | None = None):
        key = None
        if gathered_out is None and not return_gathered and config is None:
            key = fastpath.key(a_shard, b, bias, out)
            f = self.fast_entry(key)
            if f is not None:
                got = self._fast_call(f, a_shard, b, bias, out, stream)
                if got is not None:
                    return got
        c = check_call(a_shard, b, n=self.n, k=self.k, dtype=self.dtype, out_dtype=self.out_dtype, b_layout=self.b_layout,
                       device=self.device_id, world=self.world, max_m=self.max_m, bias=bias, out=out, gathered_out=gathered_out,
                       stream=stream, config=config)
        res = self._call(c, return_gathered)
        if key is not None:
            self.remember_fast(key, self._fast_for(c, res, key[0]))
        return res

    # --- the fast path (rawflux.runtime.fastpath): a call like a validated one -------------------
    def _fast_for(self, c: Call, res, fw: str) -> _Fast:
        """The fast-path entry of validated call c (already launched; res: what it returned)."""
        ta, tb, s, n, k, od = c.ta, c.tb, c.stream, self.n, self.k, self.out_dtype
        m_loc = ta.shape[0]
        m = m_loc * self.world
        ldb = tb.strides[0] if tb.shape[0] > 1 else tb.shape[1]
        ldc = c.tout.strides[0] if c.tout is not None and m > 1 else n
        src_pitch = ta.strides[0] * ta.itemsize if m_loc > 1 else self.row_bytes
        if self.world == 1:  # rawflux.gemm's plan, as _call_local runs it
            cfg = engine.pick_config(m, n, k, self.dtype, self.b_layout, od, self.device_id)
            plan = engine.plan(cfg, m, n, k, dtype=self.dtype, b_layout=self.b_layout, out_dtype=od, device_id=self.device_id, stream=s)
            bound = plan.bind(ta.strides[0] if m > 1 else k, ldb)
            meta, slabs = b"", 1
        else:
            path = self.path(m)
            slabs = self.slabs(m, self.last_config)
            edges, own = self._in_place(m_loc, self.last_config, False, ta.ptr, src_pitch)
            plan, pro = self._gemm_plan(s, self.last_config, m_loc, slabs, own)
            bound = plan.bind(k, ldb, pro, pdl=path == "sm")
            meta = self.call_record(self._fields(m_loc, slabs))
        spans = (fastpath.span(ta), fastpath.span(tb), fastpath.span(c.tbias))
        new_out = None if c.tout is not None else fastpath.allocator(fw, res, self.device_id)
        starts = None
        if self.world > 1:
            local = engine.LaunchBlock(self.kernel(KERNEL_FILE, LOCAL_KERNEL), self._local_grid(m_loc, edges), LOCAL_THREADS, 1, 0,
                                       (self._local_args(0, src_pitch, m_loc, edges=edges), meta))
            copy = None
            if path == "sm":
                copy = engine.LaunchBlock(self.kernel(KERNEL_FILE, COPY_KERNEL), self.copy_sms, COPY_THREADS, 1, 0,
                                          (self._copy_args(0, src_pitch, m_loc, slabs),))
            starts = Blocks(local, copy)
        return _Fast(s, bound, m, m_loc, ldc, src_pitch, c.bias_kind, meta, slabs, spans, fastpath.byte_span(m, n, ldc, od.itemsize),
                     new_out, starts, self.last_config if self.world > 1 else None, own[0] if self.world > 1 and own else 0,
                     path if self.world > 1 else "ce")

    def _fast_call(self, f: _Fast, a_shard, b, bias, out, stream):
        """Launch f's call for these arrays, or None where the validated path must look at it."""
        got = self.fast_args(f, a_shard, b, bias, out, stream)
        if got is None:
            return None
        s, out, pa, pb, pc, pbias = got
        with self._fast_lock:
            f.bound.point(self._gath.ptr if self.world > 1 else pa, pb)
            if f.own_ptr and pa != f.own_ptr:  # the own tiles' map of this a_shard
                f.bound.set_prologue(self._own_map(f.bound.plan, pa, f.src_pitch, f.m_loc))
                f.own_ptr = pa
            if f.bound.out_changed(pc, pbias):
                epilogue = engine.plain_epilogue(self.out_dtype)
                f.bound.set_epilogue(engine.epilogue_params(epilogue, pc, f.m, self.n, f.ldc, self.out_dtype, pbias, f.bias_kind))
            self.calls += 1
            if self.world == 1:
                f.bound.launch(s)
            else:
                with self._device():
                    self._steps(s, pa, f.src_pitch, f.m_loc, f.meta, lambda: f.bound.launch(s), f.slabs, f.path, f.starts)
                self.last_config = f.cfg
        return out

    def _call(self, c: Call, return_gathered: bool):
        """A call whose every argument check_call passed."""
        ta, tb, tg, s, config, dev, dt = c.ta, c.tb, c.tg, c.stream, c.config, self.device_id, self.dtype
        m_loc, world = ta.shape[0], self.world
        m = m_loc * world
        if world == 1:
            return self._call_local(ta, tb, c.bias, c.out, tg, c.gathered_out, return_gathered, s, config)

        if c.tout is not None:
            tc, out_obj = c.tout, c.tout.obj
        else:
            tc, out_obj = new_output((m, self.n), self.out_dtype, ta, stream=s)
        if config is None:
            if m not in self._cfgs and m not in self._forced and env.tune_mode() == "on":
                self.tune_first_use(m, s)
            cfg = self.config(m)
        else:
            cfg = self._given(config, m)
        slabs = self.slabs(m, cfg)
        fields = self._fields(m_loc, slabs)
        self.begin(s, fields)  # raises a previous call's device-side failure; RAWFLUX_DEBUG compare
        with self._device():
            self._run(s, ta, tb, tc, m_loc, cfg, c.bias_ptr, c.bias_kind, fields, slabs, gathered=tg is not None or return_gathered)
            if tg is not None:
                from cupy.cuda import runtime

                runtime.memcpyAsync(tg.ptr, self._gath.ptr, m * self.row_bytes, runtime.memcpyDefault, s)
        self.last_config = cfg
        result = out_obj if c.tout is not None else wrap_output(ta, out_obj, stream=s)
        if not return_gathered:
            return result
        if c.gathered_out is not None:
            return result, c.gathered_out
        view = _cupy_matrix(self._gath.ptr, m, self.k, dt, self, dev)
        return result, wrap_output(ta, view, stream=s)

    def _fields(self, m_loc: int, slabs: int) -> tuple[int, ...]:
        """The call record's fields (META_FIELDS): the copy path is the call's (path())."""
        return (m_loc, self.k, DTYPE_CODE[self.dtype], DIRECTIONS[self.direction], COPIES[self.path(m_loc * self.world)], self.m_local_cap,
                slabs)

    def _call_local(self, ta, tb, bias, out, tg, gathered_out, return_gathered, s, config):
        """World 1: no communication. The gathered A is a_shard itself."""
        res = gemm(ta, tb, b_layout=self.b_layout,
                     bias=bias, out=out, out_dtype=self.out_dtype, stream=s, config=config)
        if tg is not None:
            import cupy

            from cupy.cuda import runtime

            with cupy.cuda.Device(self.device_id):
                runtime.memcpy2DAsync(tg.ptr, self.row_bytes, ta.ptr, ta.strides[0] * ta.itemsize if ta.shape[0] > 1 else self.row_bytes,
                                      self.row_bytes, ta.shape[0], runtime.memcpyDefault, s)
        self.calls += 1
        if not return_gathered:
            return res
        return res, (gathered_out if gathered_out is not None else ta.obj)

    def _run(self, s: int, ta, tb, tc, m_loc: int, cfg: GemmConfig, bias_ptr: int, bias_kind: int, fields, slabs: int,
             gathered: bool = False) -> None:
        src_pitch = ta.strides[0] * ta.itemsize if m_loc > 1 else self.row_bytes
        path = self.path(m_loc * self.world)
        edges, own = self._in_place(m_loc, cfg, gathered, ta.ptr, src_pitch)
        gemm = self._prepare_gemm(s, cfg, m_loc, tb, tc, bias_ptr, bias_kind, slabs, own)
        # the gathered A asked for on "ce" push: the rows read in place copied on a side stream, beside the GEMM
        late = edges if gathered and own else None
        self._steps(s, ta.ptr, src_pitch, m_loc, self.call_record(fields), lambda: self._launch_gemm(s, gemm, pdl=path == "sm"), slabs,
                    path, edges=edges, own_late=late)

    def _in_place(self, m_loc: int, cfg: GemmConfig, gathered: bool, a_ptr: int, src_pitch: int):
        """(edges, own): the own rows the call's start copies (_edges), and (a_ptr, src_pitch) of
        the a_shard the own tiles read in place (None where every own row is copied)."""
        edges = self._edges(m_loc, cfg, gathered)
        return edges, ((a_ptr, src_pitch) if edges[0] < edges[1] else None)

    def _edges(self, m_loc: int, cfg: GemmConfig, gathered: bool) -> tuple[int, int]:
        """(head, tail) of the own rows the call's start copies (edge_rows): only those sharing a
        tile with a peer's on "push" (the GEMM reads the rest of a_shard in place); every one
        (head = tail = m_loc) where the peers read them from the gathered buffer ("pull"), or
        where the call returns the gathered A on "sm" (on "ce" push the rows read in place go
        to the gathered buffer on a side stream beside the GEMM: _steps' own_late)."""
        if self.direction == "pull" or (gathered and self.path(m_loc * self.world) == "sm"):
            return m_loc, m_loc
        return edge_rows(m_loc, self.rank, cfg.tile.bm)

    def _steps(self, s: int, a_ptr: int, src_pitch: int, m_loc: int, record: bytes, launch_gemm, slabs: int, path: str,
               blocks: Blocks | None = None, edges: tuple[int, int] | None = None, own_late: tuple[int, int] | None = None) -> None:
        """The call's schedule: the call's start (local), the copies and flags, the GEMM (launch_gemm()), the join;
        ``blocks``: the fast path's packed start and copy kernel (else packed here, the own rows
        ``edges`` copies: _edges); ``own_late``: (head, tail), "ce": own rows [head, tail) (the
        ones the GEMM reads in place) copied into the gathered buffer on side stream 0 after its
        chunk copies (the caller asked for the gathered A; joined before the call returns)."""
        from cupy.cuda import runtime

        kinds, copies = self._program(path, slabs, m_loc, src_pitch)
        sides: list[int] = []
        for kind in kinds:
            if kind == "local":
                if blocks is not None:
                    blocks.local.write(0, SRC.pack(a_ptr), SRC_OFFSET)
                    blocks.local.launch(s)
                else:
                    self._launch_local(s, a_ptr, src_pitch, m_loc, record, self._local_flags[path], edges)
            elif kind == "barrier":
                self.barrier(s)
            elif kind == "fork":
                sides = self.fork(s)
            elif kind == "copies":
                # A flag = this call's epoch, copied from device memory after its data copy on the
                # same stream (stream order: the data is complete before the flag lands).
                row, default = self.row_bytes, runtime.memcpyDefault
                for shard, dst, src, spitch, width, rows, side in copies:
                    if rows:  # 2-D: a k-slab's columns of m_loc rows (from a_shard at offset src, or a peer's buffer)
                        runtime.memcpy2DAsync(dst, row, a_ptr + src if shard else src, spitch, width, rows, default, sides[side])
                    else:  # 1-D: a whole chunk between gathered buffers, or a flag
                        runtime.memcpyAsync(dst, src, width, default, sides[side])
                if own_late is not None:
                    head, tail = own_late
                    runtime.memcpy2DAsync(self._gath.ptr + (self.rank * m_loc + head) * row, row, a_ptr + head * src_pitch, src_pitch, row,
                                          tail - head, default, sides[0])
            elif kind == "sm_copy":
                if blocks is not None:
                    blocks.copy.write(0, SRC.pack(a_ptr), SRC_OFFSET)
                    blocks.copy.launch(s)
                else:
                    self._launch_copy(s, a_ptr, src_pitch, m_loc, slabs)
            elif kind == "gemm":
                launch_gemm()
            elif kind == "join":
                self.join(s)
            else:  # pragma: no cover - _program() only makes the kinds above
                raise AssertionError(kind)

    def _program(self, path: str, slabs: int, m_loc: int, src_pitch: int) -> tuple[tuple[str, ...], tuple[tuple, ...]]:
        """The call's schedule() as run: its step kinds, each run of copy and flag steps folded into
        one "copies" kind, and those copies' arguments (shard, dst, src, src pitch, bytes a row,
        rows (0: one 1-D copy), side stream), computed once per (path, slabs, m_loc, src_pitch)."""
        key = (path, slabs, m_loc, src_pitch)
        got = self._programs.get(key)
        if got is not None:
            return got
        chunk = self.chunk_bytes(m_loc)
        slab_bytes = self.row_bytes // slabs  # one slab's columns of a row
        gath, sync = self._gath, self._sync
        kinds: list[str] = []
        copies: list[tuple] = []
        for st in self._schedules[path, slabs]:
            if st.kind not in ("copy", "flag"):
                kinds.append(st.kind)
                continue
            if not kinds or kinds[-1] != "copies":
                kinds.append("copies")
            col = st.slab * slab_bytes
            if st.kind == "flag":
                dst = sync.peer_ptrs[st.dst_rank] + READY_OFFSET + 4 * ready_index(st.chunk, st.slab)
                copies.append((False, dst, self.epoch_ptr, 0, 4, 0, st.side))
                continue
            dst = gath.peer_ptrs[st.dst_rank] + st.chunk * chunk + col
            if st.src == "shard":
                copies.append((True, dst, col, src_pitch, slab_bytes, m_loc, st.side))
            elif slabs > 1:
                src = gath.peer_ptrs[st.src_rank] + st.chunk * chunk + col
                copies.append((False, dst, src, self.row_bytes, slab_bytes, m_loc, st.side))
            else:
                copies.append((False, dst, gath.peer_ptrs[st.src_rank] + st.chunk * chunk, 0, chunk, 0, st.side))
        if len(self._programs) > 256:
            self._programs.clear()
        got = self._programs[key] = (tuple(kinds), tuple(copies))
        return got

    # --- launches ---------------------------------------------------------------------------------
    def _local_grid(self, m_loc: int, edges: tuple[int, int] | None = None) -> int:
        """ag_local_kernel's CTAs for the own rows it copies (edges: _edges; None: all of them)."""
        head, tail = edges or (m_loc, m_loc)
        vecs = (head + m_loc - tail) * (self.row_bytes // 16)
        return max(1, min(2 * self.sms, -(-vecs // (LOCAL_THREADS * 4))))

    def _local_args(self, src: int, src_pitch: int, m_loc: int, flags: int | None = None, edges: tuple[int, int] | None = None) -> bytes:
        dst = self._gath.ptr + self.rank * self.chunk_bytes(m_loc)
        head, tail = edges or (m_loc, m_loc)
        return AG_LOCAL_ARGS.pack(self.group_ctrl_ptr, src, dst, self._sync.ptr, self._sync.peer_table_ptr, src_pitch, m_loc,
                                  self.row_bytes // 16, self._local_flags[self.path(m_loc * self.world)] if flags is None else flags, head, tail, 0)

    def _copy_args(self, src: int, src_pitch: int, m_loc: int, slabs: int) -> bytes:
        return AG_COPY_ARGS.pack(self.group_ctrl_ptr, src, self._gath.peer_table_ptr, self._sync.ptr, self._sync.peer_table_ptr,
                                 int(self._counters.data.ptr), src_pitch, m_loc, self.row_bytes // 16, DIRECTIONS[self.direction], slabs)

    def _launch_local(self, s: int, src: int, src_pitch: int, m_loc: int, record: bytes, flags: int | None = None,
                      edges: tuple[int, int] | None = None) -> None:
        # the engine's lean path (launch config cached, one argument block per thread)
        engine.launch(self.kernel(KERNEL_FILE, LOCAL_KERNEL), self._local_grid(m_loc, edges), LOCAL_THREADS, 1, 0, s,
                      (self._local_args(src, src_pitch, m_loc, flags, edges), record))

    def _launch_copy(self, s: int, src: int, src_pitch: int, m_loc: int, slabs: int = 1) -> None:
        engine.launch(self.kernel(KERNEL_FILE, COPY_KERNEL), self.copy_sms, COPY_THREADS, 1, 0, s, (self._copy_args(src, src_pitch, m_loc, slabs),))

    def _prepare_gemm(self, s: int, cfg: GemmConfig, m_loc: int, tb, tc, bias_ptr: int, bias_kind: int, slabs: int = 1,
                      own: tuple[int, int] | None = None):
        """Everything the GEMM launch needs (kernel compiled and loaded, tensor maps, packed
        params), resolved before the call issues anything: no compile or module load happens
        while this rank's barrier spins. own: (a_shard's pointer, its row pitch in bytes) where
        the own tiles read it in place (_gemm_plan)."""
        m, n = m_loc * self.world, self.n
        plan, pro = self._gemm_plan(s, cfg, m_loc, slabs, own)
        ldc = tc.strides[0] if m > 1 else n
        epi = engine.epilogue_params(engine.plain_epilogue(self.out_dtype), tc.ptr, m, n, ldc, self.out_dtype, bias_ptr, bias_kind)
        ldb = tb.strides[0] if tb.shape[0] > 1 else tb.shape[1]
        return plan, plan.args(self._gath.ptr, tb.ptr, self.k, ldb, pro, epi)

    def _gemm_plan(self, s: int, cfg: GemmConfig, m_loc: int, slabs: int = 1, own: tuple[int, int] | None = None):
        """(the GEMM's plan on the gathered A, AgWait's params) for calls of m_loc rows per rank on
        stream s, chunks in ``slabs`` k-slabs; own: (a_shard's pointer, row pitch in bytes) that the
        tiles wholly inside the own chunk read in place (None: every tile reads the gathered A).
        The engine's pipeline waits trap when they expire: they get longer than any flag wait, so
        a late peer surfaces as the flag wait's clear error."""
        m, n, k, dt = m_loc * self.world, self.n, self.k, self.dtype
        slab_kb = k // tune.BK // slabs if slabs > 1 else 0  # AgWait: k blocks per slab (0: whole chunks)
        plan = engine.plan(cfg, m, n, k, dtype=dt, b_layout=self.b_layout, out_dtype=self.out_dtype, device_id=self.device_id,
                           stream=s, relpath=KERNEL_FILE, sched=SCHEDS[self.b_layout], prologue=PROLOGUE, epilogue=engine.plain_epilogue(self.out_dtype),
                           timeout_ns=self.pipeline_timeout_ns())
        own_map = self._own_map(plan, *own, m_loc) if own else bytes(OWN_MAP_BYTES)
        pro = wait_params(own_map, self.group_ctrl_ptr, self._sync.ptr + READY_OFFSET, self.epoch_ptr, m_loc, self.rank, self.world,
                          slab_kb, int(self.b_first), int(own is not None))
        return plan, pro

    def _own_map(self, plan, a_ptr: int, src_pitch: int, m_loc: int) -> bytes:
        """The own tiles' map of a_shard (m_loc rows at a_ptr, src_pitch bytes apart), with the box of the plan's A."""
        return plan.a_map(a_ptr, m_loc, src_pitch // self.dtype.itemsize)

    def _launch_gemm(self, s: int, prepared, pdl: bool = False) -> None:
        plan, args = prepared
        plan.launch_args(s, args, pdl=pdl)

    def gathered(self, m: int):
        """A CuPy view (m, k) of this rank's gathered buffer (valid until the next call). Its own
        rows hold a_shard after a call on "pull" or one that returned the gathered A; after
        another "push" call only the edge rows (edge_rows) do, the GEMM read the rest in place."""
        if self.world == 1:
            raise ValueError("at world 1 there is no gathered buffer: the gathered A is a_shard itself")
        if m > self.max_m or m % self.world:
            raise ValueError(f"m = {m}: a multiple of {self.world} up to {self.max_m}")
        return _cupy_matrix(self._gath.ptr, m, self.k, self.dtype, self, self.device_id)


# --------------------------------------------------------------------------------------------
# the functional form


def _make(group, key, capacity):
    n, k, dt, b_layout, direction, copy, od = key
    return AGGemm(group, capacity, n, k, dt, b_layout, direction=direction, copy=copy, out_dtype=od)


_cache = OpCache(_make, lambda op: op.max_m)


def shared_op(group, n: int, k: int, dtype: DType, b_layout: str, need: int, *, direction: str | None = None,
              copy: str | None = None, out_dtype: DType | None = None, stream: int | None = None) -> "AGGemm":
    """The cached op object for these parameters (None: AGGemm's defaults), grown collectively to
    at least ``need`` gathered rows: the functional form's, and rawflux.nn's."""
    direction = env.ag_direction() if direction is None else direction
    key = (int(n), int(k), dtype, b_layout, direction, default_copy(group, copy), dtype if out_dtype is None else out_dtype)
    return _cache.get(group, key, max(int(need), group.world), stream=stream, round_to=64 * group.world)


def cached_op(group, n: int, k: int, dtype, b_layout: str = "nk", *, direction: str | None = None,
              copy: str | None = None, out_dtype=None) -> "AGGemm | None":
    """The op object the functional form uses for these parameters (None before the first call):
    e.g. its ``last_config`` for rawflux.gemm(..., config=) comparisons."""
    dt = DType.from_any(dtype)
    od = dt if out_dtype is None else DType.from_any(out_dtype)
    g = resolve_group(group)
    key = (int(n), int(k), dt, b_layout, env.ag_direction() if direction is None else direction, default_copy(g, copy), od)
    return _cache.peek(g, key)


def clear_cache() -> None:
    """Close the cached op objects (collective: every rank must call it)."""
    _fn_ops.clear()
    _cache.clear()


def ag_gemm(a_shard, b, group=None, *, b_layout: str = "nk", bias=None, out=None, gathered_out=None,
            return_gathered: bool = False, stream=None, direction: str | None = None, copy: str | None = None,
            out_dtype=None):
    """Fused AllGather-GEMM on rank r of W: returns out (m, n_local) = AllGather(a_shard) @ B^T
    (+ bias); ``(out, gathered)`` with ``return_gathered=True`` (see the module docstring for the
    gathered view's lifetime). a_shard: (m/W, k); b: (n_local, k) ("nk") or (k, n_local) ("kn");
    bf16 / f16. Collective: every rank calls it with the same shapes, in the same order.
    The op objects behind it are cached per (group, n_local, k, dtype, layout, direction, copy)
    and grown (collectively, bounded) when m exceeds them; make one call with the largest m
    before capturing a CUDA graph."""
    fast = None
    if gathered_out is None and not return_gathered:
        key = fastpath.key(a_shard, b, bias, out)
        if key is not None:
            # the defaults as the environment says now: a changed RAWFLUX_AG_* picks another op
            fast = (b_layout, env.ag_direction() if direction is None else direction, copy if copy is not None else env.ag_copy(),
                    out_dtype)
            got = _fn_ops.call(group, fast, key, a_shard, b, bias, out, stream)
            if got is not None:
                return got
    g = resolve_group(group)
    direction = env.ag_direction() if direction is None else direction
    copy = default_copy(g, copy)
    _check_options(direction, copy, b_layout)
    _check_copy_path(g, copy)
    # Every argument is checked before the op is built or grown (collective): a rank with a bad
    # argument raises here, its peers at the bounded agreement instead of hanging.
    s = intake_stream(stream, (a_shard, b, bias, out, gathered_out))
    ta = as_tensor(a_shard, "a_shard", stream=s, accept=DTYPES)
    tb = as_tensor(b, "b", stream=s, accept=DTYPES)
    if ta.ndim != 2 or tb.ndim != 2:
        raise ValueError(f"a_shard and b must be 2-D matrices, got shapes {tuple(ta.shape)} and {tuple(tb.shape)}")
    if ta.dtype not in DTYPES:
        raise TypeError(f"a_shard has dtype {ta.dtype}: rawflux.ag_gemm takes bf16 or f16 (rawflux.baseline.ag_gemm takes f32)")
    k = ta.shape[1]
    n = tb.shape[0] if b_layout == "nk" else tb.shape[1]
    kb = tb.shape[1] if b_layout == "nk" else tb.shape[0]
    if kb != k:
        raise ValueError(f"a_shard is (m/W, k) = {tuple(ta.shape)} but b ({b_layout!r} layout) is {tuple(tb.shape)}: k differs ({k} vs {kb})")
    _check_nk(n, k)
    out = None if out is None else as_tensor(out, "out", stream=s)  # the caller's object stays out.obj
    od = _out_dtype(ta.dtype, out.dtype if out_dtype is None and out is not None else out_dtype)
    c = check_call(ta, tb, n=n, k=k, dtype=ta.dtype, out_dtype=od, b_layout=b_layout, device=g.device_id, world=g.world,
                   bias=bias, out=out, gathered_out=gathered_out, stream=s if s is not None else stream)
    op = shared_op(g, n, k, ta.dtype, b_layout, ta.shape[0] * g.world, direction=direction, copy=copy, out_dtype=od,
                   stream=c.stream)
    res = op._call(c, return_gathered)
    if fast is not None:
        _fn_ops.remember(fast, key, op, op._fast_for(c, res, key[0]))
    return res


_fn_ops = FunctionalFast()  # the functional form's fast path
