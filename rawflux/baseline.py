"""The non-overlapped tensor-parallel baselines: a collective and a cuBLAS GEMM (cupy.matmul), one
after the other on one stream. Every fused op must equal these to within the GEMM's rounding,
and beat them.

    ag_gemm:  out (m, n_local) = AllGather(a_shard) @ B^T             all-gather, then GEMM
    gemm_rs:  out (m/W, n)     = rank r's rows of sum_q a_q @ B_q^T    GEMM, then reduce-scatter

Collectives (``backend``):
  "nccl"  cupy.cuda.nccl (raw-pointer API; bf16 is ncclBfloat16). What a framework does.
  "ipc"   rawflux's symmetric buffers: the all-gather pulls each peer's rows with cudaMemcpyAsync
          (copy engine), the reduce-scatter sums the peers' partials (read in place, in fp32)
          into this rank's rows; device barriers order them. NCCL (>= 2.5) refuses two ranks on
          one GPU, so this is the only baseline on the emulated node.
  "auto"  (default) "ipc" where any two ranks of the group share a GPU, else "nccl".

Precision (``accum``):
  "input" (default) cuBLAS writes the GEMM in the input dtype; NCCL reduce-scatters in that dtype
          (bf16 sums round at every step; the ipc backend sums the rounded partials in fp32).
  "fp32"  the accurate oracle: fp32 GEMM of the (exactly up-cast) inputs, fp32 reduction, bias in
          fp32, one rounding at the end. (Set no CUPY_TF32: it would make the fp32 GEMM TF32.)

``reference_ag_gemm`` / ``reference_gemm_rs`` compute a float64 reference on the host from numpy
arrays, for tests. Inputs may come from any framework rawflux.runtime takes in; outputs come back
in the caller's.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from . import env
from .runtime import DType, as_tensor, check_matrix, check_out, prepare_output, resolve_stream, use_stream, wrap_output

DTYPES = (DType.BF16, DType.F16, DType.F32)
ACCUMS = ("input", "fp32")
B_LAYOUTS = ("nk", "kn")
BACKENDS = ("auto", "nccl", "ipc")

# ncclDataType_t / ncclRedOp_t (nccl.h; stable ABI values). cupy.cuda.nccl exports the same
# numbers, but only where libnccl loads, and its higher-level helpers know no bf16.
NCCL_DTYPE = {DType.F16: 6, DType.F32: 7, DType.BF16: 9}
NCCL_SUM = 0
_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction from the pointers (UVA; IPC-mapped peers too)


# --------------------------------------------------------------------------------------------
# public ops


def ag_gemm(a_shard, b, group=None, *, b_layout="nk", bias=None, out=None, gathered_out=None, stream=None,
            accum="input", backend="auto"):
    """Non-overlapped AllGather-GEMM on rank r of W.

    a_shard: (m/W, k) this rank's rows of A. b: (n_local, k) for ``b_layout="nk"`` (a linear
    layer's weight shard) or (k, n_local) for "kn". bias: (n_local,) or None. Returns
    out (m, n_local) = AllGather(a) @ B^T (+ bias), written into ``out`` when given; the gathered A
    (m, k) is written into ``gathered_out`` when given. bf16 / f16 / f32, row-major operands.
    """
    group = _group(group)
    _check_options(b_layout, accum)
    dev, world = group.device_id, group.world
    s = resolve_stream(stream, [x for x in (a_shard, b, bias, out, gathered_out) if x is not None])
    a_t = _matrix(a_shard, "a_shard", DTYPES, dev, None, s)
    dt = a_t.dtype
    m_loc, k = a_t.shape
    b_t = _matrix(b, "b", (dt,), dev, (None, k) if b_layout == "nk" else (k, None), s)
    n_loc = b_t.shape[0] if b_layout == "nk" else b_t.shape[1]
    if 0 in (m_loc, k, n_loc):
        raise ValueError(f"ag_gemm: empty problem (a_shard {a_t.shape}, b {b_t.shape})")
    m = m_loc * world
    bias_t = _vector(bias, "bias", n_loc, dt, dev, s)
    inputs = {"a_shard": a_t, "b": b_t} | ({"bias": bias_t} if bias_t is not None else {})
    gath_t = _user_out(gathered_out, "gathered_out", (m, k), dt, dev, inputs, s)
    out_t, out_obj = prepare_output(out, "out", (m, n_loc), dt, a_t, stream=s, inputs=inputs, align=1)
    backend = choose_backend(group, backend)
    _debug_compare(group, ("ag_gemm", m_loc, k, dt.tag, accum, backend))  # what the all-gather needs to agree on

    with use_stream(s, dev):
        gath_c = _cupy_view(gath_t) if gath_t is not None else None
        gathered = all_gather_cupy(group, _cupy_view(a_t), backend=backend, stream=s, into=gath_c)
        if gath_c is not None and gathered is not gath_c:
            gath_c[...] = gathered
        bm = _cupy_view(b_t)
        b_kn = bm.T if b_layout == "nk" else bm  # (k, n_local); cuBLAS reads the transposed view as is
        _gemm_into(gathered, b_kn, _cupy_view(out_t), _cupy_view(bias_t) if bias_t is not None else None, accum)
    return out_obj if out is not None else wrap_output(a_t, out_obj, stream=s)


def gemm_rs(a, b_shard, group=None, *, b_layout="nk", bias=None, out=None, stream=None, accum="input", backend="auto"):
    """Non-overlapped GEMM-ReduceScatter on rank r of W.

    a: (m, k_local) this rank's columns of A. b_shard: (n, k_local) for ``b_layout="nk"`` or
    (k_local, n) for "kn". bias: (n,) or None, added once (after the reduction). Returns
    out (m/W, n) = rows r*m/W .. (r+1)*m/W of sum over ranks q of a_q @ B_q^T (+ bias). m must be
    divisible by W. bf16 / f16 / f32, row-major operands.
    """
    group = _group(group)
    _check_options(b_layout, accum)
    dev, world = group.device_id, group.world
    s = resolve_stream(stream, [x for x in (a, b_shard, bias, out) if x is not None])
    a_t = _matrix(a, "a", DTYPES, dev, None, s)
    dt = a_t.dtype
    m, k_loc = a_t.shape
    if m % world:
        raise ValueError(f"gemm_rs: a has m={m} rows, not divisible by the group's world size {world} (each rank gets m/W rows)")
    b_t = _matrix(b_shard, "b_shard", (dt,), dev, (None, k_loc) if b_layout == "nk" else (k_loc, None), s)
    n = b_t.shape[0] if b_layout == "nk" else b_t.shape[1]
    if 0 in (m, k_loc, n):
        raise ValueError(f"gemm_rs: empty problem (a {a_t.shape}, b_shard {b_t.shape})")
    m_loc = m // world
    bias_t = _vector(bias, "bias", n, dt, dev, s)
    inputs = {"a": a_t, "b_shard": b_t} | ({"bias": bias_t} if bias_t is not None else {})
    out_t, out_obj = prepare_output(out, "out", (m_loc, n), dt, a_t, stream=s, inputs=inputs, align=1)
    backend = choose_backend(group, backend)
    _debug_compare(group, ("gemm_rs", m, n, dt.tag, accum, backend))  # what the reduce-scatter needs to agree on

    import cupy

    with use_stream(s, dev):
        am = _cupy_view(a_t)
        bm = _cupy_view(b_t)
        b_kn = bm.T if b_layout == "nk" else bm  # (k_local, n)
        out_c = _cupy_view(out_t)
        if accum == "fp32":
            a32, b32 = am.astype(np.float32), b_kn.astype(np.float32)
            red = reduce_scatter_cupy(group, (m, n), np.float32, lambda part: cupy.matmul(a32, b32, out=part),
                                      backend=backend, stream=s)
        else:
            red = reduce_scatter_cupy(group, (m, n), dt.np, lambda part: cupy.matmul(am, b_kn, out=part),
                                      backend=backend, stream=s, into=out_c)
        if bias_t is not None:
            red += _cupy_view(bias_t).astype(red.dtype, copy=False)
        if red is not out_c:
            out_c[...] = red.astype(dt.np, copy=False)  # fp32 results: the one rounding
    return out_obj if out is not None else wrap_output(a_t, out_obj, stream=s)


# --------------------------------------------------------------------------------------------
# the collectives on CuPy arrays (also the benchmark's communication-alone rows)


def choose_backend(group, backend="auto") -> str:
    """"nccl" or "ipc" (see the module docstring). The same answer on every rank: it looks at
    every rank's GPU (PCI bus ids, known to each rank)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: use one of {BACKENDS}")
    if backend != "auto":
        return backend
    return "ipc" if shares_gpu(group) else "nccl"


