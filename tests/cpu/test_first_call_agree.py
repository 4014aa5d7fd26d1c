"""The fused ops' first call with a new shape, with every CUDA entry point and the communicator
faked (CollectiveOp.agree_plan, rawflux/ops/_collective.py): the call resolves its kernels, then
the ranks agree on the call's fields over MPI (bounded), then anything is issued; a later call with
the same shape runs no host collective; ranks with different shapes all raise ValueError naming
each rank's values before any launch; a peer that never arrives raises CollectiveTimeout within
the bound."""
from __future__ import annotations

import time

from tests.cpu.test_ag_gemm_cpu import fake_cuda  # noqa: F401  (fixture: every CUDA entry point faked)

import pytest

from rawflux.dist import CallMismatch, CollectiveTimeout
from rawflux.ops import _collective as C
from rawflux.ops import ag_gemm as A
from rawflux.ops import gemm as G
from rawflux.ops import gemm_rs as R
from tests.cpu.test_ag_gemm_cpu import BASE, FakeCAI, _Comm, _Group, _Kernel

RANK, WORLD = 1, 4
MAIN = 0x42  # the caller's stream
AGREE = "agree"


class _ExKernel(_Kernel):
    def launch_ex(self, grid, block, args, stream=None, **kw):
        self.log.append(("kernel", self.name.split("::")[-1].split("<")[0], stream))


@pytest.fixture
def ops(fake_cuda, monkeypatch):
    """(log, make_rs, make_ag): op objects on rank 1 of 4 whose plans log ("plan",) when resolved."""
    log, plan_args = fake_cuda
    resolved = G._plan  # the fixture's fake: returns one plan object

    def logged_plan(*a, **kw):
        log.append(("plan",))
        return resolved(*a)

    monkeypatch.setattr(G, "_plan", logged_plan)
    monkeypatch.setattr(C, "get_kernel", lambda rel, name, device_id=None: _ExKernel(name, log))
    monkeypatch.setattr(G, "_launch_plan", lambda p, a, b, lda, ldb, stream, pro, epi: log.append(("gemm", stream)))
    monkeypatch.setattr(R, "_launch_reduce", lambda kernel, grid, stream, params: log.append(("reduce", stream)))

    def make_rs(max_m=512, n=256, k=128):
        # construction's own agreement on the arguments: every rank the same
        monkeypatch.setattr(R, "bounded_allgather", lambda group, value, what, timeout_s=None: [value] * WORLD)
        return R.GemmRS(_Group(RANK, WORLD, log), max_m, n, k, "bf16")

    def make_ag(direction="push", copy="ce", max_m=WORLD * 128, n=64, k=128):
        return A.AGGemm(_Group(RANK, WORLD, log), max_m, n, k, "bf16", direction=direction, copy=copy)

    return log, make_rs, make_ag


