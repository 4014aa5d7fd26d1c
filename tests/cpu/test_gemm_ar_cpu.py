"""CPU checks of rawflux.gemm_ar (one kernel per call: the GEMM engine with TileSched's order and
ArEpilogue): argument checks, the tiles it compiles, the epilogue's parameter struct against the
CUDA header (NVRTC static_asserts, no GPU), and whole calls with every CUDA entry point faked:
what is launched, with which parameters."""
from __future__ import annotations

import struct

import pytest

from rawflux import engine, tune
from rawflux.dist.layout import OP_GEMM_AR
from rawflux.ops import _collective as C
from rawflux.ops import gemm_ar as A
from rawflux.ops import gemm_rs as rs
from rawflux.runtime import DType
from tests.cpu.test_gemm_rs_cpu import BASE, TAIL_FIELDS, TAIL_OFFSET, W8, FakeCAI, _fake_map, _nvrtc, _read_map, epi_tail, gemm_params
from tests.cpu.test_gemm_rs_cpu import fake_device as rs_fake_device  # noqa: F401 - a fixture, used by ar_device
from tests.fake_group import FakeGroup, OpGroup


@pytest.fixture
def ar_device(rs_fake_device, monkeypatch):  # noqa: F811
    """GEMM-RS's faked device, with gemm_ar's own reference to the 3-D map builder patched too."""
    monkeypatch.setattr(A, "tensor_map_3d", lambda ptr, code, cols, rows, slabs, slab_rows, br, bc: _fake_map(ptr, code, cols, rows,
                                                                                                             slabs, slab_rows, br, bc))
    monkeypatch.setattr(A, "_device_key", lambda device_id: 0)
    return rs_fake_device


def _agree(monkeypatch, world):
    monkeypatch.setattr(A, "bounded_allgather", lambda group, value, what, timeout_s=None: [value] * world)


# --------------------------------------------------------------------------------------------
# arguments and tiles


def test_op_arguments():
    assert A.check_op_args(2, 1, 256, 64, "bf16", "nk", None) == (DType.BF16, "bf16")
    assert A.check_op_args(8, 7, 256, 64, "f16", "kn", "fp32") == (DType.F16, "fp32")  # any max_m >= 1: no m/W rows
    for args, exc, msg in [((2, 128, 256, 64, "f32", "nk", None), TypeError, "bf16 or f16"),
                           ((2, 128, 256, 64, "bf16", "tn", None), ValueError, "b_layout"),
                           ((2, 128, 256, 64, "bf16", "nk", "f16"), ValueError, "partials"),
                           ((2, 0, 256, 64, "bf16", "nk", None), ValueError, "max_m=0"),
                           ((2, 128, 260, 64, "bf16", "nk", None), ValueError, "multiples of 8"),
                           ((16, 128, 256, 64, "bf16", "nk", None), ValueError, "at most 8")]:
        with pytest.raises(exc, match=msg):
            A.check_op_args(*args)
    with pytest.raises(ValueError, match="capacity max_m=64"):
        A.check_m(65, 64)
    with pytest.raises(ValueError, match="at least 1"):
        A.check_m(0, 64)


def test_tiles_and_variants():
    from rawflux.jit.registry import variants

    names = {v.name_expr for v in variants() if v.relpath == A.KERNEL_FILE}
    for layout in A.B_LAYOUTS:
        tiles16, tiles32 = A.ar_tiles(layout, "bf16"), A.ar_tiles(layout, "fp32")
        assert tiles16 and set(tiles32) <= set(tiles16)
        assert any(t.bm == 64 for t in tiles16)  # decode: a 64-row tile
        for t in tiles16:
            assert t.cluster_size == 1 and t.cluster_k == 1 and t.wn % 64 == 0
            assert A.gemm_kernel_name(t, DType.BF16, layout, "bf16") in names
        for t in tiles32:
            assert t.wn // 2 < 96 and A.gemm_kernel_name(t, DType.F16, layout, "fp32") in names
    assert A.tiles_cap_for(100, 1000, [tune.TileConfig(64, 128, 8)]) == 2 * 8


def test_functional_form_rejects_bad_options_before_any_group():
    with pytest.raises(ValueError, match="b_layout"):
        A.gemm_ar(object(), object(), b_layout="tn")
    with pytest.raises(ValueError, match="partials"):
        A.gemm_ar(object(), object(), partials="e4m3")


# --------------------------------------------------------------------------------------------
# NVRTC: the Python mirrors agree with the CUDA header (no GPU)


