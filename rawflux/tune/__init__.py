"""GEMM configurations and how one is chosen per problem: the compiled tiles, the work plan of a
launch, a time model on the device's attributes, the heuristic that ranks candidates by it, and a
measured tuner whose results persist as JSON in the cache folder (RAWFLUX_TUNE, rawflux/env.py).

- configs:   TileConfig, Decomp, GemmConfig, parse_tag; the compiled tile tables (TILES, ...)
- plans:     a launch's grid and scheduler parameters (split_plan, sk_plan, narrow_plan, work_plan)
- model:     DeviceInfo, device_info, estimate_us and the model's fitted constants
- heuristics: candidates, heuristic, band_config, narrow_config
- tuner:     the measured tuner (tune_key, lookup, store, tune) and its JSON table; the fused ops'
             table (fused_store, fused_key)
- store:     TuneStore, a JSON table that processes sharing the cache folder merge into

Callers use the names below as ``tune.X``; a test that patches ``tune.device_info`` reaches every
caller, since none inside the package calls it.
"""
from __future__ import annotations

from .configs import (BAND_TILES, BK, DP, KSPLIT_TILES, NARROW_TILES, NARROW_WIDTHS, SMEM_PER_CTA, STREAM_K, TILES, Decomp,
                      GemmConfig, TileConfig, ksplit_base, ksplit_fits, max_stages, parse_tag, smem_bytes, tiles_for)
from .plans import (NarrowPlan, SkPlan, WorkPlan, a_box_rows, a_tail_rows, band_height, band_pieces, band_shape,
                    cluster_tiles, narrow_plan, raster, sk_pieces, sk_plan, split_plan, work_plan)
from .model import (B_OOB_FILL_COST, BAND_FIX_S, DRAM_SM_OVERLAP, KSPLIT_RATE, NARROW_COST, OOB_FILL_COST, PULL_SCALE,
                    TAIL_ROUND_S, DeviceInfo, _a_pull_rows, device_info, estimate_us)
from .heuristics import (BAND_MIN_WAVES, NARROW_MAX_WAVES, NARROW_MIN_ROWS, TAIL_MIN_WAVES, TAIL_SPLITS, band_config,
                        candidates, heuristic, narrow_config)
from .store import TuneStore
from .tuner import fused_key, fused_store, gemm_store, lookup, store, tune, tune_key

__all__ = [
    "_a_pull_rows", "a_box_rows", "a_tail_rows", "B_OOB_FILL_COST", "band_config", "BAND_FIX_S", "band_height",
    "BAND_MIN_WAVES", "band_pieces", "band_shape", "BAND_TILES", "BK", "candidates", "cluster_tiles", "Decomp",
    "device_info", "DeviceInfo", "DP", "DRAM_SM_OVERLAP", "estimate_us", "fused_key", "fused_store", "gemm_store",
    "GemmConfig", "heuristic", "ksplit_base", "ksplit_fits", "KSPLIT_RATE", "KSPLIT_TILES", "lookup", "max_stages",
    "narrow_config", "NARROW_COST", "NARROW_MAX_WAVES", "NARROW_MIN_ROWS", "narrow_plan", "NARROW_TILES",
    "NARROW_WIDTHS", "NarrowPlan", "OOB_FILL_COST", "parse_tag", "PULL_SCALE", "raster", "sk_pieces", "sk_plan",
    "SkPlan", "smem_bytes", "SMEM_PER_CTA", "split_plan", "store", "STREAM_K", "TAIL_MIN_WAVES", "TAIL_ROUND_S",
    "TAIL_SPLITS", "TileConfig", "TILES", "tiles_for", "tune", "tune_key", "TuneStore", "work_plan", "WorkPlan",
]
