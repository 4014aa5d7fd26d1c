#!/usr/bin/env bash
# session 21 call 2: stage releases in pairs (RAWFLUX_RELEASE_PAIR 1 / 2): k loop, bits, A/B vs cuBLAS
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
V="base|;pair1|RAWFLUX_RELEASE_PAIR=1;pair2|RAWFLUX_RELEASE_PAIR=2"
python3 benchmarks/gemm_kloop.py --jobs 8 --variants "$V" 2>&1 | tail -5
python3 benchmarks/gemm_kloop.py --jobs 8 --tile 128x256x64s4c1w2 --variants "$V" 2>&1 | tail -5
python3 benchmarks/gemm_kloop.py --jobs 8 --tile 128x320x64s4c2x1w2 --variants "$V" 2>&1 | tail -5
date +%T
seed=$RANDOM
for d in "" "RAWFLUX_RELEASE_PAIR=1" "RAWFLUX_RELEASE_PAIR=2"; do RAWFLUX_NVRTC_DEFINES="$d" timeout 150 python3 .exp/nbcheck.py $seed 2>&1 | tail -1; done
date +%T
VARIANTS="base|;pair1|RAWFLUX_RELEASE_PAIR=1;pair2|RAWFLUX_RELEASE_PAIR=2;base2|" GEMM_ARGS="--dtypes bf16 --ms 1024,2048,4096,8192 --reps 30" OUT=$OUT/ab timeout 420 bash launch/gemm_variants.sh > $OUT/ab.txt 2>&1
grep -A40 "=== compare" $OUT/ab.txt
date +%T
