"""python -m rawflux.bench: time every registered impl of the chosen ops, under mpirun (one rank per
GPU; or the emulated node, several ranks on one GPU, flagged ``emulated`` in the records).

    rawflux-launch python -m rawflux.bench                       # paper shapes, all ops
    mpirun -np 8 python -m rawflux.bench --op ag_gemm --shapes llama70b --m 2048,8192
    mpirun -np 2 python -m rawflux.bench --quick --shapes "4096,8192,8192"
    rawflux-launch -m rawflux.bench --op layer                    # model steps (rawflux/bench/layer.py)

Rank 0 prints each row as it is measured, with the sweep's progress (a bar on a terminal, a
count and an ETA on each line in a log; RAWFLUX_PROGRESS, --quiet), then the table, and writes
one JSON file per run under --out-dir.
"""
from __future__ import annotations

import argparse
import sys

from .. import env
from ..dist import DistError
from ..runtime import CudaUnavailable
from .layer import DECODE_M, LAYER_PRESETS, PHASES, QUICK_DECODE_M, build_layer_problems, parse_phases
from .problems import DECODE_SET_M, DEFAULT_M, PRESETS, QUICK_M, Problem, build_problems, parse_ints
from .registry import Failed, Unavailable, impls
from .report import bus_gbps, derive, format_table, now_iso, tflops, write_json

OP_CHOICES = ("ag_gemm", "gemm_rs", "gemm_ar", "gemm", "barrier", "all", "layer")
DEFAULT_ITERS, QUICK_ITERS = 50, 10
DEFAULT_WARMUP, QUICK_WARMUP = 10, 3
FAILED = "FAILED: "  # how a skip reason marks a row whose result was wrong (registry.Failed)
MIN_ITERS_FOR_RECORDS = 30  # DESIGN: median of >= 30; fewer is allowed only with --quick
SET_BUDGET_FRACTION = 0.3  # of a rank's share of GPU memory, for rotating input sets


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m rawflux.bench", description="Time rawflux ops against their baselines (run under mpirun).")
    ap.add_argument("--op", choices=OP_CHOICES, default="all",
                    help="ag_gemm / gemm_rs / gemm_ar: every impl of that op; gemm: the GEMM alone for both; barrier: barrier latency; "
                         "all (default: those); layer: a TP block's training / prefill / decode steps (asked for alone)")
    ap.add_argument("--shapes", default=None,
                    help=f"presets ({', '.join(PRESETS)}; several: 'paper,llama70b'; default paper) or shapes 'm,n,k' / 'n,k' separated by spaces or ';' "
                         f"(global sizes: ag_gemm splits n over ranks, gemm_rs splits k); --op layer: {', '.join(LAYER_PRESETS)} "
                         "(default llama70b) or 'hidden,ffn,heads,kv_heads,head_dim'")
    ap.add_argument("--m", default=None, help=f"comma-separated m values (default {','.join(map(str, DEFAULT_M))}; --quick: {','.join(map(str, QUICK_M))})")
    ap.add_argument("--decode", action="store_true",
                    help=f"the decode set: m = {','.join(map(str, DECODE_SET_M))} over the paper's and Llama-3-70B's shapes "
                         f"(--m, --shapes override), the host's time per call in its own column")
    ap.add_argument("--phase", default=",".join(PHASES), help=f"--op layer: comma-separated among {', '.join(PHASES)} (default all)")
    ap.add_argument("--decode-m", default=None,
                    help=f"--op layer: the decode phase's m values (default {','.join(map(str, DECODE_M))}; --quick: {','.join(map(str, QUICK_DECODE_M))})")
    ap.add_argument("--dtype", default="bf16", help="comma-separated: bf16, f16, f32 (default bf16)")
    ap.add_argument("--iters", type=int, default=None, help=f"timed iterations per row (default {DEFAULT_ITERS}; --quick: {QUICK_ITERS})")
    ap.add_argument("--warmup", type=int, default=None, help=f"warm-up iterations (default {DEFAULT_WARMUP}; --quick: {QUICK_WARMUP})")
    ap.add_argument("--impl", default=None, help="comma-separated impl names to run (default: all registered)")
    ap.add_argument("--out-dir", default="benchmarks/results", help="where the JSON file goes (default benchmarks/results)")
    ap.add_argument("--no-json", action="store_true", help="print only, write no file")
    ap.add_argument("--plot", action="store_true", help="also draw the run's charts as PNG next to the JSON (needs matplotlib)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: one m, few iterations (records say quick)")
    ap.add_argument("--delay-us", type=float, default=500.0,
                    help="delay kernel before each timed region so launches queue ahead (default 500; 0: off)")
    ap.add_argument("--no-align", action="store_true", help="no device barrier before each timed region")
    ap.add_argument("--seed", type=int, default=None, help="input seed (default: fresh every run)")
    ap.add_argument("--quiet", action="store_true",
                    help="no progress and no per-row lines: the table and the file names only (RAWFLUX_PROGRESS=off: "
                         "the row lines without the progress)")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.decode and args.op == "layer":
        ap.error("--decode: the layer steps have their own decode phase (--phase decode, --decode-m)")
    args.shapes = args.shapes or ("llama70b" if args.op == "layer" else "paper,llama70b" if args.decode else "paper")
    try:
        default_m = DECODE_SET_M if args.decode else QUICK_M if args.quick else DEFAULT_M
        args.m_list = parse_ints(args.m, "--m") if args.m else list(default_m)
        args.decode_m_list = parse_ints(args.decode_m, "--decode-m") if args.decode_m else list(QUICK_DECODE_M if args.quick else DECODE_M)
        args.phases = parse_phases(args.phase)
        args.dtypes = [_dtype_tag(d) for d in args.dtype.split(",") if d.strip()]
        args.impl_names = [x.strip() for x in args.impl.split(",") if x.strip()] if args.impl else None
        if args.op == "layer":
            build_layer_problems(args.shapes, args.m_list, args.decode_m_list, args.phases, args.dtypes, 1)  # validates --shapes
        elif args.op != "barrier":
            build_problems(["ag_gemm"], args.shapes, args.m_list, args.dtypes, 1)  # validates --shapes
    except (ValueError, TypeError) as e:
        ap.error(str(e))
    if not args.dtypes:
        ap.error("--dtype: no dtype given")
    args.iters = args.iters if args.iters is not None else (QUICK_ITERS if args.quick else DEFAULT_ITERS)
    args.warmup = args.warmup if args.warmup is not None else (QUICK_WARMUP if args.quick else DEFAULT_WARMUP)
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")
    if args.iters < MIN_ITERS_FOR_RECORDS and not args.quick:
        ap.error(f"--iters {args.iters}: the method takes the median of at least {MIN_ITERS_FOR_RECORDS} (use --quick for a smoke run)")
    if args.delay_us < 0:
        ap.error("--delay-us must be >= 0")
    return args


