#!/usr/bin/env bash
# session 22 call 4: a producer that looks at the empty barrier only near the expected release (clock-paced)
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
timeout 200 python3 benchmarks/gemm_kloop.py --jobs 4 --tile 128x256x64s4c1w2 --variants "base|;pace820|RAWFLUX_PRODUCER_PACE=820 RAWFLUX_PRODUCER_POLL=64;pace0|RAWFLUX_PRODUCER_PACE=0 RAWFLUX_PRODUCER_POLL=64;p771pace|RAWFLUX_PROBE=771 RAWFLUX_PRODUCER_PACE=820 RAWFLUX_PRODUCER_POLL=64" 2>&1
date +%T
timeout 180 python3 benchmarks/gemm_kloop.py --jobs 3 --variants "base|;pace820|RAWFLUX_PRODUCER_PACE=820 RAWFLUX_PRODUCER_POLL=64;pace600|RAWFLUX_PRODUCER_PACE=600 RAWFLUX_PRODUCER_POLL=64" 2>&1
date +%T
