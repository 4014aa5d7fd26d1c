#!/usr/bin/env bash
# Nsight Compute on rawflux.gemm and cuBLAS (torch.matmul), same shape, one profiled launch each
# (clocks locked to base by ncu, so both run at the same clock). Writes to $OUT (or ./.out):
#   ncu-<m>x<n>x<k>-<impl>.txt   details page (all sections of --set full)
#   ncu-<m>x<n>x<k>-<impl>.csv   raw metrics
#   ncu-<m>x<n>x<k>-<impl>-sass.csv   per-instruction SASS with stall samples (source page)
# Usage: bash benchmarks/tools/ncu_gemm.sh M N K [rawflux|torch ...] [-- extra gemm_ncu.py args]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/.out}; mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD RAWFLUX_CACHE_DIR=${RAWFLUX_CACHE_DIR:-/tmp/rawflux-cache}
m=$1 n=$2 k=$3; shift 3
impls=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do impls+=("$1"); shift; done; [ $# -gt 0 ] && shift
[ ${#impls[@]} -eq 0 ] && impls=(rawflux torch)
for impl in "${impls[@]}"; do
  tag=ncu-${m}x${n}x${k}-$impl${TAG:+-$TAG}
  python3 benchmarks/tools/gemm_ncu.py $m $n $k --impl $impl "$@" >/dev/null 2>&1  # compile outside the profiler
  timeout 400 ncu --set full --import-source no -k regex:'gemm_kernel|nvjet|xmma' --launch-skip 3 --launch-count 1 \
    -f -o "$OUT/$tag" python3 benchmarks/tools/gemm_ncu.py $m $n $k --impl $impl "$@" 2>&1 | grep -v "^==PROF==" | tail -3
  ncu -i "$OUT/$tag.ncu-rep" --page details > "$OUT/$tag.txt" 2>&1
  ncu -i "$OUT/$tag.ncu-rep" --page raw --csv > "$OUT/$tag.csv" 2>&1
  ncu -i "$OUT/$tag.ncu-rep" --page source --print-source sass --csv > "$OUT/$tag-sass.csv" 2>&1
  echo "== $tag"; grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Registers Per|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$OUT/$tag.txt" | head -14
done
