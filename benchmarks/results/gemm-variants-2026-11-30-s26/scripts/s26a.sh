#!/usr/bin/env bash
# session 26 call 1: split tail (--tails) vs picks; split-tail GPU tests; early loads / finish-read A/B
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T; nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 200 python3 benchmarks/gemm.py --precompile --dtypes bf16 --ms 1024,2048,4096,8192 --reps 30 --tails 2,3,4,5,6 --json $OUT/tails.json 2>&1 | grep -v "^max active\|^host cost" | cut -c1-400
date +%T
timeout 200 python3 -m pytest -q --color=no -p no:cacheprovider tests/gpu/test_gemm.py -k "split_tail or stream_k_every_tile" 2>&1 | tail -5
date +%T
VARIANTS="base|;early|RAWFLUX_EARLY_LOADS=1;fread|RAWFLUX_FINISH_READ=1;both|RAWFLUX_EARLY_LOADS=1 RAWFLUX_FINISH_READ=1" \
GEMM_ARGS="--dtypes bf16 --ms 1024,2048,4096,8192 --reps 30" OUT=$OUT/ab timeout 330 bash launch/gemm_variants.sh 2>&1 | grep -v "^bf16 m=" | tail -40
cp $OUT/ab/compare.txt $OUT/compare.txt 2>/dev/null
tar czf $OUT/ab.tgz -C $OUT ab && rm -rf $OUT/ab
date +%T
