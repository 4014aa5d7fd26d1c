#!/usr/bin/env bash
# A few Nsight Compute metrics of rawflux.gemm and cuBLAS (benchmarks/tools/gemm_ncu.py) on several
# shapes, one line per profiled launch, at ncu's locked base clocks and at free clocks: a gap that
# stays at locked clocks is the kernel's, not power or heat. (ncu_gemm.sh: full reports of one shape.)
# SHAPES: MxNxK,... (default 8192x8192x8192,2048x28672x8192,256x8192x8192); CLOCKS: "base none".
# Output: $OUT/ncu-metrics.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/.out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 RAWFLUX_CACHE_DIR=${RAWFLUX_CACHE_DIR:-/tmp/rawflux-cache} PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
M=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
M=$M,sm__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum
M=$M,sm__warps_active.avg.pct_of_peak_sustained_active
IFS=',' read -ra shapes <<< "${SHAPES:-8192x8192x8192,2048x28672x8192,256x8192x8192}"
for cc in ${CLOCKS:-base none}; do
  for shape in "${shapes[@]}"; do
    read -r m n k <<< "${shape//x/ }"
    for impl in rawflux torch; do
      python3 benchmarks/tools/gemm_ncu.py $m $n $k --impl $impl >/dev/null 2>&1  # compile outside the profiler
      printf "%s %s %-7s " "$cc" "$shape" "$impl"
      timeout 200 ncu --clock-control $cc --metrics $M -k regex:'gemm_kernel|nvjet|xmma' --launch-skip 3 --launch-count 1 --csv \
        python3 benchmarks/tools/gemm_ncu.py $m $n $k --impl $impl 2>/dev/null | python3 -c '
import csv, sys
short = {"gpu__time_duration.sum": "time", "sm__cycles_elapsed.avg.per_second": "clk", "dram__bytes_read.sum": "dramR",
         "dram__bytes_write.sum": "dramW", "lts__t_sector_hit_rate.pct": "L2hit", "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm%",
         "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": "bankc", "smsp__inst_executed.sum": "inst",
         "sm__warps_active.avg.pct_of_peak_sustained_active": "warps%"}
hdr, cells, name = None, [], ""
for r in csv.reader(sys.stdin):
    if "Metric Name" in r:
        hdr = r
        continue
    if hdr is None or len(r) != len(hdr):
        continue
    d = dict(zip(hdr, r))
    name = "rawflux" if "rawflux" in d["Kernel Name"] else d["Kernel Name"][:48]
    cells.append(short.get(d["Metric Name"], d["Metric Name"]) + "=" + (d["Metric Value"] + d["Metric Unit"]).replace(" ", ""))
print(name, " ".join(cells))
'
    done
  done
done 2>&1 | tee "$OUT/ncu-metrics.log"
