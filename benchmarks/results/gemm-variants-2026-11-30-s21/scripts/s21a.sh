#!/usr/bin/env bash
# session 21 call 1: named-barrier releases (RAWFLUX_NB_RELEASE) in the k-loop microbenchmark and an A/B vs cuBLAS
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date +%T
python3 benchmarks/gemm_kloop.py --jobs 8 --variants "base|;nb|RAWFLUX_NB_RELEASE=1" 2>&1 | tail -6
date +%T
python3 benchmarks/gemm_kloop.py --jobs 8 --tile 128x256x64s4c1w2 --variants "base|;nb|RAWFLUX_NB_RELEASE=1" 2>&1 | tail -6
date +%T
seed=$RANDOM
for d in "" "RAWFLUX_NB_RELEASE=1"; do RAWFLUX_NVRTC_DEFINES="$d" timeout 150 python3 .exp/nbcheck.py $seed 2>&1 | tail -4; done
date +%T
VARIANTS="base|;nb|RAWFLUX_NB_RELEASE=1;base2|;nb2|RAWFLUX_NB_RELEASE=1" GEMM_ARGS="--dtypes bf16 --ms 1024,2048,4096,8192 --reps 30" OUT=$OUT/ab timeout 420 bash launch/gemm_variants.sh 2>&1 | grep -v "^\s*$" | tail -80
date +%T
