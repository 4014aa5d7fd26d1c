"""rawflux.jit with no GPU: NVRTC to cubin, the disk cache and its key, concurrent compiles,
compile errors, ptxas resource parsing, and the check_kernels CPU check."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="needs NVRTC (cuda-bindings + nvidia-cuda-nvrtc)")

from rawflux import jit  # noqa: E402
from rawflux.jit import compiler, registry  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ARCHS = ("sm_90a", "sm_80")

TINY = r"""#pragma once
#include "rawflux/ptx/types.cuh"
namespace rawflux {
// out = scale * in + bias: a kernel small enough to compile in a blink, with a template entry too.
__global__ void test_tiny_kernel(float* out, const float* in, u32 n) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.0f * in[i] + 1.0f;
}
template <int kScale>
__global__ void test_tiny_scaled(float* out, u32 n) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] *= float(kScale);
}
}  // namespace rawflux
"""

# 48 live accumulators: fine at the default register limit, spills when capped at 24 registers.
SPILLY = r"""#pragma once
namespace rawflux {
__global__ void test_spill_kernel(float* out, const float* in) {
  float acc[48];
#pragma unroll
  for (int j = 0; j < 48; ++j) acc[j] = in[threadIdx.x + j * 32];
#pragma unroll
  for (int r = 0; r < 8; ++r) {
#pragma unroll
    for (int j = 0; j < 48; ++j) acc[j] = acc[j] * acc[(j + r + 1) % 48] + 1.0f;
  }
#pragma unroll
  for (int j = 0; j < 48; ++j) out[threadIdx.x + j * 32] = acc[j];
}
}  // namespace rawflux
"""

BAD = "#pragma once\nnamespace rawflux {\n__global__ void test_bad_kernel(float* p) {\n  p[0] = no_such_name;\n}\n}\n"


@pytest.fixture
def src(tmp_path, monkeypatch):
    """A private copy of cuda_src (RAWFLUX_CUDA_SRC) with the test kernels, and a private cache."""
    monkeypatch.delenv("RAWFLUX_CUDA_SRC", raising=False)
    monkeypatch.delenv("RAWFLUX_DISABLE_DISK_CACHE", raising=False)
    monkeypatch.delenv("RAWFLUX_JIT_VERBOSE", raising=False)
    monkeypatch.delenv("RAWFLUX_NVRTC_DEFINES", raising=False)
    root = tmp_path / "cuda_src"
    shutil.copytree(jit.cuda_src_dir(), root)
    kernels = root / "rawflux" / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    (kernels / "_test_tiny.cu").write_text(TINY)
    (kernels / "_test_spill.cu").write_text(SPILLY)
    (kernels / "_test_bad.cu").write_text(BAD)
    monkeypatch.setenv("RAWFLUX_CUDA_SRC", str(root))
    monkeypatch.setenv("RAWFLUX_CACHE_DIR", str(tmp_path / "cache"))
    compiler.clear_memory_cache()
    yield root
    compiler.clear_memory_cache()


def _compile(relpath="_test_tiny.cu", name="rawflux::test_tiny_kernel", arch="sm_90a", **kw):
    return jit.compile_cubin(jit.kernel_source(relpath), arch=arch, name_expressions=(name,), filename=relpath, **kw)


def _cache_files(cache: Path, pattern: str) -> list[Path]:
    return sorted(cache.glob(pattern)) if cache.exists() else []


@pytest.mark.parametrize("arch", ARCHS)
def test_compile_tiny_kernel_to_cubin(src, arch):
    names = ("rawflux::test_tiny_kernel", "rawflux::test_tiny_scaled<3>")
    res = jit.compile_cubin(jit.kernel_source("_test_tiny.cu"), arch=arch, name_expressions=names, filename="_test_tiny.cu")
    assert res.cubin[:4] == b"\x7fELF"
    assert not res.from_cache
    assert res.lowered["rawflux::test_tiny_kernel"] == "_ZN7rawflux16test_tiny_kernelEPfPKfj"
    assert res.lowered["rawflux::test_tiny_scaled<3>"].startswith("_ZN7rawflux16test_tiny_scaledILi3EEEv")
    for sym in res.lowered.values():
        r = res.resources[sym]
        assert r["registers"] > 0
        assert (r["stack"], r["spill_stores"], r["spill_loads"]) == (0, 0, 0)
    assert f"for '{arch}'" in res.log


def test_sm90a_and_sm80_cubins_differ_and_cache_separately(src):
    a, b = _compile(arch="sm_90a"), _compile(arch="sm_80")
    assert a.key != b.key and a.cubin != b.cubin


def test_disk_cache_hit_on_second_compile(src):
    cache = Path(os.environ["RAWFLUX_CACHE_DIR"])
    first = _compile()
    assert not first.from_cache
    assert [p.name for p in _cache_files(cache, "*.cubin")] == [f"{first.key}.cubin"]
    assert [p.name for p in _cache_files(cache, "*.json")] == [f"{first.key}.json"]
    compiler.clear_memory_cache()  # the next call must come from disk, as in a new process
    second = _compile()
    assert second.from_cache
    assert second.key == first.key and second.cubin == first.cubin and second.lowered == first.lowered
    assert second.resources == first.resources  # re-parsed from the stored log
    assert _compile() is second  # and then from memory


def test_extra_options_reach_the_compile_and_the_key(src):
    guarded = "#if RAWFLUX_TEST_FLAG != 7\n#error RAWFLUX_TEST_FLAG must be 7\n#endif\n" + TINY
    kw = dict(arch="sm_90a", name_expressions=("rawflux::test_tiny_kernel",), filename="guarded.cu")
    with pytest.raises(jit.CompileError, match="RAWFLUX_TEST_FLAG"):
        compiler.compile_cubin(guarded, **kw)
    first = compiler.compile_cubin(guarded, extra_options=("-DRAWFLUX_TEST_FLAG=7",), **kw)
    other = compiler.compile_cubin(guarded, extra_options=("-DRAWFLUX_TEST_FLAG=7", "-DRAWFLUX_OTHER"), **kw)
    assert first.cubin and other.key != first.key  # an option is part of the cache key


def test_disk_cache_can_be_disabled(src, monkeypatch):
    monkeypatch.setenv("RAWFLUX_DISABLE_DISK_CACHE", "1")
    _compile()
    assert _cache_files(Path(os.environ["RAWFLUX_CACHE_DIR"]), "*") == []


def test_damaged_cache_entry_is_rebuilt(src):
    cache = Path(os.environ["RAWFLUX_CACHE_DIR"])
    first = _compile()
    (cache / f"{first.key}.json").write_text("{not json")
    compiler.clear_memory_cache()
    again = _compile()
    assert not again.from_cache and again.cubin == first.cubin
    assert json.loads((cache / f"{first.key}.json").read_text())["lowered"] == first.lowered


def _key(arch="sm_90a") -> str:
    opts = tuple(compiler.default_options(arch))
    return compiler.cache_key(jit.kernel_source("_test_tiny.cu"), ("rawflux::test_tiny_kernel",), opts, arch)


def test_key_changes_when_a_header_changes(src):
    before = _key()
    assert _key() == before  # stable
    header = src / "rawflux" / "ptx" / "types.cuh"
    header.write_text(header.read_text() + "\n// an edit that changes no code still changes the key\n")
    after = _key()
    assert after != before
    res = _compile()
    assert res.key == after and not res.from_cache


def test_key_changes_when_an_unrelated_header_is_added(src):
    before = _key()
    (src / "rawflux" / "ptx" / "_test_new.cuh").write_text("#pragma once\n")
    assert _key() != before


def test_key_changes_with_options_arch_and_source(src):
    base = _key()
    assert _key("sm_80") != base
    opts = tuple(compiler.default_options("sm_90a"))
    assert compiler.cache_key(jit.kernel_source("_test_tiny.cu"), ("rawflux::test_tiny_kernel",), opts + ("-DX=1",), "sm_90a") != base
    assert compiler.cache_key(jit.kernel_source("_test_spill.cu"), ("rawflux::test_tiny_kernel",), opts, "sm_90a") != base
    assert compiler.cache_key(jit.kernel_source("_test_tiny.cu"), ("rawflux::test_tiny_scaled<3>",), opts, "sm_90a") != base


def test_key_does_not_depend_on_where_cuda_src_lives(src, tmp_path, monkeypatch):
    """Same sources in another folder (another checkout, an installed wheel) share cache entries."""
    base = _key()
    other = tmp_path / "elsewhere" / "cuda_src"
    shutil.copytree(src, other)
    monkeypatch.setenv("RAWFLUX_CUDA_SRC", str(other))
    assert _key() == base


def _compile_in_child(barrier, queue):
    try:
        barrier.wait(timeout=120)  # everyone misses the cache and compiles at once
        res = _compile()
        queue.put(("ok", res.key, hashlib.sha256(res.cubin).hexdigest(), res.from_cache))
    except BaseException as e:  # noqa: BLE001 - report anything to the parent
        queue.put(("error", f"{type(e).__name__}: {e}", "", False))


def test_concurrent_compiles_from_8_processes(src):
    """8 processes compile the same kernel into one cache dir at once (as 8 ranks do on their
    first call): all succeed, with identical cubins, and exactly one entry is left."""
    ctx = mp.get_context("spawn")  # a fresh interpreter per process, like separate ranks
    nproc = 8
    barrier, queue = ctx.Barrier(nproc), ctx.Queue()
    procs = [ctx.Process(target=_compile_in_child, args=(barrier, queue)) for _ in range(nproc)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in range(nproc)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    errors = [r for r in results if r[0] != "ok"]
    assert not errors, errors
    assert len({r[1] for r in results}) == 1 and len({r[2] for r in results}) == 1
    cache = Path(os.environ["RAWFLUX_CACHE_DIR"])
    assert len(_cache_files(cache, "*.cubin")) == 1
    assert len(_cache_files(cache, "*.json")) == 1
    assert _cache_files(cache, "*.tmp") == []
    compiler.clear_memory_cache()
    res = _compile()
    assert res.from_cache and hashlib.sha256(res.cubin).hexdigest() == results[0][2]


def test_compile_error_names_file_and_line(src):
    with pytest.raises(jit.CompileError) as info:
        _compile("_test_bad.cu", "rawflux::test_bad_kernel")
    msg = str(info.value)
    assert re.search(r"_test_bad\.cu\(4\): error", msg), msg
    assert "no_such_name" in msg


def test_compile_error_in_inline_source_names_the_given_filename(src):
    with pytest.raises(jit.CompileError, match=r"my_inline\.cu\(2\): error"):
        jit.compile_cubin("namespace rawflux {\nint x = ;\n}\n", arch="sm_80", filename="my_inline.cu")


def test_failed_compile_leaves_no_cache_entry(src):
    with pytest.raises(jit.CompileError):
        _compile("_test_bad.cu", "rawflux::test_bad_kernel")
    assert _cache_files(Path(os.environ["RAWFLUX_CACHE_DIR"]), "*") == []


LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperv
ptxas         .     16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z1av' for 'sm_90a'
ptxas info    : Function properties for _Z1av
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem, 368 bytes cmem[0]
ptxas info    : Compiling entry function '_Z1bv' for 'sm_90a'
ptxas info    : Function properties for _Z1bv
ptxas         .     40 bytes stack frame, 36 bytes spill stores, 44 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 40 bytes cumulative stack size, 360 bytes cmem[0]
ptxas info    : Compiling entry function '_Z1cv' for 'sm_90a'
ptxas info    : Function properties for _Z1cv
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers, 64 bytes cumulative stack size
ptxas info    : Function properties for _Z6trailerv
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
"""


