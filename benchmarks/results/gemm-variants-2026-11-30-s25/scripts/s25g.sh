#!/usr/bin/env bash
# session 25 call 9: the dynamic order with the refill (fixed count address): correctness, then A/B
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
F="^  File\|Traceback\|moduleUnload\|check_status\|Exception ignored\|^$\|cudaErrorLaunch\|CUDA kernel errors\|For debugging\|TORCH_USE"
for t in 128x256x64s4c1w2/k1/g8m/p0 128x256x64s4c2x1w2/k1/g8m/p0; do
  RAWFLUX_WAIT_TIMEOUT_S=3 RAWFLUX_NVRTC_DEFINES="RAWFLUX_DYN_SCHED=1" TAGS=$t timeout 60 python3 .exp/dyn1.py 2>&1 | grep -v "$F" | tail -3
done
VARIANTS="base|;dyn|RAWFLUX_DYN_SCHED=1;base2|;dyn2|RAWFLUX_DYN_SCHED=1" \
GEMM_ARGS="--dtypes bf16 --ms 1024,2048,4096,8192 --reps 30" OUT=$OUT/ab bash launch/gemm_variants.sh 2>&1 | grep -v "^bf16 m=" | grep -v "$F"
cp $OUT/ab/compare.txt $OUT/compare.txt
tar czf $OUT/ab.tgz -C $OUT ab && rm -rf $OUT/ab
date +%T
