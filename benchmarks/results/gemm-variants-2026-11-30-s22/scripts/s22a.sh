#!/usr/bin/env bash
# session 22 call 1: flag releases, consumer turnaround delay, and the warpgroups' phase trace
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
date +%T
T=128x256x64s4c1w2
# warm the phase builds in the background while kloop compiles its own
for d in "" "RAWFLUX_PROBE=387" "RAWFLUX_PROBE=771" "RAWFLUX_FLAG_RELEASE=1" "RAWFLUX_CONSUMER_DELAY=300"; do
  RAWFLUX_NVRTC_DEFINES="$d" python3 benchmarks/gemm_phase.py --tile $T --k 16384 --reps 1 > /dev/null 2>&1 &
done
RAWFLUX_NVRTC_DEFINES="" python3 benchmarks/gemm_phase.py --tile 128x256x64s4c2x1w2 --k 16384 --reps 1 > /dev/null 2>&1 &
wait; date +%T
python3 benchmarks/gemm_kloop.py --jobs 9 --tile $T --variants "base|;flag|RAWFLUX_FLAG_RELEASE=1;flag2|RAWFLUX_FLAG_RELEASE=2;d100|RAWFLUX_CONSUMER_DELAY=100;d300|RAWFLUX_CONSUMER_DELAY=300;p387|RAWFLUX_PROBE=387;p387d300|RAWFLUX_PROBE=387 RAWFLUX_CONSUMER_DELAY=300;p771|RAWFLUX_PROBE=771;base2|" 2>&1
date +%T
for d in "" "RAWFLUX_PROBE=387" "RAWFLUX_PROBE=771" "RAWFLUX_FLAG_RELEASE=1" "RAWFLUX_CONSUMER_DELAY=300"; do
  RAWFLUX_NVRTC_DEFINES="$d" timeout 120 python3 benchmarks/gemm_phase.py --tile $T 2>&1 | tail -14
done
RAWFLUX_NVRTC_DEFINES="" timeout 120 python3 benchmarks/gemm_phase.py --tile 128x256x64s4c2x1w2 2>&1 | tail -14
date +%T
