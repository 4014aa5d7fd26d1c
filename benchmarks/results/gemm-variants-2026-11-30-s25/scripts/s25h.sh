#!/usr/bin/env bash
# session 25 call 10: cuBLAS's tensor maps (cuTensorMapEncodeTiled logged by an LD_PRELOAD shim)
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
ldd --version | head -1
for shape in "4096 12288 6144" "1024 8192 8192" "4096 8192 8192"; do
  for impl in torch rawflux; do
    rm -f /tmp/tmaplog.txt
    LD_PRELOAD=$PWD/.exp/libtmaplog.so python3 benchmarks/gemm_ncu.py $shape --impl $impl > /dev/null 2>&1
    echo "== $shape $impl: $(wc -l < /tmp/tmaplog.txt 2>/dev/null) encodes"
    sort /tmp/tmaplog.txt 2>/dev/null | sed 's/addr=0x[0-9a-f]* //' | uniq -c | head -12
  done
done
