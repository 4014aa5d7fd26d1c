#!/usr/bin/env bash
# session 23 call 6: GPU suite part 1 at the refill commit, then an A/B of the gated refill
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
RAWFLUX_COMMIT=$C WORLDS=1,2,4,8 TAIL=30 timeout 400 bash launch/gpu_suite.sh env pytest rs ag
date +%T
VARIANTS="off|RAWFLUX_REFILL=0;on|" GEMM_ARGS="--dtypes bf16 --ms 128,512,1024,2048,4096,8192 --reps 20" OUT=$OUT/ab timeout 170 bash launch/gemm_variants.sh 2>&1 | grep -v "^\s*$" | grep -A40 "=== compare"
date +%T