def test_parse_resources_reads_registers_spills_and_smem():
    r = jit.parse_resources(LOG)
    assert set(r) == {"_Z1av", "_Z1bv", "_Z1cv"}  # entries only, not device functions
    assert r["_Z1av"] == {"registers": 168, "stack": 0, "spill_stores": 0, "spill_loads": 0, "smem": 1024}
    assert r["_Z1bv"] == {"registers": 255, "stack": 40, "spill_stores": 36, "spill_loads": 44, "smem": 0}
    # a callee's stack shows only as the caller's cumulative stack; a trailing device function's
    # properties must not overwrite the last entry's
    assert r["_Z1cv"] == {"registers": 12, "stack": 64, "spill_stores": 0, "spill_loads": 0, "smem": 0}


def test_parse_resources_of_a_real_spilling_compile(src):
    capped = _compile("_test_spill.cu", "rawflux::test_spill_kernel", extra_options=("--maxrregcount=24",))
    r = capped.resources[capped.lowered["rawflux::test_spill_kernel"]]
    assert r["registers"] <= 24 and r["spill_stores"] > 0 and r["spill_loads"] > 0 and r["stack"] > 0
    free = _compile("_test_spill.cu", "rawflux::test_spill_kernel")
    r = free.resources[free.lowered["rawflux::test_spill_kernel"]]
    assert r["registers"] > 24 and (r["stack"], r["spill_stores"], r["spill_loads"]) == (0, 0, 0)


