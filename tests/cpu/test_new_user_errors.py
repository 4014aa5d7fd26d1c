"""The errors a new user meets first, on a machine without a GPU: argument errors before any CUDA
call, one sentence when CUDA cannot be used (no CuPy, no driver, no device), the op's own dtypes,
rawflux-launch and rawflux.bench without a GPU."""
from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

import rawflux
from rawflux import launch
from rawflux.ops import gemm as G
from rawflux.runtime import device
from tests.fake_arrays import FakeCupy, at

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cuda_calls(monkeypatch):
    """No CUDA here, whatever the machine: the first CUDA call raises and is recorded."""
    seen = []

    def no_cuda():
        seen.append("cuda")
        return device.CudaUnavailable("no usable CUDA device or driver (test)")

    monkeypatch.setattr(device, "_ok", False)
    monkeypatch.setattr(device, "problem", no_cuda)
    return seen


def a(shape=(64, 128), dtype=np.float16, **kw):
    return FakeCupy(shape, dtype, ptr=kw.pop("ptr", at(1)), **kw)


def b(shape=(256, 128), dtype=np.float16, **kw):
    return FakeCupy(shape, dtype, ptr=kw.pop("ptr", at(2)), **kw)


@pytest.mark.parametrize("args,kw,exc,match", [
    ((np.zeros((64, 128), np.float16), b()), {}, TypeError, r"a is a numpy \(host\) array"),
    ((a(), np.zeros((256, 128), np.float16)), {}, TypeError, r"b is a numpy \(host\) array"),
    ((a((128,)), b()), {}, ValueError, r"a must be a 2-D matrix, got 1-D shape \(128,\)"),
    ((a(), b((256, 64))), {}, ValueError, r"k differs"),
    ((a((64, 132)), b((256, 132))), {}, ValueError, r"k = 132 must be a positive multiple of 8"),
    ((a(strides=(2, 128)), b()), {}, ValueError, r"a has strides \(1, 64\)"),
    ((a(ptr=at(1) + 4), b()), {}, ValueError, r"a's data pointer .* not 16-byte aligned"),
    ((a(dtype=np.float64), b()), {}, TypeError, r"^a has dtype float64 but must be bf16 or f16$"),
    ((a(dtype=np.float32), b()), {}, TypeError, r"^a has dtype f32 but must be bf16 or f16$"),
    ((a(), b(dtype=np.float64)), {}, TypeError, r"^b has dtype float64 but must be f16$"),
    ((a(), b()), {"out": FakeCupy((64, 128), np.float16, ptr=at(3))}, ValueError, r"out has shape \(64, 128\) but \(64, 256\)"),
    ((a(), b()), {"bias": FakeCupy((128,), np.float16, ptr=at(3))}, ValueError, r"bias must have shape \(256,\)"),
    ((a(), b()), {"b_layout": "tn"}, ValueError, r"b_layout must be"),
])
def test_gemm_checks_its_arguments_before_any_cuda_call(cuda_calls, args, kw, exc, match):
    with pytest.raises(exc, match=match):
        rawflux.gemm(*args, **kw)
    assert cuda_calls == []


def test_torch_cpu_tensors_are_refused_before_any_cuda_call(cuda_calls):
    torch = pytest.importorskip("torch")
    x = torch.zeros((64, 128), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"a is a torch tensor on cpu: rawflux needs CUDA tensors"):
        rawflux.gemm(x, x)
    with pytest.raises(ValueError, match=r"a is a torch tensor on cpu"):
        rawflux.gemm(torch.zeros(128, dtype=torch.bfloat16), x)  # 1-D and on the CPU: the CPU is what to fix first
    assert cuda_calls == []


def test_a_good_call_without_cuda_is_one_sentence(cuda_calls):
    with pytest.raises(rawflux.CudaUnavailable, match=r"^no usable CUDA device or driver \(test\)$"):
        rawflux.gemm(a(), b())
    assert cuda_calls == ["cuda"]


class _CudaError(RuntimeError):
    pass


