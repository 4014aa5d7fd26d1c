"""Problem shapes: the global (m, n, k) of a tensor-parallel op and each rank's share of it.

Shapes are given as the model's, before the split: AllGather-GEMM splits n over the W ranks
(column parallel: QKV, MLP up), GEMM-ReduceScatter splits k (row parallel: attention out, MLP
down); both split m (sequence parallel activations). GEMM + AllReduce (decode's row parallel
layers) splits k only: every rank takes the whole m and ends with the whole (m, n).
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_M = (1024, 2048, 4096, 8192)
QUICK_M = (1024,)
DECODE_SET_M = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # --decode; an m that W does not divide is skipped, saying so

# Named shape sets: op -> [(label, n, k)], the full model's layer, before the TP split.
PRESETS: dict[str, dict[str, list[tuple[str, int, int]]]] = {
    # The FLUX paper's GPT-3 175B-like TP layers (hidden 12288, MLP 49152).
    "paper": {
        "ag_gemm": [("mlp_up", 49152, 12288)],
        "gemm_rs": [("mlp_down", 12288, 49152)],
        "gemm_ar": [("mlp_down", 12288, 49152)],
    },
    # Llama-3 70B: hidden 8192, MLP 28672 (gate and up fused: 57344), 64 query heads and 8 KV
    # heads of 128 (QKV: 8192 + 2 * 1024 = 10240).
    "llama70b": {
        "ag_gemm": [("qkv", 10240, 8192), ("mlp_gate_up", 57344, 8192)],
        "gemm_rs": [("attn_out", 8192, 8192), ("mlp_down", 8192, 28672)],
        "gemm_ar": [("attn_out", 8192, 8192), ("mlp_down", 8192, 28672)],
    },
}


@dataclass(frozen=True)
class Problem:
    op: str  # "ag_gemm" | "gemm_rs" | "gemm_ar" | "barrier"
    m: int
    n: int
    k: int
    dtype: str  # DType tag: "bf16", "f16", "f32"
    world: int
    label: str = ""

    def check(self) -> str | None:
        """None when the split is even, else why this problem is skipped at this world size."""
        if self.op == "barrier":
            return None
        if min(self.m, self.n, self.k) <= 0:
            return f"m, n, k must be positive (got {self.m}, {self.n}, {self.k})"
        split = "n" if self.op == "ag_gemm" else "k"
        dims = (("m", self.m), (split, getattr(self, split))) if self.op != "gemm_ar" else (("k", self.k),)
        bad = [name for name, v in dims if v % self.world]
        if bad:
            return f"{' and '.join(bad)} not divisible by world {self.world}"
        return None

    @property
    def flops_per_rank(self) -> float:
        """Each rank does 2 m n k / W multiply-adds' worth of FLOPs in every op."""
        return 2.0 * self.m * self.n * self.k / self.world

    # Per-rank shapes. "nk" weight layout (a linear layer's weight), which the harness times.
    @property
    def a_shape(self) -> tuple[int, int]:
        """The A operand a rank holds: AG (m/W, k) rows; RS (m, k/W) columns."""
        return (self.m // self.world, self.k) if self.op == "ag_gemm" else (self.m, self.k // self.world)

    @property
    def b_shape(self) -> tuple[int, int]:
        """The weight shard, (n, k) layout: AG (n/W, k); RS (n, k/W)."""
        return (self.n // self.world, self.k) if self.op == "ag_gemm" else (self.n, self.k // self.world)

    @property
    def out_shape(self) -> tuple[int, int]:
        """AG (m, n/W); RS (m/W, n); AR (m, n)."""
        if self.op == "gemm_ar":
            return (self.m, self.n)
        return (self.m, self.n // self.world) if self.op == "ag_gemm" else (self.m // self.world, self.n)

    @property
    def gemm_a_shape(self) -> tuple[int, int]:
        """A of the local GEMM once communication is done: AG the gathered (m, k); RS (m, k/W)."""
        return (self.m, self.k) if self.op == "ag_gemm" else (self.m, self.k // self.world)

    @property
    def gemm_out_shape(self) -> tuple[int, int]:
        """The local GEMM's output: AG (m, n/W); RS the partial sum (m, n) before reduce-scatter."""
        return (self.m, self.n // self.world) if self.op == "ag_gemm" else (self.m, self.n)

    def comm_elems(self) -> int:
        """Elements one collective moves per rank's output: AG gathers (m, k); RS reduces (m, n); an
        all-reduce counts twice (m, n), so that bus_gbps gives NCCL-tests' 2 (W - 1) / W factor."""
        return self.m * (self.k if self.op == "ag_gemm" else self.n) * (2 if self.op == "gemm_ar" else 1)


def parse_ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in text.replace(";", ",").split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise ValueError(f"{what}: expected positive integers, got {text!r}")
    return vals


def parse_shapes(spec: str) -> dict[str, list[tuple[str, int | None, int, int]]] | list[tuple[str, int | None, int, int]]:
    """``spec``: preset names (``paper``, ``llama70b``; several joined by ',' or '+') -> {op:
    [(label, None, n, k)]}; or shapes "m,n,k" / "n,k" separated by spaces or ';' -> [(label, m or
    None, n, k)] applying to every op (m None: use the --m list)."""
    keys = [t.strip() for t in spec.strip().lower().replace("+", ",").split(",")]
    if all(key in PRESETS for key in keys):
        merged: dict[str, list] = {}
        for key in dict.fromkeys(keys):
            for op, rows in PRESETS[key].items():
                merged.setdefault(op, []).extend((f"{key}.{lab}", None, n, k) for lab, n, k in rows)
        return merged
    out = []
    for item in spec.replace(";", " ").split():
        try:
            vals = parse_ints(item, f"shape {item!r}")
        except ValueError as e:
            raise ValueError(f"{e} (or preset names: {', '.join(PRESETS)})") from None
        if len(vals) == 3:
            out.append((item, vals[0], vals[1], vals[2]))
        elif len(vals) == 2:
            out.append((item, None, vals[0], vals[1]))
        else:
            raise ValueError(f"shape {item!r}: give m,n,k or n,k (or a preset: {', '.join(PRESETS)})")
    if not out:
        raise ValueError(f"--shapes {spec!r}: no shapes (use a preset: {', '.join(PRESETS)}, or m,n,k triples)")
    return out


def build_problems(ops, shapes_spec: str, ms, dtypes, world: int) -> list[Problem]:
    """Every (op, shape, m, dtype) to time, in a stable order. ``ops`` among ag_gemm, gemm_rs, gemm_ar."""
    parsed = parse_shapes(shapes_spec)
    probs = []
    for op in ops:
        rows = parsed.get(op, []) if isinstance(parsed, dict) else parsed
        for label, m_fixed, n, k in rows:
            for m in ([m_fixed] if m_fixed is not None else ms):
                for dt in dtypes:
                    probs.append(Problem(op, int(m), int(n), int(k), dt, world, label))
    return probs
