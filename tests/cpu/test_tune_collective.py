"""rawflux.tune.collective: one decision for the whole group from every rank's timings."""
from __future__ import annotations

import random
import threading
import time

import pytest

from rawflux.tune.collective import MARGIN, decide, format_rows, pick


class Exchange:
    """allgather among W threads: every call returns every rank's value, in rank order."""

    def __init__(self, world: int):
        self.world, self.vals = world, [None] * world
        self.bar = threading.Barrier(world, timeout=10)

    def gather(self, rank: int):
        def g(x):
            self.vals[rank] = x
            self.bar.wait()
            out = list(self.vals)
            self.bar.wait()  # nobody overwrites a value before every rank has read it
            return out

        return g


def run(world: int, fn):
    ex, out, errors = Exchange(world), [None] * world, []

    def body(r):
        try:
            out[r] = fn(r, ex.gather(r))
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            ex.bar.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return out


@pytest.mark.parametrize("seed", range(5))
def test_noisy_ranks_make_one_choice_the_slowest_ranks(seed):
    """Every rank times the candidates with its own noise; all end with the same winner, the one
    whose slowest rank is fastest."""
    world, cands = 4, ["a", "b", "c", "d", "e"]
    rng = random.Random(seed)
    base = {c: rng.uniform(90, 110) for c in cands}
    noise = [[rng.uniform(0.9, 1.1) for _ in cands] for _ in range(world)]
    table = [{c: base[c] * noise[r][i] for i, c in enumerate(cands)} for r in range(world)]
    got = run(world, lambda r, g: decide(cands, lambda c: table[r][c], g, budget_s=60))
    winners = {best for best, _ in got}
    assert len(winners) == 1
    slowest = [max(table[r][c] for r in range(world)) for c in cands]
    fastest = min(range(len(cands)), key=lambda j: slowest[j])
    want = cands[fastest] if slowest[fastest] < slowest[0] * (1 - MARGIN) else cands[0]
    assert winners == {want}
    rows = got[0][1]
    assert [row.label for row in rows] == cands
    assert all(row.slowest_us == max(row.rank_us) and len(row.rank_us) == world for row in rows)


def test_a_rank_that_is_slow_on_one_candidate_rules_it_out():
    # rank 0 alone would take "fast"; rank 1 is slow on it, so "steady" wins everywhere
    times = [{"fast": 50.0, "steady": 60.0}, {"fast": 90.0, "steady": 61.0}]
    got = run(2, lambda r, g: decide(["fast", "steady"], lambda c: times[r][c], g, budget_s=60)[0])
    assert got == ["steady", "steady"]


def test_a_tie_keeps_the_earlier_candidate():
    got = run(2, lambda r, g: decide(["default", "other"], lambda c: 10.0, g, budget_s=60)[0])
    assert got == ["default", "default"]


def test_a_gain_inside_the_margin_keeps_the_default():
    times = {"default": 100.0, "close": 99.5, "far": 97.0}
    got = run(2, lambda r, g: decide(["default", "close"], lambda c: times[c], g, budget_s=60)[0])
    assert got == ["default", "default"]
    got = run(2, lambda r, g: decide(["default", "close", "far"], lambda c: times[c], g, budget_s=60)[0])
    assert got == ["far", "far"]
    got = run(2, lambda r, g: decide(["default", "close"], lambda c: times[c], g, budget_s=60, margin=0.0)[0])
    assert got == ["close", "close"]
    assert pick([10.0, 9.95, 9.95]) == 0 and pick([10.0, 9.0, 9.0]) == 1 and pick([10.0, 11.0]) == 0
    with pytest.raises(ValueError, match="margin"):
        decide(["a"], lambda c: 1.0, lambda x: [x], budget_s=1, margin=1.0)


def test_the_budget_stops_every_rank_after_the_same_candidate():
    """Rank 1's clock runs slow (each timing takes longer there): the stop follows the slowest
    rank's elapsed time, so both ranks time the same candidates and agree."""
    cands = list(range(10))
    timed = [[], []]

    def fn(r, g):
        def time_us(c):
            timed[r].append(c)
            time.sleep(0.05 if r == 1 else 0.001)
            return 100.0 - 5 * c  # later candidates are clearly faster: a budget stop changes the answer
        return decide(cands, time_us, g, budget_s=0.2)

    got = run(2, fn)
    assert timed[0] == timed[1] and 2 <= len(timed[0]) < len(cands)
    assert got[0][0] == got[1][0] == timed[0][-1]


def test_bad_arguments_say_why():
    with pytest.raises(ValueError, match="no candidate"):
        decide([], lambda c: 1.0, lambda x: [x], budget_s=1)
    with pytest.raises(ValueError, match="budget_s must be positive"):
        decide(["a"], lambda c: 1.0, lambda x: [x], budget_s=0)


def test_the_table_marks_the_winner():
    _, rows = decide(["x", "yy"], lambda c: {"x": 5.0, "yy": 3.0}[c], lambda v: [v, (v[0] * 2, v[1])], budget_s=60)
    text = format_rows(rows, "yy")
    assert text.splitlines()[2].endswith("<- chosen") and "6.0" in text and "10.0" in text


# --------------------------------------------------------------------------------------------
# python -m rawflux.tune's arguments (running it needs GPUs)


def test_tune_ahead_arguments():
    from rawflux.bench import tune_ahead
    from rawflux.bench.problems import Problem

    a = tune_ahead.parse_args(["--op", "gemm_rs", "--m", "1024,4096", "--top", "4"])
    assert a.ops == ["gemm_rs"] and a.m_list == [1024, 4096] and a.top == 4 and a.budget_s is None
    q = tune_ahead.parse_args(["--quick"])
    assert q.ops == ["ag_gemm", "gemm_rs"] and len(q.m_list) == 1 and q.top == 3
    for bad in (["--top", "0"], ["--budget-s", "0"], ["--op", "gemm"]):
        with pytest.raises(SystemExit):
            tune_ahead.parse_args(bad)
    assert tune_ahead.local_shape(Problem("ag_gemm", 4096, 8192, 1024, "bf16", 4)) == (4096, 2048, 1024)
    assert tune_ahead.local_shape(Problem("gemm_rs", 4096, 8192, 1024, "bf16", 4)) == (4096, 8192, 256)
