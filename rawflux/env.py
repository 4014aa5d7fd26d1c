"""Every environment switch rawflux reads, in one place.

Nothing else in the package calls ``os.environ``: add a switch here, document it in README.md.
Values are read on each call so tests can change them with ``monkeypatch.setenv``.
"""
from __future__ import annotations

import os
from pathlib import Path


def _flag(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    """RAWFLUX_CACHE_DIR: where compiled cubins live (default ~/.cache/rawflux)."""
    raw = os.environ.get("RAWFLUX_CACHE_DIR")
    if raw:
        return Path(raw).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "rawflux"


def disk_cache_enabled() -> bool:
    """RAWFLUX_DISABLE_DISK_CACHE=1 compiles every kernel anew (memory cache still applies)."""
    return not _flag("RAWFLUX_DISABLE_DISK_CACHE")


def jit_verbose() -> bool:
    """RAWFLUX_JIT_VERBOSE=1 prints each compile with its time and ptxas report."""
    return _flag("RAWFLUX_JIT_VERBOSE")


def cuda_src_override() -> Path | None:
    """RAWFLUX_CUDA_SRC: a cuda_src folder to use instead of the packaged one (kernel development)."""
    raw = os.environ.get("RAWFLUX_CUDA_SRC")
    return Path(raw).expanduser() if raw else None


def wait_timeout_s() -> float:
    """RAWFLUX_WAIT_TIMEOUT_S: bound on every device-side spin-wait (default 10 s)."""
    raw = os.environ.get("RAWFLUX_WAIT_TIMEOUT_S")
    return float(raw) if raw else 10.0


def debug() -> bool:
    """RAWFLUX_DEBUG=1 compares each op's call metadata across ranks before launching (costs an
    MPI allgather per call, so not capturable in a CUDA graph)."""
    return _flag("RAWFLUX_DEBUG")


def tune_mode() -> str:
    """RAWFLUX_TUNE: 'off' (heuristic only), 'cached' (use stored results, default), 'on' (tune
    unseen shapes on first call)."""
    return os.environ.get("RAWFLUX_TUNE", "cached").strip().lower()


def arch_override() -> str | None:
    """RAWFLUX_ARCH: compile for this architecture (e.g. sm_90a) instead of the device's."""
    return os.environ.get("RAWFLUX_ARCH") or None
