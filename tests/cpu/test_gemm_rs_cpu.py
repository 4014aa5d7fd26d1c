"""CPU checks of rawflux.gemm_rs: tile / owner / flag math, the whole scatter + reduce protocol
emulated in numpy (exact integer arithmetic), argument checks, the Python mirrors of the kernel
structs (compiled as static_asserts with NVRTC), and the kernels' resource reports."""
from __future__ import annotations

from tests.cpu.test_ag_gemm_cpu import fake_cuda  # noqa: F401,E402  (fixture: every CUDA entry point faked)

import numpy as np
import pytest

from rawflux import tune
from rawflux.ops import gemm_rs as rs
from rawflux.runtime import DType
from tests.cpu.sched_port import raster

TILES = list(tune.TILES)


def _cdiv(a, b):
    return -(-a // b)


def sched_order(m: int, n: int, t: tune.TileConfig, group: int, seg_count: int, seg_start: int):
    """Python port of TileSchedT (gemm/scheduler.cuh), splits = 1, raster along n: the CTA tiles
    in linear work-unit order (what the persistent CTAs walk, unit += grid)."""
    tiles_m, tiles_n = _cdiv(m, t.bm), _cdiv(n, t.bn)
    ctm, ctn = _cdiv(tiles_m, t.cluster_m), _cdiv(tiles_n, t.cluster_n)
    shift = ((seg_start * (m // seg_count)) // (t.bm * t.cluster_m)) % ctm if seg_count > 1 else 0
    for cu in range(ctm * ctn):
        cm, cn = raster(cu, ctm, ctn, group)
        cm = (cm + shift) % ctm
        for rm in range(t.cluster_m):
            for rn in range(t.cluster_n):
                tm, tn = cm * t.cluster_m + rm, cn * t.cluster_n + rn
                if tm < tiles_m and tn < tiles_n:
                    yield tm, tn


def emulate(m, n, k, world, t: tune.TileConfig, *, max_m=None, seed=0, epoch=7):
    """Every rank's GEMM epilogue (route rows, flag owners) and every owner's reduce, in numpy.
    Integer-valued inputs: every sum is exact, so the result must equal the reference exactly."""
    rng = np.random.default_rng(seed)
    max_m = max_m or m
    a = [rng.integers(-3, 4, size=(m, k)).astype(np.float64) for _ in range(world)]
    b = [rng.integers(-3, 4, size=(n, k)).astype(np.float64) for _ in range(world)]
    m_loc = m // world
    tiles_n = _cdiv(n, t.bn)
    cap = rs.tiles_cap_for(max_m, n, [t])
    parts = [np.full(max_m * n, np.nan) for _ in range(world)]
    flags = [np.zeros(rs.flags_bytes(world, cap) // 4, dtype=np.int64) for _ in range(world)]
    set_on = [set() for _ in range(world)]
    for src in range(world):
        p = a[src] @ b[src].T
        visited = list(sched_order(m, n, t, 8, world, (src + 1) % world))
        assert len(visited) == len(set(visited)) == _cdiv(m, t.bm) * tiles_n  # every tile exactly once
        for tm, tn in visited:
            c0, c1 = tn * t.bn, min(n, tn * t.bn + t.bn)
            for g in range(tm * t.bm, tm * t.bm + t.bm):
                route = rs.route_row(g, m, m_loc, src, n)
                if route is None:
                    assert g >= m
                    continue
                owner, off = route
                assert 0 <= off and off + n <= max_m * n
                parts[owner][off + c0:off + c1] = p[g, c0:c1]
            for o in rs.tile_owners(tm, t.bm, m, m_loc):
                idx = rs.flag_index(src, cap, tm, tiles_n, tn)
                assert rs.FLAG_BASE <= idx < len(flags[o])
                flags[o][idx] = epoch
                set_on[o].add(idx)
    outs = []
    for o in range(world):
        out = np.full((m_loc, n), np.nan)
        waited = set()
        for tm, tn, r0, r1, c0, c1 in rs.reduce_units(o, m_loc, t.bm, t.bn, n):
            acc = None
            for q in range(world):  # the fixed order
                idx = rs.flag_index(q, cap, tm, tiles_n, tn)
                assert flags[o][idx] == epoch, f"owner {o} would wait forever on source {q} tile ({tm},{tn})"
                waited.add(idx)
                base = q * m_loc * n
                blk = np.stack([parts[o][base + (r - o * m_loc) * n + c0: base + (r - o * m_loc) * n + c1] for r in range(r0, r1)])
                acc = blk if acc is None else acc + blk
            assert np.isnan(out[r0 - o * m_loc:r1 - o * m_loc, c0:c1]).all(), "an element is reduced twice"
            out[r0 - o * m_loc:r1 - o * m_loc, c0:c1] = acc
        assert waited == set_on[o], "flags raised on an owner that never waits for them, or the reverse"
        outs.append(out)
    full = sum(a[q] @ b[q].T for q in range(world))
    return outs, full, m_loc


CASES = [
    # (m, n, world, tile index): aligned, m/W < tile (decode), m/W not a multiple of the tile, tails in n
    (256, 256, 2, 1),
    (64, 384, 8, 5),  # m=64, W=8: 8 rows per rank inside one 64-row tile
    (64, 256, 8, 0),  # 128-row cluster tile, half of it past m
    (96, 200, 4, 6),  # 24 rows per rank; n not a multiple of bn
    (384, 136, 3, 4),  # odd world, 128 rows per rank
    (40, 128, 8, 2),  # 5 rows per rank, clustered 128x192
    (1000, 264, 8, 3),  # 125 rows per rank: owners straddle tiles everywhere
    (512, 512, 4, 0),
]


@pytest.mark.parametrize("m,n,world,ti", CASES)
def test_protocol_emulation_exact(m, n, world, ti):
    t = TILES[ti]
    outs, full, m_loc = emulate(m, n, 16, world, t, max_m=m + 64 * world)
    for o, out in enumerate(outs):
        assert not np.isnan(out).any(), f"rank {o}: some output element was never reduced"
        np.testing.assert_array_equal(out, full[o * m_loc:(o + 1) * m_loc])


def test_emulation_can_fail():
    """The emulation notices a wrong owner: shift one row's route and the result differs."""
    t = TILES[1]
    orig = rs.route_row

    def bad(g, m, m_loc, src, n):
        r = orig(g, m, m_loc, src, n)
        if r is not None and g == 5:
            return r[0], r[1] + n  # one row too low
        return r

    rs.route_row = bad
    try:
        outs, full, m_loc = emulate(256, 256, 16, 2, t)
        assert any(not np.array_equal(o, full[i * m_loc:(i + 1) * m_loc]) for i, o in enumerate(outs))
    finally:
        rs.route_row = orig


@pytest.mark.parametrize("world", [2, 4, 8])
def test_rotation_visits_owners_in_turn_and_own_rows_last(world):
    """Aligned case (m/W a multiple of 8 tile rows): rank r computes rank r+1's rows first, its
    own last, and at every step the W ranks write to W different owners."""
    t = tune.TileConfig(128, 256, 4)
    n = 1024
    m = world * 8 * 128
    m_loc = m // world
    per_seg = 8 * _cdiv(n, t.bn)
    owners_by_src = []
    for src in range(world):
        order = list(sched_order(m, n, t, 8, world, (src + 1) % world))
        owners = [tm * t.bm // m_loc for tm, _ in order]
        segs = [owners[i * per_seg:(i + 1) * per_seg] for i in range(world)]
        assert all(len(set(s)) == 1 for s in segs)
        seq = [s[0] for s in segs]
        assert seq == [(src + 1 + i) % world for i in range(world)]
        assert seq[-1] == src
        owners_by_src.append(seq)
    for step in range(world):
        assert sorted(owners_by_src[s][step] for s in range(world)) == list(range(world))


def test_tile_owners_and_reduce_units_cover_rows():
    for m, world, bm in [(64, 8, 64), (64, 8, 128), (1000, 8, 128), (96, 4, 64), (8, 8, 64)]:
        m_loc = m // world
        for tm in range(_cdiv(m, bm)):
            own = list(rs.tile_owners(tm, bm, m, m_loc))
            rows = range(tm * bm, min(m, tm * bm + bm))
            assert own == sorted({g // m_loc for g in rows})
        for o in range(world):
            rows = set()
            for tm, tn, r0, r1, c0, c1 in rs.reduce_units(o, m_loc, bm, 128, 256):
                assert o in rs.tile_owners(tm, bm, m, m_loc)
                if tn == 0:
                    assert not rows & set(range(r0, r1))
                    rows |= set(range(r0, r1))
            assert rows == set(range(o * m_loc, (o + 1) * m_loc))


def test_flag_indices_fit_and_are_distinct():
    world = 4
    for max_m, n in [(64, 128), (1000, 264), (4096, 1024)]:
        cap = rs.tiles_cap_for(max_m, n, TILES)
        limit = rs.flags_bytes(world, cap) // 4
        for t in TILES:
            for m in {world, max_m // 2 // world * world or world, max_m // world * world}:
                tiles_m, tiles_n = _cdiv(m, t.bm), _cdiv(n, t.bn)
                idx = {rs.flag_index(s, cap, tm, tiles_n, tn)
                       for s in range(world) for tm in range(tiles_m) for tn in range(tiles_n)}
                assert len(idx) == world * tiles_m * tiles_n
                assert min(idx) >= rs.FLAG_BASE and max(idx) < limit


def test_choose_config_is_deterministic_and_protocol_safe():
    dev = tune.DeviceInfo(sms=132, cc=(9, 0), l2_bytes=50 << 20)
    for m, n, k, layout in [(64, 12288, 6144, "nk"), (8192, 8192, 1024, "kn"), (1000, 264, 512, "nk")]:
        a = rs.choose_config(m, n, k, layout, dev, 128, 4)
        b = rs.choose_config(m, n, k, layout, dev, 128, 4)
        assert a == b
        assert a.splits == 1 and not a.raster_n and a.ctas == 128 and a.tile.supports(layout)
    small = tune.DeviceInfo(sms=14, cc=(9, 0), l2_bytes=50 << 20)
    cfg = rs.choose_config(512, 1024, 512, "nk", small, 1, 4)
    assert cfg.tile.cluster_size == 1  # a cluster of 2 cannot run on 1 CTA


def test_plan_call():
    dev = tune.DeviceInfo(sms=132, cc=(9, 0), l2_bytes=50 << 20)
    cap = rs.tiles_cap_for(1024, 512, TILES)
    p = rs.plan_call(256, n=512, k=256, dtype=DType.BF16, b_layout="nk", partials="fp32", rank=3, world=4, dev=dev,
                     gemm_ctas=128, reduce_ctas=4, tiles_cap=cap, parts_table=1, flags_table=2, epoch_ptr=3)
    assert p.m_loc == 64 and p.seg_start == 0 and 1 <= p.reduce_grid <= 4 and p.tail_grid >= 1
    assert p.fields[:6] == (256, 512, 256, 1, 0, 2) and p.fields[6:] == (p.cfg.tile.bm, p.cfg.tile.bn)
    assert p.cfg.splits == 1 and p.cfg.ctas == 128
    assert rs.SCATTER_PARAMS.unpack(p.epi_params) == (1, 2, 3, 512, 64, cap, 3, 4)
    with pytest.raises(ValueError, match="flags per source"):
        rs.plan_call(4096, n=512, k=256, dtype=DType.BF16, b_layout="nk", partials="fp32", rank=0, world=4, dev=dev,
                     gemm_ctas=128, reduce_ctas=4, tiles_cap=cap)


def test_argument_checks():
    ok = dict(world=2, max_m=128, n=256, k=64, dtype="bf16", b_layout="nk", partials="fp32")
    assert rs.check_op_args(**ok) == DType.BF16
    for bad, exc, msg in [
        (dict(dtype="f32"), TypeError, "bf16 or f16"),
        (dict(b_layout="tn"), ValueError, "b_layout"),
        (dict(partials="fp8"), ValueError, "partials"),
        (dict(n=100), ValueError, "multiples of 8"),
        (dict(k=12), ValueError, "multiples of 8"),
        (dict(max_m=1), ValueError, "smaller than the world size"),
        (dict(max_m=0), ValueError, "positive"),
    ]:
        with pytest.raises(exc, match=msg):
            rs.check_op_args(**(ok | bad))
    assert rs.check_m(64, 128, 8) == 8
    with pytest.raises(ValueError, match="not a multiple of the world size 8"):
        rs.check_m(60, 128, 8)
    with pytest.raises(ValueError, match="exceeds the op's capacity"):
        rs.check_m(256, 128, 8)
    with pytest.raises(ValueError, match="at least"):
        rs.check_m(0, 128, 8)


def test_functional_form_rejects_bad_options_before_any_group():
    with pytest.raises(ValueError, match="b_layout"):
        rs.gemm_rs(None, None, object(), b_layout="nn")
    with pytest.raises(ValueError, match="partials"):
        rs.gemm_rs(None, None, object(), partials="int8")


def test_default_reduce_ctas(monkeypatch):
    monkeypatch.delenv("RAWFLUX_RS_REDUCE_CTAS", raising=False)
    assert rs.default_reduce_ctas(132, 8) == 4
    assert rs.default_reduce_ctas(14, 8) == 1
    monkeypatch.setenv("RAWFLUX_RS_REDUCE_CTAS", "20")
    assert rs.default_reduce_ctas(132, 8) == 20
    assert rs.default_reduce_ctas(14, 8) == 7  # capped at half the SMs
    monkeypatch.setenv("RAWFLUX_RS_REDUCE_CTAS", "x")
    with pytest.raises(ValueError, match="RAWFLUX_RS_REDUCE_CTAS"):
        rs.default_reduce_ctas(132, 8)


def test_variants_registered():
    from rawflux.jit import variants

    names = {v.name_expr for v in variants() if v.relpath == rs.KERNEL_FILE}
    for dt in rs.DTYPES:
        assert rs.reduce_kernel_name("fp32", dt) in names
        for layout in rs.B_LAYOUTS:
            for t in tune.tiles_for(layout):
                assert rs.gemm_kernel_name(t, dt, layout, "fp32") in names


# --------------------------------------------------------------------------------------------
# NVRTC: the Python mirrors agree with the CUDA structs; the kernels compile without spills


def _nvrtc():
    try:
        from rawflux.jit import compile_cubin, nvrtc_version

        nvrtc_version()
        return compile_cubin
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"NVRTC unavailable: {e}")


def test_struct_layouts_match_python():
    compile_cubin = _nvrtc()
    src = f"""
#include "rawflux/kernels/gemm_rs.cu"
namespace rawflux {{
using SP = ScatterStore<2>::Params;
static_assert(sizeof(SP) == {rs.SCATTER_PARAMS.size}, "ScatterStore::Params size");
static_assert(__builtin_offsetof(SP, parts_peers) == 0 && __builtin_offsetof(SP, flags_peers) == 8, "SP");
static_assert(__builtin_offsetof(SP, epoch) == 16 && __builtin_offsetof(SP, ld) == 24, "SP");
static_assert(__builtin_offsetof(SP, m_loc) == 32 && __builtin_offsetof(SP, tiles_cap) == 36, "SP");
static_assert(__builtin_offsetof(SP, rank) == 40 && __builtin_offsetof(SP, world) == 44, "SP");
static_assert(sizeof(RsReduceParams) == {rs.REDUCE_PARAMS.size}, "RsReduceParams size");
static_assert(__builtin_offsetof(RsReduceParams, out) == 32 && __builtin_offsetof(RsReduceParams, bias) == 40, "RP");
static_assert(__builtin_offsetof(RsReduceParams, m) == 48 && __builtin_offsetof(RsReduceParams, bias_kind) == 76, "RP");
static_assert(__builtin_offsetof(RsReduceParams, bm) == 60 && __builtin_offsetof(RsReduceParams, tiles_cap) == 72, "RP");
static_assert(kRsFlagBase == {rs.FLAG_BASE} && kRsReduceThreads == {rs.REDUCE_THREADS}, "constants");
static_assert(kRsPartF32 == {rs.PARTIALS['fp32'][0]} && kRsPartBF16 == {rs.PARTIALS['bf16'][0]} && kRsPartF16 == {rs.PARTIALS['f16'][0]}, "partials");
static_assert(epi::kBiasNone == {rs.BIAS_NONE} && epi::kBiasIn16 == {rs.BIAS_IN16} && epi::kBiasF32 == {rs.BIAS_F32}, "bias");
static_assert(kOpGemmRs == {rs.OP_GEMM_RS}, "op id");
}}
__global__ void rawflux_rs_layout_probe() {{}}
"""
    compile_cubin(src, arch="sm_90a", filename="rs_layout_probe.cu")


def test_kernels_compile_without_spills():
    compile_cubin = _nvrtc()
    from rawflux.jit import kernel_source

    t = tune.TileConfig(128, 256, tune.max_stages(128, 256), cluster_m=2)
    names = [rs.reduce_kernel_name("fp32", DType.BF16), rs.reduce_kernel_name("bf16", DType.BF16),
             rs.gemm_kernel_name(t, DType.BF16, "nk", "fp32"), rs.gemm_kernel_name(tune.TileConfig(64, 128, 8), DType.F16, "kn", "f16")]
    res = compile_cubin(kernel_source(rs.KERNEL_FILE), arch="sm_90a", name_expressions=tuple(names), filename=rs.KERNEL_FILE)
    for name in names:
        r = res.resources[res.lowered[name]]
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, (name, r)


# --------------------------------------------------------------------------------------------
# the fp32 scatter store's lane-pair exchange (rs::store_rows_f32), simulated lane by lane


def _frag_value(tid, reg, wn):
    """The accumulator layout of wgmma m64nNk16 (gemm/epilogue.cuh Frag): (row, col) of a register."""
    row = 16 * (tid // 32) + (tid % 32) // 4 + 8 * ((reg % 4) // 2)
    col = 8 * (reg // 4) + 2 * (tid % 4) + (reg % 2)
    return row, col


@pytest.mark.parametrize("wn", [16, 48, 64, 128, 160, 224, 256])
def test_store_rows_f32_exchange(wn):
    regs = wn // 2
    truth = np.arange(64 * wn, dtype=np.float64).reshape(64, wn)
    acc = np.zeros((128, regs))
    for tid in range(128):
        for reg in range(regs):
            acc[tid, reg] = truth[_frag_value(tid, reg, wn)]
    got = np.full((64, wn), np.nan)
    for j in range(0, regs // 4, 2):
        # __shfl_xor_sync(v, 1): lane t receives lane t^1's value, within each warp
        send = {}
        for tid in range(128):
            q = tid % 4
            odd = q & 1
            x = acc[tid, [4 * j + 0, 4 * j + 1, 4 * j + 2, 4 * j + 3]]
            y = acc[tid, [4 * j + 4, 4 * j + 5, 4 * j + 6, 4 * j + 7]]
            send[tid] = (x if odd else y)
        for tid in range(128):
            q = tid % 4
            odd = q & 1
            recv = send[tid ^ 1]
            xa0, xa1, xb0, xb1 = acc[tid, [4 * j, 4 * j + 1, 4 * j + 2, 4 * j + 3]]
            ya0, ya1, yb0, yb1 = acc[tid, [4 * j + 4, 4 * j + 5, 4 * j + 6, 4 * j + 7]]
            ra0, ra1, rb0, rb1 = recv
            col = 8 * (j + 1) + 2 * (q - 1) if odd else 8 * j + 2 * q
            ra = 16 * (tid // 32) + (tid % 32) // 4
            va = (ra0, ra1, ya0, ya1) if odd else (xa0, xa1, ra0, ra1)
            vb = (rb0, rb1, yb0, yb1) if odd else (xb0, xb1, rb0, rb1)
            for row, v in ((ra, va), (ra + 8, vb)):
                assert np.isnan(got[row, col:col + 4]).all(), "two lanes store the same chunk"
                got[row, col:col + 4] = v
    np.testing.assert_array_equal(got, truth)


# --------------------------------------------------------------------------------------------
# a whole call at world 4 with every CUDA entry point faked: the order of what is issued


def test_the_gemm_is_queued_before_the_reducers_that_wait_on_it(fake_cuda, monkeypatch):
    """Streams may share one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1; MPS): a reduce kernel
    queued before the GEMM whose flags it spins on would hold that GEMM back until it times out
    (seen on the emulated node, 2026-11-29). The GEMM must be issued first, and its kernel
    resolved before the call issues anything."""
    from rawflux.ops import _collective as C
    from rawflux.ops import gemm_rs as R
    from tests.cpu.test_ag_gemm_cpu import BASE, FakeCAI, _Group, _Kernel

    log, _ = fake_cuda

    class _ExKernel(_Kernel):
        def launch_ex(self, grid, block, args, stream=None, **kw):
            log.append(("kernel", self.name.split("::")[-1].split("<")[0], stream))

    monkeypatch.setattr(C, "get_kernel", lambda rel, name, device_id=None: _ExKernel(name, log))
    class _Plan:
        def launch(self, a_ptr, b_ptr, *, lda, ldb, stream, epilogue_params, **kw):
            log.append(("gemm", stream, self))

    plan = _Plan()
    monkeypatch.setattr(R.engine, "plan", lambda *a, **kw: log.append(("plan",)) or plan)
    monkeypatch.setattr(R, "_launch_reduce", lambda kernel, grid, stream, params: log.append(("reduce", stream, grid)))
    rank, world, m, n, k = 1, 4, 512, 256, 128
    monkeypatch.setattr(R, "bounded_allgather", lambda group, value, what, timeout_s=None: [value] * world)
    op = R.GemmRS(_Group(rank, world, log), m, n, k, "bf16")
    main = 0x42
    log.clear()
    out = FakeCAI(BASE + (1 << 30), (m // world, n))
    res = op(FakeCAI(BASE, (m, k)), FakeCAI(BASE + (2 << 30), (n, k)), out=out, stream=main)
    assert res is out
    kinds = [e[0] for e in log]
    gemm_at = kinds.index("gemm")
    reduces = [i for i, kd in enumerate(kinds) if kd == "reduce"]
    assert log[gemm_at][1] == main and len(reduces) == 2
    assert gemm_at < min(reduces), log  # the producer first
    assert kinds.index("barrier") < gemm_at  # buffers are free: every peer finished the last call
    assert log[gemm_at][2] is plan
    # The GEMM's kernel is resolved (compiled, loaded) before anything is issued: a compile after
    # the barrier would hold the peers' flag waits (seen as a timeout in a loop of 1000 calls).
    assert kinds.index("plan") < min(i for i, kd in enumerate(kinds) if kd != "plan")
    side = [e for e in log if e[0] == "reduce" and e[1] != main]
    assert len(side) == 1  # one reducer beside the GEMM, one after it on the caller's stream


# --------------------------------------------------------------------------------------------
# the reduce kernel's unit counter (rs::claim_unit), its atomic steps interleaved at random


def _claimers(epoch: int, ctas: int, units: int, counter: list, rng, cas_only: bool = False, install: int = 1):
    """Step machines of claim_unit (fused/rs_reduce.cuh), one per CTA, each claiming until it gets
    a unit >= units; yields the units every CTA got. One atomic step per next()."""
    tag = epoch << 32

    def cta(got):
        while True:
            if cas_only:  # the old loop: read, then CAS, until the CAS wins
                cur = counter[0]
                yield
                current = (cur >> 32) == epoch
                want = cur + 1 if current else tag | 1
                if counter[0] == cur:
                    counter[0] = want
                    u = (cur & 0xFFFFFFFF) if current else 0
                else:
                    yield
                    continue
            else:
                prev = counter[0]
                counter[0] = prev + 1  # atomicAdd
                yield
                if (prev >> 32) == epoch:
                    u = prev & 0xFFFFFFFF
                else:
                    cur = counter[0]
                    yield
                    if (cur >> 32) == epoch:
                        continue
                    if counter[0] == cur:  # atomicCAS
                        counter[0] = tag | install
                        u = 0
                    else:
                        yield
                        continue
            yield
            if u >= units:
                return
            got.append(u)

    gots = [[] for _ in range(ctas)]
    live = [cta(g) for g in gots]
    while live:
        i = int(rng.integers(len(live)))
        try:
            next(live[i])
        except StopIteration:
            live.pop(i)
    return gots


@pytest.mark.parametrize("seed", range(40))
def test_claim_unit_hands_out_every_unit_once(seed):
    rng = np.random.default_rng(seed)
    units, ctas = int(rng.integers(1, 300)), int(rng.integers(1, 40))
    stale = (int(rng.integers(0, 5)) << 32) | int(rng.integers(0, 1000))  # an older call's count
    counter = [stale]
    got = sorted(u for g in _claimers(7, ctas, units, counter, rng) for u in g)
    assert got == list(range(units))
    # the next call (new epoch) starts over from the garbage this one left
    got = sorted(u for g in _claimers(8, ctas, units, counter, rng) for u in g)
    assert got == list(range(units))


def test_claim_unit_model_can_fail():
    """Mutations of the claim lose or repeat units, and the interleaving model sees it: installing
    the new tag with next = 0 (unit 0 handed out twice), or trusting a stale count."""
    rng = np.random.default_rng(1)
    seen_bad = False
    for _ in range(20):
        got = sorted(u for g in _claimers(7, 8, 40, [(3 << 32) | 50], rng, install=0) for u in g)
        seen_bad |= got != list(range(40))
    assert seen_bad
    got = sorted(u for g in _claimers(7, 8, 40, [(7 << 32) | 50], rng) for u in g)  # same epoch: the stale count is trusted
    assert got != list(range(40))
    got = sorted(u for g in _claimers(7, 8, 40, [(3 << 32) | 50], rng, cas_only=True) for u in g)  # the old loop: right, slow
    assert got == list(range(40))


def test_ranks_with_different_grids_pick_the_same_tile(fake_cuda, monkeypatch):
    """Ranks of one group may run different GEMM grids: their reduce_ctas may differ (the
    determinism check passes 1 + rank % 3) and their devices' SM counts too (an SM cap under MPS on
    the emulated node: 16 and 17). Every rank must still pick the same tile for a call (flag
    layout, call check): the op picks it for the group's smallest grid and runs its own."""
    from rawflux import tune
    from rawflux.ops import gemm_rs as R
    from tests.cpu.test_ag_gemm_cpu import _Group

    log, _ = fake_cuda
    world, m, n, k = 8, 256, 2048, 4096
    own = {q: tune.DeviceInfo(16 if q % 2 else 17, (9, 0), 50 << 20, "fake") for q in range(world)}
    reduce = {q: 1 + q % 3 for q in range(world)}
    grid = {q: own[q].sms - reduce[q] for q in range(world)}
    alone = {q: R.choose_config(m, n, k, "nk", own[q], grid[q], 4).tile for q in range(world)}
    assert len(set(alone.values())) > 1, "the ranks' own picks agree here: the test would check nothing"
    mine = (m, n, k, R.DTYPE_CODE[R.DType.BF16], R._LAYOUT_CODE["nk"], R.PARTIALS["fp32"][0])
    plans = []
    for rank in range(world):
        monkeypatch.setattr(tune, "device_info", lambda dev, rank=rank: own[rank])

        def allgather(group, value, what, timeout_s=None, rank=rank):
            # the real one packs a flat tuple of ints into an int64 array (one row per rank)
            assert value == mine + (grid[rank],) and all(isinstance(x, int) for x in value), value
            return [tuple(int(x) for x in np.asarray(mine + (grid[q],), dtype=np.int64)) for q in range(world)]

        monkeypatch.setattr(R, "bounded_allgather", allgather)
        op = R.GemmRS(_Group(rank, world, log), m, n, k, "bf16", reduce_ctas=reduce[rank])
        assert op.gemm_ctas == grid[rank] and op.tile_ctas == min(grid.values())
        p = op.plan(m)
        assert p.cfg.ctas == grid[rank]  # each rank runs its own grid
        plans.append((p.cfg.tile, p.fields))
    assert all(x == plans[0] for x in plans), plans
    assert plans[0][0] == R.choose_config(m, n, k, "nk", own[1], min(grid.values()), 4).tile
