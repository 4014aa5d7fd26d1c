"""rawflux.gemm against a float64 reference, side by side with cuBLAS (cupy.matmul) on the same
inputs: ours must be within 1.5x cuBLAS's relative Frobenius error (+ a tiny epsilon). Fresh random
inputs for every check, outputs poisoned with NaN before each run, every element checked written.
"""
from __future__ import annotations

import random

import pytest

cupy = pytest.importorskip("cupy")


def _hopper() -> bool:
    try:
        return cupy.cuda.Device().compute_capability == "90"
    except Exception:  # noqa: BLE001
        return False


pytestmark = pytest.mark.gpu

GRID_NK = [(6144, 12288), (12288, 6144), (8192, 8192), (28672, 8192), (8192, 28672)]
GRID_M = [64, 128, 256, 512, 1024, 2048, 4096, 8192]


@pytest.fixture
def rf(gpu):
    if not _hopper():
        pytest.skip("rawflux.gemm's kernels need sm_90 (Hopper)")
    from rawflux.ops import gemm as g

    return g


def _dtype(tag):
    from rawflux.runtime import DType

    return {"bf16": DType.BF16, "f16": DType.F16, "f32": DType.F32}[tag].np


# bf16 through bit operations only: nothing here relies on CuPy's bf16 arithmetic support.
def _from_f32(x32, tag):
    if tag == "f32":
        return x32
    if tag == "f16":
        return x32.astype(cupy.float16)
    u = x32.view(cupy.uint32)
    r = ((u + cupy.uint32(0x7FFF) + ((u >> 16) & cupy.uint32(1))) >> 16).astype(cupy.uint16)  # round to nearest even
    return r.view(_dtype("bf16"))


def _f64(x):
    if x.dtype == _dtype("bf16"):
        return (x.view(cupy.uint16).astype(cupy.uint32) << 16).view(cupy.float32).astype(cupy.float64)
    return x.astype(cupy.float64)


_NAN_BITS = {"bf16": (cupy.uint16, 0x7FC0), "f16": (cupy.uint16, 0x7E00), "f32": (cupy.uint32, 0x7FC00000)}


def _poisoned(shape, tag):
    out = cupy.empty(shape, dtype=_dtype(tag))
    raw, bits = _NAN_BITS[tag]
    out.view(raw).fill(bits)
    return out


def _rand(shape, tag, rng_seed):
    rs = cupy.random.RandomState(rng_seed)
    return _from_f32(rs.standard_normal(shape, dtype=cupy.float32), tag)


def _rel(x, ref) -> float:
    return float(cupy.linalg.norm(_f64(x) - ref) / cupy.linalg.norm(ref))


def check(rf, m, n, k, *, dtype="bf16", layout="nk", out_dtype=None, bias=None, config=None, seed=None):
    """Run one product; return (ours, cublas) relative errors. Asserts everything it can."""
    seed = random.randrange(1 << 30) if seed is None else seed
    a = _rand((m, k), dtype, seed)
    w = _rand((n, k), dtype, seed + 1)  # the (n, k) weight; "kn" passes its transpose, made contiguous
    b = w if layout == "nk" else cupy.ascontiguousarray(w.T)
    out_tag = out_dtype or dtype
    bvec = None
    if bias is not None:
        bvec = _rand((n,), bias, seed + 2)
    out = _poisoned((m, n), out_tag)  # every element must be written
    got = rf.gemm(a, b, b_layout=layout, bias=bvec, out=out, out_dtype=out_dtype, config=config)
    assert got is out
    cupy.cuda.get_current_stream().synchronize()
    ref = _f64(a) @ _f64(w).T
    if bvec is not None:
        ref = ref + _f64(bvec)[None, :]
    # cuBLAS on the same inputs, producing the same output type.
    if out_tag == dtype:
        cub = cupy.matmul(a, w.T)
        if bvec is not None:
            cub = _from_f32((_f64(cub) + _f64(bvec)[None, :]).astype(cupy.float32), out_tag)
    else:
        cub = cupy.matmul(_f64(a).astype(cupy.float32), _f64(w).T.astype(cupy.float32))
        if bvec is not None:
            cub = cub + _f64(bvec).astype(cupy.float32)
    outf = _f64(out)
    n_bad = int(cupy.count_nonzero(~cupy.isfinite(outf)))
    assert n_bad == 0, f"{n_bad} of {m * n} outputs not written (still NaN) for m={m} n={n} k={k} {dtype} {layout}"
    ours, theirs = _rel(out, ref), _rel(cub, ref)
    eps = 1e-5
    assert ours <= 1.5 * theirs + eps, (
        f"m={m} n={n} k={k} {dtype} {layout} out={out_tag} bias={bias} cfg={config}: rel err {ours:.3e} vs cuBLAS {theirs:.3e}"
    )
    return ours, theirs


