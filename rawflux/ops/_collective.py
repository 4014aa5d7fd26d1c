"""Machinery shared by the fused collective ops (ag_gemm, gemm_rs): an op object sized once.

``CollectiveOp`` holds, for one Group:
  * symmetric buffers allocated at construction (``self.symmetric(nbytes, tag)``, collective);
    nothing is allocated per call;
  * side streams and fork/join events, created once: side work forks from the caller's stream
    (``fork``) and joins back (``join``) before the op returns, so a call is capturable in a CUDA
    graph (DESIGN hazard 4);
  * the per-call start (``begin``): ``raise_if_failed()`` (a previous call's device-side timeout
    or mismatch surfaces here), and with RAWFLUX_DEBUG=1 an MPI comparison of the call metadata
    that names the ranks that differ;
  * the call record (``call_record``): the words each op's kernels push into every peer at a
    call's start and compare there (comm/call_record.cuh), so a rank that calls with another
    shape, another op object, or not at all, makes the others fail with a clear error
    (CallMismatch / CollectiveTimeout) instead of computing garbage. Each op numbers its calls
    with its own device-resident epoch (never a host value baked into a graph) and needs no
    per-call barrier; ``barrier`` (Group.barrier on the caller's stream) is there for the
    protocols that still do (ag_gemm's pull direction).

``OpCache`` backs the functional forms (``rawflux.ag_gemm(...)``): one op object per key, grown
(collectively, under a bounded agreement) when a call needs more capacity.

Contract between calls: calls of one op object must be ordered on the device (the same stream,
or streams joined by events), and every rank makes the same calls in the same order. A call's
side work joins the caller's stream before the op returns.

Device errors are sticky: once a wait timed out or a mismatch was found, the group is aborted
(every later wait fails fast) and must be rebuilt (rawflux.finalize(); rawflux.init()).
"""
from __future__ import annotations

import functools
import itertools
import struct
import threading
import time
import weakref

import numpy as np

from .. import env
from ..dist import CallMismatch, CollectiveTimeout, DistError, register_failure_describer
from ..dist.layout import OP_NAMES, OP_NONE, STATE_CALL_MISMATCH, STATE_OK
from ..jit import get_kernel
from ..jit.faults import raise_if_lost
from ..runtime import DType, fastpath

META_WORDS = 16  # kMetaWords (comm/call_record.cuh)
META_FIELDS_MAX = META_WORDS - 2
META_SLOT_BYTES = 4 * META_WORDS

# Bound of the agreement that starts an op object's construction: ranks may reach it far apart
# (loading weights, first compiles), so it is generous; still an error, never a hang.
CONSTRUCT_WAIT_S = 300.0
FAST_ENTRIES_MAX = 256  # call shapes an op object keeps fast-path entries for

# Codes of dtypes in metadata records (stable numbers, not enum order).
DTYPE_CODE = {DType.BF16: 1, DType.F16: 2, DType.F32: 3, DType.E4M3: 4, DType.E5M2: 5}


# op id -> (op name, names of the op-defined metadata fields), filled by CollectiveOp subclasses
_FIELD_NAMES: dict[int, tuple[str, tuple[str, ...]]] = {}


def call_record(op_id: int, fields: tuple[int, ...], tag: int = 0) -> tuple[int, ...]:
    """The META_WORDS words of a call record: tag, op id, then the op-defined fields (at most 14)."""
    if len(fields) > META_FIELDS_MAX:
        raise ValueError(f"{len(fields)} record fields; at most {META_FIELDS_MAX}")
    return (tag, int(op_id)) + tuple(int(x) & 0xFFFFFFFF for x in fields) + (0,) * (META_FIELDS_MAX - len(fields))


