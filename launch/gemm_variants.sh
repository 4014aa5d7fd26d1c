#!/usr/bin/env bash
# A/B of the GEMM engine's compile-time switches (RAWFLUX_NVRTC_DEFINES) on one GPU: every variant
# runs benchmarks/gemm.py in its own process, each against cuBLAS in that same run, so the ratios
# compare across variants. Variants are `label|defines`, separated by ';'. A quick correctness check
# (rel. Frobenius error vs float64, output poisoned) runs first, except for probes (RAWFLUX_PROBE);
# its inputs come from one fresh seed per run (CHECK_SEED), the same for every variant, and it
# prints a digest of its outputs' bits, which each variant compares with the first variant's (a
# switch that must not change the math shows "same bits"). At the end benchmarks/gemm_compare.py
# sets every variant's ratios beside the first's, point by point.
# Output: $OUT/variant-<label>.{check,log,json}, $OUT/compare.txt. Example (session 4, docs/gemm-notes.md):
#   VARIANTS="oi|;nooi|RAWFLUX_ORDERED_ISSUE=0;p3|RAWFLUX_PROBE=3" GEMM_ARGS="--dtypes bf16 --ms 2048,8192" \
#     bash launch/gemm_variants.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 RAWFLUX_CACHE_DIR=${RAWFLUX_CACHE_DIR:-/tmp/rawflux-cache} PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
VARIANTS=${VARIANTS:-"base|"}
GEMM_ARGS=${GEMM_ARGS:-"--dtypes bf16 --ms 1024,4096,8192 --shapes 8192:8192,28672:8192,6144:12288"}
IFS=';' read -ra VS <<< "$VARIANTS"
export CHECK_SEED=${CHECK_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}  # the correctness check's inputs
# compile every bf16 nk tile of every variant first, all cores at once
for v in "${VS[@]}"; do
  label=${v%%|*}; defs=${v#*|}
  RAWFLUX_NVRTC_DEFINES="$defs" python3 - <<'PY' &
from concurrent.futures import ThreadPoolExecutor
from rawflux import tune
from rawflux.jit import compile_cubin, kernel_source
from rawflux.ops.gemm import PLAIN_SCHED, kernel_name, plain_epilogue
from rawflux.runtime.dtypes import DType
names = [kernel_name(t, DType.BF16, DType.BF16, "nk", sched=PLAIN_SCHED, epilogue=plain_epilogue(DType.BF16)) for t in tune.tiles_for("nk")]
with ThreadPoolExecutor(4) as ex:
    list(ex.map(lambda n: compile_cubin(kernel_source("gemm.cu"), arch="sm_90a", name_expressions=(n,), filename="gemm.cu"), names))
PY
done
wait
echo "=== compiled ($(date +%T))"
for v in "${VS[@]}"; do
  label=${v%%|*}; defs=${v#*|}
  echo "=== variant $label: RAWFLUX_NVRTC_DEFINES='$defs' ($(date +%T))"
  case "$defs" in *RAWFLUX_PROBE=*) ;; *)
  RAWFLUX_NVRTC_DEFINES="$defs" timeout 120 python3 - <<'PY'
import hashlib
import torch
from rawflux import tune
from rawflux.ops import gemm as g
import os
torch.manual_seed(int(os.environ["CHECK_SEED"]))  # one fresh seed per run, the same in every variant: the bits compare
digest = hashlib.sha1()
worst = 0.0
for tag in ("128x256x64s4c2x1w2", "128x320x64s4c2x1w2"):
    t = tune.parse_tag(tag + "/k1/g8m/p0").tile
    for m, n, k, lay in ((333, 1280, 512, "nk"), (2048, 6400, 1536, "nk"), (77, 1024, 768, "kn")):
        if not t.supports(lay):
            continue
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) if lay == "nk" else torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        g.gemm(a, b, b_layout=lay, out=out, config=tune.GemmConfig(t, 1, 8, False))
        digest.update(out.view(torch.int16).cpu().numpy().tobytes())
        ref = a.double() @ (b.double().T if lay == "nk" else b.double())
        err = ((out.double() - ref).norm() / ref.norm()).item()
        worst = max(worst, err if err == err else 1.0)
print(f"correctness: worst rel Frobenius err {worst:.2e} -> {'PASS' if worst < 1e-2 else 'FAIL'}")
print(f"output bits: {digest.hexdigest()[:16]}")
PY
  ;; esac > "$OUT/variant-$label.check" 2>&1
  cat "$OUT/variant-$label.check"
  bits=$(sed -n 's/^output bits: //p' "$OUT/variant-$label.check")
  if [ -n "$bits" ]; then
    if [ -z "${first_bits:-}" ]; then first_bits=$bits; first_label=$label
    elif [ "$bits" = "$first_bits" ]; then echo "output bits: same as variant $first_label"
    else echo "output bits: DIFFERENT from variant $first_label"; fi
  fi
  RAWFLUX_NVRTC_DEFINES="$defs" timeout 300 python3 benchmarks/gemm.py $GEMM_ARGS --json "$OUT/variant-$label.json" > "$OUT/variant-$label.log" 2>&1
  grep -E "^(bf16|f16) |summary|ratio|rawflux" "$OUT/variant-$label.log" | tail -40
done
# Point by point against the first variant (benchmarks/gemm_compare.py): each variant's ratios and
# its median difference to the first.
files=(); labels=()
for v in "${VS[@]}"; do
  label=${v%%|*}
  [ -s "$OUT/variant-$label.json" ] && { files+=("$OUT/variant-$label.json"); labels+=("$label"); }
done
if [ ${#files[@]} -gt 1 ]; then
  echo "=== compare"
  python3 benchmarks/gemm_compare.py "${files[@]}" --labels "$(IFS=,; echo "${labels[*]}")" | tee "$OUT/compare.txt"
fi
