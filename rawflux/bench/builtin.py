"""The impls the harness times: the non-overlapped baselines (NCCL and ipc collectives), the GEMM
alone (rawflux.gemm, CuPy, torch), the communication alone (the same collectives), the barrier,
the fused rawflux ops (ag_gemm, gemm_rs, gemm_ar) and PyTorch SymmetricMemory's async-TP ops, and the layer op's model steps
(their factories in rawflux/bench/layer.py).

Each factory gets a ``timing.Ctx`` and returns ``run(i)`` (enqueue one execution on
``ctx.stream`` with input set i).
"""
from __future__ import annotations

import warnings

from . import layer
from .registry import Unavailable, register


def _nccl(ctx):
    try:
        return ctx.group.nccl()
    except Exception as e:  # noqa: BLE001  (no libnccl, or the communicator failed to form)
        raise Unavailable(f"NCCL: {type(e).__name__}: {e}") from None


def _empty(ctx, shape):
    import cupy

    with cupy.cuda.Device(ctx.group.device_id):
        return cupy.empty(shape, ctx.dtype.np)


# --------------------------------------------------------------------------------------------
# non-overlapped baselines, one row per collective backend


def _check_backend(ctx, backend):
    from .. import baseline

    if backend == "nccl":
        if baseline.shares_gpu(ctx.group):
            raise Unavailable("NCCL refuses several ranks on one GPU (the emulated node): see the ipc rows")
        _nccl(ctx)
    elif not getattr(ctx.group, "peer_access", True):
        raise Unavailable("the ipc backend needs peer access between every pair of GPUs: " + "; ".join(getattr(ctx.group, "peer_problems", [])))


def _nonoverlap(op, backend):
    def factory(ctx):
        from .. import baseline

        _check_backend(ctx, backend)
        fn = getattr(baseline, op)
        out = _empty(ctx, ctx.problem.out_shape)
        sets, group, stream = ctx.sets, ctx.group, ctx.stream
        return lambda i: fn(sets[i]["a"], sets[i]["b"], group, out=out, stream=stream, backend=backend)

    factory.__doc__ = f"rawflux.baseline.{op}(backend={backend!r}): the collective and cupy.matmul one after the other"
    return factory


for _op in ("ag_gemm", "gemm_rs"):
    register(_op, "nccl+cublas", "nonoverlap", _nonoverlap(_op, "nccl"))
    register(_op, "ipc+cublas", "nonoverlap", _nonoverlap(_op, "ipc"))


# --------------------------------------------------------------------------------------------
# fused rawflux ops (rows appear once rawflux exports ag_gemm / gemm_rs that are not the baseline)


def _fused(op, why="communication fused into the GEMM", check=None, **options):
    """The factory of rawflux.{op}(..., **options) rows; check(ctx) raises Unavailable where they cannot run."""
    def factory(ctx):
        import rawflux

        from .. import baseline

        fn = getattr(rawflux, op, None)
        if fn is None or fn is getattr(baseline, op, None):
            raise Unavailable(f"rawflux.{op} (fused) is not exported yet")
        if check is not None:
            check(ctx)
        out = _empty(ctx, ctx.problem.out_shape)
        sets, group, stream = ctx.sets, ctx.group, ctx.stream
        fn(sets[0]["a"], sets[0]["b"], group, out=out, stream=stream, **options)  # compile / tune outside the timing
        return lambda i: fn(sets[i]["a"], sets[i]["b"], group, out=out, stream=stream, **options)

    args = "".join(f"({k}={v!r})" for k, v in options.items())
    factory.__doc__ = f"rawflux.{op}{args}: {why}"
    return factory


register("ag_gemm", "rawflux", "fused", _fused("ag_gemm"), gemm_ref="rawflux_gemm")
register("gemm_rs", "rawflux", "fused", _fused("gemm_rs"), gemm_ref="rawflux_gemm")
register("gemm_ar", "rawflux", "fused", _fused("gemm_ar"), gemm_ref="rawflux_gemm")


def _all_reduce_into(ctx, backend, x) -> None:
    """x (m, n) summed over the group in place, on ctx.stream: NCCL, or rawflux.nn's IPC all-reduce."""
    if backend == "nccl":
        from ..baseline import NCCL_DTYPE, NCCL_SUM

        ctx.group.nccl().allReduce(x.data.ptr, x.data.ptr, x.size, NCCL_DTYPE[ctx.dtype], NCCL_SUM, int(ctx.stream.ptr))
    else:
        from ..nn._ops import _ipc_all_reduce
        from ..runtime import as_tensor

        _ipc_all_reduce(ctx.group, as_tensor(x, "x"), int(ctx.stream.ptr))


