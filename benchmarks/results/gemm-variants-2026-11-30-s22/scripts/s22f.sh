#!/usr/bin/env bash
# session 22 call 6: wgmma_peak's consumer loop transplanted into the engine (RAWFLUX_MB_LOOP)
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
timeout 200 python3 benchmarks/gemm_kloop.py --jobs 4 --tile 128x256x64s4c1w2 --variants "mb771|RAWFLUX_MB_LOOP=1 RAWFLUX_PROBE=771;mb387|RAWFLUX_MB_LOOP=1 RAWFLUX_PROBE=387;mb2|RAWFLUX_MB_LOOP=2;mb2p3|RAWFLUX_MB_LOOP=2 RAWFLUX_PROBE=3" 2>&1
date +%T
