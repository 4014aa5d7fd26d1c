"""Compile split-epilogue-ptxas-probe.cu (beside this file) for sm_90a once per VAR and print ptxas's
wgmma advisories and register count (session 25; README.md one folder up).

    python benchmarks/results/gemm-variants-2026-11-30-s25/scripts/split-epilogue-ptxas-probe-run.py 0 1 2 3 4 5 6 7
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3]))
from rawflux.jit import compile_cubin  # noqa: E402

src = (HERE / "split-epilogue-ptxas-probe.cu").read_text()
for var in sys.argv[1:] or ["0"]:
    r = compile_cubin(src, arch="sm_90a", name_expressions=(), filename="probe.cu", extra_options=(f"-DVAR={var}",))
    print(var, " | ".join(line[14:120] for line in r.log.splitlines() if "C7" in line or "Used" in line))
