#!/usr/bin/env bash
# session 22 call 7: gemm_rs_checks at world 2 on two real GPUs, three runs (session 21's emulated-node stall)
exec > >(tee $OUT/log.txt) 2>&1
export RAWFLUX_CACHE_DIR=/tmp/rfc
nvidia-smi -L; nvidia-smi topo -m | head -5
for r in 1 2 3; do
  echo "##### run $r $(date +%T)"
  REAL=1 WORLDS=2 TAIL=14 PWT=150 OUT=$OUT/r$r timeout 170 bash launch/gpu_suite.sh rs
  echo "##### run $r rc=$? $(date +%T)"
done
