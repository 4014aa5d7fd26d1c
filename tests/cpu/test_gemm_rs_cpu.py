"""CPU checks of rawflux.gemm_rs (one kernel per call: the GEMM engine with RsSched's tile order and
RsEpilogue): argument checks, the launch plan (GemmParams as the kernel reads them), the tiles it
compiles, the buffer layout and the epilogue's parameter struct against the CUDA headers (NVRTC
static_asserts, no GPU), and whole calls with every CUDA entry point faked: what is launched,
with which parameters. The protocol's slot safety: tests/cpu/test_rs_protocol.py; the tile
order: tests/cpu/test_rs_order.py."""
from __future__ import annotations

import importlib
import struct

import pytest

from rawflux import engine, tune
from rawflux.dist.layout import OP_GEMM_RS
from rawflux.engine import planning as P
from rawflux.ops import _collective as C
from rawflux.ops import _row_parallel as RP
from rawflux.ops import gemm_rs as rs
from rawflux.runtime import DType, arrays
from rawflux.tune.rs_order import a_tail_rows as rs_a_tail_rows
from rawflux.tune.rs_order import per_owner_tiles, rows_per_owner
from tests.fake_group import FakeGroup, OpGroup

DEV = tune.DeviceInfo(sms=132, cc=(9, 0), l2_bytes=50 << 20, name="fake")

# GemmParams (gemm/config.cuh), in engine.GEMM_PARAMS's order
GEMM_FIELDS = ("m", "n", "k", "tiles_m", "tiles_n", "k_blocks", "splits", "kb_per_split", "group", "raster_n", "seg_count",
               "seg_start", "sk_tiles", "a_box_rows", "a_tail_rows", "tail_splits", "narrow_from", "own_delay", "workspace",
               "counters", "timeout_ns")
# RsEpilogue<kPart>::Params after its 1 + kRsMaxWorld tensor maps, in rs.EPI_TAIL's order
TAIL_FIELDS = ("recv", "sync", "ctrl", "bias", "recv_peer", "sync_peer", "bias_kind", "m_loc", "tiles_cap", "rank", "world", "slot_rows",
               "record")
W8 = rs.MAX_WORLD
TAIL_OFFSET = 128 * (1 + rs.MAX_WORLD)