@pytest.mark.parametrize("n,k", GRID_NK)
@pytest.mark.parametrize("m", GRID_M)
def test_grid_bf16_nk(rf, m, n, k):
    check(rf, m, n, k)


def test_random_shapes(rf):
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng = random.Random(seed)
    worst = 0.0
    for i in range(50):
        m = rng.choice([rng.randint(1, 300), rng.randint(1, 3000)])
        n = 8 * rng.randint(1, 512)
        k = 8 * rng.randint(1, 512)
        dtype = rng.choice(["bf16", "f16"])
        layout = rng.choice(["nk", "kn"])
        out_dtype = rng.choice([None, "f32"])
        bias = rng.choice([None, dtype, "f32"])
        ours, theirs = check(rf, m, n, k, dtype=dtype, layout=layout, out_dtype=out_dtype, bias=bias, seed=rng.randrange(1 << 30))
        worst = max(worst, ours / max(theirs, 1e-30))
    print(f"random shapes (seed {seed}): worst ratio to cuBLAS error {worst:.3f}")


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("layout", ["nk", "kn"])
@pytest.mark.parametrize("out_dtype", [None, "f32"])
@pytest.mark.parametrize("bias", [None, "same", "f32"])
def test_variants(rf, dtype, layout, out_dtype, bias):
    bias = dtype if bias == "same" else bias
    check(rf, 777, 1288, 1032, dtype=dtype, layout=layout, out_dtype=out_dtype, bias=bias)


def test_every_tile_config(rf):
    """Each compiled tile shape, with and without split-K, on shapes with ragged edges."""
    from rawflux import tune

    for t in tune.TILES:
        for layout in ("nk", "kn"):
            if not t.supports(layout):
                continue
            for splits in (1, 3):
                cfg = tune.GemmConfig(t, tune.Decomp.split_k(splits), group=3, raster_n=bool(splits == 3))
                check(rf, 300, 968, 1544, layout=layout, config=cfg)
                check(rf, 5, 520, 4104, layout=layout, config=cfg, dtype="f16", out_dtype="f32")


STREAM_K_CASES = [
    # (m, n, k, ctas): every tile cut into many runs; data-parallel waves + cut tiles on a small
    # grid (runs spanning tiles; the first of the listed grids that leaves a partial wave for the
    # tile); one k block per cluster (k = 72); ragged m, n and k.
    (300, 968, 4104, (0,)),
    (300, 968, 4104, (6, 7, 10, 14)),
    (300, 968, 72, (0,)),
    (1000, 2056, 1000, (20, 22, 26)),
]


