"""The fusion tax of the fused ops, and AllGather-GEMM behind an emulated link, on one GPU.

    PYTHONPATH=. python benchmarks/fusion_tax.py [--op gemm_rs,ag_gemm] [--worlds 2,4,8] [--ms 1024,2048,4096,8192]
        [--link-gbps 370] [--link-latency-us 0] [--json PATH] [--link-json PATH]

gemm_ar (--op gemm_ar, --ms default 1..512): rank 0's one-shot GEMM + AllReduce kernel with its
peers mapped locally (rawflux/bench/ar_local.py) against rawflux.gemm's pick; bar fused / gemm <= 1.05.
gemm_rs: the fused kernel at world W with every peer mapped onto its own buffers
(rawflux/bench/rs_local.py: the same kernel, the same stores and reads, no link, no waiting)
against rawflux.gemm's own pick on the same (m, n, k_local). Bar: fused / gemm <= 1.03.
ag_gemm (rawflux/bench/ag_local.py): rank 0's fused GEMM on the gathered A, (1) with every chunk
landed (the tax; bar fused / gemm <= 1.02) and (2) behind the link emulator at G GB/s (bar
fused <= 1.03 x max(T_gemm, T_gather) at m >= 1024, T_gather = (W - 1) chunks at G), against
rawflux.gemm's own pick on the gathered A; also the emulated call with the GEMM's own raster
order instead of the fused op's chunk-major one (column pick_order) and, where the op sends
chunks in k-slabs (slabs > 1), with whole chunks (column whole_chunks); --slab-sweep also times the
tax and the emulated call at every k-slab count S that splits k (records tax_slab_ms / link_slab_ms:
{S: ms}), for what a slab costs with its flag already set and behind the link. --link-latency-us L
delays every emulated arrival by L (T_gather includes it); column b_later: the emulated call with
B's first k blocks loaded after the first wait instead of before it (AGGemm b_first=False); column
floor: the emulated call with every flag released at once (what the call's start and the
emulator's SM cost the GEMM, with no wait).
CUDA events, warm-up, median of --reps, the competitors interleaved call by call, B (and
gemm_rs's A) rotated over sets larger than 4x L2. Points are printed; exit status 1 if any
misses its bar. fusion-tax.json holds the tax records of both ops (records: op, world, m, n, k,
dtype, fused_ms, gemm_ms, ratio, tile, same_tile_gemm_ms: rawflux.gemm on the fused kernel's
configuration, emulated_link, link_gbps, gpu, commit, date; gemm_rs also partials, ag_gemm slabs); a run of
one op keeps the other's records. ag-link-emu.json holds the emulated-link records.

--tuned: tuned against untuned instead, for both ops (the gemm_rs tax, the ag_gemm tax and its
emulated link): per point the op's own tuning candidates (op.tune_candidates(m): the heuristic's
pick first) are timed as the tuner times them (--tune-reps calls each, interleaved) and op.tune(m)'s
rule keeps one (the fastest, unless within 1 % of the heuristic's pick); then the heuristic's pick, the tuned pick and the heuristic's pick
again are timed afresh (--reps, interleaved). Bar: tuned <= untuned x (1 + noise), noise = max(1 %,
twice the gap between the two heuristic timings). Records (op, world, shape, m, mode, untuned and
tuned configs and ms, ratio, noise, candidates) go to fused-tuned.json (--tuned-json).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import L2_BYTES, bench_many  # noqa: E402

# (name, n, k of the whole layer): the row-parallel GEMMs (GEMM-RS) of the paper's GPT-3 175B and Llama-3-70B
SHAPES = [("gpt3.attn_out", 12288, 12288), ("gpt3.mlp_down", 12288, 49152),
          ("llama70b.o_proj", 8192, 8192), ("llama70b.down_proj", 8192, 28672)]
# (name, n of the whole layer, k): the column-parallel GEMMs (AllGather-GEMM)
AG_SHAPES = [("gpt3.mlp_up", 49152, 12288), ("llama70b.qkv", 10240, 8192), ("llama70b.gate_up", 57344, 8192)]
BAR = 1.03
AG_TAX_BAR = 1.02
AG_LINK_BAR = 1.03
AG_LINK_FROM_M = 1024
FLOOR_GBPS = 1e7  # the emulated link's floor: every flag due within a few ns of the call's start
AR_TAX_BAR = 1.05
AR_MS = "1,16,64,128,256,512"  # gemm_ar is the decode op
RESULTS = Path(__file__).parent / "results"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="gemm_rs,ag_gemm")
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--ms", default="1024,2048,4096,8192")
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--partials", default=None, help="default: the output's type; or fp32")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--link-gbps", type=float, default=370.0)
    ap.add_argument("--link-latency-us", type=float, default=0.0, help="ag_gemm: every emulated arrival this much later")
    ap.add_argument("--json", default=str(RESULTS / "fusion-tax.json"))
    ap.add_argument("--link-json", default=str(RESULTS / "ag-link-emu.json"))
    ap.add_argument("--slab-sweep", action="store_true", help="ag_gemm: also time every k-slab count (see the module docstring)")
    ap.add_argument("--tuned", action="store_true", help="tuned against untuned (see the module docstring)")
    ap.add_argument("--tune-reps", type=int, default=20, help="--tuned: calls per candidate in the tuning pass (op.tune's reps)")
    ap.add_argument("--tuned-json", default=str(RESULTS / "fused-tuned.json"))
    args = ap.parse_args(argv)
    args.ms_given = any(x == "--ms" or x.startswith("--ms=") for x in (argv if argv is not None else sys.argv[1:]))
    ops = args.op.split(",")
    bad = [o for o in ops if o not in ("gemm_rs", "ag_gemm", "gemm_ar")]
    if bad:
        ap.error(f"--op: {bad} (gemm_rs, ag_gemm, gemm_ar)")
    if args.tuned:
        return run_tuned(args, ops)
    rows, over = [], 0
    if "gemm_rs" in ops:
        r, o = run_rs(args)
        rows, over = rows + r, over + o
    if "ag_gemm" in ops:
        r, o = run_ag(args)
        rows, over = rows + r, over + o
    if "gemm_ar" in ops:
        r, o = run_ar(args)
        rows, over = rows + r, over + o
    path = Path(args.json)
    kept = []
    if path.exists():
        try:
            kept = [r for r in json.loads(path.read_text()).get("rows", []) if r.get("op") not in ops]
        except (ValueError, AttributeError):
            kept = []
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": "fusion-tax", "bar": {"gemm_rs": BAR, "ag_gemm": AG_TAX_BAR, "gemm_ar": AR_TAX_BAR}, "rows": kept + rows}, indent=1) + "\n")
    return 1 if over else 0


def _gpu_commit():
    import cupy

    from rawflux.bench.timing import git_commit

    gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    gpu = gpu.decode() if isinstance(gpu, bytes) else str(gpu)
    return gpu, (git_commit() or "unknown")[:12]


def run_rs(args):
    """gemm_rs: the fused kernel at world W, peers mapped onto local buffers (rawflux/bench/rs_local.py)."""
    from rawflux.bench.rs_local import local_world

    return _run_row_parallel(args, "gemm_rs", lambda W, m, n, k: local_world(W, m, n, k, "bf16", partials=args.partials, tax=True),
                             lambda op, m: op.plan(m).cfg, lambda m, W: m // W, args.ms, BAR, label="")


def run_ar(args):
    """gemm_ar: rank 0's fused kernel with its peers mapped locally (rawflux/bench/ar_local.py),
    at decode m (--ms default AR_MS)."""
    from rawflux.bench.ar_local import local_ar_tax

    return _run_row_parallel(args, "gemm_ar", lambda W, m, n, k: local_ar_tax(W, m, n, k, "bf16", partials=args.partials),
                             lambda op, m: op.config_for(m), lambda m, W: m, args.ms if args.ms_given else AR_MS, AR_TAX_BAR,
                             label="gemm_ar ")


def _run_row_parallel(args, op_name: str, make, cfg_of, out_rows, ms: str, bar: float, *, label: str):
    """The tax of a row-parallel op (gemm_rs, gemm_ar) over the row-parallel shapes: ``make(W, m,
    n, k)`` the one-rank launcher (op.preset(m) before its calls), ``cfg_of(op, m)`` the
    configuration it runs, ``out_rows(m, W)`` its output's rows; against rawflux.gemm's own pick
    on (m, n, k_local) and the plain GEMM on the fused configuration."""
    import torch

    import rawflux

    gpu, commit = _gpu_commit()
    rows, worst = [], 0.0
    shapes = SHAPES if args.shapes == "all" else [s for s in SHAPES if s[0] in args.shapes.split(",")]
    for W in [int(x) for x in args.worlds.split(",")]:
        for name, n, k_all in shapes:
            k = k_all // W
            for m in [int(x) for x in ms.split(",")]:
                op = make(W, m, n, k)
                op.preset(m)
                set_bytes = (m * k + n * k) * 2
                nsets = max(2, min(16, 4 * L2_BYTES // set_bytes + 1))
                a = [torch.randn(m, k, device="cuda").to(torch.bfloat16) for _ in range(nsets)]
                b = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(nsets)]
                out = torch.empty(out_rows(m, W), n, device="cuda", dtype=torch.bfloat16)
                full = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                s = torch.cuda.current_stream().cuda_stream
                same_cfg = cfg_of(op, m)

                def fused(i):
                    op(a[i], b[i], out=out, stream=s)

                def plain(i):
                    rawflux.gemm(a[i], b[i], out=full, stream=s)

                def same(i):  # the fused kernel's tile and grid, data-parallel, in the plain GEMM
                    rawflux.gemm(a[i], b[i], out=full, stream=s, config=same_cfg)

                t_f, t_g, t_s = bench_many([fused, plain, same], nsets, args.reps)
                torch.cuda.synchronize()
                if op.failed():
                    raise RuntimeError(f"fused kernel reported a device-side failure (state {op.failed()})")
                ratio = t_f / t_g
                worst = max(worst, ratio)
                tile = same_cfg.tile.tag()
                print(f"fusion-tax W={W} {label}{name} m={m} n={n} k={k}: fused {t_f * 1e3:8.1f} us  gemm {t_g * 1e3:8.1f} us  "
                      f"ratio {ratio:.3f} {'ok' if ratio <= bar else 'OVER'}  tile {tile} (plain GEMM on it {t_s * 1e3:.1f} us)", flush=True)
                rows.append({"op": op_name, "world": W, "shape": name, "m": m, "n": n, "k": k, "dtype": "bf16",
                             "partials": args.partials or "bf16", "fused_ms": t_f, "gemm_ms": t_g, "ratio": ratio, "tile": tile,
                             "same_tile_gemm_ms": t_s, "emulated_link": False, "link_gbps": None, "gpu": gpu, "commit": commit,
                             "date": datetime.date.today().isoformat()})
                del a, b, out, full, op
                torch.cuda.empty_cache()
    over = sum(r["ratio"] > bar for r in rows)
    print(f"fusion-tax summary: {op_name} {len(rows) - over}/{len(rows)} points within {bar}, worst {worst:.3f}")
    return rows, over


def _ag_point(W: int, m: int, n: int, k: int):
    """One ag_gemm point of the one-GPU harness: (AgLocal, the gathered A filled with random rows,
    rank 0's shard of it, input sets, B sets rotated over more than 4x L2, the output)."""
    import cupy
    import torch

    from rawflux.bench.ag_local import AgLocal

    ag = AgLocal(W, m, n, k, "bf16")
    gath = torch.as_tensor(ag.gathered(m).view(cupy.int16), device="cuda").view(torch.bfloat16)  # the op's buffer
    gath.copy_(torch.randn(m, k, device="cuda").to(torch.bfloat16))
    shard = gath[: m // W].clone()  # rank 0's rows: a link call copies them back in place
    nsets = max(2, min(16, 4 * L2_BYTES // (n * k * 2) + 1))
    b = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(nsets)]
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    return ag, gath, shard, nsets, b, out


def run_ag(args):
    """ag_gemm's tax and emulated-link points (see the module docstring)."""
    from dataclasses import replace

    import torch

    import rawflux
    from rawflux.bench.ag_local import t_gather_ms
    from rawflux.tune.ag_order import SLAB_CHOICES

    gpu, commit = _gpu_commit()
    G, lat = args.link_gbps, args.link_latency_us
    today = datetime.date.today().isoformat()
    tax_rows, link_rows = [], []
    shapes = AG_SHAPES if args.shapes == "all" else [s for s in AG_SHAPES if s[0] in args.shapes.split(",")]
    for W in [int(x) for x in args.worlds.split(",")]:
        for name, n_all, k in shapes:
            n = n_all // W
            for m in [int(x) for x in args.ms.split(",")]:
                ag, gath, shard, nsets, b, out = _ag_point(W, m, n, k)
                full = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                s = torch.cuda.current_stream().cuda_stream
                cfg_tax, cfg_link = ag.config(m), ag.config(m, link=True)
                sl_tax, sl_link = ag.slabs(m, cfg_tax), ag.slabs(m, cfg_link)  # the op's k-slabs
                base = ag.op._default(m)
                cfg_pick = replace(cfg_link, group=base.group, raster_n=base.raster_n)  # the pick's own raster order

                # correctness first: poisoned output, bitwise against rawflux.gemm on the same
                # configuration, and a float64 reference
                out.fill_(float("nan"))
                ag.link(shard, b[0], out, m, G, s, latency_us=lat)
                rawflux.gemm(gath, b[0], out=full, stream=s, config=cfg_link)
                torch.cuda.synchronize()
                if ag.failed():
                    raise RuntimeError(f"ag_gemm emulated call reported a device-side failure (state {ag.failed()})")
                if not torch.equal(out, full):
                    raise RuntimeError(f"ag_gemm W={W} {name} m={m}: the emulated call differs from rawflux.gemm on its configuration")
                want = gath.double() @ b[0].double().T
                rel = float(torch.linalg.norm(out.double() - want) / torch.linalg.norm(want))
                if not rel < 1e-2:
                    raise RuntimeError(f"ag_gemm W={W} {name} m={m}: relative error {rel:.2e} against float64")
                del want

                def tax(i):
                    ag.tax(b[i], out, m, s, cfg_tax)

                def link(i):
                    ag.link(shard, b[i], out, m, G, s, cfg_link, latency_us=lat)

                def link_pick(i):
                    ag.link(shard, b[i], out, m, G, s, cfg_pick, latency_us=lat)

                def link_whole(i):  # whole chunks (one flag each), as before k-slabs
                    ag.link(shard, b[i], out, m, G, s, cfg_link, slabs=1, latency_us=lat)

                def link_b_later(i):  # B's first blocks after the wait, not before (AGGemm b_first=False)
                    ag.op.b_first = False
                    try:
                        ag.link(shard, b[i], out, m, G, s, cfg_link, latency_us=lat)
                    finally:
                        ag.op.b_first = True

                def link_floor(i):  # every flag released at once: the call's start and the emulator's SM, no wait
                    ag.link(shard, b[i], out, m, FLOOR_GBPS, s, cfg_link)

                def plain(i):
                    rawflux.gemm(gath, b[i], out=full, stream=s)

                def same(i):
                    rawflux.gemm(gath, b[i], out=full, stream=s, config=cfg_tax)

                sweep = [S for S in SLAB_CHOICES if k % (S * 64) == 0] if args.slab_sweep else []
                sweep_fns = [lambda i, S=S: ag.tax(b[i], out, m, s, cfg_tax, slabs=S) for S in sweep]
                sweep_fns += [lambda i, S=S: ag.link(shard, b[i], out, m, G, s, cfg_link, slabs=S, latency_us=lat) for S in sweep]
                fns = [tax, link, link_pick, plain, same, link_b_later, link_floor] + ([link_whole] if sl_link > 1 else []) + sweep_fns
                times = bench_many(fns, nsets, args.reps)
                t_tax, t_link, t_pick, t_g, t_s, t_later, t_floor = times[:7]
                t_whole = times[7] if sl_link > 1 else t_link
                n0 = len(fns) - len(sweep_fns)  # the sweep's times: the tax's per S, then the link's
                tax_sweep = dict(zip(map(str, sweep), times[n0:n0 + len(sweep)]))
                link_sweep = dict(zip(map(str, sweep), times[n0 + len(sweep):]))
                torch.cuda.synchronize()
                if ag.failed():
                    raise RuntimeError(f"ag_gemm emulated call reported a device-side failure (state {ag.failed()})")
                t_gather = t_gather_ms(W, m, k, 2, G) + lat * 1e-3
                bound = max(t_g, t_gather)
                r_tax, r_link = t_tax / t_g, t_link / bound
                ok_link = m < AG_LINK_FROM_M or r_link <= AG_LINK_BAR
                print(f"ag-tax  W={W} {name} m={m} n={n} k={k}: fused {t_tax * 1e3:8.1f} us  gemm {t_g * 1e3:8.1f} us  ratio {r_tax:.3f} "
                      f"{'ok' if r_tax <= AG_TAX_BAR else 'OVER'}  {cfg_tax.tag()} S={sl_tax} (plain GEMM on it {t_s * 1e3:.1f} us)",
                      flush=True)
                print(f"ag-link W={W} {name} m={m} G={G:g}{f' +{lat:g} us' if lat else ''}: fused {t_link * 1e3:8.1f} us  max(gemm, "
                      f"gather {t_gather * 1e3:.1f}) {bound * 1e3:8.1f} us  ratio {r_link:.3f} {'ok' if ok_link else 'OVER'}  S={sl_link} "
                      f"(arrivals at once {t_floor * 1e3:.1f} us; whole chunks {t_whole * 1e3:.1f} us; B after the wait {t_later * 1e3:.1f} us; "
                      f"pick's order {t_pick * 1e3:.1f} us {cfg_pick.tag()}; rel err {rel:.1e})", flush=True)
                if sweep:
                    print(f"ag-slabs W={W} {name} m={m}: S = {' / '.join(tax_sweep)}: tax " + " / ".join(f"{t * 1e3:.1f}" for t in
                          tax_sweep.values()) + " us, link " + " / ".join(f"{t * 1e3:.1f}" for t in link_sweep.values()) + " us",
                          flush=True)
                common = {"op": "ag_gemm", "world": W, "shape": name, "m": m, "n": n, "k": k, "dtype": "bf16", "gemm_ms": t_g,
                          "gpu": gpu, "commit": commit, "date": today}
                tax_rows.append(common | {"fused_ms": t_tax, "ratio": r_tax, "tile": cfg_tax.tag(), "same_tile_gemm_ms": t_s,
                                          "slabs": sl_tax, "emulated_link": False, "link_gbps": None}
                                | ({"tax_slab_ms": tax_sweep} if sweep else {}))
                link_rows.append(common | {"fused_ms": t_link, "gather_ms": t_gather, "bound_ms": bound, "ratio": r_link,
                                           "config": cfg_link.tag(), "slabs": sl_link, "whole_chunks_ms": t_whole,
                                           "pick_order_ms": t_pick, "pick_order_config": cfg_pick.tag(), "b_later_ms": t_later, "floor_ms": t_floor,
                                           "emulated_link": True, "link_gbps": G, "link_latency_us": lat, "rel_err": rel}
                                 | ({"link_slab_ms": link_sweep} if sweep else {}))
                del ag, gath, shard, b, out, full
                torch.cuda.empty_cache()
    path = Path(args.link_json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": "ag-link-emu", "bar": AG_LINK_BAR, "from_m": AG_LINK_FROM_M, "rows": link_rows}, indent=1) + "\n")
    over_tax = sum(r["ratio"] > AG_TAX_BAR for r in tax_rows)
    over_link = sum(r["ratio"] > AG_LINK_BAR and r["m"] >= AG_LINK_FROM_M for r in link_rows)
    print(f"fusion-tax summary: ag_gemm {len(tax_rows) - over_tax}/{len(tax_rows)} points within {AG_TAX_BAR}"
          + (f", worst {max(r['ratio'] for r in tax_rows):.3f}" if tax_rows else ""))
    print(f"ag-link summary: {len(link_rows) - over_link}/{len(link_rows)} points within {AG_LINK_BAR} x max(gemm, gather) at m >= "
          f"{AG_LINK_FROM_M}" + (f", worst {max(r['ratio'] for r in link_rows):.3f}" if link_rows else ""))
    return tax_rows, over_tax + over_link


TUNED_NOISE_MIN = 0.01


def _tuned_point(label, cands, run, tag, nsets, args, common):
    """One point of --tuned: the tuning pass over ``cands`` (run(j, i) makes one call of candidate
    j on input set i), then heuristic / tuned / heuristic timed afresh."""
    from rawflux.tune.collective import pick

    times = bench_many([lambda i, j=j: run(j, i) for j in range(len(cands))], nsets, args.tune_reps)
    best = pick(times)  # op.tune's rule: the fastest, unless within the margin of the heuristic's pick
    h, t, h2 = bench_many([lambda i: run(0, i), lambda i: run(best, i), lambda i: run(0, i)], nsets, args.reps)
    noise = max(TUNED_NOISE_MIN, 2 * abs(h2 / h - 1))
    ratio = t / h
    ok = ratio <= 1 + noise
    print(f"fused-tuned {label}: untuned {h * 1e3:8.1f} us {tag(cands[0])}  tuned {t * 1e3:8.1f} us {tag(cands[best])}  "
          f"ratio {ratio:.3f} (noise {noise:.3f}) {'ok' if ok else 'SLOWER'}  [{len(cands)} candidates]", flush=True)
    return common | {"untuned_config": tag(cands[0]), "tuned_config": tag(cands[best]), "untuned_ms": h, "tuned_ms": t,
                     "ratio": ratio, "noise": noise, "candidates": [tag(c) for c in cands], "candidate_ms": times}, ok


def run_tuned(args, ops) -> int:
    """--tuned (see the module docstring)."""
    import torch

    from rawflux.bench.rs_local import local_world

    gpu, commit = _gpu_commit()
    today = datetime.date.today().isoformat()
    rows, bad = [], 0
    worlds = [int(x) for x in args.worlds.split(",")]
    ms = [int(x) for x in args.ms.split(",")]
    s = torch.cuda.current_stream().cuda_stream
    if "gemm_rs" in ops:
        shapes = SHAPES if args.shapes == "all" else [x for x in SHAPES if x[0] in args.shapes.split(",")]
        for W in worlds:
            for name, n, k_all in shapes:
                k = k_all // W
                for m in ms:
                    probe = local_world(W, m, n, k, "bf16", partials=args.partials, tax=True)
                    cands = probe.tune_candidates(m)
                    del probe
                    ops_c = [local_world(W, m, n, k, "bf16", partials=args.partials, config=c, tax=True) for c in cands]
                    for o in ops_c:
                        o.preset(m)
                    nsets = max(2, min(16, 4 * L2_BYTES // ((m * k + n * k) * 2) + 1))
                    a = [torch.randn(m, k, device="cuda").to(torch.bfloat16) for _ in range(nsets)]
                    b = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(nsets)]
                    out = torch.empty(m // W, n, device="cuda", dtype=torch.bfloat16)

                    def run(j, i):
                        ops_c[j](a[i], b[i], out=out, stream=s)

                    common = {"op": "gemm_rs", "world": W, "shape": name, "m": m, "n": n, "k": k, "dtype": "bf16", "mode": "tax",
                              "emulated_link": False, "gpu": gpu, "commit": commit, "date": today}
                    row, ok = _tuned_point(f"gemm_rs W={W} {name} m={m} tax", cands, run, lambda c: c.tag(), nsets, args, common)
                    torch.cuda.synchronize()
                    if any(o.failed() for o in ops_c):
                        raise RuntimeError("gemm_rs: a fused kernel reported a device-side failure")
                    rows.append(row)
                    bad += not ok
                    del ops_c, a, b, out
                    torch.cuda.empty_cache()
    if "ag_gemm" in ops:
        shapes = AG_SHAPES if args.shapes == "all" else [x for x in AG_SHAPES if x[0] in args.shapes.split(",")]
        G = args.link_gbps
        for W in worlds:
            for name, n_all, k in shapes:
                n = n_all // W
                for m in ms:
                    ag, gath, shard, nsets, b, out = _ag_point(W, m, n, k)
                    bases = ag.op.tune_candidates(m)
                    for mode in ("tax", "link"):
                        cands = [ag.config(m, link=mode == "link", base=c) for c in bases]

                        def run(j, i, mode=mode, cands=cands):
                            if mode == "tax":
                                ag.tax(b[i], out, m, s, cands[j])
                            else:
                                ag.link(shard, b[i], out, m, G, s, cands[j])

                        common = {"op": "ag_gemm", "world": W, "shape": name, "m": m, "n": n, "k": k, "dtype": "bf16", "mode": mode,
                                  "emulated_link": mode == "link", "link_gbps": G if mode == "link" else None, "gpu": gpu,
                                  "commit": commit, "date": today}
                        row, ok = _tuned_point(f"ag_gemm W={W} {name} m={m} {mode}", cands, run, lambda c: c.tag(), nsets, args, common)
                        rows.append(row)
                        bad += not ok
                    torch.cuda.synchronize()
                    if ag.failed():
                        raise RuntimeError("ag_gemm: the emulated call reported a device-side failure")
                    del ag, gath, shard, b, out
                    torch.cuda.empty_cache()
    path = Path(args.tuned_json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": "fused-tuned", "noise_min": TUNED_NOISE_MIN, "rows": rows}, indent=1) + "\n")
    changed = sum(r["tuned_config"] != r["untuned_config"] for r in rows)
    print(f"fused-tuned summary: {len(rows) - bad}/{len(rows)} points tuned within noise of untuned or faster; the tuner changed the "
          f"pick at {changed}" + (f", best ratio {min(r['ratio'] for r in rows):.3f}" if rows else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
