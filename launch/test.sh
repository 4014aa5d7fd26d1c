#!/usr/bin/env bash
# The test suite, on any machine (GPU tests skip with a reason where there is no GPU):
#   1. every registered kernel variant compiled for its architectures with NVRTC, one process per
#      CPU, failing on spills or serialized wgmma; the cubins land in the disk cache
#      (RAWFLUX_CACHE_DIR), where the tests of step 2 find them instead of compiling again;
#   2. the plain tests;
#   3. the pytest-mpi tests under mpirun at 2 and 4 ranks, one summary per world.
# Every step runs; the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then  # Open MPI refuses root unless told (containers often run as root)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
failed=()
step() { echo; echo "== $1"; }

step "kernel variants (python -m rawflux.check_kernels)"
python -m rawflux.check_kernels || failed+=(check_kernels)

step "tests (pytest tests --ignore=tests/mpi)"
python -m pytest -q --color=no tests --ignore=tests/mpi || failed+=(pytest)

for n in 2 4; do
  step "MPI tests at $n ranks (pytest --with-mpi tests/mpi)"
  python -m rawflux.launch -n "$n" --oversubscribe -- python -m pytest -q --color=no --with-mpi tests/mpi -p no:cacheprovider \
    || failed+=("mpi-$n")
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "launch/test.sh: failed: ${failed[*]}" >&2
  exit 1
fi