def _fake_runtime(monkeypatch, *, count, driver=0, runtime_version=13020):
    from cupy.cuda import runtime

    def device_count():
        if isinstance(count, Exception):
            raise count
        return count

    monkeypatch.setattr(runtime, "getDeviceCount", device_count)
    monkeypatch.setattr(runtime, "driverGetVersion", lambda: driver)
    monkeypatch.setattr(runtime, "runtimeGetVersion", lambda: runtime_version)
    monkeypatch.setattr(device, "_ok", False)


def test_no_driver_names_what_rawflux_needs_and_what_was_found(monkeypatch):
    pytest.importorskip("cupy")
    err = _CudaError("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version\nmore")
    _fake_runtime(monkeypatch, count=err)
    with pytest.raises(rawflux.CudaUnavailable) as info:
        device.require_cuda()
    msg = str(info.value)
    assert msg == ("no usable CUDA device or driver: rawflux needs an NVIDIA Hopper GPU (sm_90a: H100, H200, GH200) and a "
                   "driver for CUDA 13 (version 580 or newer: the CuPy installed here is built for CUDA 13.2); found no NVIDIA "
                   "driver (_CudaError: cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version)")
    assert "\n" not in msg


def test_no_device_and_an_old_driver(monkeypatch):
    pytest.importorskip("cupy")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    _fake_runtime(monkeypatch, count=0, driver=12040, runtime_version=12080)
    with pytest.raises(rawflux.CudaUnavailable, match=r"^no CUDA device visible with CUDA_VISIBLE_DEVICES='': .* a driver "
                                                      r"for CUDA 12 \(version 525 or newer.*found a driver for CUDA 12.4 and no device$"):
        device.require_cuda()


def test_a_working_device_is_asked_once(monkeypatch):
    pytest.importorskip("cupy")
    calls = []
    _fake_runtime(monkeypatch, count=1)
    from cupy.cuda import runtime

    monkeypatch.setattr(runtime, "getDeviceCount", lambda: calls.append(1) or 1)
    device.require_cuda()
    device.require_cuda()
    assert calls == [1]


def test_missing_cupy_names_the_extras(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # an install without a CUDA extra
    monkeypatch.setitem(sys.modules, "cupy.cuda", None)
    monkeypatch.setattr(device, "_ok", False)
    with pytest.raises(ModuleNotFoundError) as info:
        rawflux.gemm(a(), b())
    msg = str(info.value)
    assert 'pip install "rawflux[cu13]"' in msg and '"rawflux[cu12]"' in msg and "CuPy" in msg
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"cu13", "cu12"} <= set(extras) and any("cupy" in d for d in extras["cu13"]) and any("cupy" in d for d in extras["cu12"])


def test_import_needs_no_cupy(tmp_path):
    import subprocess

    code = "import sys; sys.modules['cupy'] = None; import rawflux, rawflux.nn, rawflux.plan; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "ok", r.stderr


def test_launch_without_a_gpu_says_so(monkeypatch, capsys):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(launch.shutil, "which", lambda name: None if name == "nvidia-smi" else "/usr/bin/" + name)
    with pytest.raises(launch.LaunchError, match=r"^no NVIDIA GPU found on this node \(nvidia-smi is not on the PATH, "
                                                 r"CUDA_VISIBLE_DEVICES is unset\): rawflux needs NVIDIA Hopper GPUs"):
        launch.local_gpu_count()


def test_bench_without_cuda_is_one_line(monkeypatch, capsys):
    from rawflux.bench import cli

    def init():
        raise rawflux.CudaUnavailable("no usable CUDA device or driver: rawflux needs an NVIDIA Hopper GPU")

    monkeypatch.setattr(cli, "init_group", init)
    assert cli.main(["--quick"]) == 1
    err = capsys.readouterr().err
    assert err == "rawflux.bench: no usable CUDA device or driver: rawflux needs an NVIDIA Hopper GPU\n"


def test_gemm_dtypes_are_its_own():
    assert G.DTYPES == (rawflux.runtime.DType.BF16, rawflux.runtime.DType.F16)
