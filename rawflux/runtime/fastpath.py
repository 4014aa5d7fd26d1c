"""The host's fast path for repeated calls on CuPy arrays and torch tensors.

A call whose metadata (framework, shapes, strides, dtypes, devices, options: no pointers)
matches an earlier call that passed every check reuses that call's checks and launch block;
what depends on the pointers (alignment, an output overlapping an input) and the stream are
checked again on every call, and anything else goes the validated way, which says what is wrong.
"""
from __future__ import annotations

from .streams import stream_handle as stream_of  # noqa: F401  an explicit stream=, as the validated path reads it

_torch_stream = None  # torch._C._cuda_getCurrentRawStream, looked up on first use


def framework(x) -> str | None:
    """'torch', 'cupy' or None (every other kind of array takes the validated path)."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("cupy"):
        return "cupy"
    return None


def same_framework(fw: str, *xs) -> bool:
    return all(x is None or framework(x) == fw for x in xs)


def _meta_torch(x):
    return (x.shape, x.stride(), x.dtype, x.get_device())


def _meta_cupy(x):
    return (x.shape, x.strides, x.dtype, x.device.id)


def call_key(fw: str, *xs) -> tuple:
    """The metadata of arrays xs (None where absent), hashable; AttributeError / TypeError when an
    array is not what its module promised (the caller then takes the validated path)."""
    meta = _meta_torch if fw == "torch" else _meta_cupy
    return tuple(None if x is None else meta(x) for x in xs)


def key(first, *rest):
    """(framework, metadata of every array) of a call the fast path can take (CuPy or torch
    throughout; None for an absent optional array), else None."""
    fw = framework(first)
    if fw is None or not same_framework(fw, *rest):
        return None
    try:
        return (fw,) + call_key(fw, first, *rest)
    except (AttributeError, TypeError):  # not a plain array after all
        return None


def pointer(fw: str, x) -> int:
    if x is None:
        return 0
    return x.data_ptr() if fw == "torch" else x.data.ptr


def current_stream(fw: str, device: int) -> int:
    """The stream a call without stream= runs on: torch's current stream for torch inputs, else CuPy's."""
    global _torch_stream
    if fw == "torch":
        if _torch_stream is None:
            import torch

            _torch_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
                lambda d: torch.cuda.current_stream(d).cuda_stream)
        return _torch_stream(device)
    import cupy

    return cupy.cuda.get_current_stream(device).ptr


def pointers(fw: str, a, b, bias, out, out_span: int, spans) -> tuple[int, int, int, int] | None:
    """(a, b, out, bias) pointers where the validated path's pointer checks would pass (16-byte
    matrices, 4-byte bias, out overlapping none of the inputs of ``spans`` bytes), else None."""
    pa, pb, pc, pbias = pointer(fw, a), pointer(fw, b), pointer(fw, out), pointer(fw, bias)
    if (pa | pb | pc) & 15 or pbias & 3 or not apart(pc, out_span, (pa, pb, pbias), spans):
        return None
    return pa, pb, pc, pbias


def byte_span(rows: int, cols: int, ld: int, itemsize: int) -> int:
    """Bytes from a row-major matrix's first element to one past its last."""
    return ((rows - 1) * ld + cols) * itemsize if rows and cols else 0


def apart(out_ptr: int, out_span: int, ptrs, spans) -> bool:
    """The output's bytes overlap none of the inputs' (pointer 0: absent)."""
    end = out_ptr + out_span
    return not any(p and out_ptr < p + s and p < end for p, s in zip(ptrs, spans))


def span(t) -> int:
    """Bytes from a checked Tensor's pointer to one past the last byte it can touch (0: None)."""
    if t is None:
        return 0
    return t.byte_range()[1] - t.ptr


def allocator(fw: str, like, device: int):
    """A function making a new array of ``like``'s shape and dtype on ``device`` (the validated
    path's output of a call without out=), in framework fw, on the current stream."""
    shape, dtype = tuple(like.shape), like.dtype
    if fw == "torch":
        import torch

        dev = torch.device("cuda", device)
        return lambda: torch.empty(shape, dtype=dtype, device=dev)
    import cupy

    def new():
        with cupy.cuda.Device(device):
            return cupy.empty(shape, dtype=dtype)

    return new