def _dtype_tag(name: str) -> str:
    from ..runtime import DType

    dt = DType.from_any(name.strip())
    if dt not in (DType.BF16, DType.F16, DType.F32):
        raise ValueError(f"--dtype {name}: the baselines take bf16, f16, f32")
    return dt.tag


def plan(op: str) -> list[tuple[str, set | None]]:
    """(registry op, roles to run or None for all) for an --op choice."""
    return {
        "ag_gemm": [("ag_gemm", None)],
        "gemm_rs": [("gemm_rs", None)],
        "gemm_ar": [("gemm_ar", None)],
        "gemm": [("ag_gemm", {"gemm"}), ("gemm_rs", {"gemm"})],
        "barrier": [("barrier", None)],
        "all": [("ag_gemm", None), ("gemm_rs", None), ("barrier", None)],
        "layer": [("layer", None)],
    }[op]


def problems_for(op: str, args, world: int) -> list:
    if op == "barrier":
        return [Problem("barrier", 0, 0, 0, "-", world, "barrier")]
    if op == "layer":
        return build_layer_problems(args.shapes, args.m_list, args.decode_m_list, args.phases, args.dtypes, world)
    return build_problems([op], args.shapes, args.m_list, args.dtypes, world)


def make_record(p, impl, stats: dict, info, args, nsets: int, date: str) -> dict:
    from ..runtime import DType

    ms = stats["ms"]
    rec = {
        "op": p.op, "impl": impl.name, "role": impl.role, "label": p.label,
        "world": p.world, "m": p.m, "n": p.n, "k": p.k, "dtype": p.dtype,
        "ms": ms, "ms_rank_min": stats["ms_rank_min"], "ms_p10": stats["ms_p10"], "ms_p90": stats["ms_p90"],
        "tflops": None, "gbps": None, "us": None,
        "iters": args.iters, "warmup": args.warmup, "inner": impl.inner, "nsets": nsets,
        "gpu": info.gpu, "driver": info.driver, "commit": info.commit, "date": date,
        "emulated": info.emulated, "ranks_per_gpu": info.ranks_per_gpu, "host": info.host, "quick": bool(args.quick),
        "gemm_ref": impl.gemm_ref, "speedup": None, "exposed_ms": None, "overlap_eff": None,
    }
    if hasattr(p, "extra"):  # the layer op: phase and the block's shape
        rec.update(p.extra())
    if stats.get("host_ms") is not None:
        rec["host_ms"] = stats["host_ms"]
    if impl.role in ("fused", "nonoverlap", "gemm"):
        rec["tflops"] = tflops(p.flops_per_rank, ms)
    elif impl.role == "comm":
        rec["gbps"] = bus_gbps(p.comm_elems(), DType.from_any(p.dtype).itemsize, p.world, ms)
    elif impl.role == "barrier":
        rec["us"] = ms * 1e3
    return rec


