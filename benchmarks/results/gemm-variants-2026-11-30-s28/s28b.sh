#!/usr/bin/env bash
# session 28 call 2: bands run their last stack's low part first + in-place sums (piece 1 of 2):
# bits against the base tree, the split-mode GPU tests, A/B of the bar points with --bands, the trace
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
BASE=$PWD/.exp/base_src/cuda_src
date +%T; nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
RAWFLUX_CACHE_DIR=/tmp/rfb RAWFLUX_CUDA_SRC=$BASE timeout 200 python3 .exp/bits28.py $OUT/bits-base.json 2>&1 | tail -20
RAWFLUX_CACHE_DIR=/tmp/rfn timeout 200 python3 .exp/bits28.py $OUT/bits-new.json 2>&1 | tail -20
python3 - $OUT/bits-base.json $OUT/bits-new.json <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
same = [k for k in a if b.get(k) == a[k]]
print(f"bits: {len(same)} of {len(a)} cases equal base;", "differ:", [k for k in a if b.get(k) != a[k]])
PY
date +%T
RAWFLUX_CACHE_DIR=/tmp/rfn timeout 300 python3 -m pytest -q --color=no -p no:cacheprovider tests/gpu/test_gemm.py -k "band or split_tail or stream_k_every_tile or split_k" 2>&1 | tail -4
date +%T
for r in 1 2; do
for v in base new; do
  if [ $v = base ]; then export RAWFLUX_CUDA_SRC=$BASE RAWFLUX_CACHE_DIR=/tmp/rfb; else unset RAWFLUX_CUDA_SRC; export RAWFLUX_CACHE_DIR=/tmp/rfn; fi
  echo "== $v run $r"
  timeout 150 python3 benchmarks/gemm.py --dtypes bf16 --ms 1024,2048,4096,8192 --reps 30 --bands --json $OUT/$v$r.json 2>&1 | grep -v "^max active\|^host cost" | cut -c1-300
  date +%T
done
done
unset RAWFLUX_CUDA_SRC; export RAWFLUX_CACHE_DIR=/tmp/rfn
P=128x256x64s4c2x1w2
timeout 120 python3 benchmarks/gemm_trace.py --no-block-waits --json $OUT/trace-nbw.json --cases "1024,8192,8192,$P/k1/g8m/p0;1024,8192,8192,$P/b4/g8m/p0;2048,8192,8192,$P/b8/g8m/p0" 2>&1 | tail -12
date +%T