def shares_gpu(group) -> bool:
    """True when two ranks of the group use one GPU (the emulated node), where NCCL refuses."""
    bus = getattr(group, "bus_ids", None)
    if bus is None:
        import cupy

        bus = group.comm.allgather(cupy.cuda.Device(group.device_id).pci_bus_id)
    return len({str(b).lower() for b in bus}) < len(bus)


def all_gather_cupy(group, shard, *, backend, stream: int, into=None):
    """The gathered (W * rows, cols) array of every rank's ``shard`` (a CuPy matrix) on ``stream``.
    nccl: into ``into`` when it is a contiguous array of that shape, else a new array. ipc: a
    view of the group's symmetric buffer, valid until the next baseline all-gather."""
    import cupy

    send = shard if shard.flags.c_contiguous else cupy.ascontiguousarray(shard)
    rows, cols = send.shape
    shape = (rows * group.world, cols)
    if backend == "ipc":
        return _ipc_all_gather(group, send, stream)
    dt = DType.from_any(send.dtype)
    out = into if into is not None and into.flags.c_contiguous and into.shape == shape else cupy.empty(shape, send.dtype)
    group.nccl().allGather(send.data.ptr, out.data.ptr, send.size, NCCL_DTYPE[dt], stream)
    return out


def reduce_scatter_cupy(group, shape, dtype, produce, *, backend, stream: int, into=None):
    """This rank's (m/W, n) rows of the sum over ranks of the (m, n) partial that ``produce(buf)``
    writes into ``buf`` (this rank's partial, in ``dtype``; ``produce=None`` reduces whatever the
    buffer holds). nccl: sums in ``dtype``, into ``into`` where it fits. ipc: sums in fp32 and
    returns a new fp32 array."""
    import cupy

    m, n = shape
    m_loc = m // group.world
    dt = np.dtype(dtype)
    if backend == "ipc":
        buf, part = _ipc_partial(group, m, n, dt)
        if produce is not None:
            produce(part)
        return _ipc_reduce_rows(group, buf, m, n, dt, stream)
    part = cupy.empty((m, n), dt)
    if produce is not None:
        produce(part)
    fits = into is not None and into.flags.c_contiguous and into.shape == (m_loc, n) and into.dtype == dt
    red = into if fits else cupy.empty((m_loc, n), dt)
    group.nccl().reduceScatter(part.data.ptr, red.data.ptr, red.size, NCCL_DTYPE[DType.from_any(dt)], NCCL_SUM, stream)
    return red