def _ar_nonoverlap(backend):
    def factory(ctx):
        import cupy

        _check_backend(ctx, backend)
        out = _empty(ctx, ctx.problem.out_shape)
        sets, stream = ctx.sets, ctx.stream

        def run(i):
            with stream:
                cupy.matmul(sets[i]["a"], sets[i]["b"].T, out=out)
            _all_reduce_into(ctx, backend, out)

        return run

    factory.__doc__ = f"cupy.matmul (cuBLAS), then an in-place all-reduce of (m, n), {backend} backend"
    return factory


def _all_reduce(backend):
    def factory(ctx):
        _check_backend(ctx, backend)
        buf = _empty(ctx, ctx.problem.out_shape)
        with ctx.stream:
            buf[...] = ctx.sets[0]["partial"]
        return lambda i: _all_reduce_into(ctx, backend, buf)  # the sums grow from call to call; the time does not depend on them

    factory.__doc__ = f"all-reduce (sum) of the (m, n) partial, in place, {backend} backend"
    return factory


register("gemm_ar", "nccl+cublas", "nonoverlap", _ar_nonoverlap("nccl"))
register("gemm_ar", "ipc+cublas", "nonoverlap", _ar_nonoverlap("ipc"))
register("gemm_ar", "nccl_allreduce", "comm", _all_reduce("nccl"))
register("gemm_ar", "ipc_allreduce", "comm", _all_reduce("ipc"))


def _half_only(ctx):
    from ..runtime import DType

    if ctx.dtype not in (DType.BF16, DType.F16):
        raise Unavailable(f"rawflux.{ctx.problem.op} takes bf16 / f16, not {ctx.dtype.tag}")


def _no_mps(ctx):
    if getattr(ctx.group, "shares_gpu_under_mps", False):
        raise Unavailable("copy='ce' does not run where ranks share one GPU under MPS (ops.ag_gemm._check_copy_path)")


register("gemm_rs", "rawflux.fp32parts", "fused", _fused("gemm_rs", "twice the bytes on the links, one rounding fewer", _half_only,
                                                         partials="fp32"), gemm_ref="rawflux_gemm")
register("gemm_ar", "rawflux.fp32parts", "fused", _fused("gemm_ar", "twice the bytes, one rounding (rawflux.nn's decode path)", _half_only,
                                                         partials="fp32"), gemm_ref="rawflux_gemm")
# each copy path on its own, beside the rawflux row's per-m pick (ops.ag_gemm.pick_copy)
register("ag_gemm", "rawflux.ce", "fused", _fused("ag_gemm", "one copy path at every m", _no_mps, copy="ce"), gemm_ref="rawflux_gemm")
register("ag_gemm", "rawflux.sm", "fused", _fused("ag_gemm", "one copy path at every m", copy="sm"), gemm_ref="rawflux_gemm")


# --------------------------------------------------------------------------------------------
# the GEMM alone: AG on the gathered A (m, k); RS the partial (m, n) from this rank's k slice


def _gemm_a(ctx, i):
    return ctx.sets[i]["a_full" if ctx.problem.op == "ag_gemm" else "a"]


def _cupy_gemm(ctx):
    """cupy.matmul (cuBLAS) on the local GEMM"""
    import cupy

    out = _empty(ctx, ctx.problem.gemm_out_shape)
    stream = ctx.stream

    def run(i):
        with stream:
            cupy.matmul(_gemm_a(ctx, i), ctx.sets[i]["b"].T, out=out)

    return run


def _torch_gemm(ctx):
    """torch.matmul (cuBLAS / cuBLASLt) on the local GEMM"""
    try:
        import torch
    except ImportError:
        raise Unavailable("torch is not installed") from None
    dev = torch.device("cuda", ctx.group.device_id)
    tdt = getattr(torch, ctx.dtype.torch_name)
    gen = torch.Generator(device=dev)
    gen.manual_seed(ctx.seed)
    p = ctx.problem
    # torch's own fresh inputs (the same shapes and set count as the CuPy sets)
    a_sets = [torch.randn(p.gemm_a_shape, generator=gen, device=dev, dtype=torch.float32).to(tdt) for _ in range(ctx.nsets)]
    b_sets = [torch.randn(p.b_shape, generator=gen, device=dev, dtype=torch.float32).to(tdt) for _ in range(ctx.nsets)]
    out = torch.empty(p.gemm_out_shape, device=dev, dtype=tdt)
    tstream = torch.cuda.ExternalStream(int(ctx.stream.ptr), device=dev)
    torch.cuda.synchronize(dev)

    def run(i):
        with torch.cuda.stream(tstream):
            torch.matmul(a_sets[i], b_sets[i].t(), out=out)

    return run


