#!/usr/bin/env bash
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1 RAWFLUX_WAIT_TIMEOUT_S=2
F='^  File\|^Traceback\|moduleUnload\|check_status\|Exception ignored\|DSA\|LAUNCH_BLOCKING\|^$'
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
run() { echo "== $1 | $2 $(date +%T)"; RAWFLUX_NVRTC_DEFINES="$1" timeout 40 python3 .exp/rbits.py $2 2>&1 | grep -v "$F" | tail -3; }
run "" 1536,2816,4096
for k in 4096 1024 2048 3072 8192 12288 16384; do run "RAWFLUX_CONSUMER_REFILL=2" 1536,2816,$k; done
run "RAWFLUX_CONSUMER_REFILL=2" 128,256,4096
run "RAWFLUX_CONSUMER_REFILL=2" 256,2816,4096
run "RAWFLUX_CONSUMER_REFILL=2" 1536,256,4096
run "RAWFLUX_CONSUMER_REFILL=1" 1536,2816,4096
run "RAWFLUX_CONSUMER_REFILL=2 RAWFLUX_REFILL_FENCE=1" 1536,2816,4096
echo "== snapshot $(date +%T)"
RAWFLUX_WAIT_TIMEOUT_S=8 RAWFLUX_NVRTC_DEFINES=RAWFLUX_CONSUMER_REFILL=2 timeout 60 python3 benchmarks/gemm_phase.py --tile 128x256x64s4c1w2 --k 4096 --snapshot 3 2>&1 | grep -v "$F" | head -45
echo "== sanitizer $(date +%T)"
RAWFLUX_NVRTC_DEFINES=RAWFLUX_CONSUMER_REFILL=2 timeout 120 compute-sanitizer --tool memcheck --print-limit 10 python3 .exp/rbits.py 1536,2816,4096 2>&1 | grep -v "$F" | head -60
date +%T
