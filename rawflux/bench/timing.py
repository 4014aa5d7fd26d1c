"""The measuring method (docs/ARCHITECTURE.md): CUDA events around each timed region, warm-up first, the
median of many iterations per rank, then the maximum over ranks.

Each timed iteration is, on the bench stream:
    delay kernel -> rank alignment (device barrier) -> event -> run x inner -> event
The delay kernel holds the stream while the host queues the rest, so host launch cost stays out
of the events (it matters for short ops: a barrier, small GEMMs); the device barrier makes every
rank start the region together, so a collective's time is not inflated by another rank's late
start. Inputs rotate over several sets (more bytes than 4x L2 in all, where memory allows), so
no iteration finds its operands in L2 from the one before.
"""
from __future__ import annotations

import math
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..jit import register as _register
from .problems import Problem

L2_FALLBACK = 60 * 1024 * 1024  # H100/H200: 50-60 MB
MAX_SETS = 64  # enough for sets down to ~4 MB to exceed 4x a 60 MB L2
HOST_LAUNCH_US = 25  # generous host cost per queued execution, to size the delay kernel
HOST_MARGIN = 1.5  # over an impl's own measured queueing time (run.host_us), where it gives one

# The delay kernel queued before each timed region (python -m rawflux.check_kernels compiles it).
_register("bench_delay.cu", "rawflux::bench_delay_kernel", archs=("sm_90a", "sm_80"))


def plan_nsets(set_bytes: int, l2_bytes: int, budget_bytes: int, max_sets: int = MAX_SETS) -> int:
    """How many input sets to rotate over: enough that all sets hold > 4x L2, at most what the
    memory budget takes (never fewer than 1), at most ``max_sets``."""
    if set_bytes <= 0:
        return 1
    want = math.floor(4 * l2_bytes / set_bytes) + 1  # strictly more than 4x L2
    fit = budget_bytes // set_bytes
    return max(1, min(want, fit, max_sets))


def summarize(times_ms: list[float]) -> dict:
    """Median, p10, p90, min of one rank's per-iteration times."""
    xs = sorted(times_ms)
    q = lambda p: xs[min(len(xs) - 1, max(0, math.ceil(p * len(xs)) - 1))]  # noqa: E731  nearest-rank percentile
    return {"median": statistics.median(xs), "p10": q(0.10), "p90": q(0.90), "min": xs[0]}


# --------------------------------------------------------------------------------------------
# run environment (recorded with every row)


@dataclass
class RunInfo:
    gpu: str
    driver: str
    commit: str | None
    emulated: bool
    ranks_per_gpu: int
    host: str
    l2_bytes: int
    mem_bytes: int
    versions: dict = field(default_factory=dict)


def git_commit() -> str | None:
    """HEAD of the checkout rawflux runs from; RAWFLUX_COMMIT where there is no .git; else None."""
    from rawflux import env

    if env.commit_override():
        return env.commit_override()
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    if out.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40}", sha):
        return None
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=10)
        if dirty.returncode == 0 and dirty.stdout.strip():
            sha += "-dirty"
    except (OSError, subprocess.SubprocessError):
        pass
    return sha


def parse_driver(proc_text: str) -> str | None:
    """The kernel driver version from /proc/driver/nvidia/version's text."""
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)", proc_text)
    return m.group(1) if m else None


def driver_version() -> str:
    try:
        found = parse_driver(Path("/proc/driver/nvidia/version").read_text())
        if found:
            return found
    except OSError:
        pass
    import cupy

    v = cupy.cuda.runtime.driverGetVersion()
    return f"cuda-{v // 1000}.{v % 1000 // 10}"


def run_info(group) -> RunInfo:
    """Collective: every rank must call it."""
    import cupy

    dev = group.device_id
    props = cupy.cuda.runtime.getDeviceProperties(dev)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    host = socket.gethostname()
    where = group.comm.allgather((host, cupy.cuda.Device(dev).pci_bus_id))
    per_gpu = max(where.count(w) for w in where)
    versions = {"cupy": cupy.__version__, "numpy": np.__version__}
    try:
        import ml_dtypes

        versions["ml_dtypes"] = ml_dtypes.__version__
    except ImportError:
        pass
    try:
        from cupy.cuda import nccl

        versions["nccl"] = str(nccl.get_version())
    except Exception:  # noqa: BLE001  (no NCCL: the comm rows will say so)
        pass
    try:
        import torch

        versions["torch"] = torch.__version__
    except ImportError:
        pass
    return RunInfo(
        gpu=name,
        driver=driver_version(),
        commit=git_commit() if group.rank == 0 else None,
        emulated=per_gpu > 1,
        ranks_per_gpu=per_gpu,
        host=host,
        l2_bytes=int(props.get("l2CacheSize") or L2_FALLBACK),
        mem_bytes=int(props.get("totalGlobalMem") or 0),
        versions=versions,
    )


# --------------------------------------------------------------------------------------------
# inputs


@dataclass
class Ctx:
    """What an impl factory gets. ``sets[i]`` holds one input set as CuPy arrays (per-rank shapes,
    see Problem): ag_gemm: "a" (m/W, k), "b" (n/W, k), "a_full" (m, k); gemm_rs: "a" (m, k/W),
    "b" (n, k/W), "partial" (m, n) (gemm_ar the same); layer: nothing (its rows make torch inputs, as many sets).
    Factories allocate their own outputs; ``cache`` holds what the impls of one problem share."""

    problem: Problem
    group: object
    stream: object  # cupy.cuda.Stream
    sets: list
    seed: int
    cache: dict = field(default_factory=dict)

    @property
    def nsets(self) -> int:
        return len(self.sets)

    @property
    def dtype(self):
        from ..runtime import DType

        return DType.from_any(self.problem.dtype)


