"""Score rawflux.tune's heuristic against measured GEMM timings, by regret: at each measured point,
the measured time of the model's pick over the fastest config measured there (1.0 = the model picks
the fastest). CPU only; the SM count is the H200's unless given.

    PYTHONPATH=. python benchmarks/gemm_model_regret.py [--data FILE ...] [--sms 132] [--show 1.03]

Inputs (default: the sweeps and moved-pick A/Bs of sessions 12-17 under benchmarks/results/):
- sweep files of benchmarks/gemm.py --sweep ({"sweep": [{m, n, k, config, ms}, ...]});
- moved-pick A/B files ({"rows": [{m, n, k, old, new, old_ms, new_ms}, ...]}).
A config's raster (g8m / g8n) is ignored: the heuristic sets it after the pick. Session 13's refit
of the time model was scored this way (docs/gemm-notes.md, session 13).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_DATA = [
    RESULTS / "gemm-variants-2026-11-29-s12" / f for f in
    ("r3-sweep-small-m.json", "r4-sweep-large-m.json", "r5-sweep-m64-128-a.json", "r5-sweep-m64-128-b.json")
] + [RESULTS / "gemm-variants-2026-11-30-s13" / f for f in ("r1-0005-moved-picks.json", "r6-refit-moved-picks.json")] + [
    RESULTS / "gemm-variants-2026-11-30-s14" / f for f in ("r1-sweep-64x96-a.json", "r1-sweep-64x96-b.json", "r2-moved-picks.json")] + [
    # session 17: A's tail box (kernel change) makes ragged m faster; r2 re-sweeps m = 96, 192, 320
    RESULTS / "gemm-variants-2026-11-30-s17" / f for f in ("r1-moved-picks.json", "r2-sweep-ragged.json", "r3-moved-picks.json")] + [
    # session 26: the picks and the split tail (2-6 pieces) at the 20 bar points m >= 1024, and at
    # m = 1536, 3072 (28672x8192) beside the data-parallel configs
    RESULTS / "gemm-variants-2026-11-30-s26" / f for f in ("c1-tails.json", "c6-1536-3072.json")] + [
    # session 27: banded stream-K beside the picks at the 20 bar points m >= 1024 (c2), and the
    # heuristic's band picks beside the data-parallel 128x256 and 128x192 pairs (c4)
    RESULTS / "gemm-variants-2026-11-30-s27" / f for f in ("c2-bands-1.json", "c2-bands-2.json", "c4-picks-1.json", "c4-picks-2.json",
                                                                 "c6-offgrid.json")] + [
    # session 28: narrow columns beside the picks and the data-parallel pair at the 20 bar points m >= 1024
    RESULTS / "gemm-variants-2026-11-30-s28" / f for f in ("c4-narrow-1.json", "c4-narrow-2.json", "c6-m1536.json")]


def _canon(tag: str) -> str:
    return tag.replace("/g8n/", "/g8m/")


def load(paths) -> dict[tuple[int, int, int], dict[str, float]]:
    """(m, n, k) -> {config tag: fastest measured ms}."""
    meas: dict[tuple[int, int, int], dict[str, float]] = {}
    relative = []  # ((m, n, k), {tag: ms}) timed together in one bar run
    for p in paths:
        d = json.loads(Path(p).read_text())
        pairs = [(r["m"], r["n"], r["k"], r["config"], r["ms"]) for r in d.get("sweep", [])]
        if any(str(r.get("impl", "")).startswith(("rawflux<", "rawflux{")) for r in d.get("rows", [])):
            # a bar run with --tails, --bands or --configs (sessions 26-27): every rawflux row of a
            # point, timed in the same run
            run = {}
            for r in d["rows"]:
                if str(r.get("impl", "")).startswith("rawflux") and r.get("config") and r["impl"] != "rawflux-tuned":
                    run.setdefault((r["m"], r["n"], r["k"]), {})[_canon(r["config"])] = r["ms"]
            relative.extend(run.items())
        for r in d.get("rows", []):
            if "old" in r:
                pairs += [(r["m"], r["n"], r["k"], r["old"], r["old_ms"]), (r["m"], r["n"], r["k"], r["new"], r["new_ms"])]
        for m, n, k, tag, ms in pairs:
            d2 = meas.setdefault((m, n, k), {})
            d2[_canon(tag)] = min(d2.get(_canon(tag), math.inf), ms)
    # Configs timed together in a bar run (interleaved with cuBLAS, at the power cap) run slower than
    # the sweeps' back-to-back timings: they enter scaled by a config the sweeps timed at that point
    # (the run's time of it against the sweep's), or as they are where the sweeps have none.
    for key, times in relative:
        d2 = meas.setdefault(key, {})
        anchor = next((t for t in times if t in d2), None)
        scale = d2[anchor] / times[anchor] if anchor else 1.0
        for tag, ms in times.items():
            d2[tag] = min(d2.get(tag, math.inf), ms * scale) if anchor is None or tag != anchor else d2[tag]
    return meas


def regrets(meas, sms: int = 132):
    """[(point, pick tag, regret or None when the pick was not measured there)]."""
    from rawflux import tune

    dev = tune.DeviceInfo(sms, (9, 0), 60 << 20, "H200 (given)")
    out = []
    for key in sorted(meas):
        pick = _canon(tune.heuristic(*key, "nk", dev).tag())
        best = min(meas[key].values())
        out.append((key, pick, meas[key][pick] / best if pick in meas[key] else None))
    return out


def summary(rows) -> dict:
    def gm(xs):
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")
    small = [r for (m, _, _), _, r in rows if r is not None and m <= 512]
    large = [r for (m, _, _), _, r in rows if r is not None and m > 512]
    return {"points": len(rows), "unmeasured_picks": sum(r is None for _, _, r in rows),
            "small_mean": gm(small), "small_max": max(small, default=float("nan")),
            "large_mean": gm(large), "large_max": max(large, default=float("nan"))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", nargs="*", default=[str(p) for p in DEFAULT_DATA])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--show", type=float, default=1.03, help="list the points whose regret exceeds this")
    args = ap.parse_args(argv)
    rows = regrets(load(args.data), args.sms)
    for key, pick, r in rows:
        if r is None or r > args.show:
            print(f"m={key[0]:5d} {key[1]}x{key[2]}  pick {pick}  regret {'unmeasured' if r is None else f'{r:.3f}'}")
    s = summary(rows)
    print(f"{s['points']} points: regret at m <= 512 mean {s['small_mean']:.4f} max {s['small_max']:.3f}; "
          f"at m > 512 mean {s['large_mean']:.4f} max {s['large_max']:.3f}; picks not measured: {s['unmeasured_picks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
