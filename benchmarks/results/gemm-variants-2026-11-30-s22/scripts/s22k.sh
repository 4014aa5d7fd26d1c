#!/usr/bin/env bash
# session 22 call 13: consumer refill issued after the next commit (=2)
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
timeout 140 python3 benchmarks/gemm_kloop.py --jobs 2 --tile 128x256x64s4c1w2 --variants "refill2|RAWFLUX_CONSUMER_REFILL=2;refill1|RAWFLUX_CONSUMER_REFILL=1" 2>&1
date +%T
