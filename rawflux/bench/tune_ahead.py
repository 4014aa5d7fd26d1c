"""Tune the fused ops ahead of time for a list of shapes and print what was stored.

    rawflux-launch -n 8 -m rawflux.tune --op gemm_rs --shapes llama70b --m 1024,2048,4096,8192
    rawflux-launch -n 2 -m rawflux.tune --op all --quick --budget-s 30

Every rank builds the op of each problem (the benchmark's shapes: rawflux.bench --shapes) and
runs its tune(m): all ranks time the same candidates and keep the one whose slowest rank is
fastest (rawflux/tune/collective.py), written to <cache dir>/fused_tune.json, which later runs
read at first use (RAWFLUX_TUNE=cached, the default). Before it starts, rank 0 says how many
problems and candidates it will time and the time bound (--budget-s per problem).
"""
from __future__ import annotations

import argparse
import sys
import time

from .problems import DEFAULT_M, QUICK_M, build_problems, parse_ints

OPS = ("ag_gemm", "gemm_rs")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m rawflux.tune", description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="all", choices=OPS + ("all",))
    ap.add_argument("--shapes", default="paper,llama70b", help="presets or n:k pairs, as rawflux.bench --shapes")
    ap.add_argument("--m", default=None, help=f"comma-separated m (default {','.join(map(str, DEFAULT_M))}; --quick: {QUICK_M[0]})")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    ap.add_argument("--top", type=int, default=6, help="candidates per problem, the default pick included (default 6)")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per candidate (default 20)")
    ap.add_argument("--budget-s", type=float, default=None, help="time bound per problem (default RAWFLUX_TUNE_BUDGET_S)")
    ap.add_argument("--quick", action="store_true", help="one m, three candidates")
    args = ap.parse_args(argv)
    args.ops = list(OPS) if args.op == "all" else [args.op]
    args.m_list = parse_ints(args.m, "--m") if args.m else list(QUICK_M if args.quick else DEFAULT_M)
    if args.quick:
        args.top = min(args.top, 3)
    if args.top < 1 or args.reps < 1:
        ap.error(f"--top and --reps must be at least 1 (got {args.top}, {args.reps})")
    if args.budget_s is not None and not args.budget_s > 0:
        ap.error(f"--budget-s must be positive (got {args.budget_s})")
    return args


def local_shape(p):
    """(max_m, n, k) of the op a rank builds for problem p (the benchmark's per-rank split)."""
    if p.op == "ag_gemm":
        return p.m, p.n // p.world, p.k
    return p.m, p.n, p.k // p.world


def main(argv=None) -> int:
    args = parse_args(argv)
    import rawflux
    from rawflux import env
    from rawflux.ops.ag_gemm import AGGemm
    from rawflux.ops.gemm_rs import GemmRS
    from rawflux.tune.collective import format_rows

    group = rawflux.init()
    say = (lambda *a: print(*a, flush=True)) if group.rank == 0 else (lambda *a: None)
    if group.world == 1:
        say("rawflux.tune: world 1 has no fused op to tune (rawflux.gemm tunes itself with RAWFLUX_TUNE=on)")
        return 0
    budget = env.tune_budget_s() if args.budget_s is None else args.budget_s
    probs = [p for p in build_problems(args.ops, args.shapes, args.m_list, [args.dtype], group.world) if p.check() is None]
    say(f"rawflux.tune: {len(probs)} problem(s) at W = {group.world}, up to {args.top} candidates of {args.reps} calls each, "
        f"at most {budget:g} s per problem ({len(probs) * budget:g} s in all); results go to {env.cache_dir() / 'fused_tune.json'}")
    t0 = time.perf_counter()
    for p in probs:
        max_m, n, k = local_shape(p)
        cls = AGGemm if p.op == "ag_gemm" else GemmRS
        op = cls(group, max_m, n, k, p.dtype)
        try:
            best = op.tune(p.m, top=args.top, reps=args.reps, budget_s=budget)
            label = op._adapt(best, p.m).tag() if p.op == "ag_gemm" else best.tile.tag()
            say(f"\n{p.op} {p.label} m={p.m} n={n} k={k} {p.dtype}:\n{format_rows(op.last_tune, label)}")
        finally:
            op.close()
    say(f"\nrawflux.tune: {len(probs)} problem(s) in {time.perf_counter() - t0:.0f} s")
    rawflux.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
