"""What a lost CUDA context means here, in one error.

rawflux's GEMM kernels bound every pipeline wait and end in ``trap`` when one expires (a stage
that is never filled or released: a stall inside the kernel). A trap ends the process's CUDA
context, so no record can be read back from the device afterwards, and CUDA only says
"unspecified launch failure" at the next call. ``KernelFault`` says instead what the fault most
likely was, which rawflux kernels were launched last, and that the process must restart. The
bounded flag waits between ranks report late peers through the host-mapped status record and
expire first (the pipeline bound is longer), so a fault is never the usual sign of a rank that did
not make its call.
"""
from __future__ import annotations

import collections
import re

# CUresult / cudaError_t codes after which the context is unusable (the same numbers in both APIs).
CONTEXT_LOST = {
    700: "an illegal memory address",
    710: "a device-side assert",
    714: "a hardware stack error",
    715: "an illegal instruction",
    716: "a misaligned address",
    717: "an invalid address space",
    718: "an invalid program counter",
    719: "a kernel that trapped or failed (rawflux's pipeline waits end in trap when they expire)",
}

RECENT = 4  # launches remembered
_recent: collections.deque = collections.deque(maxlen=RECENT)


class KernelFault(RuntimeError):
    """A kernel ended this process's CUDA context; every later CUDA call fails. Restart the process."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def note_launch(symbol: str) -> None:
    """Remember a launch (cheap: one deque append) for the message of a later fault."""
    _recent.append(symbol)


def recent_launches() -> list[str]:
    for _ in range(8):
        try:
            return list(_recent)
        except RuntimeError:  # another thread appended while copying
            continue
    return []


def readable(symbol: str) -> str:
    """A kernel's name without its template arguments: 'rawflux::gemm_kernel<...>' for the
    mangled '_ZN7rawflux11gemm_kernelI...' or the source-level 'rawflux::gemm_kernel<GemmCfg<...>>'."""
    if not symbol.startswith("_ZN"):
        return symbol.split("<", 1)[0] + ("<...>" if "<" in symbol else "")
    i, parts = 3, []
    while i < len(symbol) and symbol[i].isdigit():
        j = i
        while j < len(symbol) and symbol[j].isdigit():
            j += 1
        n = int(symbol[i:j])
        parts.append(symbol[j:j + n])
        i = j + n
    if not parts:
        return symbol
    return "::".join(parts) + ("<...>" if i < len(symbol) and symbol[i] == "I" else "")


def code_of(err) -> int | None:
    """The CUDA error number of ``err``: a cuda-bindings CUresult, an int, or a CuPy
    CUDARuntimeError / CUDADriverError (their ``status``); None when it carries none."""
    if isinstance(err, int):
        return int(err)
    status = getattr(err, "status", None)
    if status is not None:
        return int(status)
    value = getattr(err, "value", None)
    return int(value) if isinstance(value, int) else None


def is_context_lost(err) -> bool:
    return code_of(err) in CONTEXT_LOST


def fault(err, where: str, detail: str = "") -> KernelFault:
    """The KernelFault for error ``err`` (see code_of) seen at ``where``; ``detail``: what else
    the caller knows (a failure in the status record, say)."""
    code = code_of(err)
    cause = CONTEXT_LOST.get(code, "a kernel fault")
    name = getattr(err, "name", None) or str(err).split("\n")[0] or type(err).__name__
    launches = [readable(n) for n in recent_launches()]
    where = re.sub(r"_ZN\w+", lambda mt: readable(mt.group(0)), where)
    last = f"; the last rawflux kernels launched in this process, oldest first: {', '.join(launches)}" if launches else ""
    more = f"; {detail}" if detail else ""
    return KernelFault(
        f"the CUDA context of this process is lost ({name}, error {code}, seen at {where}): most likely {cause}{last}{more}. "
        "A kernel that stalls waiting for a peer is normally reported first by the bounded flag waits (CollectiveTimeout); "
        "this one failed inside the kernel. The process must restart (the GPU state of its CUDA context is gone); "
        "compute-sanitizer or RAWFLUX_DEBUG=1 narrow it down.", code if code is not None else -1)


def raise_if_lost(err, where: str, detail: str = "") -> None:
    """Raise fault(err, where) from err where err means a lost context; otherwise return."""
    if is_context_lost(err):
        raise fault(err, where, detail) from (err if isinstance(err, BaseException) else None)
