"""Every kernel variant rawflux can launch, registered by the op modules at import time, so the
CPU check (``python -m rawflux.check_kernels``) compiles exactly what users can hit."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    relpath: str  # file under cuda_src/rawflux/kernels/
    name_expr: str  # C++ name expression NVRTC instantiates, e.g. "rawflux::barrier_kernel"
    archs: tuple[str, ...]  # architectures this variant must compile for
    extra_options: tuple[str, ...] = ()


_variants: list[Variant] = []


def register(relpath: str, name_expr: str, archs=("sm_90a", "sm_80"), extra_options=()) -> Variant:
    v = Variant(relpath, name_expr, tuple(archs), tuple(extra_options))
    if v not in _variants:
        _variants.append(v)
    return v


def variants() -> list[Variant]:
    return list(_variants)
