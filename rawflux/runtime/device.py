"""Whether CUDA can be used here, asked once before rawflux's first CUDA call, so that a machine
without the CUDA packages, a driver or a device gets one sentence saying what is missing instead of
an error from deep inside CuPy."""
from __future__ import annotations

import threading

from .. import env

NEEDS = "rawflux needs an NVIDIA Hopper GPU (sm_90a: H100, H200, GH200)"
EXTRAS = 'pip install "rawflux[cu13]" (or "rawflux[cu12]" for a CUDA 12 driver; nvidia-smi shows which CUDA version the driver supports)'
# The oldest driver of each CUDA major version (minor version compatibility).
MIN_DRIVER = {12: "525", 13: "580"}


class CudaUnavailable(RuntimeError):
    """No usable CUDA device or driver in this process (the message says what was found)."""


_ok = False
_lock = threading.Lock()


def missing_cupy(e: ImportError) -> ModuleNotFoundError:
    """The error for a rawflux installed without a CUDA extra."""
    err = ModuleNotFoundError(f"rawflux needs CuPy and the CUDA Python packages for this call, and they are not installed "
                              f"({e}): install them with {EXTRAS}")
    err.name = "cupy"
    return err


def _driver_text(runtime) -> str:
    try:
        v = int(runtime.driverGetVersion())
    except Exception:  # noqa: BLE001 - no driver library at all
        v = 0
    return "no NVIDIA driver" if v == 0 else f"a driver for CUDA {v // 1000}.{v % 1000 // 10}"


def _needs(runtime) -> str:
    try:
        v = int(runtime.runtimeGetVersion())
    except Exception:  # noqa: BLE001
        return f"{NEEDS} and an NVIDIA driver"
    major = v // 1000
    return (f"{NEEDS} and a driver for CUDA {major} (version {MIN_DRIVER.get(major, '?')} or newer: the CuPy installed "
            f"here is built for CUDA {major}.{v % 1000 // 10})")


def problem() -> Exception | None:
    """Why CUDA cannot be used here, as the error to raise (its message one sentence), or None
    when a device answers."""
    try:
        from cupy.cuda import runtime
    except ImportError as e:
        return missing_cupy(e)
    try:
        n = int(runtime.getDeviceCount())
    except Exception as e:  # noqa: BLE001 - every CUDA failure here means the same to the caller
        return CudaUnavailable(f"no usable CUDA device or driver: {_needs(runtime)}; found {_driver_text(runtime)} "
                               f"({_first_line(e)})")
    if n < 1:
        visible = env.cuda_visible_devices()
        where = "" if visible is None else f" with CUDA_VISIBLE_DEVICES={','.join(visible)!r}"
        return CudaUnavailable(f"no CUDA device visible{where}: {_needs(runtime)}; found {_driver_text(runtime)} and no device")
    return None


def _first_line(e: Exception) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def require_cuda() -> None:
    """Raise CudaUnavailable (ModuleNotFoundError without CuPy) unless CUDA answers; the answer is
    kept once it is yes, so ops can ask on every call."""
    global _ok
    if _ok:
        return
    with _lock:
        if _ok:
            return
        err = problem()
        if err is not None:
            raise err
        _ok = True


__all__ = ["CudaUnavailable", "missing_cupy", "problem", "require_cuda"]
