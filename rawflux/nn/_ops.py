"""What rawflux.nn calls below it: the fused ops (GEMM + AllReduce among them), the plain GEMM, a
gather and an all-reduce over the tensor-parallel group. The layers call these through this module's namespace, so tests swap
them for reference implementations (tests/cpu/test_nn_cpu.py).

Op objects are the functional rawflux.ag_gemm / rawflux.gemm_rs's own (ops' shared_op), one per
(group, shape, dtype, layout), shared by every layer of that shape and by direct functional
calls; a layer's ``max_m`` sizes them at the first call, so a step at any m <= max_m allocates
nothing (and can be captured in a CUDA graph once a step has run). Without ``max_m`` they grow to
the largest m seen, collectively.
"""
from __future__ import annotations

from .. import baseline
from ..ops import ag_gemm as _ag
from ..ops import gemm_ar as _ar
from ..ops import gemm_rs as _rs
from ..ops.gemm import gemm as _gemm
from ..runtime import DType, as_tensor, resolve_stream

# Columns of the throw-away GEMM behind a gather (ag_gemm has no gather-only call): small next to
# any layer's own n, and a width the fused kernels are checked at.
GATHER_N = 128


def _need(m: int, max_m: int | None, world: int) -> int:
    return max(int(m), int(max_m or 0), world)


def _ag_op(group, n, k, dtype, layout, m, max_m, stream):
    return _ag.shared_op(group, n, k, dtype, layout, _need(m, max_m, group.world), stream=stream)


def _rs_op(group, n, k, dtype, layout, partials, m, max_m, stream):
    return _rs.shared_op(group, n, k, dtype, layout, partials or dtype.tag, _need(m, max_m, group.world), stream=stream)


def _ar_op(group, n, k, dtype, layout, m, max_m, stream):
    return _ar.shared_op(group, n, k, dtype, layout, "fp32", _need(m, max_m, 1), stream=stream)  # any m: no floor of W rows


def ag_gemm(a, b, group, *, b_layout="nk", bias=None, gathered_out=None, return_gathered=False, max_m=None):
    """AllGather(a) @ b^T ("nk") or @ b ("kn") on the caller's stream (rawflux.AGGemm)."""
    s = resolve_stream(None, [a, b])
    ta, tb = as_tensor(a, "a_shard", stream=s), as_tensor(b, "b", stream=s)
    n = tb.shape[0] if b_layout == "nk" else tb.shape[1]
    op = _ag_op(group, n, ta.shape[1], ta.dtype, b_layout, ta.shape[0] * group.world, max_m, s)
    return op(ta, tb, bias=bias, gathered_out=gathered_out, return_gathered=return_gathered, stream=s)


def gemm_rs(a, b, group, *, b_layout="nk", bias=None, partials=None, max_m=None):
    """This rank's rows of sum_q a_q @ b_q^T ("nk") or @ b_q ("kn") (rawflux.GemmRS)."""
    s = resolve_stream(None, [a, b])
    ta, tb = as_tensor(a, "a", stream=s), as_tensor(b, "b_shard", stream=s)
    n = tb.shape[0] if b_layout == "nk" else tb.shape[1]
    op = _rs_op(group, n, ta.shape[1], ta.dtype, b_layout, partials, ta.shape[0], max_m, s)
    return op(ta, tb, bias=bias, stream=s)


def gemm_ar(a, b, group, *, b_layout="nk", bias=None, max_m=None):
    """sum_q a_q @ b_q^T ("nk") or @ b_q ("kn") on every rank, fp32 partials summed in rank order,
    the bias added and rounded once (rawflux.GemmAR): the layers' GEMM + all-reduce."""
    s = resolve_stream(None, [a, b])
    ta, tb = as_tensor(a, "a", stream=s), as_tensor(b, "b_shard", stream=s)
    n = tb.shape[0] if b_layout == "nk" else tb.shape[1]
    op = _ar_op(group, n, ta.shape[1], ta.dtype, b_layout, ta.shape[0], max_m, s)
    return op(ta, tb, bias=bias, stream=s)


def reserve(x, group, m: int, *, ag=None, rs=None, ar=None, gather_k=None, max_m=None) -> None:
    """Build, now, the op objects a backward will call for m rows (construction is collective and
    allocates): ag / rs / ar = (n, k, layout[, partials]); gather_k: a gather of k columns. The autograd
    engine runs a CUDA backward on a thread of its own; this keeps MPI and allocation on the
    caller's. x: any input of the forward (dtype, device, stream)."""
    if group.world == 1:
        return
    s = resolve_stream(None, [x])
    dt = as_tensor(x, "x", stream=s).dtype
    if ag is not None:
        _ag_op(group, ag[0], ag[1], dt, ag[2], m, max_m, s)
    if rs is not None:
        _rs_op(group, rs[0], rs[1], dt, rs[2], rs[3], m, max_m, s)
    if ar is not None:
        _ar_op(group, ar[0], ar[1], dt, ar[2], m, max_m, s)
    if gather_k is not None:
        _ag_op(group, GATHER_N, gather_k, dt, "nk", m, max_m, s)