def _rawflux_gemm(ctx):
    """rawflux.gemm on the local GEMM: the engine the fused op runs, without its communication"""
    import rawflux

    from ..runtime import DType

    if ctx.dtype not in (DType.BF16, DType.F16):
        raise Unavailable(f"rawflux.gemm takes bf16 / f16, not {ctx.dtype.tag}")
    out = _empty(ctx, ctx.problem.gemm_out_shape)
    stream = ctx.stream
    rawflux.gemm(_gemm_a(ctx, 0), ctx.sets[0]["b"], out=out, stream=stream)  # compile outside the timing
    return lambda i: rawflux.gemm(_gemm_a(ctx, i), ctx.sets[i]["b"], out=out, stream=stream)


for _op in ("ag_gemm", "gemm_rs", "gemm_ar"):
    register(_op, "rawflux_gemm", "gemm", _rawflux_gemm)
    register(_op, "cupy.matmul", "gemm", _cupy_gemm)
    register(_op, "torch.matmul", "gemm", _torch_gemm)


# --------------------------------------------------------------------------------------------
# PyTorch SymmetricMemory async-TP (torch.ops.symm_mem.fused_*): the other overlapped design.
# It needs torch.distributed over NCCL, so one rank per GPU; the process group is formed once,
# on first use, with the rendezvous address sent over the rawflux group's MPI communicator.

_torch_pg_name: str | None = None


def _torch_symm_group(ctx) -> str:
    """The name of a torch.distributed NCCL group over the same ranks, symmetric memory on."""
    global _torch_pg_name
    from .. import baseline

    if baseline.shares_gpu(ctx.group):
        raise Unavailable("torch SymmetricMemory needs one rank per GPU (NCCL refuses the emulated node)")
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed import _symmetric_memory as symm
    except ImportError as e:
        raise Unavailable(f"torch.distributed / SymmetricMemory missing: {e}") from None
    if not hasattr(torch.ops, "symm_mem") or not dist.is_nccl_available():
        raise Unavailable("this torch has no symm_mem ops or no NCCL")
    if _torch_pg_name is None:
        comm = ctx.group.comm
        port = comm.bcast(_free_port() if ctx.group.rank == 0 else None, root=0)
        dev = torch.device("cuda", ctx.group.device_id)
        torch.cuda.set_device(dev)
        if not dist.is_initialized():
            # One node (CUDA IPC already assumes it), so the rendezvous is on loopback.
            dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=ctx.group.rank,
                                    world_size=ctx.group.world, device_id=dev)
        name = dist.group.WORLD.group_name
        if hasattr(symm, "enable_symm_mem_for_group"):  # older torch needs it; newer deprecates it as a no-op
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                symm.enable_symm_mem_for_group(name)
        _torch_pg_name = name
    return _torch_pg_name


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torch_symm(op):
    def factory(ctx):
        name = _torch_symm_group(ctx)
        import torch

        p = ctx.problem
        dev = torch.device("cuda", ctx.group.device_id)
        tdt = getattr(torch, ctx.dtype.torch_name)
        gen = torch.Generator(device=dev)
        gen.manual_seed(ctx.seed)
        # torch's own fresh inputs, the same per-rank shapes and set count as the CuPy sets;
        # the weight is (n, k) as a linear layer holds it and goes in transposed, as a view.
        a_sets = [torch.randn(p.a_shape, generator=gen, device=dev, dtype=torch.float32).to(tdt) for _ in range(ctx.nsets)]
        b_sets = [torch.randn(p.b_shape, generator=gen, device=dev, dtype=torch.float32).to(tdt) for _ in range(ctx.nsets)]
        tstream = torch.cuda.ExternalStream(int(ctx.stream.ptr), device=dev)
        if op == "ag_gemm":
            def call(i):
                return torch.ops.symm_mem.fused_all_gather_matmul(a_sets[i], [b_sets[i].t()], 0, name)
        elif op == "gemm_ar":  # torch.matmul into a symmetric buffer, then symm_mem's one-shot all-reduce
            from torch.distributed import _symmetric_memory as symm

            if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce"):
                raise Unavailable("this torch has no symm_mem.one_shot_all_reduce")
            buf = symm.empty(p.gemm_out_shape, dtype=tdt, device=dev)
            symm.rendezvous(buf, name)

            def call(i):
                torch.matmul(a_sets[i], b_sets[i].t(), out=buf)
                return torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", name)
        else:
            def call(i):
                return torch.ops.symm_mem.fused_matmul_reduce_scatter(a_sets[i], b_sets[i].t(), "sum", 0, name)

        def run(i):
            with torch.cuda.stream(tstream):
                call(i)

        run(0)  # symmetric workspace and kernels set up outside the timing
        torch.cuda.synchronize(dev)
        return run

    what = {"ag_gemm": "fused_all_gather_matmul", "gemm_rs": "fused_matmul_reduce_scatter", "gemm_ar": "one_shot_all_reduce after torch.matmul"}[op]
    factory.__doc__ = f"PyTorch SymmetricMemory: torch.ops.symm_mem.{what}"
    return factory


