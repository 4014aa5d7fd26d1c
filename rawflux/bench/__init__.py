"""rawflux's benchmark harness (``python -m rawflux.bench`` under mpirun): CUDA events, warm-up,
median of many iterations, maximum over ranks, inputs larger than L2, fresh random data.

Impls are registered per op (``register``); the fused ops add their rows the same way as the
baselines in ``rawflux/bench/builtin.py``. Derived columns (speedup over non-overlapped, exposed
communication, overlap efficiency) are computed wherever their ingredients were timed.

``--op layer`` times a Llama-shaped block's TP layers as training, prefill and decode steps
(rawflux, the non-overlapped reference, torch async-TP, the GEMMs alone): rawflux/bench/layer.py.
"""
from .layer import LAYER_PRESETS, LayerProblem, LayerShape, build_layer_problems
from .problems import PRESETS, Problem, build_problems, parse_shapes
from .registry import OPS, ROLES, Failed, Impl, Unavailable, impls, register
from .report import REQUIRED, SCHEMA, derive, format_table, validate, write_json

__all__ = [
    "LAYER_PRESETS", "OPS", "PRESETS", "REQUIRED", "ROLES", "SCHEMA", "Failed", "Impl", "LayerProblem", "LayerShape", "Problem",
    "Unavailable", "build_layer_problems", "build_problems", "derive", "format_table", "impls", "parse_shapes", "register",
    "validate", "write_json",
]
