#!/usr/bin/env bash
# session 25 call 6: other tiles at every bar point against the picks (128x256 without a cluster: L2 merging)
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
python3 benchmarks/gemm.py --dtypes bf16 --ms 1024,2048,4096,8192 --reps 30 \
  --configs ${CONFIGS:-128x256x64s4c1w2/k1/g8m/p0,128x256x64s4c1w2/k1/g8n/p0,128x192x64s5c2x1w2/k1/g8m/p0} --json $OUT/cfgs.json 2>&1 | grep -v "^max active\|^host cost"
date +%T
