#!/usr/bin/env bash
# session 21 call 5: gemm_rs world 2 perf timeouts on the emulated node: per-rank host traces of the perf check
exec > >(tee $OUT/log.txt) 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GEMM_RS_PERF_TRACE=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
for r in 1 2 3 4; do
  case $r in 1|2) export RAWFLUX_CACHE_DIR=/tmp/rfc-cold$r ;; *) export RAWFLUX_CACHE_DIR=/tmp/rfc-cold2 ;; esac
  echo "=== run $r cache $RAWFLUX_CACHE_DIR ($(date +%T.%N | cut -c1-12))"
  timeout 150 python3 -m rawflux.launch --emulate 2 tests/gpu/gemm_rs_checks.py --worker > $OUT/run$r.txt 2>&1; echo "rc=$?"
  grep -a -E "perf|FAIL" $OUT/run$r.txt | cut -c1-260
done
date +%T
