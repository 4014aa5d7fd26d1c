"""Score rawflux.tune's heuristic against measured GEMM timings, by regret: at each measured point,
the measured time of the model's pick over the fastest config measured there (1.0 = the model picks
the fastest). CPU only; the SM count is the H200's unless given.

    python benchmarks/tools/gemm_model_regret.py [--data FILE ...] [--sms 132] [--show 1.03] [--write OUT]

Inputs (default: gemm_timings.json beside this script, the configs timed on an H200):
- sweep files of benchmarks/gemm.py --sweep ({"sweep": [{m, n, k, config, ms}, ...]});
- bar runs of benchmarks/gemm.py with --configs / --tails / --bands / --narrow (every
  rawflux row of a point timed in the same run);
- moved-pick A/B files ({"rows": [{m, n, k, old, new, old_ms, new_ms}, ...]});
- merged sets as --write writes them ({"points": [{m, n, k, ms: {tag: ms}}, ...]}).
A config's raster (g8m / g8n) is ignored: the heuristic sets it after the pick.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DEFAULT_DATA = [Path(__file__).resolve().parent / "gemm_timings.json"]


def _canon(tag: str) -> str:
    return tag.replace("/g8n/", "/g8m/")


def load(paths) -> dict[tuple[int, int, int], dict[str, float]]:
    """(m, n, k) -> {config tag: fastest measured ms}."""
    meas: dict[tuple[int, int, int], dict[str, float]] = {}
    relative = []  # ((m, n, k), {tag: ms}) timed together in one bar run
    for p in paths:
        d = json.loads(Path(p).read_text())
        pairs = [(r["m"], r["n"], r["k"], r["config"], r["ms"]) for r in d.get("sweep", [])]
        for pt in d.get("points", []):
            pairs += [(pt["m"], pt["n"], pt["k"], tag, ms) for tag, ms in pt["ms"].items()]
        if any(str(r.get("impl", "")).startswith(("rawflux<", "rawflux{")) for r in d.get("rows", [])):
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


def write(meas, path) -> None:
    """The merged set, one point per line (5 significant digits: far below the run-to-run spread)."""
    lines = [json.dumps({"m": m, "n": n, "k": k, "ms": {t: float(f"{v:.5g}") for t, v in sorted(meas[(m, n, k)].items())}})
             for m, n, k in sorted(meas)]
    Path(path).write_text('{"points": [\n' + ",\n".join(lines) + "\n]}\n")


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
    ap.add_argument("--write", default=None, help="also write the merged timings to this file (the --data format)")
    args = ap.parse_args(argv)
    meas = load(args.data)
    if args.write:
        write(meas, args.write)
    rows = regrets(meas, args.sms)
    for key, pick, r in rows:
        if r is None or r > args.show:
            print(f"m={key[0]:5d} {key[1]}x{key[2]}  pick {pick}  regret {'unmeasured' if r is None else f'{r:.3f}'}")
    s = summary(rows)
    print(f"{s['points']} points: regret at m <= 512 mean {s['small_mean']:.4f} max {s['small_max']:.3f}; "
          f"at m > 512 mean {s['large_mean']:.4f} max {s['large_max']:.3f}; picks not measured: {s['unmeasured_picks']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