def call_rs(op, m):
    out = FakeCAI(BASE + (1 << 30), (m // WORLD, op.n))
    return op(FakeCAI(BASE, (m, op.k)), FakeCAI(BASE + (2 << 30), (op.n, op.k)), out=out, stream=MAIN)


def call_ag(op, m_loc):
    out = FakeCAI(BASE + (1 << 30), (m_loc * WORLD, op.n))
    return op(FakeCAI(BASE, (m_loc, op.k)), FakeCAI(BASE + (2 << 30), (op.n, op.k)), out=out, stream=MAIN)


def rs_fields(op, m):
    return op.plan(m).fields


def ag_fields(op, m_loc):
    return (m_loc, op.k, C.DTYPE_CODE[op.dtype], A.DIRECTIONS[op.direction], A.COPIES[op.copy], op.m_local_cap)


def kinds(log):
    return [e[0] for e in log]


def assert_resolve_agree_issue(log, record, gemm="gemm"):
    """One agreement, after every resolve and before anything else is issued (``gemm``: how the
    log names the GEMM launch)."""
    ks = kinds(log)
    assert ks.count(AGREE) == 1, log
    at = ks.index(AGREE)
    assert log[at][1] == record
    assert "plan" in ks[:at] and "plan" not in ks[at + 1:], log  # kernels resolved first
    assert set(ks[:at]) == {"plan"}, log  # nothing issued before the agreement
    assert {"barrier", gemm} <= set(ks[at + 1:]), log  # the call then runs


def test_gemm_rs_first_call_resolves_then_agrees_then_issues(ops):
    log, make_rs, _ = ops
    op = make_rs()
    log.clear()
    call_rs(op, 512)
    assert_resolve_agree_issue(log, C.call_record(C.CHECK_PLAN, R.OP_GEMM_RS, op.uid, rs_fields(op, 512)))
    # same m again: a plan-cache hit, no host collective
    log.clear()
    call_rs(op, 512)
    assert AGREE not in kinds(log) and "gemm" in kinds(log)
    # a new m: its own agreement
    log.clear()
    call_rs(op, 256)
    assert_resolve_agree_issue(log, C.call_record(C.CHECK_PLAN, R.OP_GEMM_RS, op.uid, rs_fields(op, 256)))
    assert op.calls == 3


@pytest.mark.parametrize("direction,copy", [("push", "ce"), ("pull", "ce"), ("push", "sm"), ("pull", "sm")])
def test_ag_gemm_first_call_resolves_then_agrees_then_issues(ops, direction, copy):
    log, _, make_ag = ops
    op = make_ag(direction, copy)
    log.clear()
    call_ag(op, 100)
    # "launch": the local copy kernel, the copy kernel and the GEMM
    assert_resolve_agree_issue(log, C.call_record(C.CHECK_PLAN, A.OP_AG_GEMM, op.uid, ag_fields(op, 100)), "launch")
    log.clear()
    call_ag(op, 100)
    assert AGREE not in kinds(log) and "launch" in kinds(log)
    log.clear()
    call_ag(op, 64)
    assert kinds(log).count(AGREE) == 1


def test_a_warmed_up_shape_still_agrees_on_its_first_call(ops, monkeypatch):
    """warmup() is not collective: it plans and compiles (the plan cache hits on the first call),
    but the ranks' warm-ups may end at different times, so the first call still agrees."""
    log, make_rs, _ = ops
    op = make_rs()
    monkeypatch.setattr(R, "get_kernel", lambda *a, **kw: log.append(("compile",)))
    op.warmup([512])
    assert ("compile",) in log
    log.clear()
    call_rs(op, 512)
    assert kinds(log).count(AGREE) == 1


def test_mismatched_first_call_raises_value_error_naming_every_rank(ops):
    log, make_rs, _ = ops
    op = make_rs()
    mine = rs_fields(op, 512)
    theirs = rs_fields(op, 256)  # rank 2 calls with m = 256
    op.group.comm.peers = {2: C.call_record(C.CHECK_PLAN, R.OP_GEMM_RS, op.uid, theirs)}
    log.clear()
    with pytest.raises(ValueError) as e:
        call_rs(op, 512)
    msg = str(e.value)
    assert "gemm_rs call #1" in msg and "different arguments" in msg
    for q in range(WORLD):
        assert f"rank {q}: m={256 if q == 2 else 512}" in msg, msg
    assert "k=" not in msg and "dtype" not in msg  # only the fields that differ
    if theirs[6:] != mine[6:]:
        assert "tile_m" in msg or "tile_n" in msg
    assert set(kinds(log)) <= {"plan", AGREE}, log  # nothing issued
    assert op.calls == 0
    # Nothing was launched, so the group is fine: the same call made right agrees and runs.
    op.group.comm.peers = {}
    log.clear()
    call_rs(op, 512)
    assert kinds(log).count(AGREE) == 1 and "gemm" in kinds(log)


def test_mismatched_ag_gemm_first_call_names_m_local(ops):
    log, _, make_ag = ops
    op = make_ag()
    op.group.comm.peers = {0: C.call_record(C.CHECK_PLAN, A.OP_AG_GEMM, op.uid, ag_fields(op, 64))}
    log.clear()
    with pytest.raises(ValueError, match=r"rank 0: m_local=64; rank 1: m_local=100; rank 2: m_local=100"):
        call_ag(op, 100)
    assert set(kinds(log)) <= {"plan", AGREE}, log


def test_a_peer_that_never_arrives_times_out_within_the_bound(ops, monkeypatch):
    log, make_rs, _ = ops
    op = make_rs()
    op.group.timeout_s = 0.2
    op.group.comm.arrive = False
    resolve_s = 0.3
    resolved = G._plan

    def slow_plan(*a, **kw):  # a compile: the bound grows by this rank's own resolve time
        time.sleep(resolve_s)
        return resolved(*a, **kw)

    monkeypatch.setattr(G, "_plan", slow_plan)
    log.clear()
    t0 = time.perf_counter()
    with pytest.raises(CollectiveTimeout) as e:
        call_rs(op, 512)
    took = time.perf_counter() - t0
    assert type(e.value) is CollectiveTimeout  # a late peer, not (yet) a known mismatch
    msg = str(e.value)
    assert "gemm_rs call #1" in msg and "a peer did not arrive" in msg and "m=512" in msg, msg
    assert "compiling" in msg and "rawflux.init()" in msg
    assert resolve_s + 0.2 + resolve_s <= took < resolve_s + 0.2 + resolve_s + 1.5, took
    assert set(kinds(log)) <= {"plan", AGREE}, log  # nothing issued
    assert op.calls == 0


def test_world_1_runs_no_agreement(fake_cuda):
    log, _ = fake_cuda
    op = R.GemmRS(_Group(0, 1, log), 512, 256, 128, "bf16")
    assert not op.is_new_shape(op.plan(512).fields)


# --------------------------------------------------------------------------------------------
# the helper alone


def test_agree_first_call_helper():
    log = []
    g = _Group(0, 3, log)
    rec = C.call_record(C.CHECK_PLAN, A.OP_AG_GEMM, 7, (64, 128, C.DTYPE_CODE[A.DType.BF16]))
    C.agree_first_call(g, "op call #1", ("m_local", "k", "dtype"), rec, 1.0)
    assert log == [(AGREE, rec)]
    g = _Group(0, 3, log)
    g.comm.peers = {2: C.call_record(C.CHECK_PLAN, A.OP_AG_GEMM, 7, (64, 128, C.DTYPE_CODE[A.DType.F16]))}
    with pytest.raises(ValueError, match=r"rank 0: dtype=bf16; rank 1: dtype=bf16; rank 2: dtype=f16"):
        C.agree_first_call(g, "op call #1", ("m_local", "k", "dtype"), rec, 1.0)
    g = _Group(0, 2, log)
    g.comm.peers = {1: C.call_record(C.CHECK_PLAN, A.OP_AG_GEMM, 8, (64, 128, 1))}  # another op object
    with pytest.raises(ValueError, match=r"rank 0: op object=7; rank 1: op object=8"):
        C.agree_first_call(g, "op call #1", ("m_local", "k", "dtype"), rec, 1.0)


def test_debug_check_and_first_call_records_line_up(ops, monkeypatch):
    """The RAWFLUX_DEBUG=1 check and the first-call agreement share the private communicator and
    one record size: a rank in one while a peer is in the other is a named mismatch."""
    log, make_rs, _ = ops
    op = make_rs()
    monkeypatch.setenv("RAWFLUX_DEBUG", "1")
    fields = rs_fields(op, 512)
    assert len(C.call_record(C.CHECK_DEBUG, 1, 1, fields)) == len(C.call_record(C.CHECK_PLAN, 1, 1, fields)) == C.RECORD_WORDS
    op._agreed.add(fields)  # this rank: a later call (debug check only); rank 3: its first call
    op.group.comm.peers = {3: C.call_record(C.CHECK_PLAN, R.OP_GEMM_RS, op.uid, fields)}
    with pytest.raises(CallMismatch, match="check=first call with a new shape"):
        call_rs(op, 512)


def test_the_mock_communicator_is_what_the_real_allgather_sees():
    """_Comm fills rows like MPI's Iallgather: the agreeing case returns every rank's record."""
    log = []
    g = _Group(2, 3, log)
    g.comm = _Comm(2, 3, log, peers={0: (5, 5)})
    assert C.bounded_allgather(g, (1, 2), "x") == [(5, 5), (1, 2), (1, 2)]
