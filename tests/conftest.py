"""Shared test helpers: GPU detection. Tests marked ``gpu`` (and every test under tests/gpu/) skip
with the reason when no GPU is usable, so the suite passes on CPU-only machines and CI."""
from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import pytest

_GPU_DIR = Path(__file__).resolve().parent / "gpu"


@functools.lru_cache(maxsize=None)
def gpu_available() -> tuple[bool, str]:
    """(True, description) when CuPy can see a device and allocate on it, else (False, why)."""
    try:
        import cupy
    except Exception as e:  # noqa: BLE001 - any import failure means "no GPU here"
        return False, f"cupy is not importable: {type(e).__name__}: {e}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        return False, f"no usable CUDA driver/GPU: {type(e).__name__}: {e}"
    if count < 1:
        return False, "no CUDA device visible"
    try:
        probe = cupy.zeros(4, dtype=cupy.float32)  # a tiny allocation plus a memset
        cupy.cuda.Device().synchronize()
        del probe
    except Exception as e:  # noqa: BLE001
        return False, f"CUDA device present but unusable: {type(e).__name__}: {e}"
    return True, f"{count} CUDA device(s)"


def pytest_configure(config):
    """Under an MPI launcher with several processes on this node, each rank gets its own base temp
    dir (unless --basetemp is given): ranks sharing /tmp/pytest-of-<user> race in pytest's cleanup
    of old numbered dirs, and one of them warns that it could not remove a `garbage-*` dir."""
    from rawflux.env import launcher_local

    local = launcher_local()
    if local is None or local[1] < 2 or config.option.basetemp:
        return
    config.option.basetemp = str(Path(tempfile.gettempdir()) / f"pytest-rawflux-{os.getuid()}-rank{local[0]}")


def pytest_collection_modifyitems(config, items):
    ok, reason = None, ""
    for item in items:
        if Path(str(item.path)).resolve().is_relative_to(_GPU_DIR):
            item.add_marker(pytest.mark.gpu)
        if item.get_closest_marker("gpu") is None:
            continue
        if ok is None:
            ok, reason = gpu_available()
        if not ok:
            item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {reason}"))


@pytest.fixture
def gpu() -> int:
    """Skip unless a GPU is usable; the device ordinal to use (0)."""
    ok, reason = gpu_available()
    if not ok:
        pytest.skip(f"needs a GPU: {reason}")
    return 0
