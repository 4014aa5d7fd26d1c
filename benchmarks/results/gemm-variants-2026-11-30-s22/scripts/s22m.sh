#!/usr/bin/env bash
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
for d in "" "RAWFLUX_CONSUMER_REFILL=2"; do echo "== $d"; RAWFLUX_NVRTC_DEFINES="$d" timeout 45 python3 .exp/rbits.py 2>&1 | tail -4; done
