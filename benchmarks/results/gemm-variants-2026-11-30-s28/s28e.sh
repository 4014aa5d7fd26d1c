#!/usr/bin/env bash
# session 28 call 6 (final commit): test_gemm's random shapes and narrow columns after the f32 fix;
# the suite's gemmbench + sanitize and dist + mpi; narrow columns at m = 1536 (off the grid)
export PYTHONUNBUFFERED=1
C=$(git rev-parse --short HEAD 2>/dev/null); C=${RAWFLUX_COMMIT:-$C}
date +%T
PYTHONPATH=$PWD timeout 150 python3 -m pytest -q --color=no -p no:cacheprovider tests/gpu/test_gemm.py -k "random_shapes or narrow" 2>&1 | tail -3
date +%T
RAWFLUX_COMMIT=$C TAIL=40 bash launch/gpu_suite.sh gemmbench sanitize > $OUT/suite2.txt 2>&1; echo "gemmbench+sanitize rc=$?"
grep -a -E "summary|median|hazard|SUMMARY|gemm sanitize|Invalid|Race" $OUT/suite2.txt | grep -a -v "gemm sanitize .*: ok$" | head -30
echo "gemm sanitize ok lines: $(grep -a -c 'gemm sanitize .*: ok$' $OUT/suite2.txt)"
grep -a -E "bf16 m= *(1024|2048) n=(12288|8192) k= *(6144|8192|28672)" $OUT/suite2.txt | cut -c1-200 | head -8
date +%T
WORLDS=2,8 MPI_WORLDS="2 4" TAIL=12 bash launch/gpu_suite.sh dist mpi > $OUT/suite3.txt 2>&1; echo "dist+mpi rc=$?"
grep -a -E "summary|passed|failed|latency" $OUT/suite3.txt | head -20
date +%T
PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfn timeout 60 python3 benchmarks/gemm.py --dtypes bf16 --ms 1536 --shapes 8192:8192,8192:28672 --reps 30 \
  --narrow --configs 128x256x64s4c2x1w2/k1/g8m/p0 --json $OUT/m1536.json 2>&1 | grep "bf16 m=" | cut -c1-300
tar czf $OUT/suite-logs.tgz -C $OUT suite 2>/dev/null
date +%T