def _cut_tiles_every_tile(rf, cases, seed, f32_case, require_cut, mode="tail"):
    """Every tile that compiles stream-K, nk and kn, on each case (m, n, k, grids, v): the first
    grid whose plan cuts a tile (mode "tail": stream-K runs with v = 0, else the split tail of v
    pieces; mode "band": banded stream-K with bands of v clusters);
    against float64 (bias 16-bit in the first two cases, f32 after; f32 output in case `f32_case`),
    then bitwise repeatable (pieces summed in k order, counters left at zero)."""
    from rawflux import tune

    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    for t in tune.TILES:
        if not t.stream_k_ok:
            continue
        for layout in ("nk", "kn"):
            if not t.supports(layout):
                continue
            for i, (m, n, k, grids, v) in enumerate(cases):
                decomp = tune.Decomp(mode, v) if v else tune.STREAM_K
                cfgs = [tune.GemmConfig(t, decomp, group=2, raster_n=bool(i % 2), ctas=c) for c in grids]
                cfg = next((c for c in cfgs if tune.sk_plan(m, n, k, c, sms).sk_tiles > 0), None)
                if cfg is None:
                    assert not require_cut, f"{t.tag()} {(m, n, k, grids)}: no grid cuts a tile (a test that checks nothing)"
                    continue
                dtype = ("bf16", "f16")[i % 2]
                check(rf, m, n, k, layout=layout, config=cfg, dtype=dtype, bias=dtype if i < 2 else "f32",
                      out_dtype="f32" if i == f32_case else None)
                a = _rand((m, k), dtype, seed + 2 * i)
                w = _rand((n, k), dtype, seed + 2 * i + 1)
                b = w if layout == "nk" else cupy.ascontiguousarray(w.T)
                first = rf.gemm(a, b, b_layout=layout, config=cfg)
                again = rf.gemm(a, b, b_layout=layout, config=cfg)
                assert bool(cupy.all(again.view(cupy.uint16) == first.view(cupy.uint16))), f"{t.tag()} {layout}: not bitwise repeatable"


def test_stream_k_every_tile(rf):
    """Stream-K on every tile that compiles it: the grids cut tiles into 1 to ~9 pieces, runs span
    tiles, a small grid mixes data-parallel waves with cut tiles; against float64, with bias and f32
    output; and each result repeats bitwise (pieces summed in k order, counters left at zero)."""
    _cut_tiles_every_tile(rf, [(*case, 0) for case in STREAM_K_CASES], 11, 3, True)


SPLIT_TAIL_CASES = [
    # (m, n, k, ctas, pieces): a partial wave after data-parallel ones on small grids, pieces of
    # one k block (k = 200: 4 blocks, 5 pieces asked), ragged m, n and k.
    (300, 968, 4104, (6, 10, 14), 3),
    (1000, 2056, 1000, (20, 22, 26), 2),
    (520, 1800, 200, (10, 14), 5),
    (4096, 3072, 640, (0,), 4),
]


def test_split_tail_every_tile(rf):
    """The split tail (GemmConfig.tail) on every tile that compiles stream-K: the partial wave's
    tiles cut into k-aligned pieces summed by the split-K fix-up; against float64 (bias, f32
    output), and bitwise repeatable."""
    from rawflux import tune

    _cut_tiles_every_tile(rf, SPLIT_TAIL_CASES, 21, 1, False)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    # Each case cut a tile for some tile shape (else the test checks nothing).
    t = next(t for t in tune.TILES if t.stream_k_ok and t.cluster_m == 2 and t.bn == 256)
    for m, n, k, grids, pieces in SPLIT_TAIL_CASES:
        assert any(tune.sk_plan(m, n, k, tune.GemmConfig(t, tune.Decomp("tail", pieces), ctas=c), sms).sk_tiles for c in grids)


BAND_CASES = [
    # (m, n, k, ctas, band): grids whose clusters leave none over, or 1-2 over (they run the line's
    # end in passes); runs of one k block (k = 200), ragged m, n and k, the whole grid, few tiles.
    (1000, 2056, 1000, (10, 14, 22), 2),
    (520, 1800, 4104, (12, 18, 42), 3),
    (300, 968, 200, (6, 10, 14), 2),
    (2048, 3072, 640, (0,), 4),
    (256, 1024, 4096, (0, 40), 2),  # fewer tiles than clusters: a tile cut into up to ~30 pieces
]


NARROW_CASES = [
    # (m, n, k, ctas, dtype, bias): narrow-column plans (tune.narrow_plan) of widths 240, 232, 224 and
    # 208; ragged m, n and k; small grids (fewer clusters, so more waves); raster over two row groups
    # (m = 4096); 16-bit and f32 bias.
    (1024, 12288, 256, 0, "bf16", None),
    (2048, 8192, 192, 0, "f16", "f16"),
    (2048, 12288, 128, 0, "bf16", "f32"),
    (1000, 12000, 200, 0, "bf16", None),
    (600, 3000, 136, 20, "f16", "f16"),
    (4096, 8192, 64, 0, "bf16", None),
    (1024, 28672, 64, 0, "f16", None),
    (777, 3000, 520, 26, "bf16", "f32"),
]


