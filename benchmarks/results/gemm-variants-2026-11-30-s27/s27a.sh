#!/usr/bin/env bash
# session 27 call 1: banded stream-K (--bands) vs picks, twice; banded/stream-K/split-tail GPU tests
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
date +%T; nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 150 python3 -m pytest -q --color=no -p no:cacheprovider tests/gpu/test_gemm.py -k "band or split_tail or stream_k_every_tile" 2>&1 | tail -5
date +%T
for r in 1 2; do
timeout 200 python3 benchmarks/gemm.py --dtypes bf16 --ms 1024,2048,4096,8192 --reps 30 --bands --json $OUT/bands$r.json 2>&1 | grep -v "^max active\|^host cost" | cut -c1-300
date +%T
done
