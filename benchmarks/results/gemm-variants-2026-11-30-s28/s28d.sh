#!/usr/bin/env bash
# session 28 call 4: narrow columns: the GPU test (float64, bits = the data-parallel pair's), then the
# bar points with --narrow beside the picks and the data-parallel pair, twice, and f16 once
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 RAWFLUX_CACHE_DIR=/tmp/rfn
date +%T; nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 240 python3 -m pytest -q --color=no -p no:cacheprovider tests/gpu/test_gemm.py -k "narrow" 2>&1 | tail -15
date +%T
for r in 1 2; do
  timeout 120 python3 benchmarks/gemm.py --dtypes bf16 --ms 1024,2048,4096,8192 --reps 30 --narrow \
    --configs 128x256x64s4c2x1w2/k1/g8m/p0 --json $OUT/narrow$r.json 2>&1 | grep -v "^max active\|^host cost" | cut -c1-330
  date +%T
done
timeout 100 python3 benchmarks/gemm.py --dtypes f16 --ms 1024,2048 --reps 30 --narrow --json $OUT/narrow-f16.json 2>&1 | grep -v "^max active\|^host cost" | cut -c1-330
date +%T
