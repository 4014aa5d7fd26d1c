#!/usr/bin/env bash
# session 25 call 4: locked-clock cycles of rawflux and cuBLAS (ncu --clock-control base)
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
M=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__cycles_elapsed.max,sm__cycles_active.avg,sm__cycles_active.max,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum
for shape in 4096x12288x6144 1024x8192x8192 4096x8192x8192; do
  read -r m n k <<< "${shape//x/ }"
  for impl in rawflux torch; do
    python3 benchmarks/gemm_ncu.py $m $n $k --impl $impl >/dev/null 2>&1
    echo "== $shape $impl"
    timeout 200 ncu --clock-control base --metrics $M -k regex:'gemm_kernel|nvjet|xmma' --launch-skip 3 --launch-count 1 \
      python3 benchmarks/gemm_ncu.py $m $n $k --impl $impl 2>/dev/null | grep -E "^\s+(gpu__|sm__|dram__|lts__)" 
  done
done
