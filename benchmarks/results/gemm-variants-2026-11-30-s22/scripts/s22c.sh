#!/usr/bin/env bash
# session 22 call 3: per-group issue / completion stamps of both consumer warpgroups (is the pipe slower, or idle?)
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
T=128x256x64s4c1w2
for d in "" "RAWFLUX_PROBE=387" "RAWFLUX_PROBE=771" "RAWFLUX_PROBE=387 RAWFLUX_CONSUMER_DELAY=300" "RAWFLUX_CONSUMER_DELAY=300"; do
  RAWFLUX_NVRTC_DEFINES="$d" timeout 70 python3 benchmarks/gemm_phase.py --tile $T --reps 2 2>&1 | tail -9
  date +%T
done
