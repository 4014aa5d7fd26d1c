#!/usr/bin/env bash
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1 RAWFLUX_WAIT_TIMEOUT_S=2
for d in "RAWFLUX_CONSUMER_REFILL=2 RAWFLUX_TRACE=1 RAWFLUX_TRACE_BLOCK_WAITS=0" "RAWFLUX_CONSUMER_REFILL=2"; do echo "== $d $(date +%T)"; RAWFLUX_NVRTC_DEFINES="$d" timeout 25 python3 .exp/rbits.py 2>&1 | grep -v "^  File\|^Traceback\|moduleUnload\|check_status\|Exception ignored" | tail -5; done
date +%T
