#!/usr/bin/env bash
# Run a script on every GPU of this node: launch/run.sh [-n N] script.py args...
# (a thin wrapper of rawflux-launch; see python -m rawflux.launch --help)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONPATH="${here}/..${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python3}" -m rawflux.launch "$@"
