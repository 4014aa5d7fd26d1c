#!/usr/bin/env bash
# session 23 call 7 (run inline through the device tool, carry .exp and .whl): GPU suite part 2 at 4125379
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
(RAWFLUX_COMMIT=4125379 WORLDS=2,8 MPI_WORLDS="2 4" TAIL=12 timeout 200 bash launch/gpu_suite.sh dist mpi
 RAWFLUX_COMMIT=4125379 TAIL=40 timeout 300 bash launch/gpu_suite.sh gemmbench sanitize) 2>&1 | tee $OUT/log.txt
