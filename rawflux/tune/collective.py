"""Tuning a fused op on line: one decision for the whole group.

Every rank times the same candidates in the same order (the op's calls are collective, so the
ranks run each candidate together), the ranks exchange their times after each candidate, and the
winner is the candidate whose slowest rank is fastest, unless it beats the first candidate (the
op's default) by no more than ``margin``: a gain inside the timing noise is not worth leaving the
heuristic's pick (on the H200 a 1 % "win" measured 1.5 % slower when timed again). Every rank
computes that from the same exchanged numbers, so all launch the same configuration. The budget is checked on the slowest
rank's elapsed time, also exchanged, so every rank stops after the same candidate.

    best, rows = decide(candidates, time_us, gather, budget_s=60.0, label=str, margin=MARGIN)

candidates: the options in the order to try them (the op's default first: it wins ties, and a
budget that stops after one candidate keeps it). time_us(c): this rank's time of one call with c
(collective). gather(x): every rank's x (a tuple of floats), in rank order: a bounded allgather over the group
(CollectiveOp.gather_for_tuning). A stored result is used only where every rank holds it
(CollectiveOp.agree_stored, once per op object at construction).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ..runtime.progress import Progress


MARGIN = 0.01  # a candidate must beat the default by more than this fraction to replace it


def pick(times, margin: float = MARGIN) -> int:
    """Index of the winner among ``times`` (microseconds, the default's first): the fastest (the
    earlier of a tie), unless it is within ``margin`` of the default, which then stays."""
    if not times:
        raise ValueError("tune: no candidate to pick from")
    best = min(range(len(times)), key=lambda j: (times[j], j))
    return best if times[best] < times[0] * (1.0 - margin) else 0


@dataclass(frozen=True)
class Row:
    """One timed candidate: its label, the slowest rank's microseconds and every rank's."""

    label: str
    slowest_us: float
    rank_us: tuple


def decide(candidates, time_us, gather, *, budget_s: float, label=str, progress: bool = False, title: str = "tune",
           margin: float = MARGIN):
    """(the winning candidate, [Row per timed candidate]); see the module docstring."""
    cands = list(candidates)
    if not cands:
        raise ValueError("tune: no candidate to time")
    if not budget_s > 0:
        raise ValueError(f"tune: budget_s must be positive, got {budget_s}")
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"tune: margin must be in [0, 1), got {margin}")
    rows: list[Row] = []
    best_us = math.inf
    start = time.perf_counter()
    with Progress(len(cands), title, enabled=progress) as prog:
        for i, c in enumerate(cands):
            mine = float(time_us(c))
            every = gather((mine, time.perf_counter() - start))
            slowest = max(us for us, _ in every)
            rows.append(Row(label(c), slowest, tuple(us for us, _ in every)))
            best_us = min(best_us, slowest)
            prog.step(f"{label(c)} {slowest:.1f} us (best {best_us:.1f})")
            elapsed = max(t for _, t in every)
            left = len(cands) - i - 1
            if left and elapsed + elapsed / (i + 1) > budget_s:  # the next one would overrun, on the slowest clock
                prog.step(f"budget {budget_s:g} s reached: {left} candidate(s) not timed", left)
                break
    return cands[pick([r.slowest_us for r in rows], margin)], rows


def format_rows(rows, best_label: str) -> str:
    """The timed candidates as a small table, the winner marked."""
    width = max(len(r.label) for r in rows)
    lines = [f"{'candidate':{width}s}  slowest rank us  per rank"]
    for r in rows:
        mark = "  <- chosen" if r.label == best_label else ""
        lines.append(f"{r.label:{width}s}  {r.slowest_us:15.1f}  {', '.join(f'{u:.1f}' for u in r.rank_us)}{mark}")
    return "\n".join(lines)
