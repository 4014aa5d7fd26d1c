#!/usr/bin/env bash
# session 25 call 8: the dynamic order with the refill: where it fails
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1 RAWFLUX_WAIT_TIMEOUT_S=3
F="^  File\|Traceback\|moduleUnload\|check_status\|Exception ignored\|^$\|cudaErrorLaunch\|CUDA kernel errors\|For debugging\|TORCH_USE"
echo "== dyn, no refill"
RAWFLUX_NVRTC_DEFINES="RAWFLUX_DYN_SCHED=1 RAWFLUX_REFILL=0" TAGS=128x256x64s4c2x1w2/k1/g8m/p0 timeout 60 python3 .exp/dyn1.py 2>&1 | grep -v "$F" | tail -4
echo "== dyn + refill, c1"
RAWFLUX_NVRTC_DEFINES="RAWFLUX_DYN_SCHED=1" TAGS=128x256x64s4c1w2/k1/g8m/p0 timeout 60 python3 .exp/dyn1.py 2>&1 | grep -v "$F" | tail -4
echo "== dyn + refill, c2x1"
RAWFLUX_NVRTC_DEFINES="RAWFLUX_DYN_SCHED=1" TAGS=128x256x64s4c2x1w2/k1/g8m/p0 timeout 60 python3 .exp/dyn1.py 2>&1 | grep -v "$F" | tail -4
echo "== sanitizer, dyn + refill, c1"
RAWFLUX_NVRTC_DEFINES="RAWFLUX_DYN_SCHED=1" TAGS=128x256x64s4c1w2/k1/g8m/p0 timeout 150 compute-sanitizer --print-limit 3 python3 .exp/dyn1.py 2>&1 | grep -v "$F" | head -30
