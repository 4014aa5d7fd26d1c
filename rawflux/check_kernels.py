"""CPU check: compile every registered kernel variant to cubin for each of its architectures and
fail on any register spill, local-memory stack frame or serialized wgmma (ptxas advisory C7512, C7519:
the wgmma of a kernel then run one at a time, a silent large slowdown). Needs NVRTC, no GPU.

    python -m rawflux.check_kernels [--arch sm_90a] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys

import rawflux  # noqa: F401  (imports every op module, which registers its variants)
import rawflux.bench.timing  # noqa: F401  (registers the benchmark's delay kernel)
from rawflux.jit import CompileError, compile_cubin, kernel_source, variants


# ptxas: "(C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to ..."
# (C7512: registers; C7519: a wgmma commit / wait on a path ptxas cannot prove uniform; the text
# is the same for every reason)
_WGMMA_SERIALIZED = "wgmma.mma_async instructions are serialized"


def check(arch_filter=None) -> tuple[list[dict], list[str]]:
    rows, problems = [], []
    for v in variants():
        for arch in v.archs:
            if arch_filter and arch not in arch_filter:
                continue
            try:
                res = compile_cubin(kernel_source(v.relpath), arch=arch, name_expressions=(v.name_expr,), filename=v.relpath, extra_options=v.extra_options)
            except CompileError as e:  # report every broken variant in one run
                problems.append(f"{v.name_expr} [{arch}]: does not compile:\n{e}")
                continue
            sym = res.lowered[v.name_expr]
            r = res.resources.get(sym)
            if r is None:
                problems.append(f"{v.name_expr} [{arch}]: no ptxas report for {sym}")
                continue
            rows.append({"kernel": v.name_expr, "arch": arch, **r})
            if r["spill_stores"] or r["spill_loads"] or r["stack"]:
                problems.append(f"{v.name_expr} [{arch}]: {r['stack']} B stack, {r['spill_stores']} B spill stores, {r['spill_loads']} B spill loads")
            serialized = [line.strip() for line in res.log.splitlines() if _WGMMA_SERIALIZED in line]
            if serialized:
                problems.append(f"{v.name_expr} [{arch}]: {serialized[0]}")
    return rows, problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", action="append", help="only this architecture (repeatable)")
    ap.add_argument("--json", help="write the resource table here")
    args = ap.parse_args(argv)
    rows, problems = check(args.arch)
    for r in rows:
        print(f"{r['arch']:8s} regs={r['registers']:3d} stack={r['stack']:4d} spill={r['spill_stores']}/{r['spill_loads']} smem={r['smem']:6d}  {r['kernel']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if not rows:
        print("no kernel variants registered", file=sys.stderr)
        return 1
    for p in problems:
        print("FAIL", p, file=sys.stderr)
    print(f"{len(rows)} variants compiled, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
