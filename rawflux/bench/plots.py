"""Charts of the benchmark results and of GEMM-ReduceScatter's schedule. No GPU needed here.

    from rawflux.bench import plots
    fig = plots.gemm_figure(json.load(open("benchmarks/results/gemm.json"))["rows"])
    for title, fig in plots.performance_report("benchmarks/results"):
        fig.savefig(title.replace(" ", "_") + ".png")

Every function returns ``matplotlib.figure.Figure`` objects built without pyplot (an Agg canvas:
no display, no global figure registry; in Jupyter run ``%matplotlib inline`` once, then a figure
shows as the last expression of a cell or with ``display(fig)``). matplotlib is imported inside
the functions, so ``import rawflux`` never needs it. The plotted numbers stay in the figures:
``ax.get_lines()[i].get_xydata()`` (lines carry labels; those starting with "_" are guides such as
the 1.0 or bar lines) and ``ax.get_images()[0].get_array()`` for the schedule's image.
"""
from __future__ import annotations

import json
from pathlib import Path

EMULATED_TITLE = "emulated node (correctness only)"
CUBLAS = ("torch.matmul", "cupy.matmul")
ROLE_NAMES = {"nonoverlap": "non-overlapped", "gemm": "GEMM alone", "comm": "comm alone", "fused": "fused"}
ROLE_ORDER = {"nonoverlap": 0, "gemm": 1, "comm": 2, "fused": 3}
ROLE_STYLE = {"nonoverlap": "--", "gemm": ":", "comm": "-.", "fused": "-"}


