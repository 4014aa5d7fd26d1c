#!/usr/bin/env bash
# session 27 call 5: where banded stream-K's fix-up time goes (probes: no partial stores, no reads, neither)
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
P=128x256x64s4c2x1w2
VARIANTS="base|;nost|RAWFLUX_PROBE=65536;nord|RAWFLUX_PROBE=131072;none|RAWFLUX_PROBE=196608" \
GEMM_ARGS="--dtypes bf16 --ms 1024,2048 --shapes 8192:2048,8192:8192,12288:6144 --reps 30 --configs $P/b4/g8m/p0,$P/b8/g8m/p0" \
OUT=$OUT/ab timeout 400 bash launch/gemm_variants.sh 2>&1 | grep -v "^=== \|check" | cut -c1-330 | tail -40
cp $OUT/ab/compare.txt $OUT/compare.txt 2>/dev/null
tar czf $OUT/ab.tgz -C $OUT ab && rm -rf $OUT/ab
date +%T
