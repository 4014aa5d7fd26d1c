"""SASS of every registered kernel variant, for proving a refactor leaves the machine code alone.

    python benchmarks/tools/sass_snapshot.py snap DIR        # compile every variant, write DIR/index.json + DIR/*.sass
    python benchmarks/tools/sass_snapshot.py diff OLD NEW    # compare two snapshots variant by variant

The old snapshot comes from a worktree of the old commit, with this script copied out of the tree:
    git worktree add /tmp/base REV && cp benchmarks/tools/sass_snapshot.py /tmp/ &&
    (cd /tmp/base && PYTHONPATH=/tmp/base python /tmp/sass_snapshot.py snap /tmp/sass_old)

NVRTC compiles on the CPU (no GPU needed); the SASS comes from `cuobjdump -sass` with the function
header dropped, so two cubins compare equal when their instructions (and encodings) are the same.
`diff` pairs variants by name; names that a refactor renamed are paired by `rename()` below.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def _normalize(sass: str) -> str:
    keep = []
    for line in sass.splitlines():
        s = line.strip()
        if not s or s.startswith(("Function :", "code for", "Fatbin", ".section", "arch =", "host =", "compile_size",
                                  "identifier", "ptxasOptions")):
            continue
        keep.append(s)
    return "\n".join(keep) + "\n"


def _cuobjdump() -> str:
    """cuobjdump on the PATH, else the one of the nvidia-cuda-cuobjdump wheel (pip install nvidia-cuda-cuobjdump)."""
    import shutil

    found = shutil.which("cuobjdump")
    if found:
        return found
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for cand in Path(root).glob("cu*/bin/cuobjdump"):
            return str(cand)
    raise FileNotFoundError("cuobjdump not found: put the CUDA toolkit's bin on the PATH or pip install nvidia-cuda-cuobjdump")


def _one(args):
    relpath, name_expr, extra = args
    from rawflux.jit import compile_cubin, kernel_source

    res = compile_cubin(kernel_source(relpath), arch="sm_90a", name_expressions=(name_expr,), filename=relpath,
                        extra_options=tuple(extra))
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(res.cubin)
        path = f.name
    try:
        out = subprocess.run([_cuobjdump(), "-sass", path], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    text = _normalize(out)
    return relpath, name_expr, hashlib.sha256(text.encode()).hexdigest(), text


def snap(out_dir: Path, jobs: int) -> int:
    import rawflux  # noqa: F401  (registers every op's variants)
    import rawflux.bench.timing  # noqa: F401  (the delay kernel)
    from rawflux.jit import variants

    todo = [(v.relpath, v.name_expr, v.extra_options) for v in variants() if "sm_90a" in v.archs]
    out_dir.mkdir(parents=True, exist_ok=True)
    index = {}
    with ProcessPoolExecutor(jobs) as pool:
        for relpath, name, digest, text in pool.map(_one, todo):
            index[f"{relpath}::{name}"] = digest
            (out_dir / f"{digest}.sass").write_text(text)
    (out_dir / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
    print(f"{len(index)} variants, {len(set(index.values()))} distinct SASS bodies -> {out_dir}")
    return 0


_LEGACY_CFG = re.compile(r"rawflux::gemm_kernel<rawflux::GemmCfg<([\d,]+)>, (.+), (rawflux::\w+), (rawflux::[\w<>]+)>$")


def rename(key: str) -> str:
    """An old snapshot's variant key under the current names. GemmCfg of 10 or 11 arguments (before
    the pipeline options were template parameters) gets the options the host now computes for it
    (rawflux.engine.kernel_options), so the diff also checks that the host's rule reproduces the
    kernel's old derived constants."""
    relpath, name = key.split("::", 1)
    mt = _LEGACY_CFG.match(name)
    if mt is None or len(mt.group(1).split(",")) > 11:
        return key
    from rawflux import engine, tune
    from rawflux.runtime import DType

    a = [int(x) for x in mt.group(1).split(",")] + [1]
    bm, bn, _, stages, cm, cn, cons, tin, tout, lay, ck = a[:11]
    code = {0: DType.BF16, 1: DType.F16, 2: DType.F32}
    tile = tune.TileConfig(bm, bn, stages, cm, cn, cons, ck)
    new = engine.kernel_name(tile, code[tin], code[tout], ("nk", "kn")[lay], sched=mt.group(2), prologue=mt.group(3),
                             epilogue=mt.group(4))
    return f"{relpath}::{new}"


def diff(old_dir: Path, new_dir: Path) -> int:
    old = {rename(k): v for k, v in json.loads((old_dir / "index.json").read_text()).items()}
    new = json.loads((new_dir / "index.json").read_text())
    same = [k for k in old if new.get(k) == old[k]]
    changed = [k for k in old if k in new and new[k] != old[k]]
    gone = [k for k in old if k not in new]
    added = [k for k in new if k not in old]
    for k in changed:
        print("CHANGED", k)
    for k in gone:
        print("ONLY OLD", k)
    for k in added:
        print("ONLY NEW", k)
    print(f"{len(same)} identical, {len(changed)} changed, {len(gone)} only in {old_dir}, {len(added)} only in {new_dir}")
    return 0 if not changed and not gone and not added else 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) >= 2 and argv[0] == "snap":
        return snap(Path(argv[1]), int(os.environ.get("JOBS", os.cpu_count() or 1)))
    if len(argv) == 3 and argv[0] == "diff":
        return diff(Path(argv[1]), Path(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
