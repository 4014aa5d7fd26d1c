"""The benchmark harness without a GPU: argument parsing, shapes, derived columns, the JSON schema,
the impl registry, and the delay kernel's compile."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from rawflux.bench import cli, registry, report, timing
from rawflux.bench.problems import PRESETS, Problem, build_problems, parse_shapes

# --------------------------------------------------------------------------------------------
# arguments


def test_defaults_are_the_papers_shapes_and_method():
    args = cli.parse_args([])
    assert args.op == "all" and args.shapes == "paper"
    assert args.m_list == [1024, 2048, 4096, 8192]
    assert args.dtypes == ["bf16"]
    assert args.iters >= 30 and args.warmup >= 1
    assert args.out_dir == "benchmarks/results"
    probs = build_problems(["ag_gemm", "gemm_rs"], args.shapes, args.m_list, args.dtypes, world=8)
    ag = [p for p in probs if p.op == "ag_gemm"]
    rs = [p for p in probs if p.op == "gemm_rs"]
    assert {(p.n, p.k) for p in ag} == {(49152, 12288)}
    assert {(p.n, p.k) for p in rs} == {(12288, 49152)}
    assert [p.m for p in ag] == [1024, 2048, 4096, 8192]


def test_quick_and_explicit_values():
    q = cli.parse_args(["--quick"])
    assert q.quick and q.m_list == [1024] and q.iters < 30
    a = cli.parse_args(["--op", "gemm_rs", "--m", "512,4096", "--dtype", "bf16,f16", "--iters", "40", "--warmup", "2",
                        "--impl", "nccl+cublas,cupy.matmul", "--out-dir", "/tmp/x", "--shapes", "llama70b"])
    assert a.op == "gemm_rs" and a.m_list == [512, 4096] and a.dtypes == ["bf16", "f16"]
    assert a.iters == 40 and a.warmup == 2 and a.impl_names == ["nccl+cublas", "cupy.matmul"] and a.out_dir == "/tmp/x"
    # dtype aliases normalise to tags
    assert cli.parse_args(["--dtype", "bfloat16,float32"]).dtypes == ["bf16", "f32"]


def test_decode_set():
    """--decode: m = 1..512 over the paper's and Llama-3-70B's shapes; an m that W does not
    divide is a skipped problem that says why; --m and --shapes still override."""
    d = cli.parse_args(["--decode"])
    assert d.m_list == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512] and d.shapes == "paper,llama70b"
    probs = build_problems(["ag_gemm", "gemm_rs"], d.shapes, d.m_list, d.dtypes, world=8)
    assert {p.label for p in probs} == {"paper.mlp_up", "paper.mlp_down", "llama70b.qkv", "llama70b.mlp_gate_up",
                                        "llama70b.attn_out", "llama70b.mlp_down"}
    skipped = [p for p in probs if p.check()]
    assert {p.m for p in skipped} == {1, 2, 4} and all("not divisible by world 8" in p.check() for p in skipped)
    assert cli.parse_args(["--decode", "--m", "64", "--shapes", "llama70b"]).m_list == [64]
    with pytest.raises(SystemExit):
        cli.parse_args(["--decode", "--op", "layer"])


def test_timer_measures_the_hosts_queueing(monkeypatch):
    """Timer.time's host_us: the median time to queue one execution (here a sleep of 2 ms)."""
    import time
    import types

    from rawflux.bench import timing

    class Ev:
        def record(self, s):
            pass

    cp = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Ev, Device=lambda d: types.SimpleNamespace(
        __enter__=lambda s: s, __exit__=lambda s, *e: False), get_elapsed_time=lambda a, b: 1.0))
    cp.cuda.Device = type("D", (), {"__init__": lambda s, d: None, "__enter__": lambda s: s, "__exit__": lambda s, *e: False})
    t = timing.Timer.__new__(timing.Timer)
    t.group, t.stream = types.SimpleNamespace(device_id=0), types.SimpleNamespace(synchronize=lambda: None)
    t.warmup, t.iters, t.delay_us, t.align, t._delay, t._aligner, t._cupy = 0, 5, 0.0, False, None, None, cp
    times = t.time(lambda i: time.sleep(0.002), nsets=1, inner=2)
    assert times == [0.5] * 5 and 2000 <= t.host_us < 20000


