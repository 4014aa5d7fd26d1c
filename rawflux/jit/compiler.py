"""NVRTC compilation to cubin with a disk cache and a per-process memory cache.

The cache key covers everything that can change the cubin: the kernel source, every file under
cuda_src/ (a superset of the headers reached, so no include is ever missed), the NVRTC options,
the target architecture, the NVRTC version and the rawflux version. Cubins are written to a
temporary name and renamed into place, so many ranks compiling the same kernel at once is safe:
each either finds the finished file or writes an identical one atomically.

Nothing here needs a GPU: CI compiles every kernel variant with this module.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import env
from .._version import __version__


class CompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries NVRTC's log (file:line: error ...)."""


@dataclass(frozen=True)
class CompileResult:
    cubin: bytes
    lowered: dict[str, str]  # name expression -> mangled symbol
    log: str  # NVRTC + ptxas log (the -v resource report)
    key: str
    from_cache: bool = False
    resources: dict[str, dict] = field(default_factory=dict)  # symbol -> ptxas resource report


def cuda_src_dir() -> Path:
    """The cuda_src folder: RAWFLUX_CUDA_SRC, else the copy in an installed wheel
    (rawflux/cuda_src), else the checkout's top-level cuda_src/."""
    override = env.cuda_src_override()
    if override is not None:
        return override
    pkg = Path(__file__).resolve().parent.parent
    for candidate in (pkg / "cuda_src", pkg.parent / "cuda_src"):
        if (candidate / "rawflux").is_dir():
            return candidate
    raise FileNotFoundError(
        f"rawflux cannot find its CUDA sources: looked in {pkg / 'cuda_src'} and "
        f"{pkg.parent / 'cuda_src'}; set RAWFLUX_CUDA_SRC to the cuda_src folder"
    )


_tree_hash_lock = threading.Lock()
_tree_hash_memo: dict[tuple, str] = {}


def _tree_hash(root: Path) -> str:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".cuh", ".cu", ".h"))
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    with _tree_hash_lock:
        memo = _tree_hash_memo.get(stamp)
        if memo is not None:
            return memo
        h = hashlib.sha256()
        for p in files:
            h.update(str(p.relative_to(root)).encode())
            h.update(b"\0")
            h.update(p.read_bytes())
            h.update(b"\0")
        digest = h.hexdigest()
        _tree_hash_memo.clear()
        _tree_hash_memo[stamp] = digest
        return digest


def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return int(major), int(minor)


def _check(err, what: str, prog=None) -> None:
    from cuda.bindings import nvrtc

    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{what} failed: {err}" + (f"\n{_log(prog)}" if prog is not None else ""))


def _log(prog) -> str:
    from cuda.bindings import nvrtc

    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.decode(errors="replace").rstrip("\x00").strip()


def default_options(arch: str) -> list[str]:
    return [
        f"--gpu-architecture={arch}",
        "--std=c++17",
        "--device-as-default-execution-space",
        "-default-device",
        "--use_fast_math",
        "-DNDEBUG",
        f"-I{cuda_src_dir()}",
        "-Xptxas=-v",
        "-lineinfo",
    ]


def cache_key(source: str, name_expressions: tuple[str, ...], options: tuple[str, ...], arch: str) -> str:
    h = hashlib.sha256()
    for part in (
        source,
        "\x1f".join(name_expressions),
        "\x1f".join(o for o in options if not o.startswith("-I")),
        arch,
        "%d.%d" % nvrtc_version(),
        __version__,
        _tree_hash(cuda_src_dir()),
    ):
        h.update(part.encode())
        h.update(b"\x1e")
    return h.hexdigest()[:40]


_RES_FUNC = re.compile(r"Compiling entry function '([^']+)'")
_RES_PROPS = re.compile(r"Function properties for (\S+)")
_RES_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_RES_REGS = re.compile(r"Used (\d+) registers")
_RES_SMEM = re.compile(r"(\d+) bytes smem")
_RES_CUMSTACK = re.compile(r"(\d+) bytes cumulative stack size")


