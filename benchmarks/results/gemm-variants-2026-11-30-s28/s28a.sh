#!/usr/bin/env bash
# session 28 call 1: per-CTA trace of banded stream-K against the data-parallel pair at m = 1024-2048
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
P=128x256x64s4c2x1w2
C="1024,8192,2048,$P/k1/g8m/p0;1024,8192,2048,$P/b4/g8m/p0;1024,8192,8192,$P/k1/g8m/p0;1024,8192,8192,$P/b4/g8m/p0;2048,8192,8192,$P/k1/g8m/p0;2048,8192,8192,$P/b8/g8m/p0"
date +%T; nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 200 python3 benchmarks/gemm_trace.py --json $OUT/trace.json --cases "$C" 2>&1 | tail -40
date +%T
timeout 150 python3 benchmarks/gemm_trace.py --no-block-waits --json $OUT/trace-nbw.json --cases "$C" 2>&1 | tail -40
date +%T
RAWFLUX_NVRTC_DEFINES="RAWFLUX_PROBE=196608" timeout 120 python3 benchmarks/gemm_trace.py --no-block-waits --json $OUT/trace-notraffic.json \
  --cases "1024,8192,2048,$P/b4/g8m/p0;1024,8192,8192,$P/b4/g8m/p0;2048,8192,8192,$P/b8/g8m/p0" 2>&1 | tail -20
date +%T