def _figure(**kw):
    """A Figure on an Agg canvas (no pyplot, no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kw)
    FigureCanvasAgg(fig)
    return fig


def _log2_x(ax, xs):
    ax.set_xscale("log", base=2)
    xs = sorted({int(x) for x in xs if x})
    if xs:
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs], fontsize=7)
        ax.minorticks_off()


# ------------------------------------------------------------------------------------------------
# rawflux.gemm against cuBLAS


def gemm_ratios(rows, dtype: str = "bf16", impl: str = "rawflux") -> dict:
    """{(n, k): [(m, ratio), ...]}: impl's TFLOP/s over the faster of torch.matmul / cupy.matmul
    (benchmarks/gemm.py's ratio), for one dtype, m ascending."""
    best: dict = {}
    for r in rows:
        if r.get("dtype") == dtype and r["impl"] in CUBLAS and r.get("tflops"):
            key = (r["m"], r["n"], r["k"])
            best[key] = max(best.get(key, 0.0), r["tflops"])
    out: dict = {}
    for r in rows:
        key = (r["m"], r["n"], r["k"])
        if r.get("dtype") == dtype and r["impl"] == impl and r.get("tflops") and best.get(key):
            out.setdefault((r["n"], r["k"]), []).append((r["m"], r["tflops"] / best[key]))
    return {s: sorted(v) for s, v in sorted(out.items())}


def gemm_figure(rows, dtype: str = "bf16", title: str | None = None):
    """rawflux.gemm TFLOP/s over the faster cuBLAS against m (log2), one line per (n, k) shape."""
    series = gemm_ratios(rows, dtype)
    fig = _figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.add_subplot()
    for (n, k), pts in series.items():
        ax.plot([m for m, _ in pts], [v for _, v in pts], marker="o", ms=3, lw=1.2, label=f"{n} x {k}")
    ax.axhline(1.0, color="k", ls="--", lw=0.8, label="_cuBLAS")
    _log2_x(ax, [m for pts in series.values() for m, _ in pts])
    ax.set_xlabel("m")
    ax.set_ylabel("rawflux / best cuBLAS (TFLOP/s)")
    ax.set_title(title or f"rawflux.gemm against cuBLAS, {dtype} (n x k)")
    if series:
        ax.legend(fontsize=7, ncol=2, title="n x k", title_fontsize=7)
    return fig


# ------------------------------------------------------------------------------------------------
# fused ops: one run's impls against m


def _load(obj):
    if isinstance(obj, dict):
        return "<dict>", obj
    p = Path(obj)
    return p.name, json.loads(p.read_text())


def is_emulated(rec: dict, meta: dict | None = None) -> bool:
    """An emulated node: several ranks share one GPU (record's emulated / ranks_per_gpu, or meta's)."""
    meta = meta or {}
    return bool(rec.get("emulated") or (rec.get("ranks_per_gpu") or 1) > 1
                or meta.get("emulated") or (meta.get("ranks_per_gpu") or 1) > 1)


def _impl_name(rec: dict) -> str:
    role = rec["role"]
    if role == "fused":
        what = "torch async-TP" if rec["impl"].startswith("torch") else "rawflux"
    else:
        what = ROLE_NAMES.get(role, role)
    return f"{rec['impl']} ({what})"


def fused_figures(bench_files) -> list:
    """[(title, Figure)]: per run file and op (and world, emulated or not: never mixed in one
    figure), one subplot per shape with every impl's time (ms) against m, as the FLUX paper's
    Figure 4. Emulated runs carry "emulated node (correctness only)" in their titles."""
    from .report import derive

    out = []
    for f in bench_files:
        name, d = _load(f)
        meta = d.get("meta", {})
        recs = derive([dict(r) for r in d.get("records", [])])
        groups: dict = {}
        for r in recs:
            if r.get("role") == "barrier" or r["op"] == "barrier" or not r.get("m"):
                continue
            groups.setdefault((r["op"], r["world"], is_emulated(r, meta)), []).append(r)
        for (op, world, emu), rows in sorted(groups.items()):
            shapes = sorted({r.get("label", "") or f"{r['n']}x{r['k']}" for r in rows},
                            key=lambda s: (not s.startswith("paper."), s))
            sample = rows[0]
            if emu:
                where = f"{EMULATED_TITLE}: {sample.get('ranks_per_gpu', world)} ranks on one {sample.get('gpu', 'GPU')}"
            else:
                where = f"{sample.get('gpu', 'GPU')} x {world}, one rank per GPU"
            title = f"{op} W={world}, {where} ({name})"
            head = f"{op} W={world}, {where}\n{name}"
            ncol = min(3, len(shapes))
            nrow = -(-len(shapes) // ncol)
            fig = _figure(figsize=(max(6.0, 4.6 * ncol), 3.6 * nrow + 0.8), layout="constrained")
            fig.suptitle(head, fontsize=10)
            axes = fig.subplots(nrow, ncol, squeeze=False).ravel()
            for ax, shape in zip(axes, shapes):
                sub = [r for r in rows if (r.get("label", "") or f"{r['n']}x{r['k']}") == shape]
                impls = sorted({(ROLE_ORDER.get(r["role"], 9), r["impl"]) for r in sub})
                for _, impl in impls:
                    pts = sorted((r["m"], r["ms"]) for r in sub if r["impl"] == impl)
                    rec = next(r for r in sub if r["impl"] == impl)
                    ax.plot([m for m, _ in pts], [v for _, v in pts], ROLE_STYLE.get(rec["role"], "-"), marker="o", ms=3,
                            lw=2.0 if impl == "rawflux" else 1.1, label=_impl_name(rec))
                _log2_x(ax, [r["m"] for r in sub])
                ax.set_yscale("log")
                n, k = sub[0]["n"], sub[0]["k"]
                dims = f"hidden {n}, ffn {k}" if op == "layer" else f"n={n}, k={k}"  # the layer op's n, k are the block's
                ax.set_title(f"{shape} ({dims})" + (f"\n{EMULATED_TITLE}" if emu else ""), fontsize=9)
                ax.set_xlabel("m")
                ax.set_ylabel("ms per step" if op == "layer" else "ms")
                ax.legend(fontsize=6)
            for ax in axes[len(shapes):]:
                ax.set_visible(False)
            fig.rawflux_emulated = emu
            out.append((title, fig))
    return out


# ------------------------------------------------------------------------------------------------
# fusion tax


def _ratio_figure(rows, bar: float, ylabel: str, title: str):
    """rows' ratio against m: one subplot per world, one line per shape, the bar dashed."""
    worlds = sorted({r["world"] for r in rows})
    fig = _figure(figsize=(4.2 * max(1, len(worlds)), 3.8), layout="constrained")
    axes = fig.subplots(1, max(1, len(worlds)), squeeze=False, sharey=True).ravel()
    for ax, w in zip(axes, worlds):
        sub = [r for r in rows if r["world"] == w]
        for shape in sorted({r["shape"] for r in sub}):
            pts = sorted((r["m"], r["ratio"]) for r in sub if r["shape"] == shape)
            ax.plot([m for m, _ in pts], [v for _, v in pts], marker="o", ms=3, label=shape)
        ax.axhline(bar, color="k", ls="--", lw=0.9, label=f"_bar {bar}")
        ax.text(0.01, bar, f" bar {bar}", transform=ax.get_yaxis_transform(), va="bottom", fontsize=7)
        _log2_x(ax, [r["m"] for r in sub])
        ax.set_title(f"W = {w}", fontsize=9)
        ax.set_xlabel("m")
        ax.legend(fontsize=6)
    axes[0].set_ylabel(ylabel)
    fig.suptitle(title, fontsize=10)
    return fig


TAX_TITLES = {"gemm_rs": "GEMM-ReduceScatter", "ag_gemm": "AllGather-GEMM"}


def fusion_tax_figure(d: dict, op: str = "gemm_rs"):
    """fused / rawflux.gemm against m for one op of a fusion-tax file (benchmarks/fusion_tax.py)."""
    bars = d.get("bar", 1.03)
    bar = bars.get(op, 1.03) if isinstance(bars, dict) else bars
    rows = [r for r in d["rows"] if r.get("op", "gemm_rs") == op]
    return _ratio_figure(rows, bar, "fused / rawflux.gemm (ms)", f"{TAX_TITLES.get(op, op)}'s fusion tax (one GPU, no link)")


def ag_link_figure(d: dict):
    """AllGather-GEMM behind the link emulator: fused / max(rawflux.gemm, T_gather) against m."""
    gbps = ", ".join(f"{g:g}" for g in sorted({r["link_gbps"] for r in d["rows"]}))
    return _ratio_figure(d["rows"], d.get("bar", 1.03), "fused / max(gemm, gather)",
                         f"AllGather-GEMM behind the link emulator ({gbps} GB/s, one GPU)")


# ------------------------------------------------------------------------------------------------
# host time per call (benchmarks/host_cost.py)


def host_cost_data(d: dict) -> dict:
    """{(world, m): [(call, host_us, bar_us or None)]} of a host-cost file, calls in a fixed order
    (torch.matmul, gemm, then each op's object and functional form)."""
    out: dict = {}
    for r in d["records"]:
        out.setdefault((r["world"], r["m"]), []).append((f"{r['op']} {r['form']}", r["host_us"], r.get("bar_us")))
    order = lambda c: (not c[0].startswith("torch"), not c[0].startswith("gemm "), c[0])  # noqa: E731
    return {key: sorted(calls, key=order) for key, calls in sorted(out.items())}


def host_cost_figure(d: dict):
    """The host's time to queue one call, per call form: one subplot per (W, m), each bar marked
    with its bar (dashes) where it has one."""
    data = host_cost_data(d)
    fig = _figure(figsize=(3.6 * max(1, len(data)), 3.8), layout="constrained")
    axes = fig.subplots(1, max(1, len(data)), squeeze=False, sharey=True).ravel()
    for ax, ((w, m), calls) in zip(axes, data.items()):
        xs = range(len(calls))
        ax.bar(xs, [us for _, us, _ in calls], color=["0.6" if b is None else "C0" if us <= b else "C3" for _, us, b in calls])
        for x, (_, _, b) in zip(xs, calls):
            if b is not None:
                ax.hlines(b, x - 0.4, x + 0.4, colors="k", linestyles="--", lw=0.9)
        ax.set_xticks(list(xs), [c for c, _, _ in calls], rotation=60, ha="right", fontsize=6)
        ax.set_title(f"W = {w}, m = {m}", fontsize=9)
    axes[0].set_ylabel("host us per call")
    emu = " (W > 1: ranks sharing one GPU)" if any(r.get("emulated") for r in d["records"]) else ""
    fig.suptitle(f"Host time per call{emu}; dashes: the bar", fontsize=10)
    return fig


# ------------------------------------------------------------------------------------------------
# GEMM-ReduceScatter's schedule (rawflux.plan's model)


def schedule_data(world: int, m: int, n: int, k: int, sms: int = 132, rank: int = 0, **kw) -> dict:
    """The numbers schedule_figure draws: owner[c][w] of rank's cluster c in wave w (-1: idle),
    own[(w, c)], link MiB per wave, and the prediction against m."""
    from .. import plan

    p = plan.predict(world, m, n, k, sms=sms, **kw)
    order = plan.orders(world, p.per_owner, p.delays)[rank]
    g, waves = p.clusters[rank], p.waves[rank]
    owner = [[-1] * waves for _ in range(g)]
    own = []
    for u, (o, _j) in enumerate(order):
        w, c = divmod(u, g)
        owner[c][w] = o
        if o == rank:
            own.append((w, c))
    mib = 1.0 / (1 << 20)
    links = {o: [lw[rank][o] * mib for lw in p.link_bytes] for o in range(world) if o != rank}
    busiest = [max(lw[r][o] for r in range(world) for o in range(world)) * mib for lw in p.link_bytes]
    ms = [x for x in (64 << i for i in range(8)) if x % world == 0]
    preds = [plan.predict(world, x, n, k, sms=sms, **kw) for x in ms]
    return {"prediction": p, "rank": rank, "owner": owner, "own": own, "links": links, "busiest": busiest,
            "m_list": ms, "predicted_us": [q.predicted_us for q in preds], "t_gemm_us": [q.t_gemm_us for q in preds],
            "t_link_us": [q.t_link_us for q in preds],
            "max_us": [max(q.t_gemm_us, q.t_link_us) for q in preds]}


def schedule_figure(world: int, m: int, n: int, k: int, sms: int = 132, rank: int = 0, **kw):
    """GEMM-ReduceScatter on rank 0 (rawflux.plan's model): (a) each cluster's tile owner per wave
    (own tiles marked x), (b) MiB per link per wave, (c) predicted time against max(T_gemm, T_link)
    for m = 64..8192. k is one rank's k; kw goes to rawflux.plan.predict (tile, link_gbps, delay...)."""
    import numpy as np
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch

    d = schedule_data(world, m, n, k, sms, rank, **kw)
    p = d["prediction"]
    fig = _figure(figsize=(15, 4.4), layout="constrained")
    ax_a, ax_b, ax_c = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.2, 1, 1]})
    fig.suptitle(f"GEMM-ReduceScatter schedule, W={world}, m={m}, n={n}, k={k} per rank: tile {p.tile}, "
                 f"T={p.per_owner} cluster tiles per owner, G={p.clusters[rank]} clusters, own delay {p.delays[rank]}", fontsize=10)

    # (a) owners per cluster and wave
    arr = np.ma.masked_less(np.array(d["owner"], dtype=float), 0)
    base = [tuple(c) for c in __import__("matplotlib").colormaps["tab10"].colors]
    cmap = ListedColormap([base[o % len(base)] for o in range(world)]).with_extremes(bad="white")
    ax_a.imshow(arr, aspect="auto", interpolation="nearest", cmap=cmap,
                norm=BoundaryNorm(np.arange(-0.5, world + 0.5), world), origin="upper")
    if d["own"]:
        ax_a.plot([w for w, _ in d["own"]], [c for _, c in d["own"]], "x", color="k", ms=3, mew=0.8, ls="none",
                  label=f"own tile (rank {rank})")
    ax_a.set_xlabel("wave")
    ax_a.set_ylabel("cluster")
    ax_a.set_title(f"(a) rank {rank}: owner of each cluster's tile", fontsize=9)
    handles = [Patch(color=cmap(o), label=f"owner {o}" + (" (own)" if o == rank else "")) for o in range(world)]
    ax_a.legend(handles=handles + ax_a.get_lines(), fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))

    # (b) bytes per link per wave
    waves = list(range(len(d["busiest"])))
    for o, ys in d["links"].items():
        ax_b.plot(waves, ys, marker="o", ms=3, color=cmap(o), label=f"link {rank} -> {o}")
    ax_b.plot(waves, d["busiest"], "k--", lw=0.9, label="busiest link (any)")
    ax_b.set_xlabel("wave")
    ax_b.set_ylabel("MiB sent in the wave")
    ax_b.set_title(f"(b) partial bytes per link and wave ({p.link_gbps:g} GB/s links)", fontsize=9)
    ax_b.legend(fontsize=6)

    # (c) the model against m
    ms = d["m_list"]
    ax_c.plot(ms, d["predicted_us"], "-", marker="o", ms=3, lw=2, label="predicted (+ launch)")
    ax_c.plot(ms, d["max_us"], "k--", lw=1, label="max(T_gemm, T_link)")
    ax_c.plot(ms, d["t_gemm_us"], ":", label="T_gemm")
    ax_c.plot(ms, d["t_link_us"], "-.", label="T_link")
    _log2_x(ax_c, ms)
    ax_c.set_yscale("log")
    ax_c.set_xlabel("m")
    ax_c.set_ylabel("us")
    ax_c.set_title(f"(c) predicted time, W={world}, n={n}, k={k}", fontsize=9)
    ax_c.legend(fontsize=6)
    fig.rawflux_data = d
    return fig


