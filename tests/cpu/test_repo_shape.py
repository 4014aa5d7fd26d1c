"""The repository is a library, not a lab notebook: BENCHMARKS.md is generated from the current
result JSON, the docs stay short, and no run records (logs, patches, experiment scripts) are kept."""
from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KB = 1024


def _report():
    spec = importlib.util.spec_from_file_location("benchmarks_report", ROOT / "benchmarks" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmarks_md_regenerates_unchanged():
    assert (ROOT / "BENCHMARKS.md").read_text() == _report().render(), "BENCHMARKS.md is stale: run python benchmarks/report.py"


def test_every_result_file_is_current():
    """A newer run of the same benchmark replaces the old file (git history keeps it)."""
    rep = _report()
    assert rep.superseded(rep.load()) == []


def test_benchmarks_md_wording():
    text = (ROOT / "BENCHMARKS.md").read_text()
    assert "session" not in text.lower()
    if any(r["emulated"] for _, _, recs in _report().load()["bench"] for r in recs):
        assert "correctness-only" in text and "NOT MULTI-GPU RESULTS" in text


def test_short_config_names():
    short = _report().short_config
    assert short("128x256x64s4c2x1w2/k1/g8m/p0") == ""
    assert short("128x256x64s4c2x1w2/n240/g8m/p0") == "narrow 240"
    assert short("128x256x64s4c2x1w2/b8/g8n/p0") == "band 8"
    assert short("128x256x64s4c2x1w2/t3/g8m/p0") == "tail 3"
    assert short("64x96x64s8c1w2/k2/g8m/p0") == "64x96 c1 k2"
    assert short("128x96x64s8c1k2w2/k1/g8m/p0") == "128x96 c1k2"
    assert short("128x128x64s7c1w2/sk/g8m/p0") == "128x128 c1 stream-K"


@pytest.mark.parametrize("name,limit", [("BENCHMARKS.md", 20 * KB), ("README.md", 10 * KB), ("docs/decisions.md", 15 * KB)])
def test_doc_sizes(name, limit):
    size = len((ROOT / name).read_bytes())
    assert size < limit, f"{name} is {size} bytes, over {limit}"


def test_no_run_records():
    for d in ("docs/gpu-runs", "docs/wip"):
        left = [p for p in (ROOT / d).rglob("*") if p.is_file()] if (ROOT / d).exists() else []
        assert not left, f"run records under {d}: {left[:5]}"
    results = ROOT / "benchmarks" / "results"
    others = [p.relative_to(ROOT) for p in results.rglob("*") if p.is_file() and p.suffix != ".json"]
    assert not others, f"benchmarks/results holds only result JSON: {others[:5]}"
    assert not [p for p in results.iterdir() if p.is_dir()], "benchmarks/results has no subfolders"


def _tracked_text_files():
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    for rel in filter(None, out.decode().split("\0")):
        path = ROOT / rel
        if not path.is_file():  # deleted in the working tree, not yet committed
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            yield rel, data.decode()
        except UnicodeDecodeError:
            continue


def test_design_md_named_only_by_architecture_md():
    """docs/ARCHITECTURE.md is the project's design document; only its first line names the origin."""
    bad = []
    for rel, text in _tracked_text_files():
        for no, line in enumerate(text.splitlines(), 1):
            if "DESIGN.md" in line and not (rel == "docs/ARCHITECTURE.md" and no == 1) and rel != "tests/cpu/test_repo_shape.py":
                bad.append(f"{rel}:{no}")
    assert not bad, f"files that refer to DESIGN.md (point them to docs/ARCHITECTURE.md): {bad}"


_SWITCH = __import__("re").compile(r"^\s*#\s*(?:if|ifdef|ifndef|elif)\b.*?\b(RAWFLUX_\w+)")


def _kernel_switches(text: str) -> set[str]:
    """RAWFLUX_ macros that a preprocessor conditional of `text` tests."""
    return {m.group(1) for line in text.splitlines() if (m := _SWITCH.match(line))}


def test_kernels_have_no_switches_but_documented_ones():
    """Behaviour is chosen by template parameters: a RAWFLUX_ preprocessor switch in cuda_src/ is
    allowed only where rawflux/env.py documents it (none today)."""
    assert _kernel_switches("#ifndef RAWFLUX_PROBE\n#define RAWFLUX_PROBE 0\n#endif\n# if RAWFLUX_X > 1\n") == {"RAWFLUX_PROBE", "RAWFLUX_X"}
    documented = set(__import__("re").findall(r"RAWFLUX_\w+", (ROOT / "rawflux" / "env.py").read_text()))
    found = {}
    for p in (ROOT / "cuda_src").rglob("*"):
        if p.suffix in (".cu", ".cuh", ".h"):
            for name in _kernel_switches(p.read_text()) - documented:
                found.setdefault(name, str(p.relative_to(ROOT)))
    assert not found, f"kernel switches not documented in rawflux/env.py: {found}"
