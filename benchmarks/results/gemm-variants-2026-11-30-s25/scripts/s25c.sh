#!/usr/bin/env bash
# session 25 call 3: L2 eviction policies on the operand loads (RAWFLUX_L2_HINT), A/B against base
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
VARIANTS="${VARIANTS:-base|;bef|RAWFLUX_L2_HINT=4;aef|RAWFLUX_L2_HINT=1;befael|RAWFLUX_L2_HINT=6;base2|}" \
GEMM_ARGS="--dtypes bf16 --ms 1024,2048,4096,8192 --reps 30" OUT=$OUT/ab bash launch/gemm_variants.sh 2>&1 | grep -v "^bf16 m=" 
cp $OUT/ab/compare.txt $OUT/compare.txt
tar czf $OUT/ab.tgz -C $OUT ab && rm -rf $OUT/ab
date +%T
