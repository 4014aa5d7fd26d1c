#!/usr/bin/env bash
# The test suite: the plain tests (GPU tests skip with a reason where there is no GPU), every
# kernel variant compiled for sm_90a and sm_80 with no spills, then the pytest-mpi tests under
# mpirun at 2 and 4 ranks. Exit status is non-zero if any part fails.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
python -m pytest -q --color=no tests --ignore=tests/mpi || status=1
python -m rawflux.check_kernels || status=1
for n in 2 4; do
  python -m rawflux.launch -n "$n" --oversubscribe -- python -m pytest -q --color=no --with-mpi tests/mpi -p no:cacheprovider || status=1
done
exit $status
