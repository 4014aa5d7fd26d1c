#!/usr/bin/env bash
# session 23 call 5: consumer refill at small m and per tile (128x192 pair)
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1 RAWFLUX_WAIT_TIMEOUT_S=4
F='^  File\|^Traceback\|moduleUnload\|check_status\|Exception ignored\|DSA\|LAUNCH_BLOCKING\|^$'
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date +%T
for t in 128x192x64s5c2x1w2 128x320x64s4c2x1w2; do timeout 100 python3 benchmarks/gemm_kloop.py --jobs 2 --tile $t --variants "off|RAWFLUX_REFILL=0;on|" 2>&1 | grep -v "$F" | tail -4; done
date +%T
VARIANTS="off|RAWFLUX_REFILL=0;on|;off2|RAWFLUX_REFILL=0;on2|" GEMM_ARGS="--dtypes bf16 --ms 64,128,256,512,1024 --reps 30 --tiles 128x192x64s5c2x1w2" OUT=$OUT/ab timeout 420 bash launch/gemm_variants.sh 2>&1 | grep -v "^\s*$" | grep -A40 "=== compare"
date +%T
