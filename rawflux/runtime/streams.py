"""Which CUDA stream an op runs on, and making CuPy work on it.

An op launches on: the stream the caller passed (CuPy stream, torch stream, anything with
``__cuda_stream__``, or a raw handle), else torch's current stream of the inputs' device when any
input is a torch tensor (so the op orders with the caller's torch work), else CuPy's current
stream. JAX exposes no stream: its arrays are synchronised through DLPack at intake instead.
"""
from __future__ import annotations

import contextlib

from .device import require_cuda


def _is_torch(x) -> bool:
    return (type(x).__module__ or "").startswith("torch")


def stream_handle(stream) -> int:
    """The raw cudaStream_t of an explicit stream object or int (0 = legacy default stream)."""
    if isinstance(stream, bool):
        raise TypeError("stream must be a CUDA stream or an int handle, not a bool")
    if isinstance(stream, int):
        if stream < 0:
            raise ValueError(f"stream handle {stream} is negative")
        return stream
    if _is_torch(stream) and hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    proto = getattr(stream, "__cuda_stream__", None)  # CUDA stream protocol (cuda.core, CuPy 14)
    if proto is not None:
        got = proto() if callable(proto) else proto
        return int(got[1])
    ptr = getattr(stream, "ptr", None)  # CuPy Stream / ExternalStream (CuPy 13)
    if ptr is not None:
        return int(ptr)
    raise TypeError(
        f"stream of type {type(stream).__module__}.{type(stream).__name__}: pass a CuPy stream, a torch.cuda.Stream, "
        "an object with __cuda_stream__, or an int cudaStream_t handle"
    )


def _device_of(x) -> int | None:
    dev = getattr(x, "device", None)
    if isinstance(dev, int):  # rawflux Tensor
        return dev
    index = getattr(dev, "index", None)  # torch.device
    if isinstance(index, int):
        return index
    dev_id = getattr(dev, "id", None)  # cupy.cuda.Device
    return dev_id if isinstance(dev_id, int) else None


def resolve_stream(stream, tensors=()) -> int:
    """The stream handle an op launches on: ``stream`` if given, else torch's current stream on
    the device of the first torch input (rawflux Tensors or raw arrays), else CuPy's current
    stream on the first input's device (or the current device)."""
    if stream is not None:
        return stream_handle(stream)
    require_cuda()
    first_dev = None
    for t in tensors:
        fw = getattr(t, "framework", None)  # a rawflux Tensor says; a raw array is judged by its type
        is_torch = fw == "torch" if isinstance(fw, str) else _is_torch(t) and getattr(getattr(t, "device", None), "type", "") == "cuda"
        dev = _device_of(t)
        if first_dev is None and dev is not None and dev >= 0:
            first_dev = dev
        if is_torch:
            import torch

            return int(torch.cuda.current_stream(dev).cuda_stream)
    import cupy

    return int(cupy.cuda.get_current_stream(-1 if first_dev is None else first_dev).ptr)


class _Handle:
    """A bare handle behind the CUDA stream protocol, for cupy.cuda.Stream.from_external."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def cupy_stream(handle: int):
    """A CuPy stream object for a raw handle (not owned: CuPy never destroys it)."""
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:  # CuPy 14: ExternalStream is deprecated
        return from_external(_Handle(int(handle)))
    return cupy.cuda.ExternalStream(int(handle))


@contextlib.contextmanager
def use_stream(stream, device: int | None = None):
    """Make ``stream`` (any form stream_handle takes; None keeps the current one) CuPy's current
    stream, and ``device`` its current device, for the body: CuPy allocations, copies and
    kernels in it then order with the op's launch. Yields the handle (or None)."""
    import cupy

    handle = None if stream is None else stream_handle(stream)
    with contextlib.ExitStack() as stack:
        if device is not None:
            stack.enter_context(cupy.cuda.Device(device))
        if handle is not None:
            stack.enter_context(cupy_stream(handle))
        yield handle


def stream_wait(waiter: int, producer: int, device: int | None = None) -> None:
    """Make ``waiter`` wait (on the device, no host sync) for work queued so far on ``producer``."""
    if int(waiter) == int(producer):
        return
    import cupy

    with contextlib.ExitStack() as stack:
        if device is not None:
            stack.enter_context(cupy.cuda.Device(device))
        ev = cupy.cuda.Event(disable_timing=True)
        ev.record(cupy_stream(producer))
        cupy_stream(waiter).wait_event(ev)
