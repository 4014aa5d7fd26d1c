#!/usr/bin/env bash
# session 23 call 2: consumer refill (RAWFLUX_REFILL, default on) -- kloop, bits vs off, tiles vs cuBLAS
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1 RAWFLUX_WAIT_TIMEOUT_S=4
F='^  File\|^Traceback\|moduleUnload\|check_status\|Exception ignored\|DSA\|LAUNCH_BLOCKING\|^$'
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date +%T
timeout 150 python3 benchmarks/gemm_kloop.py --jobs 3 --tile 128x256x64s4c1w2 --variants "off|RAWFLUX_REFILL=0;on|;relaxed|RAWFLUX_REFILL_RELAXED=1" 2>&1 | grep -v "$F" | tail -6
date +%T
(RAWFLUX_NVRTC_DEFINES="RAWFLUX_REFILL=0" timeout 200 python3 .exp/precompile.py 8 & RAWFLUX_NVRTC_DEFINES="" timeout 200 python3 .exp/precompile.py 8; wait) 2>&1 | tail -2
date +%T
seed=$RANDOM
for d in "RAWFLUX_REFILL=0" ""; do echo "== bits '$d'"; RAWFLUX_NVRTC_DEFINES="$d" timeout 200 python3 .exp/nbcheck.py $seed 2>&1 | grep -v "$F" | grep -v "^skip" | tail -4; date +%T; done
echo "== tiles vs cuBLAS"
timeout 200 python3 benchmarks/gemm.py --dtypes bf16 --ms 1024,2048,4096,8192 --reps 20 --tiles 128x256x64s4c1w2,128x256x64s4c2x1w2,128x320x64s4c2x1w2 --json $OUT/tiles.json 2>&1 | grep -v "$F" | tail -45
date +%T
