#!/usr/bin/env bash
# session 27 call 4: the heuristic with banded stream-K (picks) against the data-parallel pairs, twice
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
for r in 1 2; do
timeout 200 python3 benchmarks/gemm.py --dtypes bf16 --ms 1024,2048,4096,8192 --reps 30 \
  --configs 128x256x64s4c2x1w2/k1/g8m/p0,128x192x64s5c2x1w2/k1/g8m/p0 --json $OUT/picks$r.json 2>&1 | grep -v "^max active\|^host cost" | cut -c1-330
date +%T
done
