#!/usr/bin/env bash
# session 25 call 2: power or cycles? sustained clocks of both kernels alone; our cycles per k block in multi-wave runs
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
python3 benchmarks/gemm_clocks.py --shapes 1024x8192x8192,4096x12288x6144,4096x8192x8192 --seconds 2.5 2>&1 | tail -20
date +%T
python3 benchmarks/gemm_trace.py --no-block-waits --reps 8 --cases "4096,12288,6144;4096,12288,8192;1024,8192,8192" 2>&1 | grep -v "^ *[0-9]* *|" | tail -40
date +%T
