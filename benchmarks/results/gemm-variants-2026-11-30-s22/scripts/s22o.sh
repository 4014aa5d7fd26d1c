#!/usr/bin/env bash
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1 RAWFLUX_WAIT_TIMEOUT_S=2
RAWFLUX_NVRTC_DEFINES="RAWFLUX_CONSUMER_REFILL=2" timeout 20 python3 .exp/rbits.py 1536,2816,16384 2>&1 | grep -v "^  File\|^Traceback\|moduleUnload\|check_status\|Exception ignored" | tail -4
