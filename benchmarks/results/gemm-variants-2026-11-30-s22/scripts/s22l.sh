#!/usr/bin/env bash
# session 22 call 12: phase trace of the consumer refill against base
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
for d in "RAWFLUX_CONSUMER_REFILL=1" ""; do
  RAWFLUX_NVRTC_DEFINES="$d" timeout 60 python3 benchmarks/gemm_phase.py --tile 128x256x64s4c1w2 --reps 2 2>&1 | tail -8
done
date +%T
