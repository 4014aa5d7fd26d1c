#!/usr/bin/env bash
# session 28 call 3: k-loop cycles per k block of the 128x256, 128x224 and 128x192 pairs (is a
# narrower tile's k block proportionally shorter?)
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 RAWFLUX_CACHE_DIR=/tmp/rfn
date +%T
for t in 128x256x64s4c2x1w2 128x224x64s5c2x1w2 128x192x64s5c2x1w2; do
  timeout 150 python3 benchmarks/gemm_kloop.py --tile $t --ks 4096,16384 --reps 3 2>&1 | tail -4
done
date +%T
