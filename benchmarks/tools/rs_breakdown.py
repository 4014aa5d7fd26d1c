"""Where a gemm_rs call's time goes, on a real node (run under rawflux-launch, one rank per GPU):

    rawflux-launch -n 2 python benchmarks/tools/rs_breakdown.py "8192,8192,4096;8192,12288,24576"

Shapes are "m,n,k_local" per rank. For each shape and partial type, CUDA events around the pieces
the op queues on the caller's stream (wrapping its launch helpers): the start (record publish,
barrier: includes the ranks' skew, as they are aligned only by an MPI barrier here), the scatter
GEMM, the tail reduction after it; the side reducer's span from its launch; then rawflux.gemm
alone with its own pick and with the fused op's configuration (128 CTAs). Medians of --iters,
one line per rank. A diagnostic, not a benchmark: rawflux.bench gives the aligned, rotated,
every-competitor numbers.
"""
from __future__ import annotations

import argparse
import statistics


def main() -> int:
    import cupy as cp
    import ml_dtypes

    import rawflux
    from rawflux.engine import planning
    from rawflux.ops import gemm_rs as rs

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shapes", nargs="?", default="8192,8192,4096;2048,8192,4096", help="'m,n,k_local;...'")
    ap.add_argument("--iters", type=int, default=9)
    ap.add_argument("--partials", default="fp32,bf16")
    args = ap.parse_args()
    g = rawflux.init()
    comm, rank = g.comm, g.rank
    marks: list = []
    launch_gemm, launch_reduce = planning.GemmPlan.launch, rs._launch_reduce

    def timed(name, fn, stream):
        s = cp.cuda.ExternalStream(stream)
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        fn()
        e1.record(s)
        marks.append((name, e0, e1))

    planning.GemmPlan.launch = lambda self, *a, **kw: timed("gemm", lambda: launch_gemm(self, *a, **kw), kw["stream"])
    rs._launch_reduce = lambda k, grid, stream, prm: timed(f"reduce[{grid}]", lambda: launch_reduce(k, grid, stream, prm), stream)
    bf16 = ml_dtypes.bfloat16
    med = statistics.median

    def say(lines):
        got = comm.gather(lines, root=0)
        if rank == 0:
            for r, ls in enumerate(got):
                for ln in ls:
                    print(f"[rank {r}] {ln}", flush=True)

    for spec in args.shapes.split(";"):
        m, n, kl = (int(x) for x in spec.split(","))
        a = cp.random.standard_normal((m, kl), dtype=cp.float32).astype(bf16)
        b = cp.random.standard_normal((n, kl), dtype=cp.float32).astype(bf16)
        out = cp.empty((m // g.world, n), bf16)
        c = cp.empty((m, n), bf16)
        s = cp.cuda.Stream(non_blocking=True)
        lines = []
        for part in args.partials.split(","):
            op = rawflux.GemmRS(g, max_m=m, n=n, k=kl, dtype="bf16", partials=part)
            op(a, b, out=out, stream=s)
            s.synchronize()
            total, pieces = [], {}
            for _ in range(args.iters):
                marks.clear()
                comm.Barrier()
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(s)
                op(a, b, out=out, stream=s)
                e1.record(s)
                e1.synchronize()
                total.append(cp.cuda.get_elapsed_time(e0, e1))
                pieces.setdefault("start", []).append(cp.cuda.get_elapsed_time(e0, marks[0][1]))
                for name, x, y in marks:
                    pieces.setdefault(name, []).append(cp.cuda.get_elapsed_time(x, y))
            fused_cfg = op.plan(m).cfg
            lines.append(f"gemm_rs m={m} n={n} k_local={kl} partials={part}: total {med(total):.3f} ms | "
                         + " | ".join(f"{k} {med(v):.3f}" for k, v in pieces.items()) + f" | {fused_cfg.tag()}")
            op.close()
        for label, cfg in (("own pick", None), ("the fused op's config", fused_cfg)):
            rawflux.gemm(a, b, out=c, stream=s, config=cfg)
            s.synchronize()
            ts = []
            for _ in range(args.iters):
                comm.Barrier()
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(s)
                rawflux.gemm(a, b, out=c, stream=s, config=cfg)
                e1.record(s)
                e1.synchronize()
                ts.append(cp.cuda.get_elapsed_time(e0, e1))
            lines.append(f"rawflux.gemm m={m} n={n} k={kl} ({label}): {med(ts):.3f} ms")
        say(lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
