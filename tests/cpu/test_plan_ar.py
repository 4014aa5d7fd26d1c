"""The decode GEMM + AllReduce model (python -m rawflux.plan gemm_ar): each strategy's time by
hand on one point, the pick's crossover, the CLI. The kernel (ops/gemm_ar.py) runs one-shot."""
from __future__ import annotations

import json

import pytest

from rawflux import plan, tune


def test_by_hand():
    w, m, n, k = 4, 64, 8192, 2048
    p = plan.predict_ar(w, m, n, k, link_gbps=400.0, hop_us=2.0, nccl_us=10.0, nccl_busbw=200.0)
    dev = plan.h200()
    t_gemm = tune.estimate_us(m, n, k, tune.heuristic(m, n, k, "nk", dev, 2), dev, 2)
    out = m * n * 2
    dram = lambda nbytes: nbytes / dev.dram_bytes_per_s * 1e6  # noqa: E731
    assert p.t_gemm_us == pytest.approx(t_gemm)
    assert p.one_shot_us == pytest.approx(t_gemm + 3 * out / 400e3 + 2.0 + dram(5 * out))
    assert p.two_shot_us == pytest.approx(t_gemm + 2 * (3 * out / 4) / 400e3 + 4.0 + dram(5 * out / 4))
    assert p.nccl_us == pytest.approx(t_gemm + 10.0 + (2 * 3 * out / 4) / 200e3)


def test_one_shot_for_the_smallest_m_two_shot_past_the_crossover():
    picks = [plan.predict_ar(8, m, 8192, 1024).pick for m in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)]
    cut = picks.index("two_shot")
    assert 0 < cut and set(picks[:cut]) == {"one_shot"} and set(picks[cut:]) == {"two_shot"}
    # at W = 2 both move the same bytes: one hop fewer decides until the one-shot reduction's reads do
    assert plan.predict_ar(2, 16, 8192, 4096).pick == "one_shot"


def test_times_grow_with_m_and_stay_above_the_gemm():
    last = None
    for m in (1, 16, 128, 512):
        p = plan.predict_ar(4, m, 8192, 2048)
        assert min(p.one_shot_us, p.two_shot_us, p.nccl_us) > p.t_gemm_us
        if last is not None:
            assert p.one_shot_us > last.one_shot_us and p.two_shot_us > last.two_shot_us
        last = p


@pytest.mark.parametrize("args,msg", [(dict(world=1), "at least 2 ranks"), (dict(m=0), "positive"),
                                      (dict(link_gbps=0.0), "positive")])
def test_bad_arguments(args, msg):
    kw = dict(world=2, m=16, n=8192, k=1024) | args
    world, m, n, k = kw.pop("world"), kw.pop("m"), kw.pop("n"), kw.pop("k")
    with pytest.raises(ValueError, match=msg):
        plan.predict_ar(world, m, n, k, **kw)


def test_cli(capsys):
    assert plan.main(["gemm_ar", "--world", "8", "--n", "8192", "--k", "1024", "--ms", "1,512"]) == 0
    out = capsys.readouterr().out
    assert "one_shot" in out and "two_shot" in out
    assert plan.main(["gemm_ar", "--world", "2", "--n", "8192", "--k", "1024", "--ms", "16", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["m"] == 16 and row["pick"] in ("one_shot", "two_shot")
    assert plan.main(["gemm_ar", "--world", "1", "--n", "8192", "--k", "1024"]) == 2
