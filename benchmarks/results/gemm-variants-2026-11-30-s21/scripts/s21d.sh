#!/usr/bin/env bash
# session 21 call 4: the suite's second call at 6165210, gemm_rs world 2 again x3, then the post-release sleep experiment
exec > >(tee $OUT/log.txt) 2>&1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for r in 1 2 3; do
  echo "=== gemm_rs_checks world 2, rerun $r ($(date +%T))"
  PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rawflux-cache timeout 120 python3 tests/gpu/gemm_rs_checks.py --worlds 2 --per-world-timeout 100 2>&1 | grep -a -E "perf|FAIL|summary" | cut -c1-300
done
RAWFLUX_COMMIT=6165210 WORLDS=2,8 MPI_WORLDS="2 4" TAIL=30 bash launch/gpu_suite.sh dist mpi > $OUT/suite2a.txt 2>&1
grep -a -E "^===|passed|failed|PASS|FAIL|summary|latency" $OUT/suite2a.txt | grep -v "^\[above" | tail -40
RAWFLUX_COMMIT=6165210 TAIL=60 bash launch/gpu_suite.sh gemmbench sanitize > $OUT/suite2b.txt 2>&1
grep -a -E "^===|summary|m>=|ERROR SUMMARY|hazard|RACECHECK|below" $OUT/suite2b.txt | tail -40
date +%T
git apply .exp/post_sleep.patch && PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc timeout 150 python3 benchmarks/gemm_kloop.py --jobs 8 --variants "base|;ps100|RAWFLUX_POST_SLEEP=100;ps300|RAWFLUX_POST_SLEEP=300;w771|RAWFLUX_PROBE=771;w771ps300|RAWFLUX_PROBE=771 RAWFLUX_POST_SLEEP=300" > $OUT/kloop.txt 2>&1
grep -A8 "^variant" $OUT/kloop.txt
date +%T
