"""What the harness can time: per op, a registry of implementations ("impls"), each a factory.

A factory takes the bench context (problem, group, stream, input sets; see ``timing.Ctx``) and
returns ``run(i)``, a callable that enqueues one execution on ``ctx.stream`` using input set
``i`` (no host synchronisation). It raises ``Unavailable(reason)`` when it cannot run here (torch
missing, op not built yet, shape unsupported): the row is skipped and the reason printed; it
raises ``Failed(reason)`` when its result does not match the reference (the layer op's guard).

Roles say what a row measures, and so how derived columns are computed:
  fused       the op with communication hidden in the GEMM (rawflux, torch SymmetricMemory ...)
  nonoverlap  the collective then the GEMM, one after the other (the baseline to beat)
  gemm        the GEMM alone on data already in place (no communication)
  comm        the communication alone (the same bytes through NCCL)
  barrier     a synchronisation's latency (op "barrier")

Fused ops plug in by registering more impls:

    from rawflux.bench import register
    register("ag_gemm", "rawflux", "fused", my_factory, gemm_ref="rawflux_gemm")
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

OPS = ("ag_gemm", "gemm_rs", "gemm_ar", "barrier", "layer")
ROLES = ("fused", "nonoverlap", "gemm", "comm", "barrier")


class Unavailable(Exception):
    """An impl cannot run here; the message says why."""


class Failed(Exception):
    """An impl ran and its result is wrong: the row is not timed and the run lists it as failed."""


@dataclass(frozen=True)
class Impl:
    op: str
    name: str
    role: str
    factory: Callable  # (ctx) -> run(i)
    gemm_ref: str | None = None  # the "gemm" impl its exposed communication is measured against
    inner: int = 1  # executions per timed region (short ops: time a batch, report per execution)
    doc: str = ""


_impls: dict[str, dict[str, Impl]] = {op: {} for op in OPS}


def register(op: str, name: str, role: str, factory: Callable | None = None, *, gemm_ref: str | None = None,
             inner: int = 1, doc: str = ""):
    """Register an impl (replacing one of the same op and name). Usable as a decorator when
    ``factory`` is omitted."""
    if op not in OPS:
        raise ValueError(f"op {op!r}: one of {OPS}")
    if role not in ROLES:
        raise ValueError(f"role {role!r}: one of {ROLES}")
    if int(inner) < 1:
        raise ValueError(f"inner={inner}: at least 1")

    def add(fn: Callable) -> Callable:
        _impls[op][name] = Impl(op, name, role, fn, gemm_ref, int(inner), doc or (fn.__doc__ or "").strip().split("\n")[0])
        return fn

    return add if factory is None else add(factory)


def impls(op: str, roles=None, names=None) -> list[Impl]:
    """The impls of ``op`` in registration order, optionally only those of ``roles`` / ``names``."""
    if op not in OPS:
        raise ValueError(f"op {op!r}: one of {OPS}")
    return [i for i in _impls[op].values() if (roles is None or i.role in roles) and (names is None or i.name in names)]
