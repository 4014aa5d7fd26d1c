"""Every environment switch rawflux reads, in one place.

Nothing else in the package calls ``os.environ``: add a switch here, document it in README.md.
Values are read on each call so tests can change them with ``monkeypatch.setenv``.
"""
from __future__ import annotations

import os
from pathlib import Path


def _flag(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() not in ("0", "false", "no", "off")


def _positive_int(name: str) -> int | None:
    """A switch holding a positive integer; None when unset or empty."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        val = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}") from None
    if val < 1:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}")
    return val


def cache_dir() -> Path:
    """RAWFLUX_CACHE_DIR: where compiled cubins live (default ~/.cache/rawflux)."""
    raw = os.environ.get("RAWFLUX_CACHE_DIR")
    if raw:
        return Path(raw).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "rawflux"


def disk_cache_enabled() -> bool:
    """RAWFLUX_DISABLE_DISK_CACHE=1 compiles every kernel anew (memory cache still applies)."""
    return not _flag("RAWFLUX_DISABLE_DISK_CACHE")


def jit_verbose() -> bool:
    """RAWFLUX_JIT_VERBOSE=1 prints each compile with its time and ptxas report."""
    return _flag("RAWFLUX_JIT_VERBOSE")


def cuda_src_override() -> Path | None:
    """RAWFLUX_CUDA_SRC: a cuda_src folder to use instead of the packaged one (kernel development)."""
    raw = os.environ.get("RAWFLUX_CUDA_SRC")
    return Path(raw).expanduser() if raw else None


def wait_timeout_s() -> float:
    """RAWFLUX_WAIT_TIMEOUT_S: bound on every device-side spin-wait (default 10 s)."""
    raw = os.environ.get("RAWFLUX_WAIT_TIMEOUT_S")
    return float(raw) if raw else 10.0


def debug() -> bool:
    """RAWFLUX_DEBUG=1 compares each op's call metadata across ranks before launching (costs an
    MPI allgather per call, so not capturable in a CUDA graph)."""
    return _flag("RAWFLUX_DEBUG")


def tune_mode() -> str:
    """RAWFLUX_TUNE: 'off' (heuristic only), 'cached' (use stored results, default), 'on' (tune
    unseen shapes on first call); any other value raises ValueError."""
    raw = os.environ.get("RAWFLUX_TUNE") or "cached"
    mode = raw.strip().lower()
    if mode not in ("off", "cached", "on"):
        raise ValueError(f"RAWFLUX_TUNE must be off, cached or on, got {raw!r}")
    return mode


def tune_budget_s() -> float:
    """RAWFLUX_TUNE_BUDGET_S: seconds a fused op may spend tuning one problem (default 120; the
    tuner stops before the candidate that would overrun it)."""
    raw = os.environ.get("RAWFLUX_TUNE_BUDGET_S")
    if raw is None or raw.strip() == "":
        return 120.0
    try:
        val = float(raw)
    except ValueError:
        val = float("nan")
    if not val > 0:  # NaN fails this too
        raise ValueError(f"RAWFLUX_TUNE_BUDGET_S must be a positive number of seconds, got {raw!r}")
    return val


def progress() -> str:
    """RAWFLUX_PROGRESS: how long loops (rawflux.bench's sweep, the tuner) show progress: 'auto'
    (default: a bar on a terminal, a plain line per step in a log), 'bar', 'lines', or 'off'
    (no progress; a sweep's result lines still print)."""
    raw = (os.environ.get("RAWFLUX_PROGRESS") or "auto").strip().lower()
    raw = {"0": "off", "false": "off", "no": "off", "1": "auto"}.get(raw, raw)
    if raw not in ("auto", "bar", "lines", "off"):
        raise ValueError(f"RAWFLUX_PROGRESS must be auto, bar, lines or off, got {raw!r}")
    return raw


def arch_override() -> str | None:
    """RAWFLUX_ARCH: compile for this architecture (e.g. sm_90a) instead of the device's."""
    return os.environ.get("RAWFLUX_ARCH") or None


# --- dist / launch switches (rawflux.dist, rawflux.launch) -----------------------------------


def device_override() -> int | None:
    """RAWFLUX_DEVICE: bind every rank of this process to this CUDA device ordinal (as numbered
    under CUDA_VISIBLE_DEVICES) instead of local_rank % visible devices."""
    raw = os.environ.get("RAWFLUX_DEVICE")
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"RAWFLUX_DEVICE must be a device ordinal (an integer), got {raw!r}") from None


def launcher_local() -> tuple[int, int] | None:
    """(node-local rank, processes on this node) as the MPI launcher (Open MPI, MPICH/Hydra,
    MVAPICH, Slurm) gives them to this process, or None. rawflux binds devices by it only when a
    group is built from a sub-communicator that leaves out some of the node's processes, so two
    TP groups on one node do not both start at device 0."""
    for rank_var, size_var in (("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                               ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
                               ("MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
                               ("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")):
        r, n = os.environ.get(rank_var, ""), os.environ.get(size_var, "")
        if r.strip().isdigit() and n.strip().isdigit():
            return int(r), int(n)
    return None


def launcher_rank() -> int | None:
    """This process's rank in the MPI job as the launcher (Open MPI, MPICH/Hydra, PMIx, MVAPICH,
    Slurm) gives it, or None outside one: who prints progress, without initialising MPI."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"):
        raw = os.environ.get(var, "").strip()
        if raw.isdigit():
            return int(raw)
    return None


def cuda_visible_devices() -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list of entries (None when unset; [] when set to nothing)."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [d.strip() for d in raw.split(",") if d.strip()]


def mpirun() -> str:
    """RAWFLUX_MPIRUN: the MPI launcher rawflux-launch runs (default: mpirun on the PATH)."""
    return os.environ.get("RAWFLUX_MPIRUN") or "mpirun"


def mpirun_extra_args() -> list[str]:
    """RAWFLUX_MPIRUN_ARGS: extra launcher arguments (shell-quoted), e.g. '--tag-output'."""
    import shlex

    return shlex.split(os.environ.get("RAWFLUX_MPIRUN_ARGS", ""))


def mps_control() -> str:
    """RAWFLUX_MPS_CONTROL: the MPS control binary rawflux-launch --emulate starts (default:
    nvidia-cuda-mps-control on the PATH)."""
    return os.environ.get("RAWFLUX_MPS_CONTROL") or "nvidia-cuda-mps-control"


def emulated_node() -> bool:
    """RAWFLUX_EMULATED_NODE=1 (set by rawflux-launch --emulate): all ranks share one GPU under MPS."""
    return _flag("RAWFLUX_EMULATED_NODE")


# --- fused AllGather-GEMM switches (rawflux.ops.ag_gemm) ----------------------------------------


def ag_direction() -> str:
    """RAWFLUX_AG_DIRECTION: default gather direction of rawflux.ag_gemm, 'push' (each rank writes
    its shard into every peer, default) or 'pull' (each rank reads every peer's shard)."""
    raw = (os.environ.get("RAWFLUX_AG_DIRECTION") or "push").strip().lower()
    if raw not in ("push", "pull"):
        raise ValueError(f"RAWFLUX_AG_DIRECTION must be 'push' or 'pull', got {raw!r}")
    return raw


def ag_copy() -> str | None:
    """RAWFLUX_AG_COPY: default copy mode of rawflux.ag_gemm, 'ce' (copy engine), 'sm' (a copy
    kernel on a few SMs, the GEMM on the rest) or 'auto' (per m: 'sm' where the host's copy-engine
    calls would outlast the GEMM, else 'ce'; rawflux.ops.ag_gemm.pick_copy). Unset: 'auto' between
    GPUs, 'sm' where ranks share a GPU (the emulated node: a copy between two processes' buffers on
    one GPU is no copy-engine transfer, and large ones were seen to stall behind a GEMM that waits on them)."""
    raw = (os.environ.get("RAWFLUX_AG_COPY") or "").strip().lower()
    if not raw:
        return None
    if raw not in ("ce", "sm", "auto"):
        raise ValueError(f"RAWFLUX_AG_COPY must be 'ce', 'sm' or 'auto', got {raw!r}")
    return raw


def ag_copy_sms() -> int | None:
    """RAWFLUX_AG_COPY_SMS: SMs the 'sm' copy path of rawflux.ag_gemm takes from the GEMM
    (default: min(16, SMs // 4))."""
    return _positive_int("RAWFLUX_AG_COPY_SMS")


def commit_override() -> str | None:
    """RAWFLUX_COMMIT: the commit benchmark records name when rawflux runs from a copy without
    .git (the device machine gets a copy of the working tree); unset: ``git rev-parse HEAD``."""
    raw = os.environ.get("RAWFLUX_COMMIT", "").strip()
    return raw or None
