#!/usr/bin/env bash
# session 25 call 11: two H200s over NVLink, one rank per GPU, at 2ebb377's kernels (= 4c7ef51's;
# the consumer refill of session 23 has not run on two real GPUs before): the fused checks, dist,
# pytest-mpi and the quick bench
exec > >(tee $OUT/log.txt) 2>&1
export RAWFLUX_CACHE_DIR=/tmp/rfc RAWFLUX_COMMIT=2ebb377
nvidia-smi -L; nvidia-smi topo -m | head -4
REAL=1 WORLDS=2 MPI_WORLDS=2 BENCH_WORLD=2 TAIL=30 PWT=150 OUT=$OUT/s timeout 560 bash launch/gpu_suite.sh env rs ag dist mpi bench
echo "rc=$? $(date +%T)"
ls $OUT/s | head; cp $OUT/s/*.json $OUT/ 2>/dev/null; cp benchmarks/results/*_w2_*.json $OUT/ 2>/dev/null; tar czf $OUT/s.tgz -C $OUT s && rm -rf $OUT/s
