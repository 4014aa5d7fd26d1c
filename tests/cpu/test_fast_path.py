"""The host's fast path (rawflux.runtime.fastpath) on the CPU, every CUDA entry point faked: a
call whose metadata matches a validated one launches the same bytes as the validated path would,
and every call the fast path cannot vouch for (new pointers that break alignment or overlap, a
new stream, a closed op, a failed group, RAWFLUX_DEBUG) goes the validated way and gets its error."""
from __future__ import annotations

import importlib

import pytest

from rawflux import DistError
from rawflux.ops import gemm_rs as rs
from rawflux.runtime import fastpath
from rawflux.ops import ag_gemm as A
from tests.cpu.test_ag_gemm_cpu import fake_cuda  # noqa: F401  the fixtures
from tests.cpu.test_gemm_rs_cpu import fake_device  # noqa: F401
from tests.fake_arrays import FakeCupy, at
from tests.fake_group import FakeGroup, OpGroup

L = importlib.import_module("rawflux.engine.launch")  # the module (rawflux.engine.launch is also a function's name)
S = 0x42  # the launch stream


@pytest.fixture
def counted(monkeypatch):
    """How many calls took the validated path (check_call)."""
    n = {"checked": 0}
    real = rs.check_call

    def spy(*args, **kw):
        n["checked"] += 1
        return real(*args, **kw)

    monkeypatch.setattr(rs, "check_call", spy)
    return n


def _op(monkeypatch, world, rank=0, **kw):
    monkeypatch.setattr(rs, "bounded_allgather", lambda group, value, what, timeout_s=None: [value] * world)
    group = OpGroup(rank, world, []) if world > 1 else FakeGroup(rank=0, world=1, device_id=0, timeout_s=5.0, closed=False)
    return rs.GemmRS(group, 512, 256, 128, "bf16", **kw), group


