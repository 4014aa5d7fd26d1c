#!/usr/bin/env bash
# session 22 call 9: gemm_rs_checks world 2 on two real GPUs, fresh JIT cache, with the barrier before the timing
exec > >(tee $OUT/log.txt) 2>&1
export RAWFLUX_CACHE_DIR=/tmp/rfc3
REAL=1 WORLDS=2 TAIL=14 PWT=150 OUT=$OUT/s timeout 170 bash launch/gpu_suite.sh rs
date +%T
