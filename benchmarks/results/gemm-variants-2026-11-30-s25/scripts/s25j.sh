#!/usr/bin/env bash
# session 25 call 18: cuBLAS's descriptor bits in ours (rank-2 maps; bit 1 of word 8, bit 28 of word 20, L2 promotion 128 B)
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1 RAWFLUX_WAIT_TIMEOUT_S=5
declare -A W8=([base]="" [b1]="0x2:0x2" [b1b60]="0x2:0x2" [cub]="0x60002:0x40002")
declare -A W20=([base]="" [b1]="" [b1b60]="0x10000000:0x10000000" [cub]="0x10000000:0x10000000")
for v in base b1 b1b60 cub; do
  LABEL=$v RAWFLUX_TMAP_W8=${W8[$v]} RAWFLUX_TMAP_W20=${W20[$v]} timeout 60 python3 .exp/tmcheck.py 2>&1 | tail -2
done
M=gpu__time_duration.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,dram__bytes_read.sum
for v in base cub b1; do
  echo "== ncu $v"
  RAWFLUX_TMAP_W8=${W8[$v]} RAWFLUX_TMAP_W20=${W20[$v]} timeout 100 ncu --metrics $M -k regex:gemm_kernel --launch-skip 3 --launch-count 1 \
    python3 benchmarks/gemm_ncu.py 4096 12288 6144 --impl rawflux 2>/dev/null | grep -E "^\s+(gpu__|lts__|dram__)"
done
for v in base cub b1 base2; do
  vv=${v%2}
  RAWFLUX_TMAP_W8=${W8[$vv]} RAWFLUX_TMAP_W20=${W20[$vv]} timeout 200 python3 benchmarks/gemm.py --dtypes bf16 --ms 1024,2048,4096,8192 --reps 30 --json $OUT/v-$v.json 2>&1 | grep "^bf16 rawflux"
done
python3 benchmarks/gemm_compare.py $OUT/v-base.json $OUT/v-cub.json $OUT/v-b1.json $OUT/v-base2.json --labels base,cub,b1,base2 | tail -8
