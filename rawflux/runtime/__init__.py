"""Array intake (CuPy, torch, JAX, DLPack, __cuda_array_interface__), dtypes, outputs, streams, and
the progress display of long loops (progress.py)."""
from .arrays import (
    Tensor, as_tensor, check_matrix, check_out, check_same_device, check_same_dtype, framework_of, intake_stream, new_output,
    pointer_device, prepare_output, read_dlpack_capsule, wrap_output,
)
from .device import CudaUnavailable, require_cuda
from .dtypes import DType, dtype_of, typestr_to_dtype
from . import fastpath
from .progress import Progress
from .streams import cupy_stream, resolve_stream, stream_handle, stream_wait, use_stream

__all__ = [
    "CudaUnavailable", "DType", "Progress", "fastpath", "Tensor", "as_tensor", "check_matrix", "check_out", "check_same_device", "check_same_dtype",
    "cupy_stream", "dtype_of", "framework_of", "intake_stream", "new_output", "pointer_device", "prepare_output",
    "read_dlpack_capsule", "require_cuda", "resolve_stream", "stream_handle", "stream_wait", "typestr_to_dtype", "use_stream",
    "wrap_output",
]
