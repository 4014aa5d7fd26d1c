"""BENCHMARKS.md, generated from the result JSON under benchmarks/results/.

    python benchmarks/report.py           # write BENCHMARKS.md
    python benchmarks/report.py --check   # exit 1 if BENCHMARKS.md differs from what it would write

Two kinds of JSON: benchmarks/gemm.py's grid ({"rows": [...]}: the newest by date is the current
one) and rawflux.bench runs ({"schema": "rawflux.bench/1", ...}). Of the bench runs, each row of a
table (op, world, emulated or not, shape, m) comes from the newest run that measured it; a file
that supplies nothing is superseded and reported (the repo keeps only current results). The
layer op's rows (rawflux.bench --op layer), where a run has any, get a table per phase.
The output depends on the JSON alone: no clock, no environment.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "BENCHMARKS.md"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gemm import CUBLAS, SHAPES_NK, ratios  # noqa: E402  (the grid and the ratio benchmarks/gemm.py prints)

from rawflux.bench.report import SCHEMA, derive  # noqa: E402  (the product's speedup definitions)

BIG_M, SMALL_M = 1024, 512
BAR_BIG_MIN, BAR_BIG_MEDIAN, BAR_SMALL_MIN = 0.95, 1.00, 0.90


# ---------------------------------------------------------------------------------------------
# loading


def load(results: Path = RESULTS) -> dict:
    """{"gemm": (file name, rows) or None, "bench": [(file name, meta, records)], "other": [names]}."""
    gemms, bench, other, tax, link, host, tuned = [], [], [], None, None, None, None
    for p in sorted(results.glob("*.json")):
        d = json.loads(p.read_text())
        if isinstance(d, dict) and d.get("kind") == "fusion-tax":
            tax = (p.name, d)
        elif isinstance(d, dict) and d.get("kind") == "ag-link-emu":
            link = (p.name, d)
        elif isinstance(d, dict) and d.get("kind") == "host-cost":
            host = (p.name, d)
        elif isinstance(d, dict) and d.get("kind") == "fused-tuned":
            tuned = (p.name, d)
        elif isinstance(d, dict) and "rows" in d:
            gemms.append((max((r.get("date", "") for r in d["rows"]), default=""), p.name, d["rows"]))
        elif isinstance(d, dict) and d.get("schema") == SCHEMA:
            bench.append((p.name, d.get("meta", {}), derive(d["records"])))
        else:
            other.append(p.name)
    gemm = max(gemms, key=lambda g: (g[0], g[1]))[1:] if gemms else None
    return {"gemm": gemm, "bench": bench, "other": other, "old_gemm": [g[1] for g in gemms if gemm and g[1] != gemm[0]], "tax": tax,
            "link": link, "host": host, "tuned": tuned}


def _run_date(records) -> str:
    return max(r["date"] for r in records)


def current_rows(bench) -> dict:
    """(op, world, emulated) -> {(shape, m): (file name, [records of that problem])}, each problem
    from the newest run that has it (barrier rows under shape "barrier", m 0; a dtype other than
    bf16 is part of the shape's name)."""
    out: dict = {}
    for name, _, recs in sorted(bench, key=lambda b: (_run_date(b[2]), b[0])):  # newer runs overwrite older
        probs: dict = {}
        for r in recs:
            shape = r.get("label", "") + ("" if r["dtype"] in ("bf16", "-") else f" {r['dtype']}")
            probs.setdefault((r["op"], r["world"], r["emulated"], shape, r["m"]), []).append(r)
        for (op, w, emu, shape, m), rows in probs.items():
            out.setdefault((op, w, emu), {})[(shape, m)] = (name, rows)
    return out


def superseded(data: dict) -> list[str]:
    """Result files no table draws on."""
    used = {name for table in current_rows(data["bench"]).values() for name, _ in table.values()}
    return sorted(data["old_gemm"] + data["other"] + [name for name, _, _ in data["bench"] if name not in used])


# ---------------------------------------------------------------------------------------------
# formatting


def _f(v, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def _short_commit(c) -> str:
    return str(c or "unknown")[:7]


def short_config(tag: str) -> str:
    """A config tag in the tables' words; '' for the 128x256 2x1-cluster data-parallel default."""
    mt = re.fullmatch(r"(\d+)x(\d+)x\d+s\d+c(\d+x\d+|1)(k\d)?w\d/(k\d+|sk|t\d+|b\d+|n\d+)/g\d+[mn]/p\d+", tag or "")
    if mt is None:
        return tag or ""
    bm, bn, cluster, ksplit, run = mt.groups()
    tile = f"{bm}x{bn} c{cluster}{ksplit or ''}"
    word = {"k1": "", "sk": "stream-K"}.get(run)
    if word is None:
        word = {"k": "k", "t": "tail ", "b": "band ", "n": "narrow "}[run[0]] + run[1:]
    if tile == "128x256 c2x1":
        return word
    return f"{tile} {word}".strip()


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def _median(xs):
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------------------------
# sections


METHOD = """\
## Method

- CUDA events around every timed call or region, after warm-up; the median of many iterations (the
  fused ops: per rank, then the slowest rank).
- Fresh random inputs, rotated over sets several times the 60 MB L2 in all.
- Device time: a delay kernel holds the stream while the host queues the timed calls; the fused
  ops' ranks start each region together at a device barrier.
- Every competitor in the same run (the GEMM's interleaved call by call); only ratios within a run
  are compared (the power cap makes the clock drift).
- GEMM ratio: rawflux TFLOP/s over the faster of torch.matmul and cupy.matmul (cuBLAS) at that point.
  Fused-op speedup: the best non-overlapped time (NCCL + cuBLAS, or IPC copy + cuBLAS) over the
  implementation's time, above 1 faster. Two runs of a build: ~0.3 % apart on the GEMM median.
"""


def gemm_section(gemm) -> list[str]:
    name, rows = gemm
    out = ["## rawflux.gemm against cuBLAS", ""]
    commits = sorted({_short_commit(r.get("commit")) for r in rows})
    dates = sorted({r.get("date", "") for r in rows})
    gpus = sorted({f"{r.get('gpu')}, driver {r.get('driver')}" for r in rows})
    out += [f"`benchmarks/results/{name}`: commit {', '.join(commits)}, {', '.join(dates)}, {'; '.join(gpus)}.",
            "Reproduce: `python benchmarks/gemm.py` (or `launch/gpu_suite.sh gemmbench`), then `python benchmarks/report.py`.",
            "Cells: ratio to the faster cuBLAS (rawflux TFLOP/s), then the config where it is not the 128x256 tile",
            "with a 2x1 cluster and no split (`kN` split-K, `c1k2` the k-split cluster pair, `tail N` split tail,",
            "`band N` banded stream-K, `narrow W` narrow last-wave columns). Shapes are n x k, B as (n, k).", ""]
    rat = ratios(rows)
    tf = {(r["dtype"], r["m"], r["n"], r["k"]): r["tflops"] for r in rows if r["impl"] == "rawflux"}
    for dt in sorted({p[0] for p in rat}, key=lambda d: (d != "bf16", d)):
        pts = {p: v for p, v in rat.items() if p[0] == dt}
        shapes = sorted({(p[2], p[3]) for p in pts}, key=lambda s: (SHAPES_NK.index(s) if s in SHAPES_NK else len(SHAPES_NK), s))
        ms = sorted({p[1] for p in pts})
        body = []
        for m in ms:
            cells = [str(m)]
            for n, k in shapes:
                v = pts.get((dt, m, n, k))
                if v is None:
                    cells.append("-")
                    continue
                note = short_config(v[1])
                cells.append(f"{v[0]:.2f} ({tf[(dt, m, n, k)]:.0f})" + (f" {note}" if note else ""))
            body.append(cells)
        out += [f"{dt}:", ""] + _table(["m"] + [f"{n}x{k}" for n, k in shapes], body) + [""]
        big = sorted((v[0], p) for p, v in pts.items() if p[1] >= BIG_M)
        small = sorted((v[0], p) for p, v in pts.items() if p[1] <= SMALL_M)
        line = f"{dt} summary:"
        if big:
            med = _median([v for v, _ in big])
            low, lp = big[0]
            met = low >= BAR_BIG_MIN and med >= BAR_BIG_MEDIAN
            line += (f" m >= {BIG_M}: median {med:.4f}, lowest {low:.3f} (m = {lp[1]}, {lp[2]}x{lp[3]}),"
                     f" {sum(v < BAR_BIG_MIN for v, _ in big)} of {len(big)} below {BAR_BIG_MIN:.2f}"
                     f" (target: none below {BAR_BIG_MIN:.2f}, median >= {BAR_BIG_MEDIAN:.2f}: {'met' if met else 'not met'});")
        if small:
            low, lp = small[0]
            line += (f" m <= {SMALL_M}: median {_median([v for v, _ in small]):.3f}, lowest {low:.3f} (m = {lp[1]}, {lp[2]}x{lp[3]}),"
                     f" {sum(v < BAR_SMALL_MIN for v, _ in small)} of {len(small)} below {BAR_SMALL_MIN:.2f}"
                     f" (target: none below {BAR_SMALL_MIN:.2f}: {'met' if low >= BAR_SMALL_MIN else 'not met'}).")
        out += [line, ""]
    return out


def _fastest(rows, role, impls=None):
    xs = [r for r in rows if r["role"] == role and (impls is None or r["impl"] in impls)]
    return min(xs, key=lambda r: r["ms"]) if xs else None


def _ms(rows, impl):
    r = next((r for r in rows if r["impl"] == impl), None)
    return r["ms"] if r else None


def _speed(rows, impl):
    r = next((r for r in rows if r["impl"] == impl), None)
    return r.get("speedup") if r else None


def _command(meta: dict, world: int, emulated: bool) -> str:
    args = list(meta.get("argv", [])[1:])
    if "--out-dir" in args:  # the run's own output folder, not part of the measurement
        i = args.index("--out-dir")
        del args[i:i + 2]
    mode = f"--emulate {world}" if emulated else f"-n {world}"
    return f"rawflux-launch {mode} -m rawflux.bench {' '.join(args)}".strip()


def _sources(names, bench, short: bool = False) -> list[str]:
    """A line per run file (its machine is the header's); short: its commit, date and command only."""
    meta = {name: (m, recs) for name, m, recs in bench}
    lines = []
    for name in sorted(set(names), key=lambda n: (_run_date(meta[n][1]), n)):
        m, recs = meta[name]
        r0 = recs[0]
        commits = ", ".join(sorted({_short_commit(r["commit"]) for r in recs}))
        if short:
            lines.append(f"- `{name}` ({commits}, {_run_date(recs)[:10]}): `{_command(m, r0['world'], r0['emulated'])}`")
            continue
        lines.append(f"- `benchmarks/results/{name}`: commit {commits}, {_run_date(recs)[:10]}, {r0['iters']} timed of {r0['warmup']} "
                     f"warm-up; `{_command(m, r0['world'], r0['emulated'])}`")
    return lines


def fused_real_section(cur, bench) -> list[str]:
    out = []
    for op, title in (("ag_gemm", "AllGather-GEMM"), ("gemm_rs", "GEMM-ReduceScatter"), ("gemm_ar", "GEMM + AllReduce")):
        for (o, w, emu), table in sorted(cur.items()):
            if o != op or emu:
                continue
            sample = next(iter(table.values()))[1][0]
            per_gpu = "one rank per GPU" if sample.get("ranks_per_gpu", 1) == 1 else f"{sample['ranks_per_gpu']} ranks per GPU"
            out += [f"### rawflux.{op}, {title}, W = {w}, {per_gpu}", ""]
            commits = [_short_commit(rows[0]["commit"]) for _, rows in table.values()]
            common = max(sorted(set(commits)), key=commits.count)
            out += [f"{sample['gpu']} x {w // sample.get('ranks_per_gpu', 1)}, one host, {per_gpu} ({', '.join(_versions(bench))}). Times in ms; shapes are the",
                    "model's (n, k), split over W " + ("along n." if op == "ag_gemm" else "along k.") +
                    f" Speedup: best non-overlapped / it. Commit {common} unless a row names another.", ""]
            bf16p = any(_ms(rows, "rawflux.bf16parts") is not None for _, rows in table.values())
            head = ["shape", "m", "rawflux"] + (["bf16 partials"] if bf16p else []) + [
                "NCCL+cuBLAS", "IPC+cuBLAS", "torch SymmMem", "rawflux.gemm alone", "cuBLAS alone",
                "speedup rawflux"] + (["speedup bf16 partials"] if bf16p else []) + ["speedup torch", "commit"]
            body = []
            for (label, m), (name, rows) in sorted(table.items(), key=_row_order):
                cub = _fastest(rows, "gemm", CUBLAS)
                body.append([label, str(m), _f(_ms(rows, "rawflux"))] + ([_f(_ms(rows, "rawflux.bf16parts"))] if bf16p else []) + [
                    _f(_ms(rows, "nccl+cublas")), _f(_ms(rows, "ipc+cublas")), _f(_ms(rows, "torch.symm_mem")),
                    _f(_ms(rows, "rawflux_gemm")), _f(cub["ms"] if cub else None), _f(_speed(rows, "rawflux"), ".2f")]
                    + ([_f(_speed(rows, "rawflux.bf16parts"), ".2f")] if bf16p else [])
                    + [_f(_speed(rows, "torch.symm_mem"), ".2f"), "" if _short_commit(rows[0]["commit"]) == common else _short_commit(rows[0]["commit"])])
            out += _table(head, body) + [""] + _summary(table, bf16p) + ["", "Runs:"] + _sources([n for n, _ in table.values()], bench) + [""]
    return out


def _row_order(item):
    (label, m), _ = item
    return (not label.startswith("paper."), label, m)  # the paper's shape first


def _summary(table, bf16p) -> list[str]:
    lines = []
    for impl, what in (("rawflux", "rawflux"), ("rawflux.bf16parts", "rawflux with bf16 partials"), ("torch.symm_mem", "torch SymmMem")):
        if impl == "rawflux.bf16parts" and not bf16p:
            continue
        big = [_speed(rows, impl) for (_, m), (_, rows) in table.items() if m >= BIG_M and _speed(rows, impl) is not None]
        small = [_speed(rows, impl) for (_, m), (_, rows) in table.items() if 0 < m <= SMALL_M and _speed(rows, impl) is not None]
        if big:
            lines.append(f"- {what}: speedup {min(big):.2f}-{max(big):.2f} (median {_median(big):.2f}) at m >= {BIG_M}"
                         + (f", {min(small):.2f}-{max(small):.2f} at m <= {SMALL_M}" if small else "") + ".")
    return lines


def _versions(bench) -> list[str]:
    vs = {}
    for _, meta, _ in bench:
        for k, v in sorted(meta.get("versions", {}).items()):
            if k in ("cupy", "torch", "nccl"):
                vs.setdefault(k, set()).add(str(v))
    return [f"{k} {', '.join(sorted(v))}" for k, v in sorted(vs.items())]


def barrier_section(cur, bench) -> list[str]:
    rows, names, inner = [], [], set()
    for (op, w, emu), table in sorted(cur.items()):
        if op != "barrier":
            continue
        for _, (name, recs) in sorted(table.items()):
            names.append(name)
            for r in sorted(recs, key=lambda r: r["impl"]):
                inner.add(str(r.get("inner", 1)))
                rows.append([r["impl"], str(w), "emulated node (correctness only)" if emu else "one rank per GPU",
                             f"{r['us'] if r.get('us') is not None else r['ms'] * 1e3:.2f}", _short_commit(r["commit"])])
    if not rows:
        return []
    return (["### Device barrier", "",
             f"Per barrier, from {' / '.join(sorted(inner))} back-to-back barriers in one timed region (median over iterations, us).",
             "The emulated node's figure is for correctness only: it shows that the barrier runs there.", ""]
            + _table(["impl", "W", "where", "us per barrier", "commit"], rows) + ["", "Runs:"] + _sources(names, bench) + [""])


LAYER_PHASES = (("train", "Training step (forward + backward, sequence parallel)"), ("prefill", "Prefill (forward, sequence parallel)"),
                ("decode", "Decode step (forward, no sequence parallelism)"))


def _failed(bench) -> set:
    """(file name, label, world, m, impl) of the rows a run's correctness guard refused (meta.failed)."""
    return {(name, f["label"], f["world"], f["m"], f["impl"]) for name, meta, _ in bench for f in meta.get("failed", [])}


def layer_section(cur, bench) -> list[str]:
    """The layer op's steps: a small table per phase, real GPUs' rows first, then the emulated node's."""
    failed = _failed(bench)
    tables = {ph: [] for ph, _ in LAYER_PHASES}
    names, emulated = [], set()
    for (op, w, emu), table in sorted(cur.items(), key=lambda kv: (kv[0][2], kv[0][1])):
        if op != "layer":
            continue
        if emu:
            emulated.add(w)
        for (_, m), (name, recs) in sorted(table.items(), key=_row_order):
            names.append(name)
            r0 = recs[0]
            shape = r0["label"].rsplit(".", 1)[0] + ("" if r0["dtype"] == "bf16" else f" {r0['dtype']}")

            def cell(impl, spec=".3f", value=_ms):
                return "FAILED" if (name, r0["label"], w, m, impl) in failed else _f(value(recs, impl), spec)

            tables.setdefault(r0.get("phase"), []).append(
                [str(w), "emulated" if emu else "GPUs", shape, str(m), cell("rawflux"), cell("nonoverlap"), cell("torch_async_tp"),
                 _f(_ms(recs, "gemm_only")), cell("rawflux", ".2f", _speed), cell("torch_async_tp", ".2f", _speed),
                 cell("rawflux", ".3f", _exposed), _short_commit(r0["commit"])])
    if not names:
        return []
    out = ["## Tensor-parallel layer steps", "",
           "A Llama-shaped block's TP linear layers (attention replaced by an elementwise op) timed as model steps by",
           "`rawflux.bench --op layer`. Device ms per step; speedup: non-overlapped / that row; GEMM only (cuBLAS): the",
           "lower bound; exposed: rawflux - GEMM only; FAILED: did not match the non-overlapped step (not timed).", ""]
    if emulated:
        out += [f"**SINGLE-GPU EMULATION, NOT MULTI-GPU RESULTS** in the rows marked emulated (W = {', '.join(map(str, sorted(emulated)))}):",
                "correctness-only timings, W ranks on one GPU with no link to hide.", ""]
    head = ["W", "where", "shape", "m", "rawflux", "non-overlapped", "torch async-TP", "GEMM only", "speedup rawflux",
            "speedup torch", "exposed", "commit"]
    for phase, what in LAYER_PHASES:
        if tables.get(phase):
            out += [f"{what}:", ""] + _table(head, tables[phase]) + [""]
    return out + ["Runs:"] + _sources(names, bench) + [""]


def _exposed(rows, impl):
    r = next((r for r in rows if r["impl"] == impl), None)
    return r.get("exposed_ms") if r else None


def emulated_section(cur, bench) -> list[str]:
    names, worlds, ops = [], set(), set()
    for (op, w, emu), table in sorted(cur.items()):
        if not emu or op in ("barrier", "layer"):
            continue
        worlds.add(w)
        ops.add(op)
        names += [name for (name, _) in table.values()]
    if not names:
        return []
    return (["## Emulated node: correctness-only runs", "",
             "**SINGLE-GPU EMULATION, NOT MULTI-GPU RESULTS.** W ranks share one GPU under MPS, each capped at 1/W of its",
             "SMs, and the \"communication\" is copies inside one GPU's memory: there is no link to hide. These runs only",
             f"show that {', '.join(sorted(ops))} run at W = {', '.join(map(str, sorted(worlds)))} on the benchmark's shapes; their",
             "times are in the JSON, not here (the link emulator is the one-GPU measure of overlap).", "",
             "Runs (under `benchmarks/results/`):"]
            + _sources(names, bench, short=True) + [""])


def _by_m(rows, cell, nk: bool = True) -> tuple[list, list]:
    ms = sorted({r["m"] for r in rows})
    cells: dict = {}
    for r in rows:
        key = (r["world"], r["shape"], r["n"], r["k"])
        cells[key] = cells.get(key, {}) | {r["m"]: cell(r)}
    return ms, [[str(w), shape] + ([f"{n} x {k}"] if nk else []) + [c.get(m, "-") for m in ms]
                for (w, shape, n, k), c in sorted(cells.items())]


def _stamp(name, rows) -> str:
    """Where a table's rows come from: each commit with its GPU and date (rows of several runs)."""
    runs = sorted({(r.get("date", ""), _short_commit(r.get("commit")), (str(r.get("gpu", "")).removeprefix("NVIDIA ").split() or [""])[0]) for r in rows})
    return f"`benchmarks/results/{name}`: " + "; ".join(f"{c} on {g}, {d}" for d, c, g in runs) + "."


def tax_section(tax, link=None) -> list[str]:
    name, d = tax
    bars = d.get("bar", 1.03)
    bars = bars if isinstance(bars, dict) else {"gemm_rs": bars}
    out = ["## The fusion tax (one GPU, no link)", "",
           "Each fused kernel, nothing to wait for, against rawflux.gemm's pick (`python benchmarks/fusion_tax.py`).", ""]
    rs = [r for r in d["rows"] if r.get("op", "gemm_rs") == "gemm_rs"]
    if rs:
        bar = bars.get("gemm_rs", 1.03)
        ms, table = _by_m(rs, lambda r: f"{r['ratio']:.2f} ({r['fused_ms'] / r['same_tile_gemm_ms']:.2f})"
                          if r.get("same_tile_gemm_ms") else f"{r['ratio']:.2f}", nk=False)
        over = sum(r["ratio"] > bar for r in rs)
        out += [f"GEMM-ReduceScatter, {_stamp(name, rs)} World W, peers' buffers in local memory. Cells: fused /",
                f"rawflux.gemm (fused / the plain GEMM on the fused configuration). Bar <= {bar}.", ""]
        out += _table(["W", "layer"] + [f"m = {m}" for m in ms], table)
        out += ["", f"{len(rs) - over} of {len(rs)} points within the bar; worst {max(r['ratio'] for r in rs):.3f}.", ""]
    ag = [r for r in d["rows"] if r.get("op") == "ag_gemm"]
    if ag:
        bar = bars.get("ag_gemm", 1.02)
        ms, table = _by_m(ag, lambda r: f"{r['ratio']:.2f} ({r['fused_ms'] / r['same_tile_gemm_ms']:.2f})", nk=False)
        over = sum(r["ratio"] > bar for r in ag)
        out += [f"AllGather-GEMM, {_stamp(name, ag)} Rank 0's GEMM, every chunk landed. Cells as above. Bar <= {bar}.", ""]
        out += _table(["W", "layer"] + [f"m = {m}" for m in ms], table)
        out += ["", f"{len(ag) - over} of {len(ag)} points within the bar; worst {max(r['ratio'] for r in ag):.3f}.", ""]
    ar = [r for r in d["rows"] if r.get("op") == "gemm_ar"]
    if ar:
        bar = bars.get("gemm_ar", 1.05)
        over = sum(r["ratio"] > bar for r in ar)
        span = lambda rs: f"{min(r['ratio'] for r in rs):.2f}-{max(r['ratio'] for r in rs):.2f}" if rs else "-"  # noqa: E731
        table = [[str(w), span([r for r in ar if r["world"] == w and r["m"] <= 128]),
                  span([r for r in ar if r["world"] == w and r["m"] > 128])] for w in sorted({r["world"] for r in ar})]
        out += [f"GEMM + AllReduce, {_stamp(name, ar)} Rank 0's kernel, peers local, GEMM-RS's layers,",
                f"m = {', '.join(str(m) for m in sorted({r['m'] for r in ar}))}. Cells: fused / rawflux.gemm. Bar <= {bar}.", ""]
        out += _table(["W", "m <= 128", "m > 128"], table)
        out += ["", f"{len(ar) - over} of {len(ar)} points within the bar; worst {max(r['ratio'] for r in ar):.3f}.", ""]
    if link:
        lname, ld = link
        rows = ld["rows"]
        bar, from_m = ld.get("bar", 1.03), ld.get("from_m", 1024)
        gbps = sorted({r["link_gbps"] for r in rows})
        ms, table = _by_m(rows, lambda r: f"{r['ratio']:.2f} ({r.get('whole_chunks_ms', r['fused_ms']) / r['bound_ms']:.2f})", nk=False)
        over = sum(r["ratio"] > bar and r["m"] >= from_m for r in rows)
        out += ["## AllGather-GEMM behind an emulated link (one GPU)", "",
                f"{_stamp(lname, rows)} Flags released when a {', '.join(f'{g:g}' for g in gbps)} GB/s link would deliver",
                "the chunks (rawflux/bench/ag_local.py). Cells: fused (k-slabs) / max(rawflux.gemm, T_gather)",
                f"(whole chunks). Bar <= {bar} at m >= {from_m}.", ""]
        out += _table(["W", "layer"] + [f"m = {m}" for m in ms], table)
        out += ["", f"{sum(r['m'] >= from_m for r in rows) - over} of {sum(r['m'] >= from_m for r in rows)} points within the bar; "
                f"worst {max(r['ratio'] for r in rows):.3f}.", ""]
    return out


def host_section(host) -> list[str]:
    name, d = host
    rows = d["records"]
    cols = sorted({(r["world"], r["m"]) for r in rows})
    cell = {(r["op"], r["form"], r["world"], r["m"]): r for r in rows}
    forms = sorted({(r["op"], r["form"]) for r in rows}, key=lambda f: (f[0] != "torch", f[0] != "gemm", f))
    table = []
    for op, form in forms:
        bar = next((r["bar_us"] for r in rows if (r["op"], r["form"]) == (op, form)), None)
        table.append([f"{op} {form}", "-" if bar is None else f"{bar:g}"]
                     + [_f(cell[(op, form, w, m)]["host_us"], ".1f") if (op, form, w, m) in cell else "" for w, m in cols])
    over = sum(r["bar_us"] is not None and r["host_us"] > r["bar_us"] for r in rows)
    emu = any(r.get("emulated") for r in rows)
    return ["## Host time per call", "",
            f"{_stamp(name, rows)} `python benchmarks/host_cost.py`: torch inputs, out= given, n = k = {rows[0]['n']};",
            "host us per call" + (" (W > 1: ranks sharing one GPU)" if emu else "") + ".", ""] + \
        _table(["call", "bar"] + [f"W={w} m={m}" for w, m in cols], table) + \
        ["", f"{sum(r['bar_us'] is not None for r in rows) - over} of {sum(r['bar_us'] is not None for r in rows)} within the bar.", ""]


def tuned_section(tuned) -> list[str]:
    """One line per (op, mode): points within noise, picks the tuner changed, the ratios."""
    name, d = tuned
    rows = d["rows"]
    lines = ["## Fused ops tuned against untuned (one GPU)", "",
             f"{_stamp(name, rows)} `python benchmarks/fusion_tax.py --tuned`: tuned / untuned time per point.", ""]
    table = []
    for op, mode in sorted({(r["op"], r["mode"]) for r in rows}):
        rs = [r for r in rows if (r["op"], r["mode"]) == (op, mode)]
        ok = sum(r["ratio"] <= 1 + r["noise"] for r in rs)
        changed = sum(r["tuned_config"] != r["untuned_config"] for r in rs)
        table.append([f"{op} {mode}", f"{ok}/{len(rs)}", str(changed), _f(min(r["ratio"] for r in rs)), _f(max(r["ratio"] for r in rs))])
    return lines + _table(["op", "within noise", "pick changed", "best", "worst"], table) + [""]


def render(results: Path = RESULTS) -> str:
    data = load(results)
    cur = current_rows(data["bench"])
    machines = sorted({f"{r['gpu']}, driver {r['driver']}" for _, _, recs in data["bench"] for r in recs}
                      | ({f"{r.get('gpu')}, driver {r.get('driver')}" for r in data["gemm"][1]} if data["gemm"] else set()))
    out = ["# Benchmarks", "",
           "Generated by `python benchmarks/report.py` from `benchmarks/results/*.json` (a CPU test checks it);",
           "decisions: `docs/decisions.md`. To update: swap a JSON in `benchmarks/results/`, rerun.", "",
           f"Machine: {'; '.join(machines)}" + (f"; {', '.join(_versions(data['bench']))}" if data["bench"] else "") + ".", "",
           METHOD]
    if data["gemm"]:
        out += gemm_section(data["gemm"])
    if data["tax"]:
        out += tax_section(data["tax"], data["link"])
    if data["host"]:
        out += host_section(data["host"])
    if data["tuned"]:
        out += tuned_section(data["tuned"])
    if any(not emu and op in ("ag_gemm", "gemm_rs", "gemm_ar") for op, _, emu in cur):
        out += ["## Fused ops on real GPUs", ""]
        out += fused_real_section(cur, data["bench"])
    out += barrier_section(cur, data["bench"])  # a part of the real GPUs' section
    out += layer_section(cur, data["bench"])
    out += emulated_section(cur, data["bench"])
    text = "\n".join(out).rstrip("\n") + "\n"
    return re.sub(r"\n{3,}", "\n\n", text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if BENCHMARKS.md is not what this would write")
    args = ap.parse_args(argv)
    text = render()
    stale = superseded(load())
    if stale:
        print(f"superseded result files (no table uses them): {', '.join(stale)}", file=sys.stderr)
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.name} is out of date: run python benchmarks/report.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text.encode())} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
