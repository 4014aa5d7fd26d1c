#!/usr/bin/env bash
# session 27 call 6: the two-count fix-up (correctness: split-K, stream-K, split tail, bands), and the
# band picks off the bar grid (m = 1536 / 3072) beside the data-parallel pair
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
timeout 240 python3 -m pytest -q --color=no -p no:cacheprovider tests/gpu/test_gemm.py -k "band or split_tail or stream_k_every_tile or split_k" 2>&1 | tail -4
date +%T
timeout 120 python3 benchmarks/gemm.py --dtypes bf16 --ms 1536,3072 --shapes 28672:8192,12288:6144 --reps 30 \
  --configs 128x256x64s4c2x1w2/k1/g8m/p0 --json $OUT/offgrid.json 2>&1 | grep -v "^max active\|^host cost" | cut -c1-300
date +%T