def _cdiv(a, b):
    return -(-a // b)


def gemm_params(raw: bytes) -> dict:
    vals = engine.GEMM_PARAMS.unpack(raw)
    assert len(vals) == len(GEMM_FIELDS)
    return dict(zip(GEMM_FIELDS, vals))


def epi_tail(raw: bytes) -> dict:
    v = rs.EPI_TAIL.unpack(raw[TAIL_OFFSET:TAIL_OFFSET + rs.EPI_TAIL.size])
    vals = v[:4] + (v[4:4 + W8], v[4 + W8:4 + 2 * W8]) + v[4 + 2 * W8:10 + 2 * W8]
    return dict(zip(TAIL_FIELDS, vals)) | {"record": v[10 + 2 * W8:]}


# --------------------------------------------------------------------------------------------
# arguments

OK_ARGS = dict(world=2, max_m=128, n=256, k=64, dtype="bf16", b_layout="nk", partials="fp32")


def test_op_arguments_accepted():
    assert rs.check_op_args(**OK_ARGS) == (DType.BF16, "fp32")
    assert rs.check_op_args(**(OK_ARGS | dict(partials=None))) == (DType.BF16, "bf16")  # default: the output's type
    assert rs.check_op_args(**(OK_ARGS | dict(dtype="f16", partials="f16", b_layout="kn"))) == (DType.F16, "f16")
    assert rs.check_op_args(**(OK_ARGS | dict(world=8, max_m=8))) == (DType.BF16, "fp32")


@pytest.mark.parametrize("bad,exc,msg", [
    (dict(dtype="f32"), TypeError, "bf16 or f16"),
    (dict(b_layout="tn"), ValueError, "b_layout"),
    (dict(partials="fp8"), ValueError, "partials"),
    (dict(partials="f16"), ValueError, "partials='f16'"),  # 16-bit partials have the output's type
    (dict(dtype="f16", partials="bf16"), ValueError, "partials='bf16'"),
    (dict(n=100), ValueError, "multiples of 8"),
    (dict(k=12), ValueError, "multiples of 8"),
    (dict(max_m=1), ValueError, "smaller than the world size"),
    (dict(max_m=0), ValueError, "positive"),
    (dict(n=2.0), ValueError, "positive int"),
    (dict(k=True), ValueError, "positive int"),
    (dict(world=9, max_m=64), ValueError, "at most 8"),
])
def test_op_arguments_rejected(bad, exc, msg):
    with pytest.raises(exc, match=msg):
        rs.check_op_args(**(OK_ARGS | bad))


def test_check_m():
    assert rs.check_m(64, 128, 8) == 8
    assert rs.check_m(128, 128, 8) == 16
    with pytest.raises(ValueError, match="not a multiple of the world size 8.*pad m to 64"):
        rs.check_m(60, 128, 8)
    with pytest.raises(ValueError, match="exceeds the op's capacity"):
        rs.check_m(256, 128, 8)
    with pytest.raises(ValueError, match="at least 8"):
        rs.check_m(0, 128, 8)


def test_functional_form_rejects_bad_options_before_any_group():
    with pytest.raises(ValueError, match="b_layout"):
        rs.gemm_rs(None, None, object(), b_layout="nn")
    with pytest.raises(ValueError, match="partials"):
        rs.gemm_rs(None, None, object(), partials="int8")


# --------------------------------------------------------------------------------------------
# the tiles GEMM-RS compiles


@pytest.mark.parametrize("layout", rs.B_LAYOUTS)
def test_rs_tiles(layout):
    tiles = rs.rs_tiles(layout)
    assert tiles
    for t in tiles:
        assert t.supports(layout) and t in tune.tiles_for(layout)
        assert t.cluster_k == 1  # no k-split cluster (RsSchedT's static_assert)
        assert t.wn % 64 == 0 and t.wn // 2 < 128  # whole 64-column boxes; fewer than 128 accumulators a thread
        assert t.consumers <= 2  # kRsFlagsPerTile flags a tile
        opts = engine.kernel_options(t, engine.NOWAIT, rs.rs_epilogue("bf16"), DType.BF16)
        assert opts.store_bufs > 0 and opts.defer_boxes == 0
    every = tune.tiles_for(layout)
    assert any(t.wn == 256 for t in every) and not any(t.wn == 256 for t in tiles)  # 128 accumulators: left out


def test_variants_registered():
    from rawflux.jit import variants

    names = {v.name_expr for v in variants() if v.relpath == rs.KERNEL_FILE}
    want = {rs.gemm_kernel_name(t, dt, layout, part) for dt in rs.DTYPES for part in (dt.tag, "fp32") for layout in rs.B_LAYOUTS
            for t in rs.rs_tiles(layout)}
    assert names == want
    assert all(v.archs == ("sm_90a",) for v in variants() if v.relpath == rs.KERNEL_FILE)
    name = rs.gemm_kernel_name(rs.rs_tiles("nk")[0], DType.F16, "nk", "fp32")
    assert "rawflux::RsSched" in name and f"rawflux::RsEpilogue<{rs.PARTIALS['fp32'][0]}>" in name


def test_tiles_cap_for():
    tiles = rs.rs_tiles("nk")
    for max_m, world, n in [(64, 8, 128), (1000, 8, 264), (4096, 4, 1024), (8, 8, 8), (3, 2, 64)]:
        m_loc = max(1, max_m // world)
        cap = rs.tiles_cap_for(max_m, world, n, tiles)
        assert cap == max(rows_per_owner(m_loc, t) * _cdiv(n, t.bn) for t in tiles)
        # every call of the op fits, with every tile
        for m in range(world, max_m + 1, world):
            for t in tiles:
                assert rows_per_owner(m // world, t) * _cdiv(n, t.bn) <= cap


# --------------------------------------------------------------------------------------------
# the launch plan


@pytest.mark.parametrize("m,n,k,world,rank,partials,layout", [
    (256, 512, 256, 4, 3, "fp32", "nk"),
    (64, 12288, 6144, 8, 0, "bf16", "nk"),
    (1000, 264, 512, 8, 5, "bf16", "kn"),  # 125 rows per owner: padded tile rows
    (8192, 8192, 1024, 2, 1, "fp32", "kn"),
    (24, 128, 64, 8, 7, "bf16", "nk"),  # 3 rows per owner
])
def test_plan_call(m, n, k, world, rank, partials, layout):
    tiles = rs.rs_tiles(layout)
    cap = rs.tiles_cap_for(m, world, n, tiles)
    p = rs.plan_call(m, n=n, k=k, dtype=DType.BF16, b_layout=layout, partials=partials, world=world, rank=rank, dev=DEV, ctas=128,
                     tiles_cap=cap, timeout_ns=12345)
    t = p.cfg.tile
    m_loc = m // world
    assert p.m == m and p.m_loc == m_loc
    assert t in tiles and p.cfg.decomp == tune.DP and not p.cfg.raster_n and p.cfg.ctas == 128
    assert p.cfg == rs.choose_config(m, n, k, layout, DEV, 128, world, rs.PARTIALS[partials][1])
    assert p.rows_per_owner == rows_per_owner(m_loc, t) and p.per_owner == per_owner_tiles(m_loc, n, t)
    assert p.clusters == max(1, min(128 // t.cluster_size, world * p.per_owner)) and p.own_delay == p.clusters
    g = gemm_params(p.params)
    kb = _cdiv(k, tune.BK)
    assert g == dict(m=m, n=n, k=k, tiles_m=world * p.rows_per_owner, tiles_n=_cdiv(n, t.bn), k_blocks=kb, splits=1, kb_per_split=kb,
                     group=max(1, p.cfg.group), raster_n=0, seg_count=world, seg_start=rank, sk_tiles=0,
                     a_box_rows=tune.a_box_rows(t, m), a_tail_rows=rs_a_tail_rows(t, m, world), tail_splits=0, narrow_from=0,
                     own_delay=p.clusters, workspace=0, counters=0, timeout_ns=12345)
    part_code = rs.PARTIALS[partials][0]
    assert p.fields == (m, n, k, C.DTYPE_CODE[DType.BF16], rs._LAYOUT_CODE[layout], part_code, t.bm, t.bn, t.cluster_m, t.cluster_n,
                        t.consumers)
    assert len(p.fields) == len(rs.GemmRS.META_FIELDS) <= C.META_FIELDS_MAX


def _a_rows_loaded(t, p: dict, m0: int) -> int:
    """Rows of A the kernel loads for a tile whose rows start at m0 (gemm/load.cuh: a_tail_box
    picks the tail box, else the main box of a_box_rows)."""
    box = t.bm // t.cluster_n
    tail = t.cluster_n == 1 and p["a_tail_rows"] > 0 and (p["m"] - m0 <= 0 or (p["m"] - m0 < box and p["m"] > box))
    return p["a_tail_rows"] if tail else p["a_box_rows"]


@pytest.mark.parametrize("world", [2, 4, 8])
def test_a_boxes_cover_owner_rows(world):
    """Every tile row loads at least the rows of A its owner stores: owner rows start at o m_loc,
    so the plain tiling's tail box (counted from row 0) can be short of an owner's last tile row
    (the rows past it were stale shared memory: m = 74 at W = 2 on 64-row tiles lost rows 16..36)."""
    checked = 0
    for t in {t for layout in rs.B_LAYOUTS for t in rs.rs_tiles(layout)}:
        for m_loc in list(range(1, 3 * t.bm + 2)) + [1000, 4096 // world + 3]:
            m = world * m_loc
            cap = rs.tiles_cap_for(m, world, 512, [t])
            pc = rs.plan_call(m, n=512, k=256, dtype=DType.BF16, b_layout="nk", partials="bf16", world=world, rank=0, dev=DEV,
                              ctas=128, tiles_cap=cap, config=tune.GemmConfig(t, tune.DP))
            g = gemm_params(pc.params)
            lp = pc.rows_per_owner
            for o in range(world):
                for l in range(lp):
                    m0 = o * m_loc + l * t.bm
                    need = min(t.bm, max(0, m_loc - l * t.bm))  # rows of this tile the owner keeps
                    assert _a_rows_loaded(t, g, m0) >= need, (t.tag(), m, world, o, l)
                    checked += 1
    assert checked > 1000


def test_plan_call_options():
    t = next(t for t in rs.rs_tiles("nk") if t.cluster_size == 2)
    cap = rs.tiles_cap_for(4096, 4, 1024, [t])
    kw = dict(n=1024, k=512, dtype=DType.F16, b_layout="nk", partials="f16", world=4, rank=2, dev=DEV, tiles_cap=cap)
    # a given configuration: its decomposition and grid are the op's (data-parallel on `ctas`)
    p = rs.plan_call(4096, ctas=100, config=tune.GemmConfig(t, tune.Decomp.split_k(3), raster_n=True, ctas=7), **kw)
    assert p.cfg.tile == t and p.cfg.decomp == tune.DP and not p.cfg.raster_n and p.cfg.ctas == 100
    assert gemm_params(p.params)["splits"] == 1 and p.clusters == 50
    # own_delay overrides the delay only
    q = rs.plan_call(4096, ctas=100, config=tune.GemmConfig(t), own_delay=3, **kw)
    assert q.own_delay == 3 and q.clusters == 50 and gemm_params(q.params)["own_delay"] == 3
    # the grid never exceeds the tiles: a small call runs on fewer clusters than the device has
    r = rs.plan_call(16, ctas=132, config=tune.GemmConfig(t), **kw)
    assert r.clusters == 4 * r.per_owner < 66
    # the tile is chosen for tile_ctas, the grid is ctas
    a = rs.plan_call(256, n=2048, k=4096, dtype=DType.BF16, b_layout="nk", partials="bf16", world=4, rank=0, dev=DEV, ctas=132,
                     tiles_cap=rs.tiles_cap_for(256, 4, 2048, rs.rs_tiles("nk")), tile_ctas=60)
    assert a.cfg.tile == rs.choose_config(256, 2048, 4096, "nk", DEV, 60, 4).tile and a.cfg.ctas == 132
    # the flags the op holds bound the calls it can plan
    with pytest.raises(ValueError, match="flags per source"):
        rs.plan_call(8192, ctas=100, config=tune.GemmConfig(t), **kw)


def test_plan_call_timeout_default(monkeypatch):
    monkeypatch.setenv("RAWFLUX_WAIT_TIMEOUT_S", "3")
    p = rs.plan_call(256, n=512, k=256, dtype=DType.BF16, b_layout="nk", partials="bf16", world=2, rank=0, dev=DEV, ctas=132,
                     tiles_cap=rs.tiles_cap_for(256, 2, 512, rs.rs_tiles("nk")))
    assert gemm_params(p.params)["timeout_ns"] == 3 * 10**9


def test_choose_config_is_deterministic_and_protocol_safe():
    for m, n, k, layout in [(64, 12288, 6144, "nk"), (8192, 8192, 1024, "kn"), (1000, 264, 512, "nk")]:
        a = rs.choose_config(m, n, k, layout, DEV, 128, 4)
        assert a == rs.choose_config(m, n, k, layout, DEV, 128, 4)
        assert a.splits == 1 and not a.raster_n and a.ctas == 128 and a.tile in rs.rs_tiles(layout)
    cfg = rs.choose_config(512, 1024, 512, "nk", tune.DeviceInfo(sms=14, cc=(9, 0), l2_bytes=50 << 20), 1, 4)
    assert cfg.tile.cluster_size == 1  # a cluster of 2 cannot run on 1 CTA
    with pytest.raises(ValueError, match="no tile configuration"):
        rs.choose_config(512, 1024, 512, "nk", DEV, 1, 4, tiles=[t for t in rs.rs_tiles("nk") if t.cluster_size == 2])


# --------------------------------------------------------------------------------------------
# the buffer layout (fused/rs_layout.cuh)


def test_layout_constants():
    assert (rs.EPOCH_OFFSET, rs.DONE_OFFSET, rs.RECORDS_OFFSET) == (0, 64, 128)
    assert rs.RECORD_BYTES == C.META_SLOT_BYTES
    assert rs.FLAGS_OFFSET == rs.RECORDS_OFFSET + 2 * rs.MAX_WORLD * rs.RECORD_BYTES
    assert rs.EPI_TAIL.size == (4 + 2 * W8) * 8 + 6 * 4 + 4 * C.META_WORDS
    assert rs.EPI_PARAMS_BYTES == _cdiv(TAIL_OFFSET + rs.EPI_TAIL.size, 64) * 64
    # kernelParams' room for the epilogue's parameters (engine/launch.py _ArgBlock)
    from rawflux.engine.launch import _ArgBlock

    assert _ArgBlock.SIZES[4] >= rs.EPI_PARAMS_BYTES
    assert _ArgBlock.OFFSETS[4] + _ArgBlock.SIZES[4] <= _ArgBlock.OFFSETS[5]


@pytest.mark.parametrize("world,tiles_cap", [(2, 1), (3, 7), (8, 40)])
def test_records_and_flags_fit_and_are_distinct(world, tiles_cap):
    size = rs.sync_bytes(world, tiles_cap)
    recs = [rs.record_offset(p, s) for p in (0, 1) for s in range(world)]
    assert len(set(recs)) == len(recs)
    assert all(rs.RECORDS_OFFSET <= o and o + rs.RECORD_BYTES <= rs.FLAGS_OFFSET and o % 16 == 0 for o in recs)
    flags = [rs.flag_offset(p, world, s, tiles_cap, t, c) for p in (0, 1) for s in range(world) for t in range(tiles_cap)
             for c in range(rs.FLAGS_PER_TILE)]
    assert len(set(flags)) == len(flags) and min(flags) == rs.FLAGS_OFFSET and max(flags) + 4 == size
    assert all(o % 4 == 0 for o in flags)
    assert rs.DONE_OFFSET + 4 <= rs.RECORDS_OFFSET and rs.EPOCH_OFFSET + 4 <= rs.DONE_OFFSET


@pytest.mark.parametrize("world,m,n", [(2, 256, 512), (8, 64, 136), (3, 9, 8)])
def test_slots_tile_the_receive_buffer(world, m, n):
    m_loc = m // world
    rows = [rs.slot_row(p, world, s, m_loc, r, n) for p in (0, 1) for s in range(world) for r in range(m_loc)]
    assert rows == list(range(0, 2 * m * n, n))  # slot (p, s) = rows (p W + s) m_loc .. of one (2 m, n) array
    for part_bytes in (2, 4):
        assert rs.recv_bytes(m, n, part_bytes) == 2 * m * n * part_bytes
        assert (max(rows) + n) * part_bytes <= rs.recv_bytes(m, n, part_bytes)


# --------------------------------------------------------------------------------------------
# NVRTC: the Python mirrors agree with the CUDA headers (no GPU)


def _nvrtc():
    pytest.importorskip("cuda.bindings.nvrtc")
    from rawflux.jit import compile_cubin

    return compile_cubin


def _rs_state_bytes() -> int:
    from rawflux.engine.abi import RS_EPILOGUE_PREFIX, epilogue_traits

    return epilogue_traits(RS_EPILOGUE_PREFIX).state_bytes


def _layout_asserts() -> str:
    lines = ['#include "rawflux/fused/rs_epilogue.cuh"', "namespace rawflux {"]
    for part, (code, nbytes) in rs.PARTIALS.items():
        ps = f"RsEpilogue<{code}>::Params"
        lines += [
            f'static_assert(sizeof({ps}) == {rs.EPI_PARAMS_BYTES}, "{part}: sizeof(Params)");',
            f'static_assert(alignof({ps}) == 64, "{part}: Params alignment (its tensor maps)");',
            f'static_assert(__builtin_offsetof({ps}, tmap_out) == 0, "{part}: Params.tmap_out");',
            f'static_assert(__builtin_offsetof({ps}, tmap_recv) == 128, "{part}: Params.tmap_recv");',
            f'static_assert(RsEpilogue<{code}>::kPartBytes == {nbytes}, "{part}: kPartBytes");',
            f'static_assert(RsEpilogue<{code}>::kStateBytes == {_rs_state_bytes()}, "{part}: kStateBytes (engine.abi.epilogue_traits)");',
        ]
        off = TAIL_OFFSET
        for name, fmt in zip(TAIL_FIELDS, ("Q",) * 4 + (f"{W8}Q",) * 2 + ("i",) * 6 + (f"{C.META_WORDS}I",)):
            lines.append(f'static_assert(__builtin_offsetof({ps}, {name}) == {off}, "{part}: Params.{name}");')
            off += struct.calcsize("<" + fmt)
    lines += [
        f'static_assert(sizeof(RsEpilogue<0>::Params::record) == {4 * C.META_WORDS}, "Params.record");',
        f'static_assert(kRsMaxWorld == {rs.MAX_WORLD}, "kRsMaxWorld");',
        f'static_assert(kRsEpochOffset == {rs.EPOCH_OFFSET} && kRsDoneOffset == {rs.DONE_OFFSET}, "epoch / done words");',
        f'static_assert(kRsRecordsOffset == {rs.RECORDS_OFFSET}, "kRsRecordsOffset");',
        f'static_assert(kRsFlagsOffset == {rs.FLAGS_OFFSET}, "kRsFlagsOffset");',
        f'static_assert(kRsFlagsPerTile == {rs.FLAGS_PER_TILE}, "kRsFlagsPerTile");',
        f'static_assert(kMetaSlotBytes == {rs.RECORD_BYTES} && kMetaWords == {C.META_WORDS}, "record size");',
        f'static_assert(kRsPartBF16 == {rs.PARTIALS["bf16"][0]} && kRsPartF16 == {rs.PARTIALS["f16"][0]} && '
        f'kRsPartF32 == {rs.PARTIALS["fp32"][0]}, "partial codes");',
        f'static_assert(epi::kBiasNone == {engine.BIAS_NONE} && epi::kBiasIn16 == {engine.BIAS_IN16} && '
        f'epi::kBiasF32 == {engine.BIAS_F32}, "bias kinds");',
        f'static_assert(kOpGemmRs == {OP_GEMM_RS}, "op id");',
        "}  // namespace rawflux",
        "__global__ void rs_layout_probe() {}",
    ]
    return "\n".join(lines) + "\n"


def test_layout_matches_cuda():
    compile_cubin = _nvrtc()
    assert "Params, recv) == 1152" in _layout_asserts()
    compile_cubin(_layout_asserts(), arch="sm_90a", filename="rs_layout_probe.cu")


def test_layout_check_can_fail():
    compile_cubin = _nvrtc()
    good = _layout_asserts()
    for old, new, what in [(f"kRsFlagsOffset == {rs.FLAGS_OFFSET}", f"kRsFlagsOffset == {rs.FLAGS_OFFSET + 4}", "kRsFlagsOffset"),
                           ("Params, m_loc) == 1316", "Params, m_loc) == 1320", "Params.m_loc")]:
        broken = good.replace(old, new)
        assert broken != good
        with pytest.raises(Exception, match=what):
            compile_cubin(broken, arch="sm_90a", filename="rs_layout_probe.cu")


@pytest.mark.parametrize("layout,dtype,partials", [("nk", DType.BF16, "bf16"), ("kn", DType.F16, "fp32")])
def test_rs_kernels_compile_without_spills(layout, dtype, partials):
    """One registered variant per partial kind (python -m rawflux.check_kernels compiles them all)."""
    compile_cubin = _nvrtc()
    from rawflux.jit import kernel_source

    names = tuple(rs.gemm_kernel_name(t, dtype, layout, partials) for t in rs.rs_tiles(layout)[:2])
    res = compile_cubin(kernel_source(rs.KERNEL_FILE), arch="sm_90a", name_expressions=names, filename=rs.KERNEL_FILE)
    for name in names:
        r = res.resources[res.lowered[name]]
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, (name, r)


# --------------------------------------------------------------------------------------------
# whole calls with every CUDA entry point faked

BASE = 0x7F00_0000_0000


class FakeCAI:
    def __init__(self, ptr, shape, typestr="<V2", strides=None):
        self.__cuda_array_interface__ = {"version": 3, "data": (ptr, False), "shape": tuple(shape), "typestr": typestr,
                                         "strides": strides}


def _fake_map(*args) -> bytes:
    """A 'tensor map' that spells its arguments (ints), so the tests can read them back."""
    raw = struct.pack(f"<{len(args)}q", *(int(a) for a in args))
    return raw + bytes(128 - len(raw))


def _read_map(raw: bytes, count: int) -> tuple:
    return struct.unpack(f"<{count}q", raw[:8 * count])


@pytest.fixture
def fake_device(monkeypatch):
    """tune.device_info, pointers, tensor maps, kernel loading and launching faked; returns the
    launch log and a setter for the device's SM count."""
    L = importlib.import_module("rawflux.engine.launch")  # the module (rawflux.engine.launch is also a function's name)

    log = []
    sms = {"n": 132}
    monkeypatch.setattr(arrays, "pointer_device", lambda ptr: 0)
    monkeypatch.setattr(tune, "device_info", lambda dev: tune.DeviceInfo(sms["n"], (9, 0), 50 << 20, "fake"))
    monkeypatch.setattr(L, "tensor_map_code", lambda ptr, code, rows, cols, ld, br, bc: _fake_map(ptr, code, rows, cols, ld, br, bc))
    monkeypatch.setattr(P, "tensor_map_code", lambda ptr, code, rows, cols, ld, br, bc: _fake_map(ptr, code, rows, cols, ld, br, bc))
    monkeypatch.setattr(RP, "tensor_map", lambda ptr, dt, rows, cols, ld, br, bc: _fake_map(ptr, engine.abi.TMAP_CODE[dt], rows, cols, ld,
                                                                                           br, bc))
    monkeypatch.setattr(rs, "tensor_map_3d", lambda ptr, code, cols, rows, slabs, slab_rows, br, bc: _fake_map(ptr, code, cols, rows,
                                                                                                              slabs, br, bc))
    monkeypatch.setattr(rs, "max_active_clusters", lambda kern, threads, smem, cluster: 66)
    monkeypatch.setattr(rs, "_device_key", lambda device_id: 0)
    monkeypatch.setattr(P, "get_kernel", lambda relpath, name, device_id=None, arch=None: (relpath, name))
    monkeypatch.setattr(P, "_plans", {})
    monkeypatch.setattr(P, "launch", lambda kern, grid, threads, cluster, smem, s, args, pdl=False: log.append(
        dict(relpath=kern[0], name=kern[1], grid=grid, threads=threads, cluster=cluster, smem=smem, stream=s, args=args)))
    monkeypatch.setattr(L.LaunchBlock, "launch", lambda blk, s: log.append(  # the fast path's own argument blocks
        dict(relpath=blk.kernel[0], name=blk.kernel[1], grid=blk.grid, threads=blk.threads, cluster=blk.cluster, smem=blk.smem,
             stream=s, args=blk.args())))
    return log, lambda n: sms.__setitem__("n", n)


def test_world_one_is_the_plain_gemm(fake_device):
    """World 1: no buffers, no communication; one plain GEMM kernel stores straight into out."""
    log, _ = fake_device
    group = FakeGroup(rank=0, world=1, device_id=0, timeout_s=5.0, closed=False)
    op = rs.GemmRS(group, 256, 256, 128, "bf16")
    assert op.recv is None and op.sync is None and op.tiles_cap >= 1
    out = FakeCAI(BASE + (1 << 30), (256, 256))
    assert op(FakeCAI(BASE, (256, 128)), FakeCAI(BASE + (2 << 30), (256, 128)), out=out, stream=0x42) is out
    assert len(log) == 1
    launch = log[0]
    assert launch["relpath"] == "gemm.cu" and "RsSched" not in launch["name"] and "RsEpilogue" not in launch["name"]
    assert launch["stream"] == 0x42
    epi = launch["args"][4]
    assert _read_map(epi, 1) == (BASE + (1 << 30),)  # TmaStore's map of out, or LocalStore's pointer: out first
    assert op.calls == 1
    # a call of any m up to max_m, even one not a multiple of 8 (W = 1 divides every m)
    op(FakeCAI(BASE, (3, 128)), FakeCAI(BASE + (2 << 30), (256, 128)), out=FakeCAI(BASE + (1 << 30), (3, 256)), stream=0x42)
    assert len(log) == 2
    with pytest.raises(ValueError, match="world 1 runs the plain GEMM"):
        op.plan(3)  # no fused plan to show: world 1 launches rawflux.gemm's


@pytest.mark.parametrize("call,match", [
    (lambda op, a, b, o: op(FakeCAI(BASE, (300, 128)), b, stream=0), "exceeds the op's capacity"),
    (lambda op, a, b, o: op(a, FakeCAI(BASE + (2 << 30), (128, 256)), stream=0), r"b_shard has shape"),
    (lambda op, a, b, o: op(FakeCAI(BASE, (256, 128), typestr="<f4"), b, stream=0), "dtype"),
    (lambda op, a, b, o: op(a, b, out=FakeCAI(BASE + (1 << 30), (256, 256)), stream=0), "out"),
    (lambda op, a, b, o: op(a, b, bias=FakeCAI(BASE + (3 << 30), (128,)), stream=0), r"bias must have shape \(256,\)"),
])
def test_bad_calls_raise_before_launch(fake_device, monkeypatch, call, match):
    log, _ = fake_device
    monkeypatch.setattr(rs, "bounded_allgather", lambda group, value, what, timeout_s=None: [value] * 4)
    op = rs.GemmRS(OpGroup(1, 4, []), 256, 256, 128, "bf16")
    a, b = FakeCAI(BASE, (256, 128)), FakeCAI(BASE + (2 << 30), (256, 128))
    with pytest.raises((ValueError, TypeError), match=match):
        call(op, a, b, None)
    assert not log


@pytest.mark.parametrize("partials", ["bf16", "fp32"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_call_is_one_kernel(fake_device, monkeypatch, partials, with_bias):
    """World 4, rank 1: the buffers the op allocates, and a call launches exactly one kernel (no
    barrier, no side stream) with the plan's GemmParams and the epilogue's Params."""
    log, _ = fake_device
    rank, world, m, n, k = 1, 4, 512, 256, 128
    monkeypatch.setattr(rs, "bounded_allgather", lambda group, value, what, timeout_s=None: [value] * world)
    glog = []
    group = OpGroup(rank, world, glog)
    op = rs.GemmRS(group, m, n, k, "bf16", partials=partials)
    part_bytes = rs.PARTIALS[partials][1]
    assert op.recv.nbytes == rs.recv_bytes(m, n, part_bytes) and op.sync.nbytes == rs.sync_bytes(world, op.tiles_cap)
    assert op.tiles_cap == rs.tiles_cap_for(m, world, n, rs.rs_tiles("nk"))
    out = FakeCAI(BASE + (1 << 30), (m // world, n))
    bias = FakeCAI(BASE + (3 << 30), (n,)) if with_bias else None
    res = op(FakeCAI(BASE, (m, k)), FakeCAI(BASE + (2 << 30), (n, k)), bias=bias, out=out, stream=0x42)
    assert res is out and not glog  # no host barrier: calls are ordered by the device epoch
    assert len(log) == 1
    launch = log[0]
    p = op.plan(m)
    t = p.cfg.tile
    assert launch["relpath"] == rs.KERNEL_FILE and launch["name"] == rs.gemm_kernel_name(t, DType.BF16, "nk", partials)
    assert launch["grid"] == p.clusters * t.cluster_size and launch["cluster"] == t.cluster_size and launch["stream"] == 0x42
    tmap_a, tmap_b, params, prologue, epi, tmap_a_tail = launch["args"]
    assert params == p.params
    g = gemm_params(params)
    assert g["seg_count"] == world and g["seg_start"] == rank and g["own_delay"] == p.clusters
    assert g["tiles_m"] == world * p.rows_per_owner
    assert prologue == engine.NOWAIT_PARAMS
    assert len(epi) == rs.EPI_PARAMS_BYTES
    m_loc = m // world
    assert _read_map(epi[:128], 5) == (out.__cuda_array_interface__["data"][0], engine.abi.TMAP_CODE[DType.BF16], m_loc, n, n)
    for o in range(rs.MAX_WORLD):
        raw = epi[128 * (1 + o):128 * (2 + o)]
        if o < world and partials != "fp32":  # the owner's receive buffer as (n, m_loc, 2W) 16-bit partials
            assert _read_map(raw, 7) == (op.recv.peer_ptrs[o], engine.abi.TMAP_CODE[DType.BF16], n, m_loc, 2 * world, 64, 64)
        else:
            assert raw == bytes(128)
    tail = epi_tail(epi)
    pad8 = lambda ptrs: tuple(ptrs) + (0,) * (W8 - len(ptrs))  # noqa: E731
    assert tail == dict(recv=op.recv.ptr, sync=op.sync.ptr, recv_peer=pad8(op.recv.peer_ptrs), sync_peer=pad8(op.sync.peer_ptrs),
                        ctrl=group.group_ctrl_ptr, bias=BASE + (3 << 30) if with_bias else 0,
                        bias_kind=engine.BIAS_IN16 if with_bias else engine.BIAS_NONE, m_loc=m_loc, tiles_cap=op.tiles_cap, rank=rank,
                        world=world, slot_rows=op.max_m // world, record=(0, OP_GEMM_RS) + p.fields + (0,) * (C.META_WORDS - 2 - len(p.fields)))
    assert epi[TAIL_OFFSET + rs.EPI_TAIL.size:] == bytes(rs.EPI_PARAMS_BYTES - TAIL_OFFSET - rs.EPI_TAIL.size)
    # the next call with the same m reuses the plan; a bias-free call after one with a bias carries none
    op(FakeCAI(BASE, (m, k)), FakeCAI(BASE + (2 << 30), (n, k)), out=out, stream=0x42)
    assert len(log) == 2 and epi_tail(log[1]["args"][4])["bias"] == 0 and op.calls == 2


@pytest.mark.parametrize("m", [74, 196, 502])
def test_tail_box_follows_owner_rows(fake_device, monkeypatch, m):
    """The launched tail map's box has the rows GemmParams::a_tail_rows counts (the stage's
    expected bytes): the owner tiling's, where the plain tiling's differs."""
    log, _ = fake_device
    monkeypatch.setattr(rs, "bounded_allgather", lambda group, value, what, timeout_s=None: [value] * 2)
    op = rs.GemmRS(OpGroup(1, 2, []), 512, 512, 256, "bf16", config=tune.GemmConfig(tune.TileConfig(64, 128, 8), tune.DP))
    op(FakeCAI(BASE, (m, 256)), FakeCAI(BASE + (2 << 30), (512, 256)), out=FakeCAI(BASE + (1 << 30), (m // 2, 512)), stream=0x42)
    tmap_a, _, params, _, _, tmap_a_tail = log[0]["args"]
    rows = gemm_params(params)["a_tail_rows"]
    t = op.plan(m).cfg.tile
    assert rows == rs_a_tail_rows(t, m, 2) != tune.a_tail_rows(t, m) and rows > 0
    assert _read_map(tmap_a_tail, 7) == (BASE, engine.abi.TMAP_CODE[DType.BF16], m, 256, 256, rows, tune.BK)


def test_construction_needs_the_same_arguments_everywhere(fake_device, monkeypatch):
    log, _ = fake_device
    mine = []

    def allgather(group, value, what, timeout_s=None):
        mine.append(value)
        other = list(value)
        other[1] = 512  # rank 2 builds the op with another n
        return [value, value, tuple(other), value]

    monkeypatch.setattr(rs, "bounded_allgather", allgather)
    group = OpGroup(0, 4, [])
    with pytest.raises(ValueError, match="different arguments.*rank 2: max_m=256, n=512"):
        rs.GemmRS(group, 256, 256, 128, "bf16")
    assert "recv" not in group.buffers and "sync" not in group.buffers  # checked before the buffers are allocated
    assert mine == [(256, 256, 128, C.DTYPE_CODE[DType.BF16], 0, rs.PARTIALS["bf16"][0], 0, 132)]  # ..., device key, ctas


def test_construction_rejects_a_foreign_tile(fake_device, monkeypatch):
    monkeypatch.setattr(rs, "bounded_allgather", lambda group, value, what, timeout_s=None: [value] * 2)
    wide = next(t for t in tune.tiles_for("nk") if t not in rs.rs_tiles("nk"))
    with pytest.raises(ValueError, match="not a GEMM-RS variant"):
        rs.GemmRS(OpGroup(0, 2, []), 256, 256, 128, "bf16", config=tune.GemmConfig(wide))
    with pytest.raises(TypeError, match="GemmConfig"):
        rs.GemmRS(OpGroup(0, 2, []), 256, 256, 128, "bf16", config="fast")
    with pytest.raises(ValueError, match="ctas=0"):
        rs.GemmRS(OpGroup(0, 2, []), 256, 256, 128, "bf16", ctas=0)


def test_ranks_with_different_grids_pick_the_same_tile(fake_device, monkeypatch):
    """Ranks of one group may run different grids (an SM cap under MPS: 60 and 132 SMs here).
    Every rank must still pick the same tile for a call (flag layout, call records): the op
    picks it for the group's smallest grid and runs its own."""
    log, set_sms = fake_device
    world, m, n, k = 4, 256, 2048, 4096
    sms = {q: 132 if q % 2 else 60 for q in range(world)}
    alone = {q: rs.choose_config(m, n, k, "nk", tune.DeviceInfo(sms[q], (9, 0), 50 << 20), sms[q], world).tile for q in range(world)}
    assert len(set(alone.values())) > 1, "the ranks' own picks agree here: the test would check nothing"
    mine = (m, n, k, C.DTYPE_CODE[DType.BF16], rs._LAYOUT_CODE["nk"], rs.PARTIALS["bf16"][0])
    plans = []
    for rank in range(world):
        set_sms(sms[rank])

        def allgather(group, value, what, timeout_s=None, rank=rank):  # one GPU per rank (device keys 0..W-1)
            assert value == mine + (0, sms[rank]) and all(isinstance(x, int) for x in value), value
            return [mine + (q, sms[q]) for q in range(world)]

        monkeypatch.setattr(rs, "bounded_allgather", allgather)
        op = rs.GemmRS(OpGroup(rank, world, []), m, n, k, "bf16")
        assert op.ctas == sms[rank] and op.tile_ctas == min(sms.values())
        p = op.plan(m)
        assert p.cfg.ctas == sms[rank]  # each rank runs its own grid
        assert gemm_params(p.params)["seg_start"] == rank
        plans.append((p.cfg.tile, p.fields, p.rows_per_owner, gemm_params(p.params)["tiles_n"]))
    assert all(x == plans[0] for x in plans), plans
    assert plans[0][0] == alone[0]  # the smallest grid's pick


def test_ranks_sharing_a_gpu_run_no_cluster_tiles(fake_device, monkeypatch):
    """The emulated node (ranks on one GPU under MPS): every CTA of every rank must be resident at
    once, and clusters of two ranks need not fit beside each other in the GPCs: no cluster tiles."""
    world, m, n, k = 2, 8192, 8192, 4096
    for keys, want_cluster in (((7, 7), False), ((1, 2), True)):
        monkeypatch.setattr(rs, "bounded_allgather", lambda group, value, what, timeout_s=None, keys=keys:
                            [value[:-2] + (kq, value[-1]) for kq in keys])
        op = rs.GemmRS(OpGroup(0, world, []), m, n, k, "bf16")
        assert op.shares_gpu == (not want_cluster)
        t = op.plan(m).cfg.tile
        assert (t.cluster_size > 1) == want_cluster, t.tag()


# --------------------------------------------------------------------------------------------
# tuning: the stored result, agreed by every rank (rawflux/tune/collective.py runs the timing)


class _Store:
    """The fused-op table, in memory."""

    def __init__(self, entries=None):
        self.table, self.puts = dict(entries or {}), []

    def get(self, key):
        return self.table.get(key)

    def entries(self):
        return dict(self.table)

    def put(self, key, entry):
        self.table[key] = entry
        self.puts.append(key)


def test_a_stored_tuning_is_used_where_every_rank_holds_it(fake_device, monkeypatch):
    world, m, n, k = 2, 2048, 2048, 512
    empty = _Store()
    monkeypatch.setattr(tune, "fused_store", lambda: empty)
    op = rs.GemmRS(OpGroup(0, world, []), m, n, k, "bf16")
    default = op.plan(m).cfg
    cands = op.tune_candidates(m, top=4)
    assert cands[0].tile == default.tile and len(cands) == len({c.tile for c in cands}) <= 4
    other = cands[1]
    store = _Store({op._tune_id(m): {"config": other.to_json(), "us": 1.0}})
    monkeypatch.setattr(tune, "fused_store", lambda: store)
    assert rs.GemmRS(OpGroup(0, world, []), m, n, k, "bf16").plan(m).cfg.tile == other.tile
    # another m, or another world, has its own entry: the model's pick
    assert rs.GemmRS(OpGroup(0, world, []), m, n, k, "bf16").plan(m // 2).cfg.tile == op.plan(m // 2).cfg.tile
    assert op._tune_id(m) != rs.GemmRS(OpGroup(0, 4, []), m, n, k * 2, "bf16")._tune_id(m)
    # a peer without the entry (its digest 0): every rank falls back to the model's pick
    real = C.bounded_allgather
    monkeypatch.setattr(C, "bounded_allgather", lambda g, v, what, timeout_s=None: [tuple(v), (0,) + tuple(v)[1:]]
                        if "agreement" in what else real(g, v, what, timeout_s))
    assert rs.GemmRS(OpGroup(0, world, []), m, n, k, "bf16").plan(m).cfg.tile == default.tile
    monkeypatch.setattr(C, "bounded_allgather", real)
    monkeypatch.setenv("RAWFLUX_TUNE", "off")  # off: the stored result is not read
    assert rs.GemmRS(OpGroup(0, world, []), m, n, k, "bf16").plan(m).cfg.tile == default.tile
    assert not store.puts


def test_the_stored_tunings_are_agreed_once_per_op_not_per_call(fake_device, monkeypatch):
    """One agreement at construction: planning a new m exchanges nothing, so a rank that calls
    with another m meets the device-side call check (a host exchange there would wait for peers
    that never join it)."""
    world, m, n, k = 2, 2048, 2048, 512
    probe = rs.GemmRS(OpGroup(0, world, []), m, n, k, "bf16")
    other = probe.tune_candidates(m, top=4)[1]
    store = _Store({probe._tune_id(m): {"config": other.to_json(), "us": 1.0},
                    probe._tune_id(m // 2): {"config": other.to_json(), "us": 1.0},
                    "not json": {"config": other.to_json()}})
    monkeypatch.setattr(tune, "fused_store", lambda: store)
    seen = []
    real = C.bounded_allgather
    monkeypatch.setattr(C, "bounded_allgather", lambda g, v, what, timeout_s=None: seen.append(what) or real(g, v, what, timeout_s))
    op = rs.GemmRS(OpGroup(0, world, []), m, n, k, "bf16")
    agreements = [w for w in seen if "agreement" in w]
    assert len(agreements) == 1, seen
    seen.clear()
    assert op.plan(m).cfg.tile == other.tile and op.plan(m // 2).cfg.tile == other.tile
    assert op.plan(m // 4).cfg.tile == probe.plan(m // 4).cfg.tile  # no entry: the model's pick
    assert seen == [], seen


def test_tune_refuses_what_it_cannot_time(fake_device):
    op = rs.GemmRS(OpGroup(0, 2, []), 256, 256, 128, "bf16", config=tune.GemmConfig(tune.TileConfig(64, 128, 8), tune.DP))
    with pytest.raises(ValueError, match="fixed config"):
        op.tune(256)
    with pytest.raises(ValueError, match="world 1"):
        rs.GemmRS(FakeGroup(rank=0, world=1, device_id=0, timeout_s=5.0, closed=False), 256, 256, 128, "bf16").tune(256)
