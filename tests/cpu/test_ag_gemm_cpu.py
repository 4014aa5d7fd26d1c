"""rawflux.ag_gemm with no GPU: the protocol as data (orders, permutations, a simulation of every
rank's gathered buffer and flags), the chunk math of the wait prologue, the Python mirrors of the
CUDA parameter structs (checked by NVRTC static_asserts), the kernels compile without spills,
call-record mismatch messages, and every argument check's error before any launch."""
from __future__ import annotations

import itertools
import struct
import re
import numpy as np
import pytest

from rawflux.dist.layout import OP_AG_GEMM, StatusRecord
from rawflux.ops import _collective as C
from rawflux.ops import ag_gemm as A
from rawflux.tune.ag_order import row_shift
from rawflux.runtime import DType, arrays
from tests.fake_group import FakeGroup, OpGroup

WORLDS = (2, 3, 4, 8)


# --------------------------------------------------------------------------------------------
# protocol


@pytest.mark.parametrize("world", WORLDS)
def test_every_step_is_a_permutation(world):
    for order in (A.push_targets, A.pull_sources):
        table = [order(r, world) for r in range(world)]
        for step in range(world - 1):
            targets = [table[r][step] for r in range(world)]
            assert sorted(targets) == list(range(world)), (order.__name__, step, targets)
            assert all(t != r for r, t in enumerate(targets))  # nobody copies to / from itself


@pytest.mark.parametrize("world", WORLDS)
def test_push_delivers_chunks_in_the_gemm_order(world):
    # At step s rank r writes chunk r into rank r - s; so rank q receives chunk q + s at step s.
    received = {q: [] for q in range(world)}
    for step in range(world - 1):
        for r in range(world):
            received[A.push_targets(r, world)[step]].append(r)
    for q in range(world):
        assert [q] + received[q] == A.arrival_order(q, world)
        # the engine's rotation visits segments q, q+1, ... (upward): the first remote chunk it
        # needs is the first to arrive
        assert A.arrival_order(q, world)[1] == (q + 1) % world


@pytest.mark.parametrize("world", WORLDS)
def test_pull_fetches_in_the_gemm_order(world):
    for r in range(world):
        assert [r] + A.pull_sources(r, world) == A.arrival_order(r, world)