def gemm(a, b, *, b_layout="nk", bias=None, out_dtype=None):
    """a @ b^T ("nk") or a @ b ("kn") on one GPU (rawflux.gemm)."""
    return _gemm(a, b, b_layout=b_layout, bias=bias, out_dtype=out_dtype)


_gather_w: dict[tuple, object] = {}


def gather(x, group, *, max_m=None):
    """AllGather(x) along rows: (W * m_loc, k). A view of the gather op's buffer, valid until the
    next gather with the same k and dtype: use it on the same stream before then."""
    if group.world == 1:
        return x
    t = as_tensor(x, "x")
    key = (t.framework, t.device, t.dtype, t.shape[1])
    w = _gather_w.get(key)
    if w is None:  # its values never matter: only the gathered rows are used
        w = _gather_w[key] = _zeros_like(x, (GATHER_N, t.shape[1]))
    _, full = ag_gemm(x, w, group, return_gathered=True, max_m=max_m)
    return full


def _zeros_like(x, shape):
    if type(x).__module__.startswith("torch"):
        return x.new_zeros(shape)
    import cupy

    with cupy.cuda.Device(as_tensor(x, "x").device):
        return cupy.zeros(shape, dtype=x.dtype)


# --------------------------------------------------------------------------------------------
# all-reduce

_ipc_bufs: dict[int, tuple[object, object]] = {}


def all_reduce(x, group, *, pg=None):
    """Sum ``x`` (a contiguous torch tensor or CuPy array) over the group, in place; returns x.

    pg: a torch.distributed process group over the same ranks, to reduce through it. Else NCCL
    (the group's communicator: capturable, no allocation), or where ranks share a GPU and NCCL
    refuses (the emulated node) rawflux's symmetric buffers: every rank sums the W copies in the
    same order in fp32, so all end with the same bits (host-sized buffers: not capturable)."""
    if group.world == 1:
        return x
    if pg is not None:
        import torch.distributed as dist

        dist.all_reduce(x, group=pg)
        return x
    s = resolve_stream(None, [x])
    t = as_tensor(x, "x", stream=s)
    if not t.is_row_major():
        raise ValueError(f"all_reduce needs a contiguous array, got strides {t.strides} for shape {t.shape}")
    if baseline.choose_backend(group) == "nccl":
        group.nccl().allReduce(t.ptr, t.ptr, t.numel, baseline.NCCL_DTYPE[t.dtype], baseline.NCCL_SUM, s)
        return x
    _ipc_all_reduce(group, t, s)
    return x


def _ipc_all_reduce(group, t, s: int) -> None:
    import numpy as np

    from ..runtime import use_stream

    nbytes = t.nbytes
    got = _ipc_bufs.get(id(group))
    buf = got[1] if got is not None and got[0] is group else None
    if buf is None or buf.closed or buf.nbytes < nbytes:
        if buf is not None and not buf.closed:
            group.free_symmetric(buf)
        buf = group.symmetric(max(1 << 20, 1 << (nbytes - 1).bit_length()), "rawflux.nn.all_reduce")
        _ipc_bufs[id(group)] = (group, buf)
    with use_stream(s, t.device):
        mine = _cupy_of(t)
        buf.view(mine.dtype, t.numel)[...] = mine
        group.barrier(s)  # every rank's copy is in its buffer
        acc = buf.peer_view(0, mine.dtype, t.numel).astype(np.float32)
        for q in range(1, group.world):
            acc += buf.peer_view(q, mine.dtype, t.numel).astype(np.float32)
        group.barrier(s)  # every rank has read every buffer: the next call may overwrite them
        mine[...] = acc.astype(mine.dtype)


def _cupy_of(t):
    """A flat CuPy array over a contiguous runtime Tensor (no copy)."""
    import cupy

    mem = cupy.cuda.UnownedMemory(int(t.ptr), t.nbytes, t, int(t.device))
    return cupy.ndarray((t.numel,), dtype=DType.from_any(t.dtype).np, memptr=cupy.cuda.MemoryPointer(mem, 0))


def clear_cache() -> None:
    """Close the op objects rawflux.nn uses (shared with the functional rawflux.ag_gemm / gemm_rs) and
    its buffers (collective: every rank calls it)."""
    _ag.clear_cache()
    _rs.clear_cache()
    _gather_w.clear()
    for group, buf in list(_ipc_bufs.values()):
        if not group.closed and not buf.closed:
            group.free_symmetric(buf)
    _ipc_bufs.clear()