def parse_resources(log: str) -> dict[str, dict]:
    """Per entry function: registers, stack (own frame, or the cumulative stack with callees if
    larger), spill bytes and static smem, from ptxas -v output. "Function properties" blocks of
    non-entry (noinline device) functions are not attributed to any entry."""
    out: dict[str, dict] = {}
    current = None  # the entry whose "Used N registers" line comes next
    props = None  # where the next "stack frame" line belongs (None: a non-entry function)
    for line in log.splitlines():
        m = _RES_FUNC.search(line)
        if m:
            current = out.setdefault(m.group(1), {"registers": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0, "smem": 0})
            props = current
            continue
        m = _RES_PROPS.search(line)
        if m:
            props = out.get(m.group(1))
            continue
        m = _RES_FRAME.search(line)
        if m:
            if props is not None:
                props["stack"], props["spill_stores"], props["spill_loads"] = map(int, m.groups())
            continue
        if current is None:
            continue
        m = _RES_REGS.search(line)
        if m:
            current["registers"] = int(m.group(1))
            m = _RES_SMEM.search(line)
            if m:
                current["smem"] = int(m.group(1))
            m = _RES_CUMSTACK.search(line)
            if m:
                current["stack"] = max(current["stack"], int(m.group(1)))
    return out


def _compile_nvrtc(source: str, filename: str, name_expressions, options) -> tuple[bytes, dict, str]:
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        for expr in name_expressions:
            (err,) = nvrtc.nvrtcAddNameExpression(prog, expr.encode())
            _check(err, f"nvrtcAddNameExpression({expr})")
        opts = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        log = _log(prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"NVRTC could not compile {filename} ({err.name}):\n{log}")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(err, "nvrtcGetCUBIN")
        lowered = {}
        for expr in name_expressions:
            err, name = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
            _check(err, f"nvrtcGetLoweredName({expr})")
            lowered[expr] = name.decode()
        return cubin, lowered, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # atomic on POSIX: readers see the old file, none, or the whole new one
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


_memory_cache: dict[str, CompileResult] = {}
_memory_lock = threading.Lock()


def compile_cubin(
    source: str,
    *,
    arch: str,
    name_expressions: tuple[str, ...] = (),
    filename: str = "rawflux_kernel.cu",
    extra_options: tuple[str, ...] = (),
) -> CompileResult:
    """Compile ``source`` for ``arch`` (e.g. "sm_90a"), or return the cached cubin."""
    options = tuple(default_options(arch)) + tuple(extra_options)
    name_expressions = tuple(name_expressions)
    key = cache_key(source, name_expressions, options, arch)
    with _memory_lock:
        hit = _memory_cache.get(key)
    if hit is not None:
        return hit

    cubin_path = env.cache_dir() / f"{key}.cubin"
    meta_path = env.cache_dir() / f"{key}.json"
    use_disk = env.disk_cache_enabled()
    if use_disk and cubin_path.exists() and meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
            res = CompileResult(cubin_path.read_bytes(), meta["lowered"], meta["log"], key, True, parse_resources(meta["log"]))
            with _memory_lock:
                _memory_cache[key] = res
            return res
        except (OSError, ValueError, KeyError):
            pass  # a damaged entry is rebuilt below

    t0 = time.perf_counter()
    cubin, lowered, log = _compile_nvrtc(source, filename, name_expressions, options)
    if env.jit_verbose():
        print(f"[rawflux.jit] compiled {filename} for {arch} in {time.perf_counter() - t0:.2f}s\n{log}", flush=True)
    res = CompileResult(cubin, lowered, log, key, False, parse_resources(log))
    if use_disk:
        try:
            # cubin first, metadata last: a reader needs both, so it never sees a half entry.
            _atomic_write(cubin_path, cubin)
            _atomic_write(meta_path, json.dumps({"lowered": lowered, "log": log, "options": list(options)}).encode())
        except OSError:
            pass  # a read-only cache folder costs a recompile next time, nothing more
    with _memory_lock:
        _memory_cache[key] = res
    return res


def clear_memory_cache() -> None:
    with _memory_lock:
        _memory_cache.clear()