# --- ipc backend: symmetric buffers, copy-engine pulls, device barriers ----------------------
# A peer reads this rank's buffer between two barriers of the same call; this rank writes it
# only before the first (DESIGN hazard 3). Buffers grow (collectively: every rank makes the same
# calls, so every rank decides alike) and live until the group closes.

_ipc_bufs: dict[int, tuple[object, dict]] = {}


def _ipc_buffer(group, name: str, nbytes: int):
    ent = _ipc_bufs.get(id(group))
    if ent is None or ent[0] is not group:
        ent = _ipc_bufs[id(group)] = (group, {})
    bufs = ent[1]
    buf = bufs.get(name)
    if buf is not None and (buf.closed or buf.nbytes < nbytes):
        if not buf.closed:
            group.free_symmetric(buf)
        buf = None
    if buf is None:
        buf = bufs[name] = group.symmetric(max(1 << 20, 1 << (int(nbytes) - 1).bit_length()), name)
    return buf


def _ipc_all_gather(group, send, stream: int):
    from cupy.cuda import runtime

    world, rank = group.world, group.rank
    rows, cols = send.shape
    nbytes = send.nbytes
    buf = _ipc_buffer(group, "rawflux.baseline.ag", nbytes * world)
    full = buf.view(send.dtype, send.size * world).reshape(rows * world, cols)
    runtime.memcpyAsync(full.data.ptr + rank * nbytes, send.data.ptr, nbytes, _MEMCPY_DEFAULT, stream)
    group.barrier(stream)  # every rank's own rows are in its buffer
    for i in range(1, world):
        q = (rank + i) % world  # rotated: no two ranks read one peer at the same time
        runtime.memcpyAsync(full.data.ptr + q * nbytes, buf.peer_ptrs[q] + q * nbytes, nbytes, _MEMCPY_DEFAULT, stream)
    group.barrier(stream)  # every rank has pulled this rank's rows: the next call may overwrite them
    return full