def describe_failure(rec) -> CollectiveTimeout:
    """The exception for a failed Status record (timeouts, aborts, and call mismatches)."""
    if rec.state != STATE_CALL_MISMATCH:
        return CollectiveTimeout(rec.message(), rec)
    op_name, fields = _FIELD_NAMES.get(rec.op, (OP_NAMES.get(rec.op, f"op {rec.op}"), ()))
    names = ("call tag", "op") + tuple(fields)
    word = rec.index
    what = names[word] if 0 <= word < len(names) else f"word {word}"
    me, peer = rec.waiter, rec.peer
    if word == 0:
        detail = (f"rank {peer} did not make this call of this {op_name} op object (its last record there is "
                  f"for call {rec.observed}, this one is call {rec.expected}): it skipped the call, called "
                  f"another op object, or called with another protocol (barrier count)")
    else:
        detail = f"{what}: rank {me} has {_fmt_field(what, rec.expected)}, rank {peer} has {_fmt_field(what, rec.observed)}"
    msg = (f"{op_name} call #{rec.call_id}: ranks {me} and {peer} disagree on the call ({detail}). Every rank "
           f"must make the same collective calls in the same order with the same shapes; the group is aborted "
           f"(rawflux.finalize(), then rawflux.init())")
    return CallMismatch(msg, rec, peer)


def _fmt_field(name: str, value: int) -> str:
    if name == "dtype":
        for dt, code in DTYPE_CODE.items():
            if code == value:
                return dt.tag
    if name == "op":
        return OP_NAMES.get(value, str(value))
    return str(value)


register_failure_describer(STATE_CALL_MISMATCH, describe_failure)


def resolve_group(group):
    """``group`` or the current group (rawflux.init() called earlier), else a clear error."""
    if group is not None:
        return group
    from ..dist import current_group

    return current_group()


def check_capacity(name: str, value: int, cap: int, what: str) -> None:
    if value > cap:
        raise ValueError(f"{name}={value} exceeds the op's capacity {cap} ({what}); build the op with a larger size")


def check_divisible(name: str, value: int, by: int, what: str) -> None:
    if by > 0 and value % by:
        raise ValueError(f"{name}={value} is not a multiple of {by} ({what})")


def is_capturing(stream: int) -> bool:
    from cupy.cuda import runtime

    try:
        return runtime.streamIsCapturing(int(stream)) != runtime.streamCaptureStatusNone
    except Exception:  # noqa: BLE001 - a failed query means the stream is unusable anyway; let launches report
        return False


_uid_lock = threading.Lock()
_uids: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _next_uid(group) -> int:
    """Op objects of one group, numbered in construction order (the same on every rank, since
    construction is collective)."""
    with _uid_lock:
        counter = _uids.get(group)
        if counter is None:
            counter = itertools.count(1)
            _uids[group] = counter
        return next(counter)