def _args(m=512, n=256, k=128, world=4, a=0, b=2, out=1, bias=None):
    arrs = dict(a=FakeCupy((m, k), ptr=at(a)), b=FakeCupy((n, k), ptr=at(b)), out=FakeCupy((m // world, n), ptr=at(out)))
    arrs["bias"] = None if bias is None else FakeCupy((n,), ptr=at(bias))
    return arrs


def _call(op, x, **kw):
    return op(x["a"], x["b"], bias=x["bias"], out=x["out"], stream=kw.get("stream", S))


def _validated(op, x, log):
    """The launch the validated path makes for call x (the op's fast entries dropped first)."""
    op.forget_fast()
    _call(op, x)
    return log[-1]


@pytest.mark.parametrize("world,rank", [(4, 1), (1, 0)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_repeated_call_launches_what_the_validated_path_does(fake_device, counted, monkeypatch, world, rank, with_bias):  # noqa: F811
    log, _ = fake_device
    op, _ = _op(monkeypatch, world, rank)
    x = _args(world=world, bias=3 if with_bias else None)
    assert _call(op, x) is x["out"] and counted["checked"] == 1
    assert _call(op, x) is x["out"] and counted["checked"] == 1  # fast: no checks, one launch
    assert len(log) == 2 and log[1] == log[0]
    # new pointers, same metadata: still fast, and the bytes follow the pointers
    y = _args(world=world, a=4, b=5, out=6, bias=7 if with_bias else None)
    _call(op, y)
    assert counted["checked"] == 1
    fast = log[-1]
    assert fast == _validated(op, y, log) and fast != log[0]
    assert op.calls == 4


def test_a_call_the_fast_path_cannot_vouch_for_gets_the_validated_error(fake_device, counted, monkeypatch):  # noqa: F811
    log, _ = fake_device
    op, group = _op(monkeypatch, 4, 1)
    x = _args()
    _call(op, x)
    launched = len(log)
    # the output overlapping an input, a misaligned pointer: the validated path raises, nothing launched
    bad = dict(x, out=FakeCupy((128, 256), ptr=at(0) + 256))
    with pytest.raises(ValueError, match="overlaps input a"):
        _call(op, bad)
    bad = dict(x, a=FakeCupy((512, 128), ptr=at(0) + 8))
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        _call(op, bad)
    assert len(log) == launched
    # another stream: validated once, then fast on it
    checked = counted["checked"]
    _call(op, x, stream=0x43)
    assert counted["checked"] == checked + 1 and log[-1]["stream"] == 0x43
    # RAWFLUX_DEBUG: every call compares (validated path)
    monkeypatch.setenv("RAWFLUX_DEBUG", "1")
    before = counted["checked"]
    _call(op, x, stream=0x43)
    assert counted["checked"] == before + 1
    monkeypatch.delenv("RAWFLUX_DEBUG")
    # a failed device wait: the validated path raises it
    group.status = FakeGroup(state=1, failed=True, op=0, call_id=0, waiter=0, peer=0, index=0, expected=0, observed=0, elapsed_ns=0,
                             timeout_ns=0, late_mask=0, abort_from=-1, late_ranks=[])
    with pytest.raises(Exception):
        _call(op, x)
    group.status = FakeGroup(state=0, failed=False)
    # a closed op
    op._closed = True
    with pytest.raises(DistError, match="closed"):
        _call(op, x)


def test_tuning_a_shape_drops_its_fast_entries(fake_device, counted, monkeypatch):  # noqa: F811
    log, _ = fake_device
    op, _ = _op(monkeypatch, 2)
    x = _args(world=2)
    _call(op, x)
    cfg = op.plan(512).cfg
    op._use_config(512, cfg)
    _call(op, x)
    assert counted["checked"] == 2


def test_functional_form_reuses_its_op_launch(fake_device, counted, monkeypatch):  # noqa: F811
    log, _ = fake_device
    monkeypatch.setattr(rs, "bounded_allgather", lambda group, value, what, timeout_s=None: [value] * 2)
    group = OpGroup(0, 2, [])
    x = _args(world=2)
    try:
        rs.gemm_rs(x["a"], x["b"], group, out=x["out"], stream=S)
        rs.gemm_rs(x["a"], x["b"], group, out=x["out"], stream=S)
        assert counted["checked"] == 1 and len(log) == 2 and log[0] == log[1]
        other = OpGroup(0, 2, [])  # another group: its own op, validated first
        rs.gemm_rs(x["a"], x["b"], other, out=x["out"], stream=S)
        assert counted["checked"] == 2
    finally:
        rs._fn_ops.clear()
        rs._ops._ops.clear()  # fake ops: nothing to close


def test_launch_block_writes_and_bounds():
    blk = L.LaunchBlock(kernel=None, grid=1, threads=32, cluster=1, smem=0, args=(b"\x01" * 128, b"\x02" * 16))
    assert blk.args() == (b"\x01" * 128, b"\x02" * 16)
    blk.write(1, b"\x03" * 8, 8)
    assert blk.read(1) == b"\x02" * 8 + b"\x03" * 8
    with pytest.raises(ValueError, match="overflow argument slot 0"):
        blk.write(0, b"\x00" * 8, 124)


def test_apart_and_spans():
    assert fastpath.apart(1000, 100, (2000, 0), (50, 0))
    assert not fastpath.apart(1000, 100, (1099, 0), (1, 0))
    assert not fastpath.apart(1000, 100, (900, 0), (101, 0))
    assert fastpath.apart(1000, 100, (900, 0), (100, 0))
    assert fastpath.byte_span(3, 8, 16, 2) == (2 * 16 + 8) * 2


# --- AllGather-GEMM: the same protocol from the fast path -------------------------------------

class _Block:
    """LaunchBlock as the faked engine sees it: slots hold what was written (tuples here)."""

    def __init__(self, kernel, grid, threads, cluster, smem, args=(), pdl=False, log=None):
        self.kernel, self.grid, self.pdl, self.slots = kernel, grid, pdl, [None] * 6
        for slot, raw in enumerate(args):
            self.write(slot, raw)

    def write(self, slot, raw, offset=0):
        old = self.slots[slot]
        if old is not None:  # a patch in place, as LaunchBlock.write (ag_gemm's a_shard pointer, its own map)
            raw = old[:offset] + raw + old[offset + len(raw):]
        self.slots[slot] = raw

    def launch(self, stream):
        self.kernel.log.append(("launch", self.kernel.name.split("::")[-1], stream, self.grid,
                                tuple(x for x in self.slots if x is not None)) + (("pdl",) if self.pdl else ()))


@pytest.mark.parametrize("m_loc", [100, 320])  # 320: own tiles read a_shard in place (push), its map rewritten per pointer
@pytest.mark.parametrize("direction,copy,slabs", [("push", "ce", 1), ("pull", "sm", 1), ("push", "ce", 2), ("pull", "ce", 2),
                                                   ("push", "sm", 2)])
def test_ag_gemm_fast_path_issues_the_validated_protocol(fake_cuda, monkeypatch, direction, copy, slabs, m_loc):  # noqa: F811
    from rawflux.engine import planning as P

    monkeypatch.setattr(P, "LaunchBlock", _Block)
    monkeypatch.setattr(A.engine, "LaunchBlock", _Block)
    log, _ = fake_cuda
    n_checked = {"n": 0}
    real = A.check_call
    monkeypatch.setattr(A, "check_call", lambda *a, **k: n_checked.__setitem__("n", n_checked["n"] + 1) or real(*a, **k))
    rank, world, n, k = 1, 4, 64, 128
    op = A.AGGemm(OpGroup(rank, world, log), world * 320, n, k, "bf16", direction=direction, copy=copy, slabs=slabs)

    def call(i):
        a, b, out = FakeCupy((m_loc, k), ptr=at(3 * i)), FakeCupy((n, k), ptr=at(3 * i + 1)), FakeCupy((m_loc * world, n), ptr=at(3 * i + 2))
        log.clear()
        assert op(a, b, out=out, stream=S) is out
        return list(log)

    first = call(0)
    assert call(0) == first and n_checked["n"] == 1  # fast: no checks, the same launches and copies
    fast = call(1)  # new pointers
    assert n_checked["n"] == 1 and fast != first
    op.forget_fast()
    assert call(1) == fast and n_checked["n"] == 2  # what the validated path issues for them
    assert op.calls == 4


def test_ag_gemm_fast_call_sets_last_config(fake_cuda, monkeypatch):  # noqa: F811
    # last_config is what rawflux.gemm(..., config=) must be given to match a call bitwise: a fast
    # call of m after a call of another m must leave m's config there (rank 1 rotates per m)
    from rawflux.engine import planning as P

    monkeypatch.setattr(P, "LaunchBlock", _Block)
    monkeypatch.setattr(A.engine, "LaunchBlock", _Block)
    log, _ = fake_cuda
    rank, world, n, k = 1, 4, 64, 128
    op = A.AGGemm(OpGroup(rank, world, log), world * 256, n, k, "bf16", copy="sm")

    def call(m_loc):
        a, b, out = FakeCupy((m_loc, k), ptr=at(0)), FakeCupy((n, k), ptr=at(1)), FakeCupy((m_loc * world, n), ptr=at(2))
        op(a, b, out=out, stream=S)

    call(256)
    call(64)
    calls = op.calls
    call(256)  # fast
    assert op.calls == calls + 1 and len(op._fast) == 2
    assert op.last_config == op.config(4 * 256) and op.last_config.rotate != op.config(4 * 64).rotate


def test_ag_gemm_functional_form_reuses_its_op(fake_cuda, monkeypatch):  # noqa: F811
    from rawflux.engine import planning as P

    monkeypatch.setattr(P, "LaunchBlock", _Block)
    monkeypatch.setattr(A.engine, "LaunchBlock", _Block)
    log, _ = fake_cuda
    group = OpGroup(1, 4, log)
    a, b, out = FakeCupy((64, 128), ptr=at(0)), FakeCupy((64, 128), ptr=at(1)), FakeCupy((256, 64), ptr=at(2))
    try:
        A.ag_gemm(a, b, group, out=out, stream=S, copy="ce")
        log.clear()
        A.ag_gemm(a, b, group, out=out, stream=S, copy="ce")
        first = list(log)
        log.clear()
        A.ag_gemm(a, b, group, out=out, stream=S, copy="ce")
        assert log == first and any(e[:2] == ("launch", "gemm_kernel") for e in first)
        op = next(iter(A._fn_ops.values()))
        assert len(op._fast) == 1
        monkeypatch.setenv("RAWFLUX_AG_DIRECTION", "pull")  # another default: another op, validated first
        calls = op.calls
        A.ag_gemm(a, b, group, out=out, stream=S, copy="ce")
        assert op.calls == calls and len(A._fn_ops) == 2
    finally:
        A._fn_ops.clear()
        A._cache._ops.clear()  # fake ops: nothing to close


def test_capture_needs_out(fake_device, monkeypatch):  # noqa: F811
    op, _ = _op(monkeypatch, 2)
    x = _args(world=2)
    with pytest.raises(ValueError, match="pass out="):
        op.capture(x["a"], x["b"], stream=S)


def test_gemm_repeated_call_launches_what_the_validated_path_does(fake_device, monkeypatch):  # noqa: F811
    """rawflux.gemm on CuPy arrays without stream=: the second call with the same metadata skips
    the checks and launches the same bytes; new pointers rewrite the maps and the epilogue."""
    from rawflux.ops import gemm as G

    log, _ = fake_device
    monkeypatch.setattr(fastpath, "current_stream", lambda fw, device: S)
    monkeypatch.setattr(G, "resolve_stream", lambda stream, tensors: S)  # CuPy's current stream, as the fast path sees it
    monkeypatch.setattr(G, "_fast", {})
    checked = {"n": 0}
    real = G._gemm_checked
    monkeypatch.setattr(G, "_gemm_checked", lambda *a, **k: checked.__setitem__("n", checked["n"] + 1) or real(*a, **k))

    def call(i, bias=None):
        a, b, out = FakeCupy((256, 128), ptr=at(3 * i)), FakeCupy((512, 128), ptr=at(3 * i + 1)), FakeCupy((256, 512), ptr=at(3 * i + 2))
        assert G.gemm(a, b, out=out, bias=bias) is out
        return log[-1]

    first = call(0)
    assert call(0) == first and checked["n"] == 1
    fast = call(1)
    assert checked["n"] == 1 and fast != first
    G._fast.clear()
    assert call(1) == fast and checked["n"] == 2
    overlapping = FakeCupy((256, 512), ptr=at(0) + 256)  # out over a: the validated path raises
    with pytest.raises(ValueError, match="overlaps"):
        G.gemm(FakeCupy((256, 128), ptr=at(0)), FakeCupy((512, 128), ptr=at(1)), out=overlapping)


def test_grown_workspace_stays_allocated(monkeypatch):
    """engine.workspace grows per (device, stream); the plans cached with the old pointers launch
    into them again, so the old buffers must not go back to CuPy's pool (where the caller's next
    arrays would take them and a later split's partials overwrite them)."""
    import contextlib
    import importlib
    import sys
    import types
    import weakref

    from rawflux import runtime

    L = importlib.import_module("rawflux.engine.launch")

    class Buf:
        next_ptr = 1 << 20

        def __init__(self, n, itemsize):
            self.nbytes, self.size = n * itemsize, n
            self.data = types.SimpleNamespace(ptr=Buf.next_ptr)
            Buf.next_ptr += self.nbytes + 256

    fake = types.SimpleNamespace(empty=lambda n, dtype: Buf(n, 1), zeros=lambda n, dtype: Buf(n, 4), uint8="u1", uint32="u4")
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(runtime, "use_stream", lambda stream, device=None: contextlib.nullcontext())
    monkeypatch.setattr(L, "_workspaces", {})
    monkeypatch.setattr(L, "_retired", [])
    small = L.workspace(0, 7, 1 << 10, 8)
    old = weakref.ref(L._workspaces[(0, 7)][0])
    assert L.workspace(0, 7, 1 << 9, 4) == small  # fits: the same buffers
    big = L.workspace(0, 7, 1 << 12, 8)
    assert big != small and L._workspaces[(0, 7)][0].nbytes == 1 << 12
    assert old() is not None and old() in [r[0] for r in L._retired]  # still referenced: never freed
