#!/usr/bin/env bash
# session 22 call 8: two real H200s (NVLink): rs (the perf warm-up fix, fresh cache), ag, dist, pytest-mpi, the bench
exec > >(tee $OUT/log.txt) 2>&1
export RAWFLUX_CACHE_DIR=/tmp/rfc2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
REAL=1 WORLDS=2 TAIL=6 PWT=150 OUT=$OUT/s timeout 170 bash launch/gpu_suite.sh rs
REAL=1 WORLDS=2 TAIL=40 PWT=150 OUT=$OUT/s timeout 200 bash launch/gpu_suite.sh ag dist
REAL=1 MPI_WORLDS=2 OUT=$OUT/s timeout 150 bash launch/gpu_suite.sh mpi
REAL=1 BENCH_WORLD=2 BENCH_TIMEOUT=200 OUT=$OUT/b timeout 210 bash launch/gpu_suite.sh bench
date +%T