@pytest.mark.parametrize("argv", [
    ["--op", "nope"],
    ["--m", "0"],
    ["--m", "abc"],
    ["--dtype", "int8"],
    ["--dtype", "e4m3"],  # a rawflux dtype, but not one the baselines take
    ["--iters", "5"],  # fewer than 30 needs --quick
    ["--iters", "0", "--quick"],
    ["--shapes", "1,2,3,4"],
    ["--shapes", "gpt5"],
    ["--delay-us", "-1"],
])
def test_bad_arguments_exit_with_a_message(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


def test_custom_shapes_apply_to_every_op():
    parsed = parse_shapes("4096,8192,1024; 8192,2048")
    assert parsed == [("4096,8192,1024", 4096, 8192, 1024), ("8192,2048", None, 8192, 2048)]
    probs = build_problems(["ag_gemm", "gemm_rs"], "4096,8192,1024 8192,2048", [256, 512], ["bf16"], world=2)
    # the triple fixes m; the pair takes every m of the list
    assert [(p.op, p.m, p.n, p.k) for p in probs] == [
        ("ag_gemm", 4096, 8192, 1024), ("ag_gemm", 256, 8192, 2048), ("ag_gemm", 512, 8192, 2048),
        ("gemm_rs", 4096, 8192, 1024), ("gemm_rs", 256, 8192, 2048), ("gemm_rs", 512, 8192, 2048),
    ]


def test_presets_combine():
    both = parse_shapes("paper,llama70b")
    assert parse_shapes("Paper + LLAMA70B") == both
    assert [lab for lab, *_ in both["ag_gemm"]] == ["paper.mlp_up", "llama70b.qkv", "llama70b.mlp_gate_up"]
    assert [(n, k) for _, _, n, k in both["gemm_rs"]] == [(12288, 49152), (8192, 8192), (8192, 28672)]
    probs = build_problems(["gemm_rs"], "paper,llama70b", [64, 1024], ["bf16"], world=2)
    assert [(p.label, p.m) for p in probs][:3] == [("paper.mlp_down", 64), ("paper.mlp_down", 1024), ("llama70b.attn_out", 64)]
    with pytest.raises(ValueError, match="preset"):
        parse_shapes("paper,llama7b")


def test_llama_preset_divides_over_eight_ranks():
    for op, rows in PRESETS["llama70b"].items():
        for _, n, k in rows:
            assert Problem(op, 8192, n, k, "bf16", 8).check() is None


def test_plan_maps_each_op_choice():
    assert cli.plan("ag_gemm") == [("ag_gemm", None)]
    assert cli.plan("gemm") == [("ag_gemm", {"gemm"}), ("gemm_rs", {"gemm"})]
    assert [op for op, _ in cli.plan("all")] == ["ag_gemm", "gemm_rs", "barrier"]
    assert set(cli.OP_CHOICES) == {"ag_gemm", "gemm_rs", "gemm_ar", "gemm", "barrier", "all", "layer"}
    assert cli.plan("gemm_ar") == [("gemm_ar", None)]


# --------------------------------------------------------------------------------------------
# per-rank shapes, splits, sizes


def test_problem_shares_per_rank():
    ag = Problem("ag_gemm", 4096, 49152, 12288, "bf16", 8)
    assert ag.a_shape == (512, 12288) and ag.b_shape == (6144, 12288) and ag.out_shape == (4096, 6144)
    assert ag.gemm_a_shape == (4096, 12288) and ag.gemm_out_shape == (4096, 6144)
    rs = Problem("gemm_rs", 4096, 12288, 49152, "bf16", 8)
    assert rs.a_shape == (4096, 6144) and rs.b_shape == (12288, 6144) and rs.out_shape == (512, 12288)
    assert rs.gemm_out_shape == (4096, 12288)
    assert ag.flops_per_rank == rs.flops_per_rank == 2 * 4096 * 49152 * 12288 / 8
    assert ag.comm_elems() == 4096 * 12288 and rs.comm_elems() == 4096 * 12288


def test_problem_check_names_the_bad_split():
    assert Problem("ag_gemm", 1024, 49152, 12288, "bf16", 8).check() is None
    assert "m" in Problem("ag_gemm", 1001, 49152, 12288, "bf16", 8).check()
    assert "n" in Problem("ag_gemm", 1024, 100, 12288, "bf16", 8).check()
    assert "k" in Problem("gemm_rs", 1024, 12288, 100, "bf16", 8).check()
    assert Problem("gemm_rs", 1024, 100, 49152, "bf16", 8).check() is None  # RS splits k, not n
    assert Problem("barrier", 0, 0, 0, "-", 3).check() is None


def test_input_sets_exceed_four_l2_where_memory_allows():
    l2 = 60 << 20
    n = timing.plan_nsets(10 << 20, l2, budget_bytes=1 << 40)
    assert n * (10 << 20) > 4 * l2 and (n - 1) * (10 << 20) <= 4 * l2
    assert timing.plan_nsets(500 << 20, l2, 1 << 40) == 1  # one set is already > 4x L2
    assert timing.plan_nsets(10 << 20, l2, budget_bytes=30 << 20) == 3  # memory-limited
    assert timing.plan_nsets(10 << 20, l2, budget_bytes=1) == 1  # never fewer than one
    assert timing.plan_nsets(1, l2, 1 << 40) == timing.MAX_SETS
    p = Problem("ag_gemm", 1024, 49152, 12288, "bf16", 8)
    assert timing.set_bytes(p, 2) == 2 * (128 * 12288 + 6144 * 12288 + 1024 * 12288)


def test_summary_statistics():
    s = timing.summarize([5.0, 1.0, 3.0, 2.0, 4.0, 100.0, 2.5, 3.5, 1.5, 4.5])
    assert s["median"] == pytest.approx(3.25) and s["min"] == 1.0
    assert s["p10"] == 1.0 and s["p90"] == 5.0  # nearest rank: an outlier does not move the median


def test_driver_parse():
    assert timing.parse_driver("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build") == "580.95.05"
    assert timing.parse_driver("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 2023") == "535.129.03"
    assert timing.parse_driver("garbage") is None


# --------------------------------------------------------------------------------------------
# derived columns


def _rec(impl, role, ms, **kw):
    base = {"op": "ag_gemm", "label": "paper.mlp_up", "world": 8, "m": 4096, "n": 49152, "k": 12288, "dtype": "bf16",
            "impl": impl, "role": role, "ms": ms}
    base.update(kw)
    return base


def test_derived_columns_follow_design():
    rows = [
        _rec("nccl+cublas", "nonoverlap", 10.0),
        _rec("cupy.matmul", "gemm", 7.0),
        _rec("torch.matmul", "gemm", 6.5),
        _rec("rawflux_gemm", "gemm", 6.8),
        _rec("nccl_allgather", "comm", 4.0),
        _rec("rawflux", "fused", 8.0, gemm_ref="rawflux_gemm"),
        _rec("other_fused", "fused", 7.5),  # no gemm_ref: the fastest GEMM alone
    ]
    report.derive(rows)
    by = {r["impl"]: r for r in rows}
    f = by["rawflux"]
    assert f["speedup"] == pytest.approx(10.0 / 8.0)
    assert f["exposed_ms"] == pytest.approx(8.0 - 6.8)
    assert f["overlap_eff"] == pytest.approx(1 - 1.2 / 4.0)
    assert f["gemm_ref_used"] == "rawflux_gemm"
    o = by["other_fused"]
    assert o["exposed_ms"] == pytest.approx(1.0) and o["overlap_eff"] == pytest.approx(0.75) and o["gemm_ref_used"] == "torch.matmul"
    b = by["nccl+cublas"]
    assert b["speedup"] == pytest.approx(1.0) and b["overlap_eff"] == pytest.approx(1 - 3.5 / 4.0)
    assert "speedup" not in by["cupy.matmul"] and "speedup" not in by["nccl_allgather"]


def test_derived_columns_stay_within_one_problem_and_need_their_ingredients():
    rows = [
        _rec("rawflux", "fused", 8.0),  # m=4096: nothing else timed
        _rec("nccl+cublas", "nonoverlap", 10.0, m=8192),
        _rec("cupy.matmul", "gemm", 7.0, m=8192),
        _rec("rawflux", "fused", 9.0, m=8192),  # no comm row: no overlap efficiency
    ]
    report.derive(rows)
    lone, _, _, f = rows
    assert lone["speedup"] is None and lone["exposed_ms"] is None and lone["overlap_eff"] is None
    assert f["speedup"] == pytest.approx(10 / 9) and f["exposed_ms"] == pytest.approx(2.0) and f["overlap_eff"] is None
    # a gemm_ref that was not timed falls back to the fastest GEMM alone
    rows = [_rec("cupy.matmul", "gemm", 7.0), _rec("rawflux", "fused", 8.0, gemm_ref="missing")]
    report.derive(rows)
    assert rows[1]["exposed_ms"] == pytest.approx(1.0)


def test_rates():
    assert report.tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert report.tflops(2e12, 0) is None
    # 8 ranks all-gathering a 1 GB buffer in 10 ms: 100 GB/s algorithm bandwidth, x 7/8 bus
    assert report.bus_gbps(500_000_000, 2, 8, 10.0) == pytest.approx(100.0 * 7 / 8)


# --------------------------------------------------------------------------------------------
# records and the JSON file


def _info(**kw):
    base = dict(gpu="NVIDIA H200", driver="580.95.05", commit="0" * 40, emulated=False, ranks_per_gpu=1, host="h",
                l2_bytes=60 << 20, mem_bytes=140 << 30, versions={})
    base.update(kw)
    return SimpleNamespace(**base)


def _stats(ms):
    return {"ms": ms, "ms_rank_min": ms * 0.9, "ms_p10": ms * 0.95, "ms_p90": ms * 1.1}


def test_records_fit_the_schema_and_round_trip(tmp_path):
    args = cli.parse_args(["--quick"])
    p = Problem("ag_gemm", 4096, 49152, 12288, "bf16", 8, "paper.mlp_up")
    impl = registry.Impl("ag_gemm", "nccl+cublas", "nonoverlap", lambda ctx: None)
    comm = registry.Impl("ag_gemm", "nccl_allgather", "comm", lambda ctx: None)
    bar = registry.Impl("barrier", "group.barrier", "barrier", lambda ctx: None, inner=20)
    date = report.now_iso()
    recs = [
        cli.make_record(p, impl, _stats(2.0), _info(), args, 2, date),
        cli.make_record(p, comm, _stats(1.0), _info(), args, 2, date),
        cli.make_record(Problem("barrier", 0, 0, 0, "-", 8, "barrier"), bar, _stats(0.004), _info(commit=None, emulated=True), args, 1, date),
    ]
    for r in recs:
        assert report.validate(r) == [], r
    assert recs[0]["tflops"] == pytest.approx(p.flops_per_rank / 2e-3 / 1e12)
    assert recs[1]["tflops"] is None and recs[1]["gbps"] == pytest.approx(4096 * 12288 * 2 / 1e-3 / 1e9 * 7 / 8)
    assert recs[2]["us"] == pytest.approx(4.0) and recs[2]["tflops"] is None
    assert all(r["quick"] for r in recs)
    report.derive(recs)
    path = report.write_json(recs, tmp_path / "results", {"argv": ["--quick"]})
    assert path.parent == tmp_path / "results" and path.suffix == ".json"
    data = json.loads(path.read_text())
    assert data["schema"] == report.SCHEMA and data["meta"]["argv"] == ["--quick"]
    assert len(data["records"]) == 3
    for r in data["records"]:
        assert report.validate(r) == []
        for field in report.REQUIRED:
            assert field in r
    # a second run in the same second gets its own file
    assert report.write_json(recs, tmp_path / "results", {}) != path
    table = report.format_table(recs)
    assert "nccl+cublas" in table and "group.barrier" in table and "4.00us" in table


@pytest.mark.parametrize("change, msg", [
    (lambda r: r.pop("gpu"), "missing gpu"),
    (lambda r: r.update(ms="fast"), "ms:"),
    (lambda r: r.update(ms=float("nan")), "positive finite"),
    (lambda r: r.update(ms=-1.0), "positive finite"),
    (lambda r: r.update(world=True), "world"),
    (lambda r: r.update(emulated=1), "emulated"),
    (lambda r: r.update(date="yesterday"), "ISO"),
])
def test_schema_rejects(change, msg, tmp_path):
    r = cli.make_record(Problem("gemm_rs", 1024, 12288, 49152, "bf16", 2), registry.Impl("gemm_rs", "x", "gemm", None),
                        _stats(1.0), _info(), cli.parse_args([]), 1, report.now_iso())
    assert report.validate(r) == []
    change(r)
    errs = report.validate(r)
    assert errs and any(msg in e for e in errs), errs
    with pytest.raises(ValueError, match="schema"):
        report.write_json([r], tmp_path, {})


# --------------------------------------------------------------------------------------------
# registry


def test_registry_plugs_in_more_impls(monkeypatch):
    monkeypatch.setattr(registry, "_impls", {op: {} for op in registry.OPS})

    @registry.register("ag_gemm", "fancy", "fused", gemm_ref="fancy_gemm")
    def fancy(ctx):
        """A fused impl."""
        return lambda i: None

    registry.register("ag_gemm", "fancy_gemm", "gemm", lambda ctx: None)
    registry.register("gemm_rs", "other", "comm", lambda ctx: None)
    assert [i.name for i in registry.impls("ag_gemm")] == ["fancy", "fancy_gemm"]
    assert [i.name for i in registry.impls("ag_gemm", roles={"gemm"})] == ["fancy_gemm"]
    assert [i.name for i in registry.impls("ag_gemm", names=["fancy"])] == ["fancy"]
    got = registry.impls("ag_gemm")[0]
    assert got.factory is fancy and got.gemm_ref == "fancy_gemm" and got.doc == "A fused impl."
    with pytest.raises(ValueError, match="role"):
        registry.register("ag_gemm", "bad", "fastest", lambda ctx: None)
    with pytest.raises(ValueError, match="op"):
        registry.register("gemm", "bad", "gemm", lambda ctx: None)
    with pytest.raises(ValueError, match="inner"):
        registry.register("barrier", "bad", "barrier", lambda ctx: None, inner=0)


def test_builtin_impls_cover_every_baseline_row():
    from rawflux.bench import builtin  # noqa: F401  (registers; imports no GPU library)

    for op, comm_name in (("ag_gemm", "allgather"), ("gemm_rs", "reduce_scatter")):
        names = {i.name: i.role for i in registry.impls(op)}
        assert names["nccl+cublas"] == names["ipc+cublas"] == "nonoverlap"
        assert names["cupy.matmul"] == "gemm" and names["torch.matmul"] == "gemm"
        assert names[f"nccl_{comm_name}"] == names[f"ipc_{comm_name}"] == "comm"
        assert names["rawflux"] == names["torch.symm_mem"] == "fused"
        assert names["rawflux_gemm"] == "gemm"  # the fused row's exposed-communication reference
        assert registry.impls(op, names=["rawflux"])[0].gemm_ref == "rawflux_gemm"
    bar = registry.impls("barrier")
    assert {i.name for i in bar} == {"group.barrier", "nccl_allreduce_4B"} and all(i.inner > 1 for i in bar)


def test_unavailable_impl_says_why():
    from rawflux.bench import builtin  # noqa: F401

    ctx = SimpleNamespace(group=SimpleNamespace(), stream=None)
    with pytest.raises(registry.Unavailable, match="barrier"):
        registry.impls("barrier", names=["group.barrier"])[0].factory(ctx)
    # NCCL rows on the emulated node (two ranks on one GPU) say why instead of failing NCCL init
    emulated = SimpleNamespace(group=SimpleNamespace(bus_ids=["0000:01:00.0"] * 2, nccl=lambda: pytest.fail("NCCL touched")))
    for op in ("ag_gemm", "gemm_rs"):
        for impl in registry.impls(op, roles={"nonoverlap", "comm"}):
            if impl.name.startswith("nccl"):
                with pytest.raises(registry.Unavailable, match="one GPU"):
                    impl.factory(emulated)
        # torch's async-TP needs NCCL too: refused before torch.distributed is touched
        with pytest.raises(registry.Unavailable, match="one rank per GPU"):
            registry.impls(op, names=["torch.symm_mem"])[0].factory(emulated)


def test_backend_choice_follows_the_gpus():
    from rawflux import baseline

    one_gpu = SimpleNamespace(bus_ids=["0000:1A:00.0", "0000:1a:00.0"])
    two_gpus = SimpleNamespace(bus_ids=["0000:1a:00.0", "0000:2a:00.0"])
    assert baseline.choose_backend(one_gpu) == "ipc" and baseline.choose_backend(two_gpus) == "nccl"
    assert baseline.choose_backend(one_gpu, "nccl") == "nccl" and baseline.choose_backend(two_gpus, "ipc") == "ipc"
    with pytest.raises(ValueError, match="backend"):
        baseline.choose_backend(two_gpus, "mpi")


# --------------------------------------------------------------------------------------------
# the delay kernel compiles (NVRTC, no GPU)


def test_delay_kernel_compiles_without_spills():
    pytest.importorskip("cuda.bindings.nvrtc")
    from rawflux.jit import compile_cubin, kernel_source

    for arch in ("sm_90a", "sm_80"):
        res = compile_cubin(kernel_source("bench_delay.cu"), arch=arch, name_expressions=("rawflux::bench_delay_kernel",))
        r = res.resources[res.lowered["rawflux::bench_delay_kernel"]]
        assert r["spill_stores"] == 0 and r["stack"] == 0
    assert math.isfinite(timing.HOST_LAUNCH_US)



def test_world_one_has_nothing_exposed_or_overlapped():
    # world 1: no communication, so a fused row's time over the GEMM's is not exposed communication
    recs = [_rec("nccl+cublas", "nonoverlap", 7.0, world=1), _rec("torch.matmul", "gemm", 6.8, world=1),
            _rec("nccl", "comm", 0.01, world=1), _rec("rawflux", "fused", 7.2, world=1)]
    report.derive(recs)
    f = recs[3]
    assert f["speedup"] == pytest.approx(7.0 / 7.2)
    assert f["exposed_ms"] is None and f["overlap_eff"] is None
    assert report.format_table(recs).splitlines()[-1].split()[-2:] == ["-", "-"]  # the exposed and overlap columns


def test_gemm_ar_rows_and_shapes():
    """GEMM + AllReduce: k split over the ranks, any m, (m, n) on every rank; its rows are the fused
    op (16-bit and fp32 partials), cuBLAS then an all-reduce (NCCL, IPC), the all-reduce alone, the
    GEMM alone, and torch's one-shot all-reduce after torch.matmul."""
    from rawflux.bench import builtin  # noqa: F401

    p = Problem("gemm_ar", 7, 8192, 28672, "bf16", 8)
    assert p.check() is None  # any m: every rank takes the whole m
    assert (p.a_shape, p.b_shape, p.out_shape, p.gemm_out_shape) == ((7, 3584), (8192, 3584), (7, 8192), (7, 8192))
    assert p.comm_elems() == 2 * 7 * 8192  # an all-reduce: twice a reduce-scatter's bytes on the bus
    assert "k" in Problem("gemm_ar", 8, 8192, 100, "bf16", 8).check()
    names = {i.name: i.role for i in registry.impls("gemm_ar")}
    assert names == {"rawflux": "fused", "rawflux.fp32parts": "fused", "torch.symm_mem": "fused", "nccl+cublas": "nonoverlap",
                     "ipc+cublas": "nonoverlap", "nccl_allreduce": "comm", "ipc_allreduce": "comm", "rawflux_gemm": "gemm",
                     "cupy.matmul": "gemm", "torch.matmul": "gemm"}
    probs = build_problems(["gemm_ar"], "paper,llama70b", [1, 64], ["bf16"], world=8)
    assert [(q.label, q.m) for q in probs] == [("paper.mlp_down", 1), ("paper.mlp_down", 64), ("llama70b.attn_out", 1),
                                               ("llama70b.attn_out", 64), ("llama70b.mlp_down", 1), ("llama70b.mlp_down", 64)]
    emulated = SimpleNamespace(group=SimpleNamespace(bus_ids=["0000:01:00.0"] * 2, nccl=lambda: pytest.fail("NCCL touched")))
    for impl in registry.impls("gemm_ar", names=["nccl+cublas", "nccl_allreduce"]):
        with pytest.raises(registry.Unavailable, match="one GPU"):
            impl.factory(emulated)


def test_ag_gemm_rows_for_each_copy_path(monkeypatch):
    """Beside the rawflux row (copy="auto" between GPUs: per m, pick_copy), rawflux.ce and
    rawflux.sm time one copy path at every m; "ce" is unavailable where ranks share a GPU under MPS."""
    import rawflux
    from rawflux.bench import builtin  # noqa: F401

    impls = {i.name: i for i in registry.impls("ag_gemm")}
    assert impls["rawflux.ce"].role == impls["rawflux.sm"].role == "fused"
    assert impls["rawflux.ce"].gemm_ref == "rawflux_gemm"
    calls = []
    monkeypatch.setattr(rawflux, "ag_gemm", lambda a, b, group, **kw: calls.append((a, b, kw["copy"])))
    monkeypatch.setattr(builtin, "_empty", lambda ctx, shape: "out")
    ctx = SimpleNamespace(group=SimpleNamespace(shares_gpu_under_mps=False), sets=[{"a": "a0", "b": "b0"}, {"a": "a1", "b": "b1"}],
                          stream=None, problem=SimpleNamespace(out_shape=(8, 8)))
    for copy in ("ce", "sm"):
        calls.clear()
        run = impls[f"rawflux.{copy}"].factory(ctx)  # one warm-up call
        run(1)
        assert calls == [("a0", "b0", copy), ("a1", "b1", copy)]
    ctx.group.shares_gpu_under_mps = True
    with pytest.raises(registry.Unavailable, match="MPS"):
        impls["rawflux.ce"].factory(ctx)
    impls["rawflux.sm"].factory(ctx)
