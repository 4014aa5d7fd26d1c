"""rawflux.bench's layer op without a GPU: problems and per-rank shapes at W = 1, 2, 4, 8, the
arguments, records and derived columns on fake timings, the correctness guard, BENCHMARKS.md's
layer tables from a fixture, and the steps themselves: every way (rawflux.nn, the non-overlapped
reference, torch async-TP) against the unsplit block in float64, W ranks simulated by threads
(tests/cpu/test_nn_cpu.py's world, with its reference ops standing in for the fused ones)."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from rawflux.bench import builtin, cli, layer, registry, report, timing  # noqa: F401  (builtin registers the rows)
from rawflux.bench.layer import LAYER_PRESETS, LayerProblem, LayerShape, build_layer_problems, parse_layer_shapes

ROOT = Path(__file__).resolve().parents[2]
L70 = LAYER_PRESETS["llama70b"]


# --------------------------------------------------------------------------------------------
# problems and shapes


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_llama70b_per_rank_shapes(world):
    p = LayerProblem("train", 8192, L70, "bf16", world, "llama70b.train")
    assert p.check() is None
    loc = p.local()
    assert loc["x"] == (8192 // world, 8192)
    assert loc["w_qkv"] == ((8192 + 2 * 1024) // world, 8192) and loc["w_o"] == (8192, 8192 // world)
    assert loc["w_gate_up"] == (2 * 28672 // world, 8192) and loc["w_down"] == (8192, 28672 // world)
    assert loc["attn"] == (8192, 8192 // world) and loc["act"] == (8192, 28672 // world)
    fwd = 2 * 8192 * 8192 * (10240 + 8192 + 57344 + 28672) / world
    assert p.flops_per_rank == pytest.approx(3 * fwd)  # forward, input gradients, weight gradients
    assert LayerProblem("prefill", 8192, L70, "bf16", world, "x").flops_per_rank == pytest.approx(fwd)
    dec = LayerProblem("decode", 1, L70, "bf16", world, "llama70b.decode")
    assert dec.check() is None and dec.rows == 1 and dec.local()["x"] == (1, 8192)  # the whole batch on every rank
    assert p.extra() == {"phase": "train", "hidden": 8192, "ffn": 28672, "heads": 64, "kv_heads": 8, "head_dim": 128,
                         "seq_parallel": True}
    assert not dec.extra()["seq_parallel"] and (p.n, p.k) == (8192, 28672)


def test_gemm_list_is_the_steps():
    p = LayerProblem("train", 64, LAYER_PRESETS["tiny"], "bf16", 2, "tiny.train")
    g = p.gemms()
    assert len(g) == 12 and len(LayerProblem("decode", 4, LAYER_PRESETS["tiny"], "bf16", 2, "d").gemms()) == 4
    assert g[0] == (64, (16 + 16) * 64 // 2, 1024, False, True)  # x_full @ w_qkv^T
    assert g[4] == (64, 3584 // 2, 1024, False, False)  # dgrad of down: dy (m, hidden) @ w_down (hidden, ffn/W)
    assert g[5] == (1024, 3584 // 2, 64, True, False)  # wgrad of down: dy^T @ act
    assert p.input_bytes(2) == 2 * 32 * 1024 * 2


@pytest.mark.parametrize("p, why", [
    (LayerProblem("train", 1024, L70, "bf16", 16, "l"), "num_kv_heads = 8 not divisible by world 16"),
    (LayerProblem("train", 1000, L70, "bf16", 16, "l"), "num_kv_heads"),
    (LayerProblem("train", 1001, L70, "bf16", 2, "l"), "m = 1001 not divisible by world 2"),
    (LayerProblem("train", 96, LayerShape(1024, 3004, 12, 4, 64), "bf16", 8, "l"),
     "num_heads = 12 and num_kv_heads = 4 and ffn = 3004 not divisible by world 8"),
    (LayerProblem("train", 96, LayerShape(1004, 3584, 16, 8, 4), "bf16", 8, "l"), "hidden = 1004 and kv_heads / W * head_dim = 4"),
    (LayerProblem("train", 96, LayerShape(1024, 3584, 12, 8, 64), "bf16", 2, "l"), "not a multiple of num_kv_heads"),
    (LayerProblem("train", 96, L70, "f32", 2, "l"), "bf16 or f16"),
    (LayerProblem("eval", 96, L70, "bf16", 2, "l"), "phase 'eval'"),
])
def test_problem_check_says_why(p, why):
    assert why in p.check()


def test_decode_rows_need_not_divide():
    assert LayerProblem("decode", 3, L70, "bf16", 8, "l").check() is None
    for w in (1, 2, 4, 8):
        assert all(p.check() is None for p in build_layer_problems("llama70b,tiny", [1024, 8192], [1, 64], layer.PHASES, ["bf16"], w))


def test_shapes_and_problems():
    assert parse_layer_shapes("llama70b") == [("llama70b", L70)]
    assert parse_layer_shapes("Tiny + llama70b; 2048,7168,16,8,128") == [
        ("tiny", LAYER_PRESETS["tiny"]), ("llama70b", L70), ("2048,7168,16,8,128", LayerShape(2048, 7168, 16, 8, 128))]
    for bad, msg in (("paper", "presets are llama70b, tiny"), ("1,2,3", "hidden,ffn,heads,kv_heads,head_dim"), ("", "no layer shape")):
        with pytest.raises(ValueError, match=msg):
            parse_layer_shapes(bad)
    probs = build_layer_problems("tiny", [1024, 2048], [1, 16], ["train", "decode"], ["bf16"], 4)
    assert [(p.label, p.m) for p in probs] == [("tiny.train", 1024), ("tiny.train", 2048), ("tiny.decode", 1), ("tiny.decode", 16)]


def test_layer_arguments():
    a = cli.parse_args(["--op", "layer"])
    assert a.shapes == "llama70b" and a.phases == ["train", "prefill", "decode"]
    assert a.m_list == [1024, 2048, 4096, 8192] and a.decode_m_list == list(layer.DECODE_M)
    assert cli.plan("layer") == [("layer", None)] and "layer" not in {op for op, _ in cli.plan("all")}
    q = cli.parse_args(["--op", "layer", "--quick", "--shapes", "tiny", "--phase", "decode,train", "--decode-m", "2,8"])
    assert q.m_list == [1024] and q.decode_m_list == [2, 8] and q.phases == ["decode", "train"]
    assert cli.parse_args(["--op", "layer", "--quick"]).decode_m_list == list(layer.QUICK_DECODE_M)
    assert [p.label for p in cli.problems_for("layer", q, 2)] == ["tiny.decode", "tiny.decode", "tiny.train"]
    assert cli.parse_args([]).shapes == "paper"  # the other ops keep theirs


@pytest.mark.parametrize("argv", [["--op", "layer", "--shapes", "paper"], ["--op", "layer", "--phase", "eval"],
                                  ["--op", "layer", "--decode-m", "0"], ["--op", "layer", "--shapes", "1,2,3,4"]])
def test_bad_layer_arguments(argv, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_sets_are_sized_by_the_layers_inputs():
    p = LayerProblem("train", 8192, L70, "bf16", 8, "l")
    assert timing.set_bytes(p, 2) == 2 * 1024 * 8192 * 2 and timing.set_shapes(p) == {}
    assert timing.plan_nsets(timing.set_bytes(p, 2), 60 << 20, 1 << 40) == 8


def test_delay_covers_the_hosts_queueing():
    class Kern:
        def launch(self, grid, block, args, stream=None):
            self.ns = int(args[0])

    t = timing.Timer(SimpleNamespace(device_id=0), None, warmup=1, iters=1, delay_us=0, align=False)
    t._delay, t.delay_us = Kern(), 500.0
    t._delay_launch(1)
    assert t._delay.ns == (500 + timing.HOST_LAUNCH_US) * 1000
    t._delay_launch(1, 2000.0)
    assert t._delay.ns == (500 + timing.HOST_LAUNCH_US + timing.HOST_MARGIN * 2000) * 1000


# --------------------------------------------------------------------------------------------
# registry, records, derived columns


def test_layer_rows_are_registered():
    got = {i.name: (i.role, i.gemm_ref) for i in registry.impls("layer")}
    assert got == {"nonoverlap": ("nonoverlap", None), "rawflux": ("fused", "gemm_only"),
                   "torch_async_tp": ("fused", "gemm_only"), "gemm_only": ("gemm", None)}
    asy = registry.impls("layer", names=["torch_async_tp"])[0].factory
    dec = SimpleNamespace(problem=LayerProblem("decode", 4, L70, "bf16", 2, "l"), group=None, cache={})
    with pytest.raises(registry.Unavailable, match="no sequence parallelism"):
        asy(dec)
    emu = SimpleNamespace(problem=LayerProblem("train", 64, L70, "bf16", 2, "l"), cache={},
                          group=SimpleNamespace(bus_ids=["0000:01:00.0"] * 2, nccl=lambda: pytest.fail("NCCL touched")))
    with pytest.raises(registry.Unavailable, match="one rank per GPU"):
        asy(emu)


def _info(**kw):
    base = dict(gpu="NVIDIA H200", driver="580.95.05", commit="0" * 40, emulated=False, ranks_per_gpu=1, host="h",
                l2_bytes=60 << 20, mem_bytes=140 << 30, versions={})
    return SimpleNamespace(**(base | kw))


def _stats(ms, host_ms=None):
    return {"ms": ms, "ms_rank_min": ms * 0.9, "ms_p10": ms * 0.95, "ms_p90": ms * 1.1, "host_ms": host_ms}


def _records(phase="train", m=1024, times=(("nonoverlap", 10.0), ("rawflux", 8.0), ("torch_async_tp", 9.0), ("gemm_only", 6.0)),
             world=8, **info):
    args = cli.parse_args(["--op", "layer", "--quick"])
    p = LayerProblem(phase, m, L70, "bf16", world, f"llama70b.{phase}")
    impls = {i.name: i for i in registry.impls("layer")}
    return [cli.make_record(p, impls[name], _stats(ms, 1.5), _info(**info), args, 2, "2026-12-01T00:00:00+00:00") for name, ms in times]


def test_layer_records_and_speedups():
    recs = _records() + _records("prefill")
    report.derive(recs)
    by = {(r["phase"], r["impl"]): r for r in recs}
    raw, asy, base, gem = (by[("train", n)] for n in ("rawflux", "torch_async_tp", "nonoverlap", "gemm_only"))
    assert raw["speedup"] == pytest.approx(1.25) and asy["speedup"] == pytest.approx(10 / 9) and base["speedup"] == 1.0
    assert raw["exposed_ms"] == pytest.approx(2.0) and asy["exposed_ms"] == pytest.approx(3.0) and raw["gemm_ref_used"] == "gemm_only"
    assert raw["overlap_eff"] is None  # no communication-alone row
    assert "speedup" not in gem or gem["speedup"] is None
    p = LayerProblem("train", 1024, L70, "bf16", 8, "x")
    assert raw["tflops"] == pytest.approx(p.flops_per_rank / 8e-3 / 1e12) and raw["host_ms"] == 1.5
    assert raw["op"] == "layer" and raw["label"] == "llama70b.train" and (raw["n"], raw["k"]) == (8192, 28672)
    assert raw["phase"] == "train" and raw["heads"] == 64 and raw["kv_heads"] == 8 and raw["head_dim"] == 128 and raw["seq_parallel"]
    assert by[("prefill", "rawflux")]["speedup"] == pytest.approx(1.25)  # phases are problems of their own
    for r in recs:
        assert report.validate(r) == [], r
    table = report.format_table(recs)
    assert "llama70b.train" in table and "llama70b.prefill" in table


# --------------------------------------------------------------------------------------------
# the correctness guard


class _Comm:
    def __init__(self, others=()):
        self.others = list(others)

    def allgather(self, x):
        return [x] + self.others


def _guarded(ref, others=()):
    st = object.__new__(layer._State)
    st.on, st.group, st._ref, st._ref_err = contextlib.nullcontext, SimpleNamespace(comm=_Comm(others)), ref, None
    from rawflux.bench import layer_steps

    st.steps = layer_steps
    return st


def test_guard_passes_a_match_and_fails_a_wrong_step():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    ref = [torch.randn(8, 16, generator=g) for _ in range(6)]
    near = [t * (1 + 1e-3) for t in ref]
    _guarded(ref).guard("rawflux", lambda i: near)
    wrong = list(near)
    wrong[3] = ref[3] * 1.1
    with pytest.raises(registry.Failed, match=r"rawflux step's dW o differs from the nonoverlap step's by 0\.1 \(relative, rank 0"):
        _guarded(ref).guard("rawflux", lambda i: wrong)
    with pytest.raises(registry.Failed, match="dx .* rank 1"):  # another rank's error fails every rank
        _guarded(ref, [(0.5, "dx")]).guard("rawflux", lambda i: near)
    nan = [ref[0] * float("nan")] + near[1:]
    with pytest.raises(registry.Failed, match="output differs .* inf"):
        _guarded(ref).guard("torch_async_tp", lambda i: nan)
    broken = _guarded(None)
    broken._ref_err = "RuntimeError: NCCL"
    with pytest.raises(registry.Unavailable, match="reference step failed .*NCCL"):
        broken.guard("rawflux", lambda i: near)


def test_guard_compares_on_the_steps_stream(monkeypatch):
    """The step runs on the bench stream (``on``); its result is compared there too: torch's
    default stream does not wait for a non-blocking stream, so comparing outside ``on`` read a
    decode step's output before it was written (1.15 relative on the emulated node)."""
    torch = pytest.importorskip("torch")
    ref = [torch.ones(4, 4)]
    inside = []

    @contextlib.contextmanager
    def on():
        inside.append(True)
        yield
        inside.pop()

    st = _guarded(ref)
    st.on = on
    seen = []
    real = layer_steps.rel_errors
    monkeypatch.setattr(layer_steps, "rel_errors", lambda got, want: seen.append(bool(inside)) or real(got, want))
    st.guard("rawflux", lambda i: [t.clone() for t in ref])
    assert seen == [True]