@pytest.mark.parametrize("code, why", [("C7512", "insufficient register resources for the function '_Z1kv'"),
                                       ("C7519", "program dependence on compiler-inserted WG.AR in divergent path in the function '_Z1kv'")])
def test_check_kernels_reports_serialized_wgmma(monkeypatch, code, why):
    """A ptxas advisory that wgmma are serialized (C7512: registers; C7519: a commit / wait under a
    branch) fails the check like a spill does."""
    from rawflux import check_kernels

    log = (f"ptxas info    : ({code}) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
           f"{why}\n"
           "ptxas info    : Compiling entry function '_Z1kv' for 'sm_90a'\n"
           "ptxas info    : Function properties for _Z1kv\n"
           "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 168 registers\n")
    fake = compiler.CompileResult(b"", {"k": "_Z1kv"}, log, "key", resources=compiler.parse_resources(log))
    monkeypatch.setattr(registry, "_variants", [registry.Variant("x.cu", "k", ("sm_90a",))])
    result = [fake]
    monkeypatch.setattr(check_kernels, "compile_cubin", lambda *a, **k: result[0])
    monkeypatch.setattr(check_kernels, "kernel_source", lambda relpath: "")
    rows, problems = check_kernels.check()
    assert len(rows) == 1 and len(problems) == 1 and code in problems[0]
    result[0] = dataclasses.replace(fake, log="".join(log.splitlines(keepends=True)[1:]))  # no advisory
    assert check_kernels.check()[1] == []