def _layout_asserts() -> str:
    from rawflux.engine.abi import AR_EPILOGUE_PREFIX, epilogue_traits

    lines = ['#include "rawflux/fused/ar_epilogue.cuh"', "namespace rawflux {"]
    for part, (code, nbytes) in A.PARTIALS.items():
        ps = f"ArEpilogue<{code}>::Params"
        lines += [
            f'static_assert(sizeof({ps}) == {A.EPI_PARAMS_BYTES}, "{part}: sizeof(Params)");',
            f'static_assert(__builtin_offsetof({ps}, tmap_recv) == 128, "{part}: Params.tmap_recv");',
            f'static_assert(ArEpilogue<{code}>::kPartBytes == {nbytes}, "{part}: kPartBytes");',
            f'static_assert(ArEpilogue<{code}>::kStateBytes == {epilogue_traits(AR_EPILOGUE_PREFIX).state_bytes}, "{part}: kStateBytes");',
        ]
        off = TAIL_OFFSET
        for name, fmt in zip(TAIL_FIELDS, ("Q",) * 4 + (f"{W8}Q",) * 2 + ("i",) * 6 + (f"{C.META_WORDS}I",)):
            name = "m" if name == "m_loc" else name  # GEMM-RS's m / W is GEMM + AllReduce's m
            lines.append(f'static_assert(__builtin_offsetof({ps}, {name}) == {off}, "{part}: Params.{name}");')
            off += struct.calcsize("<" + fmt)
    lines += [f'static_assert(kOpGemmAr == {OP_GEMM_AR}, "op id");', "}  // namespace rawflux", "__global__ void ar_layout_probe() {}"]
    return "\n".join(lines) + "\n"


def test_layout_matches_cuda_and_the_check_can_fail():
    compile_cubin = _nvrtc()
    good = _layout_asserts()
    compile_cubin(good, arch="sm_90a", filename="ar_layout_probe.cu")
    broken = good.replace("Params, m) == 1316", "Params, m) == 1320")
    assert broken != good
    with pytest.raises(Exception, match="Params.m"):
        compile_cubin(broken, arch="sm_90a", filename="ar_layout_probe.cu")


def test_ar_kernels_compile_without_spills():
    """The widest 16-bit variant and an fp32 one (python -m rawflux.check_kernels compiles them all)."""
    compile_cubin = _nvrtc()
    from rawflux.jit import kernel_source

    wide = max(A.ar_tiles("nk", "bf16"), key=lambda t: t.wn)
    names = (A.gemm_kernel_name(wide, DType.BF16, "nk", "bf16"), A.gemm_kernel_name(A.ar_tiles("kn", "fp32")[0], DType.F16, "kn", "fp32"))
    res = compile_cubin(kernel_source(A.KERNEL_FILE), arch="sm_90a", name_expressions=names, filename=A.KERNEL_FILE)
    for name in names:
        r = res.resources[res.lowered[name]]
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, (name, r)


# --------------------------------------------------------------------------------------------
# whole calls with every CUDA entry point faked


def test_world_one_is_the_plain_gemm(ar_device):
    log, _ = ar_device
    op = A.GemmAR(FakeGroup(rank=0, world=1, device_id=0, timeout_s=5.0, closed=False), 64, 256, 128, "bf16")
    assert op.recv is None and op.sync is None
    out = FakeCAI(BASE + (1 << 30), (5, 256))
    assert op(FakeCAI(BASE, (5, 128)), FakeCAI(BASE + (2 << 30), (256, 128)), out=out, stream=0x42) is out
    assert len(log) == 1 and log[0]["relpath"] == "gemm.cu" and "ArEpilogue" not in log[0]["name"]


@pytest.mark.parametrize("call,match", [
    (lambda op, a, b: op(FakeCAI(BASE, (300, 128)), b, stream=0), "exceeds the op's capacity"),
    (lambda op, a, b: op(a, FakeCAI(BASE + (2 << 30), (128, 256)), stream=0), r"b_shard has shape"),
    (lambda op, a, b: op(FakeCAI(BASE, (64, 128), typestr="<f4"), b, stream=0), "dtype"),
    (lambda op, a, b: op(a, b, out=FakeCAI(BASE + (1 << 30), (16, 256)), stream=0), "out"),
    (lambda op, a, b: op(a, b, bias=FakeCAI(BASE + (3 << 30), (128,)), stream=0), r"bias must have shape \(256,\)"),
])
def test_bad_calls_raise_before_launch(ar_device, monkeypatch, call, match):
    log, _ = ar_device
    _agree(monkeypatch, 4)
    op = A.GemmAR(OpGroup(1, 4, []), 256, 256, 128, "bf16")
    with pytest.raises((ValueError, TypeError), match=match):
        call(op, FakeCAI(BASE, (64, 128)), FakeCAI(BASE + (2 << 30), (256, 128)))
    assert not log


