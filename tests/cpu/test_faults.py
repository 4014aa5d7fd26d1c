"""KernelFault: a lost CUDA context explained (rawflux/jit/faults.py) and where rawflux raises it."""
from __future__ import annotations

import enum

import pytest

from rawflux import KernelFault
from rawflux.jit import faults


class CUresult(enum.IntEnum):  # cuda-bindings' enum, as far as these tests need it
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_LAUNCH_FAILED = 719


class CupyLikeError(RuntimeError):  # CuPy's CUDARuntimeError carries the code in .status
    def __init__(self, status, text):
        super().__init__(text)
        self.status = status


def test_codes_are_read_from_every_kind_of_error():
    assert faults.code_of(719) == 719
    assert faults.code_of(CUresult.CUDA_ERROR_LAUNCH_FAILED) == 719
    assert faults.code_of(CupyLikeError(700, "cudaErrorIllegalAddress: an illegal memory access")) == 700
    assert faults.code_of(ValueError("no code")) is None
    assert faults.is_context_lost(719) and faults.is_context_lost(715) and not faults.is_context_lost(1)


def test_the_message_says_what_failed_where_and_what_to_do():
    for name in ("rawflux::ag_local_kernel", "rawflux::gemm_kernel<...>"):
        faults.note_launch(name)
    e = faults.fault(CUresult.CUDA_ERROR_LAUNCH_FAILED, "ag_gemm.synchronize", "this rank's status record: nothing late")
    text = str(e)
    assert isinstance(e, KernelFault) and e.code == 719
    assert "CUDA_ERROR_LAUNCH_FAILED, error 719, seen at ag_gemm.synchronize" in text
    assert "trapped" in text and "must restart" in text and "status record: nothing late" in text
    assert text.index("rawflux::ag_local_kernel") < text.index("rawflux::gemm_kernel<...>")  # oldest first
    for i in range(faults.RECENT + 3):
        faults.note_launch(f"k{i}")
    assert faults.recent_launches() == [f"k{i}" for i in range(3, faults.RECENT + 3)]  # only the latest are kept


def test_kernel_names_lose_their_template_arguments():
    mangled = "_ZN7rawflux11gemm_kernelINS_7GemmCfgILi128ELi256EEENS_12StreamKSchedEEEvNS_9TensorMapE"
    assert faults.readable(mangled) == "rawflux::gemm_kernel<...>"
    assert faults.readable("_ZN7rawflux15ag_local_kernelENS_11AgLocalArgsE") == "rawflux::ag_local_kernel"
    assert faults.readable("rawflux::gemm_kernel<rawflux::GemmCfg<128, 256>>") == "rawflux::gemm_kernel<...>"
    assert faults.readable("boom") == "boom"
    assert "seen at launch of rawflux::gemm_kernel<...>" in str(faults.fault(719, f"launch of {mangled}"))


def test_only_a_lost_context_is_translated():
    faults.raise_if_lost(CupyLikeError(1, "cudaErrorInvalidValue"), "x")  # returns: the caller re-raises its own error
    cause = CupyLikeError(719, "cudaErrorLaunchFailure: unspecified launch failure")
    with pytest.raises(KernelFault, match="cudaErrorLaunchFailure: unspecified launch failure, error 719") as info:
        faults.raise_if_lost(cause, "Group.synchronize")
    assert info.value.__cause__ is cause


def test_a_failed_launch_of_the_engine_says_the_context_is_lost(monkeypatch):
    import importlib

    engine_launch = importlib.import_module("rawflux.engine.launch")  # the module (rawflux.engine.launch is also a function)

    class FakeDriver:
        def __init__(self, err):
            self.err = err

        def cuLaunchKernelEx(self, *args):
            return (self.err,)

        def cuGetErrorString(self, err):
            return (CUresult.CUDA_SUCCESS, b"what the driver says")

    class Kernel:
        symbol = "rawflux::gemm_kernel<test>"

    monkeypatch.setattr(engine_launch, "_cu", FakeDriver(CUresult.CUDA_ERROR_LAUNCH_FAILED))
    with pytest.raises(KernelFault, match=r"seen at launch of rawflux::gemm_kernel<test>.*launched in this process.*rawflux::gemm_kernel<\.\.\.>"):
        engine_launch._driver_launch((None, None), 0, Kernel())
    monkeypatch.setattr(engine_launch, "_cu", FakeDriver(CUresult.CUDA_ERROR_INVALID_VALUE))
    with pytest.raises(RuntimeError, match="CUDA_ERROR_INVALID_VALUE: what the driver says") as info:
        engine_launch._driver_launch((None, None), 0, Kernel())
    assert not isinstance(info.value, KernelFault)