def _simulate(direction, copy, world, sides, m_local=3, k=8, seed=0, slabs=1):
    """Run every rank's schedule on host buffers (each side stream in order, streams in
    any interleaving), check flags are set only after their data and every buffer ends full.
    slabs > 1: each copy moves k / slabs columns and each flag covers them."""
    rng = np.random.default_rng(seed)
    shards = [rng.standard_normal((m_local, k)) for _ in range(world)]
    gath = [np.full((world * m_local, k), np.nan) for _ in range(world)]
    ready = [np.zeros((world, slabs), dtype=np.int64) for _ in range(world)]
    epoch = 7
    # phase 1: the call's start on every rank (pull: after a barrier): own rows, the arrival;
    # phase 2: the copies, each of which needs its peer's arrival (all arrived after phase 1)
    queues = []
    for r in range(world):
        steps = A.schedule(direction, copy, r, world, sides, slabs)
        kinds = [s.kind for s in steps]
        start = kinds.index("local")
        assert kinds[:start + 1] == (["barrier", "local"] if direction == "pull" else ["local"]), kinds
        assert kinds.count("barrier") == (direction == "pull")  # push needs none
        gath[r][r * m_local:(r + 1) * m_local] = shards[r]
        after = steps[start + 1:]
        if copy == "ce":
            # the record check is the call's start's (its gate): no kernel on a side stream
            assert after[0].kind == "fork" and [st.kind for st in after][-2:] == ["gemm", "join"]
        else:  # one stream: the copy kernel (which compares the records), then the GEMM as its programmatic dependent
            assert [st.kind for st in after] == ["sm_copy", "gemm"]
        work = [s for s in after if s.kind in ("copy", "flag", "sm_copy")]
        if any(s.kind == "sm_copy" for s in work):
            work = A.sm_copy_steps(direction, r, world, slabs)
        per_side = {}
        for s in work:
            per_side.setdefault(s.side, []).append((r, s))
        queues += list(per_side.values())
    # interleave the side queues round-robin (any interleaving must work)
    pos = [0] * len(queues)
    while any(p < len(q) for p, q in zip(pos, queues)):
        for qi, q in enumerate(queues):
            if pos[qi] >= len(q):
                continue
            r, s = q[pos[qi]]
            pos[qi] += 1
            rows = slice(s.chunk * m_local, (s.chunk + 1) * m_local)
            cols = slice(s.slab * (k // slabs), (s.slab + 1) * (k // slabs))
            if s.kind == "copy":
                src = shards[r][:, cols] if s.src == "shard" else gath[s.src_rank][rows, cols]
                assert not np.isnan(src).any(), f"rank {r} copies chunk {s.chunk} before it exists"
                gath[s.dst_rank][rows, cols] = src
            else:
                assert ready[s.dst_rank][s.chunk, s.slab] < epoch
                assert np.array_equal(gath[s.dst_rank][rows, cols], shards[s.chunk][:, cols]), "flag set before its data"
                ready[s.dst_rank][s.chunk, s.slab] = epoch
    full = np.concatenate(shards)
    for r in range(world):
        assert np.array_equal(gath[r], full), f"rank {r}'s gathered buffer"
        assert all((ready[r][q] == epoch).all() for q in range(world) if q != r), f"rank {r}'s flags {ready[r]}"
        assert (ready[r][r] == 0).all()  # the own chunk needs no flag: it is in place before the GEMM


@pytest.mark.parametrize("slabs", [1, 2, 8])
@pytest.mark.parametrize("direction,copy,sides", [("push", "ce", 1), ("pull", "ce", 1), ("push", "ce", 3), ("pull", "ce", 2),
                                                  ("push", "sm", 1), ("pull", "sm", 1)])
@pytest.mark.parametrize("world", WORLDS)
def test_schedule_gathers_everything(direction, copy, sides, world, slabs):
    _simulate(direction, copy, world, sides, slabs=slabs)


@pytest.mark.parametrize("copy", ["ce", "sm"])
def test_slabs_go_slab_major(copy):
    """Every peer's slab j is sent before any slab j + 1 (the order the link emulator and the
    planner assume: a tile's first slab lands after one slab of each peer, not after whole chunks)."""
    for world in (2, 4, 8):
        for r in range(world):
            steps = A.schedule("push", copy, r, world, 1, 4) if copy == "ce" else A.sm_copy_steps("push", r, world, 4)
            sl = [st.slab for st in steps if st.kind == "copy"]
            assert sl == sorted(sl) and len(sl) == 4 * (world - 1)


def test_simulation_can_fail():
    # flag before the data: the simulation must notice
    orig = A.schedule

    def broken(direction, copy, rank, world, sides=1, slabs=1):
        steps = orig(direction, copy, rank, world, sides, slabs)
        i = next(i for i, s in enumerate(steps) if s.kind == "copy")
        steps[i], steps[i + 1] = steps[i + 1], steps[i]
        return steps

    A.schedule = broken
    try:
        with pytest.raises(AssertionError, match="flag set before its data"):
            _simulate("push", "ce", 4, 1)
    finally:
        A.schedule = orig


@pytest.mark.parametrize("direction", ["push", "pull"])
@pytest.mark.parametrize("copy", ["ce", "sm"])
def test_every_producer_is_queued_before_the_gemm_that_waits(direction, copy):
    # With one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1) a spinning GEMM queued first would
    # hold back the copies it waits for: every copy and flag must be issued before the GEMM.
    kinds = [s.kind for s in A.schedule(direction, copy, 1, 4)]
    producers = [i for i, k in enumerate(kinds) if k in ("copy", "flag", "sm_copy", "local")]
    assert producers and max(producers) < kinds.index("gemm")
    if copy == "ce":
        assert kinds.index("fork") < kinds.index("gemm") < kinds.index("join")
    else:  # the GEMM directly follows the copy kernel on one stream (its programmatic dependent)
        assert kinds.index("sm_copy") == kinds.index("gemm") - 1 and "fork" not in kinds and "join" not in kinds


def test_schedule_rejects_unknown_modes():
    with pytest.raises(ValueError):
        A.schedule("sideways", "ce", 0, 2)


def test_chunk_span_matches_brute_force():
    for m_local, m0, rows in itertools.product((1, 3, 64, 100, 128), range(0, 400, 7), (1, 5, 64, 128)):
        first, last = A.chunk_span(m0, rows, m_local)
        touched = sorted({r // m_local for r in range(m0, m0 + rows)})
        assert (first, last) == (touched[0], touched[-1])
    assert A.chunk_span(10, 0, 4) == (0, -1)


def test_default_copy_sms(monkeypatch):
    monkeypatch.delenv("RAWFLUX_AG_COPY_SMS", raising=False)
    assert A.default_copy_sms(132) == 16
    assert A.default_copy_sms(14) == 3
    assert A.default_copy_sms(2) == 1
    monkeypatch.setenv("RAWFLUX_AG_COPY_SMS", "200")
    assert A.default_copy_sms(132) == 131
    monkeypatch.setenv("RAWFLUX_AG_COPY_SMS", "0")
    with pytest.raises(ValueError, match="RAWFLUX_AG_COPY_SMS"):
        A.default_copy_sms(132)


def test_env_switches(monkeypatch):
    from rawflux import env

    monkeypatch.setenv("RAWFLUX_AG_DIRECTION", "PULL")
    monkeypatch.setenv("RAWFLUX_AG_COPY", "sm")
    assert env.ag_direction() == "pull" and env.ag_copy() == "sm"
    monkeypatch.setenv("RAWFLUX_AG_DIRECTION", "both")
    with pytest.raises(ValueError, match="push' or 'pull"):
        env.ag_direction()


# --------------------------------------------------------------------------------------------
# CUDA side: struct mirrors and compilation (NVRTC, no GPU)

nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
from rawflux.jit import compile_cubin, kernel_source  # noqa: E402


def _layout_asserts() -> str:
    lines = ['#include "rawflux/fused/ag_gemm.cuh"', "namespace rawflux {"]

    def fields(struct_name, st: "struct.Struct", names, base: int = 0):
        # st's fields from byte `base` of the struct (pad bytes 'Nx' end it)
        lines.append(f'static_assert(sizeof({struct_name}) == {base + st.size}, "{struct_name} size");')
        off = base
        codes = [c for c in re.findall(r"\d*[a-zA-Z]", st.format.lstrip("<")) if not c.endswith("x")]
        assert len(codes) == len(names), (struct_name, codes, names)
        for name, code in zip(names, codes):
            if name:
                lines.append(f'static_assert(__builtin_offsetof({struct_name}, {name}) == {off}, "{struct_name}.{name}");')
            off += {"Q": 8, "q": 8, "i": 4, "I": 4}[code]

    lines.append(f'static_assert(__builtin_offsetof(AgWait::Params, own_map) == 0 && sizeof(TensorMap) == {A.OWN_MAP_BYTES}, "own map");')
    fields("AgWait::Params", A.AG_WAIT_PARAMS, ("group_ctrl", "ready", "epoch", "m_local", "rank", "world", "slab_kb", "b_first", "own_rows"),
           base=A.OWN_MAP_BYTES)
    fields("AgLocalArgs", A.AG_LOCAL_ARGS,
           ("group_ctrl", "src", "dst", "sync", "sync_peers", "src_pitch", "m_local", "row_vecs", "flags", "head", "tail", "pad"))
    fields("AgCopyArgs", A.AG_COPY_ARGS,
           ("group_ctrl", "src", "gath_peers", "sync", "sync_peers", "counters", "src_pitch", "m_local", "row_vecs", "mode", "slabs"))
    lines += [
        f'static_assert(sizeof(CallRecord) == {A.CALL_RECORD.size}, "CallRecord");',
        f'static_assert(kMetaWords == {C.META_WORDS} && kMetaSlotBytes == {C.META_SLOT_BYTES}, "meta words");',
        f'static_assert(kAgEpochOffset == {A.EPOCH_OFFSET} && kAgLocalDoneOffset == {A.LOCAL_DONE_OFFSET}, "sync: epoch, done");',
        f'static_assert(kAgArriveOffset == {A.ARRIVE_OFFSET} && kAgReadyOffset == {A.READY_OFFSET}, "sync: arrive, ready");',
        f'static_assert(kAgRecordsOffset == {A.RECORDS_OFFSET} && kAgSyncBytes == {A.SYNC_BYTES}, "sync: records, size");',
        f'static_assert(kAgArriveLate == {A.LOCAL_ARRIVE_LATE} && kAgGate == {A.LOCAL_GATE}, "local flags");',
        f'static_assert(kAgMaxSlabs == {A.MAX_SLABS} && kAgCopyCounters == {A.COPY_COUNTERS}, "slabs, copy counters");',
        f'static_assert(ag_ready_index(3, 5) == {A.ready_index(3, 5)}, "ready index");',
        f'static_assert(kStateCallMismatch == {C.STATE_CALL_MISMATCH}, "mismatch state");',
        f'static_assert(kAgPush == {A.DIRECTIONS["push"]} && kAgPull == {A.DIRECTIONS["pull"]}, "directions");',
        f'static_assert(kOpAgGemm == {OP_AG_GEMM}, "op id");',
        # the fast path patches a_shard's pointer into packed argument blocks at SRC_OFFSET
        f'static_assert(__builtin_offsetof(AgLocalArgs, src) == {A.SRC_OFFSET} && '
        f'__builtin_offsetof(AgCopyArgs, src) == {A.SRC_OFFSET} && sizeof(u64) == {A.SRC.size}, "fast path src");',
        "}  // namespace rawflux",
        "__global__ void ag_layout_probe() {}",
    ]
    return "\n".join(lines) + "\n"


def test_param_structs_match_cuda():
    compile_cubin(_layout_asserts(), arch="sm_90a")


def test_param_struct_check_can_fail():
    broken = _layout_asserts().replace("AgCopyArgs, mode) == 64", "AgCopyArgs, mode) == 68")
    assert broken != _layout_asserts()
    with pytest.raises(Exception, match="AgCopyArgs.mode"):
        compile_cubin(broken, arch="sm_90a")


def _no_spills(res, names):
    for name in names:
        r = res.resources[res.lowered[name]]
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, (name, r)


def test_copy_kernels_compile_without_spills():
    names = (A.LOCAL_KERNEL, A.COPY_KERNEL)
    res = compile_cubin(kernel_source(A.KERNEL_FILE), arch="sm_90a", name_expressions=names, filename=A.KERNEL_FILE)
    _no_spills(res, names)


@pytest.mark.parametrize("layout,dtype", [("nk", DType.BF16), ("kn", DType.F16)])
def test_gemm_with_wait_prologue_compiles_without_spills(layout, dtype):
    from rawflux import tune

    tile = next(t for t in tune.tiles_for(layout))
    name = A.engine.kernel_name(tile, dtype, dtype, layout, prologue=A.PROLOGUE, epilogue=A.engine.plain_epilogue(dtype))
    _no_spills(compile_cubin(kernel_source(A.KERNEL_FILE), arch="sm_90a", name_expressions=(name,), filename=A.KERNEL_FILE), (name,))


def test_every_ag_variant_is_registered():
    from rawflux.jit import variants

    names = {v.name_expr for v in variants() if v.relpath == A.KERNEL_FILE}
    assert {A.LOCAL_KERNEL, A.COPY_KERNEL} <= names
    assert sum(A.PROLOGUE in n for n in names) >= 8


# --------------------------------------------------------------------------------------------
# call-record mismatch messages


def _rec(**kw):
    base = dict(state=C.STATE_CALL_MISMATCH, op=OP_AG_GEMM, call_id=9, waiter=0, peer=2, index=2, expected=128,
                observed=96, elapsed_ns=0, timeout_ns=10**10, late_mask=4, abort_from=0)
    base.update(kw)
    return StatusRecord(**base)


def test_mismatch_message_names_ranks_and_field():
    e = C.describe_failure(_rec())
    assert isinstance(e, C.CallMismatch) and e.peer == 2
    msg = str(e)
    assert "ag_gemm call #9" in msg and "m_local: rank 0 has 128, rank 2 has 96" in msg


def test_mismatch_message_dtype_and_missing_call():
    assert "dtype: rank 0 has bf16, rank 2 has f16" in str(C.describe_failure(_rec(index=4, expected=1, observed=2)))
    assert "did not make this call" in str(C.describe_failure(_rec(index=0, expected=9, observed=7)))


def test_timeouts_keep_dist_message():
    e = C.describe_failure(_rec(state=1, index=3))
    assert type(e) is C.CollectiveTimeout and "did not signal" in str(e)


# --------------------------------------------------------------------------------------------
# argument checks (a world-1 op object on fake device memory; nothing is launched)

BASE = 0x7F00_0000_0000


class FakeCAI:
    def __init__(self, ptr, shape, typestr="<V2", strides=None):
        self.__cuda_array_interface__ = {"version": 3, "data": (ptr, False), "shape": tuple(shape), "typestr": typestr,
                                         "strides": strides}


@pytest.fixture
def op(monkeypatch):
    monkeypatch.setattr(arrays, "pointer_device", lambda ptr: 0)
    from rawflux import tune

    monkeypatch.setattr(tune, "device_info", lambda dev: tune.DeviceInfo(132, (9, 0), 50 << 20, "fake"))
    group = FakeGroup(rank=0, world=1, device_id=0, timeout_s=5.0, closed=False)
    o = A.AGGemm(group, 256, 64, 128, "bf16")
    # Any launch would be a bug in these tests: make it loud.
    monkeypatch.setattr(A, "gemm", lambda *a, **k: (_ for _ in ()).throw(AssertionError("launched")))
    return o


def _a(rows=64, k=128, ptr=BASE, typestr="<V2", strides=None):
    return FakeCAI(ptr, (rows, k), typestr, strides)


def _b(n=64, k=128, ptr=BASE + (1 << 24)):
    return FakeCAI(ptr, (n, k))


@pytest.mark.parametrize("call,match", [
    (lambda op: op(_a(k=64), _b()), r"a_shard has shape \(64, 64\) but \(\*, 128\)"),
    (lambda op: op(_a(rows=300), _b()), r"m = 300 x 1 ranks = 300, above this op's max_m = 256"),
    (lambda op: op(_a(rows=0), _b()), r"no rows"),
    (lambda op: op(_a(typestr="<f4"), _b()), r"a_shard has dtype f32 but must be bf16"),
    (lambda op: op(_a(), _b(n=32)), r"b has shape \(32, 128\) but \(64, 128\)"),
    (lambda op: op(_a(ptr=BASE + 8), _b()), r"not 16-byte aligned"),
    (lambda op: op(_a(), _b(), bias=FakeCAI(BASE + (2 << 24), (32,))), r"bias must have shape \(64,\)"),
    (lambda op: op(_a(), _b(), gathered_out=FakeCAI(BASE + (3 << 24), (32, 128))), r"gathered_out has shape"),
    (lambda op: op(_a(), _b(), gathered_out=FakeCAI(BASE + 256, (64, 128))), r"overlaps input a_shard"),
    (lambda op: op(_a(), _b(), config="fast"), r"config must be a rawflux.tune.GemmConfig"),
])
def test_bad_calls_raise_before_launch(op, call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(lambda *a, **k: op(*a, stream=0, **k))  # an explicit stream: no CUDA call to find one


@pytest.mark.parametrize("kwargs,match", [
    (dict(n=60), r"n = 60 .* multiple of 8"),
    (dict(k=12), r"k = 12 must be a positive multiple of 8"),
    (dict(dtype="f32"), r"dtype must be bf16 or f16"),
    (dict(b_layout="mk"), r"b_layout must be 'nk'"),
    (dict(direction="up"), r"direction must be 'push' or 'pull'"),
    (dict(copy="dma"), r"copy must be 'ce'"),
    (dict(max_m=0), r"max_m = 0 must be at least the world size"),
    (dict(out_dtype="f16"), r"out_dtype f16 is not supported for bf16"),
])
def test_bad_construction_raises(monkeypatch, kwargs, match):
    from rawflux import tune

    monkeypatch.setattr(tune, "device_info", lambda dev: tune.DeviceInfo(132, (9, 0), 50 << 20, "fake"))
    group = FakeGroup(rank=0, world=1, device_id=0, timeout_s=5.0, closed=False)
    args = dict(max_m=256, n=64, k=128, dtype="bf16") | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        A.AGGemm(group, args.pop("max_m"), args.pop("n"), args.pop("k"), args.pop("dtype"), **args)


def test_functional_form_checks(monkeypatch):
    monkeypatch.setattr(arrays, "pointer_device", lambda ptr: 0)
    group = FakeGroup(rank=0, world=2, device_id=0, timeout_s=5.0, closed=False)
    with pytest.raises(ValueError, match="k differs"):
        A.ag_gemm(_a(), FakeCAI(BASE + (1 << 24), (64, 96)), group, stream=0)
    with pytest.raises(TypeError, match="bf16 or f16"):
        A.ag_gemm(_a(typestr="<f4"), _b(), group, stream=0)
    with pytest.raises(ValueError, match="direction must be"):
        A.ag_gemm(_a(), _b(), group, direction="x", stream=0)


# --------------------------------------------------------------------------------------------
# OpCache (world 1: no agreement needed)


class _FakeOp:
    def __init__(self, group, key, cap):
        self.group, self.key, self.max_m, self.closed = group, key, cap, False

    def close(self):
        self.closed = True


def test_op_cache_grows_and_reuses():
    made = []

    def make(group, key, cap):
        made.append(cap)
        return _FakeOp(group, key, cap)

    cache = C.OpCache(make, lambda op: op.max_m)
    g = FakeGroup(world=1, closed=False, timeout_s=1.0)
    a = cache.get(g, ("k",), 100, round_to=64)
    assert a.max_m == 128 and cache.get(g, ("k",), 128) is a
    b = cache.get(g, ("k",), 129, round_to=64)
    assert b is not a and a.closed and b.max_m == 256  # doubles: few regrowths over a run
    assert cache.get(g, ("other",), 10).max_m == 10
    assert made == [128, 256, 10]


# --------------------------------------------------------------------------------------------
# a whole call at world 4 with every CUDA entry point faked: what is issued, in which order, with
# which pointers (catches host-side slips that only a GPU run would otherwise show)


class _Kernel:
    def __init__(self, name, log):
        self.name, self.log, self.handle, self.symbol = name, log, hash(name), name

    def launch(self, grid, block, args, stream=None, **kw):
        self.log.append(("kernel", self.name.split("::")[-1], stream))

    def set_max_dynamic_smem(self, n):
        pass


@pytest.fixture
def fake_cuda(monkeypatch):
    import cupy
    from cupy.cuda import runtime

    from rawflux import engine as E
    from rawflux import tune
    from rawflux.engine import planning as P

    log = []
    monkeypatch.setattr(arrays, "pointer_device", lambda ptr: 0)
    monkeypatch.setattr(tune, "device_info", lambda dev: tune.DeviceInfo(132, (9, 0), 50 << 20, "fake"))
    handles = itertools.count(0x100)
    monkeypatch.setattr(runtime, "streamCreateWithFlags", lambda flags: next(handles))
    monkeypatch.setattr(runtime, "eventCreateWithFlags", lambda flags: next(handles))
    monkeypatch.setattr(runtime, "eventRecord", lambda ev, s: log.append(("record", ev, s)))
    monkeypatch.setattr(runtime, "streamWaitEvent", lambda s, ev, flags=0: log.append(("wait", s, ev)))
    monkeypatch.setattr(runtime, "memcpyAsync", lambda dst, src, n, kind, s: log.append(("memcpy", dst, src, n, s)))
    monkeypatch.setattr(runtime, "memcpy2DAsync",
                        lambda dst, dp, src, sp, w, h, kind, s: log.append(("memcpy2d", dst, src, w * h, s, dp, sp, w, h)))

    class _Dev:
        def __init__(self, *a):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *e):
            return False

        def synchronize(self):
            pass

    monkeypatch.setattr(cupy.cuda, "Device", _Dev)

    class _Arr:
        data = types_ns(ptr=0x7000_0000)

    monkeypatch.setattr(cupy, "zeros", lambda *a, **k: _Arr())
    monkeypatch.setattr(C, "get_kernel", lambda rel, name, device_id=None: _Kernel(name, log))
    cfg = tune.GemmConfig(next(iter(tune.TILES)), tune.Decomp.split_k(3))
    monkeypatch.setattr(E, "pick_config", lambda *a, **k: cfg)
    plans = []

    def fake_plan(cfg, m, n, k, **kw):  # a real GemmPlan, without a device or a compile
        plans.append((cfg, m, n, k, kw))
        work = tune.work_plan(m, n, k, cfg, 132)
        params = E.pack_params(cfg, m, n, k, work, seg_count=kw.get("seg_count", 1), seg_start=kw.get("seg_start", 0),
                               timeout_ns=kw["timeout_ns"])
        return E.GemmPlan(cfg, "gemm_kernel", E.KernelOptions(False, 0, 2), _Kernel("gemm_kernel", log), work, 132, 384, 2, 200000,
                          params, (128, 64), (128, 64), 40, (m, n, k), kw["b_layout"], 9)

    def fake_launch(kern, grid, threads, cluster, smem, s, args, pdl=False):
        log.append(("launch", kern.name.split("::")[-1], s, grid, args) + (("pdl",) if pdl else ()))

    monkeypatch.setattr(E, "plan", fake_plan)
    monkeypatch.setattr(P, "tensor_map_code", fake_map)
    monkeypatch.setattr(E, "epilogue_params", lambda epilogue, c_ptr, *a: (epilogue, c_ptr) + a)
    monkeypatch.setattr(E, "launch", fake_launch)
    monkeypatch.setattr(P, "launch", fake_launch)
    yield log, plans


def fake_map(ptr, code, rows, cols, ld, box_rows, box_cols) -> bytes:
    """A 'tensor map' of 128 bytes that spells its arguments (read_map reads them back)."""
    return struct.pack("<7q", ptr, code, rows, cols, ld, box_rows, box_cols) + bytes(128 - 56)


def read_map(raw: bytes) -> tuple:
    """fake_map's (ptr, code, rows, cols, ld, box_rows, box_cols)."""
    return struct.unpack("<7q", raw[:56])


def types_ns(**kw):
    import types

    return types.SimpleNamespace(**kw)


@pytest.mark.parametrize("b_first", [True, False])
def test_b_first_reaches_the_prologue(fake_cuda, b_first):
    # AGGemm(b_first=) is AgWait::Params.b_first of the GEMM's launch (the CUDA layout: _layout_asserts)
    log, _ = fake_cuda
    rank, world, m_loc, n, k = 1, 4, 100, 64, 128
    op = A.AGGemm(OpGroup(rank, world, log), world * 128, n, k, "bf16", b_first=b_first)
    op(FakeCAI(BASE, (m_loc, k)), FakeCAI(BASE + (2 << 30), (n, k)), out=FakeCAI(BASE + (1 << 30), (m_loc * world, n)), stream=0x42)
    g = next(e for e in log if e[0] == "launch" and e[1] == "gemm_kernel")
    assert A.AG_WAIT_PARAMS.unpack(g[4][3][A.OWN_MAP_BYTES:])[7] == int(b_first)


@pytest.mark.parametrize("slabs", [1, 2])
@pytest.mark.parametrize("direction,copy", [("push", "ce"), ("pull", "ce"), ("push", "sm"), ("pull", "sm")])
def test_a_call_issues_the_protocol(fake_cuda, direction, copy, slabs):
    log, plans = fake_cuda
    rank, world, m_loc, n, k = 1, 4, 100, 64, 128
    row = 2 * k
    op = A.AGGemm(OpGroup(rank, world, log), world * 128, n, k, "bf16", direction=direction, copy=copy, slabs=slabs)
    main = 0x42
    a = FakeCAI(BASE, (m_loc, k))
    out = FakeCAI(BASE + (1 << 30), (m_loc * world, n))
    b = FakeCAI(BASE + (2 << 30), (n, k))
    log.clear()
    res = op(a, b, out=out, stream=main)
    assert res is out
    kinds = [e[0] if e[0] not in ("kernel", "launch") else e[1] for e in log]
    gath, sync = op._gath, op._sync
    chunk = m_loc * row
    # the call's start, on the main stream: own rows, the op's sync buffers, the call record
    local = next(e for e in log if e[0] == "launch" and e[1] == "ag_local_kernel")
    args = A.AG_LOCAL_ARGS.unpack(local[4][0])
    assert local[2] == main and args[2] == gath.ptr + rank * chunk and args[1] == BASE and args[6] == m_loc
    assert args[3:5] == (sync.ptr, sync.peer_table_ptr)
    assert args[8] == (A.LOCAL_ARRIVE_LATE if direction == "pull" else 0) | (A.LOCAL_GATE if copy == "ce" else 0)
    record = A.CALL_RECORD.unpack(local[4][1])
    assert record[:9] == (0, OP_AG_GEMM, m_loc, k, C.DTYPE_CODE[DType.BF16], A.DIRECTIONS[direction], A.COPIES[copy], 128, slabs)
    # push: no barrier at all; pull: one, before the call's start
    barriers = [i for i, kd in enumerate(kinds) if kd == "barrier"]
    assert len(barriers) == (direction == "pull")
    if direction == "pull":
        assert barriers[0] < kinds.index("ag_local_kernel")
    # the GEMM: on main after the call's start, rotated to this rank, split-K off, waiting on the op's flags
    g = next(e for e in log if e[0] == "launch" and e[1] == "gemm_kernel")
    assert g[2] == main and kinds.index("gemm_kernel") > kinds.index("ag_local_kernel")
    tmap_a, _, params, pro, _, tmap_a_tail = g[4]
    tmap_a, tmap_a_tail = read_map(tmap_a), read_map(tmap_a_tail)
    assert tmap_a[0] == gath.ptr and tmap_a[2] == m_loc * world
    # k blocks per slab (k = 128: two 64-column blocks), 0 for whole chunks
    assert A.AG_WAIT_PARAMS.unpack(pro[A.OWN_MAP_BYTES:])[1:8] == (sync.ptr + A.READY_OFFSET, sync.ptr + A.EPOCH_OFFSET, m_loc, rank, world,
                                                 0 if slabs == 1 else 1, 1)  # B first: on by default
    p = A.engine.GEMM_PARAMS.unpack(params)
    # m, and the rotation: the config's, one-row segments starting at rank's first whole cluster row
    fused = plans[-1][0]
    t = fused.tile
    assert fused == op.config(m_loc * world) and fused.rotate == row_shift(m_loc * world, world, rank, t) > 0
    assert p[0] == m_loc * world and p[10:12] == (m_loc * world, fused.rotate * t.bm * t.cluster_m)
    assert p[10:12] == A.rotation(m_loc * world, world, rank, t)
    assert p[20] > 5.0e9 * 2  # pipeline timeout longer than any flag wait
    assert tmap_a_tail == tmap_a[:5] + (40, 64)  # A's tail box: the plan's rows, over the gathered buffer
    # the base's split-K kept only where the model has it paying in the fused order
    base = A.tune.Decomp.split_k(3)  # the fixture's pick
    dp = A.replace(fused, decomp=A.tune.DP)
    dev = A.tune.device_info(0)
    assert fused.decomp in (A.tune.DP, base) and (fused.decomp == A.tune.DP) == (
        A.tune.estimate_us(m_loc * world, n, k, A.replace(fused, decomp=base), dev) >= A.tune.estimate_us(m_loc * world, n, k, dp, dev))
    assert plans[-1][4]["relpath"] == A.KERNEL_FILE and plans[-1][4]["prologue"] == A.PROLOGUE
    sides = op.side_streams
    if copy == "ce":
        data = [e for e in log if e[0] in ("memcpy2d", "memcpy") and e[3] != 4]
        flags = [e for e in log if e[0] == "memcpy" and e[3] == 4]
        assert len(data) == len(flags) == (world - 1) * slabs
        col = row // slabs  # one slab's bytes of a row; slab-major: slab 0 to every peer first
        ready = A.READY_OFFSET
        if direction == "push":
            tg = A.push_targets(rank, world)
            assert [d[1] for d in data] == [gath.peer_ptrs[q] + rank * chunk + j * col for j in range(slabs) for q in tg]
            assert [d[2] for d in data] == [BASE + j * col for j in range(slabs) for q in tg]
            assert all(d[3] == m_loc * col and d[5] == row for d in data)
            assert [f[1] for f in flags] == [sync.peer_ptrs[q] + ready + 4 * A.ready_index(rank, j) for j in range(slabs) for q in tg]
        else:
            srcs = A.pull_sources(rank, world)
            assert [d[1] for d in data] == [gath.ptr + q * chunk + j * col for j in range(slabs) for q in srcs]
            assert [d[2] for d in data] == [gath.peer_ptrs[q] + q * chunk + j * col for j in range(slabs) for q in srcs]
            assert all(d[3] == m_loc * col for d in data)
            assert [f[1] for f in flags] == [sync.ptr + ready + 4 * A.ready_index(q, j) for j in range(slabs) for q in srcs]
        assert all(f[2] == op.epoch_ptr == sync.ptr + A.EPOCH_OFFSET for f in flags)  # the flag is the op's device-resident epoch
        assert all(e[4] in sides for e in data + flags)
        # each flag follows its data copy on the same side stream
        for d, f in zip(data, flags):
            assert log.index(d) < log.index(f) and d[4] == f[4]
        assert g[5:] == ()  # an ordinary launch: the copies run on side streams
        # pull's flags are copies within this GPU (a driver kernel): the GEMM leaves them an SM
        assert op.reserved_sms == (direction == "pull")
        assert op.last_config.ctas == 131 if direction == "pull" else op.last_config.ctas in (0, 132)  # 0: every SM
        # two launches, both on main: the call's start (its gate compares the records) and the GEMM
        assert [(e[1], e[2]) for e in log if e[0] == "launch"] == [("ag_local_kernel", main), ("gemm_kernel", main)]
        # fork after the call's start, join (main waits for every side) at the end
        assert kinds.index("record") > kinds.index("ag_local_kernel")
        waits = [e for e in log if e[0] == "wait"]
        assert waits[-1][1] == main and {w[1] for w in waits[:len(sides)]} == set(sides)
        assert log[-1][0] == "wait" and log[-1][1] == main
    else:
        cp_ = next(e for e in log if e[0] == "launch" and e[1] == "ag_copy_kernel")
        assert cp_[2] == main and cp_[3] == op.copy_sms
        ca = A.AG_COPY_ARGS.unpack(cp_[4][0])
        assert ca[2:5] == (gath.peer_table_ptr, sync.ptr, sync.peer_table_ptr) and ca[9:11] == (A.DIRECTIONS[direction], slabs)
        assert op.last_config.ctas == 132 - op.copy_sms
        # three launches on one stream: the call's start, the copy kernel (it compares the
        # records), the GEMM right after it as its programmatic dependent
        assert [kd for kd in kinds if kd != "barrier"] == ["ag_local_kernel", "ag_copy_kernel", "gemm_kernel"]
        assert g[5:] == ("pdl",)
        assert not any(e[0] in ("wait", "record") for e in log)


def test_a_call_at_capacity_and_gathered_copy(fake_cuda):
    log, _ = fake_cuda
    op = A.AGGemm(OpGroup(0, 2, log), 256, 64, 128, "bf16")
    a = FakeCAI(BASE, (128, 128))
    g_out = FakeCAI(BASE + (3 << 30), (256, 128))
    op(a, FakeCAI(BASE + (2 << 30), (64, 128)), out=FakeCAI(BASE + (1 << 30), (256, 64)), gathered_out=g_out, stream=7)
    last_copy = [e for e in log if e[0] == "memcpy"][-1]
    assert last_copy[1:4] == (BASE + (3 << 30), op._gath.ptr, 256 * 128 * 2) and last_copy[4] == 7
    with pytest.raises(ValueError, match="above this op's max_m = 256"):
        op(FakeCAI(BASE, (129, 128)), FakeCAI(BASE + (2 << 30), (64, 128)), stream=7)


def _own_tile(tile0: int, bm: int, rank: int, m_local: int) -> bool:
    """AgWait::own_tile: the tile's rows all lie in the own chunk."""
    return tile0 >= rank * m_local and tile0 + bm <= (rank + 1) * m_local


@pytest.mark.parametrize("bm", [64, 128, 256])
def test_edge_rows_are_the_own_rows_no_own_tile_reads(bm):
    # the call's start copies exactly the own rows whose tile is not read in place (a tile that
    # also holds a peer's rows, or runs past m), so every row the GEMM reads from the gathered
    # buffer is there and no row it reads from a_shard is copied
    rng = np.random.default_rng(bm)
    cases = [(int(rng.integers(1, 700)), int(w)) for w in rng.integers(2, 9, size=60)] + [(256, 4), (128, 2), (1, 8), (bm, 2), (bm + 1, 3)]
    for m_local, world in cases:
        for rank in range(world):
            head, tail = A.edge_rows(m_local, rank, bm)
            assert 0 <= head <= tail <= m_local
            r0 = rank * m_local
            for i in range(m_local):
                tile0 = (r0 + i) // bm * bm
                assert (head <= i < tail) == _own_tile(tile0, bm, rank, m_local), (m_local, world, rank, i)


@pytest.mark.parametrize("copy", ["sm", "ce"])
@pytest.mark.parametrize("direction,gathered", [("push", None), ("push", "return"), ("push", "out"), ("pull", None)])
def test_own_rows_are_read_in_place_on_push(fake_cuda, direction, gathered, copy):
    # push: the GEMM's own tiles read a_shard through AgWait's own map (its pointer, rows, pitch,
    # A's box) and the call's start copies only the edge rows; where the call returns the
    # gathered A, "ce" copies the rest on side stream 0 after its chunks (beside the GEMM) and
    # "sm" every own row at the start; pull (peers read the own rows) copies every one at the start
    log, plans = fake_cuda
    rank, world, m_loc, n, k = 1, 4, 320, 64, 128
    op = A.AGGemm(OpGroup(rank, world, log), world * m_loc, n, k, "bf16", direction=direction, copy=copy)
    pitch = 2 * k + 64  # a strided shard: the map keeps its pitch
    a = FakeCAI(BASE, (m_loc, k), strides=(pitch, 2))
    kw = {"return_gathered": True} if gathered == "return" else {"gathered_out": FakeCAI(BASE + (3 << 30), (world * m_loc, k))} if gathered else {}
    op(a, FakeCAI(BASE + (2 << 30), (n, k)), out=FakeCAI(BASE + (1 << 30), (m_loc * world, n)), stream=7, **kw)
    local = next(e for e in log if e[0] == "launch" and e[1] == "ag_local_kernel")
    args = A.AG_LOCAL_ARGS.unpack(local[4][0])
    g = next(e for e in log if e[0] == "launch" and e[1] == "gemm_kernel")
    pro = g[4][3]
    fields = A.AG_WAIT_PARAMS.unpack(pro[A.OWN_MAP_BYTES:])
    bm = plans[-1][0].tile.bm
    in_place = direction == "push" and (gathered is None or copy == "ce")
    head, tail = A.edge_rows(m_loc, rank, bm) if in_place else (m_loc, m_loc)
    assert in_place <= (head < tail)  # the test's shape has own tiles
    assert args[9:11] == (head, tail) and args[5] == pitch
    row_vecs = 2 * k // 16
    assert local[3] == max(1, min(2 * 132, -(-(head + m_loc - tail) * row_vecs // (A.LOCAL_THREADS * 4))))  # CTAs for the rows it copies
    assert fields[8] == int(in_place)
    if in_place:
        assert read_map(pro[:A.OWN_MAP_BYTES]) == (BASE, 9, m_loc, k, pitch // 2, 128, 64)  # a_shard, with the plan's box of A
    else:
        assert pro[:A.OWN_MAP_BYTES] == bytes(A.OWN_MAP_BYTES)
    row = 2 * k
    late = [e for e in log if e[0] == "memcpy2d" and e[1] == op._gath.ptr + (rank * m_loc + head) * row]
    if in_place and gathered:
        side0 = op.side_streams[0]
        assert late == [("memcpy2d", op._gath.ptr + (rank * m_loc + head) * row, BASE + head * pitch, (tail - head) * row, side0, row, pitch,
                         row, tail - head)]
        on_side0 = [e for e in log if len(e) > 4 and e[0] in ("memcpy", "memcpy2d") and e[4] == side0]
        assert on_side0[-1] == late[0]  # after the chunks and flags of side 0
        joins = [i for i, e in enumerate(log) if e[0] == "wait" and e[1] == 7]
        assert log.index(late[0]) < joins[-1]
    else:
        assert late == []


def test_a_given_config_keeps_its_decomposition(fake_cuda):
    """config= runs its tile and decomposition (split-K, stream-K, split tail: the plain GEMM's
    scheduler) with the op's rotation, and with the copy kernel's SMs left free on the "sm" path;
    with B (k, n) data-parallel (SCHEDS); a config whose plan cannot run is refused before the
    call issues anything."""
    from rawflux import tune

    log, plans = fake_cuda
    t = next(t for t in tune.TILES if t.cluster_size == 1 and t.stream_k_ok and t.bm == 128)
    a, out = FakeCAI(BASE, (128, 128)), FakeCAI(BASE + (1 << 30), (256, 64))
    for layout, bshape in (("nk", (64, 128)), ("kn", (128, 64))):
        op = A.AGGemm(OpGroup(1, 2, log), 256, 64, 128, "bf16", layout, copy="sm")
        for decomp in (tune.Decomp.split_k(2), tune.STREAM_K, tune.Decomp("tail", 2)):
            op(a, FakeCAI(BASE + (2 << 30), bshape), out=out, stream=7, config=tune.GemmConfig(t, decomp))
            cfg = plans[-1][0]
            assert plans[-1][4]["sched"] == A.SCHEDS[layout]
            assert cfg.tile == t and cfg.ctas == 132 - op.copy_sms, cfg.tag()
            assert cfg.decomp == (decomp if layout == "nk" else tune.DP), cfg.tag()
            assert cfg.rotate == row_shift(256, 2, 1, t) == 1
    op = A.AGGemm(OpGroup(1, 2, log), 256, 64, 128, "bf16", copy="sm")
    log.clear()
    with pytest.raises(ValueError, match="narrow"):  # narrow columns are the 128x256 pair's: refused, nothing issued
        op(a, FakeCAI(BASE + (2 << 30), (64, 128)), out=out, stream=7, config=tune.GemmConfig(t, tune.Decomp("narrow", 208)))
    assert not [e for e in log if e[0] in ("launch", "memcpy", "memcpy2d")]


class _SameDeviceGroup:
    def __init__(self, same_device):
        self.same_device = same_device


@pytest.mark.parametrize("same_device,env_value,given,want", [
    ([True, False, False, False], None, None, "auto"), # one rank per GPU: per m (pick_copy)
    ([True, False], "auto", None, "auto"),
    ([True, True, True, True], None, None, "sm"),      # the emulated node: copies by SMs
    ([True, True, True, True], "ce", None, "ce"),      # RAWFLUX_AG_COPY wins over the guess
    ([True, False], "sm", None, "sm"),
    ([True, True], "sm", "ce", "ce"),                  # an explicit argument wins over both
])
def test_default_copy_path(monkeypatch, same_device, env_value, given, want):
    if env_value is None:
        monkeypatch.delenv("RAWFLUX_AG_COPY", raising=False)
    else:
        monkeypatch.setenv("RAWFLUX_AG_COPY", env_value)
    assert A.default_copy(_SameDeviceGroup(same_device), given) == want


def test_bad_copy_switch_is_rejected(monkeypatch):
    monkeypatch.setenv("RAWFLUX_AG_COPY", "dma")
    with pytest.raises(ValueError, match="RAWFLUX_AG_COPY must be 'ce', 'sm' or 'auto'"):
        A.default_copy(_SameDeviceGroup([True]), None)


@pytest.mark.parametrize("shares_under_mps,copy,raises", [
    (True, "ce", True),    # ranks on one GPU under MPS: copies stall behind spinning GEMMs
    (True, "sm", False),
    (False, "ce", False),  # one GPU per rank, or a shared GPU without MPS (time-sliced)
])
def test_ce_refused_between_mps_clients(monkeypatch, shares_under_mps, copy, raises):
    monkeypatch.setattr(arrays, "pointer_device", lambda ptr: 0)
    group = FakeGroup(rank=0, world=2, device_id=0, timeout_s=5.0, closed=False, same_device=[True, shares_under_mps],
                      shares_gpu_under_mps=shares_under_mps)
    if raises:
        with pytest.raises(ValueError, match="copy='ce' is not supported where ranks share one GPU under MPS"):
            A.AGGemm(group, 256, 64, 128, "bf16", copy=copy)
        with pytest.raises(ValueError, match="copy='ce' is not supported"):
            A.ag_gemm(_a(), _b(), group, copy=copy, stream=0)
    else:
        A._check_copy_path(group, copy)  # the rule lets it through (building the op needs a device)


# --------------------------------------------------------------------------------------------
# chunk-major order (fused_config) and the link emulator (rawflux/bench/ag_local.py)


def _tile(bm, bn, cluster_m=1):
    from rawflux import tune

    return next(t for t in tune.TILES if t.bm == bm and t.bn == bn and t.cluster_m == cluster_m and t.cluster_k == 1)


@pytest.mark.parametrize("m_local,cluster_m,group,want", [
    (512, 1, 8, 4),     # 4 tile rows per chunk: the whole chunk, not 8 rows over two chunks
    (1024, 1, 8, 8),    # 8 rows: the pick's 8
    (768, 1, 8, 6),     # 6 rows: 6 divides them
    (1280, 1, 8, 5),    # 10 rows: 5, not 8 (8 would straddle chunk 0's end)
    (512, 2, 8, 2),     # 2 cluster rows of 256
    (64, 1, 8, 1),      # decode: a tile spans chunks
    (1000, 1, 8, 7),    # chunk edges inside tiles: about one chunk per group
])
def test_chunk_group_keeps_groups_inside_chunks(m_local, cluster_m, group, want):
    t = _tile(128, 256, cluster_m) if cluster_m > 1 else _tile(128, 256)
    g = A.chunk_group(m_local, t, group)
    assert g == want
    rows = m_local // (t.bm * t.cluster_m)
    if rows and m_local % (t.bm * t.cluster_m) == 0:
        assert rows % g == 0


def test_fused_config_is_chunk_major_and_rotated():
    from rawflux import tune
    from rawflux.plan import h200

    dev = h200()
    base = tune.GemmConfig(_tile(128, 256, 2), tune.DP, 8, True, 0)
    cfg = A.fused_config(base, 4096, 8, 131, rank=3, n=7168, k=8192, dev=dev)
    assert cfg.decomp == tune.DP and not cfg.raster_n and cfg.ctas == 131 and cfg.tile == base.tile
    assert cfg.group == A.chunk_group(512, base.tile, 8) == 2
    assert cfg.rotate == row_shift(4096, 8, 3, base.tile) == 6  # rank 3's chunk: cluster row 6 of 16 (two a chunk)
    assert A.fused_config(base, 4096, 8, 131, rank=0, n=7168, k=8192, dev=dev).rotate == 0
    ks = next((t for t in tune.TILES if t.cluster_k > 1), None)
    if ks is not None:
        assert A.fused_config(tune.GemmConfig(ks, tune.DP), 4096, 2, 0, rank=0, n=7168, k=8192, dev=dev).tile == tune.ksplit_base(ks)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_fused_config_keeps_the_decompositions_that_pay(world):
    """The plain pick's decomposition survives the fused order where its plan runs there and the
    model has it faster than data-parallel (the AG fusion tax was mostly these: 2-9 % on the
    model at the bar's points); otherwise, and always with B (k, n), data-parallel."""
    from rawflux import tune
    from rawflux.plan import h200

    dev = h200()
    kept = set()
    for n_full, k in ((49152, 12288), (10240, 8192), (57344, 8192), (28672, 8192)):
        n = n_full // world
        for m in (64, 256, 1024, 2048, 4096, 8192):
            base = tune.heuristic(m, n, k, "nk", dev, 2)
            for rank in (0, world - 1):
                cfg = A.fused_config(base, m, world, 0, rank=rank, n=n, k=k, dev=dev)
                dp = A.replace(cfg, decomp=tune.DP)
                assert cfg.tile == (base.tile if base.tile.cluster_k == 1 else tune.ksplit_base(base.tile))
                if cfg.decomp != tune.DP:
                    kept.add(cfg.decomp.kind)
                    assert cfg.decomp == base.decomp or (base.tile.cluster_k > 1 and cfg.decomp == tune.Decomp.split_k(2))
                    tune.work_plan(m, n, k, cfg, dev.sms)  # runs
                    assert tune.estimate_us(m, n, k, cfg, dev) < tune.estimate_us(m, n, k, dp, dev)
                elif base.decomp != tune.DP and base.tile.cluster_k == 1:
                    try:
                        tune.work_plan(m, n, k, A.replace(cfg, decomp=base.decomp), dev.sms)
                    except ValueError:
                        continue
                    cand = A.replace(cfg, decomp=base.decomp)
                    assert tune.estimate_us(m, n, k, cand, dev) + _cut_wait(cand, m, n, k, world, dev) >= tune.estimate_us(m, n, k, cfg, dev)
                kn = A.fused_config(base, m, world, 0, rank=rank, n=n, k=k, dev=dev, b_layout="kn")
                assert kn == dp
    assert {"tail", "band"} <= kept, kept


def _cut_wait(cfg, m, n, k, world, dev):
    """The k-cut tiles' wait fused_config charges cfg with (ag_order.cut_tiles_wait_us, rank 0)."""
    from rawflux import tune
    from rawflux.tune.ag_order import ag_units, cut_tiles_wait_us, slab_arrival_us

    wp = tune.work_plan(m, n, k, cfg, dev.sms)
    if not wp.sk_tiles:
        return 0.0
    units = ag_units(m, n, world, 0, cfg.tile, cfg.group)
    arr = [a[0] for a in slab_arrival_us(world, 0, m // world, k, 2, A.LINK_GBPS, 1)]
    t_dp = tune.estimate_us(m, n, k, A.replace(cfg, decomp=tune.DP), dev)
    return cut_tiles_wait_us(units, wp.sk_tiles, cfg.tile, m, world, arr, t_dp * (len(units) - wp.sk_tiles) / len(units))


def test_fused_config_drops_stream_k_that_waits_at_its_start():
    """Banded stream-K over the whole order (gate_up at W = 8, m = 4096 on 65 clusters: every tile
    cut in k) hands the clusters slices of the order from the start, so the slices on the last
    chunks wait ~(W - 1) chunk times at t = 0: behind the emulated link it took 1.30x the GEMM
    where data-parallel takes ~1.07x. On 66 clusters the same bands cut only the last 184 tiles,
    which start after the chunks have landed: kept."""
    from rawflux import tune
    from rawflux.tune.ag_order import ag_units, cut_tiles_wait_us

    dev = tune.DeviceInfo(132, (9, 0), 50 << 20, "H100")
    m, n, k, world = 4096, 7168, 8192, 8
    base = tune.GemmConfig(_tile(128, 256, 2), tune.Decomp("band", 8), 8, True, 0)
    whole = A.replace(A.fused_config(base, m, world, 0, rank=0, n=n, k=k, dev=dev), ctas=131)
    assert tune.work_plan(m, n, k, whole, dev.sms).sk_tiles == len(ag_units(m, n, world, 0, whole.tile, whole.group))
    assert _cut_wait(whole, m, n, k, world, dev) == pytest.approx(7 * (m // world) * k * 2 / A.LINK_GBPS * 1e-3)
    assert A.fused_config(base, m, world, 131, rank=0, n=n, k=k, dev=dev).decomp == tune.DP
    kept = A.fused_config(base, m, world, 0, rank=0, n=n, k=k, dev=dev)
    assert kept.decomp == tune.Decomp("band", 8) and _cut_wait(kept, m, n, k, world, dev) == 0.0
    # the wait is the latest chunk among the cut tiles, less when their clusters start
    units = [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert cut_tiles_wait_us(units, 2, _tile(128, 256, 2), 1024, 4, [0.0, 10.0, 20.0, 30.0], 5.0) == 25.0
    assert cut_tiles_wait_us(units, 1, _tile(128, 256, 2), 1024, 4, [0.0, 10.0, 20.0, 30.0], 40.0) == 0.0


def test_link_emulator_arrivals_follow_the_push_schedule():
    from rawflux.bench.ag_local import push_arrivals, t_gather_ms

    for world in range(2, 9):
        for rank in range(world):
            arr = push_arrivals(rank, world, 1 << 20, 370.0)
            # rank r receives chunk r + s at step s (push_targets: rank q writes q - s)
            senders = {s: q for q in range(world) for s, t in enumerate(A.push_targets(q, world), 1) if t == rank}
            assert [f for f, _ in arr] == [A.ready_index(senders[s]) for s in range(1, world)]
            assert [senders[s] for s in range(1, world)] == A.arrival_order(rank, world)[1:]
            assert [round(t) for _, t in arr] == [round(s * (1 << 20) / 370.0) for s in range(1, world)]
            # k-slabs: slab-major (slab j of every chunk before slab j + 1), one slab's time apart
            for slabs in (2, 4, 8):
                arr = push_arrivals(rank, world, 1 << 20, 370.0, slabs)
                t_slab = (1 << 20) / slabs / 370.0
                assert [f for f, _ in arr] == [A.ready_index(senders[s], j) for j in range(slabs) for s in range(1, world)]
                assert [round(t) for _, t in arr] == [round((j * (world - 1) + s) * t_slab) for j in range(slabs) for s in range(1, world)]
                assert max(t for _, t in arr) == pytest.approx((world - 1) * (1 << 20) / 370.0)  # the gather's time is the same
    assert t_gather_ms(8, 1024, 12288, 2, 370.0) == pytest.approx(7 * 128 * 12288 * 2 / 370e9 * 1e3)


def test_link_emulator_args_match_cuda():
    from rawflux.bench.ag_local import EMU_KERNEL, LINK_EMU_ARGS

    src = ['#include "rawflux/kernels/link_emu.cu"', "namespace rawflux {",
           f'static_assert(sizeof(LinkEmuArgs) == {LINK_EMU_ARGS.size}, "size");']
    for name, off in (("ready", 0), ("epoch", 8), ("due_ns", 16), ("flag", 24), ("count", 32)):
        src.append(f'static_assert(__builtin_offsetof(LinkEmuArgs, {name}) == {off}, "{name}");')
    src.append("}")
    res = compile_cubin("\n".join(src) + "\n", arch="sm_90a", name_expressions=(EMU_KERNEL,))
    _no_spills(res, (EMU_KERNEL,))


def test_slab_count_is_the_model_pick():
    """slab_count: whole chunks at decode and where one chunk fills waves; slabs where one wave
    holds every chunk (Llama-3-70B QKV at W = 8); always one of the kernel's counts, dividing k."""
    from rawflux import tune
    from rawflux.plan import H200_SMS, h200
    from rawflux.tune.ag_order import SLAB_CHOICES

    dev = h200(H200_SMS)
    for world, m, n, k in ((8, 2048, 1280, 8192), (8, 64, 1280, 8192), (2, 8192, 24576, 12288), (4, 1024, 2560, 8192),
                           (8, 1024, 6144, 12288), (2, 1024, 1280, 8256)):
        cfg = A.fused_config(tune.heuristic(m, n, k, "nk", dev, 2), m, world, dev.sms, rank=0, n=n, k=k, dev=dev)
        s = A.slab_count(cfg, m, n, k, world, dev, 2)
        assert s in SLAB_CHOICES and k % (s * tune.BK) == 0, (world, m, s)
        if (world, m) == (8, 2048) or (world, m) == (4, 1024):
            assert s > 1, (world, m, s)
        if m == 8192 or k == 8256:  # many waves per chunk; k = 8256 has no whole 128-column halves
            assert s == 1, (world, m, s)


def test_eager_ce_calls_count_the_hosts_issue_time(fake_cuda):
    """The "ce" path makes two driver calls per peer and slab: an eager call's k-slabs are picked on
    the longer of the GEMM and the host's issue time (ce_issue_us), so at W = 8 it takes fewer
    slabs than the device alone would; a call being captured and the "sm" path take the device's
    pick, and so does AgLocal (its emulated link issues no copies)."""
    from rawflux.bench.ag_local import AgLocal

    log, _ = fake_cuda
    world, m, n, k = 8, 1024, 1280, 8192  # Llama-3-70B QKV at W = 8
    ce = A.AGGemm(OpGroup(0, world, log), m, n, k, "bf16", copy="ce")
    cfg = ce.config(m)
    device, eager = ce.slabs(m, cfg, eager=False), ce.slabs(m, cfg)
    assert eager == A.slab_count(cfg, m, n, k, world, A.tune.device_info(0), 2, issue_us=lambda s: A.ce_issue_us(world, s))
    assert eager < device, (eager, device)  # CE_CALL_US = 5: the host's 100 us at S = 1 already outlast the GEMM
    ce.capturing = True
    assert ce.slabs(m, cfg) == device
    ce.capturing = False
    sm = A.AGGemm(OpGroup(0, world, log), m, n, k, "bf16", copy="sm")
    assert sm.slabs(m) == sm.slabs(m, eager=False)
    assert AgLocal.slabs(types_ns(op=ce), m, cfg) == device
    # no host time: the device's pick; a host slower than any GEMM: whole chunks
    units = A.ag_units(m, n, world, 0, cfg.tile, cfg.group, cfg.raster_n)
    args = (units, cfg.tile, m, k, world, 2, 370.0, 66, 40.0)
    assert A.pick_slabs(*args, issue_us=lambda s: 0.0) == A.pick_slabs(*args) > 1
    assert A.pick_slabs(*args, issue_us=lambda s: 1e6 * s) == 1


def test_capture_plans_its_calls_without_host_time(fake_cuda, monkeypatch):
    """op.capture: its warm-up and captured calls take the device's k-slabs (a replay issues
    nothing from the host) and a fast-path entry of eager calls is not reused for them; the eager
    calls after it take the eager pick again."""
    import cupy

    from rawflux import runtime

    log, _ = fake_cuda
    events = []

    class _Stream:
        ptr = 0x77

        def wait_event(self, ev):
            pass

        def begin_capture(self):
            events.append("begin")

        def end_capture(self):
            events.append("end")
            return "graph"

    class _Event:
        def __init__(self, **kw):
            pass

        def record(self, s=None):
            pass

    monkeypatch.setattr(cupy.cuda, "Stream", lambda non_blocking=False: _Stream())
    monkeypatch.setattr(cupy.cuda, "Event", _Event)
    monkeypatch.setattr(runtime, "cupy_stream", lambda s: _Stream())
    world, m, n, k = 8, 1024, 1280, 8192
    op = A.AGGemm(OpGroup(0, world, log), m, n, k, "bf16", copy="ce")
    from rawflux.engine import planning as P
    from tests.cpu.test_fast_path import _Block  # the fast path's launch blocks, logging
    from tests.fake_arrays import FakeCupy, at

    monkeypatch.setattr(P, "LaunchBlock", _Block)
    monkeypatch.setattr(A.engine, "LaunchBlock", _Block)
    a, b, out = FakeCupy((m // world, k), ptr=at(0)), FakeCupy((n, k), ptr=at(2)), FakeCupy((m, n), ptr=at(1))
    checked = []
    real = A.check_call
    monkeypatch.setattr(A, "check_call", lambda *x, **kw: checked.append(1) or real(*x, **kw))

    def slab_flags():  # the k-slab count of each call in the log (data copies per peer)
        data = [e for e in log if e[0] in ("memcpy", "memcpy2d") and e[3] != 4]
        return len(data) // (world - 1)

    device, eager = op.slabs(m, eager=False), op.slabs(m)
    assert eager < device
    for _ in range(2):  # validated, then the fast path
        log.clear()
        op(a, b, out=out, stream=0x77)
        assert slab_flags() == eager
    assert len(checked) == 1
    log.clear()
    graph = op.capture(a, b, out=out, stream=0x77)
    assert graph is not None and events == ["begin", "end"] and not op.capturing
    assert slab_flags() == 2 * device and len(checked) == 2  # the warm-up call (validated) and the captured one
    for _ in range(2):
        log.clear()
        op(a, b, out=out, stream=0x77)
        assert slab_flags() == eager
    assert len(checked) == 3


@pytest.mark.parametrize("world,slabs,direction", [(2, 1, "push"), (4, 2, "push"), (4, 2, "pull"), (8, 4, "push")])
def test_ce_issue_us_counts_the_driver_calls_a_call_makes(fake_cuda, world, slabs, direction):
    log, _ = fake_cuda
    op = A.AGGemm(OpGroup(1, world, log), world * 128, 64, 256, "bf16", direction=direction, copy="ce", slabs=slabs)
    for ptr in (BASE, BASE + (3 << 30)):  # the validated call, then the fast path's
        log.clear()
        op(FakeCAI(ptr, (100, 256)), FakeCAI(BASE + (2 << 30), (64, 256)), out=FakeCAI(BASE + (1 << 30), (100 * world, 64)), stream=7)
        calls = [e for e in log if e[0] in ("memcpy", "memcpy2d", "record", "wait", "launch", "kernel", "barrier")]
        assert len(calls) * A.CE_CALL_US == A.ce_issue_us(world, slabs, 1, direction == "pull"), [e[:2] for e in calls]


def test_slabs_option_is_checked(fake_cuda):
    log, _ = fake_cuda
    for bad, k in ((3, 128), (16, 1024), (2, 64 * 3), (0, 128)):
        with pytest.raises(ValueError, match="slabs = "):
            A.AGGemm(OpGroup(0, 2, log), 256, 64, k, "bf16", slabs=bad)
    op = A.AGGemm(OpGroup(0, 2, log), 256, 64, 256, "bf16", slabs=4)
    assert op.slabs(256) == 4
    op = A.AGGemm(OpGroup(0, 2, log), 256, 64, 256, "bf16")
    assert op.slabs(256) in (1, 2, 4)  # the model's pick, a divisor of k's four 64-column blocks


@pytest.mark.parametrize("bug", ["late_slab_flag_first", "chunk_flag_only"])
def test_slab_simulation_can_fail(monkeypatch, bug):
    """k-slabs: a later slab's flag before its copy, or one flag per chunk (slab 0) for all its
    slabs, must be caught (a tile would read the slab's columns before they land)."""
    orig = A.schedule

    def broken(direction, copy, rank, world, sides=1, slabs=1):
        steps = orig(direction, copy, rank, world, sides, slabs)
        if bug == "late_slab_flag_first":
            i = max(i for i, s in enumerate(steps) if s.kind == "copy")
            steps[i], steps[i + 1] = steps[i + 1], steps[i]
            return steps
        return [s for s in steps if not (s.kind == "flag" and s.slab > 0)]

    monkeypatch.setattr(A, "schedule", broken)
    with pytest.raises(AssertionError, match="flag set before its data" if bug == "late_slab_flag_first" else "flags"):
        _simulate("push", "ce", 4, 1, slabs=4)


def test_pick_copy_weighs_the_host_against_the_gemm():
    # a call lasts the longer of the host's issue time and the GEMM: "ce" issues two driver calls
    # per peer (ce_issue_us), "sm" three launches but runs the GEMM on copy_sms fewer SMs
    for world in (2, 4, 8):
        ce_host, sm_host = A.ce_issue_us(world, 1), A.sm_issue_us()
        assert sm_host < ce_host
        assert A.pick_copy(1.0, 1.2, world) == "sm"  # decode: the host decides
        assert A.pick_copy(sm_host + 1, sm_host + 2, world) == "sm"
        assert A.pick_copy(ce_host, ce_host * 1.13, world) == "ce"  # the GEMM outlasts the host: the SMs decide
        assert A.pick_copy(ce_host + 50, ce_host + 60, world) == "ce"
        assert A.pick_copy(ce_host, ce_host, world) == "ce"  # a tie keeps every SM for the GEMM
    # more side streams and pull's barrier cost the "ce" host more
    assert A.ce_issue_us(4, 1, 2, True) > A.ce_issue_us(4, 1)
    assert A.sm_issue_us(True) == A.sm_issue_us() + A.CE_CALL_US


def _auto_call(op, log, m_loc, n, k, main=0x42):
    a, b, out = FakeCAI(BASE, (m_loc, k)), FakeCAI(BASE + (2 << 30), (n, k)), FakeCAI(BASE + (1 << 30), (m_loc * op.world, n))
    log.clear()
    assert op(a, b, out=out, stream=main) is out
    launches = [(e[1], e[2]) + e[5:] for e in log if e[0] == "launch"]
    local = next(e for e in log if e[0] == "launch" and e[1] == "ag_local_kernel")
    return launches, A.CALL_RECORD.unpack(local[4][1]), A.AG_LOCAL_ARGS.unpack(local[4][0])[8], [e for e in log if e[0].startswith("memcpy")]


@pytest.mark.parametrize("direction", ["push", "pull"])
def test_an_auto_op_takes_the_sm_path_at_decode_and_ce_above(fake_cuda, direction):
    log, plans = fake_cuda
    rank, world, n, k = 1, 4, 4096, 4096
    op = A.AGGemm(OpGroup(rank, world, log), world * 2048, n, k, "bf16", direction=direction)
    assert op.copy == "auto" and op.paths == ("ce", "sm")
    small, large = world * 16, world * 2048
    dev = A.tune.device_info(0)
    # the model's time of the default pick on each path's SMs (no rank-dependent decomposition)
    t = lambda m, p: A.tune.estimate_us(m, n, k, A.replace(op._default(m), ctas=132 - op.reserved(p)), dev)  # noqa: E731
    assert op.path(small) == A.pick_copy(t(small, "ce"), t(small, "sm"), world, op._sides, direction == "pull") == "sm"
    assert op.path(large) == A.pick_copy(t(large, "ce"), t(large, "sm"), world, op._sides, direction == "pull") == "ce"
    main = 0x42
    late = A.LOCAL_ARRIVE_LATE if direction == "pull" else 0
    # decode, twice (the validated call, then the fast path): the copy kernel, the GEMM its PDL dependent, no copy engine
    for _ in range(2):
        launches, record, flags, copies = _auto_call(op, log, small // world, n, k, main)
        assert launches == [("ag_local_kernel", main), ("ag_copy_kernel", main), ("gemm_kernel", main, "pdl")]
        assert record[6] == A.COPIES["sm"] and flags == late and copies == []
        assert op.last_config.ctas == 132 - op.copy_sms
    # a large m: the copy engine, every SM for the GEMM (pull: one left to the flag copies)
    for _ in range(2):
        launches, record, flags, copies = _auto_call(op, log, large // world, n, k, main)
        assert launches == [("ag_local_kernel", main), ("gemm_kernel", main)]
        assert record[6] == A.COPIES["ce"] and flags == late | A.LOCAL_GATE
        assert len(copies) == 2 * (world - 1) * op.slabs(large)
        assert op.last_config.ctas in ((131,) if direction == "pull" else (0, 132))
    # and back: the paths alternate call by call, each with its own record
    launches, record, _, copies = _auto_call(op, log, small // world, n, k, main)
    assert record[6] == A.COPIES["sm"] and copies == [] and len(launches) == 3
    # the tuning key names the call's path, so a tuned "ce" pick never runs on the "sm" path
    assert op._tune_id(small) != op._tune_id(large)


def test_auto_is_sm_where_ranks_share_a_gpu_under_mps(fake_cuda):
    log, _ = fake_cuda
    g = OpGroup(0, 2, log)
    g.shares_gpu_under_mps = True
    op = A.AGGemm(g, 2 * 2048, 4096, 4096, "bf16", copy="auto")
    assert op.paths == ("sm",) and op.path(2 * 2048) == op.path(2) == "sm" and op.reserved_sms == op.copy_sms > 0
    with pytest.raises(ValueError, match="not supported where ranks share one GPU under MPS"):
        A.AGGemm(g, 2 * 2048, 4096, 4096, "bf16", copy="ce")
