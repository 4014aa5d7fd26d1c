"""rawflux.runtime on a GPU: CuPy, torch (bf16 and fp8 too) and JAX inputs; outputs handed back
in the caller's framework, with the pointer rawflux reports really being the caller's memory;
streams resolved as documented. Every test here skips without a GPU (tests/conftest.py)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from rawflux import runtime as rt
from rawflux.runtime import DType

cupy = pytest.importorskip("cupy")

RAW = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def _host(shape, dt: DType, rng=None):
    """Fresh random values (never zeros) in ``dt``."""
    rng = rng or np.random.default_rng()
    return (rng.standard_normal(shape) + 3.0).astype(np.float32).astype(dt.np)


def _to_cupy(host):
    """Host array -> CuPy array of the same dtype, moving only unsigned ints (bf16/fp8 safe)."""
    return cupy.asarray(host.view(RAW[host.dtype.itemsize])).view(host.dtype)


def _bits_at(t: rt.Tensor) -> np.ndarray:
    """The bytes at t.ptr as unsigned ints (dense row-major t), read through CuPy."""
    mem = cupy.cuda.UnownedMemory(t.ptr, t.nbytes, t.obj, t.device)
    raw = cupy.ndarray(t.shape, dtype=RAW[t.itemsize], memptr=cupy.cuda.MemoryPointer(mem, 0))
    with cupy.cuda.Device(t.device):
        cupy.cuda.Device().synchronize()
        return raw.get()


def _write_bits(t: rt.Tensor, host) -> None:
    mem = cupy.cuda.UnownedMemory(t.ptr, t.nbytes, t.obj, t.device)
    raw = cupy.ndarray(t.shape, dtype=RAW[t.itemsize], memptr=cupy.cuda.MemoryPointer(mem, 0))
    with cupy.cuda.Device(t.device):
        raw.set(np.ascontiguousarray(host).view(RAW[t.itemsize]))
        cupy.cuda.Device().synchronize()


class OnlyDLPack:
    """Hides everything but DLPack (so rawflux's own capsule parser is used)."""

    def __init__(self, x, legacy=False):
        self.x, self.legacy = x, legacy

    def __dlpack__(self, stream=None, max_version=None, **kw):
        if max_version is None:
            return self.x.__dlpack__(stream=stream)
        if self.legacy:
            raise TypeError("a pre-1.0 producer")
        return self.x.__dlpack__(stream=stream, max_version=max_version)  # a TypeError here: rawflux retries

    def __dlpack_device__(self):
        return self.x.__dlpack_device__()


class OnlyCAI:
    def __init__(self, x):
        self.__cuda_array_interface__ = x.__cuda_array_interface__
        self.x = x


# ---------------------------------------------------------------------------------- CuPy

@pytest.mark.parametrize("dt", list(DType))
def test_cupy_intake(gpu, dt):
    host = _host((96, 64), dt)
    x = _to_cupy(host)
    t = rt.as_tensor(x, "a")
    assert (t.ptr, t.shape, t.strides, t.dtype, t.device, t.framework) == (x.data.ptr, (96, 64), (64, 1), dt, gpu, "cupy")
    assert t.nbytes == host.nbytes and t.is_row_major()
    assert (_bits_at(t) == host.view(RAW[dt.itemsize])).all()
    assert rt.check_matrix(t, "a", dtypes=dt, device=gpu, shape=(96, 64)) is t


def test_cupy_views(gpu):
    x = _to_cupy(_host((64, 128), DType.BF16))
    t = rt.as_tensor(x[:, 8:], "a")
    assert t.ptr == x.data.ptr + 16 and t.strides == (128, 1)
    with pytest.raises(ValueError, match="contiguous rows"):
        rt.check_matrix(t, "a", dtypes=DType.BF16, device=gpu)
    assert rt.check_matrix(t, "a", dtypes=DType.BF16, device=gpu, ld_ok=True).ld == 128
    with pytest.raises(ValueError, match=r"strides \(1, 128\)"):
        rt.check_matrix(x.T, "a", dtypes=DType.BF16, device=gpu)
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        rt.check_matrix(x[:, 1:9], "a", dtypes=DType.BF16, device=gpu, ld_ok=True)


def test_cupy_output_and_cai_and_dlpack_paths(gpu):
    x = _to_cupy(_host((32, 64), DType.F16))
    tx = rt.as_tensor(x, "a")
    tc, obj = rt.new_output((32, 48), DType.BF16, tx)
    assert isinstance(obj, cupy.ndarray) and obj.dtype == DType.BF16.np and obj.shape == (32, 48)
    assert tc.ptr == obj.data.ptr and tc.framework == "cupy" and rt.wrap_output(tx, tc) is obj
    t = rt.as_tensor(OnlyCAI(x), "a")  # the real pointer_device and CAI v3 stream key
    assert (t.ptr, t.device, t.dtype, t.framework) == (x.data.ptr, gpu, DType.F16, "cai")
    s = cupy.cuda.Stream(non_blocking=True)
    assert rt.as_tensor(OnlyCAI(x), "a", stream=s.ptr).ptr == x.data.ptr  # joins the producer stream
    t = rt.as_tensor(OnlyDLPack(x), "a", stream=s.ptr)
    assert (t.ptr, t.device, t.dtype, t.framework) == (x.data.ptr, gpu, DType.F16, "dlpack")


def test_pointer_device_rejects_host_memory(gpu):
    host = np.ones(16, np.float32)
    with pytest.raises(ValueError, match="not CUDA device memory"):
        rt.pointer_device(host.ctypes.data)
    assert rt.pointer_device(cupy.ones(4).data.ptr) == gpu


def test_wrong_device_message_on_a_second_gpu(gpu):
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 GPUs")
    with cupy.cuda.Device(1):
        x = cupy.ones((16, 16), cupy.float32)
    with pytest.raises(ValueError, match=r"^a is on device 1 but the group uses device 0$"):
        rt.check_matrix(x, "a", dtypes=DType.F32, device=0)


# ---------------------------------------------------------------------------------- torch

@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("name, dt", [("bfloat16", DType.BF16), ("float16", DType.F16), ("float32", DType.F32),
                                      ("float8_e4m3fn", DType.E4M3), ("float8_e5m2", DType.E5M2)])
def test_torch_intake(gpu, torch, name, dt):
    x = (torch.randn(80, 64, device=f"cuda:{gpu}") + 3).to(getattr(torch, name))
    t = rt.as_tensor(x, "a")
    assert (t.ptr, t.shape, t.strides, t.dtype, t.device, t.framework) == (x.data_ptr(), (80, 64), (64, 1), dt, gpu, "torch")
    torch.cuda.synchronize()
    want = x.view(torch.uint8 if dt.itemsize == 1 else torch.int16 if dt.itemsize == 2 else torch.int32).cpu().numpy()
    assert (_bits_at(t) == want.view(RAW[dt.itemsize])).all()


def test_torch_views_and_errors(gpu, torch):
    x = torch.randn(64, 128, device=f"cuda:{gpu}", dtype=torch.bfloat16)
    t = rt.as_tensor(x[2:, 8:], "a")
    assert t.ptr == x.data_ptr() + (2 * 128 + 8) * 2 and t.strides == (128, 1)
    with pytest.raises(ValueError, match=r"strides \(1, 128\)"):
        rt.check_matrix(x.t(), "b", dtypes=DType.BF16, device=gpu)
    with pytest.raises(TypeError, match="b has dtype bf16 but must be f16"):
        rt.check_matrix(x, "b", dtypes=DType.F16, device=gpu)
    with pytest.raises(TypeError, match=r"unsupported dtype torch.float64"):
        rt.as_tensor(x.double(), "a")
    raw = x.view(torch.int16)
    with pytest.raises(TypeError):
        rt.as_tensor(raw, "a", dtype=DType.BF16)  # int16 is not raw storage: no silent reinterpretation
    fp8_bytes = torch.randint(0, 255, (16, 32), dtype=torch.uint8, device=f"cuda:{gpu}")
    assert rt.as_tensor(fp8_bytes, "a", dtype="e4m3").dtype is DType.E4M3


@pytest.mark.parametrize("legacy", [False, True])
def test_torch_bf16_through_our_dlpack_parser(gpu, torch, legacy):
    x = torch.randn(48, 64, device=f"cuda:{gpu}", dtype=torch.bfloat16)
    for view in (x, x[:, 16:], x.t()):
        t = rt.as_tensor(OnlyDLPack(view, legacy), "a", stream=torch.cuda.current_stream().cuda_stream)
        assert (t.ptr, t.shape, t.strides, t.dtype, t.device) == (view.data_ptr(), tuple(view.shape), view.stride(), DType.BF16, gpu)


def test_torch_f16_through_cai(gpu, torch):
    x = torch.randn(32, 64, device=f"cuda:{gpu}", dtype=torch.float16)
    t = rt.as_tensor(OnlyCAI(x), "a")
    assert (t.ptr, t.strides, t.dtype, t.device, t.framework) == (x.data_ptr(), (64, 1), DType.F16, gpu, "cai")


@pytest.mark.parametrize("dt", [DType.BF16, DType.F32, DType.E4M3])
def test_torch_output_is_torch_and_pointer_is_its_memory(gpu, torch, dt):
    a = rt.as_tensor(torch.randn(8, 8, device=f"cuda:{gpu}"), "a")
    tc, obj = rt.new_output((40, 24), dt, a)
    assert isinstance(obj, torch.Tensor) and obj.dtype == getattr(torch, dt.torch_name)
    assert tuple(obj.shape) == (40, 24) and obj.device == torch.device("cuda", gpu) and obj.is_contiguous()
    assert rt.wrap_output(a, tc) is obj
    host = _host((40, 24), dt)
    _write_bits(tc, host)  # write through the reported pointer, read back through torch
    torch.cuda.synchronize()
    got = obj.view(torch.uint8 if dt.itemsize == 1 else torch.int16 if dt.itemsize == 2 else torch.int32).cpu().numpy()
    assert (got.view(RAW[dt.itemsize]) == host.view(RAW[dt.itemsize])).all()


def test_torch_output_on_a_side_stream(gpu, torch):
    a = rt.as_tensor(torch.randn(8, 8, device=f"cuda:{gpu}"), "a")
    s = torch.cuda.Stream()
    tc, obj = rt.new_output((16, 16), DType.BF16, a, stream=s.cuda_stream)
    assert tc.ptr == obj.data_ptr()


def test_wrap_cupy_array_for_torch_caller(gpu, torch):
    a = rt.as_tensor(torch.randn(8, 8, device=f"cuda:{gpu}", dtype=torch.bfloat16), "a")
    host = _host((24, 40), DType.BF16)
    arr = _to_cupy(host)
    out = rt.wrap_output(a, arr)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.data_ptr() == arr.data.ptr
    assert np.array_equal(out.float().cpu().numpy(), host.astype(np.float32))


def test_prepare_output_with_torch_out(gpu, torch):
    x = torch.randn(64, 32, device=f"cuda:{gpu}", dtype=torch.bfloat16)
    a = rt.as_tensor(x, "a")
    out = torch.empty(64, 48, device=f"cuda:{gpu}", dtype=torch.bfloat16)
    t, obj = rt.prepare_output(out, "out", (64, 48), DType.BF16, a, inputs={"a": a})
    assert obj is out and t.ptr == out.data_ptr() and rt.wrap_output(a, t) is out
    with pytest.raises(ValueError, match="out overlaps input a"):
        rt.prepare_output(x, "out", (64, 32), DType.BF16, a, inputs={"a": a})
    with pytest.raises(TypeError, match="out has dtype f16 but must be bf16"):
        rt.prepare_output(out.half(), "out", (64, 48), DType.BF16, a)


# ---------------------------------------------------------------------------------- streams

def test_resolve_stream_cupy(gpu):
    x = cupy.ones((4, 4), cupy.float32)
    t = rt.as_tensor(x, "a")
    assert rt.resolve_stream(None, [t]) == cupy.cuda.get_current_stream().ptr
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        assert rt.resolve_stream(None, [t]) == s.ptr
        assert rt.resolve_stream(None, [x]) == s.ptr
        assert rt.resolve_stream(None, []) == s.ptr
    assert rt.resolve_stream(s, [t]) == s.ptr
    assert rt.resolve_stream(s.ptr, [t]) == s.ptr


def test_resolve_stream_torch(gpu, torch):
    x = torch.randn(4, 4, device=f"cuda:{gpu}")
    c = rt.as_tensor(cupy.ones((4, 4), cupy.float32), "c")
    s = torch.cuda.Stream()
    cs = cupy.cuda.Stream(non_blocking=True)
    with torch.cuda.stream(s), cs:  # torch's stream wins whenever any input is torch
        assert rt.resolve_stream(None, [x]) == s.cuda_stream
        assert rt.resolve_stream(None, [c, rt.as_tensor(x, "x")]) == s.cuda_stream
        assert rt.resolve_stream(None, [c]) == cs.ptr
    assert rt.resolve_stream(None, [x]) == torch.cuda.current_stream().cuda_stream
    assert rt.resolve_stream(s, [c]) == s.cuda_stream  # an explicit torch stream


def test_use_stream_makes_cupy_work_there(gpu):
    s = cupy.cuda.Stream(non_blocking=True)
    before = cupy.cuda.get_current_stream().ptr
    with rt.use_stream(s.ptr, gpu) as h:
        assert h == s.ptr and cupy.cuda.get_current_stream().ptr == s.ptr
        y = cupy.arange(1024, dtype=cupy.float32) * 2
    s.synchronize()
    assert cupy.cuda.get_current_stream().ptr == before
    assert float(y[-1].get()) == 2046.0
    with rt.use_stream(None) as h:
        assert h is None and cupy.cuda.get_current_stream().ptr == before


def test_stream_wait_orders_consumer_after_producer(gpu):
    producer, consumer = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    big = cupy.random.standard_normal((4096, 4096), dtype=cupy.float32)
    flag = cupy.zeros(1, cupy.float32)
    cupy.cuda.Device().synchronize()
    with producer:
        for _ in range(4):
            big = big @ big * 1e-3  # keeps the producer busy for a while
        flag.fill(7.0)
    rt.stream_wait(consumer.ptr, producer.ptr, gpu)
    with consumer:
        seen = flag.copy()
    consumer.synchronize()
    assert float(seen.get()[0]) == 7.0


# ---------------------------------------------------------------------------------- JAX

@pytest.fixture
def jax_gpu():
    jax = pytest.importorskip("jax")
    try:
        if not jax.devices("gpu"):
            pytest.skip("JAX has no GPU backend")
    except RuntimeError as e:
        pytest.skip(f"JAX has no GPU backend: {e}")
    return jax


@pytest.mark.parametrize("dt", [DType.BF16, DType.F32])
def test_jax_intake_and_output(gpu, jax_gpu, dt):
    jnp = jax_gpu.numpy
    host = _host((64, 32), dt)
    x = jnp.asarray(host)
    t = rt.as_tensor(x, "a")
    assert t.framework == "jax" and t.dtype is dt and t.shape == (64, 32) and t.strides == (32, 1)
    assert t.ptr == x.unsafe_buffer_pointer() and t.device == x.__dlpack_device__()[1]
    assert (_bits_at(t) == host.view(RAW[dt.itemsize])).all()

    tc, obj = rt.new_output((16, 24), dt, t)
    assert tc.wrap_to == "jax" and isinstance(obj, cupy.ndarray)
    out_host = _host((16, 24), dt)
    _write_bits(tc, out_host)  # stands in for the kernel
    s = cupy.cuda.Stream(non_blocking=True)
    out = rt.wrap_output(t, tc, stream=s.ptr)
    assert isinstance(out, jax_gpu.Array) and out.dtype == dt.np and out.shape == (16, 24)
    assert np.array_equal(np.asarray(out).view(RAW[dt.itemsize]), out_host.view(RAW[dt.itemsize]))


def test_jax_ml_dtypes_agree(gpu, jax_gpu):
    assert np.dtype(jax_gpu.numpy.bfloat16) == DType.BF16.np == np.dtype(ml_dtypes.bfloat16)
