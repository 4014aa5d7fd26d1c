#!/usr/bin/env bash
# The GPU half of the proof, in stages that each fit one device call. Logs go to $OUT (or
# ./.out); the whole output of the pytest, ag, rs and nn stages to $OUT/suite/.
# Usage: bash launch/gpu_suite.sh STAGE...   stages: env pytest dist ag rs ar nn tune rslocal tax hostcost soak mpi bench gemmbench agce agsm agdiag sanitize
# REAL=1: the multi-rank stages run one rank per GPU (rawflux-launch -n) instead of the emulated
# node (MPS); WORLDS / MPI_WORLDS / BENCH_WORLD then name GPU counts.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 RAWFLUX_CACHE_DIR=${RAWFLUX_CACHE_DIR:-/tmp/rawflux-cache}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -d .whl ] && ! python3 -c "import pytest_mpi" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
QUICK=${QUICK:-}
REAL=${REAL:-}
ranks() { if [ -n "$REAL" ]; then echo "-n $1"; else echo "--emulate $1"; fi; }  # rawflux-launch's mode flag
log() { echo "=== $* ($(date +%T))"; }
# keep NAME: the whole output goes to $OUT/suite/NAME.log; shown are its last TAIL lines, preceded
# by the FAIL / error lines the tail would cut (a failure's text was once lost to TAIL=40).
keep() {
  local f="$OUT/suite/$1.log" n
  mkdir -p "$OUT/suite"
  cat > "$f"
  n=$(wc -l < "$f")
  if [ "$n" -gt "${TAIL:-80}" ]; then
    head -n "$((n - ${TAIL:-80}))" "$f" | grep -a -E "FAIL|Error|error:" | head -40 | sed 's/^/[above the tail] /'
  fi
  tail -n "${TAIL:-80}" "$f"
}
# first N: the first N lines, reading all of them (head would exit early, and under pipefail the
# writer's SIGPIPE would fail the stage although the command passed).
first() { awk -v n="$1" 'NR <= n'; }
# sanitized NAME RESULTS CMD...: run a compute-sanitizer command with its whole output in
# $OUT/suite/sanitize-NAME.log, show the grouped counts, and fail the suite (rc=1) unless
# launch/sanitize_verdict.sh passes it (the exit status is the command's, not a pipe's).
sanitized() {
  local name=$1 results=$2 f st
  shift 2
  f="$OUT/suite/sanitize-$name.log"
  mkdir -p "$OUT/suite"
  "$@" > "$f" 2>&1; st=$?
  grep -a -E "ERROR SUMMARY|RACECHECK SUMMARY|Program hit|Invalid|Race|hazard|$results" "$f" | sed -E 's/ \(error [0-9]+\) due to .* on CUDA API call to / on /' | sort | uniq -c | first 30
  bash launch/sanitize_verdict.sh "$f" "$st" "$results" || rc=1
}
rc=0
for stage in "$@"; do
  case $stage in
    env)
      log env; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvidia-smi topo -m 2>/dev/null | head -20
      echo "RAWFLUX_COMMIT=${RAWFLUX_COMMIT:-unset} (the device copy's .git can be stale: git says $(git rev-parse --short HEAD 2>/dev/null))"
      python3 -c "import cupy, cuda.bindings; from rawflux.jit import nvrtc_version; print('cupy', cupy.__version__, 'nvrtc', nvrtc_version())" || rc=1
      python3 tests/gpu/suballoc_probe.py 2>&1 | tail -6 ;;
    pytest)
      # One process per file: in one process, torch's import failed after the fused-op tests had
      # run (2026-11-29, not understood yet; each file passes on its own).
      for f in tests/gpu/test_*.py; do
        log pytest $f; timeout 300 python3 -m pytest -q --color=no -p no:cacheprovider "$f" 2>&1 | TAIL=${TAIL:-15} keep "pytest-$(basename "$f" .py)" || rc=1
      done ;;
    dist)
      log dist_checks; timeout ${DIST_TIMEOUT:-450} python3 tests/gpu/dist_checks.py --worlds ${WORLDS:-1,2,4,8} ${REAL:+--real} --per-world-timeout 120 2>&1 | grep -a -E "PASS|FAIL|SKIP|summary|latency|Error|error" | first 60 || rc=1 ;;
    ag)
      log ag_gemm_checks; timeout 560 python3 tests/gpu/ag_gemm_checks.py --worlds ${WORLDS:-1,2,4,8} ${REAL:+--real} ${QUICK:+--quick} --per-world-timeout ${PWT:-140} 2>&1 | keep ag_gemm_checks || rc=1 ;;
    nn)
      log nn_checks; timeout 560 python3 tests/gpu/nn_checks.py --worlds ${WORLDS:-1,2,4} ${REAL:+--real} ${QUICK:+--quick} --per-world-timeout ${PWT:-180} 2>&1 | keep nn_checks || rc=1 ;;
    tune)
      log tune_checks; timeout ${TUNE_TIMEOUT:-500} python3 tests/gpu/tune_checks.py --worlds ${WORLDS:-2,4} ${REAL:+--real} --per-world-timeout ${PWT:-240} 2>&1 | keep tune_checks || rc=1 ;;
    rslocal)
      log rs_local_checks; timeout 200 python3 tests/gpu/rs_local_checks.py --worlds ${WORLDS:-2,4} 2>&1 | keep rs_local_checks || rc=1 ;;
    tax)
      log fusion_tax; timeout 400 python3 benchmarks/fusion_tax.py --json "$OUT/fusion-tax.json" 2>&1 | grep -a -E "fusion-tax|Error" || rc=1 ;;
    rs)
      log gemm_rs_checks; timeout 560 python3 tests/gpu/gemm_rs_checks.py --worlds ${WORLDS:-1,2,4,8} ${REAL:+--real} ${QUICK:+--calls 200 --replays 20 --runs 5} --per-world-timeout ${PWT:-140} 2>&1 | keep gemm_rs_checks || rc=1 ;;
    ar)
      log gemm_ar_checks; timeout 560 python3 tests/gpu/gemm_ar_checks.py --worlds ${WORLDS:-1,2,4,8} ${REAL:+--real} ${QUICK:+--calls 200 --replays 20 --runs 5} --per-world-timeout ${PWT:-140} 2>&1 | keep gemm_ar_checks || rc=1 ;;
    mpi)
      for n in ${MPI_WORLDS:-2 4}; do
        log pytest-mpi world $n ${REAL:+one rank per GPU}
        timeout 300 python3 -m rawflux.launch $(ranks $n) -m pytest -q -rf --color=no -p no:cacheprovider --with-mpi tests/mpi 2>&1 | grep -a -E "passed|failed|FAILED|error|Error" | sort | uniq -c | first 20 || rc=1
      done ;;
    bench)
      # BENCH_WORLD: one or more world sizes ("2 4 8"), each on the emulated node (REAL: GPUs)
      for w in ${BENCH_WORLD:-4}; do
        log rawflux.bench world $w ${REAL:+one rank per GPU}
        timeout ${BENCH_TIMEOUT:-400} python3 -m rawflux.launch $(ranks $w) -m rawflux.bench --op ${BENCH_OP:-all} ${BENCH_ARGS:---quick} --out-dir "$OUT" 2>&1 | tail -60 || rc=1
      done ;;
    soak)
      # 10,000 random-m calls per fused op and 1,000 graph replays at SOAK_WORLDS (QUICK: 1,000 / 100)
      log soak; timeout ${SOAK_TIMEOUT:-1800} python3 tests/gpu/soak.py --worlds ${SOAK_WORLDS:-2,4,8} --ops ${SOAK_OPS:-ag_gemm,gemm_rs,gemm_ar} ${REAL:+--real} ${QUICK:+--calls 1000 --replays 100} 2>&1 | keep soak || rc=1 ;;
    hostcost)
      # the host's time per call: world 1 in one process, then HOST_WORLD ranks (emulated node; REAL: GPUs)
      log host_cost; timeout 120 python3 benchmarks/host_cost.py --json "$OUT/host-cost.json" 2>&1 | grep -a -E "host-cost|Error" || rc=1
      timeout 200 python3 -m rawflux.launch $(ranks ${HOST_WORLD:-2}) python3 benchmarks/host_cost.py --json "$OUT/host-cost.json" 2>&1 | grep -a -E "host-cost|Error" || rc=1 ;;
    gemmbench)
      log benchmarks/gemm.py; timeout 420 python3 benchmarks/gemm.py ${GEMM_ARGS:-} --json "$OUT/gemm.json" 2>&1 | tail -60 || rc=1 ;;
    sanitize)
      # compute-sanitizer at world 2, two processes WITHOUT MPS (the sanitizer does not attach to
      # MPS clients): on one GPU, or one per GPU where there are two; slow signal rounds, so
      # small problems and few calls.
      export RAWFLUX_WAIT_TIMEOUT_S=60  # the sanitizer slows every kernel many times over
      # memcheck also lists failed CUDA API calls: cuda.bindings probes absent driver entry points
      # with cuGetProcAddress at import (harmless); the grouped counts below show any other kind,
      # and launch/sanitize_verdict.sh fails the stage on any error but those, any hazard, a
      # failed check or a bad exit (the whole output: $OUT/suite/sanitize-*.log).
      for tool in memcheck racecheck; do
        log compute-sanitizer $tool gemm_rs world 2
        sanitized "$tool-gemm_rs" "gemm_rs world=2 (correct|graph|loop)" timeout 240 python3 -m rawflux.launch -n 2 \
          compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 1000 \
          python3 tests/gpu/gemm_rs_checks.py --worker --calls 10 --replays 3 --runs 2 --no-perf
        log compute-sanitizer $tool gemm "(TmaStore staging reuse)"
        sanitized "$tool-gemm" "gemm sanitize" timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 1000 \
          python3 tests/gpu/gemm_sanitize.py
        log compute-sanitizer $tool ag_gemm world 2
        sanitized "$tool-ag_gemm" "ag_gemm world=2" timeout 240 python3 -m rawflux.launch -n 2 \
          compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 1000 \
          python3 tests/gpu/ag_gemm_checks.py --worker --quick --only "bitwise"
      done ;;
    agce)
      # The copy-engine paths of ag_gemm (and "auto", switching between "ce" and "sm") where ranks
      # share the GPU WITHOUT MPS (time-sliced contexts): under MPS 'ce' is refused (_check_copy_path).
      for w in ${CE_WORLDS:-2 4}; do
        log ag_gemm ce paths world $w without MPS
        timeout ${CE_TIMEOUT:-200} python3 -m rawflux.launch -n $w python3 tests/gpu/ag_gemm_checks.py --worker --quick --only "/(ce|auto)" 2>&1 | grep -a -E "ag_gemm world=" | first 30 || rc=1
      done ;;
    agsm)
      # the sm path's graph / torch_stream failures at 147f4ad, one change at a time (tests/gpu/ag_sm_bisect.py)
      log ag_sm_bisect; timeout 200 python3 -m rawflux.launch --emulate 2 python3 tests/gpu/ag_sm_bisect.py 2>&1 | grep -a "DIAG" | first 20 || rc=1 ;;
    agdiag)
      # where a stalled ag_gemm call stops (tests/gpu/ag_diag.py). AGDIAG: ';'-separated
      # "world direction copy m_local [extra args]" specs (default: the paths that stalled on 2026-11-29)
      IFS=';' read -ra specs <<< "${AGDIAG:-2 push ce 2048 --batch;8 pull ce 256}"
      for spec in "${specs[@]}"; do
        read -r w dir cp ml extra <<< "$spec"
        log ag_diag world $w $dir/$cp m_local $ml $extra
        timeout 150 python3 -m rawflux.launch --emulate $w tests/gpu/ag_diag.py --direction $dir --copy $cp --m-local $ml $extra 2>&1 | grep -a "^\[" | grep -v "AGGemm object" | head -40
      done ;;
    *) echo "unknown stage $stage"; rc=2 ;;
  esac
done
exit $rc
