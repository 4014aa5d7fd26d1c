#!/usr/bin/env bash
# session 24 call 5: the gemm_rs world-2 hang (correct.tile128x224_bf16p) -- single process first, then world 2
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1 RAWFLUX_WAIT_TIMEOUT_S=4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
F='^  File\|^Traceback\|moduleUnload\|check_status\|Exception ignored\|DSA\|LAUNCH_BLOCKING\|^$'
date +%T
timeout 60 python3 .exp/gone.py 2>&1 | grep -v "$F" | tail -30
date +%T
echo "== world 2, default"
ITERS=3 timeout 70 python3 -m rawflux.launch --emulate 2 .exp/rsone.py correct.tile128x224,correct.tile128x224_bf16p,correct.cluster_tile 2>&1 | grep -v "$F" | tail -12
date +%T
echo "== world 2, RAWFLUX_REFILL=0"
RAWFLUX_NVRTC_DEFINES=RAWFLUX_REFILL=0 ITERS=2 timeout 60 python3 -m rawflux.launch --emulate 2 .exp/rsone.py correct.tile128x224,correct.tile128x224_bf16p 2>&1 | grep -v "$F" | tail -8
date +%T
