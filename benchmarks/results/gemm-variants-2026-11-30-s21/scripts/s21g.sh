#!/usr/bin/env bash
# session 21 call 6: the world-2 emulated gemm_rs perf stall: a stall or a slow rank? wait timeout 10 s vs 60 s, traced
exec > >(tee $OUT/log.txt) 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GEMM_RS_PERF_TRACE=1 RAWFLUX_CACHE_DIR=/tmp/rfc
for r in 1 2 3 4 5; do
  case $r in 1|2|3) export RAWFLUX_WAIT_TIMEOUT_S=60 ;; *) export RAWFLUX_WAIT_TIMEOUT_S=10 ;; esac
  echo "=== run $r timeout $RAWFLUX_WAIT_TIMEOUT_S ($(date +%T))"
  timeout 100 python3 -m rawflux.launch --emulate 2 tests/gpu/gemm_rs_checks.py --worker > $OUT/run$r.txt 2>&1; echo "rc=$?"
  grep -a -E "m=4096 begin|synced after first call|fused timed|perf|raised|FAIL" $OUT/run$r.txt | grep -v "m=1024" | cut -c1-300
done
date +%T
