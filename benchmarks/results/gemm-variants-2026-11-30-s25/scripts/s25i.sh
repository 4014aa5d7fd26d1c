#!/usr/bin/env bash
# session 25 call 13: cuBLAS's launch configuration and kernel parameters (tensor maps), by an LD_PRELOAD shim
exec > >(tee $OUT/log.txt) 2>&1
export PYTHONPATH=$PWD RAWFLUX_CACHE_DIR=/tmp/rfc PYTHONUNBUFFERED=1
rm -f /tmp/launchlog.txt
LD_PRELOAD=$PWD/.exp/liblaunchlog.so python3 .exp/launch1.py 2>&1 | tail -5
cp /tmp/launchlog.txt $OUT/launchlog.txt
wc -l $OUT/launchlog.txt; cut -c1-400 $OUT/launchlog.txt | head -60
