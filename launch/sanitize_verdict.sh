#!/usr/bin/env bash
# sanitize_verdict.sh LOG STATUS RESULTS: the verdict on one compute-sanitizer run (launch/gpu_suite.sh
# sanitize), from its whole output LOG and the exit STATUS of the command; RESULTS is a regex of the
# program's own result lines. Prints one line and exits 0 (PASS) or 1 (FAIL).
#
# memcheck counts failed CUDA API calls as errors, and cuda.bindings probes absent driver entry
# points at import (cuGetProcAddress), so every run counts a few dozen harmless errors and
# --error-exitcode 9 fires on them. A run passes when:
#   the sanitizer printed its ERROR SUMMARY (it ran to the end),
#   every error it counted is one of the KNOWN_API calls rawflux makes on purpose,
#   racecheck found no hazard (error or warning),
#   the program printed a result line (RESULTS with PASS or ": ok") and none that failed,
#   and it exited 0, or 9 with only known API errors counted.
set -uo pipefail
log=$1 status=$2 results=$3
# cuGetProcAddress: cuda.bindings' probes; cudaErrorPeerAccessAlreadyEnabled: rawflux.dist enabling
# peer access a second time (handled: already enabled is fine).
KNOWN_API=${KNOWN_API:-'on (CUDA API call to )?cuGetProcAddress|cudaErrorPeerAccessAlreadyEnabled'}
awk -v st="$status" -v known="$KNOWN_API" -v results="$results" -v name="$(basename "$log" .log)" '
  /ERROR SUMMARY: [0-9]+ error/ { match($0, /ERROR SUMMARY: [0-9]+/); errors += substr($0, RSTART + 15, RLENGTH - 15); summaries++ }
  /RACECHECK SUMMARY: [0-9]+ hazard/ { match($0, /RACECHECK SUMMARY: [0-9]+/); hazards += substr($0, RSTART + 19, RLENGTH - 19) }
  /Program hit / && $0 ~ known { probes++ }
  $0 ~ results && (/ PASS / || /: ok$/) { passed++ }
  ($0 ~ results && / FAIL /) || /outputs differ|Traceback \(most recent call last\)/ { failed++ }
  END {
    unexplained = errors - probes
    ok = summaries > 0 && unexplained <= 0 && hazards == 0 && passed > 0 && failed == 0 && (st == 0 || st == 9)
    printf "[sanitize] %s: exit %s, %d errors (%d known API calls), %d hazards, %d results passed, %d failed: %s\n",
           name, st, errors, probes, hazards, passed, failed, ok ? "PASS" : "FAIL"
    exit ok ? 0 : 1
  }' "$log"
