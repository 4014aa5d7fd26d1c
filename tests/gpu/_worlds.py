"""The driver side shared by the GPU check scripts (dist_checks, ag_gemm_checks, gemm_rs_checks):
run the script's --worker under rawflux-launch once per world size (the emulated node, or one
rank per GPU), echo its result lines, and say which worlds failed; and what their workers share
(preload_torch)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def preload_torch() -> None:
    """Import torch (where installed) before any check runs: imported only after the fused-op
    checks, torch's own import failed with a TorchScript parse error (cause not known)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        pass


def run_world(script: str, world: int, worker_args: list[str], *, real: bool, timeout_s: float,
              env_defaults: dict[str, str] | None = None) -> tuple[object, str]:
    """(exit code, or "timeout" / "interrupted"; combined output) of one world's worker run."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for key, value in (env_defaults or {}).items():
        env.setdefault(key, value)
    mode = ["-n", str(world)] if (real or world == 1) else ["--emulate", str(world)]
    cmd = [sys.executable, "-m", "rawflux.launch", *mode, os.path.abspath(script), "--worker", *worker_args]
    # Popen + SIGINT on timeout (not subprocess.run's SIGKILL): the launcher must get the chance
    # to stop its MPS daemon.
    p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
        return p.returncode, out
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as e:
        p.send_signal(signal.SIGINT)
        try:
            out, _ = p.communicate(timeout=45)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        return ("interrupted" if isinstance(e, KeyboardInterrupt) else "timeout"), out


def run_worlds(script: str, prefix: str, worlds: list[int], worker_args: list[str], *, real: bool, timeout_s: float,
               env_defaults: dict[str, str] | None = None, tail: int = 60, needs_pass: bool = False):
    """Run every world; print the worker's lines that start with f"{prefix} world=". Returns
    (all those lines, the worlds that failed). A world fails on a non-zero exit, no result line,
    a FAIL line, or (needs_pass) no PASS line."""
    lines, failures = [], []
    for w in worlds:
        t0 = time.perf_counter()
        rc, out = run_world(script, w, worker_args, real=real, timeout_s=timeout_s, env_defaults=env_defaults)
        got = [ln for ln in out.splitlines() if ln.startswith(f"{prefix} world=")]
        for ln in got:
            print(ln, flush=True)
        lines += got
        if rc != 0 or not got or any(" FAIL " in ln for ln in got) or (needs_pass and not any(" PASS " in ln for ln in got)):
            failures.append(w)
            print(f"{prefix} world={w} launcher exit {rc} after {time.perf_counter() - t0:.1f} s; last output:\n"
                  + "\n".join(out.splitlines()[-tail:]), flush=True)
        if rc == "interrupted":
            break
    return lines, failures


def counts_summary(prefix: str, lines: list[str], failures: list[int], worlds: list[int]) -> str:
    """A driver's last line: the verdict, and the PASS / FAIL / SKIP lines run_worlds echoed."""
    passes, fails, skips = (sum(f" {tag} " in ln for ln in lines) for tag in ("PASS", "FAIL", "SKIP"))
    verdict = "ALL PASS" if not failures else f"FAILED at worlds {failures}"
    return f"{prefix} summary: {verdict}; {passes} pass, {fails} fail, {skips} skip over worlds {worlds}"
