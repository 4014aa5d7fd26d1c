"""Run-time compilation: NVRTC -> cubin, cached on disk and in memory, loaded through CuPy."""
from .compiler import CompileError, CompileResult, compile_cubin, cuda_src_dir, nvrtc_version, parse_resources
from .kernel import Kernel, arch_for_cc, device_arch, get_kernel, kernel_source
from .registry import Variant, register, variants

__all__ = [
    "CompileError", "CompileResult", "Kernel", "Variant", "arch_for_cc", "compile_cubin", "cuda_src_dir",
    "device_arch", "get_kernel", "kernel_source", "nvrtc_version", "parse_resources", "register", "variants",
]