@pytest.mark.parametrize("partials", ["bf16", "fp32"])
@pytest.mark.parametrize("m", [1, 77])
def test_a_call_is_one_kernel(ar_device, monkeypatch, partials, m):
    """World 4, rank 1: the buffers, and a call launches exactly one kernel (no barrier, no side
    stream) with the data-parallel GemmParams of (m, n, k) and the epilogue's Params."""
    log, _ = ar_device
    rank, world, max_m, n, k = 1, 4, 128, 512, 256
    _agree(monkeypatch, world)
    glog = []
    group = OpGroup(rank, world, glog)
    op = A.GemmAR(group, max_m, n, k, "bf16", partials=partials)
    part_bytes = A.PARTIALS[partials][1]
    assert op.recv.nbytes == A.recv_bytes(max_m, world, n, part_bytes) and op.sync.nbytes == A.sync_bytes(world, op.tiles_cap)
    out = FakeCAI(BASE + (1 << 30), (m, n))
    bias = FakeCAI(BASE + (3 << 30), (n,))
    assert op(FakeCAI(BASE, (m, k)), FakeCAI(BASE + (2 << 30), (n, k)), bias=bias, out=out, stream=0x42) is out
    assert not glog and len(log) == 1
    launch = log[0]
    cfg = op.config_for(m)
    t = cfg.tile
    assert launch["relpath"] == A.KERNEL_FILE and launch["name"] == A.gemm_kernel_name(t, DType.BF16, "nk", partials)
    assert t in A.ar_tiles("nk", partials) and launch["cluster"] == 1 and launch["stream"] == 0x42
    tiles = -(-m // t.bm) * -(-n // t.bn)
    assert launch["grid"] == min(tiles, 132)
    _, _, params, prologue, epi, _ = launch["args"]
    g = gemm_params(params)
    assert (g["m"], g["n"], g["k"], g["splits"], g["seg_count"]) == (m, n, k, 1, 1)
    assert prologue == engine.NOWAIT_PARAMS and len(epi) == A.EPI_PARAMS_BYTES
    assert _read_map(epi[:128], 5) == (BASE + (1 << 30), engine.abi.TMAP_CODE[DType.BF16], m, n, n)
    for q in range(A.MAX_WORLD):  # every rank's receive buffer, this one's too, as (n, m, 2W) slots max_m rows apart
        raw = epi[128 * (1 + q):128 * (2 + q)]
        if q < world and partials != "fp32":
            assert _read_map(raw, 7) == (op.recv.peer_ptrs[q], engine.abi.TMAP_CODE[DType.BF16], n, m, 2 * world, max_m, 64)
        else:
            assert raw == bytes(128)
    tail = epi_tail(epi)
    pad8 = lambda ptrs: tuple(ptrs) + (0,) * (W8 - len(ptrs))  # noqa: E731
    fields = (m, n, k, C.DTYPE_CODE[DType.BF16], 0, A.PARTIALS[partials][0], t.bm, t.bn, t.consumers)
    assert tail == dict(recv=op.recv.ptr, sync=op.sync.ptr, recv_peer=pad8(op.recv.peer_ptrs), sync_peer=pad8(op.sync.peer_ptrs),
                        ctrl=group.group_ctrl_ptr, bias=BASE + (3 << 30), bias_kind=engine.BIAS_IN16, m_loc=m, tiles_cap=op.tiles_cap,
                        rank=rank, world=world, slot_rows=max_m, record=(0, OP_GEMM_AR) + fields + (0,) * (C.META_WORDS - 2 - len(fields)))
    # the next call reuses the plan (the fast path); without a bias it carries none
    op(FakeCAI(BASE, (m, k)), FakeCAI(BASE + (2 << 30), (n, k)), out=out, stream=0x42)
    assert len(log) == 2 and epi_tail(log[1]["args"][4])["bias"] == 0 and op.calls == 2


def test_ranks_with_different_grids_pick_the_same_tile(ar_device, monkeypatch):
    """Under MPS ranks may see different SM counts: every rank picks the tile for the group's
    smallest grid (flag layout, call records) and runs its own grid."""
    log, set_sms = ar_device
    world, m, n, k = 2, 256, 2048, 4096
    sms = {0: 132, 1: 40}
    picks = []
    for rank in range(world):
        set_sms(sms[rank])
        monkeypatch.setattr(A, "bounded_allgather", lambda group, value, what, timeout_s=None:
                            [value[:-1] + (sms[q],) for q in range(world)])
        op = A.GemmAR(OpGroup(rank, world, []), m, n, k, "bf16")
        assert op.tile_ctas == 40 and op.ctas == sms[rank]
        cfg = op.config_for(m)
        assert cfg.ctas == sms[rank]
        picks.append(cfg.tile)
    assert picks[0] == picks[1]


def test_construction_needs_the_same_arguments_everywhere(ar_device, monkeypatch):
    def allgather(group, value, what, timeout_s=None):
        other = list(value)
        other[2] = 64  # rank 1 builds the op with another k
        return [value, tuple(other)]

    monkeypatch.setattr(A, "bounded_allgather", allgather)
    group = OpGroup(0, 2, [])
    with pytest.raises(ValueError, match="different arguments.*rank 1: max_m=128, n=256, k=64"):
        A.GemmAR(group, 128, 256, 128, "bf16")
    assert "recv" not in group.buffers  # checked before the buffers are allocated
    with pytest.raises(ValueError, match="not a GEMM \\+ AllReduce variant"):
        wide = next(t for t in tune.tiles_for("nk") if t not in A.ar_tiles("nk"))
        _agree(monkeypatch, 2)
        A.GemmAR(OpGroup(0, 2, []), 128, 256, 128, "bf16", config=tune.GemmConfig(wide))
    assert rs.EPI_TAIL is A.EPI_TAIL  # one parameter layout for both epilogues
