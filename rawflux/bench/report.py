"""Records, derived columns, the printed table and the JSON file. No GPU needed here.

One record per (problem, impl). ``ms`` is the median over iterations of one rank's CUDA-event
times, then the maximum over ranks. ``tflops`` is per GPU: 2 m n k / W / time.
Derived, per problem, for "fused" and "nonoverlap" rows (docs/ARCHITECTURE.md):
  speedup     = non-overlapped ms / this ms
  exposed_ms  = this ms - GEMM alone ms     (the communication the op failed to hide; none at world 1)
  overlap_eff = 1 - exposed_ms / communication-alone ms   (none at world 1)
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import re
from pathlib import Path

SCHEMA = "rawflux.bench/1"

# field -> accepted types (None: JSON null allowed)
REQUIRED = {
    "op": (str,),
    "impl": (str,),
    "role": (str,),
    "world": (int,),
    "m": (int,),
    "n": (int,),
    "k": (int,),
    "dtype": (str,),
    "ms": (float, int),
    "tflops": (float, int, type(None)),
    "gpu": (str,),
    "driver": (str,),
    "commit": (str, type(None)),
    "date": (str,),
    "emulated": (bool,),
}
DERIVED = ("speedup", "exposed_ms", "overlap_eff")


def problem_key(rec: dict) -> tuple:
    return (rec["op"], rec.get("label", ""), rec["world"], rec["m"], rec["n"], rec["k"], rec["dtype"])


def derive(records: list[dict]) -> list[dict]:
    """Fill speedup / exposed_ms / overlap_eff (None where an ingredient is missing) in place on
    every fused and nonoverlap record; returns ``records``."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(problem_key(r), []).append(r)
    for rows in groups.values():
        base = _fastest(r for r in rows if r["role"] == "nonoverlap")
        comm = _fastest(r for r in rows if r["role"] == "comm")
        gemms = {r["impl"]: r for r in rows if r["role"] == "gemm"}
        for r in rows:
            if r["role"] not in ("fused", "nonoverlap"):
                continue
            ref = gemms.get(r.get("gemm_ref")) if r.get("gemm_ref") else None
            gemm = ref if ref is not None else _fastest(gemms.values())
            r["speedup"] = base["ms"] / r["ms"] if base is not None and r["ms"] > 0 else None
            # world 1 communicates nothing: nothing is exposed or overlapped (printed "-")
            r["exposed_ms"] = r["ms"] - gemm["ms"] if gemm is not None and r["world"] > 1 else None
            r["overlap_eff"] = (
                1.0 - r["exposed_ms"] / comm["ms"] if r["exposed_ms"] is not None and comm is not None and comm["ms"] > 0 else None
            )
            r["gemm_ref_used"] = gemm["impl"] if gemm is not None else None
    return records


def _fastest(rows):
    rows = [r for r in rows if r.get("ms") is not None]
    return min(rows, key=lambda r: r["ms"]) if rows else None


def tflops(flops: float, ms: float) -> float | None:
    return flops / (ms * 1e-3) / 1e12 if ms and ms > 0 and flops else None


def bus_gbps(elems: int, itemsize: int, world: int, ms: float) -> float | None:
    """NCCL-tests' bus bandwidth for an all-gather / reduce-scatter whose full buffer is
    ``elems`` elements: algorithm bandwidth (bytes / time) times (W - 1) / W."""
    if not ms or ms <= 0:
        return None
    return elems * itemsize / (ms * 1e-3) / 1e9 * (world - 1) / world


def validate(rec: dict) -> list[str]:
    """Problems with one record against the schema (empty list: valid)."""
    errs = []
    for field, types in REQUIRED.items():
        if field not in rec:
            errs.append(f"missing {field}")
        elif isinstance(rec[field], bool) and bool not in types:
            errs.append(f"{field}: bool where {types} expected")
        elif not isinstance(rec[field], types):
            errs.append(f"{field}: {type(rec[field]).__name__} where {'/'.join(t.__name__ for t in types)} expected")
    ms = rec.get("ms")
    if isinstance(ms, (int, float)) and not (math.isfinite(ms) and ms > 0):
        errs.append(f"ms: {ms} is not a positive finite time")
    if rec.get("date") and not re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", str(rec["date"])):
        errs.append(f"date: {rec['date']!r} is not ISO 8601")
    return errs


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "gpu"


def write_json(records: list[dict], out_dir, meta: dict) -> Path:
    """One file per run: {"schema", "meta", "records"}; the name carries time, GPU, world, ops."""
    for r in records:
        errs = validate(r)
        if errs:
            raise ValueError(f"record {r.get('op')}/{r.get('impl')} does not fit the schema: {'; '.join(errs)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    first = records[0] if records else {}
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    ops = "-".join(sorted({r["op"] for r in records})) or "none"
    name = f"{stamp}_{_slug(first.get('gpu', 'gpu'))}_w{first.get('world', 0)}{'_emu' if first.get('emulated') else ''}_{ops}"
    path = out / f"{name}.json"
    n = 1
    while path.exists():
        n += 1
        path = out / f"{name}_{n}.json"
    path.write_text(json.dumps({"schema": SCHEMA, "meta": meta, "records": records}, indent=1, default=_json_default) + "\n")
    return path


def _json_default(x):
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    raise TypeError(f"cannot write {type(x).__name__} to JSON")


def _fmt(v, spec: str) -> str:
    if v is None:
        return "-"
    return format(v, spec)


def format_table(records: list[dict]) -> str:
    """A plain-text table, one line per record, problems separated by a blank line."""
    head = f"{'op':8s} {'shape':22s} {'W':>2s} {'m':>6s} {'n':>6s} {'k':>6s} {'dt':4s} {'impl':22s} {'role':10s} " \
           f"{'ms':>9s} {'TFLOP/s':>8s} {'GB/s':>7s} {'speedup':>7s} {'expo ms':>8s} {'overlap':>7s} {'host us':>7s}"
    lines = [head, "-" * len(head)]
    last = None
    for r in records:
        key = problem_key(r)
        if last is not None and key != last:
            lines.append("")
        last = key
        if r["role"] == "barrier":
            lines.append(
                f"{r['op']:8s} {'-':22s} {r['world']:>2d} {'':>6s} {'':>6s} {'':>6s} {'':4s} {r['impl']:22s} {r['role']:10s} "
                f"{r['ms'] * 1e3:>7.2f}us"
            )
            continue
        lines.append(
            f"{r['op']:8s} {r.get('label', '')[:22]:22s} {r['world']:>2d} {r['m']:>6d} {r['n']:>6d} {r['k']:>6d} {r['dtype']:4s} "
            f"{r['impl'][:22]:22s} {r['role']:10s} {r['ms']:>9.4f} {_fmt(r.get('tflops'), '8.1f'):>8s} "
            f"{_fmt(r.get('gbps'), '7.1f'):>7s} {_fmt(r.get('speedup'), '7.3f'):>7s} {_fmt(r.get('exposed_ms'), '8.4f'):>8s} "
            f"{_fmt(r.get('overlap_eff'), '7.3f'):>7s} {_fmt(r['host_ms'] * 1e3 if r.get('host_ms') is not None else None, '7.1f'):>7s}"
        )
    return "\n".join(lines)
