#!/usr/bin/env bash
# session 27 call 3: where banded stream-K loses (m = 1024-2048): k scan, band heights, raster n, classic stream-K
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T
P=128x256x64s4c2x1w2
timeout 300 python3 benchmarks/gemm.py --dtypes bf16 --ms 1024,2048 --shapes 8192:2048,8192:4096,8192:8192,8192:16384,12288:6144 --reps 30 \
  --configs $P/b2/g8m/p0,$P/b4/g8m/p0,$P/b8/g8m/p0,$P/b8/g8n/p0,$P/sk/g8m/p0 --json $OUT/scan.json 2>&1 | grep -v "^max active\|^host cost" | cut -c1-420
date +%T
