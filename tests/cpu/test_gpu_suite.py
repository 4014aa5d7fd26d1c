"""launch/gpu_suite.sh's verdicts without a GPU: launch/sanitize_verdict.sh on canned
compute-sanitizer output (the counts as the H200 printed them), and the suite's pipelines, which
must fail on the command's status and not on a pipe's."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "launch" / "gpu_suite.sh"
VERDICT = ROOT / "launch" / "sanitize_verdict.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("awk") is None, reason="needs bash and awk")

PROBE = '========= Program hit CUDA_ERROR_INVALID_VALUE (error 1) due to "invalid argument" on CUDA API call to cuGetProcAddress_v2.'
RS_PASS = "gemm_rs world=2 correct.basic          PASS  m=256 n=512 k=256 nk bf16"
RS_FAIL = "gemm_rs world=2 loop1000               FAIL  rank 1: max rel err 3.1e-01"
RESULTS = "gemm_rs world=2 (correct|graph|loop)"


def memcheck(errors_per_rank=34, probes_per_rank=34, extra=(), ranks=2):
    lines = []
    for _ in range(ranks):
        lines += [PROBE] * probes_per_rank + list(extra) + [f"========= ERROR SUMMARY: {errors_per_rank} errors"]
    return lines


def verdict(tmp_path, lines, status, results=RESULTS):
    log = tmp_path / "sanitize-memcheck-gemm_rs.log"
    log.write_text("\n".join(lines) + "\n")
    r = subprocess.run(["bash", str(VERDICT), str(log), str(status), results], capture_output=True, text=True, timeout=60)
    assert r.stdout.startswith("[sanitize] sanitize-memcheck-gemm_rs: "), r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("PASS" if r.returncode == 0 else "FAIL"), r.stdout
    return r.returncode, r.stdout


@pytest.mark.parametrize("status", [0, 9])
def test_known_api_probes_alone_pass(tmp_path, status):
    rc, out = verdict(tmp_path, memcheck() + [RS_PASS], status)
    assert rc == 0, out
    assert "exit %d, 68 errors (68 known API calls), 0 hazards, 1 results passed, 0 failed" % status in out


def test_racecheck_clean_passes(tmp_path):
    lines = memcheck() + ["========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"] * 2 + [RS_PASS]
    assert verdict(tmp_path, lines, 9)[0] == 0


@pytest.mark.parametrize("case,lines,status", [
    ("memory error", memcheck(35, extra=["========= Invalid __global__ read of size 16 bytes"]) + [RS_PASS], 9),
    ("other API error", memcheck(35, extra=["========= Program hit cudaErrorIllegalAddress on cudaStreamSynchronize."]) + [RS_PASS], 9),
    ("hazard", memcheck() + ["========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)", RS_PASS], 9),
    ("race warning", memcheck() + ["========= RACECHECK SUMMARY: 1 hazards displayed (0 errors, 1 warnings)", RS_PASS], 9),
    ("a check failed", memcheck() + [RS_PASS, RS_FAIL], 9),
    ("a check failed, exit 1", memcheck(0, 0) + [RS_PASS, RS_FAIL], 1),
    ("timeout", memcheck() + [RS_PASS], 124),
    ("killed", memcheck() + [RS_PASS], 137),
    ("program failed", memcheck(0, 0) + [RS_PASS], 1),
    ("no summary", [PROBE, RS_PASS], 0),
    ("no result line", memcheck(), 0),
    ("traceback", memcheck() + [RS_PASS, "Traceback (most recent call last):"], 9),
])
def test_errors_fail(tmp_path, case, lines, status):
    rc, out = verdict(tmp_path, lines, status)
    assert rc == 1, f"{case}: {out}"


def test_gemm_sanitize_lines(tmp_path):
    ok = memcheck(34, 34, ranks=1) + ["gemm sanitize 128x128x64s7c1w2/k1/g8m/p2: ok"]
    assert verdict(tmp_path, ok, 9, "gemm sanitize")[0] == 0
    bad = ok + ["gemm sanitize 128x256x64s4c1w2/sk/g8m/p0: 12 outputs differ"]
    assert verdict(tmp_path, bad, 9, "gemm sanitize")[0] == 1


def test_every_sanitizer_run_goes_through_the_verdict():
    text = SUITE.read_text()
    stage = text[text.index("    sanitize)"):text.index("    agce)")]
    runs = re.findall(r"compute-sanitizer --tool", stage)
    assert len(runs) == 3 and stage.count("sanitized ") == 3, stage
    assert "| sort | uniq -c | head" not in text  # the old form: its exit status was never looked at


def _bash(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def test_pipelines_keep_the_commands_status():
    """set -o pipefail (the suite's): `cmd | grep ... || rc=1` sees cmd's failure, and `first`
    (unlike head) never fails a passing command by cutting its output."""
    first = next(line for line in SUITE.read_text().splitlines() if line.startswith("first()"))
    r = _bash("set -uo pipefail\n" + first + """
rc=0; (echo PASS; exit 3) | grep PASS | first 5 >/dev/null || rc=1; echo "fail:$rc"
rc=0; seq 1 200000 | grep . | first 60 >/dev/null || rc=1; echo "long:$rc"
rc=0; seq 1 200000 | grep . | head -60 >/dev/null || rc=1; echo "head:$rc"
""")
    assert r.stdout.split() == ["fail:1", "long:0", "head:1"], r.stdout + r.stderr
    assert "| head -" not in "\n".join(line for line in SUITE.read_text().splitlines() if "|| rc=1" in line)


def test_gpu_checks_pass_nothing_by_a_literal():
    """A check line PASSes only on a computed result: the only literal True in gemm_rs_checks is a
    skip, and both timing checks fail on a stall (a batch slower than --stall-s)."""
    rs = (ROOT / "tests" / "gpu" / "gemm_rs_checks.py").read_text()
    literal = re.findall(r"Check\([^()]*, True,[^\n]*", rs)
    assert literal and all("skipped=True" in c for c in literal), literal
    ag = (ROOT / "tests" / "gpu" / "ag_gemm_checks.py").read_text()
    timing = ag[ag.index("def check_timing"):ag.index("# failure checks")]
    assert "block_s > ctx.stall_s" in timing and "problems.append(f\"STALL" in timing
    perf = rs[rs.index("def _perf_cases"):rs.index("def _perf_inputs")]
    assert "comm.bcast(not stalled, root=0)" in perf and "ratio <= 1.02 and not stalled" in perf
    for text in (rs, ag):
        assert '"--stall-s"' in text