# ------------------------------------------------------------------------------------------------
# everything in a results folder


def default_results_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def performance_report(results_dir=None) -> list:
    """[(title, Figure)] for every result JSON in results_dir (default: the repo's
    benchmarks/results): the newest GEMM grid (one figure per dtype, bf16 first), the fusion tax,
    the link emulator, the host's time per call, then the bench runs (real multi-GPU runs first, emulated-node runs after, each its own figure)."""
    from .report import SCHEMA

    results = Path(results_dir) if results_dir is not None else default_results_dir()
    gemms, taxes, links, hosts, bench = [], [], [], [], []
    for p in sorted(results.glob("*.json")):
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(d, dict):
            continue
        if d.get("kind") == "fusion-tax":
            taxes.append((p.name, d))
        elif d.get("kind") == "ag-link-emu":
            links.append((p.name, d))
        elif d.get("kind") == "host-cost":
            hosts.append((p.name, d))
        elif d.get("kind"):
            continue  # another benchmark's file
        elif d.get("schema") == SCHEMA:
            bench.append(p)
        elif "rows" in d:
            gemms.append((max((str(r.get("date", "")) for r in d["rows"]), default=""), p.name, d["rows"]))
    out = []
    if gemms:
        _, name, rows = max(gemms, key=lambda g: (g[0], g[1]))
        for dt in sorted({r.get("dtype") for r in rows if r.get("dtype")}, key=lambda x: (x != "bf16", x)):
            if gemm_ratios(rows, dt):
                title = f"rawflux.gemm against cuBLAS, {dt} ({name})"
                out.append((title, gemm_figure(rows, dt, title=title)))
    for name, d in taxes:
        for op in sorted({r.get("op", "gemm_rs") for r in d["rows"]}, key=lambda o: o != "gemm_rs"):
            out.append((f"{TAX_TITLES.get(op, op)} fusion tax ({name})", fusion_tax_figure(d, op)))
    for name, d in links:
        out.append((f"AllGather-GEMM behind the link emulator ({name})", ag_link_figure(d)))
    for name, d in hosts:
        out.append((f"Host time per call ({name})", host_cost_figure(d)))
    figs = fused_figures(bench)
    out += [f for f in figs if not f[1].rawflux_emulated] + [f for f in figs if f[1].rawflux_emulated]
    return out
