#!/usr/bin/env bash
# session 22 call 5: does the producer's observation cost when it is not timed with the release?
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
timeout 200 python3 benchmarks/gemm_kloop.py --jobs 4 --tile 128x256x64s4c1w2 --variants "p771|RAWFLUX_PROBE=771;p771pace1500|RAWFLUX_PROBE=771 RAWFLUX_PRODUCER_PACE=1500 RAWFLUX_PRODUCER_POLL=64;p771pace3000|RAWFLUX_PROBE=771 RAWFLUX_PRODUCER_PACE=3000 RAWFLUX_PRODUCER_POLL=64;p387|RAWFLUX_PROBE=387" 2>&1
date +%T