def set_shapes(p: Problem) -> dict[str, tuple[int, int]]:
    if p.op == "ag_gemm":
        return {"a": p.a_shape, "b": p.b_shape, "a_full": p.gemm_a_shape}
    if p.op in ("gemm_rs", "gemm_ar"):
        return {"a": p.a_shape, "b": p.b_shape, "partial": p.gemm_out_shape}
    return {}


def set_bytes(p: Problem, itemsize: int) -> int:
    if hasattr(p, "input_bytes"):  # the layer op: its own inputs, counted here to size the sets
        return p.input_bytes(itemsize)
    return sum(r * c for r, c in set_shapes(p).values()) * itemsize


def make_sets(p: Problem, nsets: int, seed: int, device_id: int, stream) -> list[dict]:
    """Fresh random inputs (normal, never zeros) on the bench stream."""
    import cupy

    from ..runtime import DType

    dt = DType.from_any(p.dtype)
    sets = []
    with cupy.cuda.Device(device_id), stream:
        rng = cupy.random.default_rng(seed)
        for _ in range(nsets):
            sets.append({key: rng.standard_normal(shape, dtype=np.float32).astype(dt.np) for key, shape in set_shapes(p).items()})
    return sets


# --------------------------------------------------------------------------------------------
# the timer


class Timer:
    def __init__(self, group, stream, *, warmup: int, iters: int, delay_us: float, align: bool):
        import cupy

        self.group, self.stream = group, stream
        self.warmup, self.iters = int(warmup), int(iters)
        self.delay_us, self.align = float(delay_us), bool(align)
        self._delay = None
        self._aligner = None
        self._cupy = cupy
        if self.delay_us > 0:
            from ..jit import get_kernel

            self._delay = get_kernel("bench_delay.cu", "rawflux::bench_delay_kernel", device_id=group.device_id)

    def _delay_launch(self, inner: int, host_us: float = 0.0) -> None:
        if self._delay is not None:
            ns = int((self.delay_us + (HOST_LAUNCH_US + HOST_MARGIN * host_us) * inner) * 1000)
            self._delay.launch((1,), (1,), (np.uint64(ns),), stream=self.stream)

    def _align_launch(self) -> None:
        if not self.align:
            return
        if self._aligner is None:
            self._aligner = make_aligner(self.group, self.stream)
        self._aligner()

    def warm(self, run, nsets: int, inner: int = 1) -> None:
        """Warm-up executions (host side only; the caller agrees across ranks, then syncs)."""
        for i in range(max(1, self.warmup) * inner):
            run(i % nsets)

    def sync(self) -> None:
        self.stream.synchronize()

    def time(self, run, nsets: int, inner: int = 1) -> list[float]:
        """Per-execution ms of each timed iteration on this rank. Also sets ``host_us``: the
        median over the iterations of the host's time to queue one execution (behind the delay
        kernel, so the device never makes the host wait)."""
        cp = self._cupy
        evs = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(self.iters)]
        k = self.warmup * inner
        host_us = float(getattr(run, "host_us", 0.0))  # a whole model step queues for milliseconds
        queued = []
        with cp.cuda.Device(self.group.device_id):
            for e0, e1 in evs:
                self._delay_launch(inner, host_us)
                self._align_launch()
                e0.record(self.stream)
                t0 = time.perf_counter()
                for _ in range(inner):
                    run(k % nsets)
                    k += 1
                queued.append((time.perf_counter() - t0) * 1e6 / inner)
                e1.record(self.stream)
            self.stream.synchronize()
        self.host_us = statistics.median(queued)
        return [cp.cuda.get_elapsed_time(e0, e1) / inner for e0, e1 in evs]


class GpuSide:
    """What a run needs from the GPU: run info, the bench stream, the timer, input sets."""

    def __init__(self, group, args):
        import cupy

        self.group = group
        cupy.cuda.Device(group.device_id).use()
        self.info = run_info(group)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.timer = Timer(group, self.stream, warmup=args.warmup, iters=args.iters, delay_us=args.delay_us,
                           align=not args.no_align)

    def make_sets(self, p: Problem, nsets: int, seed: int) -> list[dict]:
        sets = make_sets(p, nsets, seed, self.group.device_id, self.stream)
        self.stream.synchronize()
        return sets

    def release(self) -> None:
        """After a problem: let its buffers go back to the device."""
        import cupy

        self.stream.synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
        torch = sys.modules.get("torch")  # the layer op's tensors live in torch's caching allocator
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def make_aligner(group, stream):
    """A device-side all-ranks barrier on ``stream``: Group.barrier, else a 4-byte NCCL
    all-reduce (also a device-side rendezvous)."""
    barrier = getattr(group, "barrier", None)
    if barrier is not None and getattr(group, "peer_access", True):
        return lambda: barrier(stream)
    import cupy

    from ..baseline import NCCL_DTYPE, NCCL_SUM
    from ..runtime import DType

    buf = cupy.zeros(1, np.float32)
    comm = group.nccl()
    return lambda: comm.allReduce(buf.data.ptr, buf.data.ptr, 1, NCCL_DTYPE[DType.F32], NCCL_SUM, stream.ptr)


def fresh_seed(rank: int) -> int:
    """A new seed every run (fresh data), different per rank."""
    return int.from_bytes(os.urandom(4), "little") ^ (rank * 0x9E3779B1 & 0xFFFFFFFF)
