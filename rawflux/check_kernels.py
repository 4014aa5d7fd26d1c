"""CPU check: compile every registered kernel variant to cubin for each of its architectures and
fail on any register spill, local-memory stack frame or serialized wgmma (ptxas advisory C7512, C7519:
the wgmma of a kernel then run one at a time, a silent large slowdown). Needs NVRTC, no GPU.

    python -m rawflux.check_kernels [--arch sm_90a] [--jobs N] [--verbose] [--json out.json]

The variants compile in parallel, one process per CPU (at most 16), into the usual disk cache
(RAWFLUX_CACHE_DIR), so later compiles of the same variants (the tests, the first launch on a GPU)
read the cubins instead of compiling again.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import rawflux  # noqa: F401  (imports every op module, which registers its variants)
import rawflux.bench.timing  # noqa: F401  (registers the benchmark's delay kernel)
import rawflux.bench.ag_local  # noqa: F401  (registers the link emulator's kernel)
from rawflux.jit import CompileError, compile_cubin, kernel_source, variants


# ptxas: "(C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to ..."
# (C7512: registers; C7519: a wgmma commit / wait on a path ptxas cannot prove uniform; the text
# is the same for every reason)
_WGMMA_SERIALIZED = "wgmma.mma_async instructions are serialized"

# A worker process takes about a second to start (it imports rawflux): fewer compiles stay here.
_MIN_PARALLEL = 8


def default_jobs() -> int:
    """The CPUs this process may run on, at most 16 (a compile takes ~250 MB)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 16))


def _compile_one(task: tuple) -> tuple:
    """Compile one (relpath, name_expr, arch, extra_options); in a worker process or in this one.
    Returns ("ok", ptxas resources or None, wgmma-serialized advisories, symbol) or ("error", message)."""
    relpath, name_expr, arch, extra_options = task
    try:
        res = compile_cubin(kernel_source(relpath), arch=arch, name_expressions=(name_expr,), filename=relpath, extra_options=extra_options)
    except CompileError as e:
        return ("error", str(e))
    serialized = [line.strip() for line in res.log.splitlines() if _WGMMA_SERIALIZED in line]
    return ("ok", res.resources.get(res.lowered[name_expr]), serialized, res.lowered[name_expr])


def check(arch_filter=None, jobs: int = 1) -> tuple[list[dict], list[str]]:
    """(resource rows, problems) over every registered variant and architecture. jobs > 1 compiles
    in that many worker processes where there are at least _MIN_PARALLEL compiles (the workers
    inherit the environment, so RAWFLUX_CUDA_SRC and RAWFLUX_CACHE_DIR apply there too)."""
    tasks = [(v.relpath, v.name_expr, arch, v.extra_options)
             for v in variants() for arch in v.archs if not arch_filter or arch in arch_filter]
    jobs = min(jobs, len(tasks))
    if jobs > 1 and len(tasks) >= _MIN_PARALLEL:
        # spawn: a fresh interpreter per worker, safe whatever threads or CUDA state this one has
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(_compile_one, tasks))
    else:
        results = [_compile_one(t) for t in tasks]

    rows, problems = [], []
    for (_, name_expr, arch, _), result in zip(tasks, results):
        if result[0] == "error":  # every broken variant is reported in one run
            problems.append(f"{name_expr} [{arch}]: does not compile:\n{result[1]}")
            continue
        _, r, serialized, sym = result
        if r is None:
            problems.append(f"{name_expr} [{arch}]: no ptxas report for {sym}")
            continue
        rows.append({"kernel": name_expr, "arch": arch, **r})
        if r["spill_stores"] or r["spill_loads"] or r["stack"]:
            problems.append(f"{name_expr} [{arch}]: {r['stack']} B stack, {r['spill_stores']} B spill stores, {r['spill_loads']} B spill loads")
        if serialized:
            problems.append(f"{name_expr} [{arch}]: {serialized[0]}")
    return rows, problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", action="append", help="only this architecture (repeatable)")
    ap.add_argument("-j", "--jobs", type=int, default=default_jobs(), help="compile in this many processes (default: one per CPU, at most 16)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every variant's registers, stack, spills and smem")
    ap.add_argument("--json", help="write the resource table here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows, problems = check(args.arch, jobs=max(1, args.jobs))
    if args.verbose:
        for r in rows:
            print(f"{r['arch']:8s} regs={r['registers']:3d} stack={r['stack']:4d} spill={r['spill_stores']}/{r['spill_loads']} smem={r['smem']:6d}  {r['kernel']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    sys.stdout.flush()  # the table before the problems, where both go to one terminal or file
    if not rows and not problems:
        print("no kernel variants registered", file=sys.stderr)
        return 1
    for p in problems:
        print("FAIL", p, file=sys.stderr)
    print(f"check_kernels: {len(rows)} variants compiled, {len(problems)} problems ({time.perf_counter() - t0:.0f} s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