def measure(ctx, impl, timer):
    """Per-rank timing of one impl, agreed across ranks. Returns stats or a skip reason (str)."""
    from mpi4py import MPI

    from .timing import summarize

    comm = ctx.group.comm
    err = None
    try:
        run = impl.factory(ctx)
    except Failed as e:
        err = f"{FAILED}{e}"
    except Unavailable as e:
        err = str(e)
    except Exception as e:  # noqa: BLE001  (a broken impl skips its row; the others still run)
        err = f"{type(e).__name__}: {e}"
    errs = comm.allgather(err)
    if any(errs):
        return next(f"rank {r}: {e}" for r, e in enumerate(errs) if e)
    try:
        timer.warm(run, ctx.nsets, impl.inner)
    except Exception as e:  # noqa: BLE001
        err = f"{type(e).__name__}: {e}"
    errs = comm.allgather(err)
    if all(errs):  # raised on every rank (before any unmatched collective): skip cleanly
        return f"rank 0: {errs[0]}"
    if any(errs):  # some ranks queued collectives their peers never will: they would hang
        bad = "; ".join(f"rank {r}: {e}" for r, e in enumerate(errs) if e)
        print(f"[rawflux.bench] {impl.op}/{impl.name} failed on some ranks only ({bad}): aborting", file=sys.stderr, flush=True)
        comm.Abort(1)
    timer.sync()
    times = timer.time(run, ctx.nsets, impl.inner)
    s = summarize(times)
    host = getattr(run, "host_us", None)
    host = getattr(timer, "host_us", None) if host is None else host  # the queueing the timed iterations measured
    return {
        "ms": comm.allreduce(s["median"], op=MPI.MAX),
        "ms_rank_min": comm.allreduce(s["median"], op=MPI.MIN),
        "ms_p10": comm.allreduce(s["p10"], op=MPI.MAX),
        "ms_p90": comm.allreduce(s["p90"], op=MPI.MAX),
        "host_ms": comm.allreduce(float(host) / 1e3, op=MPI.MAX) if host is not None else None,
    }


def init_group():
    import rawflux

    init = getattr(rawflux, "init", None)
    if init is None:
        from rawflux.dist import init
    return init()


def plot_run(json_path) -> list:
    """The charts of one run file (rawflux.bench.plots.fused_figures) as PNG files beside it."""
    from pathlib import Path

    from .plots import fused_figures

    path = Path(json_path)
    out = []
    for i, (_, fig) in enumerate(fused_figures([path])):
        png = path.with_name(f"{path.stem}-{i}.png")
        fig.savefig(png, dpi=110)
        out.append(png)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    from . import builtin  # noqa: F401  (registers the built-in impls)
    from .registry import OPS
    from .timing import GpuSide

    known = {i.name for op in OPS for i in impls(op)}
    unknown = sorted(set(args.impl_names or ()) - known)
    if unknown:
        build_parser().error(f"--impl: no impl named {', '.join(unknown)} (registered: {', '.join(sorted(known))})")
    try:
        group = init_group()
    except (CudaUnavailable, DistError, ModuleNotFoundError) as e:  # what is missing: one line, no traceback
        if env.launcher_rank() in (None, 0):
            print(f"rawflux.bench: {e}", file=sys.stderr, flush=True)
        return 1
    run(args, group, GpuSide(group, args), sys.argv if argv is None else list(argv))
    return 0


