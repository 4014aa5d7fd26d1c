#!/usr/bin/env bash
# Run a script as an emulated node: N ranks on one GPU under a private MPS daemon (stopped after).
#   launch/emulate.sh N script.py args...        e.g. launch/emulate.sh 8 tests/gpu/dist_checks.py --worker
# (a thin wrapper of rawflux-launch --emulate; see python -m rawflux.launch --help)
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 N script.py args..." >&2
  exit 2
fi
n="$1"
shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONPATH="${here}/..${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python3}" -m rawflux.launch --emulate "${n}" "$@"
