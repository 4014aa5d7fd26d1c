#!/usr/bin/env bash
# session 22 call 10: consumer-side observation of the releases (RAWFLUX_CONSUMER_OBSERVE) with no producer (probe 387)
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
timeout 170 python3 benchmarks/gemm_kloop.py --jobs 4 --tile 128x256x64s4c1w2 --variants "p387|RAWFLUX_PROBE=387;obs1|RAWFLUX_PROBE=387 RAWFLUX_CONSUMER_OBSERVE=1;obs2|RAWFLUX_PROBE=387 RAWFLUX_CONSUMER_OBSERVE=2;obs3|RAWFLUX_PROBE=387 RAWFLUX_CONSUMER_OBSERVE=3" 2>&1
date +%T