def test_failed_rows_are_marked():
    class Comm:
        def allgather(self, x):
            return [x, x]

    def bad(ctx):
        raise registry.Failed("dx differs")

    impl = registry.Impl("layer", "rawflux", "fused", bad)
    ctx = SimpleNamespace(group=SimpleNamespace(comm=Comm()))
    res = cli.measure(ctx, impl, None)
    assert isinstance(res, str) and cli.FAILED in res and "dx differs" in res


# --------------------------------------------------------------------------------------------
# BENCHMARKS.md's layer tables


def _report():
    spec = importlib.util.spec_from_file_location("benchmarks_report", ROOT / "benchmarks" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run_file(path: Path, recs, failed=()):
    meta = {"argv": ["rawflux.bench", "--op", "layer", "--quick", "--out-dir", "x"], "versions": {"torch": "2.11"}}
    if failed:
        meta["failed"] = list(failed)
    path.write_text(json.dumps({"schema": report.SCHEMA, "meta": meta, "records": recs}))


def test_benchmarks_md_renders_layer_rows(tmp_path):
    rep = _report()
    assert "layer steps" not in rep.render(tmp_path)  # no layer run: no section
    real = _records() + _records("decode", 16, (("nonoverlap", 0.4), ("rawflux", 0.5), ("gemm_only", 0.3)))
    _run_file(tmp_path / "real.json", real)
    emu = _records(world=2, times=(("nonoverlap", 3.0), ("gemm_only", 1.0)), emulated=True, ranks_per_gpu=2)
    _run_file(tmp_path / "emu.json", emu, [{"op": "layer", "label": "llama70b.train", "world": 2, "m": 1024, "dtype": "bf16",
                                            "impl": "rawflux", "why": "rank 0: FAILED: dx differs"}])
    text = rep.render(tmp_path)
    assert "## Tensor-parallel layer steps" in text
    assert "| 8 | GPUs | llama70b | 1024 | 8.000 | 10.000 | 9.000 | 6.000 | 1.25 | 1.11 | 2.000 | 0000000 |" in text
    assert "Decode step" in text and "| 8 | GPUs | llama70b | 16 | 0.500 | 0.400 | - | 0.300 | 0.80 | - | 0.200 | 0000000 |" in text
    assert "Prefill" not in text  # no prefill rows: no table
    assert "NOT MULTI-GPU RESULTS** in the rows marked emulated (W = 2)" in text and "correctness-only" in text
    assert "| 2 | emulated | llama70b | 1024 | FAILED | 3.000 | - | 1.000 | FAILED | - | FAILED |" in text
    assert text.index("| 8 | GPUs | llama70b | 1024") < text.index("| 2 | emulated")  # real GPUs first
    assert "rawflux-launch --emulate 2 -m rawflux.bench --op layer --quick`" in text
    assert "## Emulated node: correctness-only runs" not in text  # that section is the fused ops'
    assert rep.superseded(rep.load(tmp_path)) == []


def test_layer_runs_plot():
    pytest.importorskip("matplotlib")
    from rawflux.bench import plots

    recs = report.derive(_records())
    (title, fig), = plots.fused_figures([{"schema": report.SCHEMA, "meta": {}, "records": recs}])
    assert title.startswith("layer W=8") and "hidden 8192, ffn 28672" in fig.axes[0].get_title()


# --------------------------------------------------------------------------------------------
# the steps on the CPU: every way against the unsplit block


torch = pytest.importorskip("torch")
import torch.nn.functional as TF  # noqa: E402

from rawflux.bench import layer_steps  # noqa: E402

from rawflux.nn import _ops  # noqa: E402

from .test_nn_cpu import RefAttention, RefMLP, _cat, fake_ops, rand, rows, run_ranks  # noqa: E402, F401  (fake_ops: a fixture)

H, FFN, HEADS, KV, HD = 32, 64, 8, 4, 8
TOL = dict(rtol=1e-9, atol=1e-9)


@pytest.fixture
def fake_collectives(monkeypatch, fake_ops):  # noqa: F811
    """The reference's baseline calls and torch's async-TP ops over the simulated world."""
    def mm(a, b, layout):
        return a @ (b.T if layout == "nk" else b)

    def gathered(x, group):
        return _cat(group.sim.exchange(group.rank, x.detach().clone()))

    def scattered(part, group):
        parts = group.sim.exchange(group.rank, part.detach().clone())
        total = sum(parts[1:], parts[0])
        n = total.shape[0] // group.world
        return total[group.rank * n:(group.rank + 1) * n].contiguous()

    def base_ag_gemm(x, w, group, layout, gathered_out=None):
        full = gathered(x, group)
        if gathered_out is not None:
            gathered_out.copy_(full)
        return mm(full, w, layout)

    monkeypatch.setattr(layer_steps, "base_ag_gemm", base_ag_gemm)
    monkeypatch.setattr(layer_steps, "base_gemm_rs", lambda x, w, group, layout: scattered(mm(x, w, layout), group))
    monkeypatch.setattr(layer_steps, "symm_ag", lambda a, b, g: (gathered(a, g), gathered(a, g) @ b))
    monkeypatch.setattr(layer_steps, "symm_rs", lambda a, b, g: scattered(a @ b, g))


def unsplit(attn, mlp, x, dy):
    """The block on the whole input with the full weights: (y, dx, {weight name: grad})."""
    x = x.clone().requires_grad_(True)
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    h = x + attn.o_proj(layer_steps.mix(q, k, v, HD))
    y = h + mlp.down_proj(TF.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
    y.backward(dy)
    grads = {n: lin.weight.grad for n, lin in (("q", attn.q_proj), ("k", attn.k_proj), ("v", attn.v_proj), ("o", attn.o_proj),
                                               ("gate", mlp.gate_proj), ("up", mlp.up_proj), ("down", mlp.down_proj))}
    return y.detach(), x.grad, grads


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("sp, train", [(True, True), (True, False), (False, True)])
def test_every_way_matches_the_unsplit_block(fake_collectives, world, sp, train):
    attn, mlp = RefAttention(H, HEADS, KV, HD, seed=1), RefMLP(H, FFN, seed=10)
    m = 3 * world
    X, DY = rand(m, H, seed=20), rand(m, H, seed=21)
    Y, DX, G = unsplit(attn, mlp, X, DY)
    ways = [w for w in layer_steps.WAYS if sp or w != "torch_async_tp"]

    def rank(g):
        import rawflux.nn as tp

        proj = tp.TPAttentionProjections.from_llama(attn, g, sequence_parallel=sp, keep_gathered=True)
        blk = tp.TPMLP.from_llama(mlp, g, sequence_parallel=sp, keep_gathered=True)
        x, dy = (rows(X, g.rank, world), rows(DY, g.rank, world)) if sp else (X, DY)
        x = x.clone().requires_grad_(train)
        out = {}
        for way in ways:
            block = layer_steps.build(way, proj, blk, g, sequence_parallel=sp, symm_name=g)
            out[way] = layer_steps.step_fn(block, train, [x], [dy], layer_steps.weights(proj, blk))(0)
        return out

    got, _ = run_ranks(world, rank)
    for r, out in enumerate(got):
        part = (lambda t: rows(t, r, world)) if sp else (lambda t: t)
        q_l, kv_l, f_l = HEADS * HD // world, KV * HD // world, FFN // world
        want = [part(Y)]
        if train:
            want += [part(DX), torch.cat([rows(G["q"], r, world), rows(G["k"], r, world), rows(G["v"], r, world)]),
                     G["o"][:, r * q_l:(r + 1) * q_l], torch.cat([rows(G["gate"], r, world), rows(G["up"], r, world)]),
                     G["down"][:, r * f_l:(r + 1) * f_l]]
            assert kv_l * world == KV * HD
        for way in ways:
            assert len(out[way]) == len(want), way
            for name, a, b in zip(layer_steps.OUTPUTS, out[way], want):
                torch.testing.assert_close(a, b, **TOL, msg=lambda s, w=way, n=name: f"{w} {n}: {s}")
            errs = layer_steps.rel_errors(out[way], out["nonoverlap"])
            assert max(errs.values()) < 1e-12 and set(errs) == set(layer_steps.OUTPUTS[:len(want)])


def test_async_tp_has_no_decode_layers():
    with pytest.raises(ValueError, match="sequence parallel only"):
        layer_steps.build("torch_async_tp", SimpleNamespace(head_dim=8, qkv=None), None, None, sequence_parallel=False)
    with pytest.raises(ValueError, match="way 'fast'"):
        layer_steps.build("fast", SimpleNamespace(head_dim=8, qkv=SimpleNamespace(weight=0), out=SimpleNamespace(weight=0)),
                          SimpleNamespace(gate_up=SimpleNamespace(weight=0), down=SimpleNamespace(weight=0)), None)


def test_mix_keeps_each_kv_heads_queries_together():
    q = torch.arange(2 * 4 * 2, dtype=torch.float64).reshape(2, 8)  # 4 query heads of 2, 2 KV heads
    k = torch.ones(2, 4, dtype=torch.float64)
    v = torch.tensor([[1.0, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.float64)
    out = layer_steps.mix(q, k, v, 2)
    assert out.shape == q.shape
    # query heads 0, 1 get KV head 0's k * v; heads 2, 3 KV head 1's
    assert out[0].tolist() == [1, 3, 3, 5, 7, 9, 9, 11]
    assert math.isclose(float(layer_steps.rel_errors([out], [out])["output"]), 0.0)


class _SimComm:
    def __init__(self, g):
        self.g = g

    def bcast(self, x, root=0):
        return self.g.sim.exchange(self.g.rank, x)[root]

    def allgather(self, x):
        return self.g.sim.exchange(self.g.rank, x)


@pytest.fixture
def on_cpu(monkeypatch, fake_collectives):
    """layer.py's factories on the CPU: no CUDA stream or device, async-TP's group the simulated one."""
    monkeypatch.setattr(layer, "_cuda", lambda torch, g, s: (torch.device("cpu"), contextlib.nullcontext, lambda: None))
    monkeypatch.setattr(builtin, "_torch_symm_group", lambda ctx: ctx.group)


def _ctx(g, phase, m, world):
    g.comm = _SimComm(g)
    p = LayerProblem(phase, m, LayerShape(H, FFN, HEADS, KV, HD), "bf16", world, f"t.{phase}")
    return SimpleNamespace(problem=p, group=g, stream=None, seed=5 + g.rank, cache={}, nsets=2)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("phase, m", [("train", 8), ("prefill", 8), ("decode", 3)])
def test_factories_guard_and_run_on_the_cpu(on_cpu, world, phase, m):
    """Every row's factory (bf16 on the CPU, the fused ops played by references): shared weights
    and inputs built once per problem, the guard passed, the host's queueing time measured."""
    def rank(g):
        ctx = _ctx(g, phase, m, world)
        out = {}
        for impl in registry.impls("layer"):
            try:
                run = impl.factory(ctx)
            except registry.Unavailable as e:
                out[impl.name] = str(e)
                continue
            run(1)
            out[impl.name] = run.host_us
        st = ctx.cache["layer"]
        return out, st.xs[0].detach().clone(), st.params[0].detach().clone(), len(st.xs), len(st.dys)

    got, _ = run_ranks(world, rank)
    for out, x, w, nx, ndy in got:
        assert set(out) == {"nonoverlap", "rawflux", "torch_async_tp", "gemm_only"}
        for name, v in out.items():
            if name == "torch_async_tp" and phase == "decode":
                assert "no sequence parallelism" in v
            else:
                assert isinstance(v, float) and v > 0, (name, v)
        assert x.dtype == torch.bfloat16 and x.shape == ((m // world if phase != "decode" else m), H)
        assert (nx, ndy) == (2, 2 if phase == "train" else 0)
    if world > 1:
        same_x = torch.equal(got[0][1], got[1][1])
        assert same_x == (phase == "decode")  # decode: one batch on every rank; else each rank its rows
        assert not torch.equal(got[0][2], got[1][2])  # fresh weights on every rank


def test_a_wrong_fused_step_is_not_timed(on_cpu, monkeypatch):
    from .test_nn_cpu import fake_gemm_rs

    monkeypatch.setattr(_ops, "gemm_rs", lambda *a, **k: fake_gemm_rs(*a, **k) * 1.05)
    impls = {i.name: i for i in registry.impls("layer")}

    def rank(g):
        ctx = _ctx(g, "train", 8, 2)
        impls["nonoverlap"].factory(ctx)
        impls["torch_async_tp"].factory(ctx)  # right: passes
        impls["rawflux"].factory(ctx)

    with pytest.raises(registry.Failed, match=r"rawflux step's .* differs from the nonoverlap step's by 0\.0[2-9]"):
        run_ranks(2, rank)
