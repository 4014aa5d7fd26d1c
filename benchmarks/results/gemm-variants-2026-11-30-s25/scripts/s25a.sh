#!/usr/bin/env bash
# session 25 call 1: stream-K against the data-parallel picks at the bar points (the 128-of-132-SM
# quantization), and the per-k-block / per-tile split against cuBLAS (kfit) at HEAD
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv
date +%T
python3 benchmarks/gemm.py --dtypes bf16 --ms 1024,2048,4096,8192 --reps 30 \
  --configs 128x256x64s4c2x1w2/sk/g8m/p0,128x256x64s4c2x1w2/sk/g8n/p0 --json $OUT/sk.json 2>&1 | grep -v "^max active\|^host cost"
date +%T
python3 benchmarks/gemm_kfit.py --shapes 1024:8192,4096:12288 --ks 1024,2048,4096,8192,16384 2>&1 | tail -30
date +%T