def test_narrow_columns(rf):
    """Narrow columns (Decomp narrow): the 128x256 pair's last-wave tiles narrower. Against
    float64 (poisoned output, so every element is written), and bit for bit the data-parallel
    pair's output on the same inputs (the same k order per element; a narrow tile's last box,
    moved to end at its width, writes nothing of the next column's)."""
    from dataclasses import replace

    from rawflux import tune

    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    t = tune.NARROW_TILES[0]
    widths = set()
    for i, (m, n, k, ctas, dtype, bias) in enumerate(NARROW_CASES):
        base = tune.GemmConfig(t, tune.DP, 8, -(-m // t.bm) > -(-n // t.bn), ctas=ctas)
        plan = tune.narrow_plan(m, n, base, sms)
        assert plan is not None, f"{(m, n, ctas)}: no narrow plan on {sms} SMs (a test that checks nothing)"
        widths.add(plan.width)
        cfg = replace(base, decomp=tune.Decomp("narrow", plan.width))
        check(rf, m, n, k, config=cfg, dtype=dtype, bias=bias)
        a = _rand((m, k), dtype, 700 + 3 * i)
        w = _rand((n, k), dtype, 701 + 3 * i)
        bvec = None if bias is None else _rand((n,), bias, 702 + 3 * i)
        narrow = rf.gemm(a, w, bias=bvec, out=_poisoned((m, n), dtype), config=cfg)
        dp = rf.gemm(a, w, bias=bvec, out=_poisoned((m, n), dtype), config=base)
        same = cupy.all(narrow.view(cupy.uint16) == dp.view(cupy.uint16))
        assert bool(same), f"{cfg.tag()} {(m, n, k)}: {int(cupy.count_nonzero(narrow.view(cupy.uint16) != dp.view(cupy.uint16)))} elements differ from {base.tag()}"
    assert len(widths) >= 4, widths


def test_band_stream_k_every_tile(rf):
    """Banded stream-K (GemmConfig.band) on every tile that compiles stream-K: stacks of tiles cut
    into runs that a band of clusters takes side by side, the leftover clusters in passes; against
    float64 (bias, f32 output), and bitwise repeatable."""
    from rawflux import tune

    _cut_tiles_every_tile(rf, BAND_CASES, 31, 2, False, mode="band")
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    t = next(t for t in tune.TILES if t.stream_k_ok and t.cluster_m == 2 and t.bn == 256)
    for m, n, k, grids, band in BAND_CASES:
        assert any(tune.sk_plan(m, n, k, tune.GemmConfig(t, tune.Decomp("band", band), ctas=c), sms).sk_tiles for c in grids)


def test_few_ctas_and_rotation(rf):
    """Persistent CTAs walking many tiles each, and the row-block rotation the fused ops use."""
    from rawflux import engine, tune
    from rawflux.runtime import DType

    t = next(iter(tune.TILES))
    check(rf, 1000, 2048, 512, config=tune.GemmConfig(t, ctas=6))
    m, n, k = 1024, 1024, 256
    a = _rand((m, k), "bf16", 1)
    w = _rand((n, k), "bf16", 2)
    ref = _f64(a) @ _f64(w).T
    for seg_count, seg_start in ((4, 1), (4, 3), (8, 5)):
        out = _poisoned((m, n), "bf16")
        cfg = tune.GemmConfig(t)
        s = cupy.cuda.get_current_stream().ptr
        plan = engine.plan(cfg, m, n, k, dtype=DType.BF16, b_layout="nk", out_dtype=DType.BF16, device_id=0, stream=s,
                           sched=engine.FUSED_SCHED, epilogue=engine.LOCAL_STORE_EPI, seg_count=seg_count, seg_start=seg_start)
        plan.launch(a.data.ptr, w.data.ptr, lda=k, ldb=k, stream=s, epilogue_params=engine.local_store_params(out.data.ptr, n))
        cupy.cuda.get_current_stream().synchronize()
        assert int(cupy.count_nonzero(cupy.isnan(_f64(out)))) == 0
        assert _rel(out, ref) < 1e-2


def test_split_k_repeat_is_deterministic(rf):
    """Split-K sums partials in split order: repeated runs give identical bits, and the counters
    left behind by one launch do not disturb the next."""
    from rawflux import tune

    t = next(t for t in tune.TILES if t.bm == 64)
    cfg = tune.GemmConfig(t, tune.Decomp.split_k(5))
    a = _rand((64, 8192), "bf16", 3)
    w = _rand((1024, 8192), "bf16", 4)
    first = rf.gemm(a, w, config=cfg)
    for _ in range(3):
        again = rf.gemm(a, w, config=cfg)
        assert bool(cupy.all(again.view(cupy.uint16) == first.view(cupy.uint16)))


def test_ksplit_cluster_matches_split_k(rf):
    """k-split clusters (tune.KSPLIT_TILES): against float64 on ragged shapes, both
    layouts, bias, f32 out; and bit for bit what split-K k2 gives with the same tile, since both
    sum (0 + k half 0) + k half 1 over the same halves."""
    from rawflux import tune

    for t in tune.KSPLIT_TILES:
        plain = next(x for x in tune.TILES if (x.bm, x.bn, x.cluster_size) == (t.bm, t.bn, 1))
        for m, n, k, layout, out_dtype, bias in ((300, 968, 1544, "nk", None, None), (77, 1032, 4104, "kn", "f32", "f32"),
                                                 (128, 2048, 136, "nk", None, "bf16")):
            if not t.supports(layout):
                continue
            cfg = tune.GemmConfig(t)
            check(rf, m, n, k, layout=layout, config=cfg, out_dtype=out_dtype, bias=bias)
            seed = random.randrange(1 << 30)
            a = _rand((m, k), "bf16", seed)
            w = _rand((n, k), "bf16", seed + 1)
            b = w if layout == "nk" else cupy.ascontiguousarray(w.T)
            mine = rf.gemm(a, b, b_layout=layout, config=cfg)
            split = rf.gemm(a, b, b_layout=layout, config=tune.GemmConfig(plain, tune.Decomp.split_k(2)))
            assert bool(cupy.all(mine.view(cupy.uint16) == split.view(cupy.uint16))), f"{t.tag()} {layout}: not split-K k2's bits"
    # The model picks one at m = 128, n = 6144, k = 12288 on a full H100/H200 (132 SMs), so
    # test_grid_bf16_nk checks a default k-split call against float64 there (at n = k = 8192 since
    # the model of 2026-11-30: 64x128, measured faster).
    from rawflux import engine
    from rawflux.runtime import DType

    if tune.device_info(0).sms >= 128:
        assert engine.pick_config(128, 6144, 12288, DType.BF16, "nk", DType.BF16, 0).tile in tune.KSPLIT_TILES


def test_allocating_path_and_torch(rf):
    m, n, k = 129, 264, 136
    a = _rand((m, k), "bf16", 5)
    w = _rand((n, k), "bf16", 6)
    c = rf.gemm(a, w)
    assert isinstance(c, cupy.ndarray) and c.shape == (m, n) and c.dtype == a.dtype
    ref = _f64(a) @ _f64(w).T
    assert _rel(c, ref) < 1e-2
    c32 = rf.gemm(a, w, out_dtype="f32")
    assert c32.dtype == cupy.float32 and _rel(c32, ref) < 1e-4
    torch = pytest.importorskip("torch")
    ta = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    tw = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    tc = rf.gemm(ta, tw)
    assert isinstance(tc, torch.Tensor) and tc.dtype == torch.bfloat16 and tc.shape == (m, n)
    tref = ta.double() @ tw.double().T
    assert float((tc.double() - tref).norm() / tref.norm()) < 1e-2
    tk = rf.gemm(ta, tw.T.contiguous(), b_layout="kn")
    assert float((tk.double() - tref).norm() / tref.norm()) < 1e-2


def test_bad_inputs_raise_before_launch(rf):
    bf = _dtype("bf16")
    a = _rand((64, 128), "bf16", 7)
    w = _rand((256, 128), "bf16", 8)
    with pytest.raises(ValueError, match="k = 12"):
        rf.gemm(_rand((64, 12), "bf16", 1), _rand((256, 12), "bf16", 2))
    with pytest.raises(ValueError, match="n = 20"):
        rf.gemm(a, _rand((20, 128), "bf16", 3))
    with pytest.raises(ValueError, match="k differs"):
        rf.gemm(a, _rand((256, 136), "bf16", 4))
    with pytest.raises(TypeError, match="dtype"):
        rf.gemm(a, _rand((256, 128), "f16", 5))
    with pytest.raises(TypeError, match="dtype"):
        rf.gemm(cupy.ones((64, 128), dtype=cupy.float32), cupy.ones((256, 128), dtype=cupy.float32))
    with pytest.raises(ValueError, match="b_layout"):
        rf.gemm(a, w, b_layout="nn")
    with pytest.raises(ValueError, match="shape"):
        rf.gemm(a, w, out=cupy.empty((64, 255), dtype=bf))
    with pytest.raises(TypeError, match="out dtype"):
        rf.gemm(a, w, out_dtype="f16")
    with pytest.raises(ValueError, match="bias"):
        rf.gemm(a, w, bias=_rand((255,), "bf16", 6))
    with pytest.raises(ValueError, match="strides"):
        rf.gemm(_rand((128, 64), "bf16", 9).T, w)
    with pytest.raises(ValueError, match="2-D"):
        rf.gemm(_rand((2, 64, 128), "bf16", 10), w)


def test_fast_path_rechecks_pointers(rf):
    """A second call with the same metadata takes the fast path: fresh buffers must still be right,
    and an output overlapping an input must still raise before any launch."""
    m, n = 256, 512
    for _ in range(3):  # new buffers each time, same shapes: the fast path
        a = _rand((m, n), "bf16", random.randrange(1 << 30))
        w = _rand((n, n), "bf16", random.randrange(1 << 30))
        out = _poisoned((m, n), "bf16")
        rf.gemm(a, w, out=out)
        assert _rel(out, _f64(a) @ _f64(w).T) < 1e-2
        c = rf.gemm(a, w)  # allocating fast path
        assert _rel(c, _f64(a) @ _f64(w).T) < 1e-2
    big = _rand((2 * m, n), "bf16", 11)
    with pytest.raises(ValueError, match="overlap"):
        rf.gemm(big[:m], w, out=big[m // 2: m // 2 + m])


def test_tma_store_matches_register_path_and_stays_in_bounds(rf):
    """16-bit C goes through shared memory and TMA stores (TmaStore), f32 C from registers: rounding
    the f32 result gives the same bits, for every tile (1, 2 or no staging buffers), with and
    without split-K, ragged m and n, bias, and many tiles per CTA (staging buffers reused across
    tiles). C is a block of rows inside a larger poisoned buffer: the rows around it stay untouched
    (the tensor map clips each box at m and n)."""
    from rawflux import tune

    for t in tune.TILES:
        for layout in ("nk", "kn"):
            if not t.supports(layout):
                continue
            for splits, ctas, sk in ((1, 5, False), (3, 0, False), (1, 0, t.stream_k_ok), (1, 6, t.stream_k_ok)):
                m, n, k = 2 * t.bm * 3 + 37, 3 * t.bn + 72, 328
                seed = random.randrange(1 << 30)
                dtype = random.choice(["bf16", "f16"])
                a = _rand((m, k), dtype, seed)
                w = _rand((n, k), dtype, seed + 1)
                b = w if layout == "nk" else cupy.ascontiguousarray(w.T)
                bvec = _rand((n,), dtype, seed + 2)
                cfg = tune.GemmConfig(t, tune.STREAM_K if sk else tune.Decomp.split_k(splits), group=2, ctas=ctas)
                big = _poisoned((m + 5, n), dtype)
                out = big[2:2 + m]
                rf.gemm(a, b, b_layout=layout, bias=bvec, out=out, config=cfg)
                c32 = rf.gemm(a, b, b_layout=layout, bias=bvec, out_dtype="f32", config=cfg)
                cupy.cuda.get_current_stream().synchronize()
                raw = big.view(cupy.uint16)
                poison = _NAN_BITS[dtype][1]
                assert bool(cupy.all(raw[:2] == poison)) and bool(cupy.all(raw[2 + m:] == poison)), (
                    f"{t.tag()} {layout} splits={splits}: rows outside C were written")
                want = _from_f32(c32, dtype).view(cupy.uint16)
                diff = int(cupy.count_nonzero(out.view(cupy.uint16) != want))
                assert diff == 0, f"{t.tag()} {layout} {dtype} splits={splits}: {diff} of {m * n} outputs differ from the rounded f32 path"
                ref = _f64(a) @ _f64(w).T + _f64(bvec)[None, :]
                assert _rel(out, ref) < 1e-2


def test_short_a_box_matches_full_box(rf, monkeypatch):
    """m below A's box: the kernel loads m rows rounded up to 8 (GemmParams::a_box_rows) and the
    stage's other rows hold stale data from earlier stages. Their results must never reach C: the
    bits equal the full (zero-filled) box's for every tile, split-K and k-split cluster included,
    and C matches float64 with the output poisoned."""
    from rawflux import tune
    from rawflux.engine import planning

    cfgs = [tune.GemmConfig(t, tune.Decomp.split_k(s), 8, False) for t in tune.TILES for s in (1, 2)]
    cfgs += [tune.GemmConfig(t, tune.DP, 8, False) for t in tune.KSPLIT_TILES]
    for m in (1, 13, 40):
        n, k = 384, 1096
        seed = random.randrange(1 << 30)
        a, w = _rand((m, k), "bf16", seed), _rand((n, k), "bf16", seed + 1)
        ref = _f64(a) @ _f64(w).T
        for cfg in cfgs:
            if m >= cfg.tile.bm // cfg.tile.cluster_n:
                continue
            assert tune.a_box_rows(cfg.tile, m) == -(-m // 8) * 8
            cut = _poisoned((m, n), "bf16")
            rf.gemm(a, w, out=cut, config=cfg)
            full_cfg = tune.GemmConfig(cfg.tile, cfg.decomp, cfg.group, cfg.raster_n, ctas=1024)  # its own cached plan
            with monkeypatch.context() as mp:
                mp.setattr(planning, "a_box_rows", lambda t, m_: t.bm // t.cluster_n)
                full = _poisoned((m, n), "bf16")
                rf.gemm(a, w, out=full, config=full_cfg)
            assert cupy.array_equal(cut.view(cupy.uint16), full.view(cupy.uint16)), (m, cfg.tag())
            assert _rel(cut, ref) < 1e-2, (m, cfg.tag())


def test_tail_a_box_matches_full_box(rf, monkeypatch):
    """A ragged last tile row loads its own rows rounded up to 8 (GemmParams::a_tail_rows, the
    kernel's tmap_a_tail) instead of a full box the TMA unit zero-fills past m, and a cluster's CTA
    whose tile lies wholly past m (odd tile rows, 2x1 clusters) zero-fills the tail box's rows only:
    the stage's other rows hold stale data from earlier stages. Their results must never reach C:
    the bits equal the full box's for every tile, split-K, stream-K and k-split cluster, C matches
    float64 with the output poisoned, and the rows around C stay untouched."""
    from rawflux import tune
    from rawflux.engine import planning

    cfgs = [tune.GemmConfig(t, tune.Decomp.split_k(s), 2, False) for t in tune.TILES for s in (1, 3)]
    cfgs += [tune.GemmConfig(t, tune.STREAM_K, 2, False) for t in tune.TILES if t.stream_k_ok]
    cfgs += [tune.GemmConfig(t, tune.DP, 8, False) for t in tune.KSPLIT_TILES]
    for cfg in cfgs:
        t = cfg.tile
        for m in (t.bm + 1, 2 * t.bm + 37, 3 * t.bm - 5, 3 * t.bm, 40):
            n, k = 2 * t.bn + 40, 520
            rows = tune.a_tail_rows(t, m)
            if m % t.bm and m > t.bm:
                assert rows == -(-(m % t.bm) // 8) * 8, (t.tag(), m, rows)
            elif rows == 0:
                continue  # no tail map: the path is the full box's
            seed = random.randrange(1 << 30)
            a, w = _rand((m, k), "bf16", seed), _rand((n, k), "bf16", seed + 1)
            big = _poisoned((m + 4, n), "bf16")
            cut = big[2:2 + m]
            rf.gemm(a, w, out=cut, config=cfg)
            full_cfg = tune.GemmConfig(t, cfg.decomp, cfg.group, cfg.raster_n, ctas=1024)  # its own plan
            with monkeypatch.context() as mp:
                mp.setattr(planning, "a_tail_rows", lambda t_, m_: 0)
                full = _poisoned((m, n), "bf16")
                rf.gemm(a, w, out=full, config=full_cfg)
            cupy.cuda.get_current_stream().synchronize()
            raw = big.view(cupy.uint16)
            poison = _NAN_BITS["bf16"][1]
            assert bool(cupy.all(raw[:2] == poison)) and bool(cupy.all(raw[2 + m:] == poison)), (m, cfg.tag(), "rows outside C written")
            assert cupy.array_equal(cut.view(cupy.uint16), full.view(cupy.uint16)), (m, cfg.tag())
            assert _rel(cut, _f64(a) @ _f64(w).T) < 1e-2, (m, cfg.tag())


def test_consumer_refill_matches_producer_bits(rf):
    """The consumer refill (GemmCfg::kRefill, the host's choice for the wide tiles) changes which
    warp issues a stage's loads, not the math: the output bits equal those of the same variant built
    without it (KernelOptions refill off) for the 2x1 pair and the tile without cluster, both
    layouts, ragged m and n, split-K, stream-K and several tiles per CTA, and C matches float64
    with the output poisoned."""
    from dataclasses import replace

    from rawflux import engine, tune
    from rawflux.runtime import DType

    cases = [("128x256x64s4c2x1w2", "nk", tune.DP, 6), ("128x256x64s4c2x1w2", "kn", tune.STREAM_K, 0),
             ("128x256x64s4c1w2", "nk", tune.Decomp.split_k(3), 0), ("128x320x64s4c2x1w2", "nk", tune.DP, 4)]
    s = cupy.cuda.get_current_stream().ptr
    for tag, layout, decomp, ctas in cases:
        t = tune.parse_tag(tag + "/k1/g8m/p0").tile
        m, n, k = 3 * t.bm + 45, 4 * t.bn + 40, 64 * 23  # 23 k blocks: several refill rounds, a partial one
        seed = random.randrange(1 << 30)
        a, w = _rand((m, k), "bf16", seed), _rand((n, k), "bf16", seed + 1)
        b = w if layout == "nk" else cupy.ascontiguousarray(w.T)
        cfg = tune.GemmConfig(t, decomp, 2, False, ctas=ctas)
        opts = engine.kernel_options(t, engine.NOWAIT, engine.TMA_STORE_EPI, DType.BF16)
        assert opts.refill, tag
        outs = []
        for o in (opts, replace(opts, refill=False)):
            out = _poisoned((m, n), "bf16")
            plan = engine.plan(cfg, m, n, k, dtype=DType.BF16, b_layout=layout, out_dtype=DType.BF16, device_id=0, stream=s, options=o)
            epi = engine.epilogue_params(engine.TMA_STORE_EPI, out.data.ptr, m, n, n, DType.BF16)
            plan.launch(a.data.ptr, b.data.ptr, lda=k, ldb=b.shape[1], stream=s, epilogue_params=epi)
            outs.append(out)
        cupy.cuda.get_current_stream().synchronize()
        assert cupy.array_equal(outs[0].view(cupy.uint16), outs[1].view(cupy.uint16)), (cfg.tag(), layout)
        assert _rel(outs[0], _f64(a) @ _f64(w).T) < 1e-2, (cfg.tag(), layout)
