#!/usr/bin/env bash
# session 24 call 1: the self-fed kernel (no producer warpgroup with the consumer refill; whole C fragment deferred)
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1 RAWFLUX_WAIT_TIMEOUT_S=4
F='^  File\|^Traceback\|moduleUnload\|check_status\|Exception ignored\|DSA\|LAUNCH_BLOCKING\|^$'
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date +%T
(RAWFLUX_NVRTC_DEFINES="RAWFLUX_REFILL=0" timeout 200 python3 .exp/precompile.py 5 & RAWFLUX_NVRTC_DEFINES="RAWFLUX_EPI_DEFER=1" timeout 200 python3 .exp/precompile.py 5 & RAWFLUX_NVRTC_DEFINES="" timeout 200 python3 .exp/precompile.py 6; wait) 2>&1 | tail -3
date +%T
seed=$RANDOM
for d in "RAWFLUX_REFILL=0" "" "RAWFLUX_EPI_DEFER=1"; do
  echo "== bits '$d'"; RAWFLUX_NVRTC_DEFINES="$d" timeout 150 python3 .exp/nbcheck.py $seed 2>&1 | grep -v "$F" | grep -v "^skip" | tail -4
  echo "== short-k bits '$d'"; RAWFLUX_NVRTC_DEFINES="$d" timeout 100 python3 .exp/nbshort.py $seed 2>&1 | grep -v "$F" | grep -v "^skip" | tail -4
  date +%T
done
echo "== kloop"
timeout 100 python3 benchmarks/gemm_kloop.py --jobs 2 --tile 128x256x64s4c2x1w2 --variants "off|RAWFLUX_REFILL=0;on|" 2>&1 | grep -v "$F" | tail -4
date +%T
echo "== pytest test_gemm"
timeout 200 python3 -m pytest -q -x tests/gpu/test_gemm.py 2>&1 | tail -8
date +%T
