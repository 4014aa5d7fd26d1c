"""Compare benchmarks/gemm.py runs point by point: each run's rawflux ratio (to the faster of
torch.matmul / cupy.matmul in that same run) at every (dtype, m, n, k), then each run's median
and lowest ratio and its median difference to the first run.

    python benchmarks/tools/gemm_compare.py base.json new.json [base2.json ...] [--labels a,b,c]

Ratios compare across runs (each is against cuBLAS in its own process); raw TFLOP/s do not, since
the GPU's clock drifts between processes. Two runs of one build differ by ~0.3 % on the median.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gemm import CUBLAS, Point, ratios  # noqa: E402,F401  (the ratio benchmarks/gemm.py reports)


def compare(runs: dict[str, dict[Point, tuple[float, str]]]) -> tuple[list[str], list[str]]:
    """(table lines, summary lines) for the runs, keyed by label in order; the first is the base."""
    labels = list(runs)
    base = runs[labels[0]]
    points = sorted({p for r in runs.values() for p in r})
    table = ["dtype m n k | " + " ".join(f"{lab:>8s}" for lab in labels) + " | config of " + labels[0]]
    for p in points:
        cells = [f"{runs[lab][p][0]:8.3f}" if p in runs[lab] else f"{'-':>8s}" for lab in labels]
        table.append(f"{p[0]} {p[1]} {p[2]} {p[3]} | " + " ".join(cells) + " | " + (base[p][1] if p in base else "-"))
    summary = []
    for lab in labels:
        vals = [v for v, _ in runs[lab].values()]
        if not vals:
            summary.append(f"{lab}: no rawflux rows")
            continue
        line = f"{lab}: {len(vals)} points, median {statistics.median(vals):.3f}, lowest {min(vals):.3f}"
        if lab != labels[0]:
            common = [p for p in runs[lab] if p in base]
            if common:
                diffs = [runs[lab][p][0] - base[p][0] for p in common]
                better = sum(d > 0.005 for d in diffs)
                worse = sum(d < -0.005 for d in diffs)
                line += (f"; against {labels[0]} on {len(common)} common points: median {statistics.median(diffs):+.3f}, "
                         f"{better} above / {worse} below by more than 0.005")
        summary.append(line)
    return table, summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="benchmarks/gemm.py --json files; the first is the base")
    ap.add_argument("--labels", default="", help="comma-separated labels (default: the file names)")
    args = ap.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [Path(f).stem for f in args.runs]
    if len(labels) != len(args.runs):
        ap.error(f"{len(labels)} labels for {len(args.runs)} runs")
    if len(set(labels)) != len(labels):
        ap.error(f"labels must differ: {labels}")
    runs = {}
    for lab, f in zip(labels, args.runs):
        try:
            runs[lab] = ratios(json.loads(Path(f).read_text())["rows"])
        except (OSError, ValueError, KeyError) as e:
            print(f"{f}: cannot read a gemm.py result ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
    table, summary = compare(runs)
    print("\n".join(table + [""] + summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
