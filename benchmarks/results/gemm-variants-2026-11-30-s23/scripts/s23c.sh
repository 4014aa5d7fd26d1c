#!/usr/bin/env bash
# session 23 call 3-4: consumer refill incl. the 2x1 pair -- kloop c1/c2x1, bits vs off, A/B vs cuBLAS
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1 RAWFLUX_WAIT_TIMEOUT_S=4
F='^  File\|^Traceback\|moduleUnload\|check_status\|Exception ignored\|DSA\|LAUNCH_BLOCKING\|^$'
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date +%T
(RAWFLUX_NVRTC_DEFINES="RAWFLUX_REFILL=0" timeout 200 python3 .exp/precompile.py 8 & RAWFLUX_NVRTC_DEFINES="" timeout 200 python3 .exp/precompile.py 8; wait) 2>&1 | tail -2
date +%T
for t in 128x256x64s4c2x1w2 128x256x64s4c1w2; do timeout 100 python3 benchmarks/gemm_kloop.py --jobs 2 --tile $t --variants "off|RAWFLUX_REFILL=0;on|" 2>&1 | grep -v "$F" | tail -4; done
date +%T
seed=$RANDOM
for d in "RAWFLUX_REFILL=0" ""; do echo "== bits '$d'"; RAWFLUX_NVRTC_DEFINES="$d" timeout 200 python3 .exp/nbcheck.py $seed 2>&1 | grep -v "$F" | grep -v "^skip" | tail -4; date +%T; done
VARIANTS="off|RAWFLUX_REFILL=0;on|;off2|RAWFLUX_REFILL=0;on2|" GEMM_ARGS="--dtypes bf16 --ms 1024,2048,4096,8192 --reps 30" OUT=$OUT/ab timeout 400 bash launch/gemm_variants.sh 2>&1 | grep -v "^\s*$" | tail -50
date +%T