register("ag_gemm", "torch.symm_mem", "fused", _torch_symm("ag_gemm"))
register("gemm_rs", "torch.symm_mem", "fused", _torch_symm("gemm_rs"))
register("gemm_ar", "torch.symm_mem", "fused", _torch_symm("gemm_ar"))


# --------------------------------------------------------------------------------------------
# the communication alone: the same bytes through the same collectives as the baselines


def _all_gather(backend):
    def factory(ctx):
        from .. import baseline

        _check_backend(ctx, backend)
        out = _empty(ctx, ctx.problem.gemm_a_shape)
        group, stream = ctx.group, int(ctx.stream.ptr)

        def run(i):
            with ctx.stream:
                baseline.all_gather_cupy(group, ctx.sets[i]["a"], backend=backend, stream=stream, into=out)

        return run

    factory.__doc__ = f"all-gather of the A shards into (m, k), {backend} backend"
    return factory


def _reduce_scatter(backend):
    def factory(ctx):
        from .. import baseline

        _check_backend(ctx, backend)
        p = ctx.problem
        out = _empty(ctx, p.out_shape)
        group, stream, dt = ctx.group, int(ctx.stream.ptr), ctx.dtype.np

        if backend == "ipc":
            # The partial must sit in the symmetric buffer: put a random one there once, then
            # reduce it every time (nothing writes it in between).
            def fill(part):
                part[...] = ctx.sets[0]["partial"]

            with ctx.stream:
                baseline.reduce_scatter_cupy(group, p.gemm_out_shape, dt, fill, backend=backend, stream=stream)

            def run(i):
                with ctx.stream:
                    baseline.reduce_scatter_cupy(group, p.gemm_out_shape, dt, None, backend=backend, stream=stream)
        else:
            from ..baseline import NCCL_DTYPE, NCCL_SUM

            comm, ndt = group.nccl(), NCCL_DTYPE[ctx.dtype]

            def run(i):
                comm.reduceScatter(ctx.sets[i]["partial"].data.ptr, out.data.ptr, out.size, ndt, NCCL_SUM, stream)

        return run

    factory.__doc__ = f"reduce-scatter (sum) of the (m, n) partials, {backend} backend"
    return factory


register("ag_gemm", "nccl_allgather", "comm", _all_gather("nccl"))
register("ag_gemm", "ipc_allgather", "comm", _all_gather("ipc"))
register("gemm_rs", "nccl_reduce_scatter", "comm", _reduce_scatter("nccl"))
register("gemm_rs", "ipc_reduce_scatter", "comm", _reduce_scatter("ipc"))


# --------------------------------------------------------------------------------------------
# barrier latency (timed 20 at a time, reported per barrier)


def _group_barrier(ctx):
    """Group.barrier: rawflux's device-side barrier"""
    barrier = getattr(ctx.group, "barrier", None)
    if barrier is None:
        raise Unavailable("the group has no barrier()")
    stream = ctx.stream
    barrier(stream)  # first use may compile / allocate: outside the timing
    return lambda i: barrier(stream)


def _nccl_allreduce_4b(ctx):
    """NCCL all-reduce of one float: NCCL's smallest rendezvous, for comparison"""
    import cupy

    from ..baseline import NCCL_DTYPE, NCCL_SUM
    from ..runtime import DType

    _check_backend(ctx, "nccl")
    comm = ctx.group.nccl()
    with cupy.cuda.Device(ctx.group.device_id):
        buf = cupy.zeros(1, cupy.float32)  # a token: its value never matters
    dt, stream = NCCL_DTYPE[DType.F32], int(ctx.stream.ptr)
    return lambda i: comm.allReduce(buf.data.ptr, buf.data.ptr, 1, dt, NCCL_SUM, stream)


register("barrier", "group.barrier", "barrier", _group_barrier, inner=20)
register("barrier", "nccl_allreduce_4B", "barrier", _nccl_allreduce_4b, inner=20)


# --------------------------------------------------------------------------------------------
# the layer op: a TP block's model steps (rawflux/bench/layer.py)

register("layer", "nonoverlap", "nonoverlap", layer.nonoverlap_row)
register("layer", "rawflux", "fused", layer.rawflux_row, gemm_ref="gemm_only")
register("layer", "torch_async_tp", "fused", layer.async_tp_row, gemm_ref="gemm_only")
register("layer", "gemm_only", "gemm", layer.gemm_only_row)