def run(args, group, side, argv) -> list[dict]:
    """Time every chosen (problem, impl) on ``side`` (a timing.GpuSide, or a stand-in in tests);
    rank 0 prints the table and writes the JSON file. Collective. Returns the records."""
    from mpi4py import MPI

    from ..runtime import DType, Progress
    from .timing import Ctx, fresh_seed, plan_nsets, set_bytes

    comm, rank, world = group.comm, group.rank, group.world
    info = side.info
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    say(f"rawflux.bench: {world} rank(s), {info.gpu}, driver {info.driver}, commit {info.commit}"
        + (f", EMULATED ({info.ranks_per_gpu} ranks per GPU: times are not a real node's)" if info.emulated else ""))
    base_seed = args.seed if args.seed is not None else comm.bcast(fresh_seed(0), root=0)
    budget = int(SET_BUDGET_FRACTION * info.mem_bytes / max(1, info.ranks_per_gpu))
    date = now_iso()
    records: list[dict] = []
    failed: list[dict] = []

    sweep = [(op, chosen, problems_for(op, args, world)) for op, roles in plan(args.op)
             if (chosen := impls(op, roles, args.impl_names))]
    prog = Progress(sum(len(c) * len(ps) for _, c, ps in sweep), enabled=rank == 0 and not args.quiet)
    for op, chosen, problems in sweep:
        for p in problems:
            why = p.check()
            if why:
                prog.step(f"skip {op} {p.label} m={p.m}: {why}", len(chosen), keep=True)
                continue
            nsets = plan_nsets(set_bytes(p, DType.from_any(p.dtype).itemsize), info.l2_bytes, budget) if op != "barrier" else 1
            nsets = comm.allreduce(nsets, op=MPI.MIN)
            seed = (base_seed + 1_000_003 * rank + 7919 * len(records)) & 0x7FFFFFFF
            sets = side.make_sets(p, nsets, seed) if op != "barrier" else [{}]
            ctx = Ctx(p, group, side.stream, sets, seed)
            for impl in chosen:
                res = measure(ctx, impl, side.timer)
                if isinstance(res, str):
                    if FAILED in res:
                        failed.append({"op": op, "label": p.label, "world": world, "m": p.m, "dtype": p.dtype, "impl": impl.name, "why": res})
                    prog.step(f"skip {op} {p.label} m={p.m} {impl.name}: {res}", keep=True)
                    continue
                rec = make_record(p, impl, res, info, args, nsets, date)
                records.append(rec)
                prog.step(f"{op:8s} {p.label:22s} m={p.m:<6d} {p.dtype:4s} {impl.name:22s} {rec['ms']:9.4f} ms"
                          + (f"  {rec['tflops']:7.1f} TFLOP/s" if rec["tflops"] else "")
                          + (f"  {rec['gbps']:7.1f} GB/s" if rec["gbps"] else "")
                          + (f"  {rec['us']:7.2f} us" if rec["us"] is not None else ""), keep=True)
            del ctx, sets
            side.release()
    prog.close()

    derive(records)
    if rank == 0:
        print()
        print(format_table(records), flush=True)
        for f in failed:
            print(f"FAILED, not timed: {f['op']} {f['label']} m={f['m']} {f['impl']}: {f['why']}", flush=True)
        if records and not args.no_json:
            meta = {"argv": list(argv), "versions": info.versions, "l2_bytes": info.l2_bytes,
                    "delay_us": args.delay_us, "align": not args.no_align, "seed": base_seed}
            if failed:
                meta["failed"] = failed
            path = write_json(records, args.out_dir, meta)
            print(f"wrote {path}", flush=True)
            if args.plot:
                for png in plot_run(path):
                    print(f"wrote {png}", flush=True)
    comm.Barrier()
    return records