class CollectiveOp:
    """Base of the fused ops (see the module docstring). Subclasses set OP_NAME, OP_ID and
    META_FIELDS (names of the op-defined metadata words, at most 14)."""

    OP_NAME = "collective"
    OP_ID = OP_NONE
    META_FIELDS: tuple[str, ...] = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if len(cls.META_FIELDS) > META_FIELDS_MAX:
            raise TypeError(f"{cls.__name__}.META_FIELDS has {len(cls.META_FIELDS)} names; at most {META_FIELDS_MAX}")
        if cls.OP_ID != OP_NONE:
            _FIELD_NAMES[cls.OP_ID] = (cls.OP_NAME, tuple(cls.META_FIELDS))

    def __init__(self, group=None, *, side_streams: int = 1):
        """Collective over ``group`` (default: the current group): every rank must construct
        the same op objects, in the same order, with the same sizes."""
        self.group = g = resolve_group(group)
        self.rank, self.world, self.device_id = g.rank, g.world, g.device_id
        self.uid = _next_uid(g)
        self._closed = False
        self._buffers: list = []
        self._streams: list[int] = []
        self._fork_event = 0
        self._join_events: list[int] = []
        self._kernels: dict[str, object] = {}
        self.calls = 0  # calls made on this rank (host count, for messages and tests)
        self.capturing = False  # inside capture(): the calls made there are replayed without the host
        self._fast: dict[tuple, object] = {}  # validated calls' launches by call metadata (fast_entry)
        self._fast_lock = threading.Lock()  # one call at a time patches and launches an entry
        if self.world > 1:
            # The rest is collective and blocking (symmetric buffers): agree first, bounded, so that a
            # rank that raised on its arguments makes the others raise instead of hang.
            got = bounded_allgather(g, (self.OP_ID, self.uid), f"{self.OP_NAME} construction",
                                    timeout_s=max(g.timeout_s, CONSTRUCT_WAIT_S))
            if any(v != got[0] for v in got):
                listing = "; ".join(f"rank {q}: {OP_NAMES.get(op, op)} #{uid}" for q, (op, uid) in enumerate(got))
                raise CallMismatch(f"ranks build different op objects ({listing}): every rank must build the same op "
                                   f"objects in the same order; {REBUILD}")
            self._group_ctrl = g.group_ctrl_ptr  # raises a clear DistError when the group has no P2P
        else:
            self._group_ctrl = 0
        self._make_streams(side_streams if self.world > 1 else 0)

    # --- resources ------------------------------------------------------------------------------
    def _device(self):
        import cupy

        return cupy.cuda.Device(self.device_id)

    def _make_streams(self, count: int) -> None:
        if count == 0:
            return  # world 1: no side work (and no CUDA call, so argument checks run anywhere)
        from cupy.cuda import runtime

        with self._device():
            self._streams = [int(runtime.streamCreateWithFlags(runtime.streamNonBlocking)) for _ in range(count)]
            flags = runtime.eventDisableTiming
            self._fork_event = int(runtime.eventCreateWithFlags(flags)) if count else 0
            self._join_events = [int(runtime.eventCreateWithFlags(flags)) for _ in range(count)]

    def symmetric(self, nbytes: int, tag: str):
        """Collective: a zeroed symmetric buffer owned by this op (freed by close())."""
        buf = self.group.symmetric(int(nbytes), f"{self.OP_NAME}#{self.uid}.{tag}")
        self._buffers.append(buf)
        return buf

    def kernel(self, relpath: str, name_expr: str):
        """A kernel of this op's device, loaded once (call at construction, never in a capture)."""
        key = (relpath, name_expr)
        k = self._kernels.get(key)
        if k is None:
            k = get_kernel(relpath, name_expr, device_id=self.device_id)
            self._kernels[key] = k
        return k

    @property
    def side_streams(self) -> list[int]:
        return list(self._streams)

    @property
    def group_ctrl_ptr(self) -> int:
        return self._group_ctrl

    @property
    def closed(self) -> bool:
        return self._closed

    # --- on-line tuning (rawflux/tune/collective.py) ------------------------------------------
    # An op that tunes provides _tune_id(m) (tune_key of its shape), _use_config(m, cfg),
    # _config_ok(cfg) and tune_candidates(m, top); tunable False: no group to agree with.
    tunable = True
    _agreed: dict | None = None  # agree_stored: {m: config JSON} every rank holds
    _every_on = False  # agree_stored: every rank runs RAWFLUX_TUNE=on

    def tune_key(self, shape: dict, dtype: str) -> str:
        """The fused-op table's key of this op's calls of ``shape``: GPU, SMs, world, ranks per GPU,
        topology and versions besides the op and the shape, so no result leaks to another setup."""
        from .. import tune

        g, dev = self.group, tune.device_info(self.device_id)
        bus = list(getattr(g, "bus_ids", ()) or ())
        per_gpu = sum(1 for b in bus if b == bus[self.rank]) if bus else 1
        topology = "shared-gpu" if per_gpu > 1 else ("p2p" if getattr(g, "peer_access", True) else "no-p2p")
        return tune.fused_key(self.OP_NAME, shape=shape, dtype=dtype, world=self.world, ranks_per_gpu=per_gpu, topology=topology,
                              gpu=dev.name, sms=dev.sms, versions=_versions())

    def agree_stored(self) -> None:
        """At the end of construction (collective): the stored tuning results of this op's calls,
        for every m, that every rank holds alike, and whether every rank tunes on first use. One
        bounded agreement per op object and none per call, so ranks that call with different m
        meet the device-side call check, not a host exchange. Ranks whose caches or RAWFLUX_TUNE
        differ fall back alike (to the op's default pick). Results this op tunes later are agreed
        by the tuning itself (the slowest rank decides) and join the set."""
        import hashlib
        import json

        from .. import env

        self._agreed, self._every_on = {}, False
        if self.world == 1 or not self.tunable:
            return
        mode = env.tune_mode()
        mine = {} if mode == "off" else self._stored_family()
        digest = 0
        if mine:
            raw = hashlib.sha1(json.dumps(sorted(mine.items()), sort_keys=True).encode()).digest()
            digest = int.from_bytes(raw[:8], "little") & (2**63 - 1) | 1  # never 0: 0 is "none"
        every = bounded_allgather(self.group, (digest, ("off", "cached", "on").index(mode)), f"{self.OP_NAME} tuning agreement")
        if digest != 0 and all(v[0] == digest for v in every):
            self._agreed = mine
        self._every_on = all(v[1] == 2 for v in every)

    def _stored_family(self) -> dict[int, dict]:
        """{m: config JSON} of this rank's fused-op table entries for this op (its _tune_id(m) for
        some m), configurations this build can run only."""
        import json

        from .. import tune

        out: dict[int, dict] = {}
        for key, entry in tune.fused_store().entries().items():
            try:
                m = json.loads(key)[1]["m"]
                if not isinstance(m, int) or key != self._tune_id(m):
                    continue
                cfg = tune.GemmConfig.from_json(entry["config"])
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            if self._config_ok(cfg):
                out[m] = entry["config"]
        return out

    def _stored(self, m: int):
        """The tuned GemmConfig for calls of m that every rank holds (agree_stored), else None
        (the op's default)."""
        from .. import env, tune

        if self.world == 1 or not self.tunable or env.tune_mode() == "off":
            return None
        hit = (self._agreed or {}).get(m)
        return tune.GemmConfig.from_json(hit) if hit is not None else None

    def gather_for_tuning(self, what: str):
        """gather(floats) for tune.collective.decide: every rank's tuple of floats, bounded (sent as
        their 64-bit patterns: bounded_allgather moves integers)."""
        def gather(vals):
            bits = np.asarray(vals, dtype=np.float64).view(np.int64).tolist()
            rows = bounded_allgather(self.group, bits, f"{self.OP_NAME} tuning ({what})")
            return [tuple(np.asarray(r, dtype=np.int64).view(np.float64).tolist()) for r in rows]

        return gather

    def _use_config(self, m: int, cfg) -> None:
        """Calls of m run ``cfg`` from now on (tuning): for ops that keep their plans per m in
        ``_plans`` (under ``_plans_lock``) and forced configurations in ``_forced``."""
        with self._plans_lock:
            self._forced[m] = cfg
            self._plans.pop(m, None)
        self.forget_fast()

    def tune_first_use(self, m: int, stream: int) -> None:
        """RAWFLUX_TUNE=on, the first call of m: tune unless every rank holds a stored result
        (collective: every rank makes the same first calls). Skipped inside a graph capture. The op
        provides _stored(m), _use_config(m, cfg), _tune_id(m) and tune(m, stream=)."""
        if is_capturing(stream):
            return
        stored = self._stored(m)  # agreed by every rank
        if stored is not None:
            self._use_config(m, stored)
            return
        if self._every_on:  # agreed at construction: every rank tunes, or none
            self.tune(m, stream=stream)

    def run_tuning(self, m: int, call, *, top: int, reps: int, budget_s: float | None, stream: int, label):
        """Time this op's candidates for calls of m (``call()`` makes one call on ``stream``), make
        the winner this op's configuration for m and store it; returns it (rows in last_tune)."""
        from .. import env, tune
        from ..tune.collective import format_rows

        budget = env.tune_budget_s() if budget_s is None else float(budget_s)
        best, rows = self.time_candidates(self.tune_candidates(m, top), lambda c: self._use_config(m, c), call, reps=reps,
                                          budget_s=budget, stream=stream, label=label, what=f"m={m} n={self.n} k={self.k}")
        self._use_config(m, best)
        self.last_tune = rows
        won = next(r for r in rows if r.label == label(best))
        # every rank writes the same entry (merged, so ranks sharing a cache folder lose nothing)
        tune.fused_store().put(self._tune_id(m), {"config": best.to_json(), "us": won.slowest_us, "table": format_rows(rows, label(best))})
        if self._agreed is not None:
            self._agreed[m] = best.to_json()  # the same decision on every rank
        return best

    def time_candidates(self, cands, use, call, *, reps: int, budget_s: float, stream: int, label, what: str):
        """tune.collective.decide over ``cands``: ``use(c)`` makes the op's next calls run c,
        ``call()`` makes one call on ``stream``; each candidate gets 3 warm-up calls, a device
        barrier (the ranks start together) and ``reps`` calls between two events."""
        import cupy

        from ..tune.collective import decide

        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        ext = cupy.cuda.ExternalStream(stream)

        def time_us(c) -> float:
            use(c)
            for _ in range(3):
                call()
            self.group.barrier(stream)  # the ranks start the timed calls together
            start.record(ext)
            for _ in range(reps):
                call()
            end.record(ext)
            end.synchronize()
            self.raise_if_failed()
            return cupy.cuda.get_elapsed_time(start, end) * 1e3 / reps

        return decide(cands, time_us, self.gather_for_tuning(what), budget_s=budget_s, label=label, progress=self.rank == 0,
                      title=f"tune {self.OP_NAME} {what}")

    def pipeline_timeout_ns(self) -> int:
        """Bound for the GEMM's internal pipeline waits (they trap): longer than any flag wait, so
        a late peer is reported by the flag wait's clear error, never by a trap."""
        return int((2.0 * self.group.timeout_s + 10.0) * 1e9)

    # --- per call -------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise DistError(f"this {self.OP_NAME} op object was closed")
        if self.group.closed:
            raise DistError(f"the group of this {self.OP_NAME} op object is closed; build a new op after rawflux.init()")

    def begin(self, stream: int, fields: tuple[int, ...]) -> None:
        """Start of a call, before any launch: the object is usable, no earlier device wait
        failed, and (RAWFLUX_DEBUG=1) every rank makes the same call."""
        self._check_open()
        if self.world > 1:
            self.raise_if_failed()
            if env.debug():
                self._debug_compare(tuple(int(x) for x in fields))
        self.calls += 1

    def fast_ready(self) -> bool:
        """begin()'s checks on the fast path, cheaply: False where begin() would raise or compare
        (the validated path then does, and says why)."""
        if self._closed or self.group.closed:
            return False
        return self.world == 1 or (self.group.healthy() and not env.debug())

    def fast_args(self, f, a, b, bias, out, stream):
        """(stream, out, a, b, out and bias pointers) of a fast call of entry f (fields stream,
        new_out, spans, out_span), or None where the validated path must look at the call: another
        stream, begin() would raise, no allocator for a missing out=, a misaligned pointer, or the
        output overlapping an input."""
        fw = fastpath.framework(a)
        s = fastpath.current_stream(fw, self.device_id) if stream is None else fastpath.stream_of(stream)
        if s != f.stream or not self.fast_ready():
            return None
        if out is None:
            if f.new_out is None or stream is not None:
                return None
            out = f.new_out()
        ptrs = fastpath.pointers(fw, a, b, bias, out, f.out_span, f.spans)
        return None if ptrs is None else (s, out, *ptrs)

    def fast_entry(self, key):
        """The fast-path entry of a call with metadata ``key`` (rawflux.runtime.fastpath), or None."""
        return None if key is None else self._fast.get(key)

    def remember_fast(self, key, entry) -> None:
        if key is None or entry is None:
            return
        with self._fast_lock:
            if len(self._fast) >= FAST_ENTRIES_MAX:
                self._fast.clear()
            self._fast[key] = entry

    def forget_fast(self) -> None:
        """Drop every fast-path entry (a plan they launch changed)."""
        with self._fast_lock:
            self._fast.clear()

    def capture(self, *args, stream=None, **kw) -> "CallGraph":
        """Collective: one call ``self(*args, **kw)`` captured into a CUDA graph. Its arrays (out=
        is required) become the graph's: write fresh inputs into them, then ``g.replay()``. The
        call runs once first (plans made, kernels loaded), on a private stream ordered after
        ``stream`` (default: the inputs' framework's current stream), and is captured there, so
        the caller's stream may be the legacy default one. Every rank captures the same calls
        in the same order and replays its graphs in that order."""
        import cupy

        from ..runtime import cupy_stream, stream_handle

        if kw.get("out") is None:
            raise ValueError(f"{self.OP_NAME}.capture: pass out=: a graph writes into the caller's buffer on every replay")
        fw = fastpath.framework(args[0]) if args else None
        with self._device():
            base = stream_handle(stream) if stream is not None else _current_stream(fw, self.device_id)
            side = cupy.cuda.Stream(non_blocking=True)
            ready = cupy.cuda.Event(disable_timing=True)
            ready.record(cupy_stream(base))
            side.wait_event(ready)  # the capture's warm-up call runs after the caller's queued work
            # An op may plan a captured call otherwise (ag_gemm's k-slabs count no host time): its
            # fast-path entries are eager calls' and are dropped on the way in and out.
            self.forget_fast()
            self.capturing = True
            try:
                self(*args, stream=side, **kw)  # outside the capture: compiles, plans and the fast-path entry
                side.begin_capture()
                try:
                    self(*args, stream=side, **kw)
                finally:
                    graph = side.end_capture()
            finally:
                self.capturing = False
                self.forget_fast()
            done = cupy.cuda.Event(disable_timing=True)
            done.record(side)
            cupy_stream(base).wait_event(done)  # the caller's later work runs after the warm-up call
        return CallGraph(graph, self, fw, side)

    def _debug_compare(self, fields: tuple[int, ...]) -> None:
        """Every rank's (op, op object, fields) through a bounded allgather: a rank that does not
        make the call yields CallMismatch after the group's timeout, never a hang."""
        vals = (int(self.OP_ID), int(self.uid)) + tuple(fields) + (0,) * (META_FIELDS_MAX - len(fields))
        metas = bounded_allgather(self.group, vals, f"{self.OP_NAME} call #{self.calls + 1} metadata (RAWFLUX_DEBUG=1 check)")
        if any(m != metas[0] for m in metas):
            names = ("op", "op object") + tuple(self.META_FIELDS)
            groups: dict[tuple, list[int]] = {}
            for q, m in enumerate(metas):
                groups.setdefault(m[: len(names)], []).append(q)
            lines = "; ".join(
                f"ranks {ranks}: " + ", ".join(f"{n}={_fmt_field(n, v) if n != 'op' else OP_NAMES.get(v, v)}" for n, v in zip(names, m))
                for m, ranks in groups.items()
            )
            raise CallMismatch(f"{self.OP_NAME}: ranks disagree on the call (RAWFLUX_DEBUG=1 check): {lines}")

    def raise_if_failed(self) -> None:
        """Raise CollectiveTimeout / CallMismatch if a device-side wait or check of this rank failed."""
        if self.world == 1:
            return
        rec = self.group.status
        if rec.state != STATE_OK:
            raise describe_failure(rec)

    def synchronize(self, stream=None) -> None:
        """Wait for ``stream`` (default: CuPy's current stream) then raise_if_failed()."""
        from ..runtime import resolve_stream

        from cupy.cuda import runtime

        try:
            with self._device():
                runtime.streamSynchronize(resolve_stream(stream))
        except runtime.CUDARuntimeError as e:
            raise_if_lost(e, f"{self.OP_NAME}.synchronize", self.group.failure_detail() if self.world > 1 else "")
            raise
        self.raise_if_failed()

    def barrier(self, stream: int) -> None:
        self.group.barrier(int(stream))

    def fork(self, stream: int, count: int | None = None) -> list[int]:
        """Side streams 0..count-1 wait for the work queued so far on ``stream``; returns them."""
        from cupy.cuda import runtime

        sides = self._streams[: len(self._streams) if count is None else count]
        if sides:
            runtime.eventRecord(self._fork_event, int(stream))
            for s in sides:
                runtime.streamWaitEvent(s, self._fork_event, 0)
        return sides

    def join(self, stream: int, count: int | None = None) -> None:
        """``stream`` waits for everything queued on side streams 0..count-1 (must match fork)."""
        from cupy.cuda import runtime

        n = len(self._streams) if count is None else count
        for s, ev in zip(self._streams[:n], self._join_events[:n]):
            runtime.eventRecord(ev, s)
            runtime.streamWaitEvent(int(stream), ev, 0)

    def call_record(self, fields: tuple[int, ...]) -> bytes:
        """The META_WORDS u32 words of this op's call record (comm/call_record.cuh), packed: word 0
        (the tag: the epoch, filled in on the device), the op id, then the call's fields."""
        return struct.pack(f"<{META_WORDS}I", *call_record(self.OP_ID, fields))

    # --- teardown -------------------------------------------------------------------------------
    def close(self) -> None:
        """Collective: free this op's symmetric buffers (device sync + group barrier first, in
        Group.free_symmetric), streams and events. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if not self.group.closed:
            for buf in reversed(self._buffers):
                self.group.free_symmetric(buf)
        self._buffers.clear()
        if not self._streams:
            return
        from cupy.cuda import runtime

        try:
            with self._device():
                for s in self._streams:
                    runtime.streamDestroy(s)
                for ev in self._join_events + ([self._fork_event] if self._fork_event else []):
                    runtime.eventDestroy(ev)
        except Exception:  # noqa: BLE001 - a broken context at teardown: nothing left to free
            pass
        self._streams, self._join_events, self._fork_event = [], [], 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# --------------------------------------------------------------------------------------------
# functional-form cache


def _current_stream(fw: str | None, device: int) -> int:
    return fastpath.current_stream(fw or "cupy", device)


class CallGraph:
    """One captured call of an op object (CollectiveOp.capture): ``replay(stream=None)`` runs it
    with whatever its arrays hold then, on ``stream`` (default: the current stream of the
    captured arrays' framework)."""

    def __init__(self, graph, op, fw: str | None, side):
        self._graph, self._op, self._fw, self._side = graph, op, fw, side  # side: the capture stream, kept alive
        self.replays = 0

    def replay(self, stream=None) -> None:
        from ..runtime import cupy_stream, stream_handle

        op = self._op
        op._check_open()
        if op.world > 1:
            op.raise_if_failed()  # a replay after a failed wait would wait again on a dead peer
        with op._device():
            s = stream_handle(stream) if stream is not None else _current_stream(self._fw, op.device_id)
            self._graph.launch(stream=cupy_stream(s))
        self.replays += 1


class _PrivateComm:
    """A communicator of the group's ranks reserved for OpCache agreements, made by a bounded
    Idup (a rank that never shows up yields an error, not a hang)."""

    def __init__(self):
        self.comm = None


_private: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


REBUILD = "close the group and make a new one (rawflux.finalize(), then rawflux.init()) before the next call"


def _bounded(group, req, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not req.Test():
        if time.monotonic() > deadline:
            _abandoned.append(req)  # a collective cannot be cancelled; keep it alive
            _broken[group] = what  # a later agreement would meet this one on the peers
            mark = getattr(group, "mark_failed", None)
            if mark is not None:
                mark(what)  # its close then waits for no peer
            raise CallMismatch(
                f"{what}: not every rank joined within {timeout_s:.1f} s: a rank raised on a bad argument, called "
                "with other shapes (a call that needs larger buffers on one rank only cannot proceed) or stopped "
                f"calling. Every rank must make the same calls with the same shapes; {REBUILD}"
            )
        time.sleep(0.0005)


_abandoned: list = []
_broken: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@functools.lru_cache(maxsize=1)
def _versions() -> dict:
    """rawflux's, the CUDA driver's and NVRTC's versions (a tuning key's; read once)."""
    from .._version import __version__
    from ..jit import nvrtc_version

    try:
        from cupy.cuda import runtime

        v = int(runtime.driverGetVersion())
        driver = f"{v // 1000}.{v % 1000 // 10}"
    except Exception:  # noqa: BLE001 - no driver: the key still separates it
        driver = "unknown"
    return {"rawflux": __version__, "driver": driver, "nvrtc": ".".join(map(str, nvrtc_version()))}


def scratch_matrix(shape, dtype, seed: int):
    """A random 16-bit CuPy matrix on the current device, for timing (normal values cut to 16 bits)."""
    import cupy

    from ..runtime import DType

    x = cupy.random.default_rng(seed).standard_normal(shape, dtype=cupy.float32)
    if dtype == DType.F16:
        return x.astype(cupy.float16)
    return (x.view(cupy.uint32) >> 16).astype(cupy.uint16).view(dtype.np)


def bounded_allgather(group, value, what: str, timeout_s: float | None = None) -> list:
    """allgather of a small picklable value over the group's agreement communicator (a Group's
    agree_comm; else a private duplicate of group.comm), giving up with CallMismatch after
    ``timeout_s`` (default: the group's wait timeout). After one gave up, every later one on the
    group raises at once: its request would meet the abandoned one on the peers."""
    timeout_s = float(group.timeout_s if timeout_s is None else timeout_s)
    if getattr(group, "closed", False):
        raise DistError(f"{what}: the group is closed (rawflux.finalize() or Group.close() ran); call rawflux.init() again")
    failed = _broken.get(group)
    if failed is not None:
        raise CallMismatch(f"{what}: an earlier agreement on this group ({failed}) timed out; {REBUILD}")
    comm = getattr(group, "agree_comm", None)
    if comm is None:
        priv = _private.get(group)
        if priv is None:
            priv = _PrivateComm()
            dup, req = group.comm.Idup()
            _bounded(group, req, timeout_s, f"{what} (communicator setup)")
            priv.comm = dup
            _private[group] = priv
        comm = priv.comm
    # Fixed-size exchange so a non-blocking allgather works with buffers: pickle is not needed.
    vals = np.asarray(value, dtype=np.int64).reshape(-1)
    out = np.zeros((comm.Get_size(), vals.size), dtype=np.int64)
    req = comm.Iallgather(vals, out)
    _bounded(group, req, timeout_s, what)
    return [tuple(int(x) for x in row) for row in out]


class FunctionalFast:
    """A functional form's fast path: (group, options, call metadata) -> the op object a
    validated call with them ran on, whose fast-path entry for the metadata holds the launch."""

    def __init__(self):
        self._ops: dict[tuple, object] = {}

    def call(self, group, options: tuple, key: tuple, *args):
        """The op's fast call for these arguments, or None (the caller takes the validated path)."""
        try:
            g = resolve_group(group)
        except DistError:
            return None  # the validated path says what is missing, after the argument checks
        op = self._ops.get((id(g),) + options + key)
        if op is None or op.group is not g:
            return None
        f = op.fast_entry(key)
        return None if f is None else op._fast_call(f, *args)

    def remember(self, options: tuple, key: tuple, op, entry) -> None:
        op.remember_fast(key, entry)
        if len(self._ops) >= FAST_ENTRIES_MAX:
            self._ops.clear()
        self._ops[(id(op.group),) + options + key] = op

    def clear(self) -> None:
        self._ops.clear()

    def __len__(self) -> int:
        return len(self._ops)

    def values(self):
        return self._ops.values()


class OpCache:
    """Op objects for the functional forms, one per key, grown to the largest capacity any rank
    needs. Growth is collective: every rank must make the same calls (bounded: a rank that does
    not join raises CallMismatch on the others within the group's wait timeout)."""

    def __init__(self, make, capacity_of):
        self._make = make  # (group, key, capacity) -> op
        self._capacity_of = capacity_of  # op -> capacity
        self._ops: dict[tuple, object] = {}
        self._lock = threading.Lock()

    def get(self, group, key: tuple, need: int, *, stream: int | None = None, round_to: int = 1):
        full_key = (id(group),) + tuple(key)
        with self._lock:
            op = self._ops.get(full_key)
            if op is not None and (op.closed or op.group is not group or group.closed):
                self._ops.pop(full_key, None)
                op = None
            if op is not None and self._capacity_of(op) >= need:
                return op
            if stream is not None and is_capturing(stream):
                have = self._capacity_of(op) if op is not None else 0
                raise RuntimeError(
                    f"this call needs buffers for {need} rows but the cached op holds {have}: growing them "
                    "allocates memory, which a CUDA graph capture forbids. Make one call with the largest "
                    "size before capturing, or build the op object (sized once) yourself"
                )
            want = _round_up(max(need, 2 * (self._capacity_of(op) if op is not None else 0)), round_to)
            if group.world > 1:
                agreed = bounded_allgather(group, (want,), f"growing the cached op buffers for key {key}")
                want = max(v[0] for v in agreed)
            if op is not None:
                op.close()
            op = self._make(group, key, want)
            self._ops[full_key] = op
            return op

    def peek(self, group, key: tuple):
        """The op object cached for (group, key), or None (no growth, no communication)."""
        with self._lock:
            return self._ops.get((id(group),) + tuple(key))

    def clear(self) -> None:
        with self._lock:
            ops = list(self._ops.values())
            self._ops.clear()
        for op in ops:
            if not op.group.closed:
                op.close()


def _round_up(x: int, to: int) -> int:
    return -(-int(x) // int(to)) * int(to)


__all__ = [
    "CallMismatch", "CollectiveOp", "DTYPE_CODE", "call_record", "META_FIELDS_MAX", "OpCache", "STATE_CALL_MISMATCH",
    "bounded_allgather", "check_capacity", "check_divisible", "describe_failure", "is_capturing", "resolve_group",
]
