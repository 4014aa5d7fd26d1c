"""The measured tuner: results keyed on (m, n, k, dtype, layout, out dtype, SMs, cc), persisted in
<cache dir>/gemm_tune.json. RAWFLUX_TUNE=cached reads them; 'on' also tunes unseen problems on
first use (rawflux/env.py). The fused ops keep theirs in <cache dir>/fused_tune.json (fused_store,
fused_key). Both files are TuneStores (store.py): processes sharing a cache folder merge into them."""
from __future__ import annotations

import json
import math
import threading
from pathlib import Path

from .. import env
from ..runtime.progress import Progress, is_rank0
from .configs import TILES, GemmConfig
from .heuristics import candidates, heuristic
from .model import DeviceInfo, estimate_us
from .store import TuneStore


def tune_key(m, n, k, dtype: str, b_layout: str, out_dtype: str, dev: DeviceInfo) -> str:
    return f"{m},{n},{k},{dtype},{b_layout},{out_dtype},sm{dev.sms},cc{dev.cc[0]}{dev.cc[1]}"


def fused_key(op: str, *, shape: dict, dtype: str, world: int, ranks_per_gpu: int, topology: str, gpu: str, sms: int,
              versions: dict) -> str:
    """The fused-op table's key: every field that can change which configuration wins, so no
    result leaks to another setup. JSON with sorted dicts: equal inputs give one string, and no
    field's text can pass for another's."""
    return json.dumps([op, shape, dtype, world, ranks_per_gpu, topology, gpu, sms, versions],
                      sort_keys=True, separators=(",", ":"), default=str)


_stores_lock = threading.Lock()
_stores: dict[Path, TuneStore] = {}


def _store_at(name: str) -> TuneStore:
    # One store per path: the cache folder is read at each call (RAWFLUX_CACHE_DIR may change).
    path = env.cache_dir() / name
    with _stores_lock:
        if path not in _stores:
            _stores[path] = TuneStore(path)
        return _stores[path]


def gemm_store() -> TuneStore:
    """The plain GEMM's results: <cache dir>/gemm_tune.json, entries {"config": ..., "us": ...}."""
    return _store_at("gemm_tune.json")


def fused_store() -> TuneStore:
    """The fused ops' results (rawflux.ops.ag_gemm, gemm_rs): <cache dir>/fused_tune.json, keyed by fused_key."""
    return _store_at("fused_tune.json")


def lookup(key: str) -> GemmConfig | None:
    if env.tune_mode() == "off":
        return None
    hit = gemm_store().get(key)
    if hit is None:
        return None
    try:
        cfg = GemmConfig.from_json(hit["config"])
    except (KeyError, TypeError, ValueError):
        return None
    return cfg if cfg.tile in TILES else None


def store(key: str, cfg: GemmConfig, us: float) -> None:
    gemm_store().put(key, {"config": cfg.to_json(), "us": us})


def tune(m, n, k, b_layout: str, dev: DeviceInfo, time_us, *, top: int = 10, out_bytes: int = 2) -> tuple[GemmConfig, float]:
    """Times the `top` best candidates of the model with `time_us(cfg) -> microseconds` (the op
    supplies it: tune sits below ops), plus the model's two best stream-K candidates (the model
    flatters stream-K, so they never take a place from the others), and returns the fastest with
    its time."""
    ranked = sorted(candidates(m, n, k, b_layout, dev, out_bytes), key=lambda c: estimate_us(m, n, k, c, dev, out_bytes))
    seen, trials = set(), []
    for c in ranked:  # split tails and bands compete here; stream-K's runs get their own two places below
        if c in seen or (c.stream_k and not c.tail and not c.band):
            continue
        seen.add(c)
        trials.append(c)
        if len(trials) >= top:
            break
    for c in [c for c in ranked if c.stream_k and not c.tail and not c.band][:2]:
        seen.add(c)
        trials.append(c)
    h = heuristic(m, n, k, b_layout, dev, out_bytes)
    if h not in seen:
        trials.append(h)
    best, best_us = None, math.inf
    with Progress(len(trials), f"tune {m}x{n}x{k} {b_layout}", enabled=is_rank0()) as prog:
        for c in trials:
            us = time_us(c)
            if us < best_us:
                best, best_us = c, us
            prog.step(f"{c.tag()} {us:.1f} us (best {best_us:.1f})")
    return best, best_us
