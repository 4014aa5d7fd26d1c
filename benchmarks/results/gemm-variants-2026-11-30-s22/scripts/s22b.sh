#!/usr/bin/env bash
# session 22 call 2: call 1 hung in its background warm-ups; everything in the foreground, bounded
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
T=128x256x64s4c1w2
RAWFLUX_NVRTC_DEFINES="" timeout 80 python3 benchmarks/gemm_phase.py --tile $T 2>&1 | tail -16
date +%T
timeout 300 python3 benchmarks/gemm_kloop.py --jobs 6 --tile $T --variants "base|;flag|RAWFLUX_FLAG_RELEASE=1;flag2|RAWFLUX_FLAG_RELEASE=2;d300|RAWFLUX_CONSUMER_DELAY=300;p387d300|RAWFLUX_PROBE=387 RAWFLUX_CONSUMER_DELAY=300;p387|RAWFLUX_PROBE=387" 2>&1
date +%T
for d in "RAWFLUX_PROBE=387" "RAWFLUX_FLAG_RELEASE=1"; do
  RAWFLUX_NVRTC_DEFINES="$d" timeout 60 python3 benchmarks/gemm_phase.py --tile $T 2>&1 | tail -16
  date +%T
done