def _ipc_partial(group, m, n, dt):
    buf = _ipc_buffer(group, "rawflux.baseline.rs", m * n * dt.itemsize)
    return buf, buf.view(dt, m * n).reshape(m, n)


def _ipc_reduce_rows(group, buf, m, n, dt, stream: int):
    world, rank = group.world, group.rank
    m_loc = m // world
    group.barrier(stream)  # every rank's partial is complete
    acc = None
    for i in range(world):
        q = (rank + i) % world  # own partial first, then peers in rotated order
        rows = buf.peer_view(q, dt, m * n).reshape(m, n)[rank * m_loc:(rank + 1) * m_loc]
        if acc is None:
            acc = rows.astype(np.float32)
        else:
            acc += rows.astype(np.float32)
    group.barrier(stream)  # every rank has read this rank's partial: the next call may overwrite it
    return acc


# --------------------------------------------------------------------------------------------
# float64 host references (tests)


def _f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def reference_ag_gemm(a_shards, b, *, b_layout="nk", bias=None) -> np.ndarray:
    """float64 AllGather(A) @ B^T (+ bias) on the host. ``a_shards``: the list of every rank's
    (m/W, k) shard in rank order, or the gathered (m, k) array. Returns (m, n_local)."""
    _check_options(b_layout, "input")
    a = np.concatenate([_f64(s) for s in a_shards], axis=0) if isinstance(a_shards, (list, tuple)) else _f64(a_shards)
    bm = _f64(b)
    c = a @ (bm.T if b_layout == "nk" else bm)
    if bias is not None:
        c += _f64(bias)[None, :]
    return c


def reference_gemm_rs(a_parts: Sequence, b_parts: Sequence, *, rank=None, b_layout="nk", bias=None) -> np.ndarray:
    """float64 sum over ranks q of a_q @ B_q^T (+ bias) on the host. ``a_parts[q]``: rank q's
    (m, k_local); ``b_parts[q]``: rank q's (n, k_local) ("nk") or (k_local, n) ("kn"). Returns
    rank ``rank``'s (m/W, n) rows, or the full (m, n) sum when rank is None."""
    _check_options(b_layout, "input")
    if len(a_parts) != len(b_parts) or not a_parts:
        raise ValueError(f"reference_gemm_rs: {len(a_parts)} a parts and {len(b_parts)} b parts (one per rank needed)")
    c = None
    for aq, bq in zip(a_parts, b_parts):
        bm = _f64(bq)
        term = _f64(aq) @ (bm.T if b_layout == "nk" else bm)
        c = term if c is None else c + term
    if bias is not None:
        c += _f64(bias)[None, :]
    if rank is None:
        return c
    world = len(a_parts)
    if c.shape[0] % world:
        raise ValueError(f"reference_gemm_rs: m={c.shape[0]} not divisible by world {world}")
    rows = c.shape[0] // world
    return c[rank * rows:(rank + 1) * rows]


