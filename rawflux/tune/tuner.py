"""The measured tuner: results keyed on (m, n, k, dtype, layout, out dtype, SMs, cc), persisted in
<cache dir>/gemm_tune.json. RAWFLUX_TUNE=cached reads them; 'on' also tunes unseen problems on
first use (rawflux/env.py)."""
from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path

from .. import env
from ..runtime.progress import Progress, is_rank0
from .configs import TILES, GemmConfig
from .heuristics import candidates, heuristic
from .model import DeviceInfo, estimate_us


def tune_key(m, n, k, dtype: str, b_layout: str, out_dtype: str, dev: DeviceInfo) -> str:
    return f"{m},{n},{k},{dtype},{b_layout},{out_dtype},sm{dev.sms},cc{dev.cc[0]}{dev.cc[1]}"


_tune_lock = threading.Lock()
_tune_table: dict[str, dict] | None = None


def _tune_path() -> Path:
    return env.cache_dir() / "gemm_tune.json"


def _load_table() -> dict[str, dict]:
    global _tune_table
    with _tune_lock:
        if _tune_table is None:
            try:
                _tune_table = json.loads(_tune_path().read_text())
            except (OSError, ValueError):
                _tune_table = {}
        return _tune_table


def lookup(key: str) -> GemmConfig | None:
    if env.tune_mode() == "off":
        return None
    hit = _load_table().get(key)
    if hit is None:
        return None
    try:
        cfg = GemmConfig.from_json(hit["config"])
    except (KeyError, TypeError, ValueError):
        return None
    return cfg if cfg.tile in TILES else None


def store(key: str, cfg: GemmConfig, us: float) -> None:
    table = _load_table()
    with _tune_lock:
        table[key] = {"config": cfg.to_json(), "us": us}
        path = _tune_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache folder: the result lives for this process only


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