def test_check_kernels_cli_runs():
    """The module entry point imports rawflux (every op registers its variants) and parses its
    arguments. The full compile of every variant is launch/test.sh's next step, not repeated here."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("RAWFLUX_CUDA_SRC", None)
    p = subprocess.run([sys.executable, "-m", "rawflux.check_kernels", "--help"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "--arch" in p.stdout and "--json" in p.stdout


def test_check_kernels_main_with_no_variants(monkeypatch, capsys):
    from rawflux import check_kernels

    monkeypatch.setattr(registry, "_variants", [])
    assert check_kernels.main([]) == 1
    assert "no kernel variants registered" in capsys.readouterr().err


def test_check_kernels_main_on_a_dummy_variant(src, monkeypatch, capsys, tmp_path):
    from rawflux import check_kernels

    monkeypatch.setattr(registry, "_variants", [])
    jit.register("_test_tiny.cu", "rawflux::test_tiny_kernel")
    out_json = tmp_path / "res.json"
    assert check_kernels.main(["--json", str(out_json)]) == 0
    assert "2 variants compiled, 0 problems" in capsys.readouterr().out
    rows = json.loads(out_json.read_text())
    assert sorted(r["arch"] for r in rows) == ["sm_80", "sm_90a"]
    assert all(r["kernel"] == "rawflux::test_tiny_kernel" and r["registers"] > 0 for r in rows)


def test_check_on_registered_dummy_variants(src, monkeypatch):
    from rawflux import check_kernels

    monkeypatch.setattr(registry, "_variants", [])
    v = jit.register("_test_tiny.cu", "rawflux::test_tiny_kernel")
    assert jit.register("_test_tiny.cu", "rawflux::test_tiny_kernel") == v  # registering twice is one variant
    jit.register("_test_tiny.cu", "rawflux::test_tiny_scaled<4>", archs=("sm_80",))
    assert len(jit.variants()) == 2

    rows, problems = check_kernels.check()
    assert problems == []
    assert sorted((r["kernel"], r["arch"]) for r in rows) == [
        ("rawflux::test_tiny_kernel", "sm_80"), ("rawflux::test_tiny_kernel", "sm_90a"), ("rawflux::test_tiny_scaled<4>", "sm_80"),
    ]
    assert all(r["registers"] > 0 for r in rows)
    rows, _ = check_kernels.check(["sm_90a"])
    assert [(r["kernel"], r["arch"]) for r in rows] == [("rawflux::test_tiny_kernel", "sm_90a")]

    jit.register("_test_spill.cu", "rawflux::test_spill_kernel", archs=("sm_90a",), extra_options=("--maxrregcount=24",))
    rows, problems = check_kernels.check(["sm_90a"])
    assert len(rows) == 2 and len(problems) == 1
    assert "rawflux::test_spill_kernel [sm_90a]" in problems[0] and "spill" in problems[0]
    assert check_kernels.main(["--arch", "sm_90a"]) == 1


def test_check_in_worker_processes_matches_one_process(src, monkeypatch):
    """check_kernels' parallel path (spawned workers, which inherit RAWFLUX_CUDA_SRC and the cache)
    reports the same rows and problems as compiling in this process."""
    from rawflux import check_kernels

    monkeypatch.setattr(registry, "_variants", [])
    for s in range(1, 9):
        jit.register("_test_tiny.cu", f"rawflux::test_tiny_scaled<{s}>", archs=("sm_90a",))
    jit.register("_test_spill.cu", "rawflux::test_spill_kernel", archs=("sm_90a",), extra_options=("--maxrregcount=24",))
    serial = check_kernels.check(jobs=1)
    assert len(serial[0]) == 9 and len(serial[1]) == 1 and "spill" in serial[1][0]
    assert check_kernels.check(jobs=2) == serial


_STUB_IMPORT = """
import sys, types
from pathlib import Path
pkg = Path(sys.argv[1]) / "rawflux"
for name, path in (("rawflux", pkg), ("rawflux.jit", pkg / "jit")):  # skip __init__s: they need numpy, cupy
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    sys.modules[name] = mod
import rawflux.jit.compiler as compiler
print(compiler.cuda_src_dir())
"""


def test_wheel_ships_every_package_and_cuda_src(tmp_path):
    """Build the wheel from a copy of the checkout; it must hold every rawflux package and all of
    cuda_src (as rawflux/cuda_src), and cuda_src_dir() must find that copy once installed."""
    import zipfile

    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, src / name)
    for name in ("rawflux", "cuda_src"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "wheel"), str(src)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, PIP_RETRIES="0", PIP_TIMEOUT="15"),
    )
    if p.returncode != 0 and re.search(r"No matching distribution found for (setuptools|wheel)|Network is unreachable|"
                                       r"Failed to establish a new connection", p.stdout + p.stderr):
        pytest.skip("pip cannot fetch the build backend (no package index here)")
    assert p.returncode == 0, p.stdout + p.stderr
    (whl,) = (tmp_path / "wheel").glob("rawflux-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())

    packages = {str(d.relative_to(REPO)).replace(os.sep, ".") for d in (REPO / "rawflux").rglob("*") if (d / "__init__.py").is_file()} | {"rawflux"}
    missing_pkgs = sorted(pkg for pkg in packages if f"{pkg.replace('.', '/')}/__init__.py" not in names)
    assert not missing_pkgs, f"packages missing from the wheel (list them in pyproject.toml): {missing_pkgs}"
    sources = sorted(str(f.relative_to(REPO)) for f in (REPO / "cuda_src").rglob("*") if f.suffix in (".cuh", ".cu", ".h"))
    assert sources, "no CUDA sources in the checkout?"
    missing_src = [f for f in sources if f"rawflux/{f}" not in names]
    assert not missing_src, f"CUDA sources missing from the wheel: {missing_src[:10]} ({len(missing_src)} in all)"

    site = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(site)
    env = {k: v for k, v in os.environ.items() if k not in ("RAWFLUX_CUDA_SRC", "PYTHONPATH")}
    p = subprocess.run([sys.executable, "-S", "-c", _STUB_IMPORT, str(site)], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout.strip()) == site / "rawflux" / "cuda_src"