# --------------------------------------------------------------------------------------------
# helpers


def _group(group):
    if group is not None:
        return group
    from .dist import init

    return init()


def _check_options(b_layout, accum) -> None:
    if b_layout not in B_LAYOUTS:
        raise ValueError(f"b_layout={b_layout!r}: use 'nk' (b is (n, k), a linear layer's weight) or 'kn' (b is (k, n))")
    if accum not in ACCUMS:
        raise ValueError(f"accum={accum!r}: use 'input' (GEMM and reduction in the input dtype) or 'fp32' (fp32 throughout, one rounding)")


def _matrix(x, name, dtypes, dev, shape, stream):
    # Row pitch may exceed the row (ld_ok) and no alignment is needed: NCCL and cuBLAS take any.
    return check_matrix(as_tensor(x, name, stream=stream), name, dtypes=dtypes, device=dev, shape=shape, align=1, ld_ok=True)


def _vector(x, name, n, dt, dev, stream):
    if x is None:
        return None
    t = as_tensor(x, name, stream=stream)
    if t.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {t.shape}")
    if t.dtype not in (dt, DType.F32):
        raise TypeError(f"{name} has dtype {t.dtype}: use the inputs' dtype ({dt}) or f32")
    if t.device != dev:
        raise ValueError(f"{name} is on device {t.device} but the group uses device {dev}")
    return t


def _user_out(x, name, shape, dt, dev, inputs, stream):
    if x is None:
        return None
    return check_out(x, name, shape=shape, dtype=dt, device=dev, inputs=inputs, align=1, stream=stream)


def _cupy_view(t):
    """A CuPy array over a runtime Tensor's memory (any framework), no copy; keeps ``t`` alive."""
    import cupy

    itemsize = t.dtype.itemsize
    shape = tuple(int(s) for s in t.shape)
    extent = 1 + sum((n - 1) * abs(st) for n, st in zip(shape, t.strides)) if all(shape) else 0
    mem = cupy.cuda.UnownedMemory(int(t.ptr), extent * itemsize, t, int(t.device))
    strides = tuple(int(st) * itemsize for st in t.strides)
    return cupy.ndarray(shape, dtype=t.dtype.np, memptr=cupy.cuda.MemoryPointer(mem, 0), strides=strides)


def _gemm_into(a, b_kn, out_c, bias_c, accum) -> None:
    """out_c = a @ b_kn (+ bias): cuBLAS in the input dtype, or fp32 with one rounding."""
    import cupy

    if accum == "fp32":
        c = cupy.matmul(a.astype(np.float32), b_kn.astype(np.float32))
        if bias_c is not None:
            c += bias_c.astype(np.float32)
        out_c[...] = c.astype(out_c.dtype)
        return
    if out_c.flags.c_contiguous:
        cupy.matmul(a, b_kn, out=out_c)
    else:
        out_c[...] = cupy.matmul(a, b_kn)
    if bias_c is not None:
        out_c += bias_c.astype(out_c.dtype, copy=False)


def _debug_compare(group, meta: tuple) -> None:
    """RAWFLUX_DEBUG=1: every rank must make the same call; a mismatch would hang the collective."""
    if not env.debug():
        return
    metas = group.comm.allgather(meta)
    if any(x != metas[0] for x in metas):
        lines = "\n".join(f"  rank {r}: {x}" for r, x in enumerate(metas))
        raise ValueError(f"{meta[0]}: ranks disagree on the call (RAWFLUX_DEBUG=1 check):\n{lines}")
