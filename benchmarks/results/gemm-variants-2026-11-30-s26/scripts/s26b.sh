#!/usr/bin/env bash
# session 26 call 2: early loads (fixed: producer warpgroup converged for setmaxnreg) A/B, twice; test_gemm with it
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
VARIANTS="base|;early|RAWFLUX_EARLY_LOADS=1;base2|;early2|RAWFLUX_EARLY_LOADS=1" \
GEMM_ARGS="--dtypes bf16 --ms 1024,2048,4096,8192 --reps 30" OUT=$OUT/ab timeout 300 bash launch/gemm_variants.sh 2>&1 | grep -v "^bf16 m=" | tail -32
cp $OUT/ab/compare.txt $OUT/compare.txt 2>/dev/null
tar czf $OUT/ab.tgz -C $OUT ab && rm -rf $OUT/ab
date +%T
RAWFLUX_NVRTC_DEFINES="RAWFLUX_EARLY_LOADS=1" timeout 240 python3 -m pytest -q -x --color=no -p no:cacheprovider tests/gpu/test_gemm.py 2>&1 | tail -4
date +%T
